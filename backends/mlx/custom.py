"""Native MLX kernels of the custom ops, composed from mlx.core: no host round-trip, so the whole
op stays in MLX's lazy graph (and under mx.compile in compiled mode).

Safety: MLX does not bounds-check indices (out of range is undefined behaviour: a segfault or
a corrupted heap). Backend.run validates index values and CSR structure on the host before any
MLX call (OpSpec.check_values, the same SpecError as the CPU reference); the kernels also clamp
indices into range inside the graph, so that a caller that bypasses Backend.run (a benchmark
calling a kernel directly) can at worst get a wrong value, never touch memory outside an array.

Scatter reductions use ``array.at[...]`` (MLX scatter_add/prod/max/min: every duplicate is
applied; on GPUs through atomics, in no fixed order). Sparse solves: lu_solve assembles A
densely and uses mx.linalg.solve on the CPU stream (MLX linalg has no GPU kernels; registered
with cpu_stream=True), so it is O(n^2) memory; cg_solve runs CG with a convergence mask, in
eager and lazy mode stopping early once every lane converged.

On a CUDA GPU stream the scatters, gathers, mat_vec, values_grad and CG's products run native
CUDA kernels instead (``cuda_kernels.py``: deterministic, no atomics); the compositions here
are the fallback on every other build, and on CUDA with RLX_MLX_CUDA_KERNELS=0. A scatter with
no updates returns ``data`` without calling MLX's scatter (MLX 0.32.4's GPU scatter dies with
SIGFPE in compiled mode on zero updates).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from rlx_conformance.backends.mlx import BACKEND
from rlx_conformance.backends.mlx import cuda_kernels as _cuda
from rlx_conformance.core.errors import SpecError

kernel = BACKEND.kernel

_TRACING = "function transformations"  # MLX's message when a traced array is read


def tracing(e: Exception) -> bool:
    """Is this MLX's refusal to evaluate inside mx.compile (values are unknown while tracing)?"""
    return isinstance(e, ValueError) and _TRACING in str(e)


def safe_index(idx: mx.array, size: int) -> mx.array:
    """Negative indices counted from the end, then clamped into [0, size-1] (a no-op for
    validated input; memory safety for a caller that bypasses Backend.run)."""
    idx = mx.where(idx < 0, idx + size, idx)
    return mx.clip(idx, 0, max(size - 1, 0))


def _axis_coords(indices: mx.array, ax: int, size: int) -> tuple[mx.array, ...]:
    """Full coordinates of each index position: its own position, the axis coord replaced."""
    shape = indices.shape
    out = []
    for d, n in enumerate(shape):
        if d == ax:
            out.append(safe_index(indices, size))
        else:
            r = mx.arange(n).reshape([n if i == d else 1 for i in range(len(shape))])
            out.append(mx.broadcast_to(r, shape))
    return tuple(out)


REDUCE = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter(data: mx.array, coords: tuple[mx.array, ...], updates: mx.array, reduction: str) -> mx.array:
    if reduction == "none":
        out = mx.array(data)
        out[coords] = updates
        return out
    return getattr(data.at[coords], REDUCE[reduction])(updates)


@kernel("onnx.ScatterElements")
def scatter_elements(data, indices, updates, *, axis, reduction):
    ax = axis % data.ndim
    if updates.size == 0 or data.size == 0:
        return mx.array(data)
    if _cuda.active():
        return _cuda.scatter_elements(data, indices, updates, ax, reduction)
    return _scatter(data, _axis_coords(indices, ax, data.shape[ax]), updates, reduction)


@kernel("onnx.GatherElements")
def gather_elements(data, indices, *, axis):
    ax = axis % data.ndim
    if indices.size == 0:
        return mx.zeros(indices.shape, data.dtype)
    if _cuda.active():
        return _cuda.gather_elements(data, indices, ax)
    # indices may be smaller than data off the axis: cut data to them, then take_along_axis.
    sub = data[tuple(slice(None) if d == ax else slice(0, n) for d, n in enumerate(indices.shape))]
    return mx.take_along_axis(sub, safe_index(indices, data.shape[ax]), axis=ax)


def _tuple_coords(idx: mx.array, sizes: Sequence[int]) -> tuple[mx.array, ...]:
    """Split [..., k] index tuples into k coordinate arrays, each normalised and clamped."""
    return tuple(safe_index(idx[..., j], s) for j, s in enumerate(sizes))


@kernel("onnx.GatherND")
def gather_nd(data, indices, *, batch_dims):
    b = batch_dims
    k = indices.shape[-1]
    out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
    if indices.size == 0 or math.prod(out_shape) == 0:
        return mx.zeros(out_shape, data.dtype)
    if _cuda.active():
        return _cuda.gather_nd(data, indices, b)
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    idx = indices.reshape(nb, -1, k)
    batch = mx.arange(nb).reshape(nb, 1)
    out = d[(batch,) + _tuple_coords(idx, data.shape[b:b + k])]
    return out.reshape(out_shape)


