"""Judges (``Policy.check``) of the custom ops, each bound written next to its reason.

* Gathers, and scatters without reduction, move values: bit-exact, signed zeros included.
* Scatter reductions: cells no update touches, or one update touches, are exact (one IEEE
  operation, the same on both sides); cells several updates touch may differ by the
  accumulation-order error only (any order of the duplicates is legal).
* rlx_sparse.mat_vec: the dot-product bound per row; values_grad: one product, exact.
* Solvers: normwise backward error, and forward error scaled by a condition estimate that the
  judge derives from the case's matrix (csr.cond_inf), both reported in the message.

When an ONNX op fails, the message says which side onnx.reference / onnxruntime agree with
(the ONNX oracles, rlx_conformance.judge.onnx_oracles; not the precise oracle of precise.py).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma, uc
from rlx_conformance.judge.bounds.summation import (
    prod_judgement,
    prod_terms,
    sum_judgement,
    sum_terms,
)
from rlx_conformance.judge.compare import (
    Bound,
    Comparison,
    Tolerance,
    compare,
    nonfinite_mismatch,
    ulp_size,
)
from rlx_conformance.judge.onnx_oracles import verdict as onnx_verdict
from rlx_conformance.spec import csr
from rlx_conformance.spec.registry import Policy

NONE = Tolerance(source="custom judge: bound only")


# -- scatter geometry ----------------------------------------------------------------------------
def scatter_targets(op: str, data: np.ndarray, idx: np.ndarray, upd: np.ndarray,
                    attrs: Mapping[str, Any]) -> np.ndarray:
    """Flat output position of every update element, in updates' row-major order."""
    if data.size == 0 or upd.size == 0:
        return np.zeros(0, np.int64)
    if op == "onnx.ScatterElements":
        ax = attrs["axis"] % data.ndim
        s = data.shape[ax]
        grid = list(np.indices(idx.shape, sparse=False))
        grid[ax] = np.where(idx < 0, idx + s, idx).astype(np.int64)
        return np.ravel_multi_index(tuple(g.ravel() for g in grid), data.shape)
    k = idx.shape[-1]
    sizes = np.array(data.shape[:k], np.int64)
    tup = idx.reshape(-1, k).astype(np.int64)
    tup = np.where(tup < 0, tup + sizes, tup)
    base = np.ravel_multi_index(tuple(tup.T), data.shape[:k])
    inner = math.prod(data.shape[k:])
    return (base[:, None] * inner + np.arange(inner)[None, :]).ravel()


def scatter_undefined(op: str) -> Callable[..., np.ndarray | None]:
    """With reduction none, cells that two updates target are undefined (ONNX: duplicates are
    not allowed, the winner is unspecified; docs/ops.md, onnx.ScatterElements and onnx.ScatterND)."""
    def undefined(inputs, attrs):
        data, idx, upd = inputs
        if attrs["reduction"] != "none":
            return None
        t = scatter_targets(op, data, idx, upd, attrs)
        return (np.bincount(t, minlength=data.size) > 1).reshape(data.shape)
    return undefined


