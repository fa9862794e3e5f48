"""MLX kernels for convolution and pooling, native mlx.core. MLX convolves channels-last
(x [N, *sp, C], w [Cout, *k, Cin/groups]), so NCHW is transposed in and out. conv uses
mx.conv_general (asymmetric padding, dilation, groups); conv_transpose2d uses
mx.conv_transpose2d (weight regrouped to [Cout, kH, kW, Cin/groups]); MLX has no pooling op in
mlx.core, so pool is a strided window view (mx.as_strided over the padded input) reduced with
max or sum.

The attributes are read here, by this backend's own code (:func:`_per_dim`, :func:`_padding`),
as RLX's MLX lowering hands them to MLX: one value per spatial dim (a single value repeated, ()
the default), conv/pool padding as (begins, ends), and output sizes left to MLX (conv) or
worked out from the padded extent (pool). None of the geometry of the CPU reference and its
bounds (judge/bounds/conv.py) is imported: a mistake in either reading then shows as a
disagreement instead of agreeing with itself. Shapes and attributes are validated before a
kernel runs (the harness's shape inference), so nothing is re-checked here beyond what MLX
rejects itself.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND

kernel = BACKEND.kernel


def _per_dim(values: Sequence[int], nd: int, default: int) -> list[int]:
    """One value per spatial dim: () is ``default`` everywhere, a single value applies to every
    dim, otherwise the values are taken as given (one per dim)."""
    if len(values) == 0:
        return [default] * nd
    if len(values) == 1:
        return [int(values[0])] * nd
    if len(values) != nd:
        raise ValueError(f"expected 1 or {nd} values, got {tuple(values)}")
    return [int(v) for v in values]


def _padding(values: Sequence[int], nd: int) -> tuple[list[int], list[int]]:
    """(low, high) padding per spatial dim: 2*nd values are all the begins then all the ends
    (for a 1-D conv, two values are its begin and end), anything else is symmetric (read as
    :func:`_per_dim` with default 0)."""
    if len(values) == 2 * nd:
        return [int(v) for v in values[:nd]], [int(v) for v in values[nd:]]
    sym = _per_dim(values, nd, 0)
    return sym, list(sym)


def _to_last(x):
    return mx.moveaxis(x, 1, -1)


def _to_first(y):
    return mx.moveaxis(y, -1, 1)


@kernel("conv")
def conv(x, w, bias, *, kernel_size, stride, padding, dilation, groups):
    nd = x.ndim - 2
    lo, hi = _padding(padding, nd)
    y = mx.conv_general(_to_last(x), _to_last(w), stride=_per_dim(stride, nd, 1), padding=(lo, hi),
                        kernel_dilation=_per_dim(dilation, nd, 1), groups=groups)
    if bias.size:
        y = y + bias
    return _to_first(y)


@kernel("conv_transpose2d")
def conv_transpose2d(x, w, bias, *, stride, padding, output_padding, dilation, groups):
    """The weight [Cin, Cout/g, kH, kW] becomes MLX's [Cout, kH, kW, Cin/g]: group-major output
    channels, each seeing its group's Cin/g input channels."""
    cin, og, kh, kw = w.shape
    wm = w.reshape(groups, cin // groups, og, kh, kw).transpose(0, 2, 3, 4, 1)
    wm = wm.reshape(groups * og, kh, kw, cin // groups)
    y = mx.conv_transpose2d(_to_last(x), wm, stride=tuple(_per_dim(stride, 2, 1)),
                            padding=tuple(_per_dim(padding, 2, 0)),
                            dilation=tuple(_per_dim(dilation, 2, 1)),
                            output_padding=tuple(_per_dim(output_padding, 2, 0)), groups=groups)
    if bias.size:
        y = y + bias
    return _to_first(y)


@kernel("pool")
def pool(x, *, kind, kernel_size, stride, padding):
    """Padding is -inf for a max (it never wins) and 0 for a sum, whose divisor counts only the
    window's real elements (a padded map of ones, windowed the same way)."""
    k = [int(v) for v in kernel_size]
    nd = len(k)
    st = [s or kk for s, kk in zip(_per_dim(stride, nd, 0), k)]  # () = the window size
    lo, hi = _padding(padding, nd)
    out = [(x.shape[2 + i] + lo[i] + hi[i] - k[i]) // st[i] + 1 for i in range(nd)]
    axes = tuple(range(-nd, 0))
    pads = [(0, 0), (0, 0)] + list(zip(lo, hi))
    win = _windows(mx.pad(x, pads, constant_values=-mx.inf if kind == "max" else 0.0), out, k, st)
    if kind == "max":
        return mx.max(win, axis=axes)
    count = _windows(mx.pad(mx.ones((1, 1) + tuple(x.shape[2:]), dtype=x.dtype), pads), out, k, st)
    return mx.sum(win, axis=axes) / mx.sum(count, axis=axes)


def _windows(xp, out, k, st):
    """[N, C, *padded] -> [N, C, *out, *k] window view (as_strided makes its input contiguous)."""
    shape = tuple(xp.shape)
    elem = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    nd = len(k)
    return mx.as_strided(xp, tuple(shape[:2]) + tuple(out) + tuple(k),
                         tuple(elem[:2]) + tuple(elem[2 + i] * st[i] for i in range(nd)) + tuple(elem[2:]))
