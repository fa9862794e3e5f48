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


# -- derivatives (validate --grad): kernels made with mx.custom_function bring their own VJP ---------
def _tanh_with_vjp(cotangent_of):
    """tanh as an mx.custom_function whose VJP is ``cotangent_of(cot, y) * ...`` (MLX calls it
    under mx.vjp; its JVP is MLX's autodiff of the forward)."""
    @mx.custom_function
    def f(x):
        return mx.tanh(x)

    @f.vjp
    def f_vjp(primals, cot, y):
        return (cotangent_of(cot, y),)
    return f


_tanh_right = _tanh_with_vjp(lambda u, y: u * (1 - y * y))
_tanh_no_factor = _tanh_with_vjp(lambda u, y: u)  # the bug: (1 - y^2) forgotten


def _row_major_read(u):
    """The cotangent's buffer read element by element in memory order and taken as row-major
    (what a hand-written kernel does with a raw pointer): right for a row-contiguous cotangent,
    scrambled for any other layout (a transposed view, a column-major array). numpy's view of
    an MLX array keeps its strides; ravel(order="K") walks memory order."""
    c = np.asarray(u)
    return mx.array(c.ravel(order="K").reshape(c.shape))


_tanh_contiguous_only = _tanh_with_vjp(lambda u, y: _row_major_read(u) * (1 - y * y))


def tanh_custom_vjp(x):
    """tanh with a right VJP of its own (mx.custom_function): validate --grad must pass it."""
    return _tanh_right(x)


def tanh_plain(x):
    """tanh with no VJP of its own: MLX differentiates through it."""
    return mx.tanh(x)


def tanh_vjp_missing_factor(x):
    """tanh whose custom VJP returns the cotangent as is: the factor 1 - tanh(x)^2 is missing."""
    return _tanh_no_factor(x)


def tanh_vjp_contiguous_only(x):
    """tanh whose custom VJP reads its cotangent's buffer as row-major: right for contiguous
    cotangents only (and, reading through numpy, untraceable: eager and lazy modes only)."""
    return _tanh_contiguous_only(x)


@mx.custom_function
def _tanh_bad_jvp(x):
    return mx.tanh(x)


@_tanh_bad_jvp.jvp
def _tanh_bad_jvp_jvp(primals, tangents):
    # one primal: MLX hands the tangent itself, not a tuple of one
    t = tangents[0] if isinstance(tangents, (tuple, list)) else tangents
    return (t,)  # the bug: the factor 1 - tanh(x)^2 is missing


def tanh_jvp_missing_factor(x):
    """tanh whose custom JVP returns the tangent as is (its VJP is MLX's autodiff: right)."""
    return _tanh_bad_jvp(x)


@mx.custom_function
def _mat_mul_transposed(a, b):
    return mx.matmul(a, b)


@_mat_mul_transposed.vjp
def _mat_mul_transposed_vjp(primals, cot, out):
    """MLX's own VJP, except A's cotangent: (u Bᵀ)ᵀ = B uᵀ, reshaped to A's shape (the
    transpose back forgotten); B's cotangent is right."""
    da, db = mx.vjp(mx.matmul, list(primals), [cot])[1]
    if da.ndim >= 2:
        da = mx.swapaxes(da, -1, -2).reshape(da.shape)
    return da, db


def mat_mul_vjp_transposed(a, b):
    """mat_mul whose custom VJP gets A's cotangent transposed: wrong whenever A's last two axes
    are not 1-wide, right for B."""
    return _mat_mul_transposed(a, b)


_GATHERS: dict = {}


def _gather(axis, accumulate):
    """ONNX Gather along ``axis`` as an mx.custom_function whose VJP scatters the cotangent
    into zeros: by accumulation (right), or by assignment (the bug: of duplicate indices one
    cotangent survives, the others are dropped). Its JVP (gather the tangent) is its own too:
    MLX's autodiff of a custom_function differentiates every argument, the indices included."""
    key = (axis, accumulate)
    if key in _GATHERS:
        return _GATHERS[key]

    def parts(x, indices):
        ax = axis % x.ndim
        idx = indices.reshape(-1).astype(mx.int32)
        idx = mx.where(idx < 0, idx + x.shape[ax], idx)
        pre = int(np.prod(x.shape[:ax], dtype=np.int64))
        post = int(np.prod(x.shape[ax + 1:], dtype=np.int64))
        return ax, idx, pre, post

    @mx.custom_function
    def g(x, indices):
        ax, idx, _, _ = parts(x, indices)
        return mx.take(x, idx, axis=ax).reshape(x.shape[:ax] + indices.shape + x.shape[ax + 1:])

    @g.vjp
    def g_vjp(primals, cot, out):
        x, indices = primals
        ax, idx, pre, post = parts(x, indices)
        u = cot.reshape(pre, idx.size, post)
        dx = mx.zeros((pre, x.shape[ax], post), dtype=cot.dtype)
        if accumulate:
            dx = dx.at[:, idx, :].add(u)
        else:
            dx[:, idx, :] = u
        return dx.reshape(x.shape), mx.zeros_like(indices)

    @g.jvp
    def g_jvp(primals, tangents):  # its own (right) JVP: the indices get none
        return (g(tangents[0], primals[1]),)

    _GATHERS[key] = g
    return g


def gather_vjp_right(x, indices, *, axis):
    """ONNX Gather whose custom VJP accumulates over duplicate indices."""
    return _gather(axis, True)(x, indices)


def gather_vjp_drops_duplicates(x, indices, *, axis):
    """ONNX Gather whose custom VJP assigns instead of accumulating: wrong where an index repeats."""
    return _gather(axis, False)(x, indices)
