"""Sort and selection (docs/ops.md): sort, arg_sort, top_k.

Order: ascending puts NaN last; descending is its mirror, NaN first (NaN ranks above +inf, as in
top_k). -0 and +0 are equal keys. Every order is stable: equal keys keep their input order, also
when descending, so arg_sort is fully determined and top_k breaks ties toward the smaller index.
Values only move, so results are judged bit-exact (signed zeros included: a stable sort keeps
the input order of -0 and +0, which an unstable or reverse-the-ascending sort does not).
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    EXACT_SZ,
    Attr,
    ErrorInputs,
    Infer,
    Input,
    OpSpec,
    declaration_helper,
    declare,
)

_AXIS = Attr("axis", "int", default=-1, sweep=(0, -1))
_DESC = Attr("descending", "bool", default=False, sweep=(False, True))


@declaration_helper
def sort_op(name: str, doc: str, *, attrs: tuple[Attr, ...], infer: Infer,
            error_inputs: ErrorInputs, not_differentiable: str = "",
            grad_values: tuple[str, ...] = ()) -> OpSpec:
    """One input ``x`` of any dtype, values only moved: bit-exact, kept in their dtype.
    "special" draws half of each input from the domain (many ties) and half from the specials
    (NaN, +-inf, +-0, subnormals, extremes): ties, NaN order and signed zeros in one case."""
    return declare(name=name, family="sort", doc=doc, inputs=(Input("x", domain="sort", ranks=(1, None)),),
                   dtypes=dt.ALL, attrs=attrs, infer=infer, shapes="sort", values=("special",),
                   policy=EXACT_SZ, low_precision="native", error_inputs=error_inputs,
                   not_differentiable=not_differentiable, grad_values=grad_values)


def infer_sort(spec, shapes, dtypes, attrs):
    (shape,) = shapes
    if not shape:
        raise SpecError(f"{spec.name}: needs rank >= 1, got a scalar")
    infer.norm_axis(spec.name, attrs["axis"], len(shape))
    return [(shape, "int64" if spec.name == "arg_sort" else dtypes[0])]


def _sort_errors():
    x = np.ones((2, 3), np.float32)
    return [("axis out of range", [x], {"axis": 2}), ("axis below -rank", [x], {"axis": -3}),
            ("scalar input", [np.ones((), np.float32)], {}),
            ("non-bool descending", [x], {"descending": "yes"})]


def infer_top_k(spec, shapes, dtypes, attrs):
    (shape,), k = shapes, attrs["k"]
    if not shape:
        raise SpecError(f"{spec.name}: needs rank >= 1, got a scalar")
    if not 0 <= k <= shape[-1]:
        raise SpecError(f"{spec.name}: k={k} outside [0, {shape[-1]}] (the last axis)")
    out = tuple(shape[:-1]) + (k,)
    return [(out, dtypes[0]), (out, "int64")]


sort_op("sort", "sorted copy along axis (stable; NaN last ascending, first descending)",
        attrs=(_AXIS, _DESC), infer=infer_sort, error_inputs=_sort_errors, grad_values=("ties",))
sort_op("arg_sort", "int64 indices that stably sort x along axis (NaN last ascending, first "
        "descending)", attrs=(_AXIS, _DESC), infer=infer_sort, error_inputs=_sort_errors,
        not_differentiable="int64 indices: piecewise constant in x")
sort_op("top_k", "the k largest along the last axis, descending: values and int64 indices; ties "
        "go to the smaller index; NaN ranks above +inf",
        attrs=(Attr("k", "int", sweep=(1, 5)),), infer=infer_top_k, grad_values=("ties",),
        error_inputs=lambda: [("k past the last axis", [np.ones((2, 3), np.float32)], {"k": 4}),
                              ("negative k", [np.ones((2, 3), np.float32)], {"k": -1}),
                              ("scalar input", [np.ones((), np.float32)], {"k": 1}),
                              ("axis attribute (top_k is along the last axis)",
                               [np.ones((2, 3), np.float32)], {"k": 1, "axis": 0})])