def scatter_bound(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                  out_dtype: str) -> Bound:
    """Per-cell judgement between two correct implementations.

    * untouched cells and cells one update touches: exact (bound 0). data (op) u is one IEEE
      operation, the same on both sides (overflow and NaN included), and float16/bfloat16 round
      the same float32 value once;
    * add, c >= 2 updates: any order of c additions errs by at most gamma_c * sum|terms| (Higham
      eq. 3.5), so two orders differ by 2 gamma_c sum|terms| over the finite terms. NaN and
      infinite terms, and finite ones whose partial sums may overflow in some order, follow
      summation.sum_judgement (exact NaN/inf where every order agrees, order-dependent outcomes
      where it does not);
    * mul, c >= 2: relative error gamma_c of the product for any order (Higham Lemma 3.1), so
      2 gamma_c |prod|; NaN, infinite and zero factors and partial products that may leave the
      exponent range follow summation.prod_judgement;
    * max, min, none: order-independent (none with duplicates is masked as undefined): exact.
    float16/bfloat16 compute in float32 and round once: two float32 results within the bound
    may straddle a rounding boundary, so add one ulp of the output dtype where the bound is > 0.
    Integers wrap, and wrapping add/mul are associative and commutative: exact.
    """
    data, idx, upd = inputs
    red = attrs["reduction"]
    out = np.zeros(data.shape, np.float64)
    if red not in ("add", "mul") or not dt.is_float(out_dtype):
        return Bound(out)
    t = scatter_targets(op, data, idx, upd, attrs)
    cdt = dt.compute_dtype(out_dtype)
    fi = dt.finfo(cdt)
    n = data.size
    cnt = np.bincount(t, minlength=n).astype(np.float64)
    terms = np.concatenate([data.astype(np.float64).ravel(), upd.astype(np.float64).ravel()])
    cells = np.concatenate([np.arange(n), t])

    def into_cells(v: np.ndarray) -> np.ndarray:
        acc = np.zeros(n)
        np.add.at(acc, cells, v)
        return acc
    with np.errstate(all="ignore"):
        if red == "add":
            st = sum_terms(terms, into_cells)
            val = st.abs_sum
            j = sum_judgement(st, 2 * gamma(cnt, fi.unit_roundoff) * val, out_dtype, cnt + 1)
        else:
            pt = prod_terms(terms, into_cells)
            val = np.exp2(pt.up + pt.down)
            j = prod_judgement(pt, 2 * gamma(cnt, fi.unit_roundoff) * val, out_dtype, cnt + 1)
    several = cnt >= 2
    b = np.where(several, j.abs, 0.0)
    if out_dtype != cdt:
        b = np.where(b > 0, b + ulp_size(val, out_dtype), b)
    free = several & j.free
    return Bound(b.reshape(data.shape), free.reshape(data.shape),
                 np.where(free, j.allow, 0).astype(np.uint8).reshape(data.shape))


# -- ONNX-op judges ------------------------------------------------------------------------------
def _with_onnx_verdict(op: str, inputs, attrs, expected, actual, comps: list[Comparison],
                       same: Callable[[np.ndarray, np.ndarray], bool]) -> list[Comparison]:
    """A failing case's first failing comparison gets the ONNX oracles' verdict (which side they
    agree with) in its message and notes."""
    if all(c.ok for c in comps):
        return comps
    try:
        v = onnx_verdict(op, inputs, attrs, expected[0], actual[0], same)
    except Exception as e:  # noqa: BLE001 — an ONNX oracle's problem must not hide the finding
        v = f"oracle verdict unavailable: {type(e).__name__}: {e}"
    for c in comps:
        if not c.ok:
            c.message = f"{c.message} [{v}]"
            c.notes.append(v)
            break
    return comps


def gather_check(op: str):
    def check(inputs, attrs, expected, actual):
        comps = [compare(e, a, exact=True, signed_zero=True, tol=NONE, name=f"output {k}")
                 for k, (e, a) in enumerate(zip(expected, actual))]

        def same(x, y):
            return compare(x, y, exact=True, signed_zero=True, tol=NONE).ok
        return _with_onnx_verdict(op, inputs, attrs, expected, actual, comps, same)
    return Policy(exact=True, signed_zero=True, check=check,
                  check_reason="pure data movement: bit-exact, signed zeros included")


