"""Shape and data movement (docs/ops.md): reshape, transpose, narrow, slice, concat, expand,
gather, reverse, pad, tile, trilu, scatter_add, one_hot, non_zero.

Every op here but scatter_add moves or selects values without arithmetic, so results are judged
bit-exact (signed zeros included) and float16/bfloat16 stay in their own dtype
(low_precision="native"). scatter_add accumulates: its floats are judged by a summation bound.

Attributes that only make sense for some input shapes (perm, new_shape, pads...) are swept as
explicit value lists; the case generator keeps the combinations that the op's inference accepts
for each shape family (an invalid one raises SpecError and is dropped), so one list serves
families of several ranks. Ops with structured inputs (indices in range) use ``generate``; their
shape families may end with the marker entry ``[32]``, meaning "draw the indices as int32"
(int64 otherwise), since the case's type variable is the data dtype, not the index dtype.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds.shape import scatter_add_bound
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    EXACT_SZ,
    Attr,
    CheckValues,
    ErrorInputs,
    Generate,
    Infer,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)
from rlx_conformance.spec.values import make_array

Shape = tuple[int, ...]
INDEX_DTYPES = ("int64", "int32")
INT32_MARKER = (32,)  # trailing shape-family entry: draw indices as int32


@declaration_helper
def layout(name: str, doc: str, *, inputs: tuple[Input, ...], infer: Infer, shapes: str,
           attrs: tuple[Attr, ...] = (), generate: Generate | None = None,
           check_values: CheckValues | None = None, error_inputs: ErrorInputs | None = None,
           uncovered: tuple[tuple[str, str], ...] = ()) -> OpSpec:
    """A layout op: every dtype, values moved unchanged (bit-exact, signed zeros included),
    float16/bfloat16 kept in their dtype. Layout ops have no value-dependent code paths: the
    "special" class (half random draws, half NaN/inf/signed zeros/subnormals/extremes) checks
    that every bit pattern moves unchanged."""
    return declare(name=name, family="shape", doc=doc, inputs=inputs, dtypes=dt.ALL, attrs=attrs,
                   infer=infer, shapes=shapes, values=("special",), policy=EXACT_SZ,
                   low_precision="native", generate=generate, check_values=check_values,
                   error_inputs=error_inputs, uncovered=uncovered)


def _rank_at_least(op: str, shape: Shape, r: int) -> None:
    if len(shape) < r:
        raise SpecError(f"{op}: needs rank >= {r}, got shape {shape}")


# Error inputs (validate's error-input parity; docs/ops.md: bad shapes/ranks,
# out-of-range axes and indices, wrong index dtypes, unknown attribute values): each a
# (description, inputs, attrs) that every backend must reject.
def _x(*shape: int, dtype: str = "float32") -> np.ndarray:
    return np.arange(math.prod(shape), dtype=dt.np_dtype(dtype)).reshape(shape)


# -- reshape -------------------------------------------------------------------------------------
def infer_reshape(spec, shapes, dtypes, attrs):
    """numpy rules: one -1 inferred from the element count; 0 is a literal zero-size dim."""
    (shape,), new = shapes, attrs["new_shape"]
    if any(d < -1 for d in new) or sum(d == -1 for d in new) > 1:
        raise SpecError(f"{spec.name}: new_shape {new} may hold sizes >= 0 and at most one -1")
    n, known = math.prod(shape), math.prod(d for d in new if d != -1)
    if -1 in new:
        if known == 0 or n % known:
            raise SpecError(f"{spec.name}: cannot infer -1 in {new} for {n} elements")
        new = tuple(n // known if d == -1 else d for d in new)
    elif known != n:
        raise SpecError(f"{spec.name}: new_shape {new} has {known} elements, the input {shape} has {n}")
    return [(tuple(new), dtypes[0])]


layout("reshape", "same elements in row-major order, new shape (one -1 inferred)",
       inputs=(Input("x"),), infer=infer_reshape, shapes="reshape",
       attrs=(Attr("new_shape", "ints", sweep=((-1,), (4, -1), (3, 1, 8), ())),),
       error_inputs=lambda: [("element count differs", [_x(2, 3)], {"new_shape": (4, 2)}),
                             ("two -1s", [_x(2, 3)], {"new_shape": (-1, -1)}),
                             ("-1 cannot be inferred", [_x(2, 3)], {"new_shape": (4, -1)}),
                             ("size below -1", [_x(2, 3)], {"new_shape": (-2, -3)})])


# -- transpose -----------------------------------------------------------------------------------
def infer_transpose(spec, shapes, dtypes, attrs):
    (shape,), perm = shapes, attrs["perm"]
    if sorted(perm) != list(range(len(shape))):
        raise SpecError(f"{spec.name}: perm {perm} is not a permutation of the {len(shape)} axes")
    return [(tuple(shape[p] for p in perm), dtypes[0])]


layout("transpose", "out.shape[i] = x.shape[perm[i]]",
       inputs=(Input("x"),), infer=infer_transpose, shapes="transpose",
       attrs=(Attr("perm", "ints", sweep=((), (0,), (1, 0), (0, 2, 1), (2, 0, 1), (3, 1, 0, 2))),),
       error_inputs=lambda: [("repeated axis in perm", [_x(2, 3)], {"perm": (0, 0)}),
                             ("perm shorter than the rank", [_x(2, 3, 4)], {"perm": (1, 0)}),
                             ("perm entry out of range", [_x(2, 3)], {"perm": (0, 2)}),
                             ("negative perm entry", [_x(2, 3)], {"perm": (-1, 0)})])


# -- narrow and slice ----------------------------------------------------------------------------
def infer_narrow(spec, shapes, dtypes, attrs):
    """x[start:start+len] along axis; start may be negative (counted from the end)."""
    (shape,) = shapes
    _rank_at_least(spec.name, shape, 1)
    a = infer.norm_axis(spec.name, attrs["axis"], len(shape))
    d, start, n = shape[a], attrs["start"], attrs["len"]
    if not -d <= start <= d:
        raise SpecError(f"{spec.name}: start {start} out of range for axis {a} of size {d}")
    if n < 0:
        raise SpecError(f"{spec.name}: len {n} is negative")
    if (start + d if start < 0 else start) + n > d:
        raise SpecError(f"{spec.name}: start {start} + len {n} exceeds axis {a} of size {d}")
    return [(shape[:a] + (n,) + shape[a + 1:], dtypes[0])]


layout("narrow", "the len elements from start along axis (start < 0 counts from the end)",
       inputs=(Input("x", ranks=(1, None)),), infer=infer_narrow, shapes="narrow",
       attrs=(Attr("axis", "int", sweep=(0, -1)), Attr("start", "int", sweep=(1, -3)),
              Attr("len", "int", sweep=(0, 2))),
       error_inputs=lambda: [("start past the end", [_x(4, 3)], {"axis": 0, "start": 5, "len": 0}),
                             ("start + len past the end", [_x(4, 3)], {"axis": 0, "start": 2, "len": 3}),
                             ("negative len", [_x(4, 3)], {"axis": 1, "start": 0, "len": -1}),
                             ("axis out of range", [_x(4, 3)], {"axis": 2, "start": 0, "len": 1}),
                             ("scalar input", [_x()], {"axis": 0, "start": 0, "len": 0})])


def slice_indices(op: str, d: int, start: int, n: int, step: int) -> np.ndarray:
    """The len positions start, start+step, ... along an axis of size d (start < 0 from the end);
    every position must be inside the axis."""
    if step == 0:
        raise SpecError(f"{op}: step must be nonzero")
    if n < 0:
        raise SpecError(f"{op}: len {n} is negative")
    if not -d <= start < max(d, 1) or (n and not -d <= start < d):
        raise SpecError(f"{op}: start {start} out of range for an axis of size {d}")
    s = start + d if start < 0 else start
    idx = s + step * np.arange(n, dtype=np.int64)
    if n and not (0 <= idx[-1] < d):
        raise SpecError(f"{op}: start {start}, len {n}, step {step} reads position {int(idx[-1])} "
                        f"outside an axis of size {d}")
    return idx


def infer_slice(spec, shapes, dtypes, attrs):
    (shape,) = shapes
    _rank_at_least(spec.name, shape, 1)
    a = infer.norm_axis(spec.name, attrs["axis"], len(shape))
    slice_indices(spec.name, shape[a], attrs["start"], attrs["len"], attrs["step"])
    return [(shape[:a] + (attrs["len"],) + shape[a + 1:], dtypes[0])]


layout("slice", "out[i] = x[start + i*step] along axis for i < len (negative steps walk "
       "backwards; start < 0 counts from the end; every read position must be in range)",
       inputs=(Input("x", ranks=(1, None)),), infer=infer_slice, shapes="slice",
       attrs=(Attr("axis", "int", sweep=(0, -1)), Attr("start", "int", sweep=(0, -1)),
              Attr("len", "int", sweep=(3,)), Attr("step", "int", sweep=(1, 2, -1, -3))),
       error_inputs=lambda: [
           ("reads past the end", [_x(4, 3)], {"axis": 0, "start": 1, "len": 3, "step": 2}),
           ("negative step walks before 0", [_x(4, 3)], {"axis": 0, "start": 1, "len": 3, "step": -1}),
           ("zero step", [_x(4, 3)], {"axis": 0, "start": 0, "len": 2, "step": 0}),
           ("start before -size", [_x(4, 3)], {"axis": 1, "start": -4, "len": 1, "step": 1}),
           ("axis out of range", [_x(4, 3)], {"axis": -3, "start": 0, "len": 1, "step": 1})])


# -- concat, expand ------------------------------------------------------------------------------
def infer_concat(spec, shapes, dtypes, attrs):
    first = shapes[0]
    _rank_at_least(spec.name, first, 1)
    a = infer.norm_axis(spec.name, attrs["axis"], len(first))
    for k, s in enumerate(shapes[1:], 1):
        if len(s) != len(first) or any(s[i] != first[i] for i in range(len(s)) if i != a):
            raise SpecError(f"{spec.name}: input {k} has shape {s}, incompatible with {first} "
                            f"outside axis {a}")
    return [(first[:a] + (sum(s[a] for s in shapes),) + first[a + 1:], dtypes[0])]


layout("concat", "join the inputs along axis (one or more inputs)",
       inputs=(Input("xs", variadic=True, ranks=(1, None)),), infer=infer_concat, shapes="concat",
       attrs=(Attr("axis", "int", sweep=(0, -1)),),
       error_inputs=lambda: [("rank mismatch", [_x(2, 3), _x(2, 3, 1)], {"axis": 0}),
                             ("sizes differ off the axis", [_x(2, 3), _x(2, 4)], {"axis": 0}),
                             ("mixed dtypes", [_x(2, 3), _x(2, 3, dtype="float64")], {"axis": 0}),
                             ("axis out of range", [_x(2, 3), _x(2, 3)], {"axis": 2}),
                             ("scalar inputs", [_x(), _x()], {"axis": 0})])


def infer_expand(spec, shapes, dtypes, attrs):
    """numpy broadcast_to: the output shape is target_shape exactly."""
    (shape,), target = shapes, attrs["target_shape"]
    if any(d < 0 for d in target) or infer.broadcast(spec.name, [shape, target]) != tuple(target):
        raise SpecError(f"{spec.name}: {shape} does not broadcast to {target}")
    return [(tuple(target), dtypes[0])]


layout("expand", "broadcast x to target_shape (numpy broadcast_to)",
       inputs=(Input("x"),), infer=infer_expand, shapes="expand",
       attrs=(Attr("target_shape", "ints",
                   sweep=((4, 3, 5), (2, 1, 3, 5), (5, 0), (2, 3))),),
       error_inputs=lambda: [("not broadcastable", [_x(2, 3)], {"target_shape": (2, 4)}),
                             ("target of lower rank", [_x(2, 3)], {"target_shape": (3,)}),
                             ("negative target size", [_x(1, 3)], {"target_shape": (-1, 3)}),
                             ("shrinks a dim to 0", [_x(2, 3)], {"target_shape": (0, 3)})])


# -- reverse, tile, trilu ------------------------------------------------------------------------
def infer_reverse(spec, shapes, dtypes, attrs):
    infer.norm_axes(spec.name, attrs["axes"], len(shapes[0]))
    return [(shapes[0], dtypes[0])]


layout("reverse", "flip the listed axes (empty list: no axis, the identity)",
       inputs=(Input("x", ranks=(1, None)),), infer=infer_reverse, shapes="reverse",
       attrs=(Attr("axes", "ints", sweep=((0,), (-1,), (0, 2), (2, 0, 1))),),
       error_inputs=lambda: [("axis out of range", [_x(2, 3)], {"axes": (2,)}),
                             ("axis below -rank", [_x(2, 3)], {"axes": (-3,)}),
                             ("repeated axis", [_x(2, 3)], {"axes": (0, -2)})])


def infer_tile(spec, shapes, dtypes, attrs):
    (shape,), reps = shapes, attrs["reps"]
    if len(reps) != len(shape) or any(r < 0 for r in reps):
        raise SpecError(f"{spec.name}: reps {reps} needs one count >= 0 per axis of {shape}")
    return [(tuple(d * r for d, r in zip(shape, reps)), dtypes[0])]


layout("tile", "repeat the whole array reps[i] times along axis i (ONNX Tile)",
       inputs=(Input("x"),), infer=infer_tile, shapes="tile",
       attrs=(Attr("reps", "ints", sweep=((3,), (2, 3), (1, 0), (2, 1, 3), ())),),
       error_inputs=lambda: [("negative reps", [_x(2, 3)], {"reps": (2, -1)}),
                             ("fewer reps than axes", [_x(2, 3)], {"reps": (2,)}),
                             ("more reps than axes", [_x(2, 3)], {"reps": (1, 2, 3)})])


def infer_trilu(spec, shapes, dtypes, attrs):
    _rank_at_least(spec.name, shapes[0], 2)
    return [(shapes[0], dtypes[0])]


layout("trilu", "ONNX Trilu over the last two axes: keep j - i >= diagonal (upper) or "
       "j - i <= diagonal (lower), zero elsewhere",
       inputs=(Input("x", ranks=(2, None)),), infer=infer_trilu, shapes="trilu",
       attrs=(Attr("upper", "bool", sweep=(False, True)),
              Attr("diagonal", "int", default=0, sweep=(2, -1))),
       error_inputs=lambda: [("rank 1", [_x(3)], {"upper": True}),
                             ("scalar input", [_x()], {"upper": False}),
                             ("non-bool upper", [_x(3, 3)], {"upper": 1}),
                             ("missing upper", [_x(3, 3)], {})])


# -- pad -----------------------------------------------------------------------------------------
PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad_value_exact(value: float, dtype: str) -> bool:
    """Is the pad value a value of the dtype (no rounding, no wrap)? NaN is, for floats."""
    if dt.is_float(dtype):
        with np.errstate(over="ignore"):
            v = np.asarray(value).astype(dt.np_dtype(dtype)).astype(np.float64)
        return bool(v == value or (v != v and value != value))
    lo, hi = dt.iinfo(dtype)
    return value == value and value == int(value) and lo <= value <= hi


def infer_pad(spec, shapes, dtypes, attrs):
    """pads = [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] (ONNX order), all >= 0.
    reflect needs pad < size (the edge is not repeated), circular pad <= size, replicate a
    non-empty axis; value is only meaningful in constant mode and must be exact in x's dtype."""
    (shape,), pads, mode, value = shapes, attrs["pads"], attrs["mode"], attrs["value"]
    r = len(shape)
    if len(pads) != 2 * r or any(p < 0 for p in pads):
        raise SpecError(f"{spec.name}: pads {pads} needs 2*rank = {2 * r} values >= 0")
    if mode != "constant" and value != 0:
        raise SpecError(f"{spec.name}: value={value} is only used by mode constant, not {mode}")
    for a, d in enumerate(shape):
        p = max(pads[a], pads[a + r])
        if (mode == "reflect" and p >= d and p) or (mode == "circular" and p > d) or \
                (mode == "replicate" and p and not d):
            raise SpecError(f"{spec.name}: mode {mode} cannot pad {p} on axis {a} of size {d}")
    t = dtypes[0]
    if mode == "constant" and not pad_value_exact(value, t):
        raise SpecError(f"{spec.name}: value {value} is not exactly representable in {t}")
    return [(tuple(d + pads[a] + pads[a + r] for a, d in enumerate(shape)), t)]


