"""MLX kernels for the elementwise family: MLX primitives (and mlx.nn activations) where MLX has
the op, otherwise the op's formula (docs/ops.md) composed from MLX primitives (as a lowering to MLX would)."""
from __future__ import annotations

import builtins
import math

import mlx.core as mx
import mlx.nn as nn

from rlx_conformance.backends.mlx import BACKEND, MX_DTYPES

kernel = BACKEND.kernel


ACTIVATIONS = {
    # MLX's own definitions (mlx.nn) where MLX has the activation, so what the matrix finds is
    # attributable to MLX itself; mlx.core primitives for the rest.
    "gelu": nn.gelu,
    "gelu_approx": nn.gelu_approx,
    "silu": nn.silu,
    "relu": nn.relu,
    "sigmoid": mx.sigmoid,
    "tanh": mx.tanh,
    "exp": mx.exp,
    "log": mx.log,
    "sqrt": mx.sqrt,
    "rsqrt": mx.rsqrt,
    "neg": mx.negative,
    "abs": mx.abs,
    "sin": mx.sin,
    "cos": mx.cos,
    "tan": mx.tan,
    "atan": mx.arctan,
    "recip": mx.reciprocal,
    "round": mx.round,
    "floor": mx.floor,
    "ceil": mx.ceil,
    "sign": mx.sign,
    "softplus": nn.softplus,
    "elu": nn.elu,
    "erf": mx.erf,
    "hard_swish": nn.hardswish,
    # mlx.nn has no hard_sigmoid: (x + 3) / 6 rather than x / 6 + 1/2, which cancels near x = -3.
    "hard_sigmoid": lambda x: mx.clip((x + 3) / 6, 0, 1),
    "mish": nn.mish,
    "softsign": nn.softsign,
    "log_sigmoid": nn.log_sigmoid,
}


def _unary(fn):
    return lambda x: fn(x)


def _binary(fn):
    return lambda a, b: fn(a, b)


for _name, _fn in ACTIVATIONS.items():
    kernel(_name)(_unary(_fn))


def _is_int(a) -> bool:
    return mx.issubdtype(a.dtype, mx.integer)


def _trunc_div(a, b):
    q = mx.floor_divide(a, b)
    fix = (mx.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


@kernel("add")
def add(a, b):
    return mx.add(a, b)


@kernel("sub")
def sub(a, b):
    return mx.subtract(a, b)


@kernel("mul")
def mul(a, b):
    return mx.multiply(a, b)


@kernel("div")
def div(a, b):
    return _trunc_div(a, b) if _is_int(a) else mx.divide(a, b)


@kernel("mod")
def mod(a, b):
    """C fmod. Ints: a - trunc(a/b)*b. Floats: remainder of magnitudes (exact), sign of a."""
    if _is_int(a):
        return a - _trunc_div(a, b) * b
    r = mx.remainder(mx.abs(a), mx.abs(b))
    neg = (a < 0) | ((a == 0) & (mx.reciprocal(a) < 0))
    return mx.where(neg, -r, r)


kernel("max")(lambda a, b: mx.maximum(a, b))
kernel("min")(lambda a, b: mx.minimum(a, b))
kernel("pow")(lambda a, b: mx.power(a, b))
kernel("atan2")(lambda a, b: mx.arctan2(a, b))
kernel("bit_and")(lambda a, b: mx.bitwise_and(a, b))
kernel("bit_or")(lambda a, b: mx.bitwise_or(a, b))
kernel("bit_xor")(lambda a, b: mx.bitwise_xor(a, b))
kernel("shl")(lambda a, b: mx.left_shift(a, b))
kernel("shr")(lambda a, b: mx.right_shift(a, b))

for _name, _fn in {"eq": mx.equal, "ne": mx.not_equal, "lt": mx.less, "le": mx.less_equal,
                   "gt": mx.greater, "ge": mx.greater_equal}.items():
    kernel(_name)(_binary(_fn))


@kernel("where")
def where(cond, a, b):
    return mx.where(cond, a, b)


@kernel("fma")
def fma(a, b, c):
    """MLX has no elementwise fused multiply-add: a*b then + c (two roundings)."""
    return a * b + c


@kernel("clamp")
def clamp(x, *, min, max):
    if _is_int(x):
        # Bounds outside the dtype's range cannot bind; converting them would wrap (-3 -> 253).
        info = mx.iinfo(x.dtype)
        lo = builtins.min(builtins.max(math.ceil(min), info.min), info.max)
        hi = builtins.max(builtins.min(math.floor(max), info.max), info.min)
        return mx.clip(x, mx.array(lo, dtype=x.dtype), mx.array(hi, dtype=x.dtype))
    return mx.clip(x, mx.array(min, dtype=x.dtype), mx.array(max, dtype=x.dtype))


@kernel("cast")
def cast(x, *, to):
    return x.astype(MX_DTYPES[to])
