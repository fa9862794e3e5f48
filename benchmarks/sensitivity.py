"""How small an error the judges catch: MLX's own outputs, perturbed, judged again.

    python benchmarks/sensitivity.py [--ops GLOB,...] [--dtypes GLOB,...] [--max-cases N]
                                     [--well-conditioned C] [--show-misses N] [--markdown]

The op list (default: every op judged by a worst-case bound, an accuracy budget of an accumulating
kind, or an own check: ``judged_ops``, read from the registry's Policy and judge/budgets.py
ACCUMULATING; bit-exact and pure-ULP-tolerance elementwise ops are left out) is crossed with every
float dtype MLX declares on its CPU. Per op x dtype, up to --max-cases of the generated eager-mode
cases are taken, round robin over (shape family, value class) so that every family and value class
is represented. Each case runs on MLX (CPU, eager, as run_case calls it) and on the CPU reference;
only cases whose UNPERTURBED MLX output passes run.execute.verdict (the matrix's own verdict:
worst-case bound or tolerance, NaN/inf pattern, own checks, accuracy budgets) are kept. Their
output is then perturbed and judged again:

    (a) every float output scaled by 1 + 1e-5;
    (b) every float output scaled by 1 + 1e-3;
    (c) one element (the largest-magnitude finite one over the float outputs) times 1 + 1e-3.

The perturbed value is computed in float64 and rounded once to the output dtype (dtypes.narrow).
In float16 (relative spacing 2^-11..2^-10) a 1e-5 scaling rounds back to the same value, and in
bfloat16 (2^-8..2^-7) so do 1e-5 and 1e-3: such a perturbation is a no-op, the case "still passes"
trivially, and the "unchanged" column counts them. The table reports the share of kept cases that
STILL pass (lower = the judges are more sensitive), and the two goals of the issue: "a 10^-3 error
caught in every case whose condition number is below 10^2" (cases with cond < 100 still passing
under (b): the goal is 0) and "a 10^-5 error caught in every well-conditioned float32 case"
(float32 cases with cond < --well-conditioned, default 10, still passing under (a): the goal is 0).
The goal columns leave out the cases where the perturbation was a no-op and those where the
unperturbed verdict reports unasserted elements (Comparison.order_dependent / unbounded: e.g. a
sum at FLT_MAX whose partial sums may overflow, where +-inf is a legal outcome by design).

Condition number per op (``condition``: the max over the case's finite outputs; 0/0 counts as 1):

* sums, means, scans, matmul, dot_general, conv, conv_transpose2d, rlx_sparse.mat_vec,
  scatter_add, average pooling, ONNX scatters with reduction add: the componentwise relative
  condition number of a (multi)linear map, f(|x|) / |f(x)| (Higham, Accuracy and Stability,
  sec. 3.1 and 4.2: sum|x_i| / |sum x_i| for a sum, sum|a_k b_k| / |sum a_k b_k| for a dot
  product), f evaluated by the CPU reference in float64;
* attention: the weighted sum's sum_j p_j |v_j| / |sum_j p_j v_j| (the reference run with |v|)
  times 1 + 2 max_ij scale sum_d |q_id k_jd| (+ max|bias|): the softmax's relative condition
  number w.r.t. relative perturbations of its scores is at most 2 max|s_ij|, and the scores
  are dot products whose sum |terms| is scale |q_i|.|k_j| (a first-order upper bound);
* reduce_prod, cum_prod, ONNX scatters with reduction mul: the number of factors n of each output
  (the relative condition number of a product of n terms);
* rope: (|x1 c| + |x2 s|) / |x1 c -+ x2 s| per rotated pair (1 for pass-through dims);
* softmax_cross_entropy: (|lse| sum|t| + sum|t_c x_c|) / |loss| per row, the loss written as the
  sum lse sum t - sum t_c x_c;
* fft: sum_j |x_j| / |X_k| per output bin;
* det: sum |A o A^-T| (the componentwise relative condition number of det); log_det: the same
  divided by |log|det||;
* solvers and factorizations (dense_solve, batched_dense_solve, triangular_solve on its triangle,
  cholesky, svd, qr, rlx_sparse.lu_solve, rlx_sparse.cg_solve): the 2-norm kappa(A);
* layer_norm, group_norm: rms(x) / sqrt(var(x) + eps) per normalized group, the condition number
  of centering and variance (Chan, Golub & LeVeque, "Algorithms for computing the sample
  variance", 1983: kappa = ||x|| / sqrt(S)), eps added as the op adds it. Data far from zero
  with a small spread (the "offset" and "spread" value classes) is ill conditioned. The affine
  step's cancellation (x_hat gamma + beta near 0) is per element and left out;
* softmax, rms_norm, batch_norm_inference, fake_quantize, pooling by max, ONNX scatters without
  reduction or with max/min: 1 (elementwise-like outputs, taken as well conditioned);
* random ops (rng_*): none (a sample has no condition number; they count in no goal column).
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate.matrix import Case, Target, generate, make_inputs
from rlx_conformance.judge import budgets
from rlx_conformance.judge.bounds.nn import rope_pairs
from rlx_conformance.ops import all_ops
from rlx_conformance.run.execute import verdict

TARGET = Target("mlx", "cpu", "eager")
SMALL, LARGE = 1e-5, 1e-3
COLUMNS = ("op", "dtype", "cases", "pass @1e-5", "pass @1e-3", "one elem. @1e-3",
           "cond<100 pass @1e-3", "well-cond. f32 pass @1e-5", "unchanged (a/b/c)", "skipped")

# Inputs whose absolute values give sum |terms| when the op is run on them (multilinear ops).
LINEAR_INPUTS: dict[str, tuple[int, ...]] = {
    "reduce_sum": (0,), "reduce_mean": (0,), "cumsum": (0,), "mat_mul": (0, 1),
    "dot_general": (0, 1), "conv": (0, 1, 2), "conv_transpose2d": (0, 1, 2),
    "rlx_sparse.mat_vec": (0, 3), "scatter_add": (0,), "attention": (2,), "pool": (0,),
    "onnx.ScatterElements": (0, 2), "onnx.ScatterND": (0, 2),
}
KAPPA_OPS = ("dense_solve", "batched_dense_solve", "triangular_solve", "cholesky", "svd", "qr",
             "rlx_sparse.lu_solve", "rlx_sparse.cg_solve")
NO_COND_OPS = ("rng_uniform", "rng_normal")


# -- which ops ---------------------------------------------------------------------------------
def judged_ops() -> list[str]:
    """Ops judged by a bound, an accumulating budget or an own check (not bit-exact): the ops where
    "how small an error is caught" depends on the inputs rather than on a fixed ULP count."""
    out = []
    for spec in all_ops():
        p = spec.policy
        if p.exact:
            continue
        judged = p.bound is not None or p.check is not None or spec.name in budgets.ACCUMULATING
        if judged and any(dt.is_float(d) for d in spec.dtypes):
            out.append(spec.name)
    return out


def select_cases(cases: Sequence[Case], n: int) -> list[Case]:
    """Up to ``n`` cases, round robin over (shape family, value class) in generation order: the
    matrix lists one family's cases together, so its first ``n`` would all be alike."""
    groups: dict[tuple[str, str], list[Case]] = defaultdict(list)
    for c in cases:
        groups[(c.family, c.vals)].append(c)
    queues = list(groups.values())
    out: list[Case] = []
    k = 0
    while len(out) < n and any(k < len(q) for q in queues):
        out += [q[k] for q in queues if k < len(q)][: n - len(out)]
        k += 1
    return out