layout("pad", "pad each axis: constant(value) | reflect (mirror, edge not repeated) | "
       "replicate (edge value) | circular (wrap around)",
       inputs=(Input("x"),), infer=infer_pad, shapes="pad",
       attrs=(Attr("pads", "ints", sweep=((), (2, 3), (1, 0, 0, 2), (0, 2, 1, 1, 0, 2))),
              Attr("mode", "enum", default="constant", choices=PAD_MODES, sweep=PAD_MODES),
              Attr("value", "float", default=0.0, sweep=(0.0, -2.0, math.nan))),
       error_inputs=lambda: [
           ("negative pad", [_x(3, 4)], {"pads": (1, -1, 0, 0)}),
           ("pads not 2*rank values", [_x(3, 4)], {"pads": (1, 1)}),
           ("unknown mode", [_x(3, 4)], {"pads": (1, 1, 1, 1), "mode": "symmetric"}),
           ("reflect pad >= axis size", [_x(3, 4)], {"pads": (3, 0, 0, 0), "mode": "reflect"}),
           ("value not exact in int8", [_x(3, dtype="int8")], {"pads": (1, 1), "value": 300.0})])


# -- gather --------------------------------------------------------------------------------------
def _marker(shapes: Sequence[Shape]) -> tuple[list[Shape], str]:
    """Split a structured family entry into its shapes and the index dtype (see module doc)."""
    shapes = [tuple(s) for s in shapes]
    if len(shapes) > 1 and shapes[-1] == INT32_MARKER:
        return shapes[:-1], "int32"
    return shapes, "int64"


