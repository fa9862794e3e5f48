"""Kernels for tests/test_validate.py: each breaks one rule, so validate must report that rule.

All are for hard_sigmoid (one float input, no attributes, 14 cases per dtype and mode) unless
named otherwise. Loaded by validate from this file's path (``tests/validate_kernels.py:NAME``),
in every worker process.
"""
from __future__ import annotations

import os
import signal
import time

import mlx.core as mx
import numpy as np


def _hs(x):
    return mx.clip((x + 3) / 6, 0.0, 1.0)


def crash_or_hang(x):
    """Right, except that it kills its process on 7 elements (family "odd") and hangs on 24
    (family "rank3")."""
    if x.size == 7:
        os.kill(os.getpid(), signal.SIGSEGV)
    if x.size == 24:
        time.sleep(120)
    return _hs(x)


def wrong_shape(x):
    return mx.expand_dims(_hs(x), 0)


def wrong_dtype(x):
    return _hs(x).astype(mx.int32)


def not_an_array(x):
    return np.array(_hs(x))  # a numpy array, not an mx.array


def mutates_input(x):
    y = _hs(x)
    x[...] = 0  # writes to the input the harness handed over
    return y


def two_inputs(x, y):
    """Does not fit hard_sigmoid's signature (one input): registration fails (exit 2)."""
    return x


def planted_bug(x):
    """Right on every shape of the matrix, wrong on 1-D inputs of 2 to 4 elements (fuzzing
    draws such shapes from the family "odd", [7] in the matrix)."""
    y = _hs(x)
    if x.ndim == 1 and 2 <= x.shape[0] <= 4:
        return y + 0.25
    return y


def sign_like_builtin(x):
    """sign as the built-in MLX kernel computes it (mx.sign(NaN) = 0, a known divergence)."""
    return mx.sign(x)


def cholesky_unchecked(A):
    """mx.linalg.cholesky as is: returns garbage for a matrix that is not positive definite."""
    return mx.linalg.cholesky(A, upper=False, stream=mx.cpu)


def cholesky_checked(A):
    """Rejects what is not positive definite, as the spec asks (an error, not garbage)."""
    L = mx.linalg.cholesky(A, upper=False, stream=mx.cpu)
    d = mx.diagonal(L, axis1=-2, axis2=-1)
    mx.eval(d)
    if A.shape[-1] and not bool(mx.all(mx.isfinite(L)).item() and mx.all(d > 0).item()):
        raise ValueError("cholesky: the matrix is not positive definite")
    return L


def softmax_nan_float64(x, *, axis):
    """softmax that returns NaN everywhere for float64 (MLX's built-in float64 softmax fails its
    cases too, by a few 1e-9 relative: a known divergence that must not excuse this)."""
    if x.dtype == mx.float64:
        return mx.full(x.shape, float("nan"), dtype=x.dtype)
    return mx.softmax(x, axis=axis)


def exp_constant_float64(x):
    """exp that returns 42.0 for float64 (the built-in's float64 exp is float32-accurate: known
    divergence float64-float32-grade-math, which must not excuse a constant)."""
    if x.dtype == mx.float64:
        return mx.full(x.shape, 42.0, dtype=x.dtype)
    return mx.exp(x)


def gather_nd_wrong_on_tables(data, indices, *, batch_dims):
    """GatherND right on rank >= 3 data and wrong on a rank-2 table (the embedding lookup): it
    reads the row after the one indexed (a classic off-by-one of a hand-rolled 2-D path)."""
    from rlx_conformance.backends.mlx.custom import gather_nd
    if data.ndim == 2 and batch_dims == 0 and indices.shape[-1] == 1:
        indices = (indices + 1) % data.shape[0]
    return gather_nd(data, indices, batch_dims=batch_dims)


def every_outcome(x):
    """One hard_sigmoid port with one bad outcome per shape family of the float32 matrix: wrong
    values on 3x5 (fail), raises on [1] (error), a wrong output shape on [1031] (contract), kills
    its process on [7] (crash), hangs on 2x3x4 (timeout); right elsewhere."""
    if x.size == 15:
        return _hs(x) + 0.5
    if x.ndim == 1 and x.size == 1:
        raise ValueError("every_outcome: one element is one too few")
    if x.size == 1031:
        return mx.expand_dims(_hs(x), 0)
    return crash_or_hang(x)


