"""MLX kernels for shape and data movement: MLX primitives where MLX has the op (reshape,
transpose, strided slicing, concatenate, broadcast_to, flip, tile, tril/triu, pad, take,
scatter-add through ``array.at``), compositions of them otherwise (circular pad, one_hot,
non_zero).

MLX does no bounds checking on indices (out of range is undefined behaviour, MLX-NOTES.md), so
index-taking kernels read the indices back and raise before the gather or scatter runs. Under
mx.compile values cannot be read while tracing: there the check has to happen on the host before
the call (see the registration notes).
"""
from __future__ import annotations

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError, UnsupportedError

kernel = BACKEND.kernel

_TRACING = "function transformations"  # MLX's message when a traced (compiled) array is read
_HOST_CHECK_NOTE = ("indices are checked on the host in eager and lazy modes; under mx.compile "
                    "they cannot be read while tracing, so compiled mode relies on a host-side "
                    "check before the call (MLX itself does no bounds checking)")


def read_flag(flag: mx.array) -> bool | None:
    """The value of a boolean scalar, or None while mx.compile traces (values unreadable)."""
    try:
        return bool(flag.item())
    except ValueError as e:
        if _TRACING in str(e):
            return None
        raise


def check_indices(op: str, idx: mx.array, size: int, what: str = "axis") -> None:
    if idx.dtype not in (mx.int32, mx.int64):
        raise SpecError(f"{op}: indices must be int32 or int64, got {idx.dtype}")
    if idx.size and read_flag(mx.any((idx < -size) | (idx >= size))):
        raise SpecError(f"{op}: an index is out of range for {what} of size {size}")


def _wrap(idx: mx.array, size: int) -> mx.array:
    """Negative indices count from the end (ONNX)."""
    return mx.where(idx < 0, idx + size, idx)


def _along(ndim: int, axis: int, s: slice) -> tuple:
    return (slice(None),) * (axis % ndim) + (s,)


@kernel("reshape")
def reshape(x, *, new_shape):
    return mx.reshape(x, list(new_shape))


@kernel("transpose")
def transpose(x, *, perm):
    return mx.transpose(x, list(perm))


@kernel("narrow")
def narrow(x, *, axis, start, len):
    s = start + x.shape[axis] if start < 0 else start
    return x[_along(x.ndim, axis, slice(s, s + len))]


@kernel("slice")
def slice_(x, *, axis, start, len, step):
    """A strided slice; the stop of a backward walk past index 0 is spelled None, not -1."""
    d = x.shape[axis]
    s = start + d if start < 0 else start
    stop = s + step * len
    return x[_along(x.ndim, axis, slice(s, stop if stop >= 0 else None, step))]


@kernel("concat")
def concat(*xs, axis):
    return mx.concatenate(list(xs), axis=axis)


@kernel("expand")
def expand(x, *, target_shape):
    return mx.broadcast_to(x, list(target_shape))


@kernel("reverse")
def reverse(x, *, axes):
    return mx.flip(x, axis=list(axes)) if axes else x


@kernel("tile")
def tile(x, *, reps):
    return mx.tile(x, list(reps)) if reps else x


@kernel("trilu")
def trilu(x, *, upper, diagonal):
    return mx.triu(x, diagonal) if upper else mx.tril(x, diagonal)


def _circular(x, axis: int, before: int, after: int):
    """Wrap-around padding of one axis: the last ``before`` elements, x, the first ``after``."""
    n = x.shape[axis]
    parts = [x[_along(x.ndim, axis, slice(n - before, n))]] if before else []
    parts.append(x)
    if after:
        parts.append(x[_along(x.ndim, axis, slice(0, after))])
    return mx.concatenate(parts, axis=axis) if len(parts) > 1 else x


@kernel("pad")
def pad(x, *, pads, mode, value):
    r = x.ndim
    width = [(pads[a], pads[a + r]) for a in range(r)]
    if mode == "constant":
        return mx.pad(x, width, mode="constant", constant_values=mx.array(value, dtype=x.dtype))
    if mode in ("reflect", "replicate"):
        return mx.pad(x, width, mode="reflect" if mode == "reflect" else "edge")
    for a, (b, e) in enumerate(width):  # circular: MLX's pad has no wrap mode
        x = _circular(x, a, b, e)
    return x


@kernel("gather", note="mx.take after " + _HOST_CHECK_NOTE)
def gather(x, indices, *, axis):
    s = x.shape[axis]
    check_indices("gather", indices, s)
    return mx.take(x, _wrap(indices, s), axis=axis)


@kernel("scatter_add", devices={"gpu": tuple(d for d in dt.NUMERIC if d != "int64")},
        note="array.at[rows].add after " + _HOST_CHECK_NOTE + "; int64 is not claimed on the "
        "GPU: MLX's GPU scatter raises 'does not yet support int64'")
def scatter_add(updates, indices, *, out_dim):
    check_indices("scatter_add", indices, out_dim, "out_dim")
    out = mx.zeros((out_dim,) + tuple(updates.shape[1:]), dtype=updates.dtype)
    if not updates.shape[0]:
        return out
    return out.at[_wrap(indices, out_dim)].add(updates)


@kernel("one_hot", note="composed: where(expand_dims(index) == arange(depth), on, off)")
def one_hot(indices, values, *, depth, axis):
    if indices.dtype not in (mx.int32, mx.int64):
        raise SpecError(f"one_hot: indices must be int32 or int64, got {indices.dtype}")
    idx = _wrap(indices.astype(mx.int64), depth)
    hot = mx.expand_dims(idx, -1) == mx.arange(depth, dtype=mx.int64)
    out = mx.where(hot, values[1], values[0])
    return mx.moveaxis(out, -1, axis % (indices.ndim + 1))


@kernel("non_zero", note="MLX has no nonzero: composed (count read back to the host, a stable "
        "sort of the flat positions, unravelled); its output shape depends on the values, which "
        "mx.compile cannot trace, so compiled mode is unsupported (a host delegate could run it)")
def non_zero(x):
    flat = (x != 0).reshape(-1) if x.ndim else (x != 0).reshape(1)
    count = _read_count(flat)
    if x.ndim == 0:
        return mx.zeros((0, count), dtype=mx.int64)
    n = flat.size
    pos = mx.arange(n, dtype=mx.int64)
    # nonzero positions keep their rank, zeros go after all of them; ascending = row-major
    first = mx.sort(mx.where(flat, pos, pos + n))[:count]
    coords = []
    for d in reversed(x.shape):
        coords.append(first % d)
        first = first // d
    return mx.stack(coords[::-1]).astype(mx.int64)


def _read_count(flat: mx.array) -> int:
    try:
        return int(mx.sum(flat.astype(mx.int64)).item())
    except ValueError as e:
        if _TRACING in str(e):
            raise UnsupportedError("mlx non_zero: the output shape depends on the values, which "
                                   "mx.compile cannot trace (eager and lazy modes run it)") from None
        raise