def scatter_check(op: str):
    undefined = scatter_undefined(op)

    def judge_one(inputs, attrs, e, a):
        out_dt = dt.name_of(e.dtype)
        skip = undefined(inputs, attrs)
        if attrs["reduction"] == "none" or not dt.is_float(out_dt):
            return compare(e, a, exact=True, signed_zero=attrs["reduction"] == "none",
                           tol=NONE, skip=skip, name="output 0")
        return compare(e, a, exact=False, signed_zero=False, tol=NONE,
                       bound=scatter_bound(op, inputs, attrs, out_dt), name="output 0")

    def check(inputs, attrs, expected, actual):
        comps = [judge_one(inputs, attrs, expected[0], actual[0])]
        return _with_onnx_verdict(op, inputs, attrs, expected, actual, comps,
                                  lambda x, y: judge_one(inputs, attrs, x, y).ok)
    return Policy(check=check, check_reason=(
        "none: bit-exact (duplicate targets undefined, masked); add/mul: cells with c >= 2 "
        "updates within 2*gamma_c*sum|terms| (add) or 2*gamma_c*|prod| (mul), every other cell "
        "exact; max/min: exact; see custom_judges.scatter_bound"))


# -- sparse judges -------------------------------------------------------------------------------
def matvec_bound(inputs: Sequence[np.ndarray], out_dtype: str) -> Bound:
    """Row r is a dot product of k_r terms: any evaluation order errs by at most
    gamma_k (|A||x|)_r (Higham eq. 3.5, k products and k-1 additions), so two implementations
    differ by 2 gamma_k (|A||x|)_r, plus k smallest subnormals for products that underflow; an
    empty row is exactly 0. The products' NaN (NaN, inf*0) and infinities, and finite terms
    whose partial sums may overflow in some order, follow summation.sum_judgement (exact where
    every order agrees, order-dependent outcomes where it does not)."""
    values, col, rp, x = inputs
    n = rp.shape[0] - 1
    rows = csr.row_ids(rp)
    with np.errstate(all="ignore"):
        prod = values.astype(np.float64) * x.astype(np.float64)[col.astype(np.int64)]
    t = sum_terms(prod, lambda v: np.bincount(rows, weights=v, minlength=n))
    k = np.diff(rp.astype(np.int64))
    fi = dt.finfo(out_dtype)
    # Products that underflow carry an absolute error up to half the smallest subnormal each
    # (Higham eq. 2.8: fl(xy) = xy(1 + d) + e, |e| <= smallest subnormal / 2): k of them.
    b = 2 * gamma(k, fi.unit_roundoff) * t.abs_sum + k * fi.smallest_subnormal
    return sum_judgement(t, b, out_dtype, k)


def matvec_check():
    def check(inputs, attrs, expected, actual):
        e, a = expected[0], actual[0]
        return [compare(e, a, exact=False, signed_zero=False, tol=NONE,
                        bound=matvec_bound(inputs, dt.name_of(e.dtype)), name="y")]
    return Policy(check=check, check_reason="per row 2*gamma_k*(|A||x|)_r, k = the row's nonzeros")


def values_grad_check():
    def check(inputs, attrs, expected, actual):
        return [compare(expected[0], actual[0], exact=True, signed_zero=True, tol=NONE, name="out")]
    return Policy(exact=True, signed_zero=True, check=check, check_reason=(
        "each entry is one IEEE product u[i]*v[j], correctly rounded: bit-exact"))


def _system(inputs):
    values, col, rp, b = inputs
    n = rp.shape[0] - 1
    return csr.to_scipy(values, col, rp, n), b.astype(np.float64), n


def backward_error(a, x: np.ndarray, b: np.ndarray) -> float:
    """Normwise backward error ||b - A x||_inf / (||A||_inf ||x||_inf + ||b||_inf) (Rigal and
    Gaches; Higham Thm 7.1): the smallest relative perturbation of A and b that x solves exactly."""
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        return math.inf
    r = csr.residual(a, x, b)
    den = csr.inf_norm(a) * float(np.max(np.abs(x), initial=0)) + float(np.max(np.abs(b), initial=0))
    return float(np.max(np.abs(r), initial=0)) / den if den else 0.0


def _rel_inf(x: np.ndarray, ref: np.ndarray) -> float:
    d = float(np.max(np.abs(x.astype(np.float64) - ref.astype(np.float64)), initial=0))
    s = float(np.max(np.abs(ref.astype(np.float64)), initial=0))
    return d / s if s else (0.0 if d == 0 else math.inf)


