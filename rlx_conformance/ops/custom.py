"""Custom ops (docs/ops.md), declared through the extension API
(:func:`rlx_conformance.spec.custom_ops.custom_op`): four ONNX ops and four ``rlx_sparse`` ops.

ONNX ops follow the ONNX spec (ScatterElements/ScatterND opset 18, GatherND/GatherElements
opset 13), not RLX's deviations: indices in [-s, s-1], negative ones count from the end,
anything else is an error (checked on the host, :func:`check_*`: MLX does no bounds checking).
Index dtypes are ONNX's: int32 or int64 for the *Elements ops, int64 only for GatherND and
ScatterND.

Case generation (``generate`` hooks): a shape family is read as [data shape, index shape] with
an optional trailing [32] (indices drawn as int32, else int64), the convention of ops/shape.py.
The generator adapts the index shape to the swept attributes so that every combination is a
valid input: dims beyond the data's on non-axis dims are cut, duplicate indices are drawn only
with a reduction (ONNX leaves them undefined with "none"), GatherND's batch dims are copied from
the data. Sparse families are [[n, m]] (rows, columns) or [[n]] (square); the value class names
the matrix structure (see rlx_conformance/spec/csr.py).

The sparse ops take a CSR matrix as ``values`` [nnz] (float32/float64), ``col_idx`` [nnz] and
``row_ptr`` [n+1] (int32): row_ptr starts at 0, never decreases and ends at nnz, and every column
index is in [0, m); anything else is an error (checked on the host). Judging
(judge/custom_checks.py): gathers and scatters without reduction bit-exact, scatter reductions
within the accumulation-order error of the duplicates, mat_vec by the dot-product bound per row,
the solvers by normwise backward error and condition-scaled forward error.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.custom_checks import (
    cg_check,
    gather_check,
    lu_check,
    matvec_check,
    scatter_check,
    scatter_undefined,
    values_grad_check,
)
from rlx_conformance.spec import csr
from rlx_conformance.spec import infer as _infer
from rlx_conformance.spec.custom_ops import Codec, Field, custom_op
from rlx_conformance.spec.registry import Attr, Input
from rlx_conformance.spec.values import Stream, make_array, specials

Shape = tuple[int, ...]
REDUCTIONS = ("none", "add", "mul", "max", "min")
REDUCTION_CODES = tuple((r, i) for i, r in enumerate(REDUCTIONS))  # RLX: 0 none .. 4 min
INDEX_DTYPES = ("int64", "int32")
INT32_MARKER = (32,)
SPARSE_DTYPES = ("float64", "float32")


# -- shared helpers ------------------------------------------------------------------------------
def _marker(shapes: Sequence[Sequence[int]]) -> tuple[list[Shape], str]:
    """Split a structured family entry into its shapes and the index dtype."""
    shapes = [tuple(s) for s in shapes]
    if len(shapes) > 1 and shapes[-1] == INT32_MARKER:
        return shapes[:-1], "int32"
    return shapes, "int64"


def _rank1(op: str, shape: Shape, what: str) -> None:
    if len(shape) < 1:
        raise SpecError(f"{op}: {what} needs rank >= 1, got a scalar")


def check_range(op: str, idx: np.ndarray, size: int, what: str) -> None:
    """ONNX index rule: values in [-size, size-1]; anything else is an error, never clamped."""
    if idx.size and (int(idx.min()) < -size or int(idx.max()) >= size):
        bad = idx[(idx < -size) | (idx >= size)].flat[0]
        raise SpecError(f"{op}: index {int(bad)} out of range [{-size}, {size - 1}] for {what}")


def _domain(dtype: str, attrs: Mapping[str, Any]) -> str:
    """Products of many draws overflow: mul reductions draw floats near one."""
    return "near_one" if attrs.get("reduction") == "mul" and dt.is_float(dtype) else "real"


def _negate_some(s: Stream, idx: np.ndarray, size: np.ndarray | int) -> np.ndarray:
    """Spell about half the indices negatively (i - size), as ONNX allows."""
    return np.where(s.coin(idx.size).reshape(idx.shape), idx - size, idx)


def _distinct(s: Stream, cols: int, k: int, size: int) -> np.ndarray:
    """cols rows of k distinct values in [0, size): random permutation prefixes."""
    if cols == 0 or k == 0:
        return np.zeros((cols, k), np.int64)
    keys = s.raw(cols * size).reshape(cols, size)
    return np.argsort(keys, axis=1, kind="stable")[:, :k].astype(np.int64)


def _with_duplicates(s: Stream, cols: int, k: int, size: int) -> np.ndarray:
    """cols rows of k values in [0, size) with repeats (a quarter copy the row's first value)."""
    v = s.integers(cols * k, 0, size - 1).reshape(cols, k) if size else np.zeros((cols, k), np.int64)
    if k > 1:
        dup = (s.coin(cols * k) & s.coin(cols * k)).reshape(cols, k)
        v = np.where(dup, v[:, :1], v)
    return v


# -- ScatterElements -----------------------------------------------------------------------------
def infer_scatter_elements(spec, shapes, dtypes, attrs):
    data, idx, upd = shapes
    _rank1(spec.name, data, "data")
    ax = _infer.norm_axis(spec.name, attrs["axis"], len(data))
    if len(idx) != len(data):
        raise SpecError(f"{spec.name}: indices rank {len(idx)} != data rank {len(data)}")
    if tuple(upd) != tuple(idx):
        raise SpecError(f"{spec.name}: updates shape {upd} != indices shape {idx}")
    for d, (i, s) in enumerate(zip(idx, data)):
        if d != ax and i > s:
            raise SpecError(f"{spec.name}: indices dim {d} is {i}, larger than data's {s} "
                            f"(only the axis dim {ax} may exceed it)")
    return [(tuple(data), dtypes[0])]


def check_scatter_elements(inputs, attrs):
    data, idx, _ = inputs
    ax = attrs["axis"] % data.ndim
    check_range("onnx.ScatterElements", idx, data.shape[ax], f"axis {ax} of size {data.shape[ax]}")


def gen_scatter_elements(stream, shapes, dtype, attrs, vals):
    (data_shape, req), idt = _marker(shapes)
    r = len(data_shape)
    ax = attrs["axis"] % r
    s = data_shape[ax]
    none = attrs["reduction"] == "none"
    ishape = [min(q, d) if (i != ax or none) else q for i, (q, d) in enumerate(zip(req, data_shape))]
    if s == 0:
        ishape[ax] = 0
    k = ishape[ax]
    cols = math.prod(ishape) // k if k else 0
    st = stream(1)
    moved = _distinct(st, cols, k, s) if none else _with_duplicates(st, cols, k, s)
    other = [d for i, d in enumerate(ishape) if i != ax]
    idx = np.moveaxis(moved.reshape(other + [k]), -1, ax)
    idx = _negate_some(st, idx, s).astype(idt)
    dom = _domain(dtype, attrs)
    data = make_array(stream(0), tuple(data_shape), dtype, dom, vals, attrs)
    upd = make_array(stream(2), tuple(ishape), dtype, dom, vals, attrs)
    return [data, idx, upd]


def _scatter_elements_errors():
    x = np.zeros((3, 4), np.float32)
    i = np.array([[0, 1]], np.int64)
    u = np.ones((1, 2), np.float32)
    return [
        ("index past the end", [x, np.array([[0, 4]], np.int64), u], {"axis": 1}),
        ("index before -size", [x, np.array([[-4, 0]], np.int32), u], {"axis": 0}),
        ("float indices", [x, i.astype(np.float32), u], {"axis": 0}),
        ("int16 indices", [x, i.astype(np.int16), u], {"axis": 0}),
        ("updates shape != indices shape", [x, i, np.ones((2, 2), np.float32)], {"axis": 0}),
        ("indices rank != data rank", [x, np.array([0, 1], np.int64), np.ones(2, np.float32)], {}),
        ("indices wider than data off the axis", [x, np.zeros((1, 5), np.int64),
                                                  np.ones((1, 5), np.float32)], {"axis": 0}),
        ("axis out of range", [x, i, u], {"axis": 2}),
        ("unknown reduction", [x, i, u], {"reduction": "mean"}),
        ("updates dtype != data dtype", [x, i, u.astype(np.float64)], {}),
    ]


custom_op(
    "onnx.ScatterElements",
    doc="ONNX ScatterElements (opset 18): out = copy(data); out[idx with axis coord = "
        "indices[idx]] = updates[idx], or reduced into it with add/mul/max/min (every "
        "duplicate applied; NaN propagates through max/min)",
    inputs=(Input("data", ranks=(1, None)), Input("indices", dtypes=INDEX_DTYPES, role="index", ranks=(1, None)),
            Input("updates", ranks=(1, None))),
    attrs=(Attr("axis", "int", default=0, sweep="axis"),
           Attr("reduction", "enum", default="none", choices=REDUCTIONS, sweep=REDUCTIONS)),
    codec=Codec((Field("axis", "i32"), Field("reduction", "i32", REDUCTION_CODES))),
    dtypes=dt.ALL, infer=infer_scatter_elements, check_values=check_scatter_elements,
    shapes="scatter_elements", values=("random", "special"), generate=gen_scatter_elements,
    error_inputs=_scatter_elements_errors, policy=scatter_check("onnx.ScatterElements"),
    undefined=scatter_undefined("onnx.ScatterElements"),
)


# -- GatherElements ------------------------------------------------------------------------------
def infer_gather_elements(spec, shapes, dtypes, attrs):
    data, idx = shapes
    _rank1(spec.name, data, "data")
    ax = _infer.norm_axis(spec.name, attrs["axis"], len(data))
    if len(idx) != len(data):
        raise SpecError(f"{spec.name}: indices rank {len(idx)} != data rank {len(data)}")
    for d, (i, s) in enumerate(zip(idx, data)):
        if d != ax and i > s:
            raise SpecError(f"{spec.name}: indices dim {d} is {i}, larger than data's {s} "
                            f"(only the axis dim {ax} may exceed it)")
    return [(tuple(idx), dtypes[0])]


def check_gather_elements(inputs, attrs):
    data, idx = inputs
    ax = attrs["axis"] % data.ndim
    check_range("onnx.GatherElements", idx, data.shape[ax], f"axis {ax} of size {data.shape[ax]}")


def gen_gather_elements(stream, shapes, dtype, attrs, vals):
    (data_shape, req), idt = _marker(shapes)
    ax = attrs["axis"] % len(data_shape)
    s = data_shape[ax]
    ishape = tuple(q if i == ax else min(q, d) for i, (q, d) in enumerate(zip(req, data_shape)))
    if s == 0:
        ishape = ishape[:ax] + (0,) + ishape[ax + 1:]
    st = stream(1)
    n = math.prod(ishape)
    idx = st.integers(n, -s, s - 1).reshape(ishape) if s else np.zeros(ishape, np.int64)
    data = make_array(stream(0), tuple(data_shape), dtype, "real", vals, attrs)
    return [data, idx.astype(idt)]


def _gather_elements_errors():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    return [
        ("index past the end", [x, np.array([[0, 3]], np.int64)], {"axis": 0}),
        ("index before -size", [x, np.array([[-5]], np.int32)], {"axis": 1}),
        ("float indices", [x, np.array([[0.0]], np.float32)], {"axis": 0}),
        ("indices rank != data rank", [x, np.array([0], np.int64)], {"axis": 0}),
        ("indices wider than data off the axis", [x, np.zeros((1, 5), np.int64)], {"axis": 0}),
        ("axis out of range", [x, np.zeros((1, 1), np.int64)], {"axis": -3}),
    ]


custom_op(
    "onnx.GatherElements",
    doc="ONNX GatherElements (opset 13): out[idx] = data[idx with axis coord = indices[idx]]",
    inputs=(Input("data", ranks=(1, None)), Input("indices", dtypes=INDEX_DTYPES, role="index", ranks=(1, None))),
    attrs=(Attr("axis", "int", default=0, sweep="axis"),),
    codec=Codec((Field("axis", "i32"),)),
    dtypes=dt.ALL, infer=infer_gather_elements, check_values=check_gather_elements,
    shapes="gather_elements", values=("special",), generate=gen_gather_elements,
    error_inputs=_gather_elements_errors, policy=gather_check("onnx.GatherElements"),
    low_precision="native",
)


# -- GatherND ------------------------------------------------------------------------------------
def infer_gather_nd(spec, shapes, dtypes, attrs):
    data, idx = shapes
    b = attrs["batch_dims"]
    r, q = len(data), len(idx)
    if r < 1 or q < 1:
        raise SpecError(f"{spec.name}: data and indices need rank >= 1 (got {r} and {q})")
    if not 0 <= b < min(q, r):
        raise SpecError(f"{spec.name}: batch_dims {b} must be in [0, min(rank(indices), "
                        f"rank(data))) = [0, {min(q, r)})")
    if tuple(data[:b]) != tuple(idx[:b]):
        raise SpecError(f"{spec.name}: the first {b} dims of data {data} and indices {idx} differ")
    k = idx[-1]
    if not 1 <= k <= r - b:
        raise SpecError(f"{spec.name}: indices.shape[-1] = {k} must be in [1, rank(data) - "
                        f"batch_dims] = [1, {r - b}]")
    return [(tuple(idx[:-1]) + tuple(data[b + k:]), dtypes[0])]


def check_gather_nd(inputs, attrs):
    data, idx = inputs
    b = attrs["batch_dims"]
    for j in range(idx.shape[-1]):
        s = data.shape[b + j]
        check_range("onnx.GatherND", idx[..., j], s, f"data dim {b + j} of size {s}")


def gen_gather_nd(stream, shapes, dtype, attrs, vals):
    """Family [data shape, middle dims + [k]]: indices = data.shape[:b] + middle + [k'] with
    k' = min(k, r - b), so each batch_dims in the sweep gets a valid input."""
    (data_shape, req), _ = _marker(shapes)
    b = attrs["batch_dims"]
    r = len(data_shape)
    k = min(req[-1], r - b)
    ishape = tuple(data_shape[:b]) + tuple(req[:-1]) + (k,)
    st = stream(1)
    lead = math.prod(ishape[:-1])
    sizes = np.array(data_shape[b:b + k], np.int64)
    idx = (st.integers(lead * k, 0, 2**40) % np.tile(sizes, lead)).reshape(ishape)
    idx = _negate_some(st, idx, sizes)
    data = make_array(stream(0), tuple(data_shape), dtype, "real", vals, attrs)
    return [data, idx.astype(np.int64)]


def _gather_nd_batch_dims(shapes) -> range:
    """0, 1, 2, as far as the family's data rank allows (batch_dims < rank(data)): rank-1 data
    (a vector) gets 0 alone, rank-2 data (an embedding table) 0 and 1."""
    return range(min(3, len(shapes[0])))  # shapes: [data shape, index spec]


def _gather_nd_errors():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    return [
        ("index past the end", [x, np.array([[1, 3]], np.int64)], {}),
        ("index before -size", [x, np.array([[-3]], np.int64)], {}),
        ("int32 indices (ONNX GatherND takes int64 only)", [x, np.array([[0]], np.int32)], {}),
        ("index depth > rank - batch_dims", [x, np.zeros((2, 3), np.int64)], {"batch_dims": 1}),
        ("index depth 0", [x, np.zeros((2, 0), np.int64)], {}),
        ("batch dims differ", [x, np.zeros((3, 1), np.int64)], {"batch_dims": 1}),
        ("batch_dims >= rank(indices)", [x, np.zeros((2,), np.int64)], {"batch_dims": 1}),
        ("negative batch_dims", [x, np.zeros((1, 1), np.int64)], {"batch_dims": -1}),
    ]


custom_op(
    "onnx.GatherND",
    doc="ONNX GatherND (opset 13): slices data[batch, indices[batch, ..., :]] for each index "
        "tuple; out shape = indices.shape[:-1] + data.shape[batch_dims + k:]",
    inputs=(Input("data", ranks=(1, None)), Input("indices", dtypes=("int64",), role="index", ranks=(1, None))),
    attrs=(Attr("batch_dims", "int", default=0, sweep=_gather_nd_batch_dims),),
    codec=Codec((Field("batch_dims", "i32"),)),
    dtypes=dt.ALL, infer=infer_gather_nd, check_values=check_gather_nd,
    shapes="gather_nd", values=("special",), generate=gen_gather_nd,
    error_inputs=_gather_nd_errors, policy=gather_check("onnx.GatherND"),
    low_precision="native",
)


# -- ScatterND -----------------------------------------------------------------------------------
def infer_scatter_nd(spec, shapes, dtypes, attrs):
    data, idx, upd = shapes
    r, q = len(data), len(idx)
    if r < 1 or q < 1:
        raise SpecError(f"{spec.name}: data and indices need rank >= 1 (got {r} and {q})")
    k = idx[-1]
    if not 1 <= k <= r:
        raise SpecError(f"{spec.name}: indices.shape[-1] = {k} must be in [1, rank(data)] = [1, {r}]")
    want = tuple(idx[:-1]) + tuple(data[k:])
    if tuple(upd) != want:
        raise SpecError(f"{spec.name}: updates shape {tuple(upd)} must be indices.shape[:-1] + "
                        f"data.shape[k:] = {want}")
    return [(tuple(data), dtypes[0])]


def check_scatter_nd(inputs, attrs):
    data, idx, _ = inputs
    for j in range(idx.shape[-1]):
        s = data.shape[j]
        check_range("onnx.ScatterND", idx[..., j], s, f"data dim {j} of size {s}")


def gen_scatter_nd(stream, shapes, dtype, attrs, vals):
    """Family [data shape, middle dims + [k]]: P = prod(middle) index tuples of length k; with
    reduction none they are distinct (P is cut to the number of slots), else repeats are drawn."""
    (data_shape, req), _ = _marker(shapes)
    r = len(data_shape)
    k = min(req[-1], r)
    slots = math.prod(data_shape[:k])
    middle = list(req[:-1])
    p = math.prod(middle)
    st = stream(1)
    if attrs["reduction"] == "none":
        if p > slots:
            middle = [slots]
            p = slots
        flat = _distinct(st, 1, p, slots)[0] if p else np.zeros(0, np.int64)
    else:
        flat = _with_duplicates(st, 1, p, slots)[0] if p else np.zeros(0, np.int64)
    tup = np.stack(np.unravel_index(flat, data_shape[:k]), axis=-1) if p else np.zeros((0, k), np.int64)
    idx = _negate_some(st, tup.reshape(middle + [k]), np.array(data_shape[:k], np.int64))
    dom = _domain(dtype, attrs)
    data = make_array(stream(0), tuple(data_shape), dtype, dom, vals, attrs)
    upd = make_array(stream(2), tuple(middle) + tuple(data_shape[k:]), dtype, dom, vals, attrs)
    return [data, idx.astype(np.int64), upd]


def _scatter_nd_errors():
    x = np.zeros((3, 4), np.float32)
    return [
        ("index past the end", [x, np.array([[0, 4]], np.int64), np.ones(1, np.float32)], {}),
        ("index before -size", [x, np.array([[-4]], np.int64), np.ones((1, 4), np.float32)], {}),
        ("int32 indices (ONNX ScatterND takes int64 only)",
         [x, np.array([[0]], np.int32), np.ones((1, 4), np.float32)], {}),
        ("index depth > rank", [x, np.zeros((1, 3), np.int64), np.ones(1, np.float32)], {}),
        ("updates shape wrong", [x, np.zeros((2, 1), np.int64), np.ones((2, 3), np.float32)], {}),
        ("unknown reduction", [x, np.zeros((1, 2), np.int64), np.ones(1, np.float32)],
         {"reduction": "sum"}),
    ]


custom_op(
    "onnx.ScatterND",
    doc="ONNX ScatterND (opset 18): out = copy(data); out[indices[i]] = updates[i] (a slice "
        "when k < rank), or reduced into it with add/mul/max/min",
    inputs=(Input("data", ranks=(1, None)), Input("indices", dtypes=("int64",), role="index", ranks=(1, None)),
            Input("updates")),
    attrs=(Attr("reduction", "enum", default="none", choices=REDUCTIONS, sweep=REDUCTIONS),),
    codec=Codec((Field("reduction", "i32", REDUCTION_CODES),)),
    dtypes=dt.ALL, infer=infer_scatter_nd, check_values=check_scatter_nd,
    shapes="scatter_nd", values=("random", "special"), generate=gen_scatter_nd,
    error_inputs=_scatter_nd_errors, policy=scatter_check("onnx.ScatterND"),
    undefined=scatter_undefined("onnx.ScatterND"),
)


# -- rlx_sparse ----------------------------------------------------------------------------------
def _csr_shapes(op: str, values: Shape | None, col: Shape, rp: Shape) -> int:
    """Shape rules of a CSR triplet; returns n (rows)."""
    if len(col) != 1 or len(rp) != 1 or (values is not None and len(values) != 1):
        raise SpecError(f"{op}: values, col_idx and row_ptr must be 1-D")
    if values is not None and values[0] != col[0]:
        raise SpecError(f"{op}: values has {values[0]} entries, col_idx {col[0]} (both nnz)")
    if rp[0] < 1:
        raise SpecError(f"{op}: row_ptr has n+1 >= 1 entries, got 0")
    return rp[0] - 1


def _vector(op: str, name: str, shape: Shape, n: int | None = None) -> int:
    if len(shape) != 1:
        raise SpecError(f"{op}: {name} must be 1-D, got shape {shape}")
    if n is not None and shape[0] != n:
        raise SpecError(f"{op}: {name} has {shape[0]} entries, the matrix has {n} rows")
    return shape[0]


def infer_mat_vec(spec, shapes, dtypes, attrs):
    values, col, rp, x = shapes
    n = _csr_shapes(spec.name, values, col, rp)
    _vector(spec.name, "x", x)
    return [((n,), dtypes[0])]


def infer_square_solve(spec, shapes, dtypes, attrs):
    values, col, rp, b = shapes
    n = _csr_shapes(spec.name, values, col, rp)
    if n < 1:
        raise SpecError(f"{spec.name}: the matrix is 0 x 0")
    _vector(spec.name, "b", b, n)
    if spec.name == "rlx_sparse.cg_solve":
        if not (attrs["tol"] > 0 and math.isfinite(attrs["tol"])):
            raise SpecError(f"{spec.name}: tol = {attrs['tol']} must be finite and > 0")
        if not 0 <= attrs["max_iter"] < 2**32:
            raise SpecError(f"{spec.name}: max_iter = {attrs['max_iter']} must fit a u32")
    return [((n,), dtypes[0])]


def infer_values_grad(spec, shapes, dtypes, attrs):
    col, rp, u, v = shapes
    n = _csr_shapes(spec.name, None, col, rp)
    _vector(spec.name, "u", u, n)
    _vector(spec.name, "v", v)
    return [((col[0],), dtypes[2])]


def check_mat_vec(inputs, attrs):
    _, col, rp, x = inputs
    csr.check_structure("rlx_sparse.mat_vec", col, rp, x.shape[0])


def check_values_grad(inputs, attrs):
    col, rp, _, v = inputs
    csr.check_structure("rlx_sparse.values_grad", col, rp, v.shape[0])


def _check_square(op):
    def check(inputs, attrs):
        _, col, rp, _ = inputs
        n = rp.shape[0] - 1
        csr.check_structure(op, col, rp, n)
        empty = np.flatnonzero(np.diff(rp.astype(np.int64)) == 0)
        if empty.size:
            raise SpecError(f"{op}: the matrix is singular (row {int(empty[0])} is empty)")
        if col.size and np.unique(col).size < n:
            missing = np.setdiff1d(np.arange(n), col)[0]
            raise SpecError(f"{op}: the matrix is singular (column {int(missing)} is empty)")
    return check


def _pool(dtype: str) -> np.ndarray:
    return specials(dtype, "real", {}).astype(np.float64)


def _vec(s: Stream, n: int, dtype: str, vals: str) -> np.ndarray:
    v = s.uniform(n, -1.0, 1.0)
    if vals == "special" and n:
        pool = _pool(dtype)
        v = np.where(s.coin(n), pool[s.choice(n, pool.size)], v)
    with np.errstate(over="ignore"):
        return v.astype(dt.np_dtype(dtype))


def _nm(shapes) -> tuple[int, int]:
    (shape,) = [tuple(s) for s in shapes]
    return (shape[0], shape[-1])


def gen_mat_vec(stream, shapes, dtype, attrs, vals):
    n, m = _nm(shapes)
    v, c, rp = csr.general(stream(0), n, m, vals, _pool(dtype), dtype)
    return [v, c, rp, _vec(stream(3), m, dtype, vals)]


def gen_values_grad(stream, shapes, dtype, attrs, vals):
    n, m = _nm(shapes)
    _, c, rp = csr.general(stream(0), n, m, vals, _pool(dtype), dtype)
    return [c, rp, _vec(stream(2), n, dtype, vals), _vec(stream(3), m, dtype, vals)]


def gen_square(stream, shapes, dtype, attrs, vals):
    """A square CSR of the class ``vals`` and a right-hand side of unit 2-norm (so cg_solve's
    absolute tol is relative to ||b||)."""
    n, _ = _nm(shapes)
    v, c, rp = csr.square(stream(0), n, vals, dtype)
    b = stream(3).uniform(n, -1.0, 1.0)
    b = b / max(np.linalg.norm(b), 1e-300)
    return [v, c, rp, b.astype(dt.np_dtype(dtype))]


def _csr_errors(op: str, square: bool):
    f = np.float64
    v = np.array([2.0, 1.0, 3.0], f)
    c = np.array([0, 1, 1], np.int32)
    rp = np.array([0, 2, 3], np.int32)
    x = np.ones(2, f)

    def case(desc, vv, cc, rr, xx, attrs=None):
        ins = [cc, rr, xx, xx] if op == "rlx_sparse.values_grad" else [vv, cc, rr, xx]
        return (desc, ins, dict(attrs or {}))
    out = [
        case("row_ptr not monotone", v, c, np.array([0, 3, 2], np.int32), x),
        case("row_ptr[0] != 0", v, c, np.array([1, 2, 3], np.int32), x),
        case("row_ptr[-1] != nnz", v, c, np.array([0, 1, 2], np.int32), x),
        case("col_idx out of range", v, np.array([0, 2, 1], np.int32), rp, x),
        case("negative col_idx", v, np.array([0, -1, 1], np.int32), rp, x),
        case("int64 col_idx", v, c.astype(np.int64), rp, x),
        case("float row_ptr", v, c, rp.astype(np.float32), x),
    ]
    if op != "rlx_sparse.mat_vec":  # n is fixed by u or b: row_ptr must have n+1 entries
        out.append(case("row_ptr of the wrong length", v, c, np.array([0, 1, 2, 3], np.int32), x))
    if op != "rlx_sparse.values_grad":
        out.append(case("values and col_idx lengths differ", v[:2], c, rp, x))
    if square:
        attrs = {"max_iter": 10, "tol": 1e-8} if op == "rlx_sparse.cg_solve" else {}
        out = [(d, i, attrs) for d, i, _ in out]
        out += [
            ("singular: an empty row", [np.array([1.0], f), np.array([0], np.int32),
                                        np.array([0, 1, 1], np.int32), x], attrs),
            ("b of the wrong length", [v, c, rp, np.ones(3, f)], attrs),
        ]
        if op == "rlx_sparse.lu_solve":
            out.append(("singular: two equal rows", [np.array([1.0, 2.0, 1.0, 2.0], f),
                                                     np.array([0, 1, 0, 1], np.int32),
                                                     np.array([0, 2, 4], np.int32), x], {}))
        else:
            out += [("tol = 0", [v, c, rp, x], {"max_iter": 10, "tol": 0.0}),
                    ("negative max_iter", [v, c, rp, x], {"max_iter": -1, "tol": 1e-8})]
    return out


_CSR_INPUTS = (Input("values", ranks=(1, 1)), Input("col_idx", dtypes=("int32",), role="index", ranks=(1, 1)),
               Input("row_ptr", dtypes=("int32",), role="index", ranks=(1, 1)))

custom_op(
    "rlx_sparse.mat_vec",
    doc="y[r] = sum over row r's entries k of values[k] * x[col_idx[k]] (x has one entry per column)",
    inputs=_CSR_INPUTS + (Input("x", ranks=(1, 1)),), infer=infer_mat_vec, check_values=check_mat_vec,
    shapes="csr", values=("random", "empty_rows", "dense_rows", "special"), generate=gen_mat_vec,
    error_inputs=lambda: _csr_errors("rlx_sparse.mat_vec", False), policy=matvec_check(),
    dtypes=SPARSE_DTYPES, low_precision="native",
)

custom_op(
    "rlx_sparse.values_grad",
    doc="out[k] = u[row(k)] * v[col_idx[k]] (the gradient of u^T A v w.r.t. A's stored values)",
    inputs=(Input("col_idx", dtypes=("int32",), role="index", ranks=(1, 1)),
            Input("row_ptr", dtypes=("int32",), role="index", ranks=(1, 1)), Input("u", ranks=(1, 1)),
            Input("v", ranks=(1, 1))),
    infer=infer_values_grad, check_values=check_values_grad, shapes="csr",
    values=("random", "empty_rows", "dense_rows", "special"), generate=gen_values_grad,
    error_inputs=lambda: _csr_errors("rlx_sparse.values_grad", False),
    policy=values_grad_check(), dtypes=SPARSE_DTYPES, low_precision="native",
)

custom_op(
    "rlx_sparse.lu_solve",
    doc="x = A^-1 b for square CSR A (sparse LU with partial pivoting); a singular A is an error",
    inputs=_CSR_INPUTS + (Input("b", ranks=(1, 1)),), infer=infer_square_solve,
    check_values=_check_square("rlx_sparse.lu_solve"), shapes="csr_square",
    values=("dominant", "pivot", "spd", "ill"), generate=gen_square,
    error_inputs=lambda: _csr_errors("rlx_sparse.lu_solve", True), policy=lu_check(),
    dtypes=SPARSE_DTYPES, low_precision="native",
)

custom_op(
    "rlx_sparse.cg_solve",
    doc="conjugate gradient for SPD A from x0 = 0: stop when ||r||_2 < tol (the recursively "
        "updated residual) or after max_iter iterations",
    inputs=_CSR_INPUTS + (Input("b", ranks=(1, 1)),), infer=infer_square_solve,
    attrs=(Attr("max_iter", "int", default=1000, sweep=(5, 100)),
           Attr("tol", "float", default=1e-8, sweep=(1e-4, 1e-9))),
    codec=Codec((Field("max_iter", "u32"), Field("tol", "f64"))),
    check_values=_check_square("rlx_sparse.cg_solve"), shapes="csr_spd",
    values=("spd", "ill"), generate=gen_square,
    error_inputs=lambda: _csr_errors("rlx_sparse.cg_solve", True), policy=cg_check(),
    dtypes=SPARSE_DTYPES, low_precision="native",
)
