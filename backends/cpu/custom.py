"""Reference kernels of the custom ops: the ONNX spec for the four ONNX ops (not RLX's
deviations: no clamping, no zeroing of non-finite outputs), scipy.sparse for ``rlx_sparse``.

Index values and CSR structure are validated before any kernel runs (OpSpec.check_values,
called by Backend.run): out of range is an error, never clamped or wrapped. Scatter reductions apply every update, duplicates
included, in the order of the updates, in the compute dtype (float16/bfloat16 arrive widened to
float32); max/min propagate NaN (numpy maximum/minimum, docs/ops.md). Sparse kernels compute in
float64 and round once.
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.spec import csr

kernel = BACKEND.kernel

UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _norm(idx: np.ndarray, size) -> np.ndarray:
    idx = idx.astype(np.int64)
    return np.where(idx < 0, idx + size, idx)


def _elements_coords(indices: np.ndarray, axis: int, size: int) -> tuple[np.ndarray, ...]:
    """Full coordinates of each index position: its own position, the axis coord replaced."""
    grid = list(np.indices(indices.shape))
    grid[axis] = _norm(indices, size)
    return tuple(grid)


def _scatter(out: np.ndarray, coords, updates: np.ndarray, reduction: str) -> np.ndarray:
    if reduction == "none":
        out[coords] = updates
    else:
        UFUNCS[reduction].at(out, coords, updates)
    return out


@kernel("onnx.ScatterElements")
def scatter_elements(data, indices, updates, *, axis, reduction):
    ax = axis % data.ndim
    coords = _elements_coords(indices, ax, data.shape[ax])
    return _scatter(data.copy(), coords, updates, reduction)


@kernel("onnx.GatherElements")
def gather_elements(data, indices, *, axis):
    ax = axis % data.ndim
    return data[_elements_coords(indices, ax, data.shape[ax])]


@kernel("onnx.GatherND")
def gather_nd(data, indices, *, batch_dims):
    b = batch_dims
    k = indices.shape[-1]
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + data.shape[b:])
    idx = _norm(indices.reshape(nb, -1, k), np.array(data.shape[b:b + k]))
    batch = np.arange(nb)[:, None]
    out = d[(batch,) + tuple(idx[..., j] for j in range(k))]
    return out.reshape(indices.shape[:-1] + data.shape[b + k:])


@kernel("onnx.ScatterND")
def scatter_nd(data, indices, updates, *, reduction):
    k = indices.shape[-1]
    idx = _norm(indices.reshape(-1, k), np.array(data.shape[:k]))
    upd = updates.reshape((idx.shape[0],) + data.shape[k:])
    return _scatter(data.copy(), tuple(idx.T), upd, reduction)


def _a(values, col_idx, row_ptr, ncols):
    return csr.to_scipy(values, col_idx, row_ptr, ncols)


@kernel("rlx_sparse.mat_vec")
def mat_vec(values, col_idx, row_ptr, x):
    y = _a(values, col_idx, row_ptr, x.shape[0]) @ x.astype(np.float64)
    return np.asarray(y).astype(values.dtype)


@kernel("rlx_sparse.values_grad")
def values_grad(col_idx, row_ptr, u, v):
    return u[csr.row_ids(row_ptr)] * v[col_idx.astype(np.int64)]


@kernel("rlx_sparse.lu_solve")
def lu_solve(values, col_idx, row_ptr, b):
    a = _a(values, col_idx, row_ptr, b.shape[0])
    return csr.lu_solve(a, b, "rlx_sparse.lu_solve").astype(values.dtype)


@kernel("rlx_sparse.cg_solve")
def cg_solve(values, col_idx, row_ptr, b, *, max_iter, tol):
    a = _a(values, col_idx, row_ptr, b.shape[0])
    x, _, _ = csr.cg(a, b.astype(np.float64), max_iter, tol)
    return x.astype(values.dtype)
