"""Reference kernels for normalization, attention and rope: the textbook formulas in float64
(two-pass mean/variance, max-subtracted softmax), rounded once to the output dtype."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import softmax_centered, unbroadcast
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


# -- reference derivatives (float64) ---------------------------------------------------------------
vjp = BACKEND.vjp
jvp = BACKEND.jvp


def _stats(x: np.ndarray, axes: tuple[int, ...], eps: float, rms: bool) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, r): the normalized x and the denominator sqrt(var + eps) (sqrt(mean x^2 + eps))."""
    d = x if rms else x - np.mean(x, axis=axes, keepdims=True)
    r = np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + eps)
    return d / r, r


def _normalize_vjp(x, axes, eps, rms, g):
    """Jᵀ of xhat = (x - mean) / r for the cotangent g of xhat:
    (g - mean(g) - xhat mean(g xhat)) / r (rms: no mean(g) term)."""
    xhat, r = _stats(x, axes, eps, rms)
    proj = xhat * np.mean(g * xhat, axis=axes, keepdims=True)
    return (g - proj if rms else g - np.mean(g, axis=axes, keepdims=True) - proj) / r


def _normalize_jvp(x, axes, eps, rms, t):
    """Forward mode: d = t - mean(t) (rms: t); dr = mean(xc d) / r; dxhat = (d - xhat dr) / r."""
    xhat, r = _stats(x, axes, eps, rms)
    d = t if rms else t - np.mean(t, axis=axes, keepdims=True)
    xc = xhat * r
    dr = np.mean(xc * d, axis=axes, keepdims=True) / r
    return (d - xhat * dr) / r


def _trailing_rules(op: str, rms: bool) -> None:
    """layer_norm / rms_norm over x.shape[axis:], gamma and beta of that shape."""
    def axes_of(x, attrs):
        return tuple(range(attrs["axis"] % x.ndim, x.ndim))

    def _vjp(inputs, attrs, cots):
        x, gamma, _ = inputs
        u = cots[0]
        if not x.size:
            return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
        axes = axes_of(x, attrs)
        lead = tuple(range(x.ndim - gamma.ndim))
        xhat, _ = _stats(x, axes, attrs["eps"], rms)
        return [_normalize_vjp(x, axes, attrs["eps"], rms, u * gamma),
                np.sum(u * xhat, axis=lead), np.sum(u, axis=lead)]

    def _jvp(inputs, attrs, tans):
        x, gamma, _ = inputs
        tx, tg, tb = tans
        if not x.size:
            return [np.zeros(x.shape)]
        axes = axes_of(x, attrs)
        xhat, _ = _stats(x, axes, attrs["eps"], rms)
        return [_normalize_jvp(x, axes, attrs["eps"], rms, tx) * gamma + xhat * tg + tb]

    def _condition(inputs, attrs):
        x = inputs[0]
        return _centering_condition(x, axes_of(x, attrs), attrs["eps"]) if x.size and not rms else 1.0

    vjp(op, condition=_condition)(_vjp)
    jvp(op)(_jvp)


def _centering_condition(x: np.ndarray, axes: tuple[int, ...], eps: float) -> float:
    """max |x| / sqrt(var + eps) over the normalized groups: x - mean carries eps max|x| absolute
    error, so the normalized values (and both rules) carry that much relative to the spread (the
    spread class: large values, small variance)."""
    _, r = _stats(x, axes, eps, False)
    return float(np.max(np.max(np.abs(x), axis=axes, keepdims=True) / r))


_trailing_rules("layer_norm", rms=False)
_trailing_rules("rms_norm", rms=True)


def _per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    return p.reshape((1, -1) + (1,) * (ndim - 2))


@vjp("group_norm", condition=lambda xs, attrs: _centering_condition(
    xs[0].reshape(xs[0].shape[0], attrs["num_groups"], -1), (2,), attrs["eps"]) if xs[0].size else 1.0)
def group_norm_vjp(inputs, attrs, cots):
    x, gamma, _ = inputs
    u = cots[0]
    if not x.size:
        return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
    n, g = x.shape[0], attrs["num_groups"]
    xg = x.reshape(n, g, -1)
    xhat = _stats(xg, (2,), attrs["eps"], False)[0].reshape(x.shape)
    other = (0,) + tuple(range(2, x.ndim))
    dxg = _normalize_vjp(xg, (2,), attrs["eps"], False, (u * _per_channel(gamma, x.ndim)).reshape(n, g, -1))
    return [dxg.reshape(x.shape), np.sum(u * xhat, axis=other), np.sum(u, axis=other)]


