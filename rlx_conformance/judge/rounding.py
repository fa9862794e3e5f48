"""Rounding once from a wide value to a float dtype, in numpy: shared by the precise oracle
(precise.py: reductions and scans in longdouble) and its fast path (precise_fast.py: the ends of
float64 enclosures), which both import it and not each other's internals.

:func:`round_dd` rounds an unevaluated sum hi + lo of float64s to float64, float32, float16 or
bfloat16 with a single rounding (round-to-odd into a format with >= p + 2 bits, then
round-to-nearest-even: Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved
algorithms using rounding to odd", IEEE TC 2008). Plain ``astype`` from longdouble to float16
rounds twice (through float64) and is not used.

Part of the precise oracle: like precise.py, it shares no code with ``backends/cpu``, and its
source is part of the oracle's version (precise.version).
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt


def _odd_round(hi: np.ndarray, lo: np.ndarray, to) -> np.ndarray:
    """Round hi + lo (|lo| small against hi, or lo = 0) to the binary format ``to`` (float64 or
    float32) with round-to-odd: truncate, and set the last bit when inexact."""
    if to is np.float64:
        return _odd_round64(hi, lo)
    t = hi.astype(to)
    exact_hi = t.astype(np.float64) == hi
    with np.errstate(invalid="ignore"):
        rest = np.where(exact_hi, lo, (hi - t.astype(np.float64)) + lo)
    finite = np.isfinite(hi)
    inexact = finite & (rest != 0)
    # truncate: step toward zero where t overshoots |hi + lo|
    over = inexact & (np.sign(rest) != np.sign(t.astype(np.float64))) & (t != 0)
    t = np.where(over, np.nextafter(t, np.zeros((), to)), t)
    # overflow of the narrowing: truncation gives the largest finite value
    big = finite & np.isinf(t)
    t = np.where(big, np.copysign(np.finfo(to).max, hi).astype(to), t)
    bits = t.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(to)


def _odd_round64(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """:func:`_odd_round` to float64 on the bits: t = hi is exact (no narrowing, no overflow),
    the step toward zero of a nonzero finite float is its bit pattern minus one (sign and
    magnitude), and the last bit is set where inexact. Bit for bit the general path's result,
    in a third of its passes."""
    with np.errstate(invalid="ignore"):
        inexact = np.isfinite(hi) & (lo != 0)
        over = inexact & (np.sign(lo) != np.sign(hi)) & (hi != 0)
    bits = hi.view(np.uint64) - over.view(np.uint8).astype(np.uint64)  # a fresh array: hi is read only
    bits |= inexact
    return bits.view(np.float64)


def round_dd(hi: np.ndarray, lo: np.ndarray, dtype: str) -> np.ndarray:
    """The value hi + lo (float64 arrays, |lo| <= ulp(hi)/2 or lo = 0) rounded once to
    ``dtype`` (round to nearest, ties to even; subnormals and overflow as IEEE)."""
    hi = np.asarray(hi, np.float64)
    lo = np.asarray(lo, np.float64)
    npd = dt.np_dtype(dtype)
    with np.errstate(all="ignore"):
        if dtype == "float64":
            # hi + lo is normalised: this is hi, correctly rounded; where lo = 0 hi itself, since
            # -0 + +0 would turn a negative zero positive
            return np.where(np.isfinite(hi) & (lo != 0), hi + lo, hi)
        odd = _odd_round(hi, lo, np.float64)  # 53 >= p + 2 for float32 / float16
        if dtype in ("float32", "float16"):
            return odd.astype(npd)  # numpy's float64 -> float32/float16 rounds once, correctly
        odd32 = _odd_round(odd, np.zeros_like(odd), np.float32)  # 24 >= 8 + 2
        return odd32.astype(npd)  # ml_dtypes float32 -> bfloat16: round to nearest even


def round_ld(v: np.ndarray, dtype: str) -> np.ndarray:
    """A longdouble array rounded once to ``dtype``."""
    v = np.asarray(v, np.longdouble)
    with np.errstate(all="ignore"):
        if dtype in ("float32", "float64"):
            # numpy's longdouble -> float32 / float64 is C's conversion, one correct rounding
            # (IEEE 754 5.4.2, C Annex F; x87 fstp to single or double, binary128's
            # __trunctfsf2 / __trunctfdf2), subnormals and signed zeros included: MPFR's value bit
            # for bit (tests/test_judge_speed.py). The hi + lo split below would round twice
            # where lo itself falls among float64's subnormals (|v| < 2^-1011), and turn -0 into +0.
            return v.astype(dt.np_dtype(dtype))
        hi = v.astype(np.float64)
        lo = np.where(np.isfinite(hi), (v - hi.astype(np.longdouble)).astype(np.float64), 0.0)
        # longdouble values beyond float64's range: hi is +-inf (the right rounding for every
        # output dtype, all narrower than float64)
    return round_dd(hi, lo, dtype)
