"""A fast path for the precise oracle (precise.py) on unary ops with float16 / bfloat16 inputs:
the same correctly rounded answers as MPFR, without evaluating MPFR one element at a time.

MPFR stays the definition. This module only *decides* an element when it can prove what MPFR's
answer is; every other element goes to MPFR (precise.elementwise does the routing).

How an element is decided
-------------------------
The op is evaluated in float64 **interval arithmetic**: each step returns ``(lo, hi)`` arrays
that provably contain the exact value of that step for the exact input.

* IEEE operations (+ - * / sqrt) are correctly rounded, so the exact result of an operation on
  float64 operands is within half an ulp of the computed one; one ``nextafter`` step outward
  (:func:`_down` / :func:`_up`) encloses it, overflow (to inf) and underflow included.
* C library functions (through Python's ``math`` module, which calls the C library's exp, expm1,
  log, log1p, sin, cos, tan, atan, tanh, erf, erfc directly) have documented maximum errors:
  :data:`GLIBC_ULPS`. Each call is widened by :data:`SAFETY` times that many ulps of the result
  (:func:`_libm`). A monotone function of an interval is evaluated at its ends.
* Constants (1/sqrt(2), 2 sqrt(2/pi), 0.044715) are enclosed by MPFR, rounded down and up.

Both ends are then rounded to the output format (rounding.round_dd: once, ties to even,
subnormals, overflow). Rounding to nearest is monotone, so when both ends round to the same bits
every value between them does too, the exact one included: that is the correctly rounded
result, which is MPFR's. When they differ, the interval touches a rounding boundary (a midpoint,
the overflow threshold, a subnormal step, the sign of a zero) and the element goes to MPFR, as do
NaN, infinite and zero inputs (special cases: MPFR's rules, bit for bit), inputs outside an op's
float64 domain (log, sqrt of negatives) and any interval that came out NaN.

The cost of a generous error allowance is only a higher fallback rate, and that is tiny: a
relative width w around a value falls on a boundary of an 11-bit format with probability about
w * 2^11, so even 2^10 float64 ulps (w ~ 2^-42) send about one element in 2^31 to MPFR.

Scope: inputs float16 / bfloat16 (every one of them checked against MPFR, bit for bit, by
benchmarks/verify_fast_oracle.py); outputs float16 / bfloat16, or any float dtype for the exact
ops (neg, abs, relu, sign, round, floor, ceil, clamp, cast). Ops that call the C library are
enabled only on glibc, whose errors are documented; elsewhere they stay on MPFR.
"""
from __future__ import annotations

import functools
import math
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gmpy2
import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge import mpfr_setup  # noqa: F401 — undoes GMP's SIGFPE handler (see there)
from rlx_conformance.judge.rounding import round_dd

Iv = tuple[np.ndarray, np.ndarray]  # (lo, hi): lo <= exact <= hi, elementwise
Enclose = Callable[[np.ndarray, Mapping[str, Any]], Iv]  # an op: (inputs, attrs) -> enclosure

TINY = 2.0 ** -1074  # float64's smallest subnormal: its ulp below 2^-1022

# glibc's known maximum errors of the double functions in round-to-nearest, in ulps of the
# result, from the glibc manual ("Known Maximum Errors in Math Functions", generated from
# sysdeps/x86_64/fpu/libm-test-ulps; a function not listed there, like tan, has 0: counted 1).
GLIBC_ULPS = {"exp": 1, "expm1": 1, "log": 1, "log1p": 1, "sin": 1, "cos": 1, "tan": 1,
              "atan": 1, "tanh": 2, "erf": 1, "erfc": 5}
# The table lists the worst errors glibc's test suite has seen, not proofs: allow 16 times as
# many. This costs nothing measurable (see the module docstring) and leaves room for other glibc
# versions, architectures and CPU-specific (ifunc) variants. benchmarks/verify_fast_oracle.py
# checks the outcome on every float16 / bfloat16 input of the machine it runs on.
SAFETY = 16