def check_indices(op: str, idx: np.ndarray, size: int, what: str = "axis") -> None:
    """ONNX index rule: values in [-size, size-1]; anything else is an error, never clamped."""
    if idx.size and (idx.min() < -size or idx.max() >= size):
        bad = idx[(idx < -size) | (idx >= size)].flat[0]
        raise SpecError(f"{op}: index {int(bad)} out of range for {what} of size {size}")


def infer_gather(spec, shapes, dtypes, attrs):
    data, idx = shapes
    _rank_at_least(spec.name, data, 1)
    a = infer.norm_axis(spec.name, attrs["axis"], len(data))
    return [(data[:a] + tuple(idx) + data[a + 1:], dtypes[0])]


def gen_gather(stream, shapes, dtype, attrs, vals):
    """Data from the value class; indices spanning [-s, s-1] (negative ones count from the end)."""
    (data_shape, idx_shape), idt = _marker(shapes)
    data = make_array(stream(0), data_shape, dtype, "real", vals, attrs)
    s = data_shape[attrs["axis"] % len(data_shape)]
    n = math.prod(idx_shape)
    idx = stream(1).integers(n, -s, s - 1) if s else np.zeros(n, np.int64)
    return [data, idx.astype(idt).reshape(idx_shape)]


def _gather_errors():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    return [("index past the end", [x, np.array([0, 3], np.int64)], {"axis": 0}),
            ("index before -size", [x, np.array([-5], np.int32)], {"axis": 1}),
            ("float indices", [x, np.array([0.0], np.float32)], {"axis": 0}),
            ("axis out of range", [x, np.array([0], np.int64)], {"axis": 2})]


