"""Reductions and scans (docs/ops.md): reduce_sum/mean/max/min/prod, arg_max, arg_min, softmax,
cumsum, cum_prod, cum_max.

Semantics: reductions take ``axes`` (empty = every axis; negative axes count from the end; an
axis may not repeat) and ``keep_dim``; arg_max/arg_min, softmax and the scans work along one
``axis``. Integer sums and products wrap. max/min (and cum_max) propagate NaN; arg_max/arg_min
return the first index of the extreme value, where NaN counts as the extreme. An empty reduction
gives the identity (0 for sums, 1 for products); max/min and arg_max/arg_min of an empty axis
are errors (no identity). Scans: ``exclusive`` shifts the result by one with the identity first,
``reverse`` runs from the end.

Accumulating ops (sums, means, products, softmax, running sums and products) are judged by
error bounds from the standard summation analysis (judge/bounds/reduce.py), since any order of
accumulation is legal; max/min and the arg reductions are exact.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.reduce import (
    cumprod_bound,
    cumsum_bound,
    mean_bound,
    prod_bound,
    softmax_bound,
    sum_bound,
)
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    EXACT,
    Attr,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)
from rlx_conformance.spec.values import ACCUMULATION_CLASSES

SPREAD = ("random", "special", "spread")  # value classes of the reductions and scans
ACCUMULATE = SPREAD + ACCUMULATION_CLASSES  # of the accumulating ones (sums, products, softmax)


def _axis_errors(dtypes, attr: str, empty_axis: bool = False):
    """Error inputs (validate's error-input parity): an axis out of range, a repeated axis, a
    scalar where an axis is needed, an empty axis for max/min (no identity)."""
    def errors():
        x = np.ones((2, 3), dt.np_dtype(dtypes[0]))
        if attr == "axes":
            out = [("axis out of range", [x], {"axes": (2,)}), ("repeated axis", [x], {"axes": (0, 0)})]
        else:
            out = [("axis out of range", [x], {"axis": 2}), ("axis below -rank", [x], {"axis": -3}),
                   ("scalar input", [np.ones((), x.dtype)], {"axis": 0})]
        if empty_axis:
            out.append(("empty axis", [np.ones((0, 3), x.dtype)], {attr: (0,) if attr == "axes" else 0}))
        return out
    return errors


_AXES = Attr("axes", "ints", default=(), sweep="axes", doc="axes to reduce; empty = all", empty="all")
_KEEP = Attr("keep_dim", "bool", default=False, sweep=(False, True))
_AXIS = Attr("axis", "int", default=-1, sweep="axis")
_SCAN_ATTRS = (_AXIS, Attr("exclusive", "bool", default=False, sweep=(False, True)),
               Attr("reverse", "bool", default=False, sweep=(False, True)))


def _bounded(bound: Callable[..., np.ndarray], reason: str) -> Policy:
    return Policy(bound=bound, bound_reason=reason)


@declaration_helper
def reduction(name: str, doc: str, *, dtypes: tuple[str, ...] = dt.NUMERIC, policy: Policy = EXACT,
              domain: str = "real", empty_axis: bool = False, values: tuple[str, ...] = SPREAD,
              grad_values: tuple[str, ...] = ()) -> OpSpec:
    """A reduction over ``axes`` with ``keep_dim``; ``empty_axis``: reducing an empty axis is an
    error (no identity)."""
    return declare(name=name, family="reduce", doc=doc, inputs=(Input("x", domain=domain),),
                   dtypes=dtypes, attrs=(_AXES, _KEEP), infer=infer.reduce, shapes="reduce",
                   values=values, policy=policy, grad_values=grad_values,
                   error_inputs=_axis_errors(dtypes, "axes", empty_axis=empty_axis))


@declaration_helper
def arg_reduction(name: str, doc: str) -> OpSpec:
    """arg_max/arg_min: an int64 index along ``axis``, exact; values drawn with many ties."""
    return declare(name=name, family="reduce", doc=doc, inputs=(Input("x", domain="ties", ranks=(1, None)),),
                   dtypes=dt.NUMERIC, attrs=(_AXIS, _KEEP), infer=infer.arg_reduce, shapes="reduce",
                   policy=EXACT, error_inputs=_axis_errors(dt.NUMERIC, "axis", empty_axis=True),
                   not_differentiable="an int64 index: piecewise constant in x")


@declaration_helper
def scan(name: str, doc: str, identity: str, *, policy: Policy = EXACT, domain: str = "real",
         values: tuple[str, ...] = SPREAD, grad_values: tuple[str, ...] = ()) -> OpSpec:
    """A running reduction along ``axis`` with ``exclusive`` and ``reverse``."""
    return declare(name=name, family="scan", doc=doc + f" (exclusive: shifted by one, {identity} first; "
                   "reverse: from the end)", inputs=(Input("x", domain=domain, ranks=(1, None)),), dtypes=dt.NUMERIC,
                   attrs=_SCAN_ATTRS, infer=infer.along_axis, shapes="reduce", values=values,
                   policy=policy, error_inputs=_axis_errors(dt.NUMERIC, "axis"), grad_values=grad_values)


# -- reductions ----------------------------------------------------------------------------------
reduction("reduce_sum", "sum; ints wrap",
          policy=_bounded(sum_bound, "any summation order: 2*gamma_(n-1)*sum|x|"), values=ACCUMULATE)
reduction("reduce_mean", "arithmetic mean", dtypes=dt.FLOATS,
          policy=_bounded(mean_bound, "sum bound / n"), values=ACCUMULATE)
reduction("reduce_max", "max, NaN-propagating", empty_axis=True, grad_values=("ties",))
reduction("reduce_min", "min, NaN-propagating", empty_axis=True, grad_values=("ties",))
reduction("reduce_prod", "product; ints wrap", domain="near_one",
          policy=_bounded(prod_bound, "n-1 roundings: 2*gamma_(n-1)*|prod|"), values=ACCUMULATE)

arg_reduction("arg_max", "index of the max; ties and NaN: first wins")
arg_reduction("arg_min", "index of the min; ties and NaN: first wins")

declare(name="softmax", family="reduce", doc="exp(x - max) / sum exp(x - max) along axis",
        inputs=(Input("x", domain="real", ranks=(1, None)),), dtypes=dt.FLOATS, attrs=(_AXIS,),
        infer=infer.along_axis, shapes="reduce", values=ACCUMULATE,
        policy=_bounded(softmax_bound, "2(n+4)u relative + smallest-normal floor"),
        error_inputs=_axis_errors(dt.FLOATS, "axis"), second_order=True)

# -- scans ---------------------------------------------------------------------------------------
scan("cumsum", "running sum; ints wrap", "0",
     policy=_bounded(cumsum_bound, "running sum: 2*gamma_(n-1)*cumsum|x|"), values=ACCUMULATE)
scan("cum_prod", "running product; ints wrap", "1", domain="near_one",
     policy=_bounded(cumprod_bound, "running product: 2*gamma_(n-1)*|cumprod|"), values=ACCUMULATE)
scan("cum_max", "running max, NaN-propagating", "-inf (integers: the dtype's smallest value)", grad_values=("ties",))
