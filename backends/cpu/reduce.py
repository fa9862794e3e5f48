"""Reference kernels for reductions and scans. Float sums and products are accumulated in
float64 (pairwise) and rounded once, so the reference sits far inside the error bound that the
registry allows any accumulation order."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND

kernel = BACKEND.kernel


def _axes(x, axes):
    return tuple(axes) if axes else None


def _acc(fn):
    """Reduce ints in their own dtype (wrapping), floats in float64 rounded once."""
    def run(x, *, axes, keep_dim):
        if np.issubdtype(x.dtype, np.floating):
            return np.asarray(fn(x.astype(np.float64), axis=_axes(x, axes), keepdims=keep_dim)).astype(x.dtype)
        return np.asarray(fn(x, axis=_axes(x, axes), keepdims=keep_dim, dtype=x.dtype))
    return run


kernel("reduce_sum")(_acc(np.sum))
kernel("reduce_prod")(_acc(np.prod))


@kernel("reduce_mean")
def reduce_mean(x, *, axes, keep_dim):
    return np.asarray(np.mean(x.astype(np.float64), axis=_axes(x, axes), keepdims=keep_dim)).astype(x.dtype)


@kernel("reduce_max")
def reduce_max(x, *, axes, keep_dim):
    return np.asarray(np.max(x, axis=_axes(x, axes), keepdims=keep_dim))  # NaN propagates


@kernel("reduce_min")
def reduce_min(x, *, axes, keep_dim):
    return np.asarray(np.min(x, axis=_axes(x, axes), keepdims=keep_dim))


@kernel("arg_max")
def arg_max(x, *, axis, keep_dim):
    """First index of the max; NaN counts as the max and the first NaN wins (numpy's rule)."""
    return np.asarray(np.argmax(x, axis=axis, keepdims=keep_dim)).astype(np.int64)


@kernel("arg_min")
def arg_min(x, *, axis, keep_dim):
    return np.asarray(np.argmin(x, axis=axis, keepdims=keep_dim)).astype(np.int64)


@kernel("softmax")
def softmax(x, *, axis):
    if x.size == 0:
        return x.copy()
    x64 = x.astype(np.float64)
    m = np.max(x64, axis=axis, keepdims=True)
    # exp(x - m) turns the rounding of x - m (|x - m| u absolute) into a relative error of
    # |x - m| u: carry its exact error (TwoSum) into exp(d + err) = exp(d)(1 + err). Found by the
    # precise oracle: float64 outputs near 1e-8 were 14 ulp off (float32 inputs: x - m is exact).
    with np.errstate(invalid="ignore"):
        d = x64 - m
        bb = d - x64
        err = (x64 - (d - bb)) + (-m - bb)
        e = np.exp(d) * (1 + np.where(np.isfinite(err), err, 0.0))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def _scan(accumulate, identity):
    """Inclusive/exclusive, forward/reverse scan; ints in their dtype, floats via float64."""
    def run(x, *, axis, exclusive, reverse):
        work = x.astype(np.float64) if np.issubdtype(x.dtype, np.floating) else x
        if reverse:
            work = np.flip(work, axis)
        out = accumulate(work, axis=axis, dtype=work.dtype)
        if exclusive and out.shape[axis]:
            ident = np.full_like(np.take(out, [0], axis=axis), identity(x.dtype))
            out = np.concatenate([ident, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
        if reverse:
            out = np.flip(out, axis)
        return out.astype(x.dtype)
    return run


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


kernel("cumsum")(_scan(np.cumsum, lambda d: 0))
kernel("cum_prod")(_scan(np.cumprod, lambda d: 1))
kernel("cum_max")(_scan(lambda a, axis, dtype: np.maximum.accumulate(a, axis=axis, dtype=dtype), _lowest))