@kernel("onnx.ScatterND")
def scatter_nd(data, indices, updates, *, reduction):
    if updates.size == 0 or data.size == 0:
        return mx.array(data)
    if _cuda.active():
        return _cuda.scatter_nd(data, indices, updates, reduction)
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    upd = updates.reshape((idx.shape[0],) + tuple(data.shape[k:]))
    return _scatter(data, _tuple_coords(idx, data.shape[:k]), upd, reduction)


# -- rlx_sparse ----------------------------------------------------------------------------------
def row_ids(row_ptr: mx.array, nnz: int) -> mx.array:
    """The row of each stored entry: mark each row start, prefix-sum the marks. row_ptr values
    are clamped into [0, nnz], so malformed input cannot index outside the mark array."""
    n = row_ptr.shape[0] - 1
    if n <= 1 or nnz == 0:
        return mx.zeros((nnz,), mx.int32)
    starts = mx.clip(row_ptr[1:n], 0, nnz)
    marks = mx.zeros((nnz + 1,), mx.int32).at[starts].add(mx.ones(starts.shape, mx.int32))
    return mx.cumsum(marks)[:nnz]


def _csr(values, col_idx, row_ptr, ncols):
    nnz = col_idx.shape[0]
    return row_ids(row_ptr, nnz), mx.clip(col_idx, 0, max(ncols - 1, 0))


def spmv(values, rows, cols, x, n):
    return mx.zeros((n,), values.dtype).at[rows].add(values * x[cols])


@kernel("rlx_sparse.mat_vec")
def mat_vec(values, col_idx, row_ptr, x):
    n = row_ptr.shape[0] - 1
    if col_idx.shape[0] == 0:
        return mx.zeros((n,), values.dtype)
    if _cuda.active() and n:
        return _cuda.spmv(values, col_idx, row_ptr, x)
    rows, cols = _csr(values, col_idx, row_ptr, x.shape[0])
    return spmv(values, rows, cols, x, n)


@kernel("rlx_sparse.values_grad")
def values_grad(col_idx, row_ptr, u, v):
    if col_idx.shape[0] == 0:
        return mx.zeros((0,), u.dtype)
    if _cuda.active() and v.shape[0]:
        return _cuda.values_grad(col_idx, row_ptr, u, v)
    rows, cols = _csr(None, col_idx, row_ptr, v.shape[0])
    return u[rows] * v[cols]


MLX_LU_1X1_F64 = (
    "MLX 0.32.4 bug: mx.linalg.lu (and solve, built on it) corrupts the heap on a 1x1 float64 "
    "matrix on the CPU (SIGSEGV/SIGABRT within ~1000 calls, eager or compiled); reproduced by "
    "tests/test_custom_oracles.py::test_mlx_lu_1x1_float64_heap_corruption")


@kernel("rlx_sparse.lu_solve", cpu_stream=True)
def lu_solve(values, col_idx, row_ptr, b):
    n = b.shape[0]
    if n == 1 and values.dtype == mx.float64:
        # Not called: it would corrupt the worker's heap and crash later, unrelated cases.
        raise RuntimeError(MLX_LU_1X1_F64)
    rows, cols = _csr(values, col_idx, row_ptr, n)
    a = mx.zeros((n, n), values.dtype).at[rows, cols].add(values)
    x = mx.linalg.solve(a, b[:, None])[:, 0]
    try:  # LAPACK failures surface at evaluation: name them where evaluation is allowed
        mx.eval(x)
    except RuntimeError as e:
        raise SpecError(f"rlx_sparse.lu_solve: the matrix is singular ({e})") from None
    except ValueError as e:
        if not tracing(e):
            raise
    return x


@kernel("rlx_sparse.cg_solve")
def cg_solve(values, col_idx, row_ptr, b, *, max_iter, tol):
    concrete = True  # eager and lazy: stop once converged; under mx.compile: all max_iter steps
    n = b.shape[0]
    if _cuda.active() and col_idx.shape[0]:
        def product(p):
            return _cuda.spmv(values, col_idx, row_ptr, p)
    else:
        rows, cols = _csr(values, col_idx, row_ptr, n)

        def product(p):
            return spmv(values, rows, cols, p, n)
    x = mx.zeros_like(b)
    r = b
    p = r
    rs = mx.sum(r * r)
    done = mx.sqrt(rs) < tol
    for it in range(max_iter):
        ap = product(p)
        alpha = rs / mx.sum(p * ap)
        x_new = x + alpha * p
        r_new = r - alpha * ap
        rs_new = mx.sum(r_new * r_new)
        p_new = r_new + (rs_new / rs) * p
        x = mx.where(done, x, x_new)
        r = mx.where(done, r, r_new)
        p = mx.where(done, p, p_new)
        rs = mx.where(done, rs, rs_new)
        done = done | (mx.sqrt(rs) < tol)
        if concrete and it % 8 == 7:
            try:
                if done.item():
                    break
            except ValueError as e:
                if not tracing(e):
                    raise
                concrete = False
    return x
