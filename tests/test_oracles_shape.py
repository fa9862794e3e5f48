"""The CPU reference of the shape and data movement family against onnx.reference, over every case
of the generated matrix in every dtype: Reshape, Transpose, Slice (narrow, slice with negative
steps, and reverse as Slice with step -1), Concat, Expand, Tile, Trilu, Pad, Gather, OneHot,
NonZero, and ScatterND with reduction "add" (scatter_add).

Our attributes are translated to ONNX's here, from docs/ops.md (shape), by code written in this
file: narrow's and slice's negative ``start`` counts from the end and slice reads ``start + i *
step`` for ``i < len`` (ONNX Slice takes starts/ends/steps; an end before the first element of a
backward slice is INT64_MIN, since ONNX reads a negative end from the end); reshape's 0 is a
literal zero (Reshape's allowzero=1); pad's modes replicate and circular are ONNX's edge and wrap;
scatter_add's negative indices count from out_dim (translated here: onnx.reference's ScatterND
does not take them), its output starting from zeros.

Values that only move are compared as bits: float dtypes go to ONNX as unsigned integers of their
width (NaN payloads and signed zeros must survive, and onnx.reference has no bfloat16), so the
judgement is bit-exact, signed zeros included, as docs/ops.md's judge is. NonZero reads values
(-0 is zero, NaN is not): it gets float32 (exact for the 16-bit floats). scatter_add's integer
sums wrap and are exact in any order; its float sums are judged against math.fsum of each
output's terms within the recursive-summation bound the reference's float64 accumulation meets,
gamma_(n+1)(2^-53) * sum|terms| (Higham 4.2: n - 1 float64 additions, plus fsum's own rounding),
plus the output dtype's rounding u_out * |sum| and half its smallest subnormal; an exact sum whose
whole error interval lies past the dtype's range must be +-inf, one straddling it may be either,
and where sum|terms| itself overflows float64 the order of the additions decides (not asserted).
onnx.reference's ScatterND sum is held to the same bound, a cross-check of the index logic.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from rlx_conformance.generate import matrix

from oracle_common import CPU, ETA, TARGET, assert_each_case
INT64_MIN = -(2 ** 63)
BITS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def onnx_run(op_type: str, inputs: Sequence[np.ndarray], opset: int, **attrs: Any) -> np.ndarray:
    """One ONNX node through onnx.reference."""
    names = [f"x{i}" for i in range(len(inputs))]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
           for n, a in zip(names, inputs)]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph([node], op_type, ins, [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return np.asarray(ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0])


def bits(x: np.ndarray) -> np.ndarray:
    """Floats as unsigned integers of their width (the bit pattern); others unchanged."""
    if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16:
        return np.array(x, copy=True).view(BITS[x.dtype.itemsize])  # keeps 0-d arrays 0-d
    return x


def i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def slice_onnx(x: np.ndarray, axis: int, start: int, length: int, step: int) -> np.ndarray:
    """out[i] = x[start + i*step] for i < length along axis (docs/ops.md), as ONNX Slice."""
    d = x.shape[axis]
    s = start + d if start < 0 else start
    end = s + length * step
    if step < 0 and end < 0:
        end = INT64_MIN  # ONNX would read a negative end from the end of the axis
    return onnx_run("Slice", [x, i64(s), i64(end), i64(axis), i64(step)], 13)


def expected(case: matrix.Case, inputs: list[np.ndarray]) -> np.ndarray:
    """The oracle's output, in bits for the moved-value ops."""
    a, op = case.attr_dict, case.op
    if op == "reshape":
        return onnx_run("Reshape", [bits(inputs[0]), i64(*a["new_shape"])], 14, allowzero=1)
    if op == "transpose":
        x = bits(inputs[0])
        if not a["perm"]:  # a scalar's perm (): ONNX cannot type an empty perm; omitted, rank 0 is unchanged
            assert x.ndim == 0
            return onnx_run("Transpose", [x], 13)
        return onnx_run("Transpose", [x], 13, perm=list(a["perm"]))
    if op == "narrow":
        return slice_onnx(bits(inputs[0]), a["axis"], a["start"], a["len"], 1)
    if op == "slice":
        return slice_onnx(bits(inputs[0]), a["axis"], a["start"], a["len"], a["step"])
    if op == "reverse":
        x = bits(inputs[0])
        for ax in a["axes"]:
            x = onnx_run("Slice", [x, i64(-1), i64(INT64_MIN), i64(ax), i64(-1)], 13)
        return x
    if op == "concat":
        return onnx_run("Concat", [bits(x) for x in inputs], 13, axis=a["axis"])
    if op == "expand":
        return onnx_run("Expand", [bits(inputs[0]), i64(*a["target_shape"])], 13)
    if op == "tile":
        return onnx_run("Tile", [bits(inputs[0]), i64(*a["reps"])], 13)
    if op == "trilu":
        return onnx_run("Trilu", [bits(inputs[0]), i64(a.get("diagonal", 0))], 14, upper=int(a["upper"]))
    if op == "pad":
        x = inputs[0]
        if x.ndim == 0:  # a scalar has no axis to pad (pads ()): onnx.reference's Pad needs an axis
            assert not a["pads"]
            return bits(x)
        pads = list(a["pads"])
        mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[a["mode"]]
        value = bits(np.asarray([a["value"]]).astype(x.dtype))[0:1].reshape(())
        return onnx_run("Pad", [bits(x), i64(*pads), value], 19, mode=mode)
    if op == "gather":
        return onnx_run("Gather", [bits(inputs[0]), inputs[1]], 13, axis=a["axis"])
    if op == "one_hot":
        idx, values = inputs
        if values.dtype == np.bool_:  # onnx.reference's OneHot subtracts the values: bool as uint8
            values = values.astype(np.uint8)
        return onnx_run("OneHot", [idx, np.array(a["depth"], np.int64), bits(values)], 11, axis=a["axis"])
    if op == "non_zero":
        x = inputs[0]
        if x.dtype.kind == "f" and x.dtype.itemsize == 2 or x.dtype == ml_dtypes.bfloat16:
            x = x.astype(np.float32)
        return onnx_run("NonZero", [x], 13)
    raise AssertionError(op)


