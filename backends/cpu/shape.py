"""Reference kernels for shape and data movement. Layout ops are numpy indexing (they copy bits);
index-taking ops check every index on the host and raise SpecError for one out of range, as the
spec requires of every backend. scatter_add accumulates floats in float64 and rounds once."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import multilinear, unbroadcast
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
    if r == 0:  # pads () on a scalar: nothing to pad (np.pad refuses an empty width list)
        return x.copy()
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


# -- reference derivatives (float64) ---------------------------------------------------------------
# Every op here is linear in its data: the JVP applies the op's own data movement to the tangent,
# the VJP its transpose, written out separately (the adjoint test checks one against the other).
vjp = BACKEND.vjp
jvp = BACKEND.jvp


@vjp("reshape")
def reshape_vjp(inputs, attrs, cots):
    return [cots[0].reshape(inputs[0].shape)]


@jvp("reshape")
def reshape_jvp(inputs, attrs, tans):
    return [np.reshape(tans[0], attrs["new_shape"]) if attrs["new_shape"] else tans[0].reshape(())]


@vjp("transpose")
def transpose_vjp(inputs, attrs, cots):
    return [np.transpose(cots[0], np.argsort(attrs["perm"])) if attrs["perm"] else cots[0]]


@jvp("transpose")
def transpose_jvp(inputs, attrs, tans):
    return [np.transpose(tans[0], attrs["perm"]) if attrs["perm"] else tans[0]]


def _put_along(shape: tuple[int, ...], axis: int, positions: np.ndarray, u: np.ndarray) -> np.ndarray:
    """zeros(shape) with u added at ``positions`` along ``axis`` (repeats accumulate)."""
    g = np.zeros(shape)
    moved = np.moveaxis(g, axis, 0)
    np.add.at(moved, positions, np.moveaxis(u, axis, 0))
    return g


@vjp("narrow")
def narrow_vjp(inputs, attrs, cots):
    (x,) = inputs
    d = x.shape[attrs["axis"]]
    s = attrs["start"] + d if attrs["start"] < 0 else attrs["start"]
    return [_put_along(x.shape, attrs["axis"], np.arange(s, s + attrs["len"]), cots[0])]


@jvp("narrow")
def narrow_jvp(inputs, attrs, tans):
    return [narrow(tans[0], axis=attrs["axis"], start=attrs["start"], len=attrs["len"])]


@vjp("slice")
def slice_vjp(inputs, attrs, cots):
    (x,) = inputs
    a = attrs["axis"]
    idx = slice_indices("slice", x.shape[a], attrs["start"], attrs["len"], attrs["step"])
    return [_put_along(x.shape, a, idx, cots[0])]


@jvp("slice")
def slice_jvp(inputs, attrs, tans):
    return [slice_(tans[0], axis=attrs["axis"], start=attrs["start"], len=attrs["len"], step=attrs["step"])]


@vjp("concat")
def concat_vjp(inputs, attrs, cots):
    cuts = np.cumsum([x.shape[attrs["axis"]] for x in inputs])[:-1]
    return list(np.split(cots[0], cuts, axis=attrs["axis"]))


@jvp("concat")
def concat_jvp(inputs, attrs, tans):
    return [np.concatenate(tans, axis=attrs["axis"])]


@vjp("expand")
def expand_vjp(inputs, attrs, cots):
    return [unbroadcast(cots[0], inputs[0].shape)]


@jvp("expand")
def expand_jvp(inputs, attrs, tans):
    return [np.broadcast_to(tans[0], attrs["target_shape"]).copy()]


@vjp("reverse")
def reverse_vjp(inputs, attrs, cots):
    return [np.flip(cots[0], axis=tuple(attrs["axes"])) if attrs["axes"] else cots[0]]


@jvp("reverse")
def reverse_jvp(inputs, attrs, tans):
    return [reverse(tans[0], axes=attrs["axes"])]


@vjp("tile")
def tile_vjp(inputs, attrs, cots):
    """Each input element appears once per repetition: sum the copies ([r0, d0, r1, d1, ...])."""
    (x,) = inputs
    if not attrs["reps"]:
        return [cots[0]]
    split = [n for r, d in zip(attrs["reps"], x.shape) for n in (r, d)]
    return [cots[0].reshape(split).sum(axis=tuple(range(0, 2 * x.ndim, 2)))]


@jvp("tile")
def tile_jvp(inputs, attrs, tans):
    return [tile(tans[0], reps=attrs["reps"])]


def _trilu_keep(x: np.ndarray, upper: bool, diagonal: int) -> np.ndarray:
    n, m = x.shape[-2:]
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    return (j - i >= diagonal) if upper else (j - i <= diagonal)


@vjp("trilu")
def trilu_vjp(inputs, attrs, cots):
    return [np.where(_trilu_keep(inputs[0], attrs["upper"], attrs["diagonal"]), cots[0], 0.0)]


@jvp("trilu")
def trilu_jvp(inputs, attrs, tans):
    return [np.where(_trilu_keep(inputs[0], attrs["upper"], attrs["diagonal"]), tans[0], 0.0)]


def _pad_source(d: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each padded position along an axis of size d, the input position it copies (-1: the
    constant); reflect mirrors without repeating the edge, replicate repeats it, circular wraps."""
    p = np.arange(-before, d + after)
    if mode == "constant":
        return np.where((p >= 0) & (p < d), p, -1)
    if mode == "replicate":
        return np.clip(p, 0, d - 1)
    if mode == "circular":
        return p % d
    return np.where(p < 0, -p, np.where(p >= d, 2 * (d - 1) - p, p))  # reflect: pad < d


