"""Elementwise ops (docs/ops.md): 29 activations, 14 binary ops, 6 comparisons, where, fma, clamp,
cast.

Semantics: activations take one float input and keep its shape and dtype; binary ops, the
comparisons, where and fma broadcast their inputs (numpy rules) and need one dtype for all data
inputs (where's condition is bool). float16/bfloat16 compute in float32 and round once. Integer
add/sub/mul wrap; integer div truncates toward zero and mod takes the sign of the dividend (C
fmod). Undefined by the spec (any output passes there): integer div/mod by zero and INT_MIN / -1,
shift counts outside [0, bits), and a float -> int cast of NaN, inf or a value whose truncation is
out of the target range. max/min propagate NaN; comparisons follow IEEE (NaN compares unequal).
At +-inf an activation takes its limit, the sign of a zero included (sigmoid(+inf) = 1,
log_sigmoid(-inf) = -inf), also where its formula gives NaN (x * 0): gelu, gelu_approx, silu,
mish and hard_swish at -inf are -0.

Judging: ops whose result is exactly defined (relu, neg, abs, rounding, sign, max/min, the bit
ops, comparisons, where, clamp, cast) are bit-exact; the rest are held to the tolerance table
(cases/tolerances.toml), which gives the correctly rounded IEEE ops (add, sub, mul, div, fma,
sqrt) 0 ULP; add, sub, mul, div and fma also compare the sign of zero.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    EXACT,
    EXACT_SZ,
    Attr,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)

APPROX = Policy()  # within the tolerance table (cases/tolerances.toml)
IEEE = Policy(signed_zero=True)  # correctly rounded IEEE ops: tolerance 0 ULP in tolerances.toml


# -- error inputs (validate's error-input parity): inputs every backend must reject -----------------
def _arr(shape, dtype: str) -> np.ndarray:
    return np.ones(shape, dt.np_dtype(dtype))


def _other(dtype: str, dtypes) -> str:
    """A dtype of the same op different from ``dtype`` (mixed-dtype error inputs)."""
    return next(d for d in ("float32", "float64", "int32", "int64", "bool") if d != dtype and d in dtypes)


def _activation_errors():
    return [("integer input", [np.arange(3, dtype=np.int32)], {})]


def _broadcast_errors(dtypes, n: int = 2):
    def errors():
        d = dtypes[0]
        out = [("shapes do not broadcast", [_arr(3, d), _arr(4, d)] + [_arr(3, d)] * (n - 2), {})]
        if len(dtypes) > 1:
            out.append(("mixed dtypes", [_arr(3, d), _arr(3, _other(d, dtypes))] + [_arr(3, d)] * (n - 2), {}))
        return out
    return errors


# -- undefined positions -------------------------------------------------------------------------
def _int_div_undefined(inputs, attrs):
    """Integer division/mod by zero, and INT_MIN / -1 (overflow), are undefined."""
    a, b = inputs
    if not np.issubdtype(a.dtype, np.integer):
        return None
    bad = b == 0
    if np.issubdtype(a.dtype, np.signedinteger):
        bad = bad | ((a == np.iinfo(a.dtype).min) & (b == -1))
    return bad


def _shift_undefined(inputs, attrs):
    """Shift counts outside [0, bits) are undefined."""
    a, b = inputs
    bits = a.dtype.itemsize * 8
    return (b.astype(np.int64) < 0) | (b.astype(np.int64) >= bits)


# -- declaration helpers -------------------------------------------------------------------------
# Why the rounding activations have no derivative (OpSpec.not_differentiable)
PIECEWISE_CONSTANT = ("piecewise constant: the derivative is 0 wherever it exists and undefined at "
                      "the jumps, so there is no rule to verify (frameworks return 0)")


@declaration_helper
def unary(name: str, doc: str, *, domain: str = "real", policy: Policy = APPROX,
          not_differentiable: str = "", grad_values: tuple[str, ...] = (),
          second_order: bool = False) -> OpSpec:
    """A float activation: one input ``x`` drawn from ``domain``, output of x's shape and dtype."""
    return declare(name=name, family="activation", doc=doc,
                   inputs=(Input("x", domain=domain),), dtypes=dt.FLOATS,
                   infer=infer.same, shapes="unary", policy=policy, error_inputs=_activation_errors,
                   not_differentiable=not_differentiable, grad_values=grad_values,
                   second_order=second_order)


