"""The CUDA kernels of the custom ops as a contributor would register them.

``rlx-conformance validate OP --kernel rlx_conformance.backends.mlx.cuda_validate:NAME --device gpu --mode M``
validates them against the reference (with RLX_MLX_CUDA_KERNELS=0 in the environment the
built-in kernel it is timed against is the composed one). Each is custom.py's kernel with the
CUDA path forced (cuda_kernels.forced): the same empty-input handling, and an error where there
is no CUDA GPU. Kept apart from cuda_kernels.py, which custom.py imports, so that neither of
those two imports the other both ways.
"""
from __future__ import annotations

import functools

import mlx.core as mx

from rlx_conformance.backends.mlx import cuda_kernels, custom
from rlx_conformance.core.errors import UnsupportedError


def _force_cuda(op: str):
    def wrap(fn):
        @functools.wraps(fn)
        def forced(*args, **attrs):
            if not (cuda_kernels.available() and mx.default_device().type == mx.gpu):
                raise UnsupportedError(f"{op}: the CUDA kernel needs MLX's CUDA build and device gpu")
            with cuda_kernels.forced():
                return fn(*args, **attrs)
        forced.__name__ = f"cuda_{fn.__name__}"
        return forced
    return wrap


def scatter_elements_kernel(data, indices, updates, *, axis, reduction):
    return _force_cuda("onnx.ScatterElements")(custom.scatter_elements)(
        data, indices, updates, axis=axis, reduction=reduction)


def gather_elements_kernel(data, indices, *, axis):
    return _force_cuda("onnx.GatherElements")(custom.gather_elements)(data, indices, axis=axis)


def gather_nd_kernel(data, indices, *, batch_dims):
    return _force_cuda("onnx.GatherND")(custom.gather_nd)(data, indices, batch_dims=batch_dims)


def scatter_nd_kernel(data, indices, updates, *, reduction):
    return _force_cuda("onnx.ScatterND")(custom.scatter_nd)(data, indices, updates, reduction=reduction)


def mat_vec_kernel(values, col_idx, row_ptr, x):
    return _force_cuda("rlx_sparse.mat_vec")(custom.mat_vec)(values, col_idx, row_ptr, x)


def values_grad_kernel(col_idx, row_ptr, u, v):
    return _force_cuda("rlx_sparse.values_grad")(custom.values_grad)(col_idx, row_ptr, u, v)


def cg_solve_kernel(values, col_idx, row_ptr, b, *, max_iter, tol):
    return _force_cuda("rlx_sparse.cg_solve")(custom.cg_solve)(
        values, col_idx, row_ptr, b, max_iter=max_iter, tol=tol)


VALIDATE = {  # op -> the entry point above, for `validate`
    "onnx.ScatterElements": "scatter_elements_kernel", "onnx.GatherElements": "gather_elements_kernel",
    "onnx.GatherND": "gather_nd_kernel", "onnx.ScatterND": "scatter_nd_kernel",
    "rlx_sparse.mat_vec": "mat_vec_kernel", "rlx_sparse.values_grad": "values_grad_kernel",
    "rlx_sparse.cg_solve": "cg_solve_kernel",
}
