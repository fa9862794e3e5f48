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
from rlx_conformance.backends.cpu._grad import SAVED_TERMS, softmax_centered
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


def _fft_scale(n: int, attrs) -> float:
    table = {"backward": 1.0, "ortho": 1 / np.sqrt(n), "forward": 1.0 / n}
    if attrs["inverse"]:
        table = {"backward": 1.0 / n, "ortho": 1 / np.sqrt(n), "forward": 1.0}
    return table[attrs["norm"]]


def _abs_cos_sin(n: int) -> tuple[np.ndarray, np.ndarray]:
    """|cos| and |sin| of 2 pi jk / n for j, k < n. The angle depends on jk mod n alone (exact
    angles: no large products in the sine), so the n values of each are computed once and
    gathered: the same bits as evaluating all n^2 (tests/test_signal_reference.py), 2-3x faster at
    n = 4096, where every case built two 16.8M-element matrices of cosines and sines."""
    m = np.arange(n)
    c, s = np.abs(np.cos(2 * np.pi * m / n)), np.abs(np.sin(2 * np.pi * m / n))
    j = np.arange(n, dtype=np.uint64)
    jk = np.multiply.outer(j, j) % np.uint64(max(n, 1))
    return c[jk], s[jk]


@BACKEND.magnitude("fft")
def fft_magnitude(inputs, attrs, kind, seeds):
    """|J| |w| exactly: as a real map of (re, im) pairs the entries are s |cos| and s |sin| of
    2 pi jk / n (symmetric in j, k and the same for either sign, so one formula for vjp and
    jvp); a result sums 2n products. Dense in n (the matrix of angles), cheap at the case sizes."""
    (x,) = inputs
    n = x.shape[-2]
    if not x.size:
        return [np.zeros(x.shape)], 1
    c, s = _abs_cos_sin(n)
    w = np.abs(seeds[0])
    re = w[..., 0] @ c + w[..., 1] @ s
    im = w[..., 0] @ s + w[..., 1] @ c
    return [_fft_scale(n, attrs) * np.stack([re, im], axis=-1)], 2 * n


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


@BACKEND.magnitude("dequantize")
def dequantize_magnitude(inputs, attrs, kind, seeds):
    """y = (x - z) s is linear in s with coefficients x - z: the rules at |x - z| (as x, with a
    zero point of 0) give |J|-product exactly; a VJP result sums every element of its channel."""
    x, scale, zp = inputs
    q = np.abs(x.astype(np.float64) - param_view(zp, x.ndim, attrs["axis"]).astype(np.float64))
    at = [q, scale, np.zeros(zp.shape)]
    if kind == "vjp":
        return [None, np.abs(dequantize_vjp(at, attrs, [np.abs(seeds[0])])[1]), None], \
            max(x.size // max(scale.size, 1), 1)
    return [dequantize_jvp(at, attrs, [None, np.abs(seeds[1]), None])[0]], 1


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
    raw = d.copy()
    np.put_along_axis(d, m, others_t - tot * others_p, axis=-1)
    # a NaN of the plain form stays NaN (a one-class row has no other term to carry a NaN logit)
    return np.where(np.isnan(raw), raw, d)


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


@BACKEND.hvp("softmax_cross_entropy")
def xent_hvp(inputs, attrs, cots, tans):
    """d/de of the VJP (u (T p - t), u (lse - l)) along (l + e vl, t + e vt): for the logits
    u (T dp + (sum vt) p - vt) with dp = p (vl - <p, vl>) (softmax's JVP), for the targets
    u (<p, vl> - vl) (d lse = <p, dl>)."""
    logits, targets = inputs
    vl, vt = tans
    p, _ = _log_softmax_parts(logits)
    u = cots[0][..., None]
    c = softmax_centered(p, vl, -1)
    dp = p * c
    tot = np.sum(targets, -1, keepdims=True)
    return [u * (tot * dp + np.sum(vt, -1, keepdims=True) * p - vt), -u * c]


@BACKEND.hvp_magnitude("softmax_cross_entropy")
def xent_hvp_magnitude(inputs, attrs, cots, tans):
    """xent_hvp's terms in absolute value: |u| (sum|t| |dp| + sum|vt| p + |vt|) and
    |u| (|vl| + <p, |vl|>), |dp| <= p (|vl| + <p, |vl|>), with each p_c scaled by
    1 + (|lse| + lse - l_c) / (n + 2): MLX forms p = exp(l - lse) from the rounded lse and
    difference, so p_c carries (n + 2 + |lse| + |lse - l_c|) u relative error (n the classes).
    Terms 2 (n + 2) + 2: quadratic in p, and the sums along the classes are n products each."""
    logits, targets = inputs
    vl, vt = tans
    n = logits.shape[-1]
    p, nll = _log_softmax_parts(logits)
    pw = p * (1 + (np.abs(nll + logits) + nll) / (n + 2))
    u = np.abs(cots[0])[..., None]
    avl, avt = np.abs(vl), np.abs(vt)
    cl = avl + np.sum(pw * avl, -1, keepdims=True)
    tot = np.sum(np.abs(targets), -1, keepdims=True)
    return [u * (tot * pw * cl + np.sum(avt, -1, keepdims=True) * pw + avt), u * cl], 2 * (n + 2) + 2


def _xent_saved(inputs, attrs, kind, seeds):
    """MLX composes the loss from logsumexp, whose VJP is exp(l - lse) from the rounded saved lse:
    rounding lse and the difference l - lse moves p_c by p_c (|lse| + |lse - l_c|) u, so the
    logits' partial T p - t by T times that (it dominates where p matches a one-hot target), and
    T itself is a sum over the classes;
    the targets' partial lse - l_c cancels where l_c is near lse (values of small spread)."""
    logits, targets = inputs
    p, nll = _log_softmax_parts(logits)
    lse = nll + logits
    c = logits.shape[-1]
    d = np.abs(np.sum(targets, -1, keepdims=True)) * p * (np.abs(lse) + np.abs(nll))
    # the logits' partial T p - t takes T = sum_c t_c (times the cotangent: the VJP of the
    # broadcast lse) as a sum over the C classes: gamma_C of sum_c |t_c| (C in units of u), as
    # the targets' partial below
    d = d + np.sum(np.abs(targets), -1, keepdims=True) * p * c
    # the targets' partial lse - l_c from the saved lse: its rounding u |lse| and the log of a
    # sum of C terms, gamma_C absolute (C, the classes, in units of u)
    dt_ = np.abs(lse) + c
    if kind == "vjp":
        u = np.abs(seeds[0])[..., None]
        return [u * d, u * dt_]
    return [np.sum(d * np.abs(seeds[0]) + dt_ * np.abs(seeds[1]), -1)]


@BACKEND.magnitude("softmax_cross_entropy")
def xent_magnitude(inputs, attrs, kind, seeds):
    """Each logit and target feeds one row's loss: the partials (the VJP at a unit cotangent)
    times |seed| exactly (a VJP result is one product, a JVP one sums 2C), plus _xent_saved."""
    logits = inputs[0]
    dl, dt_ = (np.abs(g) for g in xent_vjp(inputs, attrs, [np.ones(logits.shape[:-1])]))
    saved = _xent_saved(inputs, attrs, kind, seeds)
    if kind == "vjp":
        u = np.abs(seeds[0])[..., None]
        return [u * dl + saved[0], u * dt_ + saved[1]], 1
    return [np.sum(dl * np.abs(seeds[0]) + dt_ * np.abs(seeds[1]), -1) + saved[0]], 2 * logits.shape[-1]


SAVED_TERMS["softmax_cross_entropy"] = _xent_saved
