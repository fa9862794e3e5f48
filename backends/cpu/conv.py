"""Reference kernels for convolution and pooling: im2col + matmul (conv), the scatter
definition (conv_transpose2d) and window reductions (pool), in float64 (long double for float64
operands), rounded once."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import multilinear, selection, selection_radius
from rlx_conformance.judge.bounds.conv import (
    conv_as_matmul,
    conv_params,
    conv_transpose_reference,
    im2col,
    pool_params,
)

kernel = BACKEND.kernel

# The attribute geometry (conv_params, pool_params), im2col and the conv_transpose scatter form
# live in judge/bounds/conv.py, which evaluates the same windows for its error bounds. The MLX
# kernels read the attributes on their own (backends/mlx/conv.py); this reference is checked
# against onnx.reference over the whole matrix (tests/test_independent_oracles.py).


def conv_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, attrs) -> np.ndarray:
    cols, wm, shape = conv_as_matmul(x, w, attrs)
    y = np.matmul(cols, wm)  # [N, g, P, Cout/g]
    y = y.transpose(0, 1, 3, 2).reshape(shape)
    if bias.size:
        y = y + bias.reshape((1, -1) + (1,) * (len(shape) - 2))
    return y


def pool_reference(x: np.ndarray, attrs) -> np.ndarray:
    """Max: NaN-propagating max over the window (padding never wins); avg: sum over the window's
    non-padding elements divided by their count (ONNX count_include_pad = 0)."""
    nd, k, stride, pb, pe, out = pool_params("pool", x.shape, attrs)
    axes = tuple(range(-nd, 0))
    one = (1,) * nd
    if attrs["kind"] == "max":
        cols = im2col(x, k, stride, pb, pe, one, fill=-np.inf)
        return np.max(cols, axis=axes)
    cols = im2col(x, k, stride, pb, pe, one)
    count = im2col(np.ones((1, 1) + x.shape[2:]), k, stride, pb, pe, one).sum(axis=axes)
    return np.sum(cols, axis=axes) / count


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.longdouble if x.dtype == np.float64 else np.float64)


@kernel("conv")
def conv(x, w, bias, *, kernel_size, stride, padding, dilation, groups):
    attrs = dict(kernel_size=kernel_size, stride=stride, padding=padding, dilation=dilation, groups=groups)
    return conv_reference(_wide(x), _wide(w), _wide(bias), attrs).astype(x.dtype)


@kernel("conv_transpose2d")
def conv_transpose2d(x, w, bias, *, stride, padding, output_padding, dilation, groups):
    attrs = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation,
                 groups=groups)
    return conv_transpose_reference(_wide(x), _wide(w), _wide(bias), attrs).astype(x.dtype)


@kernel("pool")
def pool(x, *, kind, kernel_size, stride, padding):
    attrs = dict(kind=kind, kernel_size=kernel_size, stride=stride, padding=padding)
    return pool_reference(_wide(x), attrs).astype(x.dtype)


# -- reference derivatives (float64) ---------------------------------------------------------------
vjp = BACKEND.vjp
jvp = BACKEND.jvp


def col2im(cols: np.ndarray, x_shape, ksize, stride, pb, pe, dil, combine=np.add) -> np.ndarray:
    """The transpose of im2col: windows [N, C, *out, *kernel] accumulated (``combine``: add, or
    minimum for a smoothness radius) into the positions they read, padding dropped."""
    nd = len(ksize)
    padded = tuple(s + b + e for s, b, e in zip(x_shape[2:], pb, pe))
    fill = 0.0 if combine is np.add else np.inf
    acc = np.full(tuple(x_shape[:2]) + padded, fill)
    out = cols.shape[2:2 + nd]
    for taps in np.ndindex(*ksize):
        sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(taps, dil, stride, out))
        region = (slice(None), slice(None)) + sl
        acc[region] = combine(acc[region], cols[(Ellipsis,) + taps])
    crop = (slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(pb, x_shape[2:]))
    return acc[crop]


@vjp("conv")
def conv_vjp(inputs, attrs, cots):
    """y = cols @ wm (+ bias): dcols = U wmᵀ folded back by col2im, dw = colsᵀ U, dbias = sum U."""
    x, w, bias = inputs
    _, stride, pb, pe, dil, g, cout, out = conv_params("conv", x.shape, w.shape, attrs)
    cols, wm, _ = conv_as_matmul(x, w, attrs)  # [N, g, P, K], [g, K, Cout/g]
    n, c = x.shape[:2]
    p, kk = math.prod(out), math.prod(w.shape[2:])
    u = cots[0].reshape(n, g, cout // g, p).transpose(0, 1, 3, 2)  # [N, g, P, Cout/g]
    dcols = u @ np.swapaxes(wm, -1, -2)  # [N, g, P, K]
    dcols = dcols.reshape(n, g, p, c // g, kk).transpose(0, 1, 3, 2, 4).reshape((n, c) + tuple(out) + w.shape[2:])
    dx = col2im(dcols, x.shape, w.shape[2:], stride, pb, pe, dil)
    dwm = np.sum(np.swapaxes(cols, -1, -2) @ u, axis=0)  # [g, K, Cout/g]
    dw = dwm.transpose(0, 2, 1).reshape(w.shape)
    db = np.sum(cots[0], axis=(0,) + tuple(range(2, cots[0].ndim))) if bias.size else np.zeros(bias.shape)
    return [dx, dw, db]


@jvp("conv")
def conv_jvp(inputs, attrs, tans):
    """Bilinear: conv(tx, w) + conv(x, tw) + tbias."""
    x, w, bias = inputs
    tx, tw, tb = tans
    none = np.zeros(0)
    y = conv_reference(tx, w, none, attrs) + conv_reference(x, tw, none, attrs)
    return [y + tb.reshape((1, -1) + (1,) * (y.ndim - 2)) if bias.size else y]


@vjp("conv_transpose2d")
def conv_transpose_vjp(inputs, attrs, cots):
    """The scatter form's transpose: each input position o reads back the cotangent of the
    outputs o*stride - pad + tap*dilation it wrote, for every tap."""
    x, w, bias = inputs
    _, stride, pb, _, dil, g, cout, out = conv_params("conv_transpose2d", x.shape, w.shape, attrs,
                                                      transposed=True)
    n, cin, h, wd = x.shape
    cg, og = cin // g, cout // g
    kh, kw = w.shape[2:]
    full = ((h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + out[0] + pb[0],
            (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + out[1] + pb[1])
    dacc = np.zeros((n, cout) + full)
    dacc[:, :, pb[0]:pb[0] + out[0], pb[1]:pb[1] + out[1]] = cots[0]
    xg = x.reshape(n, g, cg, h, wd)
    wg = w.reshape(g, cg, og, kh, kw)
    dx = np.zeros(xg.shape)
    dw = np.zeros(wg.shape)
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dil[0], j * dil[1]
            gy = dacc[:, :, r0:r0 + stride[0] * (h - 1) + 1:stride[0],
                      c0:c0 + stride[1] * (wd - 1) + 1:stride[1]].reshape(n, g, og, h, wd)
            dx += np.einsum("ngohw,gco->ngchw", gy, wg[:, :, :, i, j])
            dw[:, :, :, i, j] = np.einsum("ngchw,ngohw->gco", xg, gy)
    db = np.sum(cots[0], axis=(0, 2, 3)) if bias.size else np.zeros(bias.shape)
    return [dx.reshape(x.shape), dw.reshape(w.shape), db]


@jvp("conv_transpose2d")
def conv_transpose_jvp(inputs, attrs, tans):
    x, w, bias = inputs
    tx, tw, tb = tans
    none = np.zeros(0)
    y = conv_transpose_reference(tx, w, none, attrs) + conv_transpose_reference(x, tw, none, attrs)
    return [y + tb.reshape(1, -1, 1, 1) if bias.size else y]


def _pool_windows(x: np.ndarray, attrs, fill: float):
    nd, k, stride, pb, pe, _ = pool_params("pool", x.shape, attrs)
    return im2col(x, k, stride, pb, pe, (1,) * nd, fill=fill), (k, stride, pb, pe, (1,) * nd), nd


def _first_max(cols: np.ndarray, nd: int) -> np.ndarray:
    """One-hot [.., *kernel] of the first maximal tap of each window (row-major window order)."""
    flat = cols.reshape(cols.shape[: cols.ndim - nd] + (-1,))
    hot = np.zeros(flat.shape)
    np.put_along_axis(hot, np.argmax(flat, axis=-1)[..., None], 1.0, axis=-1)
    return hot.reshape(cols.shape)


def _pool_radius(inputs, attrs):
    """max: per window, 0 for taps tied at the max, half the gap to the runner-up otherwise;
    an element's radius is its smallest over the windows that read it. avg: linear (None)."""
    (x,) = inputs
    if attrs["kind"] != "max":
        return [None]
    cols, geo, nd = _pool_windows(x, attrs, -np.inf)
    flat = cols.reshape(cols.shape[: cols.ndim - nd] + (-1,))
    r = selection_radius(flat).reshape(cols.shape)
    return [col2im(r, x.shape, *geo, combine=np.minimum)]