@jvp("group_norm")
def group_norm_jvp(inputs, attrs, tans):
    x, gamma, _ = inputs
    tx, tg, tb = tans
    if not x.size:
        return [np.zeros(x.shape)]
    n, g = x.shape[0], attrs["num_groups"]
    xg = x.reshape(n, g, -1)
    xhat = _stats(xg, (2,), attrs["eps"], False)[0].reshape(x.shape)
    dxhat = _normalize_jvp(xg, (2,), attrs["eps"], False, tx.reshape(n, g, -1)).reshape(x.shape)
    return [dxhat * _per_channel(gamma, x.ndim) + xhat * _per_channel(tg, x.ndim) + _per_channel(tb, x.ndim)]


@vjp("batch_norm_inference", convention="var + eps <= 0 has no derivative (a pole at var = -eps)",
     radius=lambda xs, attrs: [None, None, None, None, np.abs(xs[4] + attrs["eps"])])
def batch_norm_vjp(inputs, attrs, cots):
    """y = (x - m) s gamma + beta, s = (var + eps)^-1/2, per feature (last axis)."""
    x, gamma, _, mean, var = inputs
    u = cots[0]
    lead = tuple(range(x.ndim - 1))
    s = 1 / np.sqrt(var + attrs["eps"])
    su = np.sum(u, axis=lead)
    sux = np.sum(u * (x - mean), axis=lead)
    return [u * gamma * s, sux * s, su, -su * gamma * s, -0.5 * sux * gamma * s ** 3]


@jvp("batch_norm_inference")
def batch_norm_jvp(inputs, attrs, tans):
    x, gamma, _, mean, var = inputs
    tx, tg, tb, tm, tv = tans
    s = 1 / np.sqrt(var + attrs["eps"])
    ds = -0.5 * tv * s / (var + attrs["eps"])
    return [(tx - tm) * s * gamma + (x - mean) * (ds * gamma + s * tg) + tb]


def _heads(a: np.ndarray, b: int, s: int, h: int, d: int) -> np.ndarray:
    return a.reshape(b, s, h, d).transpose(0, 2, 1, 3)


def _unheads(a: np.ndarray) -> np.ndarray:
    b, h, s, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, s, h * d)


