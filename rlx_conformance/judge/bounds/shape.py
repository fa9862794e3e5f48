"""Error bound of the one accumulating data-movement op, scatter_add (ops/shape.py); every other
shape op only moves values and is judged bit-exact."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma
from rlx_conformance.judge.bounds.summation import sum_judgement, sum_terms
from rlx_conformance.judge.compare import Bound


def scatter_add_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """Each output row sums the m updates aimed at it, in an order the backend chooses (GPU
    atomics: any order): 2*gamma_(m-1)*sum|u| per element over the finite updates. NaN and
    infinite updates, and finite ones whose partial sums may overflow the compute dtype in some
    order, follow summation.sum_judgement (exact where every order agrees, order-dependent
    outcomes otherwise)."""
    upd, idx = inputs
    m = attrs["out_dim"]
    rows = np.where(idx < 0, idx + m, idx).astype(np.int64)

    def into_rows(v: np.ndarray) -> np.ndarray:
        out = np.zeros((m,) + upd.shape[1:])
        np.add.at(out, rows, v)
        return out
    t = sum_terms(upd, into_rows)
    cnt = np.bincount(rows, minlength=m).reshape((m,) + (1,) * (upd.ndim - 1))
    cdt = dt.compute_dtype(out_dtype)
    b = 2 * gamma(np.maximum(cnt - 1, 0), dt.finfo(cdt).unit_roundoff) * t.abs_sum
    return sum_judgement(t, b, out_dtype, cnt)
