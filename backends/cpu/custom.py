"""Reference kernels of the custom ops: the ONNX spec for the four ONNX ops (not RLX's
deviations: no clamping, no zeroing of non-finite outputs), scipy.sparse for ``rlx_sparse``.

Index values and CSR structure are validated before any kernel runs (OpSpec.check_values,
called by Backend.run): out of range is an error, never clamped or wrapped. Scatter reductions apply every update, duplicates
included, in the order of the updates, in the compute dtype (float16/bfloat16 arrive widened to
float32); max/min propagate NaN (numpy maximum/minimum, docs/ops.md). Sparse kernels compute in
float64 and round once.
"""
from __future__ import annotations

import functools

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import (
    SAVED_TERMS,
    add_grads,
    exclusive_products,
    multilinear,
    selection,
    selection_radius,
    solve_magnitude,
)
from rlx_conformance.judge.custom_checks import scatter_targets
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


# -- reference derivatives (float64) ---------------------------------------------------------------
vjp = BACKEND.vjp
jvp = BACKEND.jvp


def _source_positions(gather, data: np.ndarray, *index_args, **attrs) -> np.ndarray:
    """The flat data position each output element of a gather reads: the gather itself applied
    to the positions (its index semantics, checked against onnx.reference, once)."""
    return gather(np.arange(data.size).reshape(data.shape), *index_args, **attrs)


def _gather_rules(op: str, gather) -> None:
    """A gather's cotangent is scattered back with accumulation: every output that reads a data
    element adds its cotangent to it (repeated indices accumulate)."""
    def _vjp(inputs, attrs, cots):
        data, indices = inputs
        pos = _source_positions(gather, data, indices, **attrs)
        g = np.zeros(data.size)
        np.add.at(g, pos.ravel(), cots[0].ravel())
        return [g.reshape(data.shape), None]

    def _jvp(inputs, attrs, tans):
        return [gather(tans[0], inputs[1], **attrs)]

    vjp(op, convention="indices have no derivative; repeated indices accumulate every cotangent "
        "that reads them")(_vjp)
    jvp(op)(_jvp)


_gather_rules("onnx.GatherElements", gather_elements)
_gather_rules("onnx.GatherND", gather_nd)
for _op in ("onnx.GatherElements", "onnx.GatherND"):  # linear in data, coefficients 0 or 1
    BACKEND.magnitude(_op)(multilinear(_op))


def _segments(t: np.ndarray) -> list[np.ndarray]:
    """The update elements of each target cell, in update order."""
    order = np.argsort(t, kind="stable")
    cuts = np.flatnonzero(np.diff(t[order])) + 1
    return np.split(order, cuts) if t.size else []


def _scatter_parts(op: str, inputs, attrs):
    data, indices, updates = inputs
    t = scatter_targets(op, data, indices, updates, attrs)
    return data.ravel(), t, updates.ravel()


def _scatter_rules(op: str) -> None:
    """ScatterElements / ScatterND, over each update element's flat target (scatter_targets).
    none: the data's cotangent is zero where an update overwrites it (duplicates are undefined
    and masked); add: both pass the cotangent through; mul: the product of the other factors (no
    division); max/min: ties between the candidates of a cell share its cotangent equally."""
    def _vjp(inputs, attrs, cots):
        d, t, w = _scatter_parts(op, inputs, attrs)
        u = cots[0].ravel()
        red = attrs["reduction"]
        gd, gw = u.copy(), u[t].copy()
        if red == "none":
            gd[t] = 0.0
        elif red == "mul":
            for seg in _segments(t):
                p = t[seg[0]]
                gd[p] = u[p] * np.prod(w[seg])
                gw[seg] = u[p] * d[p] * exclusive_products(w[seg])
        elif red in ("max", "min"):
            for seg in _segments(t):
                p = t[seg[0]]
                cand = np.concatenate([[d[p]], w[seg]])
                best = cand.max() if red == "max" else cand.min()
                share = (cand == best) / np.sum(cand == best)
                gd[p] = u[p] * share[0]
                gw[seg] = u[p] * share[1:]
        return [gd.reshape(inputs[0].shape), None, gw.reshape(inputs[2].shape)]

    def _jvp(inputs, attrs, tans):
        d, t, w = _scatter_parts(op, inputs, attrs)
        td, tw = tans[0].ravel().copy(), tans[2].ravel()
        red = attrs["reduction"]
        if red == "none":
            td[t] = tw
        elif red == "add":
            np.add.at(td, t, tw)
        elif red == "mul":  # forward mode through the updates in order
            val = d.copy()
            for j, p in enumerate(t):
                val[p], td[p] = val[p] * w[j], td[p] * w[j] + val[p] * tw[j]
        else:
            for seg in _segments(t):
                p = t[seg[0]]
                cand = np.concatenate([[d[p]], w[seg]])
                best = cand.max() if red == "max" else cand.min()
                hit = cand == best
                td[p] = np.sum(np.concatenate([[td[p]], tw[seg]])[hit]) / np.sum(hit)
        return [td.reshape(inputs[0].shape)]

    def _radius(inputs, attrs):
        if attrs["reduction"] not in ("max", "min"):
            return [None, None, None]
        d, t, w = _scatter_parts(op, inputs, attrs)
        sign = 1.0 if attrs["reduction"] == "max" else -1.0
        rd, rw = np.full(d.shape, np.inf), np.full(w.shape, np.inf)
        for seg in _segments(t):
            p = t[seg[0]]
            r = selection_radius(sign * np.concatenate([[d[p]], w[seg]]))
            rd[p], rw[seg] = r[0], r[1:]
        return [rd.reshape(inputs[0].shape), None, rw.reshape(inputs[2].shape)]

    def _undefined(inputs, attrs, kind):
        """Reduction none with duplicate targets: the forward's undefined cells (OpSpec.undefined,
        scatter_undefined) make undefined the updates that write them (which one wins is
        unspecified, so which gets the cotangent is too), the data elements under them and, for
        a JVP, the output cells themselves."""
        data, _, updates = inputs
        if attrs["reduction"] != "none":
            return [None] if kind == "jvp" else [None, None, None]
        t = scatter_targets(op, data, inputs[1], updates, attrs)
        dup = np.bincount(t, minlength=data.size) > 1
        if kind == "jvp":
            return [dup.reshape(data.shape)]
        return [dup.reshape(data.shape), None, dup[t].reshape(updates.shape)]

    vjp(op, convention="indices have no derivative; reduction none: duplicate targets are "
        "undefined (masked), so are their derivatives; max/min: ties share the cotangent equally "
        "(as reduce_max)", radius=_radius)(_vjp)
    jvp(op)(_jvp)
    BACKEND.undefined_derivative(op)(_undefined)