def _attention_parts(q, k, v, mask, attrs):
    """The forward pass in float64, with what both rules need: dims, scale, heads (k, v repeated
    to the query heads), pre-cap scores, weights p (0 at masked keys and for queries with no key)."""
    b, sq, sk, h, hkv, d = attention_dims("attention", q.shape, k.shape, v.shape, mask.shape, attrs)
    scale = attrs["score_scale"] or 1 / math.sqrt(d)
    qh, kh, vh = _heads(q, b, sq, h, d), _heads(k, b, sk, hkv, d), _heads(v, b, sk, hkv, d)
    kh, vh = np.repeat(kh, h // hkv, axis=1), np.repeat(vh, h // hkv, axis=1)
    s0 = scale * (qh @ np.swapaxes(kh, -1, -2))
    c = attrs["logit_softcap"]
    s = c * np.tanh(s0 / c) if c > 0 else s0
    kind = attrs["mask_kind"]
    allowed = np.broadcast_to(allowed_keys(kind, attrs["window"], sq, sk), s.shape)
    if kind == "custom":
        allowed = np.broadcast_to(mask, s.shape) != 0
    elif kind == "bias":
        s = s + np.broadcast_to(mask, s.shape)
        allowed = s > -np.inf
    z = np.where(allowed, s, -np.inf)
    m = np.max(z, axis=-1, keepdims=True)
    e = np.where(allowed, np.exp(z - np.where(np.isfinite(m), m, 0.0)), 0.0)
    tot = e.sum(-1, keepdims=True)
    p = e / np.where(tot > 0, tot, 1.0)  # a query with no key: p = 0 (its output is undefined)
    return (b, sq, sk, h, hkv, d), scale, qh, kh, vh, s0, p


def _fold_heads(a: np.ndarray, hkv: int) -> np.ndarray:
    """Cotangents of the repeated k/v heads summed back onto the hkv shared heads."""
    b, h, s, d = a.shape
    return a.reshape(b, hkv, h // hkv, s, d).sum(2)


def _softcap_slope(s0: np.ndarray, c: float) -> np.ndarray:
    return 1 / np.cosh(s0 / c) ** 2 if c > 0 else np.ones_like(s0)


@vjp("attention", convention="a query that may attend to no key has an undefined output and "
     "passes no cotangent; the mask has a derivative only as an additive bias (mask_kind bias): "
     "a custom mask selects, the structural kinds take none")
def attention_vjp(inputs, attrs, cots):
    q, k, v, mask = inputs
    (b, sq, _, h, hkv, d), scale, qh, kh, vh, s0, p = _attention_parts(q, k, v, mask, attrs)
    do = _heads(cots[0], b, sq, h, d)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(vh, -1, -2)
    ds = p * softmax_centered(p, dp, -1)  # the softmax's Jᵀ (0 where p is 0)
    gmask = unbroadcast(ds, mask.shape) if attrs["mask_kind"] == "bias" else None
    ds0 = ds * _softcap_slope(s0, attrs["logit_softcap"])
    dq = scale * (ds0 @ kh)
    dk = scale * (np.swapaxes(ds0, -1, -2) @ qh)
    return [_unheads(dq), _unheads(_fold_heads(dk, hkv)), _unheads(_fold_heads(dv, hkv)), gmask]


@jvp("attention")
def attention_jvp(inputs, attrs, tans):
    q, k, v, mask = inputs
    tq, tk, tv, tm = tans
    (b, sq, sk, h, hkv, d), scale, qh, kh, vh, s0, p = _attention_parts(q, k, v, mask, attrs)
    tqh = _heads(tq, b, sq, h, d)
    tkh = np.repeat(_heads(tk, b, sk, hkv, d), h // hkv, axis=1)
    tvh = np.repeat(_heads(tv, b, sk, hkv, d), h // hkv, axis=1)
    ds = scale * (tqh @ np.swapaxes(kh, -1, -2) + qh @ np.swapaxes(tkh, -1, -2))
    ds = ds * _softcap_slope(s0, attrs["logit_softcap"])
    if attrs["mask_kind"] == "bias":
        ds = ds + np.broadcast_to(tm, ds.shape)
    ds = np.where(p > 0, ds, 0.0)  # masked keys: -inf scores whatever the tangent
    dp = p * softmax_centered(p, ds, -1)
    return [_unheads(dp @ vh + p @ tvh)]


def _rope_views(x, head_dim, n_rot, style):
    xs = x.reshape(x.shape[:-1] + (x.shape[-1] // head_dim, head_dim))
    return xs, rope_pairs(xs, head_dim, n_rot, style)


@vjp("rope")
def rope_vjp(inputs, attrs, cots):
    """o1 = x1 c - x2 s, o2 = x2 c + x1 s (tables broadcast over the leading dims and heads)."""
    x, cos, sin = inputs
    hd, nr, style = attrs["head_dim"], attrs["n_rot"], attrs["style"]
    _, (x1, x2, _) = _rope_views(x, hd, nr, style)
    _, (u1, u2, _) = _rope_views(cots[0], hd, nr, style)
    c, s = cos[:, None, :], sin[:, None, :]
    gx = cots[0].copy()  # the pass-through dims
    _, (g1, g2, _) = _rope_views(gx, hd, nr, style)
    g1[...] = u1 * c + u2 * s
    g2[...] = u2 * c - u1 * s
    fold = tuple(range(x1.ndim - 3)) + (x1.ndim - 2,)  # leading dims and heads
    return [gx.reshape(x.shape), np.sum(u1 * x1 + u2 * x2, axis=fold), np.sum(u2 * x1 - u1 * x2, axis=fold)]


@jvp("rope")
def rope_jvp(inputs, attrs, tans):
    x, cos, sin = inputs
    tx, tc, ts = tans
    hd, nr, style = attrs["head_dim"], attrs["n_rot"], attrs["style"]
    _, (x1, x2, _) = _rope_views(x, hd, nr, style)
    _, (t1, t2, _) = _rope_views(tx, hd, nr, style)
    c, s, dc, dsn = cos[:, None, :], sin[:, None, :], tc[:, None, :], ts[:, None, :]
    out = tx.copy()

    _, (o1, o2, _) = _rope_views(out, hd, nr, style)
    o1[...] = t1 * c - t2 * s + x1 * dc - x2 * dsn
    o2[...] = t2 * c + t1 * s + x2 * dc + x1 * dsn
    return [out.reshape(x.shape)]