layout("gather", "ONNX Gather: out = take(x, indices, axis); indices int32/int64 in "
       "[-s, s-1], negative from the end, out of range is an error",
       inputs=(Input("x", ranks=(1, None)), Input("indices", dtypes=INDEX_DTYPES, role="index")),
       infer=infer_gather, shapes="gather", attrs=(Attr("axis", "int", default=0, sweep="axis"),),
       generate=gen_gather, error_inputs=_gather_errors,
       check_values=lambda inputs, attrs: check_indices(
           "gather", inputs[1], inputs[0].shape[attrs["axis"] % inputs[0].ndim]))


# -- scatter_add ---------------------------------------------------------------------------------
def infer_scatter_add(spec, shapes, dtypes, attrs):
    upd, idx = shapes
    _rank_at_least(spec.name, upd, 1)
    if len(idx) != 1 or idx[0] != upd[0]:
        raise SpecError(f"{spec.name}: indices must be 1-D with one entry per row of updates "
                        f"{upd}, got shape {idx}")
    if attrs["out_dim"] < 0 or (attrs["out_dim"] == 0 and upd[0]):
        raise SpecError(f"{spec.name}: out_dim {attrs['out_dim']} cannot hold {upd[0]} rows")
    return [((attrs["out_dim"],) + tuple(upd[1:]), dtypes[0])]