@declaration_helper
def binary(name: str, doc: str, *, dtypes: tuple[str, ...] = dt.NUMERIC,
           domains: tuple[str, str] = ("real", "real"), policy: Policy = IEEE,
           undefined: Callable[..., np.ndarray | None] | None = None,
           grad_values: tuple[str, ...] = ()) -> OpSpec:
    """Two inputs ``a``, ``b`` of one dtype, broadcast (numpy rules), drawn from ``domains``."""
    return declare(name=name, family="binary", doc=doc,
                   inputs=(Input("a", domain=domains[0]), Input("b", domain=domains[1])), dtypes=dtypes,
                   infer=infer.elementwise, shapes="binary", policy=policy,
                   error_inputs=_broadcast_errors(dtypes), grad_values=grad_values,
                   **({"undefined": undefined} if undefined else {}))


@declaration_helper
def comparison(name: str, doc: str) -> OpSpec:
    """A broadcasting predicate over every dtype, bool out; IEEE: NaN compares unequal."""
    return declare(name=name, family="compare", doc=doc + " (IEEE: NaN compares unequal)",
                   inputs=(Input("a", domain="compare"), Input("b", domain="compare")), dtypes=dt.ALL,
                   infer=infer.predicate, shapes="binary", policy=EXACT,
                   error_inputs=_broadcast_errors(dt.ALL), not_differentiable="a predicate: bool output")


# -- activations ---------------------------------------------------------------------------------
unary("gelu", "x * Phi(x), exact erf form", domain="gelu", second_order=True)
unary("gelu_approx", "tanh form: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))", domain="gelu",
      second_order=True)
unary("silu", "x * sigmoid(x)", domain="sigmoid", second_order=True)
unary("relu", "max(x, 0)", policy=EXACT, grad_values=("kink",))
unary("sigmoid", "1 / (1 + e^-x)", domain="sigmoid", second_order=True)
unary("tanh", "hyperbolic tangent", domain="sigmoid", second_order=True)
unary("exp", "e^x", domain="exp", second_order=True)
unary("log", "natural log; log(0) = -inf, log(x<0) = NaN", domain="positive", grad_values=("near_zero",),
      second_order=True)
unary("sqrt", "square root (IEEE, correctly rounded)", domain="positive", grad_values=("near_zero",),
      second_order=True)
unary("rsqrt", "1 / sqrt(x)", domain="positive", grad_values=("near_zero",), second_order=True)
unary("neg", "-x", policy=EXACT_SZ)
unary("abs", "|x|", policy=EXACT_SZ, grad_values=("kink",))
unary("sin", "sine", domain="trig")
unary("cos", "cosine", domain="trig")
unary("tan", "tangent", domain="trig")
unary("atan", "arc tangent")
unary("recip", "1 / x", grad_values=("near_zero",))
unary("round", "round half to even", domain="rounding", policy=EXACT_SZ,
      not_differentiable=PIECEWISE_CONSTANT)
unary("floor", "floor", domain="rounding", policy=EXACT_SZ, not_differentiable=PIECEWISE_CONSTANT)
unary("ceil", "ceil", domain="rounding", policy=EXACT_SZ, not_differentiable=PIECEWISE_CONSTANT)
unary("sign", "-1, 0 or 1; sign(NaN) = NaN", policy=EXACT, not_differentiable=PIECEWISE_CONSTANT)
unary("softplus", "log(1 + e^x), computed stably", domain="softplus", second_order=True)
unary("elu", "x if x > 0 else e^x - 1 (alpha 1)", domain="exp", grad_values=("kink",),
      second_order=True)
unary("erf", "error function", second_order=True)
unary("hard_swish", "x * clamp(x + 3, 0, 6) / 6", domain="hard", grad_values=("kink",),
      second_order=True)
unary("hard_sigmoid", "clamp(x / 6 + 1/2, 0, 1)", domain="hard", grad_values=("kink",))
unary("mish", "x * tanh(softplus(x))", domain="softplus", second_order=True)
unary("softsign", "x / (1 + |x|)", grad_values=("kink",), second_order=True)
unary("log_sigmoid", "min(x, 0) - log1p(e^-|x|)", domain="softplus", second_order=True)

# -- binary ops ----------------------------------------------------------------------------------
binary("add", "a + b (ints wrap)")
binary("sub", "a - b (ints wrap)")
binary("mul", "a * b (ints wrap)")
binary("div", "a / b; ints truncate toward zero", domains=("real", "divisor"),
       undefined=_int_div_undefined, grad_values=("near_zero",))
binary("max", "elementwise max, NaN-propagating", policy=EXACT, grad_values=("ties",))
binary("min", "elementwise min, NaN-propagating", policy=EXACT, grad_values=("ties",))
binary("pow", "a ** b", dtypes=dt.FLOATS, domains=("pow_base", "pow_exp"), policy=APPROX,
       grad_values=("near_zero",))
