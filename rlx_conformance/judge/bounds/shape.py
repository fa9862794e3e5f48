"""Error bound of the one accumulating data-movement op, scatter_add (ops/shape.py); every other
shape op only moves values and is judged bit-exact."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma


def scatter_add_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """Each output row sums the m updates aimed at it, in an order the backend chooses (GPU
    atomics: any order): 2*gamma_(m-1)*sum|u| per element. Where sum|u| overflows the compute
    dtype the result depends on the order (unasserted, NaN)."""
    upd, idx = inputs
    m = attrs["out_dim"]
    rows = np.where(idx < 0, idx + m, idx).astype(np.int64)
    u = np.abs(upd.astype(np.float64))
    a = np.zeros((m,) + upd.shape[1:])
    # Infinite or NaN updates give the same non-finite sum in any order (compared as such)
    np.add.at(a, rows, np.where(np.isfinite(u), u, 0.0))
    cnt = np.bincount(rows, minlength=m).reshape((m,) + (1,) * (upd.ndim - 1))
    cdt = dt.compute_dtype(out_dtype)
    b = 2 * gamma(np.maximum(cnt - 1, 0), dt.finfo(cdt).unit_roundoff) * a
    return np.where(a > dt.finfo(cdt).max, np.nan, b)