# -- ports for tests/test_contributor_workflow.py: each op's first (wrong) and fixed version -------
def _wrap(idx, size):
    return mx.where(idx < 0, idx + size, idx)


def _gather_nd(data, indices, batch_dims, per_batch):
    b, k = batch_dims, indices.shape[-1]
    out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
    if indices.size == 0 or 0 in out_shape:
        return mx.zeros(out_shape, data.dtype)
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    idx = indices.reshape(nb, -1, k)
    # the bug: every batch reads batch 0's slab (the batch offset forgotten)
    batch = mx.arange(nb).reshape(nb, 1) if per_batch else mx.zeros((nb, 1), mx.int32)
    coords = tuple(_wrap(idx[..., j], s) for j, s in enumerate(data.shape[b:b + k]))
    return d[(batch,) + coords].reshape(out_shape)


def gather_nd_first_try(data, indices, *, batch_dims):
    """GatherND port that forgets the batch offset: right for batch_dims = 0 only."""
    return _gather_nd(data, indices, batch_dims, per_batch=False)


def gather_nd_fixed(data, indices, *, batch_dims):
    return _gather_nd(data, indices, batch_dims, per_batch=True)


_AT = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def _scatter_nd(data, indices, updates, reduction, accumulate):
    if updates.size == 0 or data.size == 0:
        return mx.array(data)
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    upd = updates.reshape((idx.shape[0],) + tuple(data.shape[k:]))
    coords = tuple(_wrap(idx[:, j], s) for j, s in enumerate(data.shape[:k]))
    if reduction == "none" or (reduction == "add" and not accumulate):
        # the bug: reduction "add" as an assignment (the last duplicate wins, nothing adds)
        out = mx.array(data)
        out[coords] = upd
        return out
    return getattr(data.at[coords], _AT[reduction])(upd)


def scatter_nd_first_try(data, indices, updates, *, reduction):
    """ScatterND port whose reduction "add" assigns instead of adding."""
    return _scatter_nd(data, indices, updates, reduction, accumulate=False)


def scatter_nd_fixed(data, indices, updates, *, reduction):
    return _scatter_nd(data, indices, updates, reduction, accumulate=True)


def _reduce_sum(x, axes, keep_dim, off_by_one):
    axis = tuple(axes) if axes else None
    if off_by_one and axis == (-1,) and x.shape[-1] > 1:
        x = x[..., :-1]  # the bug: the last element of the reduced axis is left out
    return mx.sum(x, axis=axis, keepdims=keep_dim).astype(x.dtype)


def reduce_sum_first_try(x, *, axes, keep_dim):
    """reduce_sum port that drops the last element when it reduces axis -1."""
    return _reduce_sum(x, axes, keep_dim, off_by_one=True)


def reduce_sum_fixed(x, *, axes, keep_dim):
    return _reduce_sum(x, axes, keep_dim, off_by_one=False)


def _mat_vec(values, col_idx, row_ptr, x, accumulate):
    n, nnz = row_ptr.shape[0] - 1, col_idx.shape[0]
    if nnz == 0:
        return mx.zeros((n,), values.dtype)
    marks = mx.zeros((nnz + 1,), mx.int32)
    starts = row_ptr[1:n]
    if n > 1 and accumulate:
        marks = marks.at[starts].add(mx.ones(starts.shape, mx.int32))
    elif n > 1:
        marks[starts] = 1  # the bug: an empty row's start mark overwrites the next row's
    rows = mx.cumsum(marks)[:nnz]
    return mx.zeros((n,), values.dtype).at[rows].add(values * x[col_idx])


def mat_vec_first_try(values, col_idx, row_ptr, x):
    """CSR mat_vec port whose row ids go wrong after an empty row."""
    return _mat_vec(values, col_idx, row_ptr, x, accumulate=False)


def mat_vec_fixed(values, col_idx, row_ptr, x):
    return _mat_vec(values, col_idx, row_ptr, x, accumulate=True)
