"""Error bounds of the reductions and scans (ops/reduce.py): sums, means, products, running sums
and products, softmax.

Accumulating ops are judged by error bounds from the standard summation analysis (Higham,
*Accuracy and Stability of Numerical Algorithms*, ch. 3-4), not by a flat tolerance: any order of
accumulation is legal, so a backend may differ from the reference by up to the bound. Each bound
is for two implementations (the backend and the reference), hence the factor 2. What a sum or
a product returns beyond a finite value within its bound (NaN, infinities, outcomes that depend
on the order through intermediate overflow) is decided in judge/bounds/summation.py.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma, uc
from rlx_conformance.judge.bounds.summation import (
    prod_judgement,
    prod_terms,
    sum_judgement,
    sum_terms,
)
from rlx_conformance.judge.compare import Bound


def exclusive_sums(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """sum_(j != i) a_j along ``axis`` for nonnegative a, as a prefix plus a suffix sum: no
    subtraction from the total, which cancels where a_i dominates (1 - p_i of a saturated
    softmax row's largest weight is ~1e-30; 1 - p_i in floating point is 0 or ~1e-16 there).
    The attention derivative's bound (nn.py) and the CPU reference's magnitudes of reductions
    (backends/cpu/_grad.py) read it."""
    w = np.moveaxis(a, axis, -1)
    zero = np.zeros(w.shape[:-1] + (1,))
    before = np.cumsum(np.concatenate([zero, w[..., :-1]], -1), -1)
    after = np.flip(np.cumsum(np.concatenate([zero, np.flip(w, -1)[..., :-1]], -1), -1), -1)
    return np.moveaxis(before + after, -1, axis)


def _reduced(x: np.ndarray, attrs) -> tuple[tuple[int, ...], int]:
    axes = attrs["axes"] or tuple(range(x.ndim))
    axes = tuple(a % x.ndim for a in axes) if x.ndim else ()
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    return axes, n


def _reducer(x: np.ndarray, attrs: Mapping[str, Any]):
    axes, _ = _reduced(x, attrs)
    run = lambda v: np.sum(v, axis=axes, keepdims=attrs["keep_dim"])  # noqa: E731
    run.terms_key = ("sum", axes, bool(attrs["keep_dim"]))  # budgets.py builds the same map
    return run


def _scanner(x: np.ndarray, attrs: Mapping[str, Any]):
    """A linear map giving, per position of a scan, the sum of the terms that position's result
    combines: the running sum along ``axis`` (from the end when ``reverse``), shifted by one with
    an empty first sum when ``exclusive``."""
    axis = attrs["axis"] % x.ndim

    def run(v: np.ndarray) -> np.ndarray:
        v = np.flip(v, axis) if attrs["reverse"] else v
        if attrs["exclusive"] and v.shape[axis] and v.dtype == np.float64:
            # the running sums of all but the last term, written after a zero: the same
            # sequential sums as shifting the full running sum, without its two copies
            c = np.zeros(v.shape)
            head, tail = [slice(None)] * v.ndim, [slice(None)] * v.ndim
            head[axis], tail[axis] = slice(None, -1), slice(1, None)
            np.cumsum(v[tuple(head)], axis=axis, out=c[tuple(tail)])
            return np.flip(c, axis) if attrs["reverse"] else c
        c = np.cumsum(v, axis=axis)
        if attrs["exclusive"] and c.shape[axis]:
            first = np.zeros_like(np.take(c, [0], axis=axis))
            c = np.concatenate([first, np.take(c, np.arange(c.shape[axis] - 1), axis=axis)], axis=axis)
        return np.flip(c, axis) if attrs["reverse"] else c
    run.terms_key = ("scan", axis, bool(attrs["reverse"]), bool(attrs["exclusive"]))  # budgets.py's too
    return run


def sum_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str,
              scale: float = 1.0) -> Bound:
    """|computed - exact| <= gamma_{n-1} * sum|x| for any summation order; two implementations
    therefore differ by at most twice that (sum|x| over the finite terms). NaN and infinite
    terms, and finite terms whose partial sums may overflow the compute dtype in some order,
    follow summation.sum_judgement: exact NaN/inf where every order agrees, the legal outcomes
    (counted as order-dependent) where the overflow depends on the order."""
    (x,) = inputs
    _, n = _reduced(x, attrs)
    t = sum_terms(x, _reducer(x, attrs))
    bound = 2 * gamma(max(n - 1, 0), uc(out_dtype)) * t.abs_sum * scale
    return sum_judgement(t, bound, out_dtype, n)


def mean_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """A mean is a sum (bound above) then one division by n: add one rounding of the result.
    The non-finite and overflow outcomes are the sum's (inf / n = inf)."""
    _, n = _reduced(inputs[0], attrs)
    return sum_bound(inputs, attrs, out_dtype, scale=1.0 / max(n, 1))


def prod_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """n-1 multiplications: relative error <= gamma_{n-1}; two implementations differ by twice
    that. NaN, infinite and zero factors, and partial products that may over- or underflow in
    some order (log2 of the largest possible partial product beyond the exponent range), follow
    summation.prod_judgement."""
    (x,) = inputs
    _, n = _reduced(x, attrs)
    t = prod_terms(x, _reducer(x, attrs))
    with np.errstate(over="ignore"):
        p = np.exp2(t.up + t.down)
    bound = 2 * gamma(max(n - 1, 0), uc(out_dtype)) * p
    return prod_judgement(t, bound, out_dtype, n)


def cumsum_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """Per position, a sum of at most n terms along the axis: 2 gamma_{n-1} * (running sum |x|),
    with the non-finite and overflow outcomes of that position's own terms (the prefix, or the
    suffix when reversed; without the position's own element when exclusive)."""
    (x,) = inputs
    n = x.shape[attrs["axis"] % x.ndim]
    t = sum_terms(x, _scanner(x, attrs))
    bound = 2 * gamma(max(n - 1, 0), uc(out_dtype)) * t.abs_sum
    return sum_judgement(t, bound, out_dtype, n)


def cumprod_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """Per position, a product of at most n factors: relative 2 gamma_{n-1}, with the
    non-finite and range outcomes of that position's own factors (summation.prod_judgement)."""
    (x,) = inputs
    n = x.shape[attrs["axis"] % x.ndim]
    t = prod_terms(x, _scanner(x, attrs))
    with np.errstate(over="ignore"):
        p = np.exp2(t.up + t.down)
    return prod_judgement(t, 2 * gamma(max(n - 1, 0), uc(out_dtype)) * p, out_dtype, n)


def softmax_bound(inputs: list[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """exp(x_i - m) / sum_j exp(x_j - m): each exp has a few ulp of error, the sum gamma_{n-1},
    the division one rounding, so the relative error is below 2*(n + 4) u; results in the
    subnormal range lose relative accuracy, hence an absolute floor of the smallest normal.

    Nothing here depends on the order: x - m <= 0 never overflows and the n exponentials sum to
    at most n. So a row with a NaN, a +inf (inf - inf at the max) or nothing but -inf (-inf + inf)
    is NaN throughout, and a -inf elsewhere gives exactly 0: every non-finite outcome is exact
    (bound 0 where the reference's value is NaN)."""
    (x,) = inputs
    if x.size == 0:
        return np.zeros(x.shape)
    n = x.shape[attrs["axis"] % x.ndim]
    cdt = dt.compute_dtype(out_dtype)
    u = uc(out_dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x64, axis=attrs["axis"], keepdims=True)
        e = np.exp(x64 - m)
        y = e / np.sum(e, axis=attrs["axis"], keepdims=True)
    return np.where(np.isfinite(y), 2 * (n + 4) * u * np.abs(y) + dt.finfo(cdt).tiny, 0.0)
