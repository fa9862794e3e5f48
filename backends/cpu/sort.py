"""Reference kernels for sort, arg_sort and top_k: numpy's stable sort. numpy orders NaN last and
treats -0 == +0; a stable descending order is the mirror of the stable ascending order of the
reversed array (ties then keep their input order, NaN comes first)."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND

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
