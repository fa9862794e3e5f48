"""MLX kernels for reductions and scans. MLX widens small-int reductions to int32/uint32 and
returns uint32 indices; results are cast back to the dtypes the registry declares."""
from __future__ import annotations

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND

kernel = BACKEND.kernel


def _axes(axes):
    return list(axes) if axes else None


def _reduction(fn):
    def run(x, *, axes, keep_dim):
        return fn(x, axis=_axes(axes), keepdims=keep_dim).astype(x.dtype)
    return run


kernel("reduce_sum")(_reduction(mx.sum))
kernel("reduce_mean")(_reduction(mx.mean))
kernel("reduce_max")(_reduction(mx.max))
kernel("reduce_min")(_reduction(mx.min))
kernel("reduce_prod")(_reduction(mx.prod))


@kernel("arg_max")
def arg_max(x, *, axis, keep_dim):
    return mx.argmax(x, axis=axis, keepdims=keep_dim).astype(mx.int64)


@kernel("arg_min")
def arg_min(x, *, axis, keep_dim):
    return mx.argmin(x, axis=axis, keepdims=keep_dim).astype(mx.int64)


@kernel("softmax")
def softmax(x, *, axis):
    return mx.softmax(x, axis=axis)


def _scan(fn):
    def run(x, *, axis, exclusive, reverse):
        return fn(x, axis=axis, reverse=reverse, inclusive=not exclusive).astype(x.dtype)
    return run


kernel("cumsum")(_scan(mx.cumsum))
kernel("cum_prod")(_scan(mx.cumprod))
kernel("cum_max")(_scan(mx.cummax))
