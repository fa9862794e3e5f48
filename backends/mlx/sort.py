"""MLX kernels for sort, arg_sort and top_k. mx.sort/mx.argsort sort ascending with NaN last;
MLX has no descending sort, and reversing an ascending sort would reverse the order of ties, so a
stable descending order is built as the mirror of the ascending argsort of the flipped array.
mx.topk returns values only, unordered and without a tie rule, so top_k takes the first k of the
descending order."""
from __future__ import annotations

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND

kernel = BACKEND.kernel


def stable_order(x: mx.array, axis: int, descending: bool) -> mx.array:
    """The sorting permutation, behind mx.stop_gradient: integer indices carry no derivative, and
    MLX's autodiff refuses to differentiate a take_along_axis through indices computed from the
    differentiated input ("Cannot calculate VJP with respect to indices")."""
    if not descending:
        return mx.stop_gradient(mx.argsort(x, axis=axis).astype(mx.int64))
    n = x.shape[axis]
    rev = mx.argsort(mx.flip(x, axis=axis), axis=axis).astype(mx.int64)
    return mx.stop_gradient((n - 1) - mx.flip(rev, axis=axis))


@kernel("sort", note="ascending: mx.sort; descending: take_along_axis of the mirrored stable order")
def sort(x, *, axis, descending):
    if not descending:
        return mx.sort(x, axis=axis)
    return mx.take_along_axis(x, stable_order(x, axis, True), axis=axis)


@kernel("arg_sort", note="mx.argsort (descending: mirrored argsort of the flipped array)")
def arg_sort(x, *, axis, descending):
    return stable_order(x, axis, descending)


@kernel("top_k", note="first k of the stable descending order (mx.topk has no indices)")
def top_k(x, *, k):
    idx = stable_order(x, -1, True)[..., :k]
    return mx.take_along_axis(x, idx, axis=-1), idx
