"""Elementwise ops (OPS.md "Elementwise"): 29 activations, 14 binary ops, 6 comparisons, where,
fma, clamp, cast."""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import Attr, Input, Policy, declare

# -- activations: name -> (value domain, doc, policy) --------------------------------------------
EXACT_SZ = Policy(exact=True, signed_zero=True)  # results exactly defined, sign of zero included
EXACT = Policy(exact=True)
APPROX = Policy()  # within the tolerance table (cases/tolerances.toml)

ACTIVATIONS = {
    "gelu": ("gelu", "x * Phi(x), exact erf form", APPROX),
    "gelu_approx": ("gelu", "tanh form: 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3)))", APPROX),
    "silu": ("sigmoid", "x * sigmoid(x)", APPROX),
    "relu": ("real", "max(x, 0)", EXACT),
    "sigmoid": ("sigmoid", "1 / (1 + e^-x)", APPROX),
    "tanh": ("sigmoid", "hyperbolic tangent", APPROX),
    "exp": ("exp", "e^x", APPROX),
    "log": ("positive", "natural log; log(0) = -inf, log(x<0) = NaN", APPROX),
    "sqrt": ("positive", "square root (IEEE, correctly rounded)", APPROX),
    "rsqrt": ("positive", "1 / sqrt(x)", APPROX),
    "neg": ("real", "-x", EXACT_SZ),
    "abs": ("real", "|x|", EXACT_SZ),
    "sin": ("trig", "sine", APPROX),
    "cos": ("trig", "cosine", APPROX),
    "tan": ("trig", "tangent", APPROX),
    "atan": ("real", "arc tangent", APPROX),
    "recip": ("real", "1 / x", APPROX),
    "round": ("rounding", "round half to even", EXACT_SZ),
    "floor": ("rounding", "floor", EXACT_SZ),
    "ceil": ("rounding", "ceil", EXACT_SZ),
    "sign": ("real", "-1, 0 or 1; sign(NaN) = NaN", EXACT),
    "softplus": ("softplus", "log(1 + e^x), computed stably", APPROX),
    "elu": ("exp", "x if x > 0 else e^x - 1 (alpha 1)", APPROX),
    "erf": ("real", "error function", APPROX),
    "hard_swish": ("hard", "x * clamp(x + 3, 0, 6) / 6", APPROX),
    "hard_sigmoid": ("hard", "clamp(x / 6 + 1/2, 0, 1)", APPROX),
    "mish": ("softplus", "x * tanh(softplus(x))", APPROX),
    "softsign": ("real", "x / (1 + |x|)", APPROX),
    "log_sigmoid": ("softplus", "min(x, 0) - log1p(e^-|x|)", APPROX),
}

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


for _name, (_domain, _doc, _policy) in ACTIVATIONS.items():
    declare(name=_name, family="activation", doc=_doc,
            inputs=(Input("x", domain=_domain),), dtypes=dt.FLOATS,
            infer=infer.same, shapes="unary", policy=_policy, error_inputs=_activation_errors)


# -- binary ops ----------------------------------------------------------------------------------
def _int_div_undefined(inputs, attrs):
    """Integer division/mod by zero, and INT_MIN / -1 (overflow), are undefined (OPS.md)."""
    a, b = inputs
    if not np.issubdtype(a.dtype, np.integer):
        return None
    bad = b == 0
    if np.issubdtype(a.dtype, np.signedinteger):
        bad = bad | ((a == np.iinfo(a.dtype).min) & (b == -1))
    return bad


def _shift_undefined(inputs, attrs):
    """Shift counts outside [0, bits) are undefined (OPS.md)."""
    a, b = inputs
    bits = a.dtype.itemsize * 8
    return (b.astype(np.int64) < 0) | (b.astype(np.int64) >= bits)


