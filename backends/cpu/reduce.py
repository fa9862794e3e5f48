"""Reference kernels for reductions and scans. Float sums and running sums are accumulated in
float64 by trees of depth ceil(log2 n) (pairwise sums over a contiguous last axis, doubling
scans) and rounded once, so the reference sits inside the accuracy budget of its own dtype
(cases/accuracy.toml: depth <= 3.5 ceil(log2 n)), float64 included, and far inside the error bound
that the registry allows any accumulation order. numpy alone would not: it adds along a
non-contiguous axis and scans sequentially (depth n - 1), which the precise oracle found over the
float64 budgets (constant and offset values at n = 10^6). Products are numpy's: every
multiplication rounds the whole product, so no order beats gamma_(n-1) (their budget)."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND

kernel = BACKEND.kernel


def _axes(x, axes):
    return tuple(axes) if axes else None


def _over_last(x: np.ndarray, axes, keep_dim: bool, fn) -> np.ndarray:
    """``fn`` over the reduced axes moved last, flattened into one contiguous axis (numpy's
    pairwise summation applies only to a contiguous inner axis), shaped back."""
    ax = tuple(a % x.ndim for a in axes) if axes and x.ndim else tuple(range(x.ndim))
    rest = [a for a in range(x.ndim) if a not in ax]
    n = int(np.prod([x.shape[a] for a in ax]))
    w = np.ascontiguousarray(np.transpose(x, rest + list(ax))).reshape([x.shape[a] for a in rest] + [n])
    r = fn(w)
    if keep_dim:
        r = np.reshape(r, [1 if a in ax else x.shape[a] for a in range(x.ndim)])
    return np.asarray(r)


def _acc(fn, tree):
    """Reduce ints in their own dtype (wrapping), floats in float64 over the reduced axes made one
    contiguous last axis (``tree``), rounded once."""
    def run(x, *, axes, keep_dim):
        if np.issubdtype(x.dtype, np.floating):
            return _over_last(x.astype(np.float64), axes, keep_dim, tree).astype(x.dtype)
        return np.asarray(fn(x, axis=_axes(x, axes), keepdims=keep_dim, dtype=x.dtype))
    return run


kernel("reduce_sum")(_acc(np.sum, lambda w: np.sum(w, axis=-1)))
kernel("reduce_prod")(_acc(np.prod, lambda w: np.prod(w, axis=-1)))


@kernel("reduce_mean")
def reduce_mean(x, *, axes, keep_dim):
    return _over_last(x.astype(np.float64), axes, keep_dim, lambda w: np.mean(w, axis=-1)).astype(x.dtype)


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


def _doubling(combine):
    """An inclusive scan by recursive doubling (Hillis and Steele, "Data parallel algorithms",
    CACM 1986): after step k each position holds the combination of the 2^k terms ending there,
    so every result is a balanced tree of depth ceil(log2 n) rather than a chain of n - 1."""
    def run(a, axis, dtype):
        w = np.moveaxis(a, axis, -1).astype(dtype, copy=True)
        s = 1
        with np.errstate(all="ignore"):
            while s < w.shape[-1]:
                w[..., s:] = combine(w[..., s:], w[..., :-s])  # the right side is evaluated first
                s *= 2
        return np.moveaxis(w, -1, axis)
    return run


def _scan(accumulate, identity, tree=None):
    """Inclusive/exclusive, forward/reverse scan; ints in their dtype, floats via float64 (by
    ``tree`` where given: a doubling scan)."""
    def run(x, *, axis, exclusive, reverse):
        flt = np.issubdtype(x.dtype, np.floating)
        work = x.astype(np.float64) if flt else x
        if reverse:
            work = np.flip(work, axis)
        out = (tree if flt and tree is not None and work.ndim else accumulate)(work, axis=axis, dtype=work.dtype)
        if exclusive and out.shape[axis]:
            ident = np.full_like(np.take(out, [0], axis=axis), identity(x.dtype))
            out = np.concatenate([ident, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
        if reverse:
            out = np.flip(out, axis)
        return out.astype(x.dtype)
    return run


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


kernel("cumsum")(_scan(np.cumsum, lambda d: 0, _doubling(np.add)))
kernel("cum_prod")(_scan(np.cumprod, lambda d: 1))
kernel("cum_max")(_scan(lambda a, axis, dtype: np.maximum.accumulate(a, axis=axis, dtype=dtype), _lowest))
