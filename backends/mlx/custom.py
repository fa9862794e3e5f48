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
eager and lazy mode stopping early once converged; on a GPU stream each iteration's vector
operations run as one mx.compile'd step (``cg_step_fused``).

On a CUDA GPU stream the scatters, gathers, mat_vec, values_grad and CG's products run native
CUDA kernels instead (``cuda_kernels.py``: deterministic: no floating-point atomics); the compositions here
are the fallback on every other build, and on CUDA with RLX_MLX_CUDA_KERNELS=0. A scatter with
no updates returns ``data`` without calling MLX's scatter (MLX 0.32.4's GPU scatter dies with
SIGFPE in compiled mode on zero updates). MLX cannot differentiate those kernels: each runs inside
an ``mx.custom_function`` whose VJP and JVP are written in MLX primitives (``with_derivatives``
and the ``*_with_derivatives`` factories at the end of this file), so mx.vjp/mx.jvp work on the
GPU as on the compositions, which MLX differentiates itself.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from rlx_conformance.backends.mlx import BACKEND
from rlx_conformance.backends.mlx import cuda_kernels as _cuda
from rlx_conformance.core.errors import SpecError

kernel = BACKEND.kernel

# MLX's messages when a traced array is read (item) or evaluated (async_eval) inside a transform
_TRACING = ("function transformations", "graph transformation")


def tracing(e: Exception) -> bool:
    """Is this MLX's refusal to evaluate inside mx.compile or mx.vjp/jvp (values are unknown
    while tracing)?"""
    return isinstance(e, ValueError) and any(m in str(e) for m in _TRACING)


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


def composed_scatter_elements(data, indices, updates, ax: int, reduction: str) -> mx.array:
    """ScatterElements in MLX primitives (the signature of cuda_kernels.scatter_elements)."""
    return _scatter(data, _axis_coords(indices, ax, data.shape[ax]), updates, reduction)


@kernel("onnx.ScatterElements")
def scatter_elements(data, indices, updates, *, axis, reduction):
    ax = axis % data.ndim
    if updates.size == 0 or data.size == 0:
        return mx.array(data)
    if _cuda.active():
        return _cuda_scatter_elements(ax, reduction)(data, indices, updates)
    return composed_scatter_elements(data, indices, updates, ax, reduction)


def composed_gather_elements(data, indices, ax: int) -> mx.array:
    """GatherElements in MLX primitives (the signature of cuda_kernels.gather_elements)."""
    # indices may be smaller than data off the axis: cut data to them, then take_along_axis.
    sub = data[tuple(slice(None) if d == ax else slice(0, n) for d, n in enumerate(indices.shape))]
    return mx.take_along_axis(sub, safe_index(indices, data.shape[ax]), axis=ax)


@kernel("onnx.GatherElements")
def gather_elements(data, indices, *, axis):
    ax = axis % data.ndim
    if indices.size == 0:
        return mx.zeros(indices.shape, data.dtype)
    if _cuda.active():
        return _cuda_gather_elements(ax)(data, indices)
    return composed_gather_elements(data, indices, ax)


def _tuple_coords(idx: mx.array, sizes: Sequence[int]) -> tuple[mx.array, ...]:
    """Split [..., k] index tuples into k coordinate arrays, each normalised and clamped."""
    return tuple(safe_index(idx[..., j], s) for j, s in enumerate(sizes))


def _nd_coords(data, indices, b: int) -> tuple[mx.array, ...]:
    """GatherND's source coordinates in data viewed as [nb, *data.shape[b:]]: the batch, then
    the k index coordinates, each [nb, P]."""
    k = indices.shape[-1]
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    batch = mx.arange(nb).reshape(nb, 1)
    return (batch,) + _tuple_coords(indices.reshape(nb, -1, k), data.shape[b:b + k])


def composed_gather_nd(data, indices, b: int) -> mx.array:
    """GatherND in MLX primitives (the signature of cuda_kernels.gather_nd)."""
    k = indices.shape[-1]
    out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
    nb = int(np.prod(data.shape[:b], dtype=np.int64))
    d = data.reshape((nb,) + tuple(data.shape[b:]))
    return d[_nd_coords(data, indices, b)].reshape(out_shape)


