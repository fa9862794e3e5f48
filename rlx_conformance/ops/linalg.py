"""Linear algebra (docs/ops.md): mat_mul, dot_general, dense_solve, batched_dense_solve, cholesky,
triangular_solve, det, log_det, svd, qr.

Products are judged by the dot-product error bound gamma_K * (|A||B|) per output. Solvers are
judged by backward error and, against the reference, by forward error scaled by the condition
number; factorizations by their invariants and by reconstruction, never by elementwise match of
non-unique factors; det/log_det by the LU backward error propagated through the adjugate
(judge/bounds/linalg.py has the analysis). Structured inputs (SPD, prescribed singular values,
triangular, badly scaled or extreme-magnitude matrices) come from the ``generate`` hooks here,
built deterministically by ops/_linalg_build.py; their value classes are named per op.
"""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import linalg as judge
from rlx_conformance.judge.bounds.linalg import (
    dot_general_bound,
    dot_general_dims,
    matmul_bound,
)
from rlx_conformance.ops import _linalg_build as lb
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import Attr, Input, Policy, declare
from rlx_conformance.spec.values import ACCUMULATION_CLASSES


# -- shape inference ------------------------------------------------------------------------------
def _matmul(spec, shapes, dtypes, attrs):
    """numpy matmul: rank >= 1; a 1-D lhs is a row, a 1-D rhs a column (both dropped after)."""
    a, b = shapes
    if not a or not b:
        raise SpecError(f"{spec.name}: operands need rank >= 1, got {a} and {b}")
    a2 = a if len(a) >= 2 else (1,) + a
    b2 = b if len(b) >= 2 else b + (1,)
    if a2[-1] != b2[-2]:
        raise SpecError(f"{spec.name}: contraction sizes differ: {a} @ {b}")
    batch = infer.broadcast(spec.name, [a2[:-2], b2[:-2]])
    out = batch + ((a2[-2],) if len(a) >= 2 else ()) + ((b2[-1],) if len(b) >= 2 else ())
    return [(out, dtypes[0])]


def _dot_general(spec, shapes, dtypes, attrs):
    a, b = shapes
    _, _, lbt, _, lf, rf = dot_general_dims(spec.name, a, b, attrs)
    return [(tuple(a[d] for d in lbt) + tuple(a[d] for d in lf) + tuple(b[d] for d in rf), dtypes[0])]


def _square(name: str, a) -> int:
    if len(a) < 2 or a[-1] != a[-2]:
        raise SpecError(f"{name}: needs square matrices [..., n, n], got {a}")
    return a[-1]


def _rhs(name: str, a, b, batch_rank: int) -> None:
    """b is [..., n] (one right-hand side) or [..., n, k], with the batch dims of a."""
    n = a[-1]
    batch = a[:-2]
    if len(a) - 2 != batch_rank:
        raise SpecError(f"{name}: A must have rank {batch_rank + 2}, got {a}")
    if len(b) == len(a) - 1:
        ok = b[:-1] == batch and b[-1] == n
    elif len(b) == len(a):
        ok = b[:-2] == batch and b[-2] == n
    else:
        ok = False
    if not ok:
        raise SpecError(f"{name}: right-hand side {b} does not fit A {a} (expected {batch + (n,)} "
                        f"or {batch + (n, 'k')})")


def _solve_infer(batch_rank: int):
    def run(spec, shapes, dtypes, attrs):
        a, b = shapes
        _square(spec.name, a)
        _rhs(spec.name, a, b, batch_rank)
        return [(b, dtypes[0])]
    return run


def _trisolve_infer(spec, shapes, dtypes, attrs):
    a, b = shapes
    _square(spec.name, a)
    _rhs(spec.name, a, b, len(a) - 2)
    return [(b, dtypes[0])]


def _same_square(spec, shapes, dtypes, attrs):
    _square(spec.name, shapes[0])
    return [(shapes[0], dtypes[0])]


def _det_infer(spec, shapes, dtypes, attrs):
    _square(spec.name, shapes[0])
    return [(shapes[0][:-2], dtypes[0])]


def _matrix(name, a):
    if len(a) < 2:
        raise SpecError(f"{name}: needs a matrix [..., m, n], got {a}")
    return a[:-2], a[-2], a[-1], min(a[-2], a[-1])


def _svd_infer(spec, shapes, dtypes, attrs):
    batch, m, n, k = _matrix(spec.name, shapes[0])
    out = {"u": batch + (m, k), "s": batch + (k,), "vt": batch + (k, n)}[attrs["part"]]
    return [(out, dtypes[0])]