_scatter_rules("onnx.ScatterElements")
_scatter_rules("onnx.ScatterND")


def _scatter_magnitude(op: str) -> None:
    """none/add: coefficients 0 or 1; mul: products of data and updates (_grad.multilinear);
    max/min select with tie shares (_grad.selection), a cell among its data and every update."""
    lin = multilinear(op)
    sel = selection(op, lambda xs, attrs, kind: xs[2].size + 1)

    def magnitude(inputs, attrs, kind, seeds):
        return (sel if attrs["reduction"] in ("max", "min") else lin)(inputs, attrs, kind, seeds)

    BACKEND.magnitude(op)(magnitude)


_scatter_magnitude("onnx.ScatterElements")
_scatter_magnitude("onnx.ScatterND")


@vjp("rlx_sparse.mat_vec", convention="the CSR structure (col_idx, row_ptr) has no derivative")
def mat_vec_vjp(inputs, attrs, cots):
    """y = A x: d/d values_k = u[row k] x[col k], d/dx = Aᵀ u."""
    values, col_idx, row_ptr, x = inputs
    rows, cols = csr.row_ids(row_ptr), col_idx.astype(np.int64)
    u = cots[0]
    return [u[rows] * x[cols], None, None, np.bincount(cols, values * u[rows], minlength=x.size)]


@jvp("rlx_sparse.mat_vec")
def mat_vec_jvp(inputs, attrs, tans):
    values, col_idx, row_ptr, x = inputs
    tv, tx = tans[0], tans[3]
    return [_a(tv, col_idx, row_ptr, x.size) @ x + _a(values, col_idx, row_ptr, x.size) @ tx]


@vjp("rlx_sparse.values_grad")
def values_grad_vjp(inputs, attrs, cots):
    """out_k = u[row k] v[col k]: d/du sums w v[col] per row, d/dv sums w u[row] per column."""
    col_idx, row_ptr, u, v = inputs
    rows, cols = csr.row_ids(row_ptr), col_idx.astype(np.int64)
    w = cots[0]
    return [None, None, np.bincount(rows, w * v[cols], minlength=u.size),
            np.bincount(cols, w * u[rows], minlength=v.size)]


@jvp("rlx_sparse.values_grad")
def values_grad_jvp(inputs, attrs, tans):
    col_idx, row_ptr, u, v = inputs
    rows, cols = csr.row_ids(row_ptr), col_idx.astype(np.int64)
    return [tans[2][rows] * v[cols] + u[rows] * tans[3][cols]]


for _op in ("rlx_sparse.mat_vec", "rlx_sparse.values_grad"):  # bilinear (_grad.multilinear)
    BACKEND.magnitude(_op)(multilinear(_op))


def _sparse_dense(values, col_idx, row_ptr, n) -> np.ndarray:
    return _a(values, col_idx, row_ptr, n).toarray()


