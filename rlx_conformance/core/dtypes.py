"""The harness's dtype vocabulary: names, numpy types, and per-dtype numeric facts.

One table so that every module (registry, value generation, comparison, backends) spells a
dtype the same way. numpy has no bfloat16; ml_dtypes provides it.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import ml_dtypes
import numpy as np

FLOATS = ("float32", "float16", "bfloat16", "float64")
SIGNED = ("int8", "int16", "int32", "int64")
UNSIGNED = ("uint8", "uint32")
INTS = SIGNED + UNSIGNED
NUMERIC = FLOATS + INTS
ALL = NUMERIC + ("bool",)

_NP = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint32": np.dtype(np.uint32),
    "bool": np.dtype(np.bool_),
}
_BY_NP = {v: k for k, v in _NP.items()}

# Unsigned integer type of the same width, for bit-level views of floats.
_BITS_VIEW = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def np_dtype(name: str) -> np.dtype:
    """numpy dtype for a harness dtype name (ml_dtypes.bfloat16 for bfloat16)."""
    try:
        return _NP[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(ALL)}") from None


def name_of(dtype: np.dtype | type) -> str:
    """Harness dtype name of a numpy dtype; ValueError for dtypes outside the matrix."""
    d = np.dtype(dtype)
    try:
        return _BY_NP[d]
    except KeyError:
        raise ValueError(f"dtype {d} is not in the harness's dtype list ({', '.join(ALL)})") from None


def is_float(name: str) -> bool:
    return name in FLOATS


def is_int(name: str) -> bool:
    return name in INTS


def is_signed(name: str) -> bool:
    return name in SIGNED


def compute_dtype(name: str) -> str:
    """The dtype an op computes in: float16/bfloat16 compute in float32 (RLX prepare_f32_exec_graph)."""
    return "float32" if name in ("float16", "bfloat16") else name


@dataclass(frozen=True)
class FloatInfo:
    """IEEE facts for one float dtype, as Python floats (exact: every value here is representable)."""

    name: str
    bits: int
    mant_bits: int  # explicit fraction bits
    max: float
    tiny: float  # smallest positive normal
    smallest_subnormal: float
    eps: float  # spacing at 1.0
    unit_roundoff: float  # eps / 2

    @property
    def uint(self) -> type:
        return _BITS_VIEW[self.bits // 8]


@cache
def finfo(name: str) -> FloatInfo:
    if name not in FLOATS:
        raise ValueError(f"{name} is not a float dtype")
    fi = ml_dtypes.finfo(np_dtype(name)) if name == "bfloat16" else np.finfo(np_dtype(name))
    return FloatInfo(
        name=name,
        bits=np_dtype(name).itemsize * 8,
        mant_bits=int(fi.nmant),
        max=float(fi.max),
        tiny=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_subnormal),
        eps=float(fi.eps),
        unit_roundoff=float(fi.eps) / 2,
    )


@cache
def iinfo(name: str) -> tuple[int, int]:
    """(min, max) of an integer dtype; bool is (0, 1)."""
    if name == "bool":
        return (0, 1)
    ii = np.iinfo(np_dtype(name))
    return (int(ii.min), int(ii.max))


def narrow(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` as dtype ``name``, float narrowing rounded once to nearest even, whatever the
    installed ml_dtypes does. ml_dtypes before 0.5 converts float64 to bfloat16 through float32
    (two roundings: a value just above a tie between two bfloat16 numbers lands on the tie in
    float32 and then goes to even), so the reference would depend on the machine's ml_dtypes.
    float64 to bfloat16 takes :func:`_narrow_fast` for arrays of :data:`_FAST_MIN` elements or
    more, and so does float64 to float16 where more than 1 in 32 elements are below float16's
    smallest normal (numpy converts those ~30x slower than normal ones, 65 ns each here: the
    accumulation classes' scaled-down patterns); the same bits as the plain conversion,
    :func:`_narrow_plain`, faster (tests/test_values_fast.py checks both against an exact
    rounding)."""
    if x.dtype == np.float64 and x.size >= _FAST_MIN and (
            name == "bfloat16" or name == "float16" and _many_f16_subnormals(x)):
        if x.size <= _CHUNK or not x.flags.c_contiguous:
            return _narrow_fast(x, name)
        # block by block: the temporaries (~30 bytes an element) stay small and malloc reuses
        # them, where arrays as large as x cost ~1.5 ms of page faults per 8 MB here
        out = np.empty(x.shape, np_dtype(name))
        xf, of = x.reshape(-1), out.reshape(-1)
        for i in range(0, xf.size, _CHUNK):
            of[i:i + _CHUNK] = _narrow_fast(xf[i:i + _CHUNK], name)
        return out
    return _narrow_plain(x, name)