_IEEE = Policy(signed_zero=True)  # correctly rounded IEEE ops: tolerance 0 ULP in tolerances.toml
BINARY = {
    "add": (dt.NUMERIC, "real", "real", "a + b (ints wrap)", _IEEE, None),
    "sub": (dt.NUMERIC, "real", "real", "a - b (ints wrap)", _IEEE, None),
    "mul": (dt.NUMERIC, "real", "real", "a * b (ints wrap)", _IEEE, None),
    "div": (dt.NUMERIC, "real", "divisor", "a / b; ints truncate toward zero", _IEEE, _int_div_undefined),
    "max": (dt.NUMERIC, "real", "real", "elementwise max, NaN-propagating", EXACT, None),
    "min": (dt.NUMERIC, "real", "real", "elementwise min, NaN-propagating", EXACT, None),
    "pow": (dt.FLOATS, "pow_base", "pow_exp", "a ** b", APPROX, None),
    "mod": (dt.NUMERIC, "real", "divisor", "C fmod: sign of the dividend", EXACT_SZ, _int_div_undefined),
    "bit_and": (dt.INTS + ("bool",), "bits", "bits", "bitwise and", EXACT, None),
    "bit_or": (dt.INTS + ("bool",), "bits", "bits", "bitwise or", EXACT, None),
    "bit_xor": (dt.INTS + ("bool",), "bits", "bits", "bitwise xor", EXACT, None),
    "shl": (dt.INTS, "bits", "shift", "a << b", EXACT, _shift_undefined),
    "shr": (dt.INTS, "bits", "shift", "a >> b, arithmetic for signed", EXACT, _shift_undefined),
    "atan2": (dt.FLOATS, "real", "real", "atan2(a, b)", APPROX, None),
}

for _name, (_dtypes, _da, _db, _doc, _policy, _undef) in BINARY.items():
    declare(name=_name, family="binary", doc=_doc,
            inputs=(Input("a", domain=_da), Input("b", domain=_db)), dtypes=_dtypes,
            infer=infer.elementwise, shapes="binary", policy=_policy,
            error_inputs=_broadcast_errors(_dtypes),
            **({"undefined": _undef} if _undef else {}))

# -- comparisons ---------------------------------------------------------------------------------
for _name, _doc in {"eq": "a == b", "ne": "a != b", "lt": "a < b", "le": "a <= b",
                    "gt": "a > b", "ge": "a >= b"}.items():
    declare(name=_name, family="compare", doc=_doc + " (IEEE: NaN compares unequal)",
            inputs=(Input("a", domain="compare"), Input("b", domain="compare")), dtypes=dt.ALL,
            infer=infer.predicate, shapes="binary", policy=EXACT, error_inputs=_broadcast_errors(dt.ALL))

# -- others --------------------------------------------------------------------------------------
declare(name="where", family="select", doc="cond ? a : b, broadcasting",
        inputs=(Input("cond", dtypes=("bool",), role="condition"), Input("a"), Input("b")),
        dtypes=dt.ALL, infer=infer.elementwise, shapes="ternary", policy=EXACT_SZ,
        error_inputs=lambda: [("non-bool condition", [_arr(3, "float32"), _arr(3, "float32"), _arr(3, "float32")], {}),
                              ("shapes do not broadcast", [_arr(3, "bool"), _arr(4, "float32"), _arr(3, "float32")], {})])

declare(name="fma", family="select", doc="a*b + c with a single rounding",
        inputs=(Input("a"), Input("b"), Input("c")), dtypes=dt.FLOATS,
        infer=infer.elementwise, shapes="ternary", policy=_IEEE, error_inputs=_broadcast_errors(dt.FLOATS, 3))

declare(name="clamp", family="select", doc="min(max(x, min), max), bounds converted to x's dtype",
        inputs=(Input("x", domain="clamp"),), dtypes=dt.NUMERIC,
        attrs=(Attr("min", "float", sweep=(-3.0, 0.0)), Attr("max", "float", sweep=(5.0, 6.0))),
        infer=infer.clamp, shapes="unary", policy=EXACT,
        error_inputs=lambda: [("min > max", [_arr(3, "float32")], {"min": 5.0, "max": 1.0})])


def _cast_undefined(inputs, attrs):
    """float -> int of NaN, inf or a value whose truncation is out of the target range (OPS.md)."""
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


declare(name="cast", family="cast", doc="convert to dtype `to`: float->int truncates, ->bool is x != 0, "
        "->float16/bfloat16 rounds to nearest even",
        inputs=(Input("x", domain="cast"),), dtypes=dt.ALL,
        attrs=(Attr("to", "dtype", sweep=dt.ALL),),
        infer=infer.cast, shapes="unary", policy=EXACT_SZ, undefined=_cast_undefined,
        error_inputs=lambda: [("unknown dtype", [_arr(3, "float32")], {"to": "float8"}),
                              ("complex dtype", [_arr(3, "float32")], {"to": "complex64"})])