LU_C = 6  # backward-error budget c in c*n*u: see lu_check


def lu_check():
    """Backward error <= c n u with c = 6: GEPP's computed solution satisfies (A + dA) x = b with
    |dA| <= gamma_3n |L||U| (Higham Thm 9.4), and ||L||U||| <= n rho ||A|| with growth factor
    rho <= 2 for the diagonally dominant matrices the generator makes (Higham Thm 9.9; the spd
    and ill classes are dominant before scaling, and a symmetric diagonal scaling leaves GEPP's
    growth unchanged); we allow c n u = 2 * 3n u. Forward error relative to the reference:
    ||x - x*|| / ||x*|| <= 2 kappa eta / (1 - kappa eta) per side (Higham Thm 7.2 with
    kappa_{A,b} <= 2 kappa_inf), for eta the budget above, target plus reference; unasserted
    when kappa * eta >= 1/2 (the problem is too ill-conditioned for the precision)."""

    def check(inputs, attrs, expected, actual):
        bad = nonfinite_mismatch(expected[0], actual[0], "x")  # the errors below are finite-only
        if bad:
            return [bad]
        a, b, n = _system(inputs)
        x, ref = actual[0], expected[0]
        tdt = dt.name_of(x.dtype)
        u_t = uc(tdt)
        eta = backward_error(a, x, b)
        eta_ref = backward_error(a, ref, b)
        budget = LU_C * n * u_t
        kappa = csr.cond_inf(a)
        ferr = _rel_inf(x, ref)
        info = f"n={n}, kappa_inf~{kappa:.3g}, eta={eta:.3g} (budget {budget:.3g}), ref eta={eta_ref:.3g}"
        ok_b = eta <= budget
        comps = [Comparison(ok_b, max_abs_err=eta, message="" if ok_b else
                            f"x: backward error {eta:.3g} > {LU_C}*n*u = {budget:.3g} ({info})")]
        ku = kappa * budget
        if ku < 0.5:
            fb = 2 * ku / (1 - ku) + 2 * kappa * LU_C * n * 2.0**-53 / (1 - kappa * LU_C * n * 2.0**-53)
            ok_f = ferr <= fb
            comps.append(Comparison(ok_f, max_rel_err=ferr, message="" if ok_f else
                                    f"x: forward error {ferr:.3g} > 2*kappa*eta bound {fb:.3g} ({info})"))
        else:
            comps[0].notes.append(f"forward error {ferr:.3g} unasserted: kappa*eta = {ku:.3g} >= 1/2")
        if all(c.ok for c in comps):  # recorded in the result: the estimate the case ran with
            comps[0].notes.append(info)
            comps[0].message = info
        return comps
    return Policy(check=check, check_reason="normwise backward error <= 6 n u; forward error "
                  "<= 2 kappa eta / (1 - kappa eta) per side, kappa derived from the matrix")


CG_C = 2  # see cg_check
CG_ANORM_MARGIN = 1.25  # see cg_check


def a_norm_error(a, x: np.ndarray, x_star: np.ndarray) -> float:
    """||x - x*||_A = sqrt((x - x*)^T A (x - x*)), the quantity CG minimises over its Krylov space."""
    d = x.astype(np.float64) - x_star
    return math.sqrt(max(float(d @ (a @ d)), 0.0))