@vjp("pool", convention="max: a window's cotangent goes to its first maximal element in row-major "
     "window order (PyTorch and JAX route to one argmax); padding never wins", radius=_pool_radius)
def pool_vjp(inputs, attrs, cots):
    """max: the cotangent to each window's argmax; avg: u / count spread over the window's
    non-padding elements. Overlapping windows accumulate."""
    (x,) = inputs
    cols, geo, nd = _pool_windows(x, attrs, -np.inf if attrs["kind"] == "max" else 0.0)
    u = cots[0].reshape(cots[0].shape + (1,) * nd)
    if attrs["kind"] == "max":
        return [col2im(_first_max(cols, nd) * u, x.shape, *geo)]
    ones, _, _ = _pool_windows(np.ones((1, 1) + x.shape[2:]), attrs, 0.0)
    count = ones.sum(axis=tuple(range(-nd, 0)), keepdims=True)
    return [col2im(ones * u / count, x.shape, *geo)]


@jvp("pool")
def pool_jvp(inputs, attrs, tans):
    (x,) = inputs
    if attrs["kind"] == "avg":
        return [pool_reference(tans[0], attrs)]  # linear
    cols, _, nd = _pool_windows(x, attrs, -np.inf)
    tcols, _, _ = _pool_windows(tans[0], attrs, 0.0)
    return [np.sum(_first_max(cols, nd) * tcols, axis=tuple(range(-nd, 0)))]


# Magnitudes: conv and conv_transpose2d are bilinear in (x, w) plus the bias (_grad.multilinear);
# average pooling is linear with coefficients 1/count, max pooling selects one tap per window
# (_grad.selection; the rule on ones counts the windows an element wins).
for _op in ("conv", "conv_transpose2d"):
    BACKEND.magnitude(_op)(multilinear(_op))
_pool_avg = multilinear("pool", lambda xs, attrs, kind: math.prod(pool_params("pool", xs[0].shape, attrs)[1]))
_pool_max = selection("pool")


@BACKEND.magnitude("pool")
def pool_magnitude(inputs, attrs, kind, seeds):
    return (_pool_max if attrs["kind"] == "max" else _pool_avg)(inputs, attrs, kind, seeds)
