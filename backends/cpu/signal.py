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


# -- reference derivatives (float64) ---------------------------------------------------------------
vjp = BACKEND.vjp
jvp = BACKEND.jvp


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1]


def _pairs(c: np.ndarray) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1)


@vjp("fft")
def fft_vjp(inputs, attrs, cots):
    """The adjoint of y = s F c as a real map of (re, im) pairs is c̄ = conj(s F)ᵀ ȳ: an
    unnormalized DFT of the other sign, times the same scale s (norm)."""
    (x,) = inputs
    n = x.shape[-2]
    u = _complex(cots[0])
    scale = {"backward": 1.0, "ortho": 1 / np.sqrt(n), "forward": 1.0 / n}[attrs["norm"]]
    if attrs["inverse"]:  # y = s' sum_j c_j e^{+2 pi i jk/n}, s' = 1/n, 1/sqrt n, 1
        scale = {"backward": 1.0 / n, "ortho": 1 / np.sqrt(n), "forward": 1.0}[attrs["norm"]]
        return [_pairs(scale * np.fft.fft(u, axis=-1, norm="backward"))]
    return [_pairs(scale * n * np.fft.ifft(u, axis=-1, norm="backward"))]


@jvp("fft")
def fft_jvp(inputs, attrs, tans):
    """fft is linear: the tangent transformed the same way."""
    return [fft(tans[0], inverse=attrs["inverse"], norm=attrs["norm"])]


@vjp("dequantize", convention="the integer x and zero point have no derivative")
def dequantize_vjp(inputs, attrs, cots):
    """y = (x - z) s: d/ds sums u (x - z) over everything but the parameter's axis."""
    x, scale, zp = inputs
    q = x.astype(np.float64) - param_view(zp, x.ndim, attrs["axis"]).astype(np.float64)
    w = cots[0] * q
    if scale.ndim == 0:
        return [None, np.array(np.sum(w)), None]
    a = attrs["axis"] % x.ndim
    return [None, np.sum(w, axis=tuple(d for d in range(x.ndim) if d != a)), None]


@jvp("dequantize")
def dequantize_jvp(inputs, attrs, tans):
    x, _, zp = inputs
    q = x.astype(np.float64) - param_view(zp, x.ndim, attrs["axis"]).astype(np.float64)
    return [q * param_view(tans[1], x.ndim, attrs["axis"])]


def _log_softmax_parts(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(softmax, lse - logits) along the last axis, max-subtracted."""
    m = np.max(logits, axis=-1, keepdims=True)
    e = np.exp(logits - m)
    tot = np.sum(e, axis=-1, keepdims=True)
    return e / tot, (m + np.log(tot)) - logits


def _xent_dlogits(p: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """d loss / d logits = T p - t (T = sum_c t_c) per row, accurate also where a confident
    softmax matches a one-hot target: at the largest p_m, T p_m - t_m cancels, so there it is
    (T - t_m) - T sum_{j != m} p_j, both sums of the small terms."""
    tot = np.sum(targets, -1, keepdims=True)
    d = tot * p - targets
    m = np.argmax(p, axis=-1)[..., None]
    at_m = np.arange(p.shape[-1]) == m
    others_p = np.sum(np.where(at_m, 0.0, p), -1, keepdims=True)
    others_t = np.sum(np.where(at_m, 0.0, targets), -1, keepdims=True)
    np.put_along_axis(d, m, others_t - tot * others_p, axis=-1)
    return d


@vjp("softmax_cross_entropy")
def xent_vjp(inputs, attrs, cots):
    """loss = sum_c t_c (lse - l_c): d/dl = (sum_c t_c) softmax(l) - t, d/dt = lse - l."""
    logits, targets = inputs
    p, nll = _log_softmax_parts(logits)
    u = cots[0][..., None]
    return [u * _xent_dlogits(p, targets), u * nll]


@jvp("softmax_cross_entropy")
def xent_jvp(inputs, attrs, tans):
    """d loss = sum_c (T p_c - t_c) dl_c + (lse - l_c) dt_c, the first factor from the
    derivative of lse = log sum exp l (d lse = sum_c p_c dl_c)."""
    logits, targets = inputs
    dl, dt = tans
    p, nll = _log_softmax_parts(logits)
    return [np.sum(_xent_dlogits(p, targets) * dl + nll * dt, -1)]
