"""A float64 oracle for unary ops on float32 inputs, written once for numpy and CuPy: the fast
half of the exhaustive float32 sweep (run/exhaustive_f32.py). Like precise_fast.py it only
*decides* an element when it can prove the correctly rounded answer; the rest goes to the precise
oracle (MPFR, precise.py), which stays the definition.

How an element is decided
-------------------------
The op is evaluated in float64 by a formula (:data:`F64`, the same stable forms as precise.py and
precise_fast.py) with array functions of ``xp`` (``numpy`` or ``cupy``). Each op declares
``ulps``: a bound on the formula's relative error in float64 ulps of the result (2^-52 each),
from the maximum errors the math libraries document and the conditioning of each step:

* CUDA (CUDA C++ Programming Guide, "Mathematical Functions", double precision, the errors CuPy's
  ufuncs inherit): exp, expm1, log, log1p, tanh 1 ulp; sin, cos, tan, atan, erf 2 ulp; erfc 5
  ulp; + - * / sqrt correctly rounded (0.5 ulp).
* glibc (the CPU path; numpy's ufuncs call it or its own SIMD kernels of <= 4 ulp) and scipy's
  erf/erfc (Cephes: peak relative errors 2.2e-16 and 3.7e-16, about 1 and 2 ulp): at most those
  of precise_fast.GLIBC_ULPS.

Per op the steps' errors add up, each multiplied by the condition number of what follows it
(noted in the table where it is not about 1). The declared bound is then multiplied by
:data:`SAFETY` (16, as precise_fast does: library tables list errors seen, not proofs), so the
exact result y lies within ``rel * |y64| + ABS`` of the computed y64, where ABS covers float64
underflow inside a formula: an intermediate that underflows errs by at most a few 2^-1074,
amplified by at most |x| < 2^128 -> far below ABS = 2^-300, itself 2^150 times below float32's
smallest rounding boundary (2^-150). Both ends of that interval (stepped one float64 ulp outward)
are rounded to float32 (:func:`round32_bits`: one IEEE rounding, subnormals kept): equal bits
prove the correctly rounded value, since rounding is monotone. Otherwise the interval touches a
float32 rounding boundary (a midpoint, the overflow threshold, a subnormal step or the sign of a
zero) and the element is left to MPFR, as are NaN, infinite and zero inputs (run/exhaustive_f32.py
handles those few special values through MPFR too).

The margin sets only the MPFR share: an interval of relative half-width w touches a float32
boundary with probability about w * 2^25, so the largest declared bound here (1024 ulps * 16 =
2^-38) sends about one input in 2^13 of gelu_approx to MPFR and the libm ops (16-64 ulps) one in
2^20 or fewer. Where the exact result is known to lie on one side of zero (``sign``, as in
precise_fast.FastOp) the interval is cut at zero, so results that underflow decide as a zero of
the right sign instead of going to MPFR. Ops float64 computes exactly (``exact``; with the
per-element exact branches of hard_sigmoid, hard_swish, elu) have no margin at all.

Imports CuPy nowhere: the caller passes the array module (numpy works everywhere; tests check
this module against MPFR through numpy).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

SAFETY = 16
ABS = 2.0 ** -300
NAN32 = 0x7FC00000  # float32 quiet NaN: the value of an op outside its domain


def _erf_fns(xp) -> tuple[Callable, Callable]:
    """erf and erfc for ``xp`` (cupyx.scipy.special on CuPy, scipy.special on numpy)."""
    if xp is np:
        from scipy import special
    else:  # pragma: no cover — only on a machine with CuPy
        from cupyx.scipy import special
    return special.erf, special.erfc


def _sigmoid(xp, x):
    return 1.0 / (1.0 + xp.exp(-x))


def _softplus(xp, x):
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow, no cancellation."""
    return xp.maximum(x, 0.0) + xp.log1p(xp.exp(-xp.abs(x)))


def _gelu(xp, x, attrs):
    """x/2 erfc(-x/sqrt 2); see F64 for its bound."""
    return x * 0.5 * _erf_fns(xp)[1](-x * 0.7071067811865476)


def _gelu_approx(xp, x, attrs):
    inner = 1.5957691216057308 * (x + 0.044715 * (x * x * x))  # 2 sqrt(2/pi) (x + 0.044715 x^3)
    return x * _sigmoid(xp, inner)


def _clamp(xp, x, attrs):
    """precise._clamp: max(x, lo) keeps x unless lo > x, min(m, hi) keeps m unless hi < m;
    hi everywhere when lo > hi."""
    lo, hi = float(attrs["min"]), float(attrs["max"])
    if lo > hi:
        return xp.full(x.shape, hi)
    m = xp.where(lo > x, lo, x)
    return xp.where(hi < m, hi, m)