def exact_sum(terms: np.ndarray) -> float:
    """The exact sum of float64 terms rounded once to float64 (math.fsum), +-inf where that
    overflows (fsum raises on an intermediate overflow; the Fraction sum is exact)."""
    try:
        return math.fsum(terms)
    except OverflowError:
        q = sum(Fraction(float(t)) for t in terms)
        try:
            return float(q)
        except OverflowError:
            return math.inf if q > 0 else -math.inf


def scatter_add_expected(updates: np.ndarray, indices: np.ndarray,
                         out_dim: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(value, bound or None for exact) of scatter_add by ONNX ScatterND(reduction="add")."""
    rows = np.where(indices < 0, indices + out_dim, indices).astype(np.int64).reshape(-1, 1)
    zeros = np.zeros((out_dim,) + updates.shape[1:], updates.dtype)
    if updates.dtype.kind in "iu":
        return onnx_run("ScatterND", [zeros, rows, updates], 18, reduction="add"), None
    u = updates.astype(np.float64)
    want = np.zeros(zeros.shape)
    exact = np.zeros(zeros.shape)
    mag = np.zeros(zeros.shape)
    count = np.zeros(out_dim)
    for r in range(out_dim):
        terms = u[rows[:, 0] == r]
        count[r] = len(terms)
        with np.errstate(invalid="ignore"):
            finite = np.where(np.isfinite(terms), terms, 0.0)
            specials = np.where(np.isfinite(terms), 0.0, terms).sum(axis=0)  # inf/NaN by IEEE rules
        want[r] = np.array([exact_sum(col) for col in finite.reshape(len(terms), -1).T]).reshape(zeros.shape[1:]) \
            if len(terms) else 0.0
        exact[r] = want[r]
        want[r] = np.where(np.isfinite(specials) & (specials == 0), want[r], specials)
        mag[r] = np.abs(finite).sum(axis=0) if len(terms) else 0.0
    # the ONNX evaluator's own sum decides nothing here; it is the cross-check of the index logic
    onnx_sum = onnx_run("ScatterND", [np.zeros(zeros.shape), rows, np.where(np.isfinite(u), u, 0.0)], 18,
                        reduction="add")
    n = count.reshape((out_dim,) + (1,) * (updates.ndim - 1)) + 1
    gamma = n * 2.0 ** -53 / (1 - n * 2.0 ** -53)
    bound_f = gamma * mag
    with np.errstate(invalid="ignore"):
        agree = np.abs(onnx_sum - exact) <= bound_f + 2 * 2.0 ** -1074
    assert np.all(agree | ~np.isfinite(bound_f)), \
        "onnx.reference ScatterND disagrees with the exact sums"
    return want, bound_f


def check(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    inputs = matrix.make_inputs(case)
    if out is None:
        (out,) = CPU.run(case.op, [x.copy() for x in inputs], case.attr_dict)
    out = np.asarray(out)
    if case.op == "scatter_add":
        want, bound = scatter_add_expected(inputs[0], inputs[1], case.attr_dict["out_dim"])
        if out.shape != want.shape or out.dtype != inputs[0].dtype:
            return f"shape/dtype {out.shape} {out.dtype}, want {want.shape} {inputs[0].dtype}"
        if bound is None:
            return None if np.array_equal(out, want) else f"{out} != {want}"
        got = out.astype(np.float64)
        # where sum|terms| overflows, the order of the float64 additions decides between the exact
        # value and an overflow: not asserted (the bound is infinite there)
        free = ~np.isfinite(bound)
        finite = np.isfinite(want) & ~free
        if not np.array_equal(np.isnan(got) & ~free, np.isnan(want) & ~free) or \
                not np.array_equal(got[np.isinf(want) & ~free], want[np.isinf(want) & ~free]):
            return "non-finite pattern differs"
        allowed = UNIT[case.dtype] * np.abs(want) + bound + ETA[case.dtype]
        # the output dtype's overflow: an exact sum whose whole error interval rounds to +-inf
        # must be +-inf; one straddling the threshold may be either
        with np.errstate(over="ignore", invalid="ignore"):
            low = np.where(finite, np.abs(want) - allowed, 0.0).astype(out.dtype)
            high = np.where(finite, np.abs(want) + allowed, 0.0).astype(out.dtype)
        must_inf, may_inf = finite & np.isinf(low), finite & np.isinf(high)
        if not np.array_equal(got[must_inf], np.sign(want[must_inf]) * np.inf):
            return "an exact sum beyond the dtype's range is finite"
        finite &= ~may_inf
        with np.errstate(invalid="ignore"):
            err = np.abs(got - want)
        over = finite & ~(err <= allowed)
        return None if not over.any() else f"{over.sum()} elements over the bound, max err {err[over].max()}"
    want = expected(case, inputs)
    if case.op != "non_zero":
        got = bits(out)
        if out.dtype != inputs[-1 if case.op == "one_hot" else 0].dtype:
            return f"dtype {out.dtype}"
    else:
        got = out
        if out.dtype != np.int64:
            return f"dtype {out.dtype}, want int64"
    if got.shape != want.shape:
        return f"shape {got.shape}, want {want.shape}"
    if not np.array_equal(got, want):
        return f"{int((got != want).sum())} elements differ"
    return None


OPS = ["reshape", "transpose", "narrow", "slice", "reverse", "concat", "expand", "tile", "trilu",
       "pad", "gather", "one_hot", "non_zero", "scatter_add"]
CASES = list(matrix.generate([TARGET], ops=OPS))


@pytest.mark.parametrize("op", OPS)
def test_reference_against_onnx_reference(op: str) -> None:
    """Every matrix case of the op, every dtype."""
    assert_each_case((c for c in CASES if c.op == op), check)


def _off_by_one_row(x: np.ndarray, *rest: np.ndarray, **a: Any) -> np.ndarray:
    """A reference whose result is the right one rolled by one along axis 0 (wrong index logic)."""
    (out,) = CPU.run(_off_by_one_row.op, [x.copy(), *[r.copy() for r in rest]], a)
    return np.roll(out, 1, axis=0) if out.ndim and out.shape[0] > 1 else out


@pytest.mark.parametrize("op", ["pad", "gather", "slice", "trilu", "one_hot", "scatter_add", "tile"])
def test_the_oracle_rejects_a_wrong_kernel(op: str) -> None:
    """The comparison can fail: the reference's output rolled by one row (an off-by-one in the
    index logic) is caught on the matrix's cases of each op."""
    _off_by_one_row.op = op
    caught = 0
    for case in (c for c in CASES if c.op == op and c.dtype == "float32"):
        inputs = matrix.make_inputs(case)
        caught += check(case, _off_by_one_row(*inputs, **case.attr_dict)) is not None
    assert caught > 0
