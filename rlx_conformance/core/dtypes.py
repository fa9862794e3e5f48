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
    Here float64 goes to float32 rounded to odd (truncate, then set the last bit if inexact),
    which keeps the information a second rounding needs (16 spare bits), then to bfloat16."""
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
