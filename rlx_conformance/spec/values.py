"""Input values for a case, made bit-identically from the case's seed on any machine.

Only the PCG64 bit stream (``random_raw``) is used, and every transformation of it is written
here, so no numpy distribution algorithm (which numpy may change between versions) is involved.
Value classes: ``random`` (uniform over the domain's typical range), ``special`` (half the
elements drawn from the generic special values of the dtype plus the domain's boundaries and
their ulp neighbours), ``spread`` (large magnitude, small spread: accumulation order shows), and
the accumulation classes (:data:`ACCUMULATION_CLASSES`), built so that the accuracy of a long
sum shows: ``constant``, ``offset`` (1000 plus a small noise), ``alternating`` (signs alternate,
the sum cancels), ``increasing`` (magnitudes grow along each row), ``tiny_tail`` (1, then terms
just below half an ulp of 1: a sequential accumulator in the input's precision loses every one).
Which classes a case gets depends on its size and dtype: :func:`classes_for`.
Gradient cases only (:data:`GRAD_CLASSES`, declared per op with ``grad_values``) get classes
placed where a derivative is a convention or blows up, half their elements there and the rest
random so both sides show: ``kink`` (the domain's ``kinks``, exactly and one ulp either side),
``near_zero`` (the same points and distances from them down to 2^-2p), ``ties`` (values shared
by several elements and, at the same positions, by every input of the case: tied maxima,
a == b).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt

VALUE_CLASSES = ("random", "special", "spread")
# Classes where accumulation error shows; only accumulating ops declare them (ops/*.py values=).
ACCUMULATION_CLASSES = ("constant", "offset", "alternating", "increasing", "tiny_tail")
# Classes only derivative cases get (OpSpec.grad_values; generate/matrix.grad_classes): the points
# where the reference's DerivativeRule.convention decides, or where the derivative is large.
GRAD_CLASSES = ("kink", "ties", "near_zero")
# Sizes (elements of a case's largest input): the accumulation classes from ACCUMULATION_MIN on
# (a sequential float32 sum drifts past the accuracy budget's c ceil(log2 n) u sum|x| beyond
# ~10^5 terms: below it they would add cases that show nothing the random class does not);
# from HUGE on only random and the accumulation classes, on float dtypes, and only for ops that
# declare an accumulation class (integer sums are exact at any size; at 10^6 elements the special
# class leaves a NaN in every slice and spread is offset's; other ops gain nothing there).
ACCUMULATION_MIN = 2**17
HUGE = 10**6


def classes_for(declared: Sequence[str], dtype: str, shapes: Sequence[Sequence[int]],
                inputs: bool = True) -> tuple[str, ...]:
    """The value classes a case of this dtype and these input shapes is generated with, out of
    the op's ``declared`` ones (the rule: :data:`ACCUMULATION_MIN`, :data:`HUGE`). ``inputs``:
    whether the shape family lists the inputs' shapes (an op with a ``generate`` hook may read it
    otherwise, e.g. a CSR family's [rows, columns]); if not, and the op declares no accumulation
    class, its classes are the declared ones at any size."""
    if not inputs and not any(v in ACCUMULATION_CLASSES for v in declared):
        return tuple(declared)
    size = max((math.prod(s) for s in shapes), default=0)
    if size < ACCUMULATION_MIN:
        return tuple(v for v in declared if v not in ACCUMULATION_CLASSES)
    if size < HUGE:
        return tuple(v for v in declared if v not in ACCUMULATION_CLASSES or dt.is_float(dtype))
    if not dt.is_float(dtype) or not any(v in ACCUMULATION_CLASSES for v in declared):
        return ()
    return tuple(v for v in declared if v == "random" or v in ACCUMULATION_CLASSES)


def seed_of(key: str) -> int:
    """64-bit seed from a string (sha256: stable across machines, Python versions and runs)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


