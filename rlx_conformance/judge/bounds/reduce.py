"""Error bounds of the reductions and scans (ops/reduce.py): sums, means, products, running sums
and products, softmax.

Accumulating ops are judged by error bounds from the standard summation analysis (Higham,
*Accuracy and Stability of Numerical Algorithms*, ch. 3-4), not by a flat tolerance: any order of
accumulation is legal, so a backend may differ from the reference by up to the bound. Each bound
is for two implementations (the backend and the reference), hence the factor 2.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma


def _reduced(x: np.ndarray, attrs) -> tuple[tuple[int, ...], int]:
    axes = attrs["axes"] or tuple(range(x.ndim))
    axes = tuple(a % x.ndim for a in axes) if x.ndim else ()
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    return axes, n


def _u(dtype_name: str) -> float:
    return dt.finfo(dt.compute_dtype(dtype_name)).unit_roundoff


def sum_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str,
              scale: float = 1.0) -> np.ndarray:
    """|computed - exact| <= gamma_{n-1} * sum|x| for any summation order; two implementations
    therefore differ by at most twice that. Where sum|x| overflows the compute dtype the result
    depends on accumulation order (one order overflows, another does not): NaN marks those
    positions as unasserted."""
    (x,) = inputs
    axes, n = _reduced(x, attrs)
    cdt = dt.compute_dtype(out_dtype)
    s = np.sum(np.abs(x.astype(np.float64)), axis=axes, keepdims=attrs["keep_dim"])
    bound = 2 * gamma(max(n - 1, 0), _u(out_dtype)) * s * scale
    return np.where(s > dt.finfo(cdt).max, np.nan, bound)


def mean_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """A mean is a sum (bound above) then one division by n: add one rounding of the result."""
    _, n = _reduced(inputs[0], attrs)
    return sum_bound(inputs, attrs, out_dtype, scale=1.0 / max(n, 1))


def prod_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """n-1 multiplications: relative error <= gamma_{n-1}; two implementations differ by twice
    that. Products whose partial products can over- or underflow depending on order are
    unasserted (NaN): log2 of the largest possible partial product exceeds the exponent range."""
    (x,) = inputs
    axes, n = _reduced(x, attrs)
    fi = dt.finfo(dt.compute_dtype(out_dtype))
    x64 = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(x64)
        up = np.sum(np.where(lg > 0, lg, 0), axis=axes, keepdims=attrs["keep_dim"])
        down = np.sum(np.where(lg < 0, lg, 0), axis=axes, keepdims=attrs["keep_dim"])
        p = np.prod(x64, axis=axes, keepdims=attrs["keep_dim"])
    risky = (up >= np.log2(fi.max)) | (down <= np.log2(fi.tiny))
    bound = 2 * gamma(max(n - 1, 0), fi.unit_roundoff) * np.abs(p)
    return np.where(risky, np.nan, bound)


def cumsum_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """Per position, a sum of at most n terms along the axis: 2 gamma_{n-1} * (running sum |x|)."""
    (x,) = inputs
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    a = np.abs(x.astype(np.float64))
    if attrs["reverse"]:
        a = np.flip(a, axis)
    s = np.cumsum(a, axis=axis)
    if attrs["reverse"]:
        s = np.flip(s, axis)
    bound = 2 * gamma(max(n - 1, 0), _u(out_dtype)) * s
    return np.where(s > dt.finfo(dt.compute_dtype(out_dtype)).max, np.nan, bound)


def cumprod_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """Per position, a product of at most n factors: relative 2 gamma_{n-1}; positions whose
    partial products can leave the exponent range are unasserted (NaN)."""
    (x,) = inputs
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    fi = dt.finfo(dt.compute_dtype(out_dtype))
    x64 = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(x64)

        def run(v):
            v = np.flip(v, axis) if attrs["reverse"] else v
            c = np.cumsum(v, axis=axis)
            return np.flip(c, axis) if attrs["reverse"] else c
        up, down = run(np.where(lg > 0, lg, 0)), run(np.where(lg < 0, lg, 0))
        p = np.exp2(run(np.where(np.isfinite(lg), lg, 0)))
    risky = (up >= np.log2(fi.max)) | (down <= np.log2(fi.tiny))
    return np.where(risky, np.nan, 2 * gamma(max(n - 1, 0), fi.unit_roundoff) * p)


def softmax_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """exp(x_i - m) / sum_j exp(x_j - m): each exp has a few ulp of error, the sum gamma_{n-1},
    the division one rounding, so the relative error is below 2*(n + 4) u; results in the
    subnormal range lose relative accuracy, hence an absolute floor of the smallest normal."""
    (x,) = inputs
    if x.size == 0:
        return np.zeros(x.shape)
    n = x.shape[attrs["axis"] % x.ndim]
    cdt = dt.compute_dtype(out_dtype)
    u = _u(out_dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x64, axis=attrs["axis"], keepdims=True)
        e = np.exp(x64 - m)
        y = e / np.sum(e, axis=attrs["axis"], keepdims=True)
    return 2 * (n + 4) * u * np.abs(y) + dt.finfo(cdt).tiny