binary("mod", "C fmod: sign of the dividend", domains=("real", "divisor"), policy=EXACT_SZ,
       undefined=_int_div_undefined)
binary("bit_and", "bitwise and", dtypes=dt.INTS + ("bool",), domains=("bits", "bits"), policy=EXACT)
binary("bit_or", "bitwise or", dtypes=dt.INTS + ("bool",), domains=("bits", "bits"), policy=EXACT)
binary("bit_xor", "bitwise xor", dtypes=dt.INTS + ("bool",), domains=("bits", "bits"), policy=EXACT)
binary("shl", "a << b", dtypes=dt.INTS, domains=("bits", "shift"), policy=EXACT,
       undefined=_shift_undefined)
binary("shr", "a >> b, arithmetic for signed", dtypes=dt.INTS, domains=("bits", "shift"), policy=EXACT,
       undefined=_shift_undefined)
binary("atan2", "atan2(a, b)", dtypes=dt.FLOATS, policy=APPROX)

# -- comparisons ---------------------------------------------------------------------------------
comparison("eq", "a == b")
comparison("ne", "a != b")
comparison("lt", "a < b")
comparison("le", "a <= b")
comparison("gt", "a > b")
comparison("ge", "a >= b")

# -- others --------------------------------------------------------------------------------------
declare(name="where", family="select", doc="cond ? a : b, broadcasting",
        inputs=(Input("cond", dtypes=("bool",), role="condition"), Input("a"), Input("b")),
        dtypes=dt.ALL, infer=infer.elementwise, shapes="ternary", policy=EXACT_SZ,
        error_inputs=lambda: [("non-bool condition", [_arr(3, "float32"), _arr(3, "float32"), _arr(3, "float32")], {}),
                              ("shapes do not broadcast", [_arr(3, "bool"), _arr(4, "float32"), _arr(3, "float32")], {})])

declare(name="fma", family="select", doc="a*b + c with a single rounding",
        inputs=(Input("a"), Input("b"), Input("c")), dtypes=dt.FLOATS,
        infer=infer.elementwise, shapes="ternary", policy=IEEE, error_inputs=_broadcast_errors(dt.FLOATS, 3))

declare(name="clamp", family="select", doc="min(max(x, min), max); on integer dtypes the bounds are ceil(min) and floor(max), "
        "and a bound beyond the dtype's range does not bind (it is not converted with wrap-around)",
        inputs=(Input("x", domain="clamp"),), dtypes=dt.NUMERIC,
        attrs=(Attr("min", "float", sweep=(-3.0, 0.0)), Attr("max", "float", sweep=(5.0, 6.0))),
        infer=infer.clamp, shapes="unary", policy=EXACT, grad_values=("kink",),
        error_inputs=lambda: [("min > max", [_arr(3, "float32")], {"min": 5.0, "max": 1.0})])


def _cast_undefined(inputs, attrs):
    """float -> int of NaN, inf or a value whose truncation is out of the target range."""
    (x,) = inputs
    to = attrs["to"]
    if not (np.issubdtype(x.dtype, np.floating) or x.dtype == dt.np_dtype("bfloat16")) or not dt.is_int(to):
        return None
    lo, hi = dt.iinfo(to)
    with np.errstate(invalid="ignore"):
        t = np.trunc(x.astype(np.float64))
        # hi + 1 (a power of two) is exact in float64; hi itself is not for int64 (2^63 - 1
        # rounds to 2^63, which ``t > hi`` would then let through as defined)
        return ~np.isfinite(t) | (t < lo) | (t >= float(hi + 1))


declare(name="cast", family="cast", doc="convert to dtype `to`: float->int truncates, int->int wraps (two's complement), ->bool "
        "is x != 0, ->float16/bfloat16 rounds to nearest even",
        inputs=(Input("x", domain="cast"),), dtypes=dt.ALL,
        attrs=(Attr("to", "dtype", sweep=dt.ALL),),
        infer=infer.cast, shapes="unary", policy=EXACT_SZ, undefined=_cast_undefined,
        not_differentiable="a dtype conversion: to an integer or bool it has no derivative, and "
                           "float to float is the identity up to one rounding (a step function), "
                           "whose cotangent frameworks pass through by convention",
        error_inputs=lambda: [("unknown dtype", [_arr(3, "float32")], {"to": "float8"}),
                              ("complex dtype", [_arr(3, "float32")], {"to": "complex64"})])