@vjp("pad", convention="the constant value is an attribute: padded constants pass no cotangent")
def pad_vjp(inputs, attrs, cots):
    """Each output position adds its cotangent to the input position it copies, axis by axis."""
    (x,) = inputs
    g = cots[0]
    r = x.ndim
    for a in range(r):
        src = _pad_source(x.shape[a], attrs["pads"][a], attrs["pads"][a + r], attrs["mode"])
        keep = src >= 0
        shape = g.shape[:a] + (x.shape[a],) + g.shape[a + 1:]
        g = _put_along(shape, a, src[keep], np.compress(keep, g, axis=a))
    return [g]


@jvp("pad")
def pad_jvp(inputs, attrs, tans):
    return [pad(tans[0], pads=attrs["pads"], mode=attrs["mode"], value=0.0)]


def _gather_positions(indices: np.ndarray, s: int) -> np.ndarray:
    return np.where(indices < 0, indices + s, indices).astype(np.int64)


@vjp("gather", convention="indices have no derivative; a repeated index accumulates every "
     "cotangent that reads it")
def gather_vjp(inputs, attrs, cots):
    x, indices = inputs
    a = attrs["axis"] % x.ndim
    pos = _gather_positions(indices, x.shape[a]).ravel()
    u = cots[0].reshape(x.shape[:a] + (pos.size,) + x.shape[a + 1:])
    return [_put_along(x.shape, a, pos, u), None]


@jvp("gather")
def gather_jvp(inputs, attrs, tans):
    return [gather(tans[0], inputs[1], axis=attrs["axis"])]


@vjp("scatter_add")
def scatter_add_vjp(inputs, attrs, cots):
    """Every update row reads the cotangent of the output row it adds into."""
    _, indices = inputs
    return [cots[0][_gather_positions(indices, attrs["out_dim"])], None]


@jvp("scatter_add")
def scatter_add_jvp(inputs, attrs, tans):
    _, indices = inputs
    rows = _gather_positions(indices, attrs["out_dim"])
    out = np.zeros((attrs["out_dim"],) + tans[0].shape[1:])
    np.add.at(out, rows, tans[0])
    return [out]


def _hot(indices: np.ndarray, depth: int, axis: int) -> np.ndarray:
    """The one_hot selection mask in the output layout (out-of-range indices select nothing)."""
    idx = np.where(indices < 0, indices.astype(np.int64) + depth, indices)
    return np.moveaxis(np.expand_dims(idx, -1) == np.arange(depth), -1, axis % (indices.ndim + 1))


@vjp("one_hot")
def one_hot_vjp(inputs, attrs, cots):
    indices, _ = inputs
    hot = _hot(indices, attrs["depth"], attrs["axis"])
    u = cots[0]
    return [None, np.array([np.sum(np.where(hot, 0.0, u)), np.sum(np.where(hot, u, 0.0))])]


@jvp("one_hot")
def one_hot_jvp(inputs, attrs, tans):
    indices, _ = inputs
    return [one_hot(indices, tans[1], depth=attrs["depth"], axis=attrs["axis"]).astype(np.float64)]


# Magnitudes: every op above moves or sums its data with coefficients 0 or 1 (_grad.multilinear:
# the rule on |seed| is exactly |J|-product, on ones it counts the summed seeds).
for _op in ("reshape", "transpose", "narrow", "slice", "concat", "expand", "reverse", "tile", "trilu",
            "pad", "gather", "scatter_add", "one_hot"):
    BACKEND.magnitude(_op)(multilinear(_op))