def _two_sum_exact(xp, a, b):
    """Whether a + b is exact in float64 (Knuth's TwoSum: its rounding error, computed exactly)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb) == 0


def _split(xp, a):
    c = a * 134217729.0  # 2^27 + 1: Veltkamp's split into two 26-bit halves
    hi = c - (c - a)
    return hi, a - hi


def _prod_exact(xp, a, b):
    """Whether a * b is exact in float64 (Dekker's TwoProduct, no FMA; no overflow here)."""
    p = a * b
    ah, al = _split(xp, a)
    bh, bl = _split(xp, b)
    err = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, err == 0


def _div6_exact(xp, n):
    """n / 6 and whether it is exact: q * 6 == n with no rounding error."""
    q = n / 6.0
    p, ok = _prod_exact(xp, q, xp.float64(6.0))
    return ok & (p == n)


def _hard_sigmoid_exact(xp, x):
    """The saturated branches, and (x + 3) / 6 where float64 computes it exactly: there the
    exact value may be a float32 midpoint (a tie), which a margin cannot decide."""
    s, ok = _two_sum_exact(xp, x, xp.float64(3.0))
    return (x <= -3) | (x >= 3) | (ok & _div6_exact(xp, s))


def _hard_swish_exact(xp, x):
    s, ok = _two_sum_exact(xp, x, xp.float64(3.0))
    m, ok2 = _prod_exact(xp, x, s)
    return (x <= -3) | (x >= 3) | (ok & ok2 & _div6_exact(xp, m))


Fn = Callable[[Any, Any, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class F64Op:
    """One op's float64 formula. ``ulps``: its relative error bound before SAFETY (0: exact);
    ``exact_where``: elements it computes exactly (piecewise ops); ``sign``: the exact result's
    known side of zero ("pos", "neg", "x": that of x); ``domain_nan``: finite nonzero inputs where
    the op is NaN (outside its domain); ``half_plus``: f(x) = x/2 + c with 0 < c < x^2 for
    |x| < TINY_X (gelu, gelu_approx, silu: x/2 + x^2/sqrt(2 pi) or x^2/4; hard_swish: + x^2/6),
    decided there by :func:`_half_plus` (float64 loses c, and x/2 is a float32 midpoint for
    every odd subnormal x: 2^23 inputs a sign that would all go to MPFR)."""

    fn: Fn
    ulps: float = 0.0
    sign: str | None = None
    exact_where: Callable[[Any, Any], Any] | None = None
    domain_nan: Callable[[Any, Any], Any] | None = None
    half_plus: bool = False


def _u(name: str) -> Fn:
    return lambda xp, x, attrs: getattr(xp, name)(x)


F64: dict[str, F64Op] = {
    # exact in float64 on float32 inputs
    "neg": F64Op(lambda xp, x, a: -x),
    "abs": F64Op(_u("abs")),
    "relu": F64Op(lambda xp, x, a: xp.where(x > 0, x, 0.0)),
    "sign": F64Op(lambda xp, x, a: xp.where(x > 0, 1.0, -1.0)),
    "round": F64Op(_u("rint")),  # ties to even, as MPFR's rint in RNDN
    "floor": F64Op(_u("floor")),
    "ceil": F64Op(_u("ceil")),
    "clamp": F64Op(_clamp),
    # one library call or correctly rounded operation: its documented error (max of CUDA, glibc)
    "exp": F64Op(_u("exp"), 1, sign="pos"),
    "log": F64Op(lambda xp, x, a: xp.log(xp.where(x > 0, x, 1.0)), 1, domain_nan=lambda xp, x: x < 0),
    "sqrt": F64Op(lambda xp, x, a: xp.sqrt(xp.abs(x)), 0.5, sign="pos", domain_nan=lambda xp, x: x < 0),
    "rsqrt": F64Op(lambda xp, x, a: 1.0 / xp.sqrt(xp.abs(x)), 1, sign="pos", domain_nan=lambda xp, x: x < 0),
    "recip": F64Op(lambda xp, x, a: 1.0 / x, 0.5, sign="x"),
    "sin": F64Op(_u("sin"), 2),
    "cos": F64Op(_u("cos"), 2),
    "tan": F64Op(_u("tan"), 2),
    "atan": F64Op(_u("arctan"), 2, sign="x"),
    "tanh": F64Op(_u("tanh"), 2, sign="x"),
    "erf": F64Op(lambda xp, x, a: _erf_fns(xp)[0](x), 2, sign="x"),
    # composites: steps' errors summed, times the condition of what follows
    "elu": F64Op(lambda xp, x, a: xp.where(x > 0, x, xp.expm1(xp.minimum(x, 0.0))), 1, sign="x",
                 exact_where=lambda xp, x: x > 0),
    # exp(-x) 1, 1 + e and 1 / (.) 0.5 each (1 + e sums positives: condition <= 1)
    "sigmoid": F64Op(lambda xp, x, a: _sigmoid(xp, x), 2, sign="pos"),
    "silu": F64Op(lambda xp, x, a: x * _sigmoid(xp, x), 3, sign="x", half_plus=True),
    # exp 1, log1p 1 (condition <= 1 on a positive argument), the sum of positives 0.5
    "softplus": F64Op(lambda xp, x, a: _softplus(xp, x), 4, sign="pos"),
    "log_sigmoid": F64Op(lambda xp, x, a: -_softplus(xp, -x), 4, sign="neg"),
    # softplus 4, then tanh (condition s (1 - tanh^2 s) / tanh s <= 1 for s > 0) 2, the product 0.5
    "mish": F64Op(lambda xp, x, a: x * xp.tanh(_softplus(xp, x)), 8, sign="x"),
    "softsign": F64Op(lambda xp, x, a: x / (1.0 + xp.abs(x)), 2, sign="x"),
    # (x + 3) / 6: two roundings; exact (no margin) where TwoSum / TwoProduct show float64 is
    # exact, so that ties (a rational on a float32 midpoint) are decided by the rounding itself
    "hard_sigmoid": F64Op(lambda xp, x, a: xp.where(x <= -3, 0.0, xp.where(x >= 3, 1.0, (x + 3.0) / 6.0)), 1,
                          exact_where=_hard_sigmoid_exact),
    "hard_swish": F64Op(lambda xp, x, a: xp.where(x <= -3, -0.0, xp.where(x >= 3, x, x * (x + 3.0) / 6.0)), 2,
                        exact_where=_hard_swish_exact, half_plus=True),
    # erfc 5 ulp; its argument -x/sqrt2 errs by 1 ulp (the constant's rounding and the product),
    # amplified by erfc's condition 2t^2 + 1 <= 210 wherever the float32 result is not far below
    # the smallest subnormal (t <= 10.2); the products 1: <= 5 + 210 + 1 -> 256
    "gelu": F64Op(_gelu, 256, sign="x", half_plus=True),
    # the inner polynomial u errs by <= 6 ulp (x^3 1, two constants 0.5 each, products and the
    # same-signed sum 2.5); sigmoid's condition |u| (1 - sigmoid u) <= 110 where the result is not
    # far below float32's smallest subnormal; sigmoid itself 2, the product 0.5: 6*110+3 -> 1024
    "gelu_approx": F64Op(_gelu_approx, 1024, sign="x", half_plus=True),
}


TINY_X = 2.0 ** -60


# -- float32 <-> float64 through the bits ---------------------------------------------------------
# CuPy's float32 kernels flush subnormals (measured on the H200: float32 subnormal inputs compared
# equal to 0, and float64 -> float32 casts of subnormal results gave 0), so nothing here computes
# in float32: conversions go through the bits and float64 arithmetic, which keeps subnormals.
def f32_to_f64(xp, bits):
    """The exact float64 value of float32 bit patterns (finite ones; NaN / inf give junk)."""
    b = bits.astype(xp.uint32)
    e = ((b >> 23) & xp.uint32(0xFF)).astype(xp.int32)
    m = (b & xp.uint32(0x7FFFFF)).astype(xp.float64)
    mag = xp.where(e == 0, xp.ldexp(m, xp.int32(-149)), xp.ldexp(m + 8388608.0, e - 150))
    return xp.where((b >> 31) != 0, -mag, mag)


def round32_bits(xp, v):
    """float64 -> float32 bits, rounded to nearest even, subnormals and overflow included: a
    normal result from the IEEE cast, a subnormal one as rint(|v| 2^149) (exact scaling, then
    float64's ties-to-even), the sign from v."""
    a = xp.abs(v)
    sub = a < 2.0 ** -126
    normal = a.astype(xp.float32).view(xp.uint32)
    tiny = xp.rint(xp.where(sub, a, 0.0) * 2.0 ** 149).astype(xp.uint32)
    return xp.where(sub, tiny, normal) | xp.where(xp.signbit(v), xp.uint32(0x80000000), xp.uint32(0))


def _half_plus(xp, x):
    """The float32 rounding of x/2 + c, 0 < c < x^2, |x| < TINY_X: x/2 is exact in float64 and
    c < |x| 2^-60 is far below half a float32 ulp of x/2 (>= 2^-25 |x/2|, >= 2^-150), so the
    result is x/2 where x/2 is a float32, else the neighbour above the midpoint x/2 (one step
    up in magnitude for x > 0, down for x < 0)."""
    y = x * 0.5
    r = round32_bits(xp, y)
    below = f32_to_f64(xp, r) < y
    return xp.where(below & (y > 0), r + xp.uint32(1), xp.where(below & (y < 0), r - xp.uint32(1), r))


def applies(op: str, out_dtype: str) -> bool:
    """Whether this oracle covers ``op`` with float32 inputs and ``out_dtype`` output (cast: the
    float dtypes it rounds to from float32 with one IEEE conversion)."""
    if op == "cast":
        return out_dtype in ("float32", "float64", "float16", "bfloat16")
    return op in F64 and out_dtype == "float32"


def _bf16_bits(xp, x32):
    """float32 -> bfloat16 bits, rounded to nearest even (finite inputs; overflow carries into
    the exponent and gives inf, as IEEE rounding does)."""
    b = x32.view(xp.uint32)
    return ((b + xp.uint32(0x7FFF) + ((b >> 16) & xp.uint32(1))) >> 16).astype(xp.uint16)


def _cast_bits(xp, x32, out_dtype: str):
    if out_dtype == "float32":
        return x32.view(xp.uint32)
    if out_dtype == "float64":
        return f32_to_f64(xp, x32.view(xp.uint32)).view(xp.uint64)
    if out_dtype == "float16":
        return x32.astype(xp.float16).view(xp.uint16)  # one IEEE conversion (cvt.rn.f16.f32)
    return _bf16_bits(xp, x32)


def _with_sign(xp, lo, hi, sign: str | None, x):
    if sign is None:
        return lo, hi
    pos = (x > 0) if sign == "x" else xp.full(x.shape, sign == "pos")
    neg = (x < 0) if sign == "x" else xp.full(x.shape, sign == "neg")
    return xp.where(pos & (lo <= 0), 0.0, lo), xp.where(neg & (hi >= 0), -0.0, hi)


def decide(xp, op: str, x32, attrs: Mapping[str, Any], out_dtype: str) -> tuple[Any, Any]:
    """(bits, decided) for a float32 array ``x32`` of ``xp``: where ``decided``, ``bits`` (the
    output dtype's unsigned view) is the correctly rounded result, MPFR's; elsewhere undefined.
    NaN, infinite and zero inputs are never decided. Call only where :func:`applies`."""
    with np.errstate(all="ignore"):  # numpy's warnings on NaN / overflowing casts (CuPy gives none)
        return _decide(xp, op, x32, attrs, out_dtype)


def _decide(xp, op: str, x32, attrs: Mapping[str, Any], out_dtype: str) -> tuple[Any, Any]:
    mag = x32.view(xp.uint32) & xp.uint32(0x7FFFFFFF)
    live = (mag != 0) & (mag < xp.uint32(0x7F800000))  # finite, nonzero (bits: no float32 compare)
    if op == "cast":
        return _cast_bits(xp, x32, out_dtype), live
    spec = F64[op]
    x = f32_to_f64(xp, x32.view(xp.uint32))
    y = spec.fn(xp, x, attrs)
    if spec.ulps:
        rel = SAFETY * spec.ulps * 2.0 ** -52 * (1 + 2.0 ** -40)
        fin = xp.isfinite(y)
        e = xp.where(fin, xp.abs(y) * rel + ABS, 0.0)
        if spec.exact_where is not None:
            e = xp.where(spec.exact_where(xp, x), 0.0, e)
        lo = xp.where(e > 0, xp.nextafter(y - e, -xp.inf), y)
        hi = xp.where(e > 0, xp.nextafter(y + e, xp.inf), y)
        lo, hi = _with_sign(xp, lo, hi, spec.sign, x)
    else:
        lo = hi = y
    rlo, rhi = round32_bits(xp, lo), round32_bits(xp, hi)
    decided = live & (rlo == rhi) & ~xp.isnan(lo) & ~xp.isnan(hi) & (lo <= hi)
    if spec.half_plus:
        tiny = live & (xp.abs(x) < TINY_X)
        rlo = xp.where(tiny, _half_plus(xp, x), rlo)
        decided |= tiny
    if spec.domain_nan is not None:
        dn = live & spec.domain_nan(xp, x)
        rlo = xp.where(dn, xp.uint32(NAN32), rlo)
        decided |= dn
    return rlo, decided
