"""MLX kernels for normalization, attention and rope, native mlx.core: mx.fast.layer_norm and
mx.fast.rms_norm (last axis only, so the normalized trailing dims are flattened first),
mx.fast.scaled_dot_product_attention for every mask kind it takes (none, causal, boolean and
additive masks; a sliding window becomes a boolean mask), and composed mlx ops where no fast
op fits (group_norm, batch_norm_inference, logit softcapping, rope with given cos/sin tables:
mx.fast.rope computes its own angles)."""
from __future__ import annotations

import math

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND

kernel = BACKEND.kernel


def _flatten_trailing(x, axis):
    axis = axis % x.ndim
    n = math.prod(x.shape[axis:])
    return x.reshape(tuple(x.shape[:axis]) + (n,)), n


@kernel("layer_norm")
def layer_norm(x, gamma, beta, *, axis, eps):
    x2, n = _flatten_trailing(x, axis)
    return mx.fast.layer_norm(x2, gamma.reshape(n), beta.reshape(n), eps).reshape(x.shape)


@kernel("rms_norm")
def rms_norm(x, gamma, beta, *, axis, eps):
    x2, n = _flatten_trailing(x, axis)
    return (mx.fast.rms_norm(x2, gamma.reshape(n), eps) + beta.reshape(n)).reshape(x.shape)


@kernel("group_norm")
def group_norm(x, gamma, beta, *, num_groups, eps):
    """Two-pass mean and variance per (sample, group)."""
    n, c = x.shape[:2]
    xg = x.reshape(n, num_groups, -1)
    d = xg - mx.mean(xg, axis=-1, keepdims=True)
    z = (d * mx.rsqrt(mx.mean(d * d, axis=-1, keepdims=True) + eps)).reshape(x.shape)
    per = (1, c) + (1,) * (x.ndim - 2)
    return z * gamma.reshape(per) + beta.reshape(per)


@kernel("batch_norm_inference")
def batch_norm_inference(x, gamma, beta, mean, var, *, eps):
    return (x - mean) * mx.rsqrt(var + eps) * gamma + beta


def _structural_mask(kind, window, sq, sk):
    pos = mx.arange(sq)[:, None] + (sk - sq)
    j = mx.arange(sk)[None, :]
    if kind == "causal":
        return j <= pos
    return (j <= pos) & (j > pos - window)


@kernel("attention")
def attention(q, k, v, mask, *, num_heads, head_dim, mask_kind, window, score_scale, logit_softcap):
    b, sq, _ = q.shape
    sk = k.shape[1]
    h, d = num_heads, head_dim
    hkv = k.shape[-1] // d
    scale = score_scale or 1 / math.sqrt(d)
    qh = q.reshape(b, sq, h, d).transpose(0, 2, 1, 3)
    kh = k.reshape(b, sk, hkv, d).transpose(0, 2, 1, 3)
    vh = v.reshape(b, sk, hkv, d).transpose(0, 2, 1, 3)
    if mask_kind == "none":
        m = None
    elif mask_kind == "causal":
        m = "causal"
    elif mask_kind == "sliding_window":
        m = _structural_mask(mask_kind, window, sq, sk)
    elif mask_kind == "custom":
        m = mask != 0
    else:
        m = mask
    if logit_softcap == 0:
        out = mx.fast.scaled_dot_product_attention(qh, kh, vh, scale=scale, mask=m)
    else:  # no fast path for softcapping: scores, cap, mask, softmax, weighted sum
        rep = h // hkv
        kr, vr = mx.repeat(kh, rep, axis=1), mx.repeat(vh, rep, axis=1)
        s = (qh * scale) @ mx.swapaxes(kr, -1, -2)
        s = logit_softcap * mx.tanh(s / logit_softcap)
        if m is not None:
            if isinstance(m, str):
                m = _structural_mask("causal", 0, sq, sk)
            s = mx.where(m, s, -mx.inf) if m.dtype == mx.bool_ else s + m
        out = mx.softmax(s, axis=-1, precise=True) @ vr
    return out.transpose(0, 2, 1, 3).reshape(b, sq, h * d)


def rope(x, cos, sin, *, head_dim, n_rot, style):
    xs = x.reshape(tuple(x.shape[:-1]) + (x.shape[-1] // head_dim, head_dim))
    c = cos[:, None, :]
    s = sin[:, None, :]
    half = n_rot // 2
    rest = xs[..., n_rot:]
    if style == "neox":
        x1, x2 = xs[..., :half], xs[..., half:n_rot]
        rot = mx.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)
    else:
        x1, x2 = xs[..., 0:n_rot:2], xs[..., 1:n_rot:2]
        rot = mx.stack([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).reshape(tuple(xs.shape[:-1]) + (n_rot,))
    return mx.concatenate([rot, rest], axis=-1).reshape(x.shape)


# registered undecorated, so that rope_backward (backward.py) reuses it in a standalone repro
kernel("rope")(rope)
