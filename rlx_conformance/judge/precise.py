"""The precise oracle: an independent, high-precision value of a floating op's result, rounded
ONCE to the output dtype.

Not to be confused with :mod:`rlx_conformance.judge.onnx_oracles`, which cross-checks the ONNX custom ops
against onnx.reference and onnxruntime (other implementations of the same spec). This module
computes what the answer *is*, to well beyond the output precision, so the harness can tell
which of two disagreeing backends is right, and whether the CPU reference itself is.

How each op is computed, and why it is independent of ``backends/cpu``:

* **Elementwise ops** (activations, binary arithmetic, fma, clamp, float-valued casts): MPFR
  through gmpy2, one element at a time (each distinct input tuple once). Primitive functions
  that MPFR rounds correctly (exp, log, sin, cos, tan, atan, tanh, erf, expm1, sqrt, 1/sqrt,
  + - * /, fmod, pow, atan2, fma, rint/floor/ceil) are evaluated directly in a context that *is*
  the output format (precision, exponent range, subnormals), so the result is the correctly
  rounded value. Composite activations (gelu, silu, mish, ...) are evaluated at ``p + 64`` bits
  in a numerically stable form of the op's definition (docs/ops.md), then rounded once; rational ones
  (hard_sigmoid, hard_swish, softsign) exactly, as rationals. The CPU reference instead runs
  numpy/scipy in float64 (or float64 on float64 inputs): another library, another precision,
  and for several ops another formula. For unary ops on float16 / bfloat16 inputs,
  :mod:`rlx_conformance.judge.precise_fast` first decides the elements whose correctly rounded value
  float64 interval arithmetic proves (most of them), and MPFR evaluates the rest: the answers
  are MPFR's either way, only faster.
* **Reductions and scans** (reduce_sum/mean/prod, softmax, cumsum, cum_prod): numpy in the
  x87 80-bit ``longdouble`` (64-bit significand, exponent range far beyond float64), vectorized,
  then rounded once via round-to-odd (to float32: C's conversion, itself one correct rounding;
  rounding.round_ld). Sums are pairwise (numpy's, over the reduced axes moved into one
  contiguous last axis) and running sums recursive doubling (or, where every partial sum is
  exact in long double, :func:`_sums_exact`, a plain running sum: the same values), so every
  sum is a tree of depth <= 3.5 ceil(log2 n) in 2^-64 roundings: its error before the final
  rounding is at most 3.5 ceil(log2 n) 2^-64 sum|x|, 2^11 times inside the float64 accuracy
  budget (3.5 ceil(log2 n) 2^-53 sum|x|, cases/accuracy.toml) at every n; a sequential long
  double sum would not be (n 2^-64 is 13 times the float64 budget at n = 10^6), unless exact.
  Products err by gamma_(n-1)(2^-64) in any order, 2^11 times inside their budget
  gamma_(n-1)(2^-53). Where ``longdouble`` is no wider than float64 (macOS on arm64, Windows),
  MPFR at 128 bits, element by element (slow but right).

Ops without a precise oracle are listed in :data:`NO_ORACLE` with the reason.

Rounding once: :func:`rlx_conformance.judge.rounding.round_dd` rounds an unevaluated sum
hi + lo of float64s to float64, float32, float16 or bfloat16 with a single rounding
(round-to-odd into a format with >= p + 2 bits, then round-to-nearest-even: Boldo & Melquiond,
"Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC
2008). Plain ``astype`` from longdouble to float16 rounds twice (through float64) and is not used.
"""
from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gmpy2
import numpy as np
from gmpy2 import mpfr, mpq

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge import mpfr_setup, precise_fast  # noqa: F401 — mpfr_setup undoes GMP's SIGFPE handler
from rlx_conformance.judge.rounding import round_ld

