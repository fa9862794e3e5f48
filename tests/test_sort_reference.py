"""The CPU reference of sort, arg_sort and top_k against Python's sorted() (a stable sort) with an
explicit key: NaN after everything ascending, before everything descending, -0 == +0."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from rlx_conformance.backends import get_backend

CPU = get_backend("cpu")


def oracle_order(values: list[float], descending: bool) -> list[int]:
    def key(i):
        v = float(values[i])
        nan = math.isnan(v)
        return (not nan, -v if not nan else 0.0) if descending else (nan, v if not nan else 0.0)
    return sorted(range(len(values)), key=key)


def sample(dtype, n=400, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.integers(-5, 6, n).astype(np.float64)
    pick = rng.integers(0, 6, n)
    x = np.where(pick == 0, np.nan, np.where(pick == 1, -0.0, np.where(pick == 2, np.inf, x)))
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16, np.float64])
@pytest.mark.parametrize("descending", [False, True])
def test_arg_sort_and_sort_match_stable_oracle(dtype, descending):
    x = sample(dtype).reshape(4, 100)
    (idx,) = CPU.run("arg_sort", [x], {"axis": -1, "descending": descending})
    (vals,) = CPU.run("sort", [x], {"axis": -1, "descending": descending})
    for r in range(4):
        want = oracle_order(list(x[r].astype(np.float64)), descending)
        assert idx[r].tolist() == want
        assert vals[r].view(np.uint8).tobytes() == x[r][want].view(np.uint8).tobytes()


def test_sort_along_axis_0_and_ints():
    x = np.random.default_rng(1).integers(-128, 128, (50, 3)).astype(np.int8)
    for desc in (False, True):
        (idx,) = CPU.run("arg_sort", [x], {"axis": 0, "descending": desc})
        for c in range(3):
            assert idx[:, c].tolist() == oracle_order(list(x[:, c].astype(float)), desc)


def test_top_k_ties_to_smaller_index_and_nan_first():
    x = np.array([[1.0, 3.0, 3.0, np.nan, -np.inf, 3.0]], np.float32)
    vals, idx = CPU.run("top_k", [x], {"k": 4})
    assert idx.tolist() == [[3, 1, 2, 5]]
    assert np.isnan(vals[0, 0]) and vals[0, 1:].tolist() == [3.0, 3.0, 3.0]
