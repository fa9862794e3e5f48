"""The fast paths of input generation (issue 18) against the straightforward formulas they replace.

Each fast path must give the very bits of the plain computation (a case id names its inputs, and
the committed baselines were made with the plain one): the float64 -> bfloat16/float16 rounding
(core/dtypes._narrow_fast) against an exact round-to-nearest-even over the target's whole value
table, on the edge values where a rounding goes wrong (ties, subnormals of float32, bfloat16 and
float16, overflow to infinity, NaN, -0.0, the largest finite values); the uint64 remainder,
the bitwise select and the uniform draw of spec/values.py against %, np.where and the two-product
formula; the accumulation classes against their plain formulas.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec import values

HALF = ("bfloat16", "float16")


def _table(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every finite non-negative value of ``name`` (as float64, ascending) and its bit pattern."""
    bits = np.arange(0x8000, dtype=np.uint16)
    with np.errstate(invalid="ignore"):  # the NaN patterns
        v = bits.view(dt.np_dtype(name)).astype(np.float32).astype(np.float64)  # exact widenings
    keep = np.isfinite(v)
    return v[keep], bits[keep]


def _exact(x: np.ndarray, name: str) -> np.ndarray:
    """Round-to-nearest-even of float64 ``x`` to ``name``, as bits, from the value table: the
    nearer neighbour, the even bit pattern on a tie, infinity from the largest finite value plus
    half an ulp on (IEEE 754: rounding as if the exponent range were unbounded)."""
    vals, bits = _table(name)
    fi = dt.finfo(name)
    big = 2.0 ** (math.floor(math.log2(fi.max)) + 1)  # the next value after max, unbounded
    a = np.abs(x)
    i = np.clip(np.searchsorted(vals, a, side="right") - 1, 0, len(vals) - 1)
    lo, lo_bits = vals[i], bits[i].astype(np.uint32)
    top = i + 1 >= len(vals)
    hi = np.where(top, big, vals[np.minimum(i + 1, len(vals) - 1)])
    hi_bits = np.where(top, np.uint32(0x7C00 if name == "float16" else 0x7F80),
                       bits[np.minimum(i + 1, len(vals) - 1)].astype(np.uint32))
    with np.errstate(invalid="ignore", over="ignore"):
        d_lo, d_hi = a - lo, hi - a
        up = (d_hi < d_lo) | ((d_hi == d_lo) & (lo_bits & 1 == 1))
    out = np.where(up | np.isinf(a), hi_bits, lo_bits)  # infinity: i is the last, hi_bits inf
    out = out | np.where(np.signbit(x), np.uint32(0x8000), np.uint32(0))
    return out.astype(np.uint16)