# -- formats -----------------------------------------------------------------------------------
# (precision p, MPFR emin, MPFR emax): MPFR's significand is in [1/2, 1), so IEEE emin - p + 2
# and emax + 1 (IEEE binary formats: emin = 1 - bias, subnormals via subnormalize).
FORMATS = {
    "float64": (53, -1073, 1024),
    "float32": (24, -148, 128),
    "float16": (11, -23, 16),
    "bfloat16": (8, -132, 128),
}
GUARD_BITS = 64  # working precision of composite functions: p + 64 bits

WIDE_LONGDOUBLE = np.finfo(np.longdouble).nmant >= 63  # x87 extended (Linux/x86-64)


@functools.cache
def target_context(dtype: str) -> gmpy2.context:
    """An MPFR context that is the IEEE format ``dtype``: one operation in it is correctly
    rounded to that format, subnormals and overflow included."""
    p, emin, emax = FORMATS[dtype]
    return gmpy2.context(precision=p, emin=emin, emax=emax, subnormalize=True,
                         round=gmpy2.RoundToNearest)


@functools.cache
def working_context(dtype: str) -> gmpy2.context:
    return gmpy2.context(precision=FORMATS[dtype][0] + GUARD_BITS, round=gmpy2.RoundToNearest)


def version() -> str:
    """A digest of the oracle's source (this module, its fast path precise_fast.py and the
    rounding both use, rounding.py): part of the exhaustive mode's disk-cache key, so a change to
    any of them invalidates what was cached. The fast path is meant never to change an answer,
    but the key names the code that made it."""
    h = hashlib.sha256()
    for path in (Path(__file__), Path(__file__).with_name("precise_fast.py"),
                 Path(__file__).with_name("rounding.py")):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# -- elementwise definitions -------------------------------------------------------------------
# Each entry: (kind, fn). kind "direct": fn runs in the output format's context (MPFR rounds it
# correctly); "wide": fn runs at p + 64 bits and the result is rounded once; "exact": fn returns
# an exact mpq (or a special mpfr), rounded once. fn(args, attrs) takes exact mpfr inputs.
_INF = mpfr("inf")
_NINF = mpfr("-inf")
_NAN = mpfr("nan")
_PZ = mpfr(0.0)
_NZ = mpfr(-0.0)


def _nan(x) -> bool:
    return gmpy2.is_nan(x)


def _inf(x) -> bool:
    return gmpy2.is_infinite(x)


def _neg(x) -> bool:
    return gmpy2.is_signed(x)


def _limits(at_minus_inf, at_plus_inf):
    """Wrap a composite: NaN -> NaN, +-inf -> the function's limits (docs/ops.md, elementwise: at
    +-inf an activation takes its limit), finite -> fn."""
    def deco(fn):
        def run(args, attrs):
            (x,) = args
            if _nan(x):
                return _NAN
            if _inf(x):
                return at_minus_inf if _neg(x) else at_plus_inf
            return fn(x)
        return run
    return deco