def _solve_rules(op: str, convention: str) -> None:
    """x = A⁻¹ b by implicit differentiation (A x = b): gb = A⁻ᵀ u (a transposed solve),
    d/d values_k = -gb[row k] x[col k] (only A's stored entries: the CSR structure is fixed);
    dx = A⁻¹ (db - dA x), dA the tangent's values on A's structure. Every solve is sparse LU in
    float64 (csr.lu_solve), whatever algorithm the op's forward runs."""
    def _system(inputs):
        values, col_idx, row_ptr, b = inputs
        a = _a(values, col_idx, row_ptr, b.size)
        return a, csr.lu_solve(a, b, op)

    def _vjp(inputs, attrs, cots):
        _, col_idx, row_ptr, _ = inputs
        a, x = _system(inputs)
        gb = csr.lu_solve(a.T.tocsr(), cots[0], op)
        return [-gb[csr.row_ids(row_ptr)] * x[col_idx.astype(np.int64)], None, None, gb]

    def _jvp(inputs, attrs, tans):
        _, col_idx, row_ptr, b = inputs
        a, x = _system(inputs)
        return [csr.lu_solve(a, tans[3] - _a(tans[0], col_idx, row_ptr, b.size) @ x, op)]

    vjp(op, convention=convention,
        radius=lambda xs, attrs: [_sparse_radius(*xs[:3], xs[3].size), None, None, None],
        condition=lambda xs, attrs: float(np.linalg.cond(_sparse_dense(*xs[:3], xs[3].size)))
        if xs[3].size else 1.0)(_vjp)
    jvp(op)(_jvp)


_solve_rules("rlx_sparse.lu_solve", "the CSR structure has no derivative; a singular A has none")
_solve_rules("rlx_sparse.cg_solve", "the derivative of the solution x* = A⁻¹ b that CG approximates "
             "(implicit differentiation, A symmetric so Aᵀ = A), not of the CG iterate's "
             "arithmetic; where CG does not converge within max_iter the output is an iterate, "
             "not x*, and the derivative is undefined (masked); the CSR structure has no derivative")


def _sparse_solve_parts(inputs, attrs, kind, seeds, skeel):
    """_grad.solve_magnitude on A as a dense matrix (the case sizes are small), A's part read at
    the stored entries. For cg_solve it is the magnitude of the solution's derivative, which is
    what the rules differentiate; CG's own stopping error is not a rounding and is not in it."""
    values, col_idx, row_ptr, b = inputs
    a = _sparse_dense(values, col_idx, row_ptr, b.size)
    rows, cols = csr.row_ids(row_ptr), col_idx.astype(np.int64)
    if not b.size:
        return [np.zeros(values.shape), None, None, np.zeros(b.shape)] if kind == "vjp" else [np.zeros(b.shape)]
    x = np.linalg.solve(a, b)[:, None]
    if kind == "vjp":
        mb, ma = solve_magnitude(a, x, kind, np.abs(seeds[0])[:, None], skeel=skeel)
        return [ma[rows, cols], None, None, mb[:, 0]]
    wa = np.abs(_sparse_dense(seeds[0], col_idx, row_ptr, b.size))
    return [solve_magnitude(a, x, kind, np.abs(seeds[3])[:, None], wa, skeel)[0][:, 0]]


def _sparse_solve_magnitude(inputs, attrs, kind, seeds):
    """The |J|-product plus the solves' rounding (SAVED_TERMS), as dense_solve's."""
    n = inputs[3].size
    mags = add_grads(_sparse_solve_parts(inputs, attrs, kind, seeds, False),
                     _sparse_solve_parts(inputs, attrs, kind, seeds, True))
    return mags, n * (n + 2)


for _op in ("rlx_sparse.lu_solve", "rlx_sparse.cg_solve"):
    BACKEND.magnitude(_op)(_sparse_solve_magnitude)
    SAVED_TERMS[_op] = functools.partial(_sparse_solve_parts, skeel=True)


@BACKEND.undefined_derivative("rlx_sparse.cg_solve")
def cg_solve_undefined(inputs, attrs, kind):
    """Everything, where the float64 reference CG (csr.cg, the forward's own run) does not
    converge: the convention above defines the derivative of x* only."""
    values, col_idx, row_ptr, b = inputs
    _, _, converged = csr.cg(_a(values, col_idx, row_ptr, b.size), b, attrs["max_iter"], attrs["tol"])
    if converged:
        return [None] * (1 if kind == "jvp" else 4)
    if kind == "jvp":
        return [np.ones(b.shape, bool)]
    return [np.ones(values.shape, bool), None, None, np.ones(b.shape, bool)]


def _sparse_radius(values, col_idx, row_ptr, n) -> np.ndarray:
    """sigma_min / sqrt(nnz): moving the stored entries by less keeps A nonsingular."""
    if not values.size:
        return np.full(values.shape, np.inf)
    s = np.linalg.svd(_sparse_dense(values, col_idx, row_ptr, n), compute_uv=False)
    return np.full(values.shape, s[-1] / np.sqrt(values.size))
