"""Reference kernels for convolution and pooling: im2col + matmul (conv), the scatter
definition (conv_transpose2d) and window reductions (pool), in float64 (long double for float64
operands), rounded once."""
from __future__ import annotations

import numpy as np
from rlx_conformance.backends.cpu import BACKEND

from rlx_conformance.ops.conv import (
    conv_reference,
    conv_transpose_reference,
    pool_reference,
)

kernel = BACKEND.kernel


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
