"""Reference kernels for the elementwise family, one function per op under the op's name.

Float kernels receive float32 or float64 arrays (float16/bfloat16 were widened to float32 by the
backend) and return the same dtype. ``_f64`` evaluates a float32 op in float64 and rounds once,
which makes the reference (nearly) correctly rounded rather than as good as numpy's float32 libm.
At +-inf the reference takes each function's limit (gelu(-inf) = -0, softsign(inf) = 1), not
the NaN that evaluating its formula literally gives.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import scipy.special as sp

from rlx_conformance import dtypes as dt

from . import BACKEND

kernel = BACKEND.kernel


def _f64(fn):
    """Evaluate ``fn`` in float64 and round the result once to the first input's dtype."""
    def run(*xs):
        out = xs[0].dtype
        return np.asarray(fn(*(x.astype(np.float64) for x in xs))).astype(out)
    return run


def _is_int(x: np.ndarray) -> bool:
    return np.issubdtype(x.dtype, np.integer)


# -- activations ---------------------------------------------------------------------------------
def _gated(fn):
    """x * g(x) with g(-inf) = 0: the continuous extension at -inf is -0 (the limit), not the NaN
    of -inf * 0; at +inf it is +inf."""
    def run(x):
        return np.where(np.isinf(x), np.where(x > 0, x, -0.0), fn(x))
    return run


ACTIVATIONS = {
    # Phi(x) = erfc(-x/sqrt2)/2 stays accurate for negative x, where 1 + erf(x/sqrt2) cancels.
    "gelu": _gated(lambda x: x * 0.5 * sp.erfc(-x / np.sqrt(2.0))),
    # 0.5 (1 + tanh z) = sigmoid(2z): the same function without the cancellation for z << 0.
    "gelu_approx": _gated(lambda x: x * sp.expit(2 * np.sqrt(2 / np.pi) * (x + 0.044715 * x**3))),
    "silu": _gated(lambda x: x * sp.expit(x)),
    "relu": lambda x: np.where(np.isnan(x), x, np.maximum(x, 0)),
    "sigmoid": sp.expit,
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "neg": np.negative,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "atan": np.arctan,
    "recip": lambda x: 1 / x,
    "round": np.rint,  # half to even
    "floor": np.floor,
    "ceil": np.ceil,
    "sign": np.sign,  # sign(NaN) = NaN
    "softplus": lambda x: np.logaddexp(0.0, x),
    "elu": lambda x: np.where(x > 0, x, np.expm1(x)),
    "erf": sp.erf,
    "hard_swish": _gated(lambda x: x * np.clip(x + 3, 0, 6) / 6),
    # (x + 3) / 6, not x/6 + 1/2: x + 3 is exact near the zero crossing (Sterbenz), so float64
    # inputs (which get no wider evaluation) keep full relative accuracy there.
    "hard_sigmoid": lambda x: np.clip((x + 3) / 6, 0, 1),
    "mish": _gated(lambda x: x * np.tanh(np.logaddexp(0.0, x))),
    # The continuous extension at +-inf (the limit +-1), not the NaN of inf/inf.
    "softsign": lambda x: np.where(np.isinf(x), np.sign(x), x / (1 + np.abs(x))),
    "log_sigmoid": lambda x: np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x))),
}
for _name, _fn in ACTIVATIONS.items():
    kernel(_name)(_f64(_fn))


# -- binary --------------------------------------------------------------------------------------
def _arith(float_fn, int_fn):
    def run(a, b):
        return int_fn(a, b) if _is_int(a) else _f64(float_fn)(a, b)
    return run


def _int_div(a, b):
    """Truncating integer division; b == 0 and INT_MIN / -1 are undefined (masked by the spec)."""
    safe = np.where(b == 0, 1, b)
    q = a // safe
    fix = ((a % safe) != 0) & ((a < 0) != (safe < 0))
    return (q + fix).astype(a.dtype)


for _name, (_ff, _if) in {
    "add": (np.add, np.add),
    "sub": (np.subtract, np.subtract),
    "mul": (np.multiply, np.multiply),
    "div": (np.divide, _int_div),
    "mod": (np.fmod, lambda a, b: np.fmod(a, np.where(b == 0, 1, b)).astype(a.dtype)),
}.items():
    kernel(_name)(_arith(_ff, _if))