class Stream:
    """Deterministic uint64 stream and the few transformations the generators need."""

    def __init__(self, key: str):
        self.key = key
        self._bg = np.random.PCG64(seed_of(key))

    def shared(self, tag: str) -> Stream:
        """A stream every input of the case gets alike: an input's stream is keyed
        ``{input id}#{k}`` (generate/matrix.make_inputs), this one ``{input id}#{tag}``, so that
        choices made from it (positions, pool entries) are the same for each input."""
        return Stream(f"{self.key.rpartition('#')[0]}#{tag}")

    # The transformations below work in place on the fresh array random_raw returns: at 10^6-10^7
    # elements (issue 14's shapes) each temporary costs as much as the draw itself (issue 18).
    # Every value is the one the plain expressions in their comments give.
    def raw(self, n: int) -> np.ndarray:
        return np.asarray(self._bg.random_raw(n), np.uint64) if n else np.zeros(0, np.uint64)

    def uniform(self, n: int, lo: float, hi: float) -> np.ndarray:
        # lo + (hi - lo) * ((raw >> 11) as float64 * 2^-53): the same two roundings, in place
        r = self.raw(n)
        r >>= np.uint64(11)
        u = r.view(np.float64)  # converted into the draws' own buffer, a block at a time: a
        for i in range(0, n, CHUNK):  # fresh 8 MB array costs ~1.5 ms of page faults here, more
            u[i:i + CHUNK] = r[i:i + CHUNK]  # than the conversion (numpy copies an overlap first)
        d = hi - lo
        if 2.0**-969 <= abs(d) < math.inf:  # u 2^-53 and d 2^-53 are exact: one product is the two
            u *= d * 2.0**-53
        else:
            u *= 2.0**-53
            u *= d
        u += lo
        return u

    def integers(self, n: int, lo: int, hi: int) -> np.ndarray:
        """Uniform integers in [lo, hi] (span < 2^63; modulo bias below 2^-40 is irrelevant here)."""
        # (raw % span) as int64 + lo; below 2^63 the view is that cast
        r = _mod(self.raw(n), hi - lo + 1)
        out = r.view(np.int64)
        if not isinstance(lo, (int, np.integer)):  # a float lo makes the sum float64, as it did
            return out + lo
        out += lo
        return out

    def choice(self, n: int, k: int) -> np.ndarray:
        return _mod(self.raw(n), k).view(np.int64)  # (raw % k) as int64

    def coin(self, n: int) -> np.ndarray:
        r = self.raw(n)  # (raw & 1) as bool
        r &= np.uint64(1)
        return r.astype(bool)


def _mod(r: np.ndarray, k: int) -> np.ndarray:
    """``r %= k`` for uint64 ``r``, in place, and ``r``. numpy's uint64 remainder divides each
    element in hardware (5 ms per 10^6 here); its floor division by a scalar multiplies and
    shifts (libdivide, 0.8 ms), and r - (r // k) k is r % k exactly in unsigned integers; a
    power of two is a mask."""
    d = np.uint64(k)
    if k & (k - 1) == 0:
        r &= np.uint64(k - 1)
        return r
    q = np.empty(min(r.size, CHUNK), np.uint64)  # a block at a time: no fresh r-sized array
    for i in range(0, r.size, CHUNK):
        s = r[i:i + CHUNK]
        t = q[:s.size]
        np.floor_divide(s, d, out=t)
        t *= d
        s -= t
    return r


# Elements per block where a transformation works block by block in a small buffer (256 KB of
# float64, which malloc reuses) instead of allocating a temporary as large as the array.
CHUNK = 1 << 15