def gen_scatter_add(stream, shapes, dtype, attrs, vals):
    """Updates from the value class; indices over [-out_dim, out_dim-1], so rows repeat often and
    several updates accumulate into one output row."""
    (upd_shape, idx_shape), idt = _marker(shapes)
    upd = make_array(stream(0), upd_shape, dtype, "real", vals, attrs)
    m = attrs["out_dim"]
    idx = stream(1).integers(idx_shape[0], -m, m - 1) if m else np.zeros(0, np.int64)
    return [upd, idx.astype(idt).reshape(idx_shape)]


def _scatter_errors():
    u = np.ones((3, 2), np.float32)
    return [("index past out_dim", [u, np.array([0, 1, 4], np.int64)], {"out_dim": 4}),
            ("indices not one per row", [u, np.array([0, 1], np.int64)], {"out_dim": 4}),
            ("2-D indices", [u, np.zeros((3, 1), np.int64)], {"out_dim": 4})]


declare(name="scatter_add", family="shape", doc="out = zeros([out_dim, *updates.shape[1:]]); "
        "out[indices[i]] += updates[i] (duplicates all accumulate; ints wrap)",
        inputs=(Input("updates", ranks=(1, None)), Input("indices", dtypes=INDEX_DTYPES, role="index", ranks=(1, 1))),
        dtypes=dt.NUMERIC, infer=infer_scatter_add, shapes="scatter_add",
        attrs=(Attr("out_dim", "int", sweep=(5,)),), generate=gen_scatter_add,
        check_values=lambda inputs, attrs: check_indices("scatter_add", inputs[1], attrs["out_dim"], "out_dim"),
        values=("random", "special", "spread"), error_inputs=_scatter_errors,
        policy=Policy(bound=scatter_add_bound, signed_zero=False,
                      bound_reason="per row, any order of m additions: 2*gamma_(m-1)*sum|u|"))