kernel("max")(np.maximum)  # NaN-propagating
kernel("min")(np.minimum)
kernel("pow")(_f64(np.power))
kernel("atan2")(_f64(np.arctan2))
kernel("bit_and")(np.bitwise_and)
kernel("bit_or")(np.bitwise_or)
kernel("bit_xor")(np.bitwise_xor)


def _shift(fn):
    """Shift with the count clipped into [0, bits): counts outside are undefined (masked)."""
    def run(a, b):
        bits = a.dtype.itemsize * 8
        return fn(a, np.clip(b.astype(np.int64), 0, bits - 1).astype(a.dtype))
    return run


kernel("shl")(_shift(np.left_shift))
kernel("shr")(_shift(np.right_shift))  # arithmetic for signed dtypes

# -- comparisons ---------------------------------------------------------------------------------
for _name, _fn in {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
                   "gt": np.greater, "ge": np.greater_equal}.items():
    kernel(_name)(_fn)


@kernel("where")
def where(cond, a, b):
    return np.where(cond, a, b)


# -- fma: exact ----------------------------------------------------------------------------------
def round_fraction(q: Fraction, dtype: np.dtype) -> float:
    """Round an exact rational to the nearest value of a float dtype, ties to even (overflow to inf)."""
    fi = dt.finfo(dt.name_of(dtype))
    if q == 0:
        return 0.0
    try:
        y = np.asarray(float(q)).astype(dtype)  # near the answer, possibly double rounded
    except OverflowError:
        y = np.asarray(np.inf if q > 0 else -np.inf).astype(dtype)
    best = None
    for c in (y, np.nextafter(y, np.asarray(np.inf, dtype)), np.nextafter(y, np.asarray(-np.inf, dtype))):
        if not np.isfinite(c):
            continue
        d = abs(Fraction(float(c)) - q)
        even = (int(np.asarray(c).view(fi.uint)) & 1) == 0
        key = (d, not even)
        if best is None or key < best[0]:
            best = (key, float(c))
    # Overflow: beyond max + half an ulp of max rounds to infinity.
    half = Fraction(fi.max) + Fraction(2.0 ** (np.log2(fi.max) // 1 - fi.mant_bits)) / 2
    if abs(q) >= half:
        return float(np.inf if q > 0 else -np.inf)
    return best[1]


@kernel("fma")
def fma(a, b, c):
    """a*b + c rounded once: exact rational arithmetic for finite operands, IEEE rules otherwise."""
    a, b, c = np.broadcast_arrays(a, b, c)
    out = np.array(a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64), dtype=a.dtype)
    finite = np.isfinite(a) & np.isfinite(b) & np.isfinite(c)
    for i in np.ndindex(out.shape):
        if not finite[i]:
            continue
        q = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        if q != 0:  # an exact zero keeps the IEEE sign rule of the float computation
            out[i] = round_fraction(q, a.dtype)
        elif a[i] * b[i] != 0:
            out[i] = 0.0  # exact cancellation of a nonzero product gives +0 (round to nearest)
    return out


@kernel("clamp")
def clamp(x, *, min, max):
    """min(max(x, min), max) in exact arithmetic: bounds beyond the dtype's range cannot bind."""
    wide = np.float64 if np.issubdtype(x.dtype, np.floating) else np.int64
    lo, hi = (wide(min), wide(max)) if wide is np.float64 else (np.int64(np.ceil(min)), np.int64(np.floor(max)))
    return np.clip(x.astype(wide), lo, hi).astype(x.dtype)


@kernel("cast")
def cast(x, *, to):
    """astype with the spec's rules: float->int truncates (out of range is undefined, masked),
    ->bool is x != 0, to a float rounds once to nearest even (via float64, exact for ints < 2^53)."""
    target = dt.np_dtype(to)
    if to == "bool":
        return x != 0
    if dt.is_float(to):
        src = x.astype(np.float64) if x.dtype != np.float64 and x.dtype != np.bool_ else x
        return src.astype(target)
    if np.issubdtype(x.dtype, np.floating):
        lo, hi = dt.iinfo(to)
        t = np.trunc(x.astype(np.float64))
        t = np.where(np.isfinite(t), np.clip(t, lo, hi), 0)
        return t.astype(np.int64).astype(target) if to != "uint32" else t.astype(np.uint64).astype(target)
    return x.astype(target)
