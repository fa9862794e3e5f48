"""Reference kernels for convolution and pooling: im2col + matmul (conv), the scatter
definition (conv_transpose2d) and window reductions (pool), in float64 (long double for float64
operands), rounded once."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.judge.bounds.conv import (
    conv_as_matmul,
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