def _qr_infer(spec, shapes, dtypes, attrs):
    batch, m, n, k = _matrix(spec.name, shapes[0])
    return [({"q": batch + (m, k), "r": batch + (k, n)}[attrs["part"]], dtypes[0])]


# -- structured inputs ---------------------------------------------------------------------------
def _cond(dtype: str) -> float:
    """Designed condition number of the ill-conditioned classes: far from singular after the
    entries are rounded to the storage dtype (float16/bfloat16 are computed in float32, so their
    ill-conditioned cases exercise mostly the rounding of the inputs)."""
    return {"float64": 1e12, "float32": 1e5, "float16": 1e2, "bfloat16": 1e2}[dtype]


def _well(stream, batch, n):
    """A well-conditioned general matrix: I + uniform noise of norm ~1/2."""
    return np.eye(n) + lb.uniform(stream, batch + (n, n), -1, 1) / (2 * math.sqrt(max(n, 1)))


def _rhs_values(stream, shape):
    return lb.uniform(stream, shape, -1, 1)


def solve_generate(stream, shapes, dtype, attrs, vals):
    """random: uniform entries; illcond: singular values geometric down to 1/cond; pivot: zero
    diagonal (partial pivoting must swap) with rows scaled by powers of two."""
    a_shape, b_shape = shapes
    batch, n = tuple(a_shape[:-2]), a_shape[-1]
    s = stream(0)
    if vals == "random":
        a = lb.uniform(s, a_shape, -1, 1)
    elif vals == "illcond":
        a = lb.with_singular_values(s, batch, n, n, lb.geometric(n, _cond(dtype)))
    elif vals == "pivot":
        a = lb.uniform(s, a_shape, -1, 1)
        if n > 1:
            a = a * (1 - np.eye(n))
        a = a * lb.pow2_scales(s, batch + (n, 1), lb.exp_range(dtype) // 2)
    else:
        raise ValueError(f"solve: unknown value class {vals}")
    return [lb.to_dtype(a, dtype), lb.to_dtype(_rhs_values(stream(1), tuple(b_shape)), dtype)]


def _spd_cond(dtype: str, n: int) -> float:
    """Safely positive definite after rounding: lambda_min = 1/cond well above n * u(dtype)."""
    return max(1.0, min(_cond(dtype) / 10, 0.25 / (max(n, 1) * dt.finfo(dtype).unit_roundoff)))


def cholesky_generate(stream, shapes, dtype, attrs, vals):
    """SPD matrices: random (eigenvalues in [1, 4]), illcond (eigenvalues geometric to 1/cond),
    scaled (D A D with D exact powers of two: badly scaled but exactly SPD)."""
    (shape,) = shapes
    batch, n = tuple(shape[:-2]), shape[-1]
    s = stream(0)
    if vals == "random":
        lam = 1 + 3 * lb.uniform(s, (n,), 0, 1)
    elif vals == "illcond":
        lam = lb.geometric(n, _spd_cond(dtype, n))
    elif vals == "scaled":
        lam = 1 + 3 * lb.uniform(s, (n,), 0, 1)
    else:
        raise ValueError(f"cholesky: unknown value class {vals}")
    a = lb.symmetric_from_eigen(s, batch, n, lam)
    if vals == "scaled":
        d = lb.pow2_scales(s, batch + (n,), lb.exp_range(dtype) // 2)
        a = a * d[..., :, None] * d[..., None, :]
    return [lb.to_dtype(a, dtype)]


def triangular_generate(stream, shapes, dtype, attrs, vals):
    """Triangular systems: the referenced triangle has diagonal magnitudes in [1, 2] and random
    off-diagonal entries (random: scaled by 1/n, well conditioned; illcond: same-signed, scaled
    for growth about cond). The other triangle holds large garbage (nan_outside: NaN and
    infinities), which the solve must never read."""
    a_shape, b_shape = shapes
    batch, n = tuple(a_shape[:-2]), a_shape[-1]
    s = stream(0)
    lower = attrs["lower"]
    if vals == "illcond" and n > 1:  # same-signed off-diagonal: the inverse grows like (1 + a/2)^n
        a = min(8.0, 2 * (_cond(dtype) ** (1 / n) - 1))
        off = -a * lb.uniform(s, a_shape, 0.5, 1)
        diag = 1 + lb.uniform(s, batch + (n,), 0, 1)
    else:
        off = lb.uniform(s, a_shape, -1, 1) / max(n, 1)
        sign = np.where(s.coin(math.prod(batch + (n,))), -1.0, 1.0).reshape(batch + (n,))
        diag = (1 + lb.uniform(s, batch + (n,), 0, 1)) * sign
    t = (np.tril(off, -1) if lower else np.triu(off, 1)) + diag[..., :, None] * np.eye(n)
    garbage = lb.uniform(s, a_shape, -1e3, 1e3)
    if vals == "nan_outside":
        pick = s.choice(math.prod(a_shape), 3).reshape(a_shape)
        garbage = np.where(pick == 0, np.nan, np.where(pick == 1, np.inf, -np.inf))
    elif vals not in ("random", "illcond"):
        raise ValueError(f"triangular_solve: unknown value class {vals}")
    other = np.triu(np.ones((n, n), bool), 1) if lower else np.tril(np.ones((n, n), bool), -1)
    a = np.where(other, garbage, t)
    return [lb.to_dtype(a, dtype), lb.to_dtype(_rhs_values(stream(1), tuple(b_shape)), dtype)]


def _max_exp(dtype: str) -> int:
    return int(math.log2(dt.finfo(dtype).max))


def _scale_cap(dtype: str) -> int:
    """Largest matrix scale exponent: entries stay finite in the storage dtype, and the small ones
    stay clear of the compute dtype's subnormals (where LU's error analysis no longer holds)."""
    cdt = dt.compute_dtype(dtype)
    return min(_max_exp(dtype) - 3, int(-math.log2(dt.finfo(cdt).tiny)) - 30)


def _row_scale_cap(dtype: str) -> int:
    """For rows scaled by 2^E and 2^-E, LU multipliers are ~2^-2E: keep them normal too."""
    cdt = dt.compute_dtype(dtype)
    return min(_max_exp(dtype) - 3, (int(-math.log2(dt.finfo(cdt).tiny)) - 30) // 2)


def det_generate(stream, shapes, dtype, attrs, vals):
    """random: uniform entries. singular: last row repeats the first (det exactly 0). balanced:
    half the rows scaled by 2^E and half by 2^-E, so det is moderate but the running product of
    the pivots leaves the compute dtype's range. extreme: 2^g M with |det| ~ 2^(+-1.2 max_exp),
    beyond the range of the compute dtype (the result over- or underflows)."""
    (shape,) = shapes
    batch, n = tuple(shape[:-2]), shape[-1]
    s = stream(0)
    cdt = dt.compute_dtype(dtype)
    cap = _scale_cap(dtype)
    if vals == "random" or n == 0:
        a = lb.uniform(s, shape, -1, 1)
    elif vals == "singular":
        a = lb.uniform(s, shape, -1, 1)
        a[..., -1, :] = a[..., 0, :] if n > 1 else 0.0
    elif vals == "balanced":
        e = min(_row_scale_cap(dtype), math.ceil(3 * _max_exp(cdt) / max(n, 1)))
        rows = np.where(np.arange(n) < n // 2, e, np.where(np.arange(n) >= n - n // 2, -e, 0))
        a = np.ldexp(_well(s, batch, n), rows[:, None])
    elif vals == "extreme":
        g = min(cap, math.ceil(1.2 * _max_exp(cdt) / max(n, 1)))
        sign = np.where(s.coin(max(math.prod(batch), 1)), 1, -1).reshape(batch + (1, 1)) if batch else \
            (1 if s.coin(1)[0] else -1)
        a = np.ldexp(_well(s, batch, n), g * sign)
    else:
        raise ValueError(f"det: unknown value class {vals}")
    return [lb.to_dtype(a, dtype)]


def _sigma(stream, dtype, k, vals):
    if vals == "clustered":  # repeated singular values: whole subspaces are free
        block = max(1, k // 3)
        return np.array([2.0 ** -(i // block) for i in range(k)])
    if vals == "graded":  # geometric to 1/cond, and rank deficient
        s = lb.geometric(k, _cond(dtype))
        if k > 1:
            s[k - max(1, k // 4):] = 0.0
        return s
    if vals == "rankdef":
        s = 1 + lb.uniform(stream, (k,), 0, 1)
        s = -np.sort(-s)
        s[max(1, k // 2):] = 0.0
        return s
    raise ValueError(f"unknown value class {vals}")


def factor_generate(stream, shapes, dtype, attrs, vals):
    """Rectangular matrices for svd/qr: random uniform entries, or prescribed singular values
    (clustered, graded, rankdef) in random orthogonal bases."""
    (shape,) = shapes
    batch, m, n = tuple(shape[:-2]), shape[-2], shape[-1]
    s = stream(0)
    if vals == "random" or min(m, n) == 0:
        a = lb.uniform(s, shape, -1, 1)
    else:
        a = lb.with_singular_values(s, batch, m, n, _sigma(s, dtype, min(m, n), vals))
    return [lb.to_dtype(a, dtype)]


# -- error inputs ----------------------------------------------------------------------------------
def _f32(*rows):
    return np.array(rows, np.float32)


def _solve_errors():
    return [("non-square A", [np.ones((2, 3), np.float32), np.ones(2, np.float32)], {}),
            ("b does not fit A", [np.eye(3, dtype=np.float32), np.ones(4, np.float32)], {}),
            ("singular A", [np.zeros((3, 3), np.float32), np.ones(3, np.float32)], {})]


def _chol_errors():
    return [("non-square", [np.ones((2, 3), np.float32)], {}),
            ("not positive definite", [_f32([1, 2], [2, 1])], {}),
            ("negative diagonal", [_f32([-1, 0], [0, 1])], {})]


# -- declarations ----------------------------------------------------------------------------------
FLOATS = dt.FLOATS

declare(name="mat_mul", family="linalg", doc="numpy matmul: batched, broadcast batch dims; a 1-D "
        "operand is a row (lhs) or a column (rhs) that is dropped from the result",
        inputs=(Input("a", ranks=(1, None)), Input("b", ranks=(1, None))), dtypes=FLOATS, infer=_matmul, shapes="linalg_matmul",
        policy=Policy(bound=matmul_bound, bound_reason="any summation order: gamma_K * (|A||B|)"),
        error_inputs=lambda: [("contraction mismatch", [np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)], {}),
                              ("scalar operand", [np.ones((), np.float32), np.ones(3, np.float32)], {})],
        values=("random", "special") + ACCUMULATION_CLASSES)

_DIMS = ((), (0,), (1,), (2,), (2, 3), (1, 0))
declare(name="dot_general", family="linalg",
        doc="XLA DotGeneral: contract lhs_contracting with rhs_contracting, batch over "
            "lhs_batch/rhs_batch; output dims are batch, lhs free, rhs free (each in order)",
        inputs=(Input("lhs"), Input("rhs")), dtypes=FLOATS, infer=_dot_general,
        attrs=(Attr("lhs_contracting", "ints", default=(), sweep=_DIMS[:5]),
               Attr("rhs_contracting", "ints", default=(), sweep=(_DIMS[0], _DIMS[1], _DIMS[2], _DIMS[5])),
               Attr("lhs_batch", "ints", default=(), sweep=((), (0,), (1,))),
               Attr("rhs_batch", "ints", default=(), sweep=((), (0,), (1,)))),
        shapes="linalg_dot_general",
        policy=Policy(bound=dot_general_bound, bound_reason="any summation order: gamma_K * (|A||B|)"),
        error_inputs=lambda: [("contracting sizes differ", [np.ones((2, 3), np.float32), np.ones((4, 2), np.float32)],
                               {"lhs_contracting": (1,), "rhs_contracting": (0,)}),
                              ("unpaired dims", [np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)],
                               {"lhs_contracting": (1,), "rhs_contracting": ()})],
        values=("random",))  # non-finite propagation is mat_mul's (same products)

_SOLVE_POLICY = Policy(check=judge.solve_check, check_reason="backward error of GEPP (Higham Thm 9.4) "
                       "and kappa-scaled forward error")
declare(name="dense_solve", family="linalg", doc="x with A x = b; A [n, n], b [n] or [n, k]; singular A is an error",
        inputs=(Input("A", ranks=(2, 2)), Input("b", ranks=(1, 2))), dtypes=FLOATS, infer=_solve_infer(0), shapes="linalg_solve",
        values=("random", "illcond", "pivot"), generate=solve_generate, policy=_SOLVE_POLICY,
        error_inputs=_solve_errors)
declare(name="batched_dense_solve", family="linalg",
        doc="dense_solve per batch entry: A [B, n, n], b [B, n] or [B, n, k]",
        inputs=(Input("A", ranks=(3, None)), Input("b", ranks=(2, None))), dtypes=FLOATS, infer=_solve_infer(1),
        shapes="linalg_batched_solve", values=("random", "illcond"), generate=solve_generate,
        policy=_SOLVE_POLICY,
        error_inputs=lambda: [("unbatched A", [np.eye(3, dtype=np.float32), np.ones(3, np.float32)], {}),
                              ("batch sizes differ",
                               [np.ones((2, 3, 3), np.float32), np.ones((3, 3), np.float32)], {})])

declare(name="cholesky", family="linalg",
        doc="lower-triangular L with positive diagonal, L L^T = A, for symmetric positive definite "
            "A [..., n, n]; a matrix that is not positive definite is an error",
        inputs=(Input("A", ranks=(2, None)),), dtypes=FLOATS, infer=_same_square, shapes="linalg_square",
        values=("random", "illcond", "scaled"), generate=cholesky_generate,
        policy=Policy(check=judge.cholesky_check, check_reason="structure, reconstruction (Higham "
                      "Thm 10.3), kappa-scaled forward error"),
        error_inputs=_chol_errors)

declare(name="triangular_solve", family="linalg",
        doc="X with op(T) X = B, T the lower (lower=true) or upper triangle of A [..., n, n] (the "
            "other triangle is never read), op(T) = T^T when transpose; B [..., n] or [..., n, k]",
        inputs=(Input("A", ranks=(2, None)), Input("B", ranks=(1, None))), dtypes=FLOATS, infer=_trisolve_infer,
        attrs=(Attr("lower", "bool", default=True, sweep=(True, False)),
               Attr("transpose", "bool", default=False, sweep=(False, True))),
        shapes="linalg_trisolve", values=("random", "illcond", "nan_outside"),
        generate=triangular_generate,
        policy=Policy(check=judge.triangular_check, check_reason="componentwise backward error "
                      "(Higham Thm 8.5) and Skeel-condition forward error"),
        error_inputs=lambda: [("zero on the diagonal", [_f32([1, 0], [1, 0]), np.ones(2, np.float32)], {}),
                              ("B does not fit", [np.eye(3, dtype=np.float32), np.ones(2, np.float32)], {})])

_DET_VALUES = ("random", "singular", "balanced", "extreme")
declare(name="det", family="linalg", doc="determinant of A [..., n, n] (1 for n = 0)",
        inputs=(Input("A", ranks=(2, None)),), dtypes=FLOATS, infer=_det_infer, shapes="linalg_square",
        values=_DET_VALUES, generate=det_generate,
        policy=Policy(bound=judge.det_bound, bound_reason="LU backward error through the "
                      "adjugate: eps * sum |P||L||U| |adj A|^T + gamma_n |det|"),
        error_inputs=lambda: [("non-square", [np.ones((2, 3), np.float32)], {})])
declare(name="log_det", family="linalg", doc="log |det A| of A [..., n, n] (-inf where the LU factorization meets a zero pivot; a matrix "
            "singular only in exact arithmetic (two equal rows) may factor with no zero pivot and give "
            "a finite value, within the det's error bound of singular; 0 for n = 0)",
        inputs=(Input("A", ranks=(2, None)),), dtypes=FLOATS, infer=_det_infer, shapes="linalg_square",
        values=_DET_VALUES, generate=det_generate,
        policy=Policy(bound=judge.log_det_bound, bound_reason="relative det bound + rounding of "
                      "the summed logs of the pivots"),
        error_inputs=lambda: [("non-square", [np.ones((2, 3), np.float32)], {})])

declare(name="svd", family="linalg",
        doc="thin SVD A = U diag(s) V^T of A [..., m, n], k = min(m, n): part u [..., m, k], "
            "s [..., k] (descending), vt [..., k, n]",
        inputs=(Input("A", ranks=(2, None)),), dtypes=FLOATS, infer=_svd_infer,
        attrs=(Attr("part", "enum", default="s", choices=("u", "s", "vt"), sweep=("u", "s", "vt")),),
        shapes="linalg_rect", values=("random", "clustered", "graded"), generate=factor_generate,
        policy=Policy(check=judge.svd_check, check_reason="Weyl bound on s; orthonormality and "
                      "Wedin sin-theta bound on singular subspaces"),
        error_inputs=lambda: [("rank 1", [np.ones(3, np.float32)], {"part": "s"})])

declare(name="qr", family="linalg",
        doc="reduced QR A = Q R of A [..., m, n], k = min(m, n): part q [..., m, k] (orthonormal "
            "columns), r [..., k, n] (upper triangular); signs are free",
        inputs=(Input("A", ranks=(2, None)),), dtypes=FLOATS, infer=_qr_infer,
        attrs=(Attr("part", "enum", default="r", choices=("q", "r"), sweep=("q", "r")),),
        shapes="linalg_rect", values=("random", "graded", "rankdef"), generate=factor_generate,
        policy=Policy(check=judge.qr_check, check_reason="orthonormality, triangularity, R^T R = A^T A, "
                      "canonical-sign comparison where well conditioned"),
        error_inputs=lambda: [("rank 1", [np.ones(3, np.float32)], {"part": "r"})])
