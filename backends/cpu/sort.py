"""Reference kernels for sort, arg_sort and top_k: numpy's stable sort. numpy orders NaN last and
treats -0 == +0; a stable descending order is the mirror of the stable ascending order of the
reversed array (ties then keep their input order, NaN comes first)."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import selection, sorted_gap_radius

kernel = BACKEND.kernel


def stable_order(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """int64 indices that stably sort x along axis (NaN last ascending, first descending)."""
    if x.dtype.kind == "V" or x.dtype.itemsize == 2 and x.dtype.kind != "i" and x.dtype.kind != "u":
        x = x.astype(np.float32)  # float16/bfloat16: exact in float32, same order, numpy's NaN rule
    if not descending:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int64)
    n = x.shape[axis]
    rev = np.argsort(np.flip(x, axis), axis=axis, kind="stable")
    return (n - 1 - np.flip(rev, axis)).astype(np.int64)


@kernel("sort")
def sort(x, *, axis, descending):
    return np.take_along_axis(x, stable_order(x, axis, descending), axis=axis)


@kernel("arg_sort")
def arg_sort(x, *, axis, descending):
    return stable_order(x, axis, descending)


@kernel("top_k")
def top_k(x, *, k):
    idx = stable_order(x, -1, True)[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx


# -- reference derivatives (float64) ---------------------------------------------------------------
# Sorting moves values: the JVP moves the tangent the same way, the VJP sends each cotangent back
# to the position its value came from. At ties the permutation is the stable order's (as
# PyTorch's sort backward, which routes through the returned indices).
vjp = BACKEND.vjp
jvp = BACKEND.jvp
_TIES = "ties follow the stable order (equal keys keep their input order), as the indices do"


def _scatter_back(shape, order: np.ndarray, u: np.ndarray, axis: int) -> np.ndarray:
    """zeros(shape) with u[..., j] placed at order[..., j] along ``axis``."""
    g = np.zeros(shape)
    np.put_along_axis(g, order, u, axis=axis)
    return g


@vjp("sort", convention=_TIES, radius=lambda xs, attrs: [sorted_gap_radius(xs[0], attrs["axis"])])
def sort_vjp(inputs, attrs, cots):
    (x,) = inputs
    order = stable_order(x, attrs["axis"], attrs["descending"])
    return [_scatter_back(x.shape, order, cots[0], attrs["axis"])]


@jvp("sort")
def sort_jvp(inputs, attrs, tans):
    (x,) = inputs
    order = stable_order(x, attrs["axis"], attrs["descending"])
    return [np.take_along_axis(tans[0], order, axis=attrs["axis"])]


@vjp("top_k", convention=_TIES + "; the indices output has no derivative",
     radius=lambda xs, attrs: [sorted_gap_radius(xs[0], -1)])
def top_k_vjp(inputs, attrs, cots):
    (x,) = inputs
    idx = stable_order(x, -1, True)[..., : attrs["k"]]
    return [_scatter_back(x.shape, idx, cots[0], -1)]


@jvp("top_k")
def top_k_jvp(inputs, attrs, tans):
    (x,) = inputs
    idx = stable_order(x, -1, True)[..., : attrs["k"]]
    return [np.take_along_axis(tans[0], idx, axis=-1), None]


# Magnitudes: a permutation (sort) or a selection of one (top_k) has 0/1 entries (_grad.selection).
for _op in ("sort", "top_k"):
    BACKEND.magnitude(_op)(selection(_op))