def _edges(name: str) -> np.ndarray:
    """float64 values where a rounding to ``name`` goes wrong: each tie between neighbours, one
    float64 ulp either side of it, the values themselves, over the subnormals, the smallest
    normals, a sample of the normal range and the largest values and overflow; float32's
    subnormals and smallest normal; zeros, infinities, float64's extremes; both signs."""
    vals, _ = _table(name)
    pick = np.r_[0:80, len(vals) // 2 - 40:len(vals) // 2 + 40, len(vals) - 80:len(vals)]
    rng = np.random.default_rng(18)
    pick = np.unique(np.r_[pick, rng.integers(0, len(vals), 400),
                           np.searchsorted(vals, dt.finfo(name).tiny) + np.arange(-40, 40)])
    pick = pick[(pick >= 0) & (pick < len(vals))]
    fi = dt.finfo(name)
    nxt = np.r_[vals[1:], 2.0 ** (math.floor(math.log2(fi.max)) + 1)]
    ties = (vals[pick] + nxt[pick]) / 2  # exact in float64: 16-bit values have few bits
    base = np.r_[vals[pick], ties]
    base = np.r_[base, np.nextafter(base, np.inf), np.nextafter(base, -np.inf)]
    f32 = np.float32
    extra = [0.0, 2.0**-149, 3 * 2.0**-150, 2.0**-140, 2.0**-127, 2.0**-126 - 2.0**-150, 2.0**-126,
             float(np.finfo(f32).max), 2.0**128, 2.0**128 - 2.0**103, 2.0**127 * 1.9999,
             65504.0, 65519.99, 65520.0, 65536.0, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26,
             1e300, np.finfo(np.float64).max, 5e-324, 2.0**-1022, np.inf]
    allv = np.r_[base, extra]
    return np.r_[allv, -allv, -0.0, np.nan, -np.nan]


@pytest.mark.parametrize("name", HALF)
def test_narrow_fast_rounds_exactly_on_edge_values(name):
    x = _edges(name)
    assert x.size >= dt._FAST_MIN
    want = _exact(x, name)
    fast = dt._narrow_fast(x, name).view(np.uint16)
    plain = dt._narrow_plain(x, name).view(np.uint16)
    finite = ~np.isnan(x)
    bad = np.flatnonzero(fast[finite] != want[finite])
    assert not bad.size, [(float(v), hex(int(f)), hex(int(w))) for v, f, w in
                          zip(x[finite][bad[:5]], fast[finite][bad[:5]], want[finite][bad[:5]])]
    assert np.array_equal(plain[finite], want[finite])  # the reference agrees with the plain path
    assert np.array_equal(fast, plain)  # NaN too, bit for bit (the plain path's payload)
    assert np.array_equal(dt.narrow(x, name).view(np.uint16), plain)


@pytest.mark.parametrize("name", HALF)
@pytest.mark.parametrize("subnormals", [False, True])
def test_narrow_fast_both_branches(name, subnormals):
    """All-normal inputs take the signed-constant branch, inputs with target subnormals or zeros
    the magnitude one; both must equal the exact rounding, ties included."""
    rng = np.random.default_rng(7)
    vals, _ = _table(name)
    tiny = dt.finfo(name).tiny
    normal = vals[vals >= tiny][:-1]
    nxt = vals[vals >= tiny][1:]
    i = rng.integers(0, normal.size, 5000)
    x = np.r_[(normal[i] + nxt[i]) / 2, normal[i] * (1 + rng.random(5000) * 2.0**-9)]
    if subnormals:
        x = np.r_[x, rng.random(5000) * tiny, 0.0, -0.0]
    x = x * rng.choice([-1.0, 1.0], x.size)
    assert (np.abs(x).min() >= tiny) != subnormals
    assert np.array_equal(dt._narrow_fast(x, name).view(np.uint16), _exact(x, name))


@pytest.mark.parametrize("name", HALF)
def test_narrow_by_blocks_is_the_plain_conversion(name):
    """narrow works block by block (dtypes._CHUNK) on large arrays: the edge values spread over
    several blocks, with and without a NaN, some blocks all normal and some not, shaped 2-D."""
    rng = np.random.default_rng(5)
    e = _edges(name)
    for x in (rng.permutation(np.resize(e, 3 * dt._CHUNK + 17)),
              np.r_[rng.uniform(-3, 3, 2 * dt._CHUNK), e[~np.isnan(e)], rng.uniform(-3, 3, 999)] * 2.0**-12):
        x = x[: x.size // 7 * 7].reshape(7, -1)
        got = dt.narrow(x, name)
        assert got.shape == x.shape and got.dtype == dt.np_dtype(name)
        assert np.array_equal(got.view(np.uint16), dt._narrow_plain(x, name).view(np.uint16))


def test_narrow_takes_fast_path_for_float16_subnormals_only_by_speed():
    """float16's choice between the paths depends on a sample; either way the bits are the same."""
    rng = np.random.default_rng(3)
    for scale in (1.0, 2.0**-16):
        x = rng.uniform(-1, 1, 4096) * scale
        assert np.array_equal(dt.narrow(x, "float16").view(np.uint16), x.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("k", [1, 2, 3, 7, 8, 17, 255, 1000, 2**31 - 1, 2**32, 2**32 + 1, 2**62 + 3, 2**63 - 1])
def test_mod_is_remainder(k):
    r = np.random.PCG64(k).random_raw(2 * values.CHUNK + 5000)  # several blocks
    r[:4] = [0, 2**64 - 1, k - 1, k]
    want = r % np.uint64(k)
    got = values._mod(r.copy(), k)
    assert got.dtype == np.uint64 and np.array_equal(got, want)


@pytest.mark.parametrize("dtype", dt.ALL)
def test_select_is_where(dtype):
    n = 3000
    raw = np.random.PCG64(11).random_raw(2 * n)
    npd = dt.np_dtype(dtype)
    itemsize = npd.itemsize
    u = values._UINT[itemsize]
    new = (raw[:n].astype(u) if dtype != "bool" else (raw[:n] & np.uint64(1)).astype(u)).view(npd)
    old = (raw[n:].astype(u) if dtype != "bool" else (raw[n:] >> np.uint64(1) & np.uint64(1)).astype(u)).view(npd)
    coin = np.random.PCG64(12).random_raw(n)
    want = np.where((coin & np.uint64(1)).astype(bool), new, old)
    assert np.array_equal(values._select(coin.copy(), new, old).view(u), want.view(u))
    mask = coin % np.uint64(3) == 0
    assert np.array_equal(values._select(mask, new, old).view(u), np.where(mask, new, old).view(u))


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-1, 1), (-100.0, 100.0), (1e-300, 3e-300),
                                   (0.0, 2.0**-1000), (-3, 1e6), (5.0, 5.0), (0.5, 0.1)])