# -- one_hot -------------------------------------------------------------------------------------
def infer_one_hot(spec, shapes, dtypes, attrs):
    """ONNX OneHot with depth as an attribute (the output shape must follow from shapes and
    attributes); the new axis of size depth goes at ``axis`` in [-(r+1), r]."""
    idx, vals = shapes
    if tuple(vals) != (2,):
        raise SpecError(f"{spec.name}: values must be [off, on] of shape (2,), got {vals}")
    if attrs["depth"] < 1:
        raise SpecError(f"{spec.name}: depth {attrs['depth']} must be >= 1")
    a = infer.norm_axis(spec.name, attrs["axis"], len(idx) + 1)
    return [(tuple(idx[:a]) + (attrs["depth"],) + tuple(idx[a:]), dtypes[1])]


def gen_one_hot(stream, shapes, dtype, attrs, vals):
    """Indices over [-depth-2, depth+1]: negative ones count from the end, the four values outside
    [-depth, depth-1] select nothing (every output off, as ONNX specifies)."""
    (idx_shape, val_shape), idt = _marker(shapes)
    d = attrs["depth"]
    idx = stream(0).integers(math.prod(idx_shape), -d - 2, d + 1).astype(idt).reshape(idx_shape)
    return [idx, make_array(stream(1), val_shape, dtype, "real", vals, attrs)]


declare(name="one_hot", family="shape", doc="out[..., j at axis, ...] = values[1] if index == j "
        "(negative indices from the end) else values[0]; indices outside [-depth, depth-1] give "
        "all values[0]",
        inputs=(Input("indices", dtypes=INDEX_DTYPES, role="index"), Input("values", ranks=(1, 1))),
        dtypes=dt.ALL, infer=infer_one_hot, shapes="one_hot",
        attrs=(Attr("depth", "int", sweep=(5,)), Attr("axis", "int", default=-1, sweep="axis")),
        generate=gen_one_hot, low_precision="native", policy=EXACT_SZ, values=("special",),
        uncovered=(("rank:indices=0", ("the matrix's axis sweep ranges over the first input's axes "
                                       "(generate/matrix.py), and a scalar has none, so no case of "
                                       "scalar indices (output rank 1, axis -1 or 0) can be generated")),),
        # an index outside [-depth, depth-1] is not an error here (all values[0], as ONNX says)
        error_inputs=lambda: [("depth 0", [np.array([0, 1], np.int64), _x(2)], {"depth": 0}),
                              ("negative depth", [np.array([0, 1], np.int64), _x(2)], {"depth": -3}),
                              ("float indices", [_x(2), _x(2)], {"depth": 3}),
                              ("values not [off, on]", [np.array([0, 1], np.int64), _x(3)], {"depth": 3}),
                              ("axis out of range", [np.array([0, 1], np.int64), _x(2)], {"depth": 3, "axis": 2})])


# -- non_zero ------------------------------------------------------------------------------------
def infer_non_zero(spec, shapes, dtypes, attrs):
    """[rank, count]: count depends on the values, so its size is None (data-dependent)."""
    return [((len(shapes[0]), None), "int64")]


declare(name="non_zero", family="shape", doc="int64 [rank, count]: the coordinates of the nonzero "
        "elements (NaN is nonzero, -0 is zero) in row-major order",
        inputs=(Input("x", domain="mostly_zero"),), dtypes=dt.ALL, infer=infer_non_zero,
        shapes="non_zero", low_precision="native", policy=EXACT_SZ, values=("random", "special"),
        not_differentiable="int64 coordinates: piecewise constant in x",
        error_inputs=lambda: [("complex input (not a harness dtype)", [np.ones(3, np.complex64)], {}),
                              ("two inputs", [_x(3), _x(3)], {}),
                              ("unknown attribute", [_x(3)], {"axis": 0})])

