"""The running-product recurrences of the reference's reduce_prod and cum_prod derivative rules
(backends/cpu/_grad.py): the per-row path on Python floats, taken for few long rows, gives the
vectorized path's float64 results bit for bit (the same operations in the same order), zeros,
signed zeros, infinities, NaN, subnormals and float32 inputs (taken in float64) included. The
vectorized path is the loop the rules had before."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_conformance.backends.cpu import _grad


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype=np.float64) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-3, 4, shape))
    flat = x.reshape(-1)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -2.2e-308, 1e300, 1.0, -1.0])
    pick = rng.random(flat.size) < 0.08
    flat[pick] = rng.choice(specials, int(pick.sum()))
    return x.astype(dtype)


def _both(fn, *arrays, monkeypatch):
    monkeypatch.setattr(_grad, "SHORT_BATCH", 10**9)
    rows = fn(*arrays)
    monkeypatch.setattr(_grad, "SHORT_BATCH", -1)
    vec = fn(*arrays)
    return rows, vec


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal as float64 bit patterns, every NaN counted as one pattern (payloads aside)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    na, nb = np.isnan(a), np.isnan(b)
    return bool(np.array_equal(na, nb) and np.array_equal(a[~na].view(np.uint64), b[~nb].view(np.uint64)))


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1000), (2, 3, 17), (0,), (4, 0), (1, 100003)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_per_row_path_is_the_vectorized_path_bit_for_bit(shape, dtype, monkeypatch):
    rng = np.random.default_rng(abs(hash((shape, str(dtype)))) % 2**32)
    x, t = _values(rng, shape, dtype), _values(rng, shape, dtype)
    for fn in (_grad.product_scan_tangent, _grad.product_scan_suffix):
        rows, vec = _both(fn, x, t, monkeypatch=monkeypatch)
        assert rows.dtype == vec.dtype == np.float64 and _same_bits(rows, vec), (fn.__name__, shape, dtype)


def test_recurrences_against_their_definitions():
    """Small exact cases: dp_j = sum_i t_i prod_{k<=j, k!=i} x_k, R_i = sum_{j>=i} u_j prod_{i<k<=j} x_k."""
    x = np.array([2.0, 0.0, 3.0, -1.0])
    t = np.array([1.0, 5.0, 0.5, 2.0])
    want_dp = [sum(t[i] * np.prod([x[k] for k in range(j + 1) if k != i]) for i in range(j + 1)) for j in range(4)]
    assert _grad.product_scan_tangent(x, t).tolist() == want_dp
    want_r = [sum(t[j] * np.prod(x[i + 1:j + 1]) for j in range(i, 4)) for i in range(4)]
    assert _grad.product_scan_suffix(x, t).tolist() == want_r
    # the last element of the suffix scan is u + 0: -0 becomes +0, as the loop it replaced
    assert np.signbit(_grad.product_scan_suffix(np.array([1.0]), np.array([-0.0]))[0]) == np.False_
