"""Reductions and scans (OPS.md "Reductions and scans"): reduce_sum/mean/max/min/prod, arg_max,
arg_min, softmax, cumsum, cum_prod, cum_max.

Accumulating ops are judged by error bounds from the standard summation analysis (Higham,
*Accuracy and Stability of Numerical Algorithms*, ch. 3-4), not by a flat tolerance: any order of
accumulation is legal, so a backend may differ from the reference by up to the bound.
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import Attr, Input, Policy, declare


def gamma(n: np.ndarray | int, u: float) -> np.ndarray:
    """gamma_n = n u / (1 - n u): the bound on the relative error of n-term floating accumulation."""
    nu = np.asarray(n, dtype=np.float64) * u
    return np.where(nu < 1, nu / np.maximum(1 - nu, 1e-300), np.inf)


def _reduced(x: np.ndarray, attrs) -> tuple[tuple[int, ...], int]:
    axes = attrs["axes"] or tuple(range(x.ndim))
    axes = tuple(a % x.ndim for a in axes) if x.ndim else ()
    n = int(np.prod([x.shape[a] for a in axes])) if axes else 1
    return axes, n


def _u(dtype_name: str) -> float:
    return dt.finfo(dt.compute_dtype(dtype_name)).unit_roundoff


def sum_bound(inputs, attrs, out_dtype: str, scale: float = 1.0):
    """|computed - exact| <= gamma_{n-1} * sum|x| for any summation order; two implementations
    therefore differ by at most twice that. Where sum|x| overflows the compute dtype the result
    depends on accumulation order (one order overflows, another does not): NaN marks those
    positions as unasserted."""
    (x,) = inputs
    axes, n = _reduced(x, attrs)
    cdt = dt.compute_dtype(out_dtype)
    s = np.sum(np.abs(x.astype(np.float64)), axis=axes, keepdims=attrs["keep_dim"])
    bound = 2 * gamma(max(n - 1, 0), _u(out_dtype)) * s * scale
    return np.where(s > dt.finfo(cdt).max, np.nan, bound)


def mean_bound(inputs, attrs, out_dtype):
    """A mean is a sum (bound above) then one division by n: add one rounding of the result."""
    _, n = _reduced(inputs[0], attrs)
    return sum_bound(inputs, attrs, out_dtype, scale=1.0 / max(n, 1))


def prod_bound(inputs, attrs, out_dtype):
    """n-1 multiplications: relative error <= gamma_{n-1}; two implementations differ by twice
    that. Products whose partial products can over- or underflow depending on order are
    unasserted (NaN): log2 of the largest possible partial product exceeds the exponent range."""
    (x,) = inputs
    axes, n = _reduced(x, attrs)
    fi = dt.finfo(dt.compute_dtype(out_dtype))
    x64 = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(x64)
        up = np.sum(np.where(lg > 0, lg, 0), axis=axes, keepdims=attrs["keep_dim"])
        down = np.sum(np.where(lg < 0, lg, 0), axis=axes, keepdims=attrs["keep_dim"])
        p = np.prod(x64, axis=axes, keepdims=attrs["keep_dim"])
    risky = (up >= np.log2(fi.max)) | (down <= np.log2(fi.tiny))
    bound = 2 * gamma(max(n - 1, 0), fi.unit_roundoff) * np.abs(p)
    return np.where(risky, np.nan, bound)


def cumsum_bound(inputs, attrs, out_dtype):
    """Per position, a sum of at most n terms along the axis: 2 gamma_{n-1} * (running sum |x|)."""
    (x,) = inputs
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    a = np.abs(x.astype(np.float64))
    if attrs["reverse"]:
        a = np.flip(a, axis)
    s = np.cumsum(a, axis=axis)
    if attrs["reverse"]:
        s = np.flip(s, axis)
    bound = 2 * gamma(max(n - 1, 0), _u(out_dtype)) * s
    return np.where(s > dt.finfo(dt.compute_dtype(out_dtype)).max, np.nan, bound)


def cumprod_bound(inputs, attrs, out_dtype):
    """Per position, a product of at most n factors: relative 2 gamma_{n-1}; positions whose
    partial products can leave the exponent range are unasserted (NaN)."""
    (x,) = inputs
    axis = attrs["axis"] % x.ndim
    n = x.shape[axis]
    fi = dt.finfo(dt.compute_dtype(out_dtype))
    x64 = np.abs(x.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(x64)

        def run(v):
            v = np.flip(v, axis) if attrs["reverse"] else v
            c = np.cumsum(v, axis=axis)
            return np.flip(c, axis) if attrs["reverse"] else c
        up, down = run(np.where(lg > 0, lg, 0)), run(np.where(lg < 0, lg, 0))
        p = np.exp2(run(np.where(np.isfinite(lg), lg, 0)))
    risky = (up >= np.log2(fi.max)) | (down <= np.log2(fi.tiny))
    return np.where(risky, np.nan, 2 * gamma(max(n - 1, 0), fi.unit_roundoff) * p)


def softmax_bound(inputs, attrs, out_dtype):
    """exp(x_i - m) / sum_j exp(x_j - m): each exp has a few ulp of error, the sum gamma_{n-1},
    the division one rounding, so the relative error is below 2*(n + 4) u; results in the
    subnormal range lose relative accuracy, hence an absolute floor of the smallest normal."""
    (x,) = inputs
    if x.size == 0:
        return np.zeros(x.shape)
    n = x.shape[attrs["axis"] % x.ndim]
    cdt = dt.compute_dtype(out_dtype)
    u = _u(out_dtype)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(x64, axis=attrs["axis"], keepdims=True)
        e = np.exp(x64 - m)
        y = e / np.sum(e, axis=attrs["axis"], keepdims=True)
    return 2 * (n + 4) * u * np.abs(y) + dt.finfo(cdt).tiny


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

REDUCTIONS = {
    "reduce_sum": (dt.NUMERIC, "sum; ints wrap", Policy(bound=sum_bound,
                   bound_reason="any summation order: 2*gamma_(n-1)*sum|x|"), "real"),
    "reduce_mean": (dt.FLOATS, "arithmetic mean", Policy(bound=mean_bound,
                    bound_reason="sum bound / n"), "real"),
    "reduce_max": (dt.NUMERIC, "max, NaN-propagating", Policy(exact=True), "real"),
    "reduce_min": (dt.NUMERIC, "min, NaN-propagating", Policy(exact=True), "real"),
    "reduce_prod": (dt.NUMERIC, "product; ints wrap", Policy(bound=prod_bound,
                    bound_reason="n-1 roundings: 2*gamma_(n-1)*|prod|"), "near_one"),
}
for _name, (_dtypes, _doc, _policy, _domain) in REDUCTIONS.items():
    declare(name=_name, family="reduce", doc=_doc, inputs=(Input("x", domain=_domain),),
            dtypes=_dtypes, attrs=(_AXES, _KEEP), infer=infer.reduce, shapes="reduce",
            values=("random", "special", "spread"), policy=_policy,
            error_inputs=_axis_errors(_dtypes, "axes", empty_axis=_name in ("reduce_max", "reduce_min")))

for _name, _doc in {"arg_max": "index of the max; ties and NaN: first wins",
                    "arg_min": "index of the min; ties and NaN: first wins"}.items():
    declare(name=_name, family="reduce", doc=_doc, inputs=(Input("x", domain="ties"),),
            dtypes=dt.NUMERIC, attrs=(_AXIS, _KEEP), infer=infer.arg_reduce, shapes="reduce",
            policy=Policy(exact=True), error_inputs=_axis_errors(dt.NUMERIC, "axis", empty_axis=True))

declare(name="softmax", family="reduce", doc="exp(x - max) / sum exp(x - max) along axis",
        inputs=(Input("x", domain="real"),), dtypes=dt.FLOATS, attrs=(_AXIS,),
        infer=infer.along_axis, shapes="reduce", values=("random", "special", "spread"),
        policy=Policy(bound=softmax_bound, bound_reason="2(n+4)u relative + smallest-normal floor"),
        error_inputs=_axis_errors(dt.FLOATS, "axis"))

_SCAN_ATTRS = (_AXIS, Attr("exclusive", "bool", default=False, sweep=(False, True)),
               Attr("reverse", "bool", default=False, sweep=(False, True)))
SCANS = {
    "cumsum": (dt.NUMERIC, "running sum; ints wrap", Policy(bound=cumsum_bound,
               bound_reason="running sum: 2*gamma_(n-1)*cumsum|x|"), "real"),
    "cum_prod": (dt.NUMERIC, "running product; ints wrap", Policy(bound=cumprod_bound,
                 bound_reason="running product: 2*gamma_(n-1)*|cumprod|"), "near_one"),
    "cum_max": (dt.NUMERIC, "running max, NaN-propagating", Policy(exact=True), "real"),
}
for _name, (_dtypes, _doc, _policy, _domain) in SCANS.items():
    declare(name=_name, family="scan", doc=_doc + " (exclusive: shifted by one, identity first; "
            "reverse: from the end)", inputs=(Input("x", domain=_domain),), dtypes=_dtypes,
            attrs=_SCAN_ATTRS, infer=infer.along_axis, shapes="reduce",
            values=("random", "special", "spread"), policy=_policy,
            error_inputs=_axis_errors(_dtypes, "axis"))