@kernel("onnx.GatherND")
def gather_nd(data, indices, *, batch_dims):
    b = batch_dims
    k = indices.shape[-1]
    out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
    if indices.size == 0 or math.prod(out_shape) == 0:
        return mx.zeros(out_shape, data.dtype)
    if _cuda.active():
        return _cuda_gather_nd(b)(data, indices)
    return composed_gather_nd(data, indices, b)


def _nd_targets(data, indices, updates) -> tuple[tuple[mx.array, ...], mx.array]:
    """ScatterND's target coordinates (one [M] array per index component) and the updates as
    [M, *slice]."""
    k = indices.shape[-1]
    idx = indices.reshape(-1, k)
    return _tuple_coords(idx, data.shape[:k]), updates.reshape((idx.shape[0],) + tuple(data.shape[k:]))


def _elements_targets(ax: int):
    """ScatterElements' target coordinates (each of the indices' shape) and the updates."""
    return lambda data, indices, updates: (_axis_coords(indices, ax, data.shape[ax]), updates)


def composed_scatter_nd(data, indices, updates, reduction: str) -> mx.array:
    """ScatterND in MLX primitives (the signature of cuda_kernels.scatter_nd)."""
    coords, upd = _nd_targets(data, indices, updates)
    return _scatter(data, coords, upd, reduction)


@kernel("onnx.ScatterND")
def scatter_nd(data, indices, updates, *, reduction):
    if updates.size == 0 or data.size == 0:
        return mx.array(data)
    if _cuda.active():
        return _cuda_scatter_nd(reduction)(data, indices, updates)
    return composed_scatter_nd(data, indices, updates, reduction)


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


def composed_spmv(values, col_idx, row_ptr, x) -> mx.array:
    """A x in MLX primitives (the signature of cuda_kernels.spmv)."""
    rows, cols = _csr(values, col_idx, row_ptr, x.shape[0])
    return spmv(values, rows, cols, x, row_ptr.shape[0] - 1)


@kernel("rlx_sparse.mat_vec")
def mat_vec(values, col_idx, row_ptr, x):
    n = row_ptr.shape[0] - 1
    if col_idx.shape[0] == 0:
        return mx.zeros((n,), values.dtype)
    if _cuda.active() and n:
        return _cuda_spmv()(values, col_idx, row_ptr, x)
    return composed_spmv(values, col_idx, row_ptr, x)


def composed_values_grad(col_idx, row_ptr, u, v) -> mx.array:
    """u[row k] v[col k] in MLX primitives (the signature of cuda_kernels.values_grad)."""
    rows, cols = _csr(None, col_idx, row_ptr, v.shape[0])
    return u[rows] * v[cols]


@kernel("rlx_sparse.values_grad")
def values_grad(col_idx, row_ptr, u, v):
    if col_idx.shape[0] == 0:
        return mx.zeros((0,), u.dtype)
    if _cuda.active() and v.shape[0]:
        return _cuda_values_grad()(col_idx, row_ptr, u, v)
    return composed_values_grad(col_idx, row_ptr, u, v)


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


def cg_step(x, r, p, ap, rs, done, tol):
    """One CG update given ``ap = A p``: the new (x, r, p, rs, done). Once ``done``, the step keeps
    the old values (mx.where): under mx.compile cg_solve runs all max_iter steps. ``tol`` is an
    array, so that a compiled step does not keep its first trace's tolerance as a constant.

    Once converged a lane's step is discarded, but its divisions still run on r = p = 0: 0/0
    there is harmless to the values and poisons the derivative (where's VJP sends 0 into the
    unselected branch, and 0 * inf = NaN), so it divides by 1 instead. The convergence test goes
    through stop_gradient: MLX's VJP of a comparison sends a zero cotangent back into its
    operands, and sqrt's derivative at rs = 0 is inf."""
    one = mx.ones_like(rs)
    alpha = rs / mx.where(done, one, mx.sum(p * ap))
    x_new = x + alpha * p
    r_new = r - alpha * ap
    rs_new = mx.sum(r_new * r_new)
    p_new = r_new + (rs_new / mx.where(done, one, rs)) * p
    rs = mx.where(done, rs, rs_new)
    return (mx.where(done, x, x_new), mx.where(done, r, r_new), mx.where(done, p, p_new), rs,
            done | (mx.sqrt(mx.stop_gradient(rs)) < tol))