def _many_f16_subnormals(x: np.ndarray) -> bool:
    """Whether more than 1 in 32 of a sample (every 16th element) of ``x`` is below float16's
    smallest normal, 2^-14 in magnitude: where :func:`_narrow_fast` (~5 ns an element) beats
    numpy's float16 conversion (~2 ns, 65 ns for those). Only the speed depends on it."""
    s = x.reshape(-1)[::16]
    return np.count_nonzero(np.abs(s) < 2.0**-14) * 32 > s.size


def _narrow_plain(x: np.ndarray, name: str) -> np.ndarray:
    """:func:`narrow` the plain way: astype, except float64 to bfloat16, which goes through float32
    rounded to odd (truncate, then set the last bit if inexact), keeping the information a
    second rounding needs (16 spare bits)."""
    target = np_dtype(name)
    if name != "bfloat16" or x.dtype != np.float64:
        return x.astype(target, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
        wide = np.abs(f.astype(np.float64)) > np.abs(x)  # rounded away from zero: step back
        f = np.where(wide, np.nextafter(f, np.float32(0)), f)
        inexact = (f.astype(np.float64) != x) & ~np.isnan(x)
        bits = f.view(np.uint32) | inexact.astype(np.uint32)
    return bits.view(np.float32).astype(target)


# Below this many elements the fast path's fixed cost (reductions, checks, more calls) outweighs
# the passes it saves; the result is the same either way.
_FAST_MIN = 256
_CHUNK = 1 << 15
# The 16-bit floats: (fraction bits p, smallest normal exponent emin, o): 2^o is the power of two
# above the largest finite value, where its rounding plus half an ulp lands (so: infinity).
_HALF = {"bfloat16": (7, -126, 128), "float16": (10, -14, 16)}
_F64_SIGN = np.uint64(1 << 63)
_F64_EXP = np.uint64(0x7FF0_0000_0000_0000)


def _narrow_fast(x: np.ndarray, name: str) -> np.ndarray:
    """float64 to bfloat16 or float16 (p fraction bits, smallest normal 2^emin; _HALF), rounded
    to nearest even in float64 arithmetic. For 2^e <= |x| < 2^(e+1), let k = max(e, emin):
    c = 2^(k+52-p) has as its float64 ulp 2^(k-p), the target's spacing at |x|, and |x| < 2^(k+1)
    is far below c, so |x| + c, one IEEE addition, stays in c's binade and rounds |x| to a
    multiple of 2^(k-p), to nearest, ties to the even multiple (c is an even one); subtracting c
    is exact (both are multiples of 2^(k-p), the difference at most 2^(k+1)). That is the
    target's rounding, subnormals included (k = emin: their fixed spacing); the sign goes back on
    as a bit (-0.0, and negatives that round to zero, stay negative). When every |x| is normal
    in the target, x + sign(x) c gives the same in fewer passes. The rounded y is a value of the
    target, or 2^o (_HALF: the rounding of everything from the largest finite value plus half an
    ulp on, up to 2^o), and the target's bits come from float32's, which holds y exactly:
    bfloat16 is float32's top half (2^128 is infinity in both); float16 is the float32 bits of
    y 2^-112, whose exponent field is float16's (31, infinity, for 2^16; float16 subnormals
    become float32 subnormals with the fraction 13 bits up). |x| >= 2^o (which could overflow c)
    and NaN, rare in drawn values, take :func:`_narrow_plain`."""
    mant, emin, over = _HALF[name]
    shift = np.uint64((52 - mant) << 52)
    a = np.abs(x)
    lo, hi = a.min(), a.max()  # NaN makes both NaN: the checks below fail, as they should
    bits = x.view(np.uint64)
    with np.errstate(over="ignore", invalid="ignore"):
        if lo >= 2.0**emin:  # all normal: c = sign(x) 2^(e+52-p), in |x|'s buffer (a fresh
            # array costs its page faults, as much as a pass at 10^6 elements)
            c = np.bitwise_and(bits, _F64_SIGN | _F64_EXP, out=a.view(np.uint64))
            c += shift
            cf = c.view(np.float64)
            y = x + cf
            y -= cf
        else:
            c = a.view(np.uint64) & _F64_EXP
            np.maximum(c, np.uint64((emin + 1023) << 52), out=c)
            c += shift
            cf = c.view(np.float64)
            y = a + cf
            y -= cf
            y.view(np.uint64)[...] |= bits & _F64_SIGN
        if name == "float16":
            y *= 2.0**-112
        y32 = y.astype(np.float32)
    f = y32.view(np.uint32)
    if name == "bfloat16":
        f >>= np.uint32(16)
    else:  # sign from bit 31 to bit 15; exponent and fraction from bits 13..27 to 0..14
        sign = f >> np.uint32(16)
        sign &= np.uint32(0x8000)
        f >>= np.uint32(13)
        f &= np.uint32(0x7FFF)
        f |= sign
    out = f.astype(np.uint16).view(np_dtype(name))
    if not hi < 2.0**over:
        other = ~(np.abs(x) < 2.0**over)  # (a may hold c now)
        out[other] = _narrow_plain(x[other], name)
    return out