def _softplus(x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, no cancellation."""
    return (x if x > 0 else 0) + gmpy2.log1p(gmpy2.exp(-abs(x)))


def _sigmoid(x):
    return 1 / (1 + gmpy2.exp(-x))


@_limits(_NZ, _INF)
def _gelu(x):
    if x < -40:  # |gelu(x)| < 1e-346: below every format's smallest subnormal
        return _NZ
    if x > 1000:  # 1 - Phi(x) < e^-5e5: x itself to any precision in use
        return x
    return x / 2 * gmpy2.erfc(-x / gmpy2.sqrt(mpfr(2)))


@_limits(_NZ, _INF)
def _gelu_approx(x):
    # 0.5 x (1 + tanh z) = x sigmoid(2z): the same function, without cancellation for z << 0.
    z = gmpy2.sqrt(2 / gmpy2.const_pi()) * (x + mpfr(mpq(44715, 1000000)) * x * x * x)
    return x * _sigmoid(2 * z)


@_limits(_NZ, _INF)
def _silu(x):
    return x * _sigmoid(x)


@_limits(_PZ, mpfr(1))
def _sigmoid_op(x):
    return _sigmoid(x)


@_limits(_PZ, _INF)
def _softplus_op(x):
    return _softplus(x)


@_limits(_NZ, _INF)
def _mish(x):
    return x * gmpy2.tanh(_softplus(x))


@_limits(_NINF, _PZ)
def _log_sigmoid(x):
    return -_softplus(-x)


def _rational(fn, zero_sign):
    """Exact rational evaluation; mpq has no signed zero, so ``zero_sign(x)`` says whether an
    exact zero result is -0 (the IEEE sign of the defining formula)."""
    def run(x):
        q = fn(mpq(x))
        if q == 0:
            return _NZ if zero_sign(x) else _PZ
        return q
    return run


def _hard_swish_q(q):
    return q * min(max(q + 3, mpq(0)), mpq(6)) / 6


def _hard_sigmoid_q(q):
    return min(max((q + 3) / 6, mpq(0)), mpq(1))


def _softsign_q(q):
    return q / (1 + abs(q))


def _unary_direct(f):
    def run(args, attrs):
        return f(args[0])
    return run


def _rsqrt(x):
    # IEEE 754-2008 rSqrt: rSqrt(+-0) = +-inf (MPFR's rec_sqrt gives +inf for -0).
    if gmpy2.is_zero(x):
        return _NINF if _neg(x) else _INF
    return gmpy2.rec_sqrt(x)


def _sign(x):
    if _nan(x):
        return _NAN
    if gmpy2.is_zero(x):
        return x
    return mpfr(-1) if _neg(x) else mpfr(1)


def _relu(x):
    if _nan(x):
        return x
    return x if x > 0 else _PZ


def _elu(x):
    return x if (_nan(x) or x > 0) else gmpy2.expm1(x)


def _maxmin(pick_max: bool):
    def run(args, attrs):
        a, b = args
        if _nan(a) or _nan(b):
            return _NAN
        if a == b:  # +-0: IEEE maximum/minimum order -0 < +0 (the sign is not asserted)
            return (b if _neg(a) else a) if pick_max else (a if _neg(a) else b)
        return (a if a > b else b) if pick_max else (a if a < b else b)
    return run


def _clamp(args, attrs):
    (x,) = args
    if _nan(x):
        return x
    lo, hi = mpfr(attrs["min"]), mpfr(attrs["max"])
    return min(max(x, lo), hi) if lo <= hi else hi  # numpy.clip's rule when min > max


def _binary(f):
    def run(args, attrs):
        return f(*args)
    return run


def _exact_unary(fn, zero_sign, limits):
    lo_lim, hi_lim = limits
    r = _rational(fn, zero_sign)

    def run(args, attrs):
        (x,) = args
        if _nan(x):
            return _NAN
        if _inf(x):
            return lo_lim if _neg(x) else hi_lim
        return r(x)
    return run


def _cast(args, attrs):
    return args[0]  # the exact input value; the output context rounds it once


ELEMENTWISE: dict[str, tuple[str, Callable[..., Any]]] = {
    # correctly rounded MPFR primitives, evaluated in the output format
    "exp": ("direct", _unary_direct(gmpy2.exp)),
    "log": ("direct", _unary_direct(gmpy2.log)),
    "sqrt": ("direct", _unary_direct(gmpy2.sqrt)),
    "rsqrt": ("direct", _unary_direct(_rsqrt)),
    "sin": ("direct", _unary_direct(gmpy2.sin)),
    "cos": ("direct", _unary_direct(gmpy2.cos)),
    "tan": ("direct", _unary_direct(gmpy2.tan)),
    "atan": ("direct", _unary_direct(gmpy2.atan)),
    "tanh": ("direct", _unary_direct(gmpy2.tanh)),
    "erf": ("direct", _unary_direct(gmpy2.erf)),
    "recip": ("direct", _unary_direct(lambda x: 1 / x)),
    "elu": ("direct", _unary_direct(_elu)),
    # exactly defined (no rounding)
    "neg": ("direct", _unary_direct(lambda x: -x)),
    "abs": ("direct", _unary_direct(abs)),
    "round": ("direct", _unary_direct(gmpy2.rint)),  # context RoundToNearest: ties to even
    "floor": ("direct", _unary_direct(gmpy2.rint_floor)),
    "ceil": ("direct", _unary_direct(gmpy2.rint_ceil)),
    "sign": ("direct", _unary_direct(_sign)),
    "relu": ("direct", _unary_direct(_relu)),
    "clamp": ("direct", _clamp),
    # composite transcendental activations, at p + 64 bits, rounded once
    "gelu": ("wide", _gelu),
    "gelu_approx": ("wide", _gelu_approx),
    "silu": ("wide", _silu),
    "sigmoid": ("wide", _sigmoid_op),
    "softplus": ("wide", _softplus_op),
    "mish": ("wide", _mish),
    "log_sigmoid": ("wide", _log_sigmoid),
    # rational activations, exactly
    "hard_swish": ("direct", _exact_unary(_hard_swish_q, lambda x: _neg(x), (_NZ, _INF))),
    "hard_sigmoid": ("direct", _exact_unary(_hard_sigmoid_q, lambda x: False, (_PZ, mpfr(1)))),
    "softsign": ("direct", _exact_unary(_softsign_q, lambda x: _neg(x), (mpfr(-1), mpfr(1)))),
    # binary / ternary IEEE operations (MPFR follows IEEE 754 / C99 Annex F special cases)
    "add": ("direct", _binary(lambda a, b: a + b)),
    "sub": ("direct", _binary(lambda a, b: a - b)),
    "mul": ("direct", _binary(lambda a, b: a * b)),
    "div": ("direct", _binary(lambda a, b: a / b)),
    "mod": ("direct", _binary(gmpy2.fmod)),
    "pow": ("direct", _binary(lambda a, b: a ** b)),
    "atan2": ("direct", _binary(gmpy2.atan2)),
    "max": ("direct", _maxmin(True)),
    "min": ("direct", _maxmin(False)),
    "fma": ("direct", _binary(gmpy2.fma)),
    "cast": ("direct", _cast),
}

REDUCTIONS = ("reduce_sum", "reduce_mean", "reduce_prod", "softmax", "cumsum", "cum_prod")

# Ops with float outputs and no precise oracle, and why. Everything else without an entry in
# ELEMENTWISE or REDUCTIONS is not a floating computation (ints, bools, indices, data movement).
NO_ORACLE = {
    "where": "a selection: no arithmetic; judged bit-exactly against the reference",
    "reduce_max": "a selection (NaN-propagating max): exact, judged bit-exactly",
    "reduce_min": "a selection (NaN-propagating min): exact, judged bit-exactly",
    "cum_max": "a running selection: exact, judged bit-exactly",
    "layer_norm": "not yet: judged by the error bound in rlx_conformance/judge/bounds/nn.py",
    "rms_norm": "not yet: judged by the error bound in rlx_conformance/judge/bounds/nn.py",
    "group_norm": "not yet: judged by the error bound in rlx_conformance/judge/bounds/nn.py",
    "batch_norm_inference": "not yet: judged by the error bound in rlx_conformance/judge/bounds/nn.py",
    "attention": "not yet: judged by the error bound in rlx_conformance/judge/bounds/nn.py",
    "softmax_cross_entropy": "not yet (a logsumexp): judged by its error bound",
    "rope": "not yet: judged by its error bound",
    "mat_mul": "dot products: judged by the gamma_K sum|a||b| bound, not elementwise",
    "dot_general": "dot products: judged by the gamma_K sum|a||b| bound, not elementwise",
    "conv": "dot products: judged by the gamma_K sum|w||x| bound",
    "conv_transpose2d": "dot products: judged by the gamma_K sum|w||x| bound",
    "pool": "max pooling is a selection; average pooling is judged by its bound",
    "fft": "judged by Higham's Thm 24.2 bound, not elementwise",
    "linalg (dense_solve, cholesky, det, svd, qr, ...)": "judged by backward error / reconstruction",
    "rng_uniform / rng_normal": "random: judged by distribution tests",
    "quantize / dequantize / fake_quantize": "exact but for near ties of x / scale: judged against the reference (itself checked against onnx.reference QuantizeLinear / DequantizeLinear)",
    "custom ops (rlx_sparse.*, onnx.*)": "judged by error bounds and the ONNX oracles (onnx_oracles.py)",
}


def has_oracle(op: str) -> bool:
    return op in ELEMENTWISE or op in REDUCTIONS


def is_float_output(dtype: str) -> bool:
    return dtype in FORMATS


# -- elementwise evaluation --------------------------------------------------------------------
def _exact_values(x: np.ndarray) -> list:
    """Python numbers equal to each element: floats (exact for every float dtype), ints."""
    if x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
        return [int(v) for v in x.tolist()]
    return x.astype(np.float64).tolist()


def _finish(y):
    """Round a direct result into the active (output) context: exact rationals once, mpfr again
    (a no-op for a result already rounded there)."""
    return mpfr(y) if isinstance(y, mpq) else +y


def _key_bits(x: np.ndarray) -> np.ndarray:
    """A uint64 per element identifying its value exactly (float bits; -0 != +0)."""
    if x.dtype == np.bool_ or np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int64).view(np.uint64)
    return x.astype(np.float64).view(np.uint64)


def _near_midpoint(y, dtype: str, prec: int) -> bool:
    """Is the p + 64-bit value y within a few of its own ulps of a midpoint (or on one) of the
    output format's grid, where rounding it could go the other way than the exact value?"""
    if not gmpy2.is_regular(y):
        return False
    ctx = target_context(dtype)
    with gmpy2.context(ctx, round=gmpy2.RoundDown):
        lo = +y
    with gmpy2.context(ctx, round=gmpy2.RoundUp):
        hi = +y
    if lo == hi:
        return False
    with gmpy2.context(precision=prec + 8):
        mid = (lo + hi) / 2
        return abs(y - mid) <= abs(y) * mpfr(2) ** (8 - prec)


def _round_wide(fn, args, attrs, y, dtype: str):
    """Round a composite evaluated at p + 64 bits once to the output format. Where it sits on or
    next to a midpoint (for tiny x, silu(x) = x/2 + x^2/4 is a midpoint to 64 extra bits), evaluate
    again at 4, 16, 64 times the precision first (Ziv's strategy); the results that are exactly
    midpoints are the rational ops', which are evaluated exactly instead."""
    prec = working_context(dtype).precision
    while _near_midpoint(y, dtype, prec) and prec < 8192:
        prec *= 4
        with gmpy2.context(precision=prec):
            y = fn(args, attrs)
    with target_context(dtype):
        return +y


def _mpfr_values(op: str, cols: Sequence[list], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """THE definition: MPFR, one input tuple (a row across ``cols``) at a time, each result
    rounded once to ``out_dtype`` and returned as float64."""
    kind, fn = ELEMENTWISE[op]
    rows = [[mpfr(v, 128) for v in args] for args in zip(*cols)]
    if kind == "wide":
        with working_context(out_dtype):
            ys = [fn(r, attrs) for r in rows]
        return np.array([float(_round_wide(fn, r, attrs, y, out_dtype)) for r, y in zip(rows, ys)],
                        np.float64)
    with target_context(out_dtype):
        return np.array([float(_finish(fn(r, attrs))) for r in rows], np.float64)


def elementwise(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                out_dtype: str, *, fast: bool = True) -> np.ndarray:
    """The op's result for every element (inputs broadcast), rounded once to ``out_dtype``.

    ``fast``: let precise_fast decide the elements it can prove MPFR's answer for (unary ops on
    float16 / bfloat16 inputs; bit-identical by construction, checked exhaustively by
    benchmarks/verify_fast_oracle.py); the rest, and everything with ``fast=False``, is MPFR."""
    arrays = np.broadcast_arrays(*[np.asarray(x) for x in inputs])
    shape = arrays[0].shape if arrays else ()
    n = int(np.prod(shape)) if shape else 1
    out = np.empty(n, np.float64)
    if n == 0:
        return out.reshape(shape).astype(dt.np_dtype(out_dtype))
    keys = np.stack([_key_bits(a).reshape(-1) for a in arrays], axis=1)
    uniq, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    firsts = [a.reshape(-1)[first] for a in arrays]
    vals = np.full(len(first), np.nan)
    todo = np.arange(len(first))
    if fast and precise_fast.applies(op, [a.dtype for a in arrays], attrs, out_dtype):
        vals, decided = precise_fast.decide(op, firsts[0], attrs, out_dtype)
        todo = np.flatnonzero(~decided)
    if todo.size:
        vals[todo] = _mpfr_values(op, [_exact_values(f[todo]) for f in firsts], attrs, out_dtype)
    out = vals[inverse.reshape(-1)]
    return out.reshape(shape).astype(dt.np_dtype(out_dtype))


# -- rounding once from MPFR values ------------------------------------------------------------
def round_mpfr(values: Sequence[Any], dtype: str, shape=None) -> np.ndarray:
    """MPFR values (any precision) or exact rationals rounded once to ``dtype``."""
    ctx = target_context(dtype)
    with ctx:
        out = np.array([float(mpfr(v) if isinstance(v, mpq) else +v) for v in values], np.float64)
    out = out.reshape(shape if shape is not None else (len(values),))
    return out.astype(dt.np_dtype(dtype))


# -- reductions and scans ----------------------------------------------------------------------
def _reduce_axes(x: np.ndarray, axes) -> tuple[int, ...]:
    return tuple(a % x.ndim for a in axes) if axes and x.ndim else tuple(range(x.ndim))


def _mp_reduce(x: np.ndarray, axes, keep_dim: bool, dtype: str, fn) -> np.ndarray:
    """MPFR fallback: move the reduced axes last, apply fn(list of mpfr) per row at 128 bits."""
    ax = _reduce_axes(x, axes)
    rest = [a for a in range(x.ndim) if a not in ax]
    xt = np.transpose(x, rest + list(ax)) if x.ndim else x
    out_shape = tuple(x.shape[a] for a in rest)
    rows = xt.reshape(int(np.prod(out_shape)) if out_shape else 1, -1)
    vals = []
    with gmpy2.context(precision=128):
        for r in rows:
            vals.append(fn([mpfr(v) for v in r.astype(np.float64).tolist()]))
    res = round_mpfr(vals, dtype, out_shape)
    if keep_dim:
        res = res.reshape(tuple(1 if a in ax else s for a, s in enumerate(x.shape)))
    return res


def _mp_sum(vals):
    return gmpy2.fsum(vals) if vals else mpfr(0)


def _mp_prod(vals):
    p = mpfr(1)
    for v in vals:
        p = p * v
    return p


def _ld_rows(x: np.ndarray, ax: tuple[int, ...]) -> np.ndarray:
    """``x`` in long double with the reduced axes ``ax`` moved last and flattened into one
    contiguous axis (where numpy's pairwise summation applies)."""
    rest = [a for a in range(x.ndim) if a not in ax]
    n = int(np.prod([x.shape[a] for a in ax])) if ax else 1
    w = np.ascontiguousarray(np.transpose(x, rest + list(ax)).astype(np.longdouble))
    return w.reshape([x.shape[a] for a in rest] + [n])


def _reduce(op: str, x: np.ndarray, attrs: Mapping[str, Any], dtype: str) -> np.ndarray:
    axes = attrs.get("axes") or None
    keep = attrs.get("keep_dim", False)
    ax = _reduce_axes(x, attrs.get("axes") or ())
    n = int(np.prod([x.shape[a] for a in ax])) if ax else 1
    if WIDE_LONGDOUBLE:
        w = _ld_rows(x, ax)
        with np.errstate(all="ignore"):
            if op == "reduce_sum":
                r = np.sum(w, axis=-1)
            elif op == "reduce_prod":
                r = np.prod(w, axis=-1)
            else:
                r = np.sum(w, axis=-1) / np.longdouble(n)
        if keep:
            r = np.reshape(r, [1 if a in ax else s for a, s in enumerate(x.shape)])
        return round_ld(np.asarray(r), dtype)
    if op == "reduce_sum":
        return _mp_reduce(x, axes, keep, dtype, _mp_sum)
    if op == "reduce_prod":
        return _mp_reduce(x, axes, keep, dtype, _mp_prod)
    return _mp_reduce(x, axes, keep, dtype, lambda v: _mp_sum(v) / len(v) if v else _NAN)


def _softmax(x: np.ndarray, axis: int, dtype: str) -> np.ndarray:
    if x.size == 0:
        return x.copy()
    if WIDE_LONGDOUBLE:
        w = x.astype(np.longdouble)
        with np.errstate(all="ignore"):
            e = np.exp(w - np.max(w, axis=axis, keepdims=True))
            return round_ld(e / np.sum(e, axis=axis, keepdims=True), dtype)
    xm = np.moveaxis(x, axis, -1)
    rows = xm.reshape(-1, xm.shape[-1]).astype(np.float64)
    vals = []
    with gmpy2.context(precision=128):
        for r in rows.tolist():
            m = max(r) if not any(math.isnan(v) for v in r) else math.nan
            es = [gmpy2.exp(mpfr(v) - mpfr(m)) for v in r]
            s = gmpy2.fsum(es)
            vals += [e / s for e in es]
    return np.moveaxis(round_mpfr(vals, dtype, xm.shape), -1, axis)


def _sums_exact(x: np.ndarray) -> bool:
    """Whether every sum of elements of ``x`` (in its own float dtype) is the same in long
    double whatever the order, so that a running sum in any order gives the recursive doubling's
    values bit for bit. The finite terms: each is an integer multiple of its own spacing, a power
    of two, hence of the smallest one q (that of the smallest nonzero magnitude); so is every
    partial sum of them, at most S = sum |x| in magnitude: below 2^64 q it fits the 64-bit
    significand, and every addition is exact (a zero's sign is then the same in every order too:
    -0 exactly when every term is -0). S is summed in float64 (relative error < n 2^-53), and
    compared with 2^63 q for the margin. NaN and infinite terms decide a sum alone in every order
    (NaN with a NaN or infinities of both signs, else the infinity; no partial sum of float
    values overflows long double). Most float32, float16 and bfloat16 inputs qualify (a span of
    < 63 bits between the largest sum and the finest spacing), few float64 ones."""
    if not WIDE_LONGDOUBLE or x.size < 2:
        return False
    ax = np.abs(x.astype(np.float64))
    s = float(np.sum(ax))
    if not math.isfinite(s):  # a NaN or an infinity among the terms: sum the finite ones
        ax = ax[np.isfinite(ax)]
        s = float(np.sum(ax))
        if not math.isfinite(s):  # beyond float64 (never for the generated inputs)
            return False
    nz = ax[ax > 0]
    if nz.size == 0:
        return True  # zeros (and non-finite terms) only: every finite sum is a zero, its sign as above
    fi = dt.finfo(dt.name_of(x.dtype))
    _, e = math.frexp(float(np.min(nz)))
    q = math.ldexp(1.0, max(e - 1, int(math.log2(fi.tiny))) - fi.mant_bits)
    return s <= math.ldexp(q, 63)


def _doubling(w: np.ndarray) -> np.ndarray:
    """Running sums along the last axis by recursive doubling (Hillis and Steele 1986): after
    the step of width s each position sums the 2s terms ending there; every result is a tree of
    depth ceil(log2 n). Two buffers in turn: each step's sums land in the other, no temporary
    (40 % faster at 2^17). ``w`` is overwritten."""
    spare = np.empty_like(w)
    step = 1
    while step < w.shape[-1]:
        np.add(w[..., step:], w[..., :-step], out=spare[..., step:])
        spare[..., :step] = w[..., :step]
        w, spare = spare, w
        step *= 2
    return w


def _scan(op: str, x: np.ndarray, attrs: Mapping[str, Any], dtype: str) -> np.ndarray:
    axis = attrs["axis"] % x.ndim if x.ndim else 0
    if x.ndim == 0:
        x = x.reshape(1)
        return _scan(op, x, attrs, dtype).reshape(())
    if x.shape[axis] == 0:
        return x.copy()
    ident = 0 if op == "cumsum" else 1
    if WIDE_LONGDOUBLE:
        w = np.moveaxis(x.astype(np.longdouble), axis, -1)
        if attrs["reverse"]:
            w = np.flip(w, -1)
        with np.errstate(all="ignore"):
            if op == "cum_prod":  # any order errs by gamma_(n-1): no tree helps a product
                w = np.cumprod(w, axis=-1)
            elif _sums_exact(x):  # every partial sum exact: any order gives the tree's values
                w = np.cumsum(w, axis=-1)
            else:
                w = _doubling(w.copy())  # contiguous, and its own
        c = np.moveaxis(w, -1, axis)  # still reversed where ``reverse``: undone after the shift
        if attrs["exclusive"]:
            first = np.full_like(np.take(c, [0], axis=axis), ident)
            c = np.concatenate([first, np.take(c, np.arange(c.shape[axis] - 1), axis=axis)], axis=axis)
        if attrs["reverse"]:
            c = np.flip(c, axis)
        return round_ld(c, dtype)
    xm = np.moveaxis(x, axis, -1)
    rows = xm.reshape(-1, xm.shape[-1]).astype(np.float64)
    vals = []
    with gmpy2.context(precision=128):
        for r in rows.tolist():
            seq = r[::-1] if attrs["reverse"] else r
            acc, outs = mpfr(ident), []
            for v in seq:
                if attrs["exclusive"]:
                    outs.append(acc)
                acc = acc + v if op == "cumsum" else acc * v
                if not attrs["exclusive"]:
                    outs.append(acc)
            vals += outs[::-1] if attrs["reverse"] else outs
    return np.moveaxis(round_mpfr(vals, dtype, xm.shape), -1, axis)


# -- entry point -------------------------------------------------------------------------------
def compute(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
            out_dtypes: Sequence[str]) -> list[np.ndarray | None]:
    """The oracle's value of each output (None for an output that is not floating, or an op
    without an oracle). ``attrs`` are resolved (defaults filled)."""
    if not has_oracle(op):
        return [None] * len(out_dtypes)
    out = []
    for d in out_dtypes:
        if not is_float_output(d):
            out.append(None)
        elif op in ELEMENTWISE:
            out.append(elementwise(op, inputs, attrs, d))
        elif op == "softmax":
            out.append(_softmax(inputs[0], attrs["axis"], d))
        elif op in ("cumsum", "cum_prod"):
            out.append(_scan(op, inputs[0], attrs, d))
        else:
            out.append(_reduce(op, inputs[0], attrs, d))
    return out
