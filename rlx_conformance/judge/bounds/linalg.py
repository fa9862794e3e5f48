"""How linear-algebra results are judged: error bounds and invariant checks from the standard
backward error analysis (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed.;
chapter numbers below refer to it).

Non-unique results (SVD and QR factors, whose signs and, for repeated singular values, whole
bases are free) are never compared elementwise: they are judged by the invariants any correct
factor has (orthonormality, triangularity, reconstruction) and, where the factor is unique up to
signs and well conditioned, against the reference after canonicalisation. Solvers are judged by
backward error, and by forward error against the reference scaled by the problem's condition.

Notation: ``uc`` is the unit roundoff of the compute dtype (float16/bfloat16 compute in float32),
``uo`` the rounding of the stored output when it is narrower than the compute dtype (else 0),
U64 that of the float64 reference, ``ULD`` that of the long double used for residuals.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.linalg

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds.gamma import U64, gamma, uc
from rlx_conformance.judge.bounds.summation import (
    bilinear_terms,
    sum_judgement,
    sum_terms,
)
from rlx_conformance.judge.compare import (
    ANY_FINITE,
    FINITE,
    NEG_INF,
    POS_INF,
    Bound,
    Comparison,
    free_where,
    nonfinite_mismatch,
    ulp_distance,
)
from rlx_conformance.spec import infer

ULD = float(np.finfo(np.longdouble).eps) / 2


def uo(dtype: str) -> float:
    return dt.finfo(dtype).unit_roundoff if dt.compute_dtype(dtype) != dtype else 0.0


# -- small helpers ------------------------------------------------------------------------------
def layout(name: str, e: np.ndarray, a: np.ndarray) -> Comparison | None:
    """A failing Comparison when shape or dtype differ, else None."""
    if e.shape != a.shape:
        return Comparison(False, message=f"{name}: shape {a.shape} != expected {e.shape}")
    if e.dtype != a.dtype:
        return Comparison(False, message=f"{name}: dtype {a.dtype} != expected {e.dtype}")
    return None


def errors_vs(e: np.ndarray, a: np.ndarray) -> dict:
    """Measured elementwise errors of a against e (informative; not a verdict)."""
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    fin = np.isfinite(e64) & np.isfinite(a64)
    if not fin.any():
        return {}
    d = np.abs(e64 - a64)[fin]
    scale = np.max(np.abs(e64[fin]))
    return {"max_abs_err": float(d.max()), "max_rel_err": float(d.max() / scale) if scale else 0.0,
            "max_ulp": float(np.nanmax(ulp_distance(e, a)[fin]))}


def verdict(name: str, value: float, allowed: float, what: str, checked: int = 1,
            **measured) -> Comparison:
    """value <= allowed passes; NaN value fails; allowed NaN means unasserted (passes)."""
    if math.isnan(allowed):
        return Comparison(True, checked=0, notes=[f"{name}: unasserted ({what})"], **measured)
    ok = bool(value <= allowed)
    msg = "" if ok else f"{name}: {what} {value:.3g} > allowed {allowed:.3g}"
    return Comparison(ok, checked=checked, mismatches=0 if ok else 1, message=msg, **measured)


def finite_or_fail(name: str, a: np.ndarray) -> Comparison | None:
    if not np.isfinite(a.astype(np.float64)).all():
        bad = int((~np.isfinite(a.astype(np.float64))).sum())
        return Comparison(False, mismatches=bad, checked=a.size,
                          message=f"{name}: {bad}/{a.size} non-finite elements for finite, "
                                  "well-posed input")
    return None


def mats(x: np.ndarray) -> np.ndarray:
    """[..., m, n] -> [batch, m, n]."""
    return x.reshape((math.prod(x.shape[:-2]),) + x.shape[-2:])


# -- dot products: mat_mul, dot_general, conv --------------------------------------------------
def bilinear_bound(f, a: np.ndarray, b: np.ndarray, k: int, out_dtype: str, u_ref: float,
                   extra: np.ndarray | None = None) -> Bound:
    """Per output of any bilinear op f(a, b) that sums k products (matmul, convolution):
    |error| <= gamma_k(uc) * sum|a||b| over the finite terms (Higham 3.5, any order), plus the
    reference's own gamma_k(u_ref) share; ``extra`` (in f's output layout): terms added to each
    sum (a convolution's bias), one more rounding each, 2 uc |extra|.

    The terms are evaluated through f on split operands (summation.bilinear_terms), so the
    products' NaN (a NaN factor, inf * 0) and signed infinities are known per output: exact
    where every order gives the same NaN or infinity, order-dependent where the finite terms'
    partial sums may overflow the compute dtype (summation.sum_judgement)."""
    t = bilinear_terms(f, a, b)
    bound = (gamma(k, uc(out_dtype)) + gamma(k, u_ref)) * t.abs_sum
    if extra is not None:
        te = sum_terms(np.broadcast_to(extra, t.pos.shape), lambda v: v)
        bound = bound + 2 * uc(out_dtype) * te.abs_sum
        t = t.plus(te)
    return sum_judgement(t, bound, out_dtype, k)


# -- mat_mul and dot_general (the dims are shared with the declarations and both backends) ---
def dot_general_dims(name: str, a: Sequence[int], b: Sequence[int], attrs: Mapping[str, Any]) -> tuple[tuple[int, ...], ...]:
    """Normalised (lhs_contracting, rhs_contracting, lhs_batch, rhs_batch, lhs_free, rhs_free)."""
    lc, rc, lbt, rbt = (attrs[k] for k in ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch"))
    if len(lc) != len(rc) or len(lbt) != len(rbt):
        raise SpecError(f"{name}: lhs/rhs contracting and batch dims must pair up "
                        f"({len(lc)} vs {len(rc)} contracting, {len(lbt)} vs {len(rbt)} batch)")
    lc, lbt = ([infer.norm_axis(name, d, len(a), "lhs dim") for d in v] for v in (lc, lbt))
    rc, rbt = ([infer.norm_axis(name, d, len(b), "rhs dim") for d in v] for v in (rc, rbt))
    for side, dims in (("lhs", lc + lbt), ("rhs", rc + rbt)):
        if len(set(dims)) != len(dims):
            raise SpecError(f"{name}: {side} dims repeat across contracting and batch: {dims}")
    for x, y, what in ((lc, rc, "contracting"), (lbt, rbt, "batch")):
        for i, j in zip(x, y):
            if a[i] != b[j]:
                raise SpecError(f"{name}: {what} sizes differ: lhs dim {i} is {a[i]}, rhs dim {j} is {b[j]}")
    lf = tuple(d for d in range(len(a)) if d not in lc + lbt)
    rf = tuple(d for d in range(len(b)) if d not in rc + rbt)
    return tuple(lc), tuple(rc), tuple(lbt), tuple(rbt), lf, rf


def reference_roundoff(dtype: str) -> float:
    """The reference computes float64 products in long double, narrower dtypes in float64."""
    return ULD if dt.compute_dtype(dtype) == "float64" else U64


def matmul_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    a, b = inputs
    k = a.shape[-1]
    a2 = a if a.ndim >= 2 else a[None, :]
    b2 = b if b.ndim >= 2 else b[:, None]
    bound = bilinear_bound(np.matmul, a2, b2, k, out_dtype, reference_roundoff(out_dtype))
    if a.ndim == 1:
        bound = bound.map(lambda v: v[..., 0, :])
    if b.ndim == 1:
        bound = bound.map(lambda v: v[..., 0])
    return bound


def dot_general_canonical(a: np.ndarray, b: np.ndarray, attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """(lhs as [B, M, K], rhs as [B, K, N], output shape): the one layout both the reference and
    the bound compute in."""
    lc, rc, lbt, rbt, lf, rf = dot_general_dims("dot_general", a.shape, b.shape, attrs)
    size = lambda x, dims: math.prod(x.shape[d] for d in dims)
    A = np.transpose(a, lbt + lf + lc).reshape(size(a, lbt), size(a, lf), size(a, lc))
    B = np.transpose(b, rbt + rc + rf).reshape(size(b, rbt), size(b, rc), size(b, rf))
    out = tuple(a.shape[d] for d in lbt) + tuple(a.shape[d] for d in lf) + tuple(b.shape[d] for d in rf)
    return A, B, out


def dot_general_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    A, B, out = dot_general_canonical(*inputs, attrs)
    bound = bilinear_bound(np.matmul, A, B, A.shape[-1], out_dtype, reference_roundoff(out_dtype))
    return bound.map(lambda v: v.reshape(out))


# -- solvers -------------------------------------------------------------------------------------
def _lu_growth(a: np.ndarray) -> float:
    """|| |L||U| ||_inf / ||A||_inf of partial-pivoting LU (the factor in Higham Thm 9.4)."""
    if a.shape[-1] == 0 or not np.abs(a).max() > 0:
        return 1.0
    _, l, u = scipy.linalg.lu(a)
    return float((np.abs(l) @ np.abs(u)).sum(-1).max() / np.abs(a).sum(-1).max())


def _inv_norm(a: np.ndarray) -> float:
    try:
        with np.errstate(all="ignore"):
            return float(np.abs(np.linalg.inv(a)).sum(-1).max())
    except np.linalg.LinAlgError:
        return math.inf


def _columns(b: np.ndarray, a_ndim: int) -> np.ndarray:
    """Right-hand sides as [..., n, k] (a vector b gets k = 1)."""
    b = b.astype(np.float64)
    return b[..., None] if b.ndim == a_ndim - 1 else b


def _forward_allowed(cond: np.ndarray, eta: np.ndarray, ref_eta: float, dtype: str) -> np.ndarray:
    """Relative forward error allowed given the measured backward error eta of the result:
    ||x - x_true|| / ||x|| <= 2 cond eta / (1 - cond eta) (Higham Thm 7.2, normwise or Skeel),
    plus the reference's own share (cond * its backward error) and the rounding of the reference
    to the output dtype (the backend's own rounding is part of its measured eta).
    NaN (unasserted) once cond * eta reaches 1/2: the bound says nothing there."""
    ce = cond * np.maximum(eta, ref_eta)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = 2 * cond * eta / (1 - ce) + 2 * cond * ref_eta + 1.01 * dt.finfo(dtype).unit_roundoff
    return np.where(ce < 0.5, out, np.nan)


def _worst(ratio_best: tuple, value: np.ndarray, allowed: np.ndarray) -> tuple:
    """Track (ratio, value, allowed) of the worst asserted entry."""
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(np.isnan(allowed), -1.0, np.where(allowed > 0, value / allowed,
                                                        np.where(value > 0, np.inf, 0.0)))
    if q.size and q.max() >= ratio_best[0]:
        k = np.unravel_index(np.argmax(q), q.shape)
        return float(q[k]), float(value[k]), float(allowed[k])
    return ratio_best


def solve_check(inputs: Sequence[np.ndarray], attrs, expected, actual) -> list[Comparison]:
    """dense_solve / batched_dense_solve (GEPP). Backward error (Rigal-Gaches, inf-norm, per
    right-hand side): eta = ||b - A x||/(||A|| ||x|| + ||b||) <= 2 gamma_3n(uc) g + 2 uo, where g is
    the partial-pivoting growth || |L||U| ||/||A|| of the reference factorization (Higham Thm 9.4),
    widened 2x for blocked variants. Forward error against the reference: within
    2 kappa_inf(A) eta / (1 - kappa eta) for the measured eta (Higham Thm 7.2), which makes the
    reference and the backend agree to the extent the problem's conditioning allows."""
    a_in, b_in = inputs
    (e,), (x,) = expected, actual
    bad = layout("x", e, x)
    if bad:
        return [bad]
    dtype = dt.name_of(a_in.dtype)
    n = a_in.shape[-1]
    if x.size == 0 or n == 0:
        return [Comparison(True, checked=0)]
    A, B = mats(a_in.astype(np.float64)), mats(_columns(b_in, a_in.ndim))
    X, E = mats(_columns(x, a_in.ndim)), mats(_columns(e, a_in.ndim))
    # A column the reference solves finitely must be finite (and NaN/inf where the reference's
    # narrow output dtype overflowed): the errors below are measured over finite columns only.
    bad = nonfinite_mismatch(e, x, "x")
    if bad:
        return [bad]
    back, fwd = (-1.0, 0.0, 0.0), (-1.0, 0.0, math.nan)
    for i in range(A.shape[0]):
        a, xb, bb, eb = A[i], X[i], B[i], E[i]
        g = _lu_growth(a)
        allowed_eta = 2 * gamma(3 * n, uc(dtype)) * g + 2 * uo(dtype) + gamma(n + 1, ULD)
        fin = np.isfinite(eb).all(0) & np.isfinite(xb).all(0)
        xb0 = np.where(np.isfinite(xb), xb, 0.0)
        r = bb.astype(np.longdouble) - a.astype(np.longdouble) @ xb0.astype(np.longdouble)
        anorm = np.abs(a).sum(-1).max()
        den = anorm * np.abs(xb0).max(0) + np.abs(bb).max(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            eta = np.where(fin & (den > 0), np.abs(r).max(0).astype(np.float64) / den, 0.0)
        back = _worst(back, eta, np.full_like(eta, allowed_eta))
        kappa = anorm * _inv_norm(a)
        allowed_f = _forward_allowed(np.full_like(eta, kappa), eta, 2 * gamma(3 * n, U64) * g, dtype)
        ex = np.abs(eb).max(0)
        with np.errstate(invalid="ignore", divide="ignore"):
            ferr = np.where(fin & (ex > 0), np.abs(xb0 - eb).max(0) / ex, 0.0)
        fwd = _worst(fwd, ferr, np.where(fin, allowed_f, np.nan))
    return [verdict("backward error", back[1], back[2], "normwise backward error", **errors_vs(e, x)),
            verdict("forward error", fwd[1], fwd[2] if fwd[0] >= 0 else math.nan,
                    "relative forward error vs the reference")]


def tri(a: np.ndarray, lower: bool) -> np.ndarray:
    """The referenced triangle; the other is never read (NaN there must not leak)."""
    return np.tril(a) if lower else np.triu(a)


def triangular_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """triangular_solve. Substitution in any order (blocked or not) satisfies the componentwise
    backward error bound |b - T x| <= gamma_n |T||x| (Higham Thm 8.5), widened to 2 gamma_2n for
    reciprocal-then-multiply variants, plus uo |T||x| for the stored rounding of x. Forward error
    against the reference: within 2 cond(T, x) omega / (1 - cond omega) for the measured
    componentwise backward error omega and Skeel's cond(T, x) = || |T^-1||T||x| || / ||x||
    (Higham Thm 7.4)."""
    a_in, b_in = inputs
    (e,), (x,) = expected, actual
    bad = layout("x", e, x)
    if bad:
        return [bad]
    dtype = dt.name_of(a_in.dtype)
    n = a_in.shape[-1]
    if x.size == 0 or n == 0:
        return [Comparison(True, checked=0)]
    A = mats(a_in.astype(np.float64))
    X, B, E = (mats(_columns(v, a_in.ndim)) for v in (x, b_in, e))
    bad = nonfinite_mismatch(e, x, "x")  # the residuals below see finite columns only
    if bad:
        return [bad]
    back, fwd = (-1.0, 0.0, 0.0), (-1.0, 0.0, math.nan)
    c_b = 2 * gamma(2 * n, uc(dtype)) + 1.01 * uo(dtype)
    for i in range(A.shape[0]):
        t = tri(A[i], attrs["lower"])
        op = t.T if attrs["transpose"] else t
        xb, bb, eb = X[i], B[i], E[i]
        fin = (np.isfinite(xb) & np.isfinite(eb)).all(0)
        xb0 = np.where(np.isfinite(xb), xb, 0.0)
        r = np.abs(bb.astype(np.longdouble) - op.astype(np.longdouble) @ xb0.astype(np.longdouble)).astype(np.float64)
        scale = np.abs(op) @ np.abs(xb0)
        slack = gamma(n + 1, ULD) * (scale + np.abs(bb))  # the residual's own rounding
        back = _worst(back, np.where(fin, np.maximum(r - slack, 0), 0.0), c_b * scale)
        with np.errstate(invalid="ignore", divide="ignore"):
            omega = np.where(fin, (np.maximum(r - slack, 0) / (scale + np.abs(bb))).max(0), 0.0)
            omega = np.nan_to_num(omega, nan=0.0)
            tinv = scipy.linalg.solve_triangular(op, np.eye(n), lower=(attrs["lower"] != attrs["transpose"]))
            ex = np.abs(eb).max(0)
            skeel = (np.abs(tinv) @ (np.abs(op) @ np.abs(eb))).max(0) / np.where(ex > 0, ex, 1)
            diff = np.abs(xb0 - np.where(np.isfinite(eb), eb, 0)).max(0)
            ferr = np.where(fin & (ex > 0), diff / np.where(ex > 0, ex, 1), 0.0)
        allowed_f = _forward_allowed(skeel, omega, gamma(2 * n, U64), dtype)
        fwd = _worst(fwd, ferr, np.where(fin, allowed_f, np.nan))
    return [verdict("backward error", back[0], 1.0,
                    f"componentwise |b - op(T)x| / (2 gamma_2n + uo)|op(T)||x| (worst residual "
                    f"{back[1]:.3g}, allowed {back[2]:.3g}); ratio", **errors_vs(e, x)),
            verdict("forward error", fwd[1], fwd[2] if fwd[0] >= 0 else math.nan,
                    "relative forward error vs the reference")]


# -- factorizations ------------------------------------------------------------------------------
def cholesky_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """cholesky (lower, positive diagonal: unique). Structure: strictly upper part exactly zero,
    diagonal positive. Reconstruction: |L L^T - A| <= gamma_(n+1) |L||L^T| (Higham Thm 10.3),
    widened to 2 gamma_(n+1) for blocked variants, plus 2 uo |L||L^T| for the stored rounding.
    Forward error vs the reference: ||dL||_F / ||L||_2 <= kappa_2(A) * n * (that) + 2 uo
    (first-order perturbation theory of the Cholesky factor, Sun 1991; Higham 10.1.1)."""
    (a_in,) = inputs
    (e,), (l_out,) = expected, actual
    bad = layout("L", e, l_out)
    if bad:
        return [bad]
    dtype = dt.name_of(a_in.dtype)
    n = a_in.shape[-1]
    if l_out.size == 0:
        return [Comparison(True, checked=0)]
    fail = nonfinite_mismatch(e, l_out, "L") or finite_or_fail("L", l_out)
    if fail:
        return [fail]
    L, E, A = mats(l_out.astype(np.float64)), mats(e.astype(np.float64)), mats(a_in.astype(np.float64))
    upper = np.triu(np.ones((n, n), bool), 1)
    n_upper = int((L[:, upper] != 0).sum())
    diag = np.diagonal(L, axis1=-2, axis2=-1)
    n_diag = int((diag <= 0).sum())
    c = 2 * gamma(n + 1, uc(dtype)) + 2.01 * uo(dtype) + gamma(n + 1, ULD)
    recon_ratio = 0.0
    fwd, fwd_allowed, fwd_ratio = 0.0, math.nan, 0.0
    for i in range(L.shape[0]):
        lo = np.tril(L[i])
        r = np.abs((lo.astype(np.longdouble) @ lo.T.astype(np.longdouble)) - A[i]).astype(np.float64)
        allowed = c * (np.abs(lo) @ np.abs(lo.T))
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(allowed > 0, r / allowed, np.where(r > 0, np.inf, 0.0))
        recon_ratio = max(recon_ratio, float(q.max()))
        s = np.linalg.svd(A[i], compute_uv=False)
        kappa = s[0] / s[-1] if s[-1] > 0 else math.inf
        allow = kappa * n * (c + 2 * gamma(n + 1, U64)) + 2 * uo(dtype)
        err = np.linalg.norm(L[i] - E[i]) / max(np.linalg.norm(E[i], 2), 1e-300)
        if allow < 1 and err / allow >= fwd_ratio:
            fwd, fwd_allowed, fwd_ratio = float(err), float(allow), err / allow
    m = errors_vs(e, l_out)
    return [verdict("upper part", n_upper, 0, "non-zero entries above the diagonal"),
            verdict("diagonal", n_diag, 0, "non-positive diagonal entries"),
            verdict("reconstruction", recon_ratio, 1.0,
                    "componentwise |L L^T - A| / (c |L||L^T|), c = 2 gamma_(n+1)(uc) + 2 uo; ratio"),
            verdict("forward error", fwd, fwd_allowed, "||L - L_ref||_F / ||L_ref||_2", **m)]


def _p(m: int, n: int) -> int:
    return max(m, n, 1)


def alg_eps(dtype: str, m: int, n: int) -> float:
    """Normwise backward error allowed to a Householder-based factorization (QR, SVD):
    ||dA|| <= gamma_(4 p) ||A||, p = max(m, n) (Higham Thm 19.4 and its SVD analogue; the factor 4
    covers the blocked/bidiagonalization variants), plus the float64 reference's share."""
    p = _p(m, n)
    return gamma(4 * p, uc(dtype)) + gamma(4 * p, U64)


def orth_eps(dtype: str, m: int, n: int) -> float:
    """Allowed |Q^T Q - I| entries: the factorization's error plus 3 uo for the stored rounding."""
    return alg_eps(dtype, m, n) + 3 * uo(dtype)


def _orth(name: str, Q: np.ndarray, dtype: str, m: int, n: int) -> Comparison:
    k = Q.shape[-1]
    worst = 0.0
    for q in Q:
        worst = max(worst, float(np.abs(q.T @ q - np.eye(k)).max()) if k else 0.0)
    return verdict(name, worst, orth_eps(dtype, m, n), "max |Q^T Q - I|")


def _clusters(s: np.ndarray, tau: float) -> list[tuple[int, int]]:
    """Index ranges [i, j) of s (descending) with consecutive gaps <= tau."""
    out, start = [], 0
    for i in range(1, len(s) + 1):
        if i == len(s) or s[i - 1] - s[i] > tau:
            out.append((start, i))
            start = i
    return out


def _factor_part(inputs, attrs, expected, actual):
    """What svd_check and qr_check share: the requested part, its layout and finiteness checks,
    and the input as float64 matrices. Returns (early verdicts or None, part, e, out, dtype, m, n, A)."""
    (a_in,) = inputs
    (e,), (out,) = expected, actual
    part = attrs["part"]
    m, n = a_in.shape[-2:]
    early = None
    bad = layout(part, e, out)
    if bad:
        early = [bad]
    elif out.size == 0 or min(m, n) == 0:
        early = [Comparison(True, checked=0)]
    else:
        fail = nonfinite_mismatch(e, out, part) or finite_or_fail(part, out)
        if fail:
            early = [fail]
    return early, part, e, out, dt.name_of(a_in.dtype), m, n, mats(a_in.astype(np.float64))


def svd_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """svd, one part per call. s: descending, non-negative, |s_i - s_ref_i| <= eps ||A||_2 (Weyl's
    inequality for a backward stable SVD) + uo s_i. u (vt): orthonormal columns (rows), and for
    every cluster of singular values separated from the rest by gap > 50 eps ||A||, the spanned
    subspace matches the reference's: ||P - P_ref||_2 <= 2 eps ||A|| / gap + orthogonality slack
    (Wedin's sin-theta theorem). Signs and bases within clusters are free, so they are not
    compared; the thin factor's complement counts as singular value 0 when m != n."""
    early, part, e, out, dtype, m, n, A = _factor_part(inputs, attrs, expected, actual)
    if early:
        return early
    k = min(m, n)
    eps = alg_eps(dtype, m, n)
    s_ref = np.linalg.svd(A, compute_uv=False)
    if part == "s":
        S = out.astype(np.float64).reshape(-1, k)
        order = int((np.diff(S, axis=-1) > 0).sum())
        neg = int((S < 0).sum())
        allowed = eps * s_ref[:, :1] + 1.01 * uo(dtype) * s_ref + 1e-300
        ratio = float((np.abs(S - s_ref) / allowed).max())
        return [verdict("order", order, 0, "ascending steps in s"),
                verdict("sign", neg, 0, "negative singular values"),
                verdict("singular values", ratio, 1.0, "|s - s_ref| / (eps ||A||_2 + uo s); ratio",
                        **errors_vs(e, out))]
    F = mats(out.astype(np.float64))
    if part == "vt":
        F = np.swapaxes(F, -1, -2)  # columns are right singular vectors
    dim = m if part == "u" else n
    _, _, Vh = np.linalg.svd(A, full_matrices=False)
    U_ref, _, _ = np.linalg.svd(A, full_matrices=False)
    R = U_ref if part == "u" else np.swapaxes(Vh, -1, -2)
    comps = [_orth(f"{part} orthonormality", F, dtype, m, n)]
    worst, allowed_at, skipped = 0.0, math.nan, 0
    for b in range(F.shape[0]):
        s = s_ref[b]
        noise = eps * s[0]
        tau = 50 * noise
        ext = np.append(s, 0.0) if dim > k else s  # the complement acts as singular value 0
        for i, j in _clusters(s, tau):
            left = ext[i - 1] - ext[i] if i > 0 else math.inf
            right = ext[j - 1] - ext[j] if j < len(ext) else math.inf
            gap = min(left, right)
            if not gap > tau:
                skipped += 1
                continue
            P = F[b][:, i:j] @ F[b][:, i:j].T
            Pr = R[b][:, i:j] @ R[b][:, i:j].T
            d = float(np.linalg.norm(P - Pr, 2))
            allow = 2 * (noise + 2 * U64 * s[0]) / gap * 2 + 4 * orth_eps(dtype, m, n) * math.sqrt(j - i)
            if math.isnan(allowed_at) or d / allow > worst / allowed_at:
                worst, allowed_at = d, allow
    c = verdict(f"{part} subspaces", worst, allowed_at, "||P - P_ref||_2 of a singular subspace")
    if skipped:
        c.notes.append(f"{skipped} cluster(s) without a resolvable gap: orthonormality only")
    comps.append(c)
    return comps


def _lead_kappa(a: np.ndarray) -> np.ndarray:
    """kappa_2 of the leading column blocks a[:, :i+1], i < min(m, n)."""
    k = min(a.shape)
    out = np.empty(k)
    for i in range(k):
        s = np.linalg.svd(a[:, :i + 1], compute_uv=False)
        out[i] = s[0] / s[-1] if s[-1] > 0 else math.inf
    return out


def qr_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """qr (reduced), one part per call. Householder QR gives Q, R with A + dA = Q R, Q orthonormal
    to within gamma, ||da_j|| <= gamma ||a_j|| (Higham Thm 19.4). q: orthonormal columns; Q^T A
    upper triangular to within eps ||a_j|| per column. r: exactly zero below the diagonal;
    R^T R = A^T A to within 2 eps ||a_i|| ||a_j||. Both: after making diag(R) positive (the
    canonical signs), column/row i matches the reference to within 4 kappa_2(A[:, :i+1]) eps
    (first-order QR perturbation theory, Higham 19.9), asserted only where that is < 0.1."""
    early, part, e, out, dtype, m, n, A = _factor_part(inputs, attrs, expected, actual)
    if early:
        return early
    k = min(m, n)
    F, E = mats(out.astype(np.float64)), mats(e.astype(np.float64))
    eps = alg_eps(dtype, m, n)
    cnorm = np.linalg.norm(A, axis=-2)  # column norms [b, n]
    comps = []
    if part == "q":
        comps.append(_orth("q orthonormality", F, dtype, m, n))
        QtA = np.swapaxes(F, -1, -2) @ A  # [b, k, n]
        low = np.tril(np.ones((k, n), bool), -1)
        allowed = (2 * eps + 3 * uo(dtype)) * cnorm[:, None, :] + 1e-300
        ratio = float((np.abs(QtA) / allowed)[:, low].max()) if low.any() else 0.0
        comps.append(verdict("Q^T A triangular", ratio, 1.0, "|(Q^T A)_ij|, i > j, / (eps ||a_j||); ratio"))
        d = np.sign(np.diagonal(QtA, axis1=-2, axis2=-1))
        d_ref = np.sign(np.diagonal(np.swapaxes(E, -1, -2) @ A, axis1=-2, axis2=-1))
        canon, canon_ref = F * np.where(d == 0, 1, d)[:, None, :], E * np.where(d_ref == 0, 1, d_ref)[:, None, :]
        vec_err = np.linalg.norm(canon - canon_ref, axis=-2)  # per column [b, k]
    else:
        low = np.tril(np.ones((k, n), bool), -1)
        nz = int((F[:, low] != 0).sum())
        comps.append(verdict("r lower part", nz, 0, "non-zero entries below the diagonal"))
        RtR = np.swapaxes(F, -1, -2) @ F
        AtA = np.swapaxes(A, -1, -2) @ A
        allowed = (2 * eps + 3 * uo(dtype)) * cnorm[:, :, None] * cnorm[:, None, :] + 1e-300
        comps.append(verdict("R^T R = A^T A", float((np.abs(RtR - AtA) / allowed).max()), 1.0,
                             "|R^T R - A^T A| / (2 eps ||a_i|| ||a_j||); ratio"))
        d = np.sign(np.diagonal(F, axis1=-2, axis2=-1))
        d_ref = np.sign(np.diagonal(E, axis1=-2, axis2=-1))
        canon, canon_ref = F * np.where(d == 0, 1, d)[:, :, None], E * np.where(d_ref == 0, 1, d_ref)[:, :, None]
        anorm = np.linalg.norm(A, 2, axis=(-2, -1))
        vec_err = np.linalg.norm(canon - canon_ref, axis=-1) / np.maximum(anorm[:, None], 1e-300)
    worst, allowed_at, skipped = 0.0, math.nan, 0
    for b in range(A.shape[0]):
        kap = _lead_kappa(A[b])
        allow = 4 * kap * eps + 4 * uo(dtype) * math.sqrt(max(m, n))
        for i in range(k):
            if not allow[i] < 0.1:
                skipped += 1
                continue
            if math.isnan(allowed_at) or vec_err[b, i] / allow[i] > worst / allowed_at:
                worst, allowed_at = float(vec_err[b, i]), float(allow[i])
    c = verdict(f"{part} canonical", worst, allowed_at,
                "distance to the reference after making diag(R) positive", **errors_vs(e, out))
    if skipped:
        c.notes.append(f"{skipped} column(s) beyond the numerical rank: invariants only")
    comps.append(c)
    return comps


# -- determinants --------------------------------------------------------------------------------
def _log_adj_terms(a: np.ndarray) -> tuple[float, float, float]:
    """For one square matrix, in float64: (log of sum_ij (P|L||U|)_ij |adj(A)|_ji upper bound,
    log|det A|, sum_i |log|u_ii||). adj(A) = det(W)det(Z) Z adj(S) W^T from the SVD A = W S Z^T,
    so |adj(A)| <= |Z| diag(prod_{j!=k} s_j) |W|^T, evaluated in the log domain so that products
    of singular values never overflow."""
    n = a.shape[0]
    p, l, u = scipy.linalg.lu(a)
    m = p @ (np.abs(l) @ np.abs(u))
    w, s, zt = np.linalg.svd(a)
    with np.errstate(divide="ignore"):
        ls = np.log(s)
        du = np.abs(np.diagonal(u))
        logdiag = np.log(du)
    finite = np.isfinite(ls)
    tot = float(np.sum(ls[finite]))
    nzero = int((~finite).sum())
    # log prod_{j != k} s_j: only the zero singular value's own term survives one exact zero
    if nzero == 0:
        lp = tot - ls
    elif nzero == 1:
        lp = np.where(finite, -np.inf, tot)
    else:
        lp = np.full(n, -np.inf)
    top = lp.max()
    if not np.isfinite(top):
        log_terms = -np.inf
    else:
        adj = np.abs(zt.T) @ np.diag(np.exp(lp - top)) @ np.abs(w).T  # scaled |adj|
        log_terms = top + math.log(max(float(np.sum(m * adj.T)), 1e-300))
    logdet = float(np.sum(logdiag))
    return log_terms, logdet, float(np.sum(np.abs(logdiag[np.isfinite(logdiag)])))


def _det_terms(a_in: np.ndarray, dtype: str):
    A = mats(a_in.astype(np.float64))
    n = A.shape[-1]
    eps = 2 * gamma(3 * n, uc(dtype)) + 2 * gamma(3 * n, U64)
    return A, n, eps


def det_bound(inputs, attrs, out_dtype: str) -> Bound:
    """|det_computed - det| <= eps * sum_ij |dA_ij| |adj(A)_ji| with |dA| <= eps P|L||U|, eps =
    2 gamma_3n (LU backward error, Higham Thm 9.3; first-order expansion of det), plus gamma_n |det|
    for the product of the pivots. The adjugate form stays finite for singular matrices. Results
    whose bound straddles the dtype's overflow threshold are order-dependent (a finite value within
    the bound, or the infinity of the determinant's sign); an absolute floor of a few
    subnormals allows gradual underflow."""
    (a_in,) = inputs
    A, n, eps = _det_terms(a_in, out_dtype)
    fi = dt.finfo(out_dtype)
    out = np.zeros(A.shape[0])
    free = np.zeros(A.shape[0], bool)
    allow = np.zeros(A.shape[0], np.uint8)
    if n == 0:
        return Bound(out.reshape(a_in.shape[:-2]))
    for i, a in enumerate(A):
        log_terms, logdet, _ = _log_adj_terms(a)
        lb = np.logaddexp(math.log(eps) + log_terms, math.log(gamma(n, uc(out_dtype))) + logdet)
        b = math.exp(lb) if lb < 709 else math.inf
        det_abs = math.exp(logdet) if logdet < 709 else math.inf
        if det_abs + b > fi.max and det_abs - b < fi.max * (1 + fi.eps):
            # may round either way at the overflow threshold: a finite value within the bound,
            # or the infinity of the determinant's sign (the product of the pivots overflowed)
            free[i] = True
            sign = np.linalg.slogdet(a)[0]
            allow[i] = FINITE | (NEG_INF if sign < 0 else POS_INF)
        out[i] = b + 4 * n * dt.finfo(dt.compute_dtype(out_dtype)).smallest_subnormal
    shape = a_in.shape[:-2]
    return Bound(out.reshape(shape), free.reshape(shape), allow.reshape(shape))


def log_det_bound(inputs, attrs, out_dtype: str) -> Bound:
    """log|det|: the relative det bound above (adjugate terms / |det|), plus (gamma_n + 2uc) sum_i
    |log|u_ii|| for evaluating and summing the logs of the pivots. Order-dependent once the relative det
    bound exceeds 1/2 (numerically singular: any very negative value or -inf is right)."""
    (a_in,) = inputs
    A, n, eps = _det_terms(a_in, out_dtype)
    out = np.zeros(A.shape[0])
    if n == 0:
        return Bound(out.reshape(a_in.shape[:-2]))
    u = uc(out_dtype)
    singular = np.zeros(A.shape[0], bool)
    for i, a in enumerate(A):
        log_terms, logdet, sum_logs = _log_adj_terms(a)
        if not np.isfinite(logdet):
            singular[i] = True
            continue
        rel = math.exp(min(math.log(eps) + log_terms - logdet, 700.0))
        singular[i] = rel > 0.5
        out[i] = 0.0 if singular[i] else 2 * rel + (gamma(n, u) + 2 * u) * sum_logs + 2 * u
    # numerically singular: the pivots' rounding decides between -inf (an exactly zero pivot) and
    # a finite, very negative value; nothing else (no NaN, no +inf) is legal
    shape = a_in.shape[:-2]
    return free_where(out.reshape(shape), singular.reshape(shape), NEG_INF | ANY_FINITE)
