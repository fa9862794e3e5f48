"""Reference kernels for shape and data movement. Layout ops are numpy indexing (they copy bits);
index-taking ops check every index on the host and raise SpecError for one out of range, as the
spec requires of every backend. scatter_add accumulates floats in float64 and rounds once."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.core.errors import SpecError
from rlx_conformance.ops.shape import check_indices, slice_indices

kernel = BACKEND.kernel


def _index_dtype(op: str, idx: np.ndarray) -> None:
    if idx.dtype not in (np.int32, np.int64):
        raise SpecError(f"{op}: indices must be int32 or int64, got {idx.dtype}")


@kernel("reshape")
def reshape(x, *, new_shape):
    return x.reshape(new_shape)


@kernel("transpose")
def transpose(x, *, perm):
    return np.transpose(x, perm)


@kernel("narrow")
def narrow(x, *, axis, start, len):
    s = start + x.shape[axis] if start < 0 else start
    return np.take(x, np.arange(s, s + len), axis=axis)


@kernel("slice")
def slice_(x, *, axis, start, len, step):
    return np.take(x, slice_indices("slice", x.shape[axis], start, len, step), axis=axis)


@kernel("concat")
def concat(*xs, axis):
    return np.concatenate(xs, axis=axis)


@kernel("expand")
def expand(x, *, target_shape):
    return np.broadcast_to(x, target_shape).copy()


@kernel("reverse")
def reverse(x, *, axes):
    return np.flip(x, axis=tuple(axes)) if axes else x.copy()


@kernel("tile")
def tile(x, *, reps):
    return np.tile(x, reps) if reps else x.copy()


@kernel("trilu")
def trilu(x, *, upper, diagonal):
    n, m = x.shape[-2:]
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    keep = (j - i >= diagonal) if upper else (j - i <= diagonal)
    return np.where(keep, x, np.zeros((), x.dtype))


@kernel("pad")
def pad(x, *, pads, mode, value):
    r = x.ndim
    width = [(pads[a], pads[a + r]) for a in range(r)]
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=np.asarray(value).astype(x.dtype))
    # numpy's names: reflect (edge not repeated), edge (replicate), wrap (circular)
    return np.pad(x, width, mode={"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


@kernel("gather")
def gather(x, indices, *, axis):
    _index_dtype("gather", indices)
    s = x.shape[axis]
    check_indices("gather", indices, s)
    return np.take(x, np.where(indices < 0, indices + s, indices).astype(np.int64), axis=axis)


@kernel("scatter_add")
def scatter_add(updates, indices, *, out_dim):
    _index_dtype("scatter_add", indices)
    check_indices("scatter_add", indices, out_dim, "out_dim")
    rows = np.where(indices < 0, indices + out_dim, indices).astype(np.int64)
    floating = np.issubdtype(updates.dtype, np.floating)
    acc = np.zeros((out_dim,) + updates.shape[1:], np.float64 if floating else updates.dtype)
    np.add.at(acc, rows, updates.astype(np.float64) if floating else updates)
    return acc.astype(updates.dtype)


@kernel("one_hot")
def one_hot(indices, values, *, depth, axis):
    _index_dtype("one_hot", indices)
    idx = np.where(indices < 0, indices.astype(np.int64) + depth, indices)
    hot = np.expand_dims(idx, -1) == np.arange(depth)  # out-of-range matches nothing
    out = np.where(hot, values[1], values[0])
    return np.moveaxis(out, -1, axis % (indices.ndim + 1))


@kernel("non_zero")
def non_zero(x):
    """Row-major coordinates of x != 0 (NaN != 0 holds; -0 == 0). A 0-d input has rank 0."""
    if x.ndim == 0:
        return np.zeros((0, int(x != 0)), np.int64)
    return np.stack(np.nonzero(x)).astype(np.int64).reshape(x.ndim, -1)

