"""dtypes.narrow: float64 -> bfloat16 rounded once, whatever ml_dtypes version is installed (older
ones round through float32, twice); checked against MPFR (gmpy2) on values around every kind of
tie, on random values, and at the edges (subnormals, overflow, NaN, signed zero)."""
from __future__ import annotations

import gmpy2
import ml_dtypes
import numpy as np

from rlx_conformance.core import dtypes as dt

BF16 = gmpy2.context(precision=8, emin=-132, emax=128, subnormalize=True,
                     round=gmpy2.RoundToNearest)


def mpfr_bf16(x: float) -> float:
    """x rounded to bfloat16 by MPFR, as a float64 (inf past the largest finite)."""
    if x != x or x in (float("inf"), float("-inf")) or x == 0:
        return x
    return float(BF16.plus(gmpy2.mpfr(x)))


def around_ties(rng: np.random.Generator, n: int) -> np.ndarray:
    """Midpoints between neighbouring bfloat16 numbers (normal and subnormal), and the float64
    values just below and above them, where rounding twice goes wrong."""
    bits = rng.integers(0, 0x7F7F, n, dtype=np.uint16)
    lo = bits.view(ml_dtypes.bfloat16).astype(np.float64)
    hi = (bits + 1).view(ml_dtypes.bfloat16).astype(np.float64)
    mid = (lo + hi) / 2  # exact in float64
    out = np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf)])
    return np.concatenate([out, -out])


def test_narrow_rounds_once_to_nearest_even():
    rng = np.random.default_rng(0)
    x = np.concatenate([around_ties(rng, 4000), rng.standard_normal(4000) * 10.0 ** rng.integers(-45, 39, 4000),
                        [0.0, -0.0, np.inf, -np.inf, 3.4e38, 3.3961e38, 3.3963e38, 1e-45, 4.591774807899562e-41,
                         2.0 ** -134, -(2.0 ** -134)]])
    got = dt.narrow(x, "bfloat16").astype(np.float64)
    want = np.array([mpfr_bf16(float(v)) for v in x])
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:5]]
    assert np.signbit(got[x == 0]).tolist() == np.signbit(x[x == 0]).tolist()


def test_narrow_keeps_nan_and_leaves_other_conversions_to_numpy():
    assert np.isnan(dt.narrow(np.array([np.nan]), "bfloat16").astype(np.float64)).all()
    x = np.array([1.0 + 2.0 ** -11, 65520.0, 2.0 ** -25 * 1.000001])
    assert dt.narrow(x, "float16").tobytes() == x.astype(np.float16).tobytes()
    f = np.array([1.5, -2.25], np.float32)
    assert dt.narrow(f, "bfloat16").tobytes() == f.astype(ml_dtypes.bfloat16).tobytes()
