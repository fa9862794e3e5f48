"""Reference kernels for normalization, attention and rope: the textbook formulas in float64
(two-pass mean/variance, max-subtracted softmax), rounded once to the output dtype."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.judge.bounds.nn import allowed_keys, attention_dims, rope_pairs

kernel = BACKEND.kernel


def _normalize(x: np.ndarray, axes: tuple[int, ...], eps: float, rms: bool) -> np.ndarray:
    if rms:
        return x / np.sqrt(np.mean(x * x, axis=axes, keepdims=True) + eps)
    d = x - np.mean(x, axis=axes, keepdims=True)
    return d / np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + eps)


def _trailing_norm(x, gamma, beta, axis, eps, rms):
    if x.size == 0:
        return x.copy()
    x64 = x.astype(np.float64)
    axes = tuple(range(axis % x.ndim, x.ndim))
    return (_normalize(x64, axes, eps, rms) * gamma.astype(np.float64) + beta.astype(np.float64)).astype(x.dtype)


@kernel("layer_norm")
def layer_norm(x, gamma, beta, *, axis, eps):
    return _trailing_norm(x, gamma, beta, axis, eps, rms=False)


@kernel("rms_norm")
def rms_norm(x, gamma, beta, *, axis, eps):
    return _trailing_norm(x, gamma, beta, axis, eps, rms=True)


@kernel("group_norm")
def group_norm(x, gamma, beta, *, num_groups, eps):
    if x.size == 0:
        return x.copy()
    n, c = x.shape[:2]
    xg = x.astype(np.float64).reshape(n, num_groups, -1)
    z = _normalize(xg, (2,), eps, rms=False).reshape(x.shape)
    per = (1, c) + (1,) * (x.ndim - 2)
    return (z * gamma.astype(np.float64).reshape(per) + beta.astype(np.float64).reshape(per)).astype(x.dtype)


@kernel("batch_norm_inference")
def batch_norm_inference(x, gamma, beta, mean, var, *, eps):
    """In float64, and in long double for float64 operands: (x - mean) / sqrt(var + eps) can
    overflow float64 on its way to a finite result (x - mean near the largest float64, a small
    variance, a tiny gamma), which its bound (judge/bounds/nn.batch_norm_bound) counts on the
    reference not to do. Found by the ONNX BatchNormalization oracle
    (tests/test_independent_oracles.py)."""
    wide = np.longdouble if x.dtype == np.float64 else np.float64
    xw, g, b, m, v = (a.astype(wide) for a in (x, gamma, beta, mean, var))
    return ((xw - m) / np.sqrt(v + wide(eps)) * g + b).astype(x.dtype)


@kernel("attention")
def attention(q, k, v, mask, *, num_heads, head_dim, mask_kind, window, score_scale, logit_softcap):
    attrs = dict(num_heads=num_heads, head_dim=head_dim, mask_kind=mask_kind, window=window,
                 score_scale=score_scale, logit_softcap=logit_softcap)
    b, sq, sk, h, hkv, d = attention_dims("attention", q.shape, k.shape, v.shape, mask.shape, attrs)
    scale = score_scale or 1 / math.sqrt(d)
    qh = q.astype(np.float64).reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    kh = np.repeat(k.astype(np.float64).reshape(b, sk, hkv, d).transpose(0, 2, 1, 3), h // hkv, axis=1)
    vh = np.repeat(v.astype(np.float64).reshape(b, sk, hkv, d).transpose(0, 2, 1, 3), h // hkv, axis=1)
    s = scale * (qh @ np.swapaxes(kh, -1, -2))
    if logit_softcap > 0:
        s = logit_softcap * np.tanh(s / logit_softcap)
    allowed = np.broadcast_to(allowed_keys(mask_kind, window, sq, sk), s.shape)
    if mask_kind == "custom":
        allowed = np.broadcast_to(mask.astype(np.float64), s.shape) != 0
    elif mask_kind == "bias":
        s = s + np.broadcast_to(mask.astype(np.float64), s.shape)
        allowed = s > -np.inf
    s = np.where(allowed, s, -np.inf)
    m = np.max(s, axis=-1, keepdims=True)
    p = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    tot = p.sum(-1, keepdims=True)
    out = (p / np.where(tot > 0, tot, np.nan)) @ vh  # a query with no key: NaN (undefined)
    return out.transpose(0, 2, 1, 3).reshape(b, sq, h * d).astype(q.dtype)


@kernel("rope")
def rope(x, cos, sin, *, head_dim, n_rot, style):
    xs = x.astype(np.float64).reshape(x.shape[:-1] + (x.shape[-1] // head_dim, head_dim))
    c = cos.astype(np.float64)[:, None, :]
    s = sin.astype(np.float64)[:, None, :]
    out = xs.copy()
    x1, x2, _ = rope_pairs(xs, head_dim, n_rot, style)
    o1, o2, _ = rope_pairs(out, head_dim, n_rot, style)
    o1[...] = x1 * c - x2 * s
    o2[...] = x2 * c + x1 * s
    return out.reshape(x.shape).astype(x.dtype)