# -- condition numbers -------------------------------------------------------------------------
def _ratio(terms: np.ndarray, result: np.ndarray) -> float:
    """max over finite positions of terms / |result| (0/0 = 1: every term is zero, the result is
    exact; t/0 = inf). 1 when no position is finite (nothing to perturb there anyway)."""
    t = np.asarray(terms, np.float64).reshape(-1)
    r = np.abs(np.asarray(result, np.float64)).reshape(-1)
    ok = np.isfinite(t) & np.isfinite(r)
    if not ok.any():
        return 1.0
    t, r = t[ok], r[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        c = np.where(r > 0, t / np.where(r > 0, r, 1.0), np.where(t > 0, np.inf, 1.0))
    return float(max(c.max(), 1.0))


def _wide(case: Case, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Inputs of the case's type variable in float64 (the conditioning of the exact problem, not
    of its float16 rounding, and no overflow of sum |x|); index inputs unchanged."""
    t = dt.np_dtype(case.dtype)
    return [x.astype(np.float64) if x.dtype == t else x for x in inputs]


def _cpu(case: Case, inputs: Sequence[np.ndarray], attrs: dict[str, Any] | None = None) -> np.ndarray:
    return get_backend("cpu").run(case.op, [x.copy() for x in inputs], attrs or case.attr_dict)[0]


def _linear_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """f(|x|) / |f(x)| for a map linear in each of LINEAR_INPUTS[op] (Higham's sum|terms|/|sum|)."""
    x = _wide(case, inputs)
    absx = [np.asarray(np.abs(a)) if k in LINEAR_INPUTS[case.op] else a for k, a in enumerate(x)]
    return _ratio(_cpu(case, absx), _cpu(case, x))


def _count_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """The number of factors of each output of a product: the same reduction (or scan, or
    scatter) as a sum over ones."""
    x = [np.ones_like(a) if a.dtype == np.float64 else a for a in _wide(case, inputs)]
    attrs = dict(case.attr_dict)
    if case.op.startswith("onnx."):
        attrs["reduction"] = "add"
        counts = get_backend("cpu").run(case.op, x, attrs)[0]
    else:
        op = {"reduce_prod": "reduce_sum", "cum_prod": "cumsum"}[case.op]
        counts = get_backend("cpu").run(op, x, attrs)[0]
    return float(max(np.max(counts, initial=1.0), 1.0))


def _rope_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """(|x1 c| + |x2 s|) / |x1 c - x2 s| and (|x2 c| + |x1 s|) / |x2 c + x1 s| per pair."""
    x, c, s = _wide(case, inputs)
    a = case.attr_dict
    hd, nr = a["head_dim"], a["n_rot"]
    xs = x.reshape(x.shape[:-1] + (x.shape[-1] // hd, hd))
    c, s = c[:, None, :], s[:, None, :]
    x1, x2, _ = rope_pairs(xs, hd, nr, a["style"])
    with np.errstate(all="ignore"):
        return max(_ratio(np.abs(x1 * c) + np.abs(x2 * s), x1 * c - x2 * s),
                   _ratio(np.abs(x2 * c) + np.abs(x1 * s), x2 * c + x1 * s))


def _xent_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """loss = lse sum_c t_c - sum_c t_c x_c per row: (|lse| sum|t| + sum|t x|) / |loss|."""
    x, t = _wide(case, inputs)
    with np.errstate(all="ignore"):
        m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
        m = np.where(np.isfinite(m), m, 0.0)
        lse = (m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True)))[..., 0]
        terms = np.abs(lse) * np.sum(np.abs(t), axis=-1) + np.sum(np.abs(t * x), axis=-1)
        loss = lse * np.sum(t, axis=-1) - np.sum(t * x, axis=-1)
    return _ratio(terms, loss)


def _fft_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """sum_j |x_j| / |X_k| (the transform unscaled: the norm attribute scales both alike)."""
    (x,) = _wide(case, inputs)
    z = x[..., 0] + 1j * x[..., 1]
    with np.errstate(all="ignore"):
        big = np.fft.ifft(z, axis=-1, norm="forward") if case.attr_dict["inverse"] else np.fft.fft(z, axis=-1)
        terms = np.broadcast_to(np.sum(np.abs(z), axis=-1, keepdims=True), big.shape)
    return _ratio(terms, np.abs(big))


def _centering_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """max over normalized groups of rms(x) / sqrt(var(x) + eps) (Chan-Golub-LeVeque); 1 for
    groups of one element."""
    x = _wide(case, inputs)[0]
    a = case.attr_dict
    if x.size == 0:
        return 1.0
    if case.op == "layer_norm":
        axis = a["axis"] % x.ndim
        g = x.reshape(math.prod(x.shape[:axis]), -1)
    else:
        g = x.reshape(x.shape[0] * a["num_groups"], -1)
    if g.shape[1] == 1:  # x - mean(x) = 0 exactly: the output is beta, whatever x is
        return 1.0
    with np.errstate(all="ignore"):
        kappa = np.sqrt(np.mean(g * g, axis=1) / (np.var(g, axis=1) + a["eps"]))
    return _ratio(kappa, np.ones_like(kappa))


def _score_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """1 + 2 max_ij scale |q_i|.|k_j| (+ max|bias|): the softmax weights' sensitivity to their
    scores, each score a dot product of sum |terms| scale |q_i|.|k_j|."""
    q, k, _, mask = _wide(case, inputs)
    a = case.attr_dict
    h, d = a["num_heads"], a["head_dim"]
    if q.size == 0 or k.size == 0:
        return 1.0
    scale = a["score_scale"] or 1 / math.sqrt(d)
    hkv = k.shape[-1] // d
    qa = np.abs(q).reshape(q.shape[0], q.shape[1], h, d)
    ka = np.abs(k).reshape(k.shape[0], k.shape[1], hkv, d)
    # every |q_i|.|k_j| of every head, one batched product per head (GQA: head h reads kv head
    # h // (H / Hkv)); masked-out keys count too, which only overestimates
    best = 0.0
    with np.errstate(all="ignore"):
        for head in range(h):
            kv = head // (h // hkv)
            s = np.einsum("bqd,bkd->bqk", qa[:, :, head], ka[:, :, kv])
            best = max(best, float(np.nanmax(s, initial=0.0)))
        bias = float(np.nanmax(np.abs(mask), initial=0.0)) if a["mask_kind"] == "bias" else 0.0
    return 1 + 2 * (scale * best + bias)


def _det_cond(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """sum |A o A^-T| per matrix (d det / det = tr(A^-1 dA)); for log_det over |log|det||."""
    (a,) = _wide(case, inputs)
    if a.shape[-1] == 0 or a.size == 0:
        return 1.0
    with np.errstate(all="ignore"):
        try:
            inv = np.linalg.inv(a)
        except np.linalg.LinAlgError:
            return math.inf
        terms = np.sum(np.abs(a * np.swapaxes(inv, -1, -2)), axis=(-1, -2))
        if case.op == "det":
            return float(np.nanmax(terms, initial=1.0))
        return _ratio(terms, np.linalg.slogdet(a)[1])


def _kappa(case: Case, inputs: Sequence[np.ndarray]) -> float:
    """The 2-norm condition number of the (largest-kappa) matrix of the case."""
    x = _wide(case, inputs)
    if case.op.startswith("rlx_sparse."):
        from scipy.sparse import csr_matrix  # scipy is the reference's own dependency
        vals, col, ptr = x[0], x[1], x[2]
        n = len(ptr) - 1
        a = csr_matrix((vals, col, ptr), shape=(n, n)).toarray()
    else:
        a = x[0]
        if case.op == "triangular_solve":
            a = np.tril(a) if case.attr_dict["lower"] else np.triu(a)
    if a.size == 0:
        return 1.0
    if not np.isfinite(a).all():
        return math.inf
    with np.errstate(all="ignore"):
        k = np.linalg.cond(a)
    return float(np.nanmax(np.where(np.isnan(k), np.inf, k), initial=1.0))


def condition(case: Case, inputs: Sequence[np.ndarray]) -> float | None:
    """The case's condition number (module docstring: per op), None where it has none."""
    op, attrs = case.op, case.attr_dict
    if op in NO_COND_OPS:
        return None
    if op in KAPPA_OPS:
        return _kappa(case, inputs)
    if op in ("det", "log_det"):
        return _det_cond(case, inputs)
    reduction = attrs.get("reduction")
    if op in ("reduce_prod", "cum_prod") or reduction == "mul":
        return _count_cond(case, inputs)
    if op == "attention":
        return _linear_cond(case, inputs) * _score_cond(case, inputs)
    if op in LINEAR_INPUTS and (op != "pool" or attrs["kind"] == "avg") and reduction in (None, "add"):
        return _linear_cond(case, inputs)
    fn: dict[str, Callable[[Case, Sequence[np.ndarray]], float]] = {
        "rope": _rope_cond, "softmax_cross_entropy": _xent_cond, "fft": _fft_cond,
        "layer_norm": _centering_cond, "group_norm": _centering_cond}
    return fn[op](case, inputs) if op in fn else 1.0


# -- perturbations -----------------------------------------------------------------------------
def _floats(outs: Sequence[np.ndarray]) -> list[int]:
    return [k for k, o in enumerate(outs) if dt.is_float(dt.name_of(o.dtype))]


def scaled(outs: Sequence[np.ndarray], eps: float) -> list[np.ndarray]:
    """Every float output times (1 + eps), computed in float64 and rounded once to its dtype."""
    fl = _floats(outs)
    return [dt.narrow(o.astype(np.float64) * (1 + eps), dt.name_of(o.dtype)) if k in fl else o.copy()
            for k, o in enumerate(outs)]


def one_element(outs: Sequence[np.ndarray], eps: float) -> list[np.ndarray]:
    """The largest-magnitude finite element over the float outputs times (1 + eps), rounded like
    ``scaled``; an error confined to one element is what a blocked or tiled kernel produces."""
    res = [o.copy() for o in outs]
    best: tuple[float, int, int] | None = None
    for k in _floats(outs):
        a = np.abs(outs[k].astype(np.float64)).reshape(-1)
        fin = np.flatnonzero(np.isfinite(a))
        if fin.size:
            i = int(fin[np.argmax(a[fin])])
            if best is None or a[i] > best[0]:
                best = (float(a[i]), k, i)
    if best is not None:
        _, k, i = best
        flat = res[k].reshape(-1)
        flat[i] = dt.narrow(np.array([np.float64(flat[i]) * (1 + eps)]), dt.name_of(flat.dtype))[0]
    return res


def unchanged(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    """Bit-identical outputs: the perturbation was lost in the rounding to the output dtype."""
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def perturbable(outs: Sequence[np.ndarray]) -> bool:
    """Whether any float output has a finite nonzero element (else every perturbation is a no-op)."""
    for k in _floats(outs):
        a = outs[k].astype(np.float64)
        if np.any(np.isfinite(a) & (a != 0)):
            return True
    return False


PERTURBATIONS: tuple[tuple[str, Callable[[Sequence[np.ndarray]], list[np.ndarray]]], ...] = (
    ("a", lambda o: scaled(o, SMALL)),
    ("b", lambda o: scaled(o, LARGE)),
    ("c", lambda o: one_element(o, LARGE)),
)


# -- one case, one row -------------------------------------------------------------------------
@dataclass
class Outcome:
    """One kept case: whether each perturbation still passes, whether it was a no-op, its cond."""

    case_id: str
    still: dict[str, bool]
    noop: dict[str, bool]
    cond: float | None
    asserted: bool = True  # no element the judges leave unasserted (order-dependent, unbounded)


def measure_case(case: Case) -> Outcome | str:
    """The case's Outcome, or why it is skipped (the reference or MLX raises, the unperturbed
    output fails or finds a reference bug, or there is nothing to perturb)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # NaN/inf and overflow are expected here
        return _measure_case(case)


def _measure_case(case: Case) -> Outcome | str:
    inputs = make_inputs(case)
    try:
        expected = get_backend("cpu").run(case.op, [x.copy() for x in inputs], case.attr_dict)
    except Exception as e:  # noqa: BLE001 — the reference rejects the input: nothing to judge
        return f"reference raised {type(e).__name__}"
    mlx = get_backend("mlx")
    try:
        actual = mlx.run(case.op, [x.copy() for x in inputs], case.attr_dict, TARGET.device, TARGET.mode)
    except Exception as e:  # noqa: BLE001 — an error is the matrix's finding, not ours
        return f"MLX raised {type(e).__name__}"
    if not _floats(actual) or not perturbable(actual):
        return "nothing to perturb"
    ftz = mlx.flushes_subnormals(TARGET.device)
    base = verdict(case, inputs, expected, actual, ftz=ftz)
    if base.reference_bug:
        return "reference bug"
    if not base.ok:
        return "fails unperturbed"
    still, noop = {}, {}
    for name, fn in PERTURBATIONS:
        p = fn(actual)
        noop[name] = unchanged(p, actual)
        still[name] = noop[name] or verdict(case, inputs, expected, p, ftz=ftz).ok
    return Outcome(case.id, still, noop, condition(case, inputs), not base.measured.get("unasserted"))


@dataclass
class Row:
    """The kept cases of one op x dtype and the skipped ones by reason."""

    op: str
    dtype: str
    outcomes: list[Outcome] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def measure(ops: Sequence[str], dtypes: Sequence[str], max_cases: int,
            progress: bool = False) -> list[Row]:
    """One Row per op x float dtype that MLX declares on its CPU."""
    mlx = get_backend("mlx")
    rows = []
    for op in ops:
        cases = [c for c in generate([TARGET], ops=[op], dtypes=dtypes) if c.op == op]
        for d in dict.fromkeys(c.dtype for c in cases):
            if not dt.is_float(d) or not mlx.supports(op, d, TARGET.device):
                continue
            row = Row(op, d)
            t0 = time.perf_counter()
            for case in select_cases([c for c in cases if c.dtype == d], max_cases):
                r = measure_case(case)
                if isinstance(r, str):
                    row.skipped[r] += 1
                else:
                    row.outcomes.append(r)
            if progress:
                print(f"  {op} {d}: {len(row.outcomes)} cases, {time.perf_counter() - t0:.1f} s",
                      file=sys.stderr)
            rows.append(row)
    return rows


# -- the table ---------------------------------------------------------------------------------
def _share(k: int, n: int) -> str:
    return f"{k / n:.0%} ({k}/{n})" if n else "–"


def goal_misses(row: Row, well: float) -> tuple[list[Outcome], int, list[Outcome], int]:
    """(cond < 100 cases still passing a 1e-3 scaling, how many cond < 100 cases; float32 cases
    with cond < ``well`` still passing a 1e-5 scaling, how many such cases), over the cases that
    the goal is about: a condition number, every element asserted, a perturbation that survived
    the rounding to the output dtype."""
    goal = [o for o in row.outcomes if o.cond is not None and o.asserted]
    c100 = [o for o in goal if o.cond < 100 and not o.noop["b"]]
    wc = [o for o in goal if row.dtype == "float32" and o.cond < well and not o.noop["a"]]
    return [o for o in c100 if o.still["b"]], len(c100), [o for o in wc if o.still["a"]], len(wc)


def cells(row: Row, well: float) -> tuple[str, ...]:
    n = len(row.outcomes)
    still = {p: sum(o.still[p] for o in row.outcomes) for p, _ in PERTURBATIONS}
    noop = "/".join(str(sum(o.noop[p] for o in row.outcomes)) for p, _ in PERTURBATIONS)
    m100, n100, mwc, nwc = goal_misses(row, well)
    skipped = ", ".join(f"{v} {k}" for k, v in sorted(row.skipped.items())) or "0"
    return (row.op, row.dtype, str(n), _share(still["a"], n), _share(still["b"], n),
            _share(still["c"], n), _share(len(m100), n100),
            _share(len(mwc), nwc) if row.dtype == "float32" else "–", noop, skipped)


def render(rows: Sequence[Row], well: float, markdown: bool) -> str:
    """The table: markdown (for the README) or aligned text."""
    body = [cells(r, well) for r in rows]
    if markdown:
        lines = ["| " + " | ".join(COLUMNS) + " |",
                 "|" + "|".join(["---"] * 2 + ["---:"] * (len(COLUMNS) - 2)) + "|"]
        lines += ["| " + " | ".join(c) + " |" for c in body]
        return "\n".join(lines)
    width = [max(len(x) for x in col) for col in zip(COLUMNS, *body)]
    return "\n".join("  ".join(x.ljust(w) if i < 2 else x.rjust(w) for i, (x, w) in enumerate(zip(line, width)))
                     for line in [COLUMNS, *body])


def render_misses(rows: Sequence[Row], well: float, limit: int) -> str:
    """Up to ``limit`` example cases per row that miss a goal, with their condition numbers."""
    out = []
    for r in rows:
        m100, _, mwc, _ = goal_misses(r, well)
        for label, miss in (("cond<100 passing 1e-3", m100), (f"f32 cond<{well:g} passing 1e-5", mwc)):
            for o in miss[:limit]:
                out.append(f"- {label}: {o.case_id} (cond {o.cond:.3g})")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=None, help="comma-separated globs (default: judged_ops())")
    ap.add_argument("--dtypes", default="float*,bfloat16", help="comma-separated globs (floats only)")
    ap.add_argument("--max-cases", type=int, default=40, help="cases per op x dtype (default 40)")
    ap.add_argument("--well-conditioned", type=float, default=10.0,
                    help="cond below which a float32 case counts as well conditioned (default 10)")
    ap.add_argument("--show-misses", type=int, default=3, help="example goal misses per row")
    ap.add_argument("--markdown", action="store_true", help="a markdown table (for the README)")
    ap.add_argument("--progress", action="store_true", help="per-row timings on stderr")
    args = ap.parse_args(argv)
    pats = args.ops.split(",") if args.ops else None
    ops = [o for o in judged_ops() if not pats or any(fnmatch.fnmatchcase(o, p) for p in pats)]
    t0 = time.perf_counter()
    rows = measure(ops, args.dtypes.split(","), args.max_cases, args.progress)
    print(render(rows, args.well_conditioned, args.markdown))
    misses = render_misses(rows, args.well_conditioned, args.show_misses)
    if misses:
        print("\nGoal misses (examples):\n" + misses)
    print(f"\n({time.perf_counter() - t0:.0f} s)")
    return rows


if __name__ == "__main__":
    main()
