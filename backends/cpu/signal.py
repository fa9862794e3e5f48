"""Reference kernels for fft, the random ops, quantization and the loss.

fft runs in complex128 and rounds once. The random ops draw from a counter-based stream of their
own (Philox keyed by the two key words) and map bits to values here: uniform from 53 random bits,
normal by the inverse normal CDF (scipy.special.ndtri) of a 53-bit uniform in (0, 1).
Quantization follows the IEEE steps of its definition in the compute dtype, so the reference is
the exact result of that arithmetic.
"""
from __future__ import annotations

import numpy as np
from scipy import special

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.signal import fake_quantize_scale, param_view

kernel = BACKEND.kernel


@kernel("fft")
def fft(x, *, inverse, norm):
    c = x[..., 0].astype(np.float64) + 1j * x[..., 1].astype(np.float64)
    y = (np.fft.ifft if inverse else np.fft.fft)(c, axis=-1, norm=norm)
    return np.stack([y.real, y.imag], axis=-1).astype(x.dtype)


def _bits53(key: np.ndarray, n: int) -> np.ndarray:
    """n uniform 53-bit integers (as float64) from the key's own Philox stream."""
    k = (int(key[0]) << 32) | int(key[1])
    raw = np.random.Philox(key=k).random_raw(n) if n else np.zeros(0, np.uint64)
    return (np.asarray(raw, np.uint64) >> np.uint64(11)).astype(np.float64)


@kernel("rng_uniform")
def rng_uniform(low, high, key, *, shape):
    n = int(np.prod(shape))
    u = (_bits53(key, n) * 2.0**-53).reshape(shape)  # [0, 1)
    lo, hi = low.astype(np.float64), high.astype(np.float64)
    v = (lo + (hi - lo) * u).astype(low.dtype)
    # rounding to the compute dtype may reach high: keep the interval half-open
    top = np.nextafter(np.broadcast_to(high, shape), np.array(-np.inf, low.dtype))
    return np.where(v >= np.broadcast_to(high, shape), top, v).astype(low.dtype)


@kernel("rng_normal")
def rng_normal(mean, scale, key, *, shape):
    n = int(np.prod(shape))
    u = ((_bits53(key, n) + 0.5) * 2.0**-53).reshape(shape)  # (0, 1)
    z = special.ndtri(u)
    return (mean.astype(np.float64) + scale.astype(np.float64) * z).astype(mean.dtype)


@kernel("quantize")
def quantize(x, scale, zero_point, *, axis, to):
    """saturate(round_half_even(x / scale) + zero_point), each step in x's (compute) dtype."""
    lo, hi = dt.iinfo(to)
    s = param_view(scale, x.ndim, axis)
    z = param_view(zero_point, x.ndim, axis).astype(x.dtype)
    q = np.clip(np.rint(x / s) + z, lo, hi)
    return np.where(np.isnan(q), 0, q).astype(dt.np_dtype(to))  # NaN: undefined, masked


@kernel("dequantize")
def dequantize(x, scale, zero_point, *, axis):
    s = param_view(scale, x.ndim, axis)
    z = param_view(zero_point, x.ndim, axis)
    return (x.astype(np.int32) - z.astype(np.int32)).astype(scale.dtype) * s


@kernel("fake_quantize")
def fake_quantize(x, *, bits, axis):
    qmax = x.dtype.type(2 ** (bits - 1) - 1)
    s = fake_quantize_scale(x, bits, axis)
    y = np.clip(np.rint(x / s), -qmax, qmax) * s
    return np.where(s == 0, x, y).astype(x.dtype)


@kernel("softmax_cross_entropy")
def softmax_cross_entropy(logits, targets):
    l64, t64 = logits.astype(np.float64), targets.astype(np.float64)
    m = np.max(l64, axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(l64 - m), axis=-1, keepdims=True))
    return np.sum(t64 * (lse - l64), axis=-1).astype(logits.dtype)
