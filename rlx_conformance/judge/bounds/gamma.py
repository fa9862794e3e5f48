"""The constant of every accumulation bound in the judges, defined once.

gamma_n = n u / (1 - n u), for unit roundoff u and n u < 1 (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., Lemma 3.1): a product of n factors (1 + delta_i)^(+-1) with
|delta_i| <= u is 1 + theta_n with |theta_n| <= gamma_n. Hence the error of an n-term sum in any
order is at most gamma_(n-1) sum|x_i| (Higham sec. 3.1, 4.2), of a dot product of length n at
most gamma_n sum|x_i y_i| (sec. 3.1), of an n-factor product at most gamma_(n-1) |prod|.

The u the bounds use, also defined here once: :func:`uc`, that of the dtype an op computes in
(float32 for float16/bfloat16 outputs), and ``U64``, that of the float64 reference.
"""
from __future__ import annotations

import math
from typing import overload

import numpy as np

from rlx_conformance.core import dtypes as dt

U64 = dt.finfo("float64").unit_roundoff  # 2^-53


def uc(dtype: str) -> float:
    """The unit roundoff of the dtype an op with output ``dtype`` computes in."""
    return dt.finfo(dt.compute_dtype(dtype)).unit_roundoff


@overload
def gamma(n: float, u: float) -> float: ...
@overload
def gamma(n: np.ndarray, u: float) -> np.ndarray: ...


def gamma(n: np.ndarray | float, u: float) -> np.ndarray | float:
    """gamma_n = n u / (1 - n u) (Higham Lemma 3.1), +inf once n u >= 1 (no bound holds there).

    A scalar ``n`` gives a float, an array of counts an array of the same shape (per-position
    counts, e.g. the number of updates each scatter target receives)."""
    if np.ndim(n) == 0:
        nu = float(n) * u
        return nu / (1 - nu) if nu < 1 else math.inf
    nu = np.asarray(n, dtype=np.float64) * u
    return np.where(nu < 1, nu / np.maximum(1 - nu, 1e-300), np.inf)