LIBM_DOCUMENTED = platform.libc_ver()[0] == "glibc"
FAST_INPUTS = ("float16", "bfloat16")


# -- interval steps ------------------------------------------------------------------------------
def _down(v: np.ndarray) -> np.ndarray:
    return np.nextafter(v, -np.inf)


def _up(v: np.ndarray) -> np.ndarray:
    return np.nextafter(v, np.inf)


def _point(v: np.ndarray) -> Iv:
    return v, v


def _add(a: Iv, b: Iv) -> Iv:
    """a + b: one correctly rounded addition per end, stepped outward."""
    return _down(a[0] + b[0]), _up(a[1] + b[1])


def _mul(a: Iv, b: Iv) -> Iv:
    """a * b for intervals of any sign: the extreme products, stepped outward (inf * 0 gives NaN,
    which sends the element to MPFR)."""
    p = np.stack([a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]])
    return _down(p.min(axis=0)), _up(p.max(axis=0))


def _recip(a: Iv) -> Iv:
    """1 / a for an interval on one side of zero (1/x decreases there); NaN if it contains 0."""
    straddles = (a[0] <= 0) & (a[1] >= 0)
    lo, hi = _down(1.0 / a[1]), _up(1.0 / a[0])
    return np.where(straddles, np.nan, lo), np.where(straddles, np.nan, hi)


def _neg(a: Iv) -> Iv:
    return -a[1], -a[0]


@functools.cache
def _const(name: str) -> Iv:
    """A constant of the composites, enclosed by MPFR at 256 bits rounded down and up."""
    with gmpy2.context(precision=256):
        v = {"inv_sqrt2": lambda: 1 / gmpy2.sqrt(gmpy2.mpfr(2)),
             "two_sqrt_2_over_pi": lambda: 2 * gmpy2.sqrt(2 / gmpy2.const_pi()),
             "0.044715": lambda: gmpy2.mpfr(gmpy2.mpq(44715, 1000000))}[name]()
    with gmpy2.context(precision=53, round=gmpy2.RoundDown):
        lo = float(+v)
    with gmpy2.context(precision=53, round=gmpy2.RoundUp):
        hi = float(+v)
    return np.float64(lo), np.float64(hi)


# -- the C library ---------------------------------------------------------------------------------
def _libm(name: str, v: np.ndarray) -> Iv:
    """The exact f(v) for each float64 v, enclosed: glibc's f(v) widened by its error allowance.

    glibc's error bound is k ulps of the exact result f. For f normal, ulp(f) <= 2^-52 |f| <=
    2^-52 (|y| + |f - y|), so |f - y| <= k 2^-52 |y| / (1 - k 2^-52) <= k 2^-52 |y| (1 + 2^-40)
    (k <= 2^11); the factor also covers the rounding of that product. For f subnormal the ulp is
    2^-1074: the k * TINY term. ``v`` must lie in f's domain, where the result is finite (the
    callers clamp): math raises otherwise."""
    fn = getattr(math, name)
    y = np.fromiter(map(fn, v.tolist()), np.float64, count=v.size).reshape(v.shape)
    k = float(SAFETY * max(GLIBC_ULPS[name], 1))
    e = k * 2.0 ** -52 * np.abs(y) * (1 + 2.0 ** -40) + k * TINY
    return _down(y - e), _up(y + e)


def _increasing(name: str, a: Iv) -> Iv:
    """f(a) for f increasing on a: f's enclosure at each end."""
    return _libm(name, a[0])[0], _libm(name, a[1])[1]


EXP_MAX_ARG = 709.0  # exp(709) ~ 8.2e307 < DBL_MAX: math.exp does not overflow up to here