def cg_check():
    """The reference's own float64 CG run (csr.cg) tells the regime.

    * It converged: the target must have solved the system to tol. Its true residual is at most
      its recursive residual (< tol when it stopped) plus the drift between the two, which after
      k iterations is about k m u (||A|| max_j ||x_j|| + ||b||) for m nonzeros per row
      (Greenbaum 1997, "Estimating the attainable accuracy of recursively computed residual
      methods"); we allow ||b - A x||_2 <= tol + c k m u (||A||_2 ||x||_2 + ||b||_2), c = 2,
      k = max_iter, ||A||_2 <= sqrt(||A||_1 ||A||_inf).
    * It did not (max_iter reached): both return the max_iter-th iterate, judged two ways, either
      of which suffices:
      - forward: while rounding is not amplified, each iteration's quantities carry relative
        errors of order m u kappa, so the iterates differ by at most c k m u kappa relative
        (kappa_2 <= kappa_inf for symmetric A); only asserted when that is < 1;
      - quality: once loss of orthogonality sets in (ill-conditioned A, many iterations), finite
        precision CG behaves like exact CG on a nearby matrix with clustered eigenvalues
        (Greenbaum 1989; Greenbaum and Strakos 1992): two correct implementations then give
        iterates that are not close, but whose A-norm errors ||x_k - x*||_A (what CG minimises)
        are. The target's must be within CG_ANORM_MARGIN = 1.25 of the larger of the float64
        reference's and the same reference algorithm rerun in the target's dtype. The margin is
        empirical (on the matrix's ill class the spread measured across evaluation orders and
        precisions was below 1.05); x* is the sparse-LU solution in float64.
      A target that stopped on its own residual test and passes the first criterion passes too.
    """

    def check(inputs, attrs, expected, actual):
        bad = nonfinite_mismatch(expected[0], actual[0], "x")  # the residuals below are finite-only
        if bad:
            return [bad]
        a, b, n = _system(inputs)
        x, ref = actual[0].astype(np.float64), expected[0].astype(np.float64)
        tdt = dt.name_of(actual[0].dtype)
        u_t = uc(tdt)
        k, tol = attrs["max_iter"], attrs["tol"]
        m = int(np.max(np.diff(inputs[2].astype(np.int64)), initial=1))
        _, k_ref, conv = csr.cg(a, b, k, tol)
        norm2 = math.sqrt(csr.one_norm(a) * csr.inf_norm(a))
        finite = bool(np.all(np.isfinite(x)))
        rho = float(np.linalg.norm(csr.residual(a, x, b))) if finite else math.inf
        allowed = tol + CG_C * k * m * u_t * (norm2 * float(np.linalg.norm(x)) + float(np.linalg.norm(b)))
        solved = rho <= allowed
        kappa = csr.cond_inf(a)
        info = (f"n={n}, kappa_inf~{kappa:.3g}, reference {'converged' if conv else 'ran'} in "
                f"{k_ref} iteration(s), ||b-Ax||_2={rho:.3g} (allowed {allowed:.3g})")
        if conv:
            ok = solved
            msg = info if ok else f"x: did not solve to tol: {info}"
            return [Comparison(ok, max_abs_err=rho, message=msg, notes=[info])]
        ferr = float(np.linalg.norm(x - ref)) / max(float(np.linalg.norm(ref)), 1e-300)
        fb = CG_C * k * m * u_t * kappa
        forward = fb < 1 and ferr <= fb
        x_star = csr.lu_solve(a, b, "cg_check")
        e_t = a_norm_error(a, x, x_star) if finite else math.inf
        e_ref = a_norm_error(a, ref, x_star)
        e_rt = a_norm_error(a, csr.cg(a, b, k, tol, dtype=dt.np_dtype(tdt))[0], x_star)
        quality = e_t <= CG_ANORM_MARGIN * max(e_ref, e_rt)
        ok = finite and (solved or forward or quality)
        note = (f"iterate error {ferr:.3g} (forward bound {fb:.3g}); ||x-x*||_A {e_t:.4g} vs "
                f"reference {e_ref:.4g} and reference in {tdt} {e_rt:.4g}")
        msg = f"{info}; {note}" if ok else f"x: {note}; {info}"
        return [Comparison(ok, max_rel_err=ferr, message=msg, notes=[info, note])]
    return Policy(check=check, check_reason=(
        "converged: ||b-Ax||_2 <= tol + 2 k m u (||A|| ||x|| + ||b||); otherwise iterates within "
        "2 k m u kappa, or A-norm error within 1.25x of a correct CG's in either precision"))
