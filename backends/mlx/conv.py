"""MLX kernels for convolution and pooling, native mlx.core. MLX convolves channels-last
(x [N, *sp, C], w [Cout, *k, Cin/groups]), so NCHW is transposed in and out. conv uses
mx.conv_general (asymmetric padding, dilation, groups); conv_transpose2d uses
mx.conv_transpose2d (weight regrouped to [Cout, kH, kW, Cin/groups]); MLX has no pooling op in
mlx.core, so pool is a strided window view (mx.as_strided over the padded input) reduced with
max or sum."""
from __future__ import annotations

import math

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND
from rlx_conformance.judge.bounds.conv import conv_params, pool_params

kernel = BACKEND.kernel


def _to_last(x):
    return mx.moveaxis(x, 1, -1)


def _to_first(y):
    return mx.moveaxis(y, -1, 1)


@kernel("conv")
def conv(x, w, bias, *, kernel_size, stride, padding, dilation, groups):
    attrs = dict(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, groups=groups)
    nd, st, pb, pe, dil, g, cout, out = conv_params("conv", x.shape, w.shape, attrs)
    y = mx.conv_general(_to_last(x), _to_last(w), stride=list(st), padding=(list(pb), list(pe)),
                        kernel_dilation=list(dil), groups=g)
    if bias.size:
        y = y + bias
    return _to_first(y)


@kernel("conv_transpose2d")
def conv_transpose2d(x, w, bias, *, stride, padding, output_padding, dilation, groups):
    attrs = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation,
                 groups=groups)
    nd, st, pb, pe, dil, g, cout, out = conv_params("conv_transpose2d", x.shape, w.shape, attrs,
                                                    transposed=True)
    cin, og, kh, kw = w.shape
    wm = w.reshape(g, cin // g, og, kh, kw).transpose(0, 2, 3, 4, 1).reshape(g * og, kh, kw, cin // g)
    op = tuple(output_padding) * 2 if len(output_padding) == 1 else (tuple(output_padding) or (0, 0))
    y = mx.conv_transpose2d(_to_last(x), wm, stride=tuple(st), padding=tuple(pb), dilation=tuple(dil),
                            output_padding=op, groups=g)
    if bias.size:
        y = y + bias
    return _to_first(y)


@kernel("pool")
def pool(x, *, kind, kernel_size, stride, padding):
    attrs = dict(kind=kind, kernel_size=kernel_size, stride=stride, padding=padding)
    nd, k, st, pb, pe, out = pool_params("pool", x.shape, attrs)
    axes = tuple(range(-nd, 0))
    pads = [(0, 0), (0, 0)] + list(zip(pb, pe))
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