# On a GPU stream one iteration's vector operations are about twenty kernels of a few
# microseconds each on vectors of 10^6 rows, so launches, not memory, set the iteration's time.
# mx.compile fuses the element-wise chains between the two reductions (benchmarks/README.md,
# "cg_solve's iteration"). Elsewhere the step runs as written: MLX's CPU compile costs a C++
# build per new program, more than it saves on the matrix's small systems.
cg_step_fused = mx.compile(cg_step)


def cg_step_here():
    """The step cg_solve uses on the current stream: fused on a GPU, as written on the CPU."""
    return cg_step_fused if mx.default_device().type == mx.gpu else cg_step


def cg_product(values, col_idx, row_ptr, n: int):
    """``p -> A p`` for cg_solve's iterations: the CUDA SpMV on a CUDA stream (with entries),
    else the composed SpMV with the CSR rows expanded once for every iteration."""
    if _cuda.active() and col_idx.shape[0]:
        cuda_spmv = _cuda_spmv()
        return lambda p: cuda_spmv(values, col_idx, row_ptr, p)
    rows, cols = _csr(values, col_idx, row_ptr, n)
    return lambda p: spmv(values, rows, cols, p, n)


@kernel("rlx_sparse.cg_solve")
def cg_solve(values, col_idx, row_ptr, b, *, max_iter, tol):
    concrete = True  # eager and lazy: stop once converged; under a transform: all max_iter steps
    step = cg_step_here()
    product = cg_product(values, col_idx, row_ptr, b.shape[0])
    x = mx.zeros_like(b)
    r = b
    p = r
    rs = mx.sum(r * r)
    limit = mx.array(tol, rs.dtype)
    done = mx.sqrt(mx.stop_gradient(rs)) < limit
    for it in range(max_iter):
        x, r, p, rs, done = step(x, r, p, product(p), rs, done, limit)
        if not concrete:
            continue
        try:
            # Queue the iteration now: the GPU runs it while Python builds the next one, instead
            # of idling until the convergence check evaluates eight iterations at once
            # (benchmarks/README.md, "cg_solve's iteration").
            mx.async_eval(x, r, p, rs, done)
            if it % 8 == 7 and done.item():
                break
        except ValueError as e:
            if not tracing(e):
                raise
            concrete = False
    return x


# -- derivatives of the CUDA kernels ---------------------------------------------------------------
# MLX cannot differentiate an mx.fast.cuda_kernel: on a CUDA stream each kernel above runs inside
# an mx.custom_function whose VJP and JVP are written in MLX primitives (the transpose gather or
# scatter), with the conventions of the reference rules (backends/cpu/custom.py): indices have no
# derivative, duplicates accumulate, scatter max/min ties share the cotangent equally, mul uses
# the product of the other factors. The composed kernels are differentiated by MLX itself.
# tests/test_custom_derivatives.py runs these wrappers on the CPU around the composed kernels.
def _floating(a: mx.array) -> bool:
    return mx.issubdtype(a.dtype, mx.floating)


def with_derivatives(forward, vjp, jvp):
    """``forward(*arrays)`` (one output) as an mx.custom_function differentiated by the rules
    ``vjp(primals, cotangent, output) -> one cotangent per primal`` (None for an index array)
    and ``jvp(primals, tangents) -> the output's tangent`` (tangents: None for an index array,
    zeros for a floating input the caller does not differentiate).

    The forward sees its inputs through mx.stop_gradient: MLX 0.32.4's mx.jvp otherwise walks
    the graph inside the custom function too, and fails on the first primitive there without a
    JVP ("[scatter] JVP not yet implemented", a cuda_kernel) before calling the custom JVP."""
    fn = mx.custom_function(lambda *args: forward(*[mx.stop_gradient(a) for a in args]))

    @fn.vjp
    def _vjp(primals, cotangent, output):
        res = vjp(primals, cotangent, output)
        return tuple(mx.zeros_like(p) if g is None else g for p, g in zip(primals, res))

    @fn.jvp
    def _jvp(primals, tangents):
        tans = [mx.zeros_like(p) if t is None and _floating(p) else (t if _floating(p) else None)
                for p, t in zip(primals, tangents)]
        return jvp(primals, tans)
    return fn