# Unsigned integer of each width, for bit-level selection (_select).
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _select(mask: np.ndarray, new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """``np.where(mask & 1, new, old)`` for ``new`` and ``old`` of one dtype and shape, as bits:
    old ^ ((old ^ new) & m) with m all ones where the mask's lowest bit is set (``mask`` a bool
    array, or raw draws whose lowest bit is the coin). np.where branches per element, and on a
    random mask that costs 7 ms per 10^6 elements here (20 ms for float64) against ~1 ms; both
    copy the selected bits unchanged (NaN payloads, -0.0). Writes into ``mask`` when it is uint64."""
    u = _UINT[old.dtype.itemsize]
    m = mask if mask.dtype == u else mask.astype(u)  # a narrowing cast keeps the low bits
    m &= u(1)
    np.negative(m, out=m)
    o = old.view(u)
    d = np.bitwise_xor(o, new.view(u))
    d &= m
    d ^= o
    return d.view(old.dtype)


# -- boundary vocabulary (cases/domains.toml names) ---------------------------------------------
def _float_boundaries(name: str, dtype: str, attrs: Mapping[str, Any]) -> list[float]:
    fi = dt.finfo(dtype)
    log_max = math.log(fi.max)
    match name:
        case "log_max":
            return [log_max]
        case "neg_log_max":
            return [-log_max]
        case "log_tiny":
            return [math.log(fi.tiny)]
        case "log_smallest_subnormal":
            return [math.log(fi.smallest_subnormal)]
        case "tiny":
            return [fi.tiny]
        case "max":
            return [fi.max]
        case "pi_multiples":
            return [k * math.pi / 2 for k in (-4, -2, -1, 1, 2, 3, 4)]
        case "large_args":
            return [1e4 * math.pi, 2.0 ** (fi.mant_bits + 1), fi.max / 2]
        case "saturation":
            return [9.0, -9.0, 17.0, -17.0, 88.0, -88.0]
        case "half_integers":
            return [k + 0.5 for k in (-3, -2, -1, 0, 1, 2)] + [2.0**fi.mant_bits - 0.5]
        case "integer_limit":
            return [2.0**fi.mant_bits, -(2.0**fi.mant_bits), 2.0 ** (fi.mant_bits + 1)]
        case "cast_limits":
            to = attrs.get("to", dtype)
            if dt.is_int(to) or to == "bool":
                lo, hi = dt.iinfo(to)
                return [float(lo), float(hi), float(lo) - 1, float(hi) + 1, -1.0, 0.5, -0.5]
            if dt.is_float(to):
                t = dt.finfo(to)
                return [t.max, -t.max, t.tiny, t.smallest_subnormal, t.smallest_subnormal / 2]
            return []
        case "clamp_bounds":  # clamp's kinks: its attributes
            return [float(attrs["min"]), float(attrs["max"])]
        case "int_extremes" | "shift_limits":
            return []
    raise ValueError(f"unknown boundary name {name!r} in cases/domains.toml")


def _int_boundaries(name: str, dtype: str, attrs: Mapping[str, Any]) -> list[int]:
    lo, hi = dt.iinfo(dtype)
    bits = dt.np_dtype(dtype).itemsize * 8
    match name:
        case "int_extremes":
            return [lo, hi, lo + 1, hi - 1]
        case "shift_limits":
            return [0, 1, bits - 1, bits, bits + 1, -1]
        case "cast_limits":
            to = attrs.get("to", dtype)
            if dt.is_int(to):
                tlo, thi = dt.iinfo(to)
                return [tlo, thi, tlo - 1, thi + 1]
            return []
    return []


def _to(a: np.ndarray, npd: np.dtype) -> np.ndarray:
    """``a`` (float64 draws) as ``npd``, rounded once to nearest even (dt.narrow): ml_dtypes
    before 0.5, which pyproject allows, converts float64 to bfloat16 through float32, rounding
    twice, so the same case id would give other bfloat16 inputs on such a machine; the narrowing
    here is the same on every machine (and 15x faster than ml_dtypes' own, 1.9 ms per 10^5)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return dt.narrow(np.asarray(a), dt.name_of(np.dtype(npd)))


def _neighbours(values: Sequence[float], dtype: str, steps: int = 2) -> np.ndarray:
    """Each value rounded to dtype, with its neighbours up to ``steps`` ulp away (finite ones)."""
    npd = dt.np_dtype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        v = _to(np.asarray(values, np.float64), npd)
    out = [v]
    up, down = v, v
    with np.errstate(all="ignore"):
        return _steps(out, up, down, dtype, npd, steps)


def _steps(out, up, down, dtype, npd, steps=2):
    for _ in range(steps):
        up = np.nextafter(up, np.array(np.inf, npd)) if dtype != "bfloat16" else _next_bf16(up, +1)
        down = np.nextafter(down, np.array(-np.inf, npd)) if dtype != "bfloat16" else _next_bf16(down, -1)
        out += [up, down]
    allv = np.concatenate(out)
    return allv[np.isfinite(allv.astype(np.float64))]


def _next_bf16(v: np.ndarray, direction: int) -> np.ndarray:
    """nextafter for bfloat16 (ml_dtypes has no nextafter ufunc loop): step the ordered bits."""
    b = v.view(np.uint16).astype(np.int32)
    neg = (b & 0x8000) != 0
    mag = b & 0x7FFF
    ordered = np.where(neg, -mag, mag) + direction
    res = np.where(ordered < 0, (-ordered) | 0x8000, ordered).astype(np.uint16)
    return res.view(dt.np_dtype("bfloat16"))


def specials(dtype: str, domain: str, attrs: Mapping[str, Any]) -> np.ndarray:
    """The special-value pool for a dtype and domain, as an array of that dtype."""
    spec = data.load("domains")[domain]
    npd = dt.np_dtype(dtype)
    named = [b for b in spec.get("boundaries", []) if isinstance(b, str)]
    numbers = [b for b in spec.get("boundaries", []) if not isinstance(b, str)]
    if dtype == "bool":
        return np.array([False, True])
    if dt.is_int(dtype):
        lo, hi = dt.iinfo(dtype)
        pool = [lo, hi, lo + 1, hi - 1, 0, 1, 2, -1, -2] + [int(n) for n in numbers]
        for n in named:
            pool += _int_boundaries(n, dtype, attrs)
        pool = sorted({p for p in pool if lo <= p <= hi})
        return np.array(pool, dtype=npd)
    fi = dt.finfo(dtype)
    generic = [math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, -1.0,
               fi.smallest_subnormal, -fi.smallest_subnormal,
               fi.tiny - fi.smallest_subnormal, -(fi.tiny - fi.smallest_subnormal),
               fi.tiny, -fi.tiny, fi.max, -fi.max]
    bounds = list(numbers)
    for n in named:
        bounds += _float_boundaries(n, dtype, attrs)
    with np.errstate(over="ignore"):
        g = _to(np.asarray(generic, np.float64), npd)
    return np.concatenate([g, _neighbours(bounds, dtype)]) if bounds else g


def kinks(dtype: str, domain: str, attrs: Mapping[str, Any]) -> list[float]:
    """The domain's declared ``kinks`` (numbers, or names resolved like boundaries, e.g.
    ``clamp_bounds`` from the attributes): where the derivative of the ops drawing from it is a
    convention (a kink, a tie) or has a pole or branch point. Empty for non-float dtypes."""
    if not dt.is_float(dtype):
        return []
    out: list[float] = []
    for k in data.load("domains")[domain].get("kinks", []):
        out += _float_boundaries(k, dtype, attrs) if isinstance(k, str) else [float(k)]
    return out


def kink_points(dtype: str, domain: str, attrs: Mapping[str, Any]) -> np.ndarray:
    """The ``kink`` class's pool: each of :func:`kinks` rounded to dtype and its neighbours one ulp
    either side (the smoothness radius is 0 at the first, tiny at the others)."""
    points = kinks(dtype, domain, attrs)
    return _neighbours(points, dtype, steps=1) if points else np.zeros(0, dt.np_dtype(dtype))


def make_array(stream: Stream, shape: tuple[int, ...], dtype: str, domain: str, vals: str,
               attrs: Mapping[str, Any]) -> np.ndarray:
    """One input array for the given dtype, domain and value class."""
    if vals in GRAD_CLASSES:
        return _grad_class(stream, shape, dtype, domain, vals, attrs)
    n = math.prod(shape)
    npd = dt.np_dtype(dtype)
    spec = data.load("domains")[domain]
    lo, hi = spec["range"]
    if dtype == "bool":
        out = stream.coin(n)
    elif vals == "spread":
        out = _spread(stream, n, dtype)
    elif vals in ACCUMULATION_CLASSES and dt.is_float(dtype) and not spec.get("integers_only"):
        out = _accumulation(stream, shape, dtype, vals, spec.get("accumulate", "sum"))
    elif vals in ACCUMULATION_CLASSES:  # a structural input (mask, ties, integers): drawn as random
        return make_array(stream, shape, dtype, domain, "random", attrs)
    elif dt.is_int(dtype):
        dlo, dhi = dt.iinfo(dtype)
        lo, hi = max(int(lo), dlo), min(int(hi), dhi)
        if spec.get("exclude_zero") and lo <= 0 <= hi:
            v = stream.integers(n, lo, hi - 1)
            v += v >= 0  # np.where(v >= 0, v + 1, v) without np.where's branch per element
            out = v.astype(npd)
        else:
            out = stream.integers(n, lo, hi).astype(npd)
    else:
        u = stream.uniform(n, lo, hi)
        if spec.get("integers_only"):
            u = np.floor(u)
        with np.errstate(over="ignore"):
            out = _to(u, npd)
    out = np.asarray(out, dtype=npd)
    if vals == "special" and n:
        pool = specials(dtype, domain, attrs)
        pick = stream.raw(n)  # a coin: the lowest bit
        out = _select(pick, pool.take(stream.choice(n, len(pool))), out)
    return out.reshape(shape)


def _grad_class(stream: Stream, shape: tuple[int, ...], dtype: str, domain: str, vals: str,
                attrs: Mapping[str, Any]) -> np.ndarray:
    """A gradient-only class (module docstring): the random class's draw with half the elements
    (chosen by a coin) replaced. Inputs that are not floating, and inputs whose domain declares no
    kinks for ``kink``/``near_zero``, keep the random draw (a condition, an exponent, indices)."""
    out = make_array(stream, shape, dtype, domain, "random", attrs)
    n, npd = out.size, out.dtype
    if not n or not dt.is_float(dtype):
        return out
    spec = data.load("domains")[domain]
    lo, hi = (float(v) for v in spec["range"])
    flat = out.reshape(-1)
    if vals == "ties":
        # Positions and values from the stream every input shares, drawn together so that inputs
        # of different sizes (broadcasting) agree on their common prefix: a == b where both pick.
        pool = _to(np.array([lo, math.floor((lo + hi) / 2) if spec.get("integers_only") else (lo + hi) / 2,
                             hi]), npd)
        r = stream.shared("ties").raw(n)  # the lowest bit picks, the rest chooses the value
        new = pool.take(_mod(r >> np.uint64(1), len(pool)).view(np.int64))
        return _select(r, new, flat).reshape(shape)
    points = kink_points(dtype, domain, attrs)
    if not len(points):
        return out
    pick = stream.raw(n)  # a coin: the lowest bit
    at = points.take(stream.choice(n, len(points)))
    if vals == "kink":
        return _select(pick, at, flat).reshape(shape)
    # near_zero: a quarter at the points (and their ulp neighbours), the rest at distances
    # 2^e, e uniform in [-2p, 0] (p: the dtype's precision), on either side; all clipped into the
    # range (sqrt's domain [0, 100]: no negatives, where the derivative is only NaN).
    centres = np.asarray(kinks(dtype, domain, attrs), np.float64)
    centre = centres.take(stream.choice(n, len(centres)))
    dist = np.exp2(stream.uniform(n, -2.0 * (dt.finfo(dtype).mant_bits + 1), 0.0))
    # centre + where(coin, 1.0, -1.0) * dist: dist > 0, and -1.0 * dist is dist with the sign bit
    side = stream.raw(n)
    side &= np.uint64(1)
    side ^= np.uint64(1)
    side <<= np.uint64(63)
    dist.view(np.uint64)[...] |= side
    centre += dist
    near = _select(stream.choice(n, 4) == 0, at.astype(np.float64), centre)
    np.clip(near, lo, hi, out=near)
    return _select(pick, _to(near, npd), flat).reshape(shape)


def _spread(stream: Stream, n: int, dtype: str) -> np.ndarray:
    """Large magnitude, small relative spread: c (1 + 2^-10 U(-1, 1)) with c = 2^(p-2), so the low
    bits of a sum depend on the order of accumulation. Ints: near a quarter of the max (sums wrap)."""
    npd = dt.np_dtype(dtype)
    if dt.is_int(dtype):
        _, hi = dt.iinfo(dtype)
        c = hi // 4
        v = stream.integers(n, -8, 8)
        v += c
        return v.astype(npd)
    fi = dt.finfo(dtype)
    c = 2.0 ** min(fi.mant_bits - 2, 20)
    v = stream.uniform(n, -1, 1)  # c * (1 + 2^-10 u), in place: the same three roundings
    v *= 2.0**-10
    v += 1
    v *= c
    return _to(v, npd)


def _accumulation(stream: Stream, shape: tuple[int, ...], dtype: str, vals: str, kind: str) -> np.ndarray:
    """An accumulation class (module docstring), laid out along the last axis (each row of a
    reduction or a scan along it, each dot product of a matmul's lhs, sees the pattern from its
    start). ``kind`` "product" (the domain's ``accumulate``: factors of products) maps the
    additive pattern v to factors 2^(8 v / sum|v|), so that every partial product stays within
    2^(+-8). Additive patterns are scaled by a power of two where their sum of magnitudes would
    pass the square root of the dtype's largest value (float16: 256), so sums, and sums of
    products of two such inputs, stay finite."""
    n = math.prod(shape)
    fi = dt.finfo(dtype)
    npd = dt.np_dtype(dtype)
    row = max(shape[-1] if shape else 1, 1)
    # Each class is built in place on its noise, row by row where the pattern depends only on the
    # index along the last axis (pos = np.arange(n) % row; n is a multiple of row), with the
    # operations, operands and order of the plain formula in its comment: the same roundings.
    pos = np.arange(row)
    # the last draw from this input's stream (make_array returns this array): the constant class,
    # which reads no noise, skips it
    v = stream.uniform(n, 0.0, 1.0) if vals != "constant" else np.full(n, 0.1)
    rows = v.reshape(n // row, row)
    signs = False
    if vals == "constant":
        pass
    elif vals == "offset":  # 1000.0 + (noise - 0.5) / 8
        v -= 0.5
        v /= 8
        v += 1000.0
    elif vals == "alternating":  # where(pos % 2 == 0, 1.0, -1.0) * (1.0 + noise * 2^-8)
        v *= 2.0**-8
        v += 1.0
        signs = True  # negated after the sum of magnitudes below (-1.0 * y is -y exactly)
    elif vals == "increasing":  # 2^-12 .. 2^4 along the row, mantissas random
        # exp2(-12.0 + 16.0 * pos / max(row - 1, 1)) * (1.0 + noise)
        v += 1.0
        rows *= np.exp2(-12.0 + 16.0 * pos / max(row - 1, 1))
    elif vals == "tiny_tail":  # just below half an ulp of 1 in the input's precision
        # where(pos == 0, 1.0, 2^-(p+1) * (1.0 - 2^-(p-1) * floor(noise * 4)))
        v *= 4
        np.floor(v, out=v)
        v *= 2.0 ** -(fi.mant_bits - 1)
        np.subtract(1.0, v, out=v)
        v *= 2.0 ** -(fi.mant_bits + 1)
        rows[:, 0] = 1.0
    else:
        raise ValueError(f"not an accumulation class: {vals!r}")
    total = float(np.sum(v))  # sum |v|: every v is positive here (alternating's signs come next)
    if signs:
        rows[:, 1::2] *= -1.0
    if kind == "product":  # exp2(8.0 * v / (total or 1.0))
        v *= 8.0
        v /= total or 1.0
        np.exp2(v, out=v)
    else:
        limit = math.sqrt(fi.max) / max(total, 1.0)
        if limit < 1:  # v * 2^floor(log2 limit) (v * 1.0 is v)
            v *= 2.0 ** math.floor(math.log2(limit))
    return _to(v, npd)