def test_uniform_is_the_plain_formula(lo, hi):
    n = 2 * values.CHUNK + 4000  # several blocks of the in-place conversion
    got = values.Stream("u").uniform(n, lo, hi)
    u = (values.Stream("u").raw(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    want = lo + (hi - lo) * u
    assert np.array_equal(got.view(np.uint64), want.view(np.uint64))


def _accumulation_plain(stream, shape, dtype, vals, kind):
    """spec/values._accumulation as it was written before the in-place rewrite."""
    n = math.prod(shape)
    fi = dt.finfo(dtype)
    row = max(shape[-1] if shape else 1, 1)
    pos = np.arange(n) % row
    noise = stream.uniform(n, 0.0, 1.0) if vals != "constant" else None
    if vals == "constant":
        v = np.full(n, 0.1)
    elif vals == "offset":
        v = 1000.0 + (noise - 0.5) / 8
    elif vals == "alternating":
        v = np.where(pos % 2 == 0, 1.0, -1.0) * (1.0 + noise * 2.0**-8)
    elif vals == "increasing":
        v = np.exp2(-12.0 + 16.0 * pos / max(row - 1, 1)) * (1.0 + noise)
    else:
        tiny = 2.0 ** -(fi.mant_bits + 1) * (1.0 - 2.0 ** -(fi.mant_bits - 1) * np.floor(noise * 4))
        v = np.where(pos == 0, 1.0, tiny)
    total = float(np.sum(np.abs(v)))
    if kind == "product":
        out = np.exp2(8.0 * v / (total or 1.0))
    else:
        limit = math.sqrt(fi.max) / max(total, 1.0)
        out = v * (2.0 ** math.floor(math.log2(limit)) if limit < 1 else 1.0)
    return dt._narrow_plain(out, dtype)


@pytest.mark.parametrize("vals", values.ACCUMULATION_CLASSES)
@pytest.mark.parametrize("dtype", dt.FLOATS)
@pytest.mark.parametrize("kind", ["sum", "product"])
def test_accumulation_is_the_plain_formula(vals, dtype, kind):
    for shape in ((3000,), (40, 257), (2**17,)):
        key = f"acc/{vals}/{dtype}/{shape}#0"
        got = values._accumulation(values.Stream(key), shape, dtype, vals, kind)
        want = _accumulation_plain(values.Stream(key), shape, dtype, vals, kind)
        assert got.dtype == want.dtype
        assert np.array_equal(got.view(values._UINT[got.itemsize]), want.view(values._UINT[got.itemsize]))