def _transpose_gather(cot: mx.array, coords: tuple[mx.array, ...], shape: tuple[int, ...]) -> mx.array:
    """The VJP of ``x[coords]`` for x of ``shape``: the cotangent scatter-added to the positions
    it was read from (repeats accumulate)."""
    lead = np.broadcast_shapes(*[tuple(c.shape) for c in coords])
    return mx.zeros(shape, cot.dtype).at[coords].add(cot.reshape(tuple(lead) + tuple(shape[len(coords):])))


def gather_with_derivatives(forward, coords_of, view=None):
    """A gather ``forward(data, indices)`` reading data (seen as ``view(data)``, default its own
    shape) at ``coords_of(data, indices)``: VJP the transpose scatter-add, JVP the gather of the
    tangent (it is linear in data)."""
    def vjp(primals, cot, out):
        data, idx = primals
        shape = tuple(view(data)) if view else tuple(data.shape)
        return _transpose_gather(cot, coords_of(data, idx), shape).reshape(data.shape), None

    def jvp(primals, tans):
        return forward(tans[0], primals[1])
    return with_derivatives(forward, vjp, jvp)


def _scatter_count(shape, coords, w: mx.array) -> mx.array:
    """Per cell, the sum of ``w`` over the updates that target it."""
    return mx.zeros(shape, w.dtype).at[coords].add(w)


def _other_factors(shape, coords, w: mx.array) -> tuple[mx.array, mx.array]:
    """Scatter mul: per cell the product of its updates, and per update the product of the other
    updates of its cell, without dividing by a zero (a cell's zero factors counted apart)."""
    zero = w == 0
    nz = mx.where(zero, mx.ones_like(w), w)
    zeros = _scatter_count(shape, coords, zero.astype(w.dtype))
    prod_nz = mx.ones(shape, w.dtype).at[coords].multiply(nz)
    total = mx.where(zeros > 0, mx.zeros_like(prod_nz), prod_nz)
    z, p = zeros[coords], prod_nz[coords]
    others = mx.where(zero, mx.where(z == 1, p, mx.zeros_like(p)),
                      mx.where(z == 0, p / nz, mx.zeros_like(p)))
    return total, others


def _ties(data, coords, w, out) -> tuple[mx.array, mx.array, mx.array]:
    """Scatter max/min: which of data and of the updates equal their cell's result, and how many
    per cell (they share its cotangent equally, as the reference's rule)."""
    hd = (data == out).astype(data.dtype)
    hw = (w == out[coords]).astype(w.dtype)
    return hd, hw, hd + _scatter_count(data.shape, coords, hw)


def scatter_with_derivatives(forward, targets_of, reduction: str):
    """A scatter ``forward(data, indices, updates)`` whose updates ``targets_of(data, indices,
    updates) -> (coords, updates viewed per target)`` go to ``data[coords]``. none and add are
    linear in (data, updates): JVP the scatter of the tangents; VJP the cotangent passed to data
    (zero where none overwrote it) and gathered for the updates. mul and max/min: the reference's
    rules (backends/cpu/custom.py) in MLX primitives."""
    def vjp(primals, cot, out):
        data, idx, updates = primals
        coords, w = targets_of(data, idx, updates)
        if reduction == "add":
            gd, gw = cot, cot[coords]
        elif reduction == "none":
            hit = _scatter_count(data.shape, coords, mx.ones_like(w))
            gd, gw = mx.where(hit > 0, mx.zeros_like(cot), cot), cot[coords]
        elif reduction == "mul":
            total, others = _other_factors(data.shape, coords, w)
            gd, gw = cot * total, cot[coords] * data[coords] * others
        else:
            hd, hw, n = _ties(data, coords, w, out)
            share = cot / n
            gd, gw = share * hd, share[coords] * hw
        return gd, None, gw.reshape(updates.shape)

    def jvp(primals, tans):
        data, idx, updates = primals
        td, _, tu = tans
        if reduction in ("none", "add"):
            return forward(td, idx, tu)
        coords, w = targets_of(data, idx, updates)
        _, tw = targets_of(data, idx, tu)
        if reduction == "mul":
            total, others = _other_factors(data.shape, coords, w)
            return td * total + data * _scatter_count(data.shape, coords, tw * others)
        hd, hw, n = _ties(data, coords, w, forward(data, idx, updates))
        return (td * hd + _scatter_count(data.shape, coords, tw * hw)) / n
    return with_derivatives(forward, vjp, jvp)