def _exp(a: Iv) -> Iv:
    """exp(a). Past EXP_MAX_ARG exp overflows float64: the lower end is exp(709)'s (exp
    increases), the upper end +inf. NaN ends stay NaN (math.exp(nan) is nan)."""
    lo = _libm("exp", np.minimum(a[0], EXP_MAX_ARG))[0]
    hi = _libm("exp", np.minimum(a[1], EXP_MAX_ARG))[1]
    return lo, np.where(a[1] > EXP_MAX_ARG, np.inf, hi)


def _sigmoid(a: Iv) -> Iv:
    """1 / (1 + exp(-a)), increasing in a: exp(-a) >= 0 so 1 + exp(-a) >= 1 - tiny > 0."""
    return _recip(_add(_point(np.float64(1.0)), _exp(_neg(a))))


def _softplus(x: np.ndarray) -> Iv:
    """log(1 + e^x) = max(x, 0) + log1p(exp(-|x|)) (precise._softplus's form): exp(-|x|) in
    (0, 1] and log1p increasing; log1p's argument stays > -1 (its lower end is at worst
    -SAFETY * TINY)."""
    return _add(_point(np.maximum(x, 0.0)), _increasing("log1p", _exp(_point(-np.abs(x)))))


# -- the ops ------------------------------------------------------------------------------------
# Each takes the finite, nonzero float64 inputs (exact float16 / bfloat16 values) and the op's
# attributes and returns the enclosure of the exact result.
def _exact(f: Callable[[np.ndarray], np.ndarray]) -> Enclose:
    """An op float64 computes exactly on these inputs: a point interval."""
    def run(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
        return _point(f(x))
    return run


def _libm_point(name: str, domain: Callable[[np.ndarray], np.ndarray] | None = None) -> Enclose:
    """f(x) straight from the C library; outside ``domain`` NaN (MPFR decides)."""
    def run(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
        ok = domain(x) if domain else np.ones(x.shape, bool)
        lo, hi = _libm(name, np.where(ok, x, 1.0))
        return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)
    return run


def _exp_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _exp(_point(x))


def _sqrt_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    s = np.sqrt(x)  # NaN for x < 0: MPFR decides
    return _down(s), _up(s)


def _rsqrt_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _recip(_sqrt_op(x, attrs))


def _recip_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _recip(_point(x))


def _elu_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """x for x > 0, expm1(x) for x < 0 (no overflow there)."""
    lo, hi = _libm("expm1", np.minimum(x, 0.0))
    return np.where(x > 0, x, lo), np.where(x > 0, x, hi)


def _gelu_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """x/2 erfc(-x/sqrt 2): erfc decreases, so the argument's upper end gives the lower value.
    Where erfc underflows (x < -38) its enclosure is [-k TINY, k TINY]: the sign rule of the
    op (gelu has the sign of x) then pins the result to -0."""
    t = _mul(_point(-x), _const("inv_sqrt2"))
    e = _libm("erfc", t[1])[0], _libm("erfc", t[0])[1]
    return _mul(_point(x * 0.5), e)


def _gelu_approx_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) (precise._gelu_approx's form); |x|^3 <
    4e115 for every bfloat16, far from float64's overflow."""
    p = _point(x)
    inner = _add(p, _mul(_const("0.044715"), _mul(_mul(p, p), p)))
    return _mul(p, _sigmoid(_mul(_const("two_sqrt_2_over_pi"), inner)))


def _silu_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _mul(_point(x), _sigmoid(_point(x)))


def _sigmoid_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _sigmoid(_point(x))


def _softplus_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _softplus(x)


def _log_sigmoid_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _neg(_softplus(-x))


def _mish_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """x tanh(softplus(x)); tanh increases."""
    return _mul(_point(x), _increasing("tanh", _softplus(x)))


def _hard_sigmoid_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """0 for x <= -3, 1 for x >= 3, (x + 3)/6 between (x + 3 is not exact for tiny bfloat16)."""
    mid = _add(_point(x), _point(np.float64(3.0)))
    lo, hi = _down(mid[0] / 6), _up(mid[1] / 6)
    return (np.where(x <= -3, 0.0, np.where(x >= 3, 1.0, lo)),
            np.where(x <= -3, 0.0, np.where(x >= 3, 1.0, hi)))


def _hard_swish_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """-0 for x <= -3 (x * 0 / 6 with x < 0: precise's zero sign), x for x >= 3, x (x + 3)/6
    between."""
    m = _mul(_point(x), _add(_point(x), _point(np.float64(3.0))))
    lo, hi = _down(m[0] / 6), _up(m[1] / 6)
    return (np.where(x <= -3, -0.0, np.where(x >= 3, x, lo)),
            np.where(x <= -3, -0.0, np.where(x >= 3, x, hi)))


def _softsign_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    return _mul(_point(x), _recip(_add(_point(np.float64(1.0)), _point(np.abs(x)))))


def _clamp_op(x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """precise._clamp: Python's max(x, lo) keeps x unless lo > x; min(m, hi) keeps m unless
    hi < m; hi everywhere when lo > hi. Bounds are used as given: :func:`applies` only lets
    bounds representable in the output format through (MPFR rounds them into it first)."""
    lo, hi = float(attrs["min"]), float(attrs["max"])
    if lo > hi:
        return _point(np.full(x.shape, hi))
    m = np.where(lo > x, lo, x)
    return _point(np.where(hi < m, hi, m))


@dataclass(frozen=True)
class FastOp:
    """How the fast path encloses one op. ``sign``: what is known of the exact result's sign
    ("pos", "neg", "x": that of x), used to keep a tiny result's interval on its side of zero
    (a positive result below half the smallest subnormal rounds to +0, not to either zero);
    ``exact``: float64 computes it exactly (then any float output dtype is fine); ``libm``: it
    calls the C library (glibc only)."""

    enclose: Enclose
    sign: str | None = None
    exact: bool = False
    libm: bool = False


FAST: dict[str, FastOp] = {
    "neg": FastOp(_exact(np.negative), exact=True),
    "abs": FastOp(_exact(np.abs), exact=True),
    "relu": FastOp(_exact(lambda x: np.where(x > 0, x, 0.0)), exact=True),
    "sign": FastOp(_exact(lambda x: np.where(x > 0, 1.0, -1.0)), exact=True),
    "round": FastOp(_exact(np.rint), exact=True),  # ties to even, like MPFR's rint in RNDN
    "floor": FastOp(_exact(np.floor), exact=True),
    "ceil": FastOp(_exact(np.ceil), exact=True),
    "cast": FastOp(_exact(lambda x: x), exact=True),
    "clamp": FastOp(_clamp_op, exact=True),
    "sqrt": FastOp(_sqrt_op, sign="pos"),
    "rsqrt": FastOp(_rsqrt_op, sign="pos"),
    "recip": FastOp(_recip_op, sign="x"),
    "softsign": FastOp(_softsign_op, sign="x"),
    "hard_sigmoid": FastOp(_hard_sigmoid_op),
    "hard_swish": FastOp(_hard_swish_op),
    "exp": FastOp(_exp_op, sign="pos", libm=True),
    "log": FastOp(_libm_point("log", lambda x: x > 0), libm=True),
    "sin": FastOp(_libm_point("sin"), libm=True),
    "cos": FastOp(_libm_point("cos"), libm=True),
    "tan": FastOp(_libm_point("tan"), libm=True),
    "atan": FastOp(_libm_point("atan"), sign="x", libm=True),
    "tanh": FastOp(_libm_point("tanh"), sign="x", libm=True),
    "erf": FastOp(_libm_point("erf"), sign="x", libm=True),
    "elu": FastOp(_elu_op, sign="x", libm=True),
    "gelu": FastOp(_gelu_op, sign="x", libm=True),
    "gelu_approx": FastOp(_gelu_approx_op, sign="x", libm=True),
    "silu": FastOp(_silu_op, sign="x", libm=True),
    "sigmoid": FastOp(_sigmoid_op, sign="pos", libm=True),
    "softplus": FastOp(_softplus_op, sign="pos", libm=True),
    "log_sigmoid": FastOp(_log_sigmoid_op, sign="neg", libm=True),
    "mish": FastOp(_mish_op, sign="x", libm=True),
}


# -- deciding -------------------------------------------------------------------------------------
def _subnormals_work() -> bool:
    """The one-ulp-outward steps assume IEEE arithmetic down to float64's subnormals; a process
    whose FPU flushes them (FTZ / DAZ, which some native libraries switch on) stays on MPFR."""
    tiny = np.array([2.0 ** -1022])
    return bool((tiny / 4)[0] == 2.0 ** -1024 and (np.nextafter(tiny, 0) * 2)[0] > 0)


def _representable(v: float, dtype: str) -> bool:
    return float(np.float64(v).astype(dt.np_dtype(dtype))) == v


def applies(op: str, in_dtypes: Sequence[np.dtype], attrs: Mapping[str, Any], out_dtype: str) -> bool:
    """Whether the fast path may decide any element of this call (else: all MPFR)."""
    spec = FAST.get(op)
    if spec is None or len(in_dtypes) != 1:
        return False
    if not any(np.dtype(in_dtypes[0]) == dt.np_dtype(d) for d in FAST_INPUTS):
        return False
    if (spec.libm and not LIBM_DOCUMENTED) or not _subnormals_work():
        return False
    if not (out_dtype in FAST_INPUTS or (spec.exact and dt.is_float(out_dtype))):
        return False
    if op == "clamp":
        return all(_representable(float(attrs[k]), out_dtype) for k in ("min", "max"))
    return True


def _with_sign(iv: Iv, sign: str | None, x: np.ndarray) -> Iv:
    """Intersect the enclosure with the side of zero the exact result is known to be on."""
    lo, hi = iv
    pos = np.full(x.shape, sign == "pos") | ((x > 0) if sign == "x" else False)
    neg = np.full(x.shape, sign == "neg") | ((x < 0) if sign == "x" else False)
    return np.where(pos & (lo <= 0), 0.0, lo), np.where(neg & (hi >= 0), -0.0, hi)


def enclose(op: str, x: np.ndarray, attrs: Mapping[str, Any]) -> Iv:
    """The enclosure of op's exact result for each finite, nonzero float64 x (exact values of
    float16 / bfloat16 inputs), sign rule applied."""
    spec = FAST[op]
    with np.errstate(all="ignore"):
        return _with_sign(spec.enclose(x, attrs), spec.sign, x)


def _round(v: np.ndarray, dtype: str) -> np.ndarray:
    return round_dd(v, np.zeros_like(v), dtype)


def decide(op: str, x: np.ndarray, attrs: Mapping[str, Any], out_dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(values, decided) for a float16 / bfloat16 array ``x``: where ``decided``, ``values``
    (float64) holds the correctly rounded ``out_dtype`` result, bit for bit MPFR's; elsewhere
    NaN, for MPFR to fill in. Call only when :func:`applies`."""
    with np.errstate(all="ignore"):  # NaN bfloat16 -> float64 warns
        xf = np.asarray(x).astype(np.float64).reshape(-1)
    live = np.isfinite(xf) & (xf != 0)
    lo, hi = enclose(op, xf[live], attrs)
    with np.errstate(all="ignore"):
        rlo, rhi = _round(lo, out_dtype), _round(hi, out_dtype)
    uint = dt.finfo(out_dtype).uint
    same = (rlo.view(uint) == rhi.view(uint)) & ~np.isnan(rlo) & ~np.isnan(lo) & ~np.isnan(hi) & (lo <= hi)
    decided = np.zeros(xf.shape, bool)
    decided[live] = same
    values = np.full(xf.shape, np.nan)
    values[live] = np.where(same, rlo.astype(np.float64), np.nan)
    return values, decided