def spmv_with_derivatives(forward):
    """``forward(values, col_idx, row_ptr, x) = A x``: VJP u[row k] x[col k] for the values and
    Aᵀ u for x (a scatter-add by column); JVP A(tv) x + A tx (it is bilinear)."""
    def vjp(primals, cot, out):
        values, col_idx, row_ptr, x = primals
        rows, cols = _csr(values, col_idx, row_ptr, x.shape[0])
        gx = mx.zeros(x.shape, cot.dtype).at[cols].add(values * cot[rows])
        return cot[rows] * x[cols], None, None, gx

    def jvp(primals, tans):
        values, col_idx, row_ptr, x = primals
        return forward(tans[0], col_idx, row_ptr, x) + forward(values, col_idx, row_ptr, tans[3])
    return with_derivatives(forward, vjp, jvp)


def values_grad_with_derivatives(forward):
    """``forward(col_idx, row_ptr, u, v) = u[row k] v[col k]``: VJP the cotangent times v summed
    per row (u) and times u summed per column (v); JVP tu[row] v[col] + u[row] tv[col]."""
    def vjp(primals, cot, out):
        col_idx, row_ptr, u, v = primals
        rows, cols = _csr(None, col_idx, row_ptr, v.shape[0])
        return (None, None, mx.zeros(u.shape, cot.dtype).at[rows].add(cot * v[cols]),
                mx.zeros(v.shape, cot.dtype).at[cols].add(cot * u[rows]))

    def jvp(primals, tans):
        col_idx, row_ptr, u, v = primals
        return forward(col_idx, row_ptr, tans[2], v) + forward(col_idx, row_ptr, u, tans[3])
    return with_derivatives(forward, vjp, jvp)


# -- the CUDA kernels' custom functions, made once per attribute set -----------------------------
# At 10^6 elements a gather's GPU work is ~10 us: the host's path to the launch is the call. A
# new mx.custom_function each call (closures, VJP and JVP registered) cost ~4 us of it on the
# project's 2-core machine; one made per axis / reduction is reused across shapes and dtypes.
# Each looks the kernel up in cuda_kernels at call time (tests swap it for the composed one).
@functools.lru_cache(maxsize=None)
def _cuda_gather_elements(ax: int):
    return gather_with_derivatives(lambda d, i: _cuda.gather_elements(d, i, ax),
                                   lambda d, i: _axis_coords(i, ax, d.shape[ax]))


@functools.lru_cache(maxsize=None)
def _cuda_gather_nd(b: int):
    return gather_with_derivatives(lambda d, i: _cuda.gather_nd(d, i, b), lambda d, i: _nd_coords(d, i, b),
                                   lambda d: (math.prod(d.shape[:b]),) + tuple(d.shape[b:]))


@functools.lru_cache(maxsize=None)
def _cuda_scatter_elements(ax: int, reduction: str):
    return scatter_with_derivatives(lambda d, i, u: _cuda.scatter_elements(d, i, u, ax, reduction),
                                    _elements_targets(ax), reduction)


@functools.lru_cache(maxsize=None)
def _cuda_scatter_nd(reduction: str):
    return scatter_with_derivatives(lambda d, i, u: _cuda.scatter_nd(d, i, u, reduction),
                                    _nd_targets, reduction)


@functools.lru_cache(maxsize=None)
def _cuda_spmv():
    return spmv_with_derivatives(lambda *a: _cuda.spmv(*a))


@functools.lru_cache(maxsize=None)
def _cuda_values_grad():
    return values_grad_with_derivatives(lambda *a: _cuda.values_grad(*a))
