"""Reference kernels for normalization, attention and rope: the textbook formulas in float64
(two-pass mean/variance, max-subtracted softmax), rounded once to the output dtype."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import SAVED_TERMS, softmax_centered, unbroadcast
from rlx_conformance.judge.bounds.nn import (
    allowed_keys,
    attention_abs,
    attention_dims,
    attention_heads,
    attention_magnitude,
    attention_parts,
    attention_unheads,
    fold_heads,
    repeat_heads,
    rope_pairs,
    softcap_slope,
)
from rlx_conformance.judge.bounds.norm_grad import (
    batch_norm_vjp_magnitude,
    group_abs_xhat,
    group_terms,
    group_vjp_magnitude,
    trailing_vjp_magnitude,
)
from rlx_conformance.judge.bounds.norm_grad import normalize_magnitude as _normalize_magnitude
from rlx_conformance.judge.bounds.norm_grad import per_channel as _per_channel
from rlx_conformance.judge.bounds.norm_grad import stats as _stats
from rlx_conformance.judge.bounds.norm_grad import xhat_error as _xhat_error

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
    kh, vh = (repeat_heads(x.astype(np.float64).reshape(b, sk, hkv, d).transpose(0, 2, 1, 3), h // hkv)
              for x in (k, v))
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

    @BACKEND.magnitude(op)
    def _magnitude(inputs, attrs, kind, seeds):
        """The VJP's: judge/bounds/norm_grad.trailing_vjp_magnitude (shared with the backward
        ops' bounds); the JVP's: _normalize_magnitude of the tangent (times |gamma|) plus
        |xhat| |t_gamma| + |t_beta|, as many terms."""
        x, gamma, _ = inputs
        axes = axes_of(x, attrs) if x.ndim else ()
        n = int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1
        if not x.size:
            return ([np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
                    if kind == "vjp" else [np.zeros(x.shape)]), 1
        if kind == "vjp":
            return trailing_vjp_magnitude(x, gamma, np.abs(seeds[0]), axes, attrs["eps"], rms)
        xhat, _ = _stats(x, axes, attrs["eps"], rms)
        ag, ah = np.abs(gamma), np.abs(xhat) + _xhat_error(x, axes, attrs["eps"], rms)
        n = max(n + 3, x.size // max(gamma.size, 1))  # gamma's and beta's sums over the rows
        tx, tg, tb = (np.abs(t) for t in seeds)
        return [_normalize_magnitude(x, axes, attrs["eps"], rms, tx) * ag + ah * tg + tb], n + 3


def _centering_condition(x: np.ndarray, axes: tuple[int, ...], eps: float) -> float:
    """max |x| / sqrt(var + eps) over the normalized groups: x - mean carries eps max|x| absolute
    error, so the normalized values (and both rules) carry that much relative to the spread (the
    spread class: large values, small variance)."""
    _, r = _stats(x, axes, eps, False)
    return float(np.max(np.max(np.abs(x), axis=axes, keepdims=True) / r))


_trailing_rules("layer_norm", rms=False)
_trailing_rules("rms_norm", rms=True)


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


@BACKEND.magnitude("group_norm")
def group_norm_magnitude(inputs, attrs, kind, seeds):
    """As layer_norm's (_normalize_magnitude) over each group, gamma and beta per channel; the
    VJP's is judge/bounds/norm_grad.group_vjp_magnitude (shared with the backward ops' bounds)."""
    x, gamma, _ = inputs
    if not x.size:
        return ([np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
                if kind == "vjp" else [np.zeros(x.shape)]), 1
    if kind == "vjp":
        return group_vjp_magnitude(x, gamma, np.abs(seeds[0]), attrs["num_groups"], attrs["eps"])
    n, g = x.shape[0], attrs["num_groups"]
    xg = x.reshape(n, g, -1)
    ah = group_abs_xhat(x, g, attrs["eps"])
    ag = np.abs(_per_channel(gamma, x.ndim))
    terms = group_terms(x, gamma, g)
    tx, tg, tb = (np.abs(t) for t in seeds)
    mx = _normalize_magnitude(xg, (2,), attrs["eps"], False, tx.reshape(n, g, -1)).reshape(x.shape)
    return [mx * ag + ah * _per_channel(tg, x.ndim) + _per_channel(tb, x.ndim)], terms


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


@BACKEND.magnitude("batch_norm_inference")
def batch_norm_magnitude(inputs, attrs, kind, seeds):
    """Elementwise per feature: the rules at x - mean -> |x - mean| (mean 0), gamma -> |gamma|
    and seeds -> |seed| with the mean's and variance's tangents negated make every term
    nonnegative, so they give |J|-product exactly; a VJP result of a parameter sums the rows."""
    x, gamma, beta, mean, var = inputs
    if kind == "vjp":  # shared with the backward ops' bounds
        return batch_norm_vjp_magnitude(x, gamma, mean, var, np.abs(seeds[0]), attrs["eps"])
    at = [np.abs(x - mean), np.abs(gamma), beta, np.zeros(mean.shape), var]
    tx, tg, tb, tm, tv = (np.abs(t) for t in seeds)
    return [np.abs(batch_norm_jvp(at, attrs, [tx, tg, tb, -tm, -tv])[0])], 5


# -- second order (OpSpec.second_order) ------------------------------------------------------------
def _normalize_hvp(x, axes, eps, rms, g, t):
    """(d/de N(x + e t)ᵀ g, N(x) t) for xhat = N(x) and a fixed g: with b = mean(g xhat) and the
    JVP's dr = mean(xhat dd), dxhat = (dd - xhat dr) / r (dd = t - mean t; rms: t), the VJP
    (g - mean g - xhat b) / r moves by -(dxhat b + xhat mean(g dxhat)) / r - VJP dr / r."""
    xhat, r = _stats(x, axes, eps, rms)
    dxhat = _normalize_jvp(x, axes, eps, rms, t)
    dr = np.mean(xhat * (t if rms else t - np.mean(t, axis=axes, keepdims=True)), axis=axes, keepdims=True)
    b = np.mean(g * xhat, axis=axes, keepdims=True)
    db = np.mean(g * dxhat, axis=axes, keepdims=True)
    return -(dxhat * b + xhat * db) / r - _normalize_vjp(x, axes, eps, rms, g) * dr / r, dxhat


def _normalize_hvp_abs(x, axes, eps, rms, g, t):
    """_normalize_hvp's terms in absolute value (g, t: |g|, |t|), and |N(x) t|'s and the VJP's,
    with |xhat| raised by kappa / (n + 2) per group (kappa = max|x| / r, _centering_condition:
    x - mean carries kappa u absolute error in xhat; rms: 0), so the caller's
    gamma_(3 (n + 2) + 4) covers it with the sums' n roundings (terms: cubic in xhat)."""
    n = math.prod(x.shape[a] for a in axes)
    xhat, r = _stats(x, axes, eps, rms)
    kappa = 0.0 if rms else np.max(np.abs(x), axis=axes, keepdims=True) / r
    xa = np.abs(xhat) + kappa / (n + 2)

    def mean(a):
        return np.mean(a, axis=axes, keepdims=True)

    dd = t if rms else t + mean(t)
    dr = mean(xa * dd)
    dxhat = (dd + xa * dr) / r
    vjp = (g + (0.0 if rms else mean(g)) + xa * mean(g * xa)) / r
    return (dxhat * mean(g * xa) + xa * mean(g * dxhat)) / r + vjp * dr / r, dxhat, vjp


def _trailing_second(op: str, rms: bool) -> None:
    """layer_norm / rms_norm: y = N(x) gamma + beta over x.shape[axis:]. Along (vx, vg, vb) the
    VJP (N(x)ᵀ(u gamma), sum u xhat, sum u) moves by (d/de N(x + e vx)ᵀ(u gamma) + N(x)ᵀ(u vg),
    sum u N(x) vx, 0) (sums over the leading dims)."""
    def axes_of(x, attrs):
        return tuple(range(attrs["axis"] % x.ndim, x.ndim))

    def hvp(inputs, attrs, cots, tans):
        x, gamma, _ = inputs
        vx, vg, _ = tans
        u = cots[0]
        if not x.size:
            return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
        axes, lead, eps = axes_of(x, attrs), tuple(range(x.ndim - gamma.ndim)), attrs["eps"]
        hx, dxhat = _normalize_hvp(x, axes, eps, rms, u * gamma, vx)
        return [hx + _normalize_vjp(x, axes, eps, rms, u * vg), np.sum(u * dxhat, axis=lead),
                np.zeros(gamma.shape)]

    def magnitude(inputs, attrs, cots, tans):
        x, gamma, _ = inputs
        vx, vg, _ = tans
        if not x.size:
            return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)], 1
        axes, lead, eps = axes_of(x, attrs), tuple(range(x.ndim - gamma.ndim)), attrs["eps"]
        u = np.abs(cots[0])
        hx, dxhat, _ = _normalize_hvp_abs(x, axes, eps, rms, u * np.abs(gamma), np.abs(vx))
        vjp_g = _normalize_hvp_abs(x, axes, eps, rms, u * np.abs(vg), np.zeros(x.shape))[2]
        n = math.prod(x.shape[a] for a in axes)
        return [hx + vjp_g, np.sum(u * dxhat, axis=lead), np.zeros(gamma.shape)], \
            3 * (n + 2) + 4 + x.size // max(gamma.size, 1)

    BACKEND.hvp(op)(hvp)
    BACKEND.hvp_magnitude(op)(magnitude)


_trailing_second("layer_norm", rms=False)
_trailing_second("rms_norm", rms=True)


def _groups(x, gamma, num_groups):
    """x as [N, G, rest] and a per-channel array broadcast to x."""
    return x.reshape(x.shape[0], num_groups, -1), _per_channel(gamma, x.ndim)


@BACKEND.hvp("group_norm")
def group_norm_hvp(inputs, attrs, cots, tans):
    """As layer_norm's (_trailing_second) over each group of channels, gamma per channel."""
    x, gamma, _ = inputs
    vx, vg, _ = tans
    u = cots[0]
    if not x.size:
        return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)]
    n, g, eps = x.shape[0], attrs["num_groups"], attrs["eps"]
    xg, gam = _groups(x, gamma, g)

    def grouped(a):
        return a.reshape(n, g, -1)

    hx, dxhat = _normalize_hvp(xg, (2,), eps, False, grouped(u * gam), grouped(vx))
    hx = hx + _normalize_vjp(xg, (2,), eps, False, grouped(u * _per_channel(vg, x.ndim)))
    other = (0,) + tuple(range(2, x.ndim))
    return [hx.reshape(x.shape), np.sum(u * dxhat.reshape(x.shape), axis=other), np.zeros(gamma.shape)]


@BACKEND.hvp_magnitude("group_norm")
def group_norm_hvp_magnitude(inputs, attrs, cots, tans):
    """_normalize_hvp_abs per group (see _trailing_second's magnitude)."""
    x, gamma, _ = inputs
    vx, vg, _ = tans
    if not x.size:
        return [np.zeros(x.shape), np.zeros(gamma.shape), np.zeros(gamma.shape)], 1
    n, g, eps = x.shape[0], attrs["num_groups"], attrs["eps"]
    xg, gam = _groups(x, np.abs(gamma), g)
    u = np.abs(cots[0])

    def grouped(a):
        return a.reshape(n, g, -1)

    hx, dxhat, _ = _normalize_hvp_abs(xg, (2,), eps, False, grouped(u * gam), grouped(np.abs(vx)))
    vjp_g = _normalize_hvp_abs(xg, (2,), eps, False, grouped(u * _per_channel(np.abs(vg), x.ndim)),
                               np.zeros(xg.shape))[2]
    other = (0,) + tuple(range(2, x.ndim))
    m = xg.shape[2]
    return [(hx + vjp_g).reshape(x.shape), np.sum(u * dxhat.reshape(x.shape), axis=other),
            np.zeros(gamma.shape)], 3 * (m + 2) + 4 + x.size // max(gamma.size, 1)


@BACKEND.hvp("batch_norm_inference")
def batch_norm_hvp(inputs, attrs, cots, tans):
    """y = (x - m) s gamma + beta, s = (var + eps)^-1/2, ds = -s^3 dvar / 2. Along (vx, vg, vb, vm,
    vv) the VJP (u gamma s, sum u (x - m) s, sum u, -sum u gamma s, -sum u (x - m) gamma s^3 / 2)
    moves by (u (vg s + gamma ds), sum u ((vx - vm) s + (x - m) ds), 0, -sum u (vg s + gamma ds),
    -sum u ((vx - vm) gamma + (x - m) vg + 3 (x - m) gamma ds / s) s^3 / 2)."""
    x, gamma, _, mean, var = inputs
    vx, vg, _, vm, vv = tans
    u = cots[0]
    lead = tuple(range(x.ndim - 1))
    s = 1 / np.sqrt(var + attrs["eps"])
    ds = -0.5 * vv * s ** 3
    xm = x - mean
    hx = u * (vg * s + gamma * ds)
    return [hx, np.sum(u * ((vx - vm) * s + xm * ds), axis=lead), np.zeros(gamma.shape),
            -np.sum(hx, axis=lead),
            -0.5 * np.sum(u * ((vx - vm) * gamma + xm * vg + 3 * xm * gamma * ds / s), axis=lead) * s ** 3]


@BACKEND.hvp_magnitude("batch_norm_inference")
def batch_norm_hvp_magnitude(inputs, attrs, cots, tans):
    """batch_norm_hvp's terms in absolute value, |x| + |m| for |x - m| (the rounded difference
    carries u (|x| + |m|)); a result sums the leading elements' products (plus s's roundings)."""
    x, gamma, _, mean, var = inputs
    vx, vg, _, vm, vv = tans
    u = np.abs(cots[0])
    lead = tuple(range(x.ndim - 1))
    s = 1 / np.sqrt(np.abs(var + attrs["eps"]))
    ds = 0.5 * np.abs(vv) * s ** 3
    xm, g = np.abs(x) + np.abs(mean), np.abs(gamma)
    avx, avg, avm = np.abs(vx), np.abs(vg), np.abs(vm)
    hx = u * (avg * s + g * ds)
    count = x.size // max(x.shape[-1], 1) if x.ndim else 1
    return [hx, np.sum(u * ((avx + avm) * s + xm * ds), axis=lead), np.zeros(gamma.shape),
            np.sum(hx, axis=lead),
            0.5 * np.sum(u * ((avx + avm) * g + xm * avg + 3 * xm * g * ds / s), axis=lead) * s ** 3], count + 8


@vjp("attention", convention="a query that may attend to no key has an undefined output and "
     "passes no cotangent; the mask has a derivative only as an additive bias (mask_kind bias): "
     "a custom mask selects, the structural kinds take none")
def attention_vjp(inputs, attrs, cots):
    q, k, v, mask = inputs
    (b, sq, _, h, hkv, d), scale, qh, kh, vh, s0, p = attention_parts(q, k, v, mask, attrs)
    do = attention_heads(cots[0], b, sq, h, d)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(vh, -1, -2)
    ds = p * softmax_centered(p, dp, -1)  # the softmax's Jᵀ (0 where p is 0)
    gmask = unbroadcast(ds, mask.shape) if attrs["mask_kind"] == "bias" else None
    ds0 = ds * softcap_slope(s0, attrs["logit_softcap"])
    dq = scale * (ds0 @ kh)
    dk = scale * (np.swapaxes(ds0, -1, -2) @ qh)
    return [attention_unheads(dq), attention_unheads(fold_heads(dk, hkv)), attention_unheads(fold_heads(dv, hkv)),
            gmask]


@jvp("attention")
def attention_jvp(inputs, attrs, tans):
    q, k, v, mask = inputs
    tq, tk, tv, tm = tans
    (b, sq, sk, h, hkv, d), scale, qh, kh, vh, s0, p = attention_parts(q, k, v, mask, attrs)
    tqh = attention_heads(tq, b, sq, h, d)
    tkh = np.repeat(attention_heads(tk, b, sk, hkv, d), h // hkv, axis=1)
    tvh = np.repeat(attention_heads(tv, b, sk, hkv, d), h // hkv, axis=1)
    ds = scale * (tqh @ np.swapaxes(kh, -1, -2) + qh @ np.swapaxes(tkh, -1, -2))
    ds = ds * softcap_slope(s0, attrs["logit_softcap"])
    if attrs["mask_kind"] == "bias":
        ds = ds + np.broadcast_to(tm, ds.shape)
    ds = np.where(p > 0, ds, 0.0)  # masked keys: -inf scores whatever the tangent
    dp = p * softmax_centered(p, ds, -1)
    return [attention_unheads(dp @ vh + p @ tvh)]


def _attention_saved(inputs, attrs, kind, seeds):
    """The part of attention's magnitude that is the rounding of its saved scores and weights."""
    plain = attention_abs(inputs, attrs, kind, seeds, saved=False)
    return [None if a is None else b - a
            for a, b in zip(plain, attention_abs(inputs, attrs, kind, seeds, saved=True))]


SAVED_TERMS["attention"] = _attention_saved
# The magnitude (judge/bounds/nn.attention_magnitude: attention_abs with the saved terms) is the
# judge's, shared with attention_backward_*'s bounds (judge/bounds/backward.py).
BACKEND.magnitude("attention")(attention_magnitude)


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


@BACKEND.magnitude("rope")
def rope_magnitude(inputs, attrs, kind, seeds):
    """The rules with every term's magnitude (their minus signs made plus, all operands |.|):
    exact, each output of a pair reads two elements of x and one of each table, each x element
    feeds the two outputs of its pair; a table's VJP result sums over the leading dims and heads."""
    x, cos, sin = (np.abs(a) for a in inputs)
    hd, nr, style = attrs["head_dim"], attrs["n_rot"], attrs["style"]
    _, (x1, x2, _) = _rope_views(x, hd, nr, style)
    c, s = cos[:, None, :], sin[:, None, :]
    if kind == "vjp":
        u = np.abs(seeds[0])
        _, (u1, u2, _) = _rope_views(u, hd, nr, style)
        g = u.copy()
        _, (g1, g2, _) = _rope_views(g, hd, nr, style)
        g1[...] = u1 * c + u2 * s
        g2[...] = u2 * c + u1 * s
        fold = tuple(range(x1.ndim - 3)) + (x1.ndim - 2,)
        count = int(np.prod([x1.shape[a] for a in fold])) if x1.ndim else 1
        return [g.reshape(x.shape), np.sum(u1 * x1 + u2 * x2, axis=fold),
                np.sum(u2 * x1 + u1 * x2, axis=fold)], max(2 * count, 2)
    tx, tc, ts = (np.abs(t) for t in seeds)
    _, (t1, t2, _) = _rope_views(tx, hd, nr, style)
    dc, dsn = tc[:, None, :], ts[:, None, :]
    out = tx.copy()
    _, (o1, o2, _) = _rope_views(out, hd, nr, style)
    o1[...] = t1 * c + t2 * s + x1 * dc + x2 * dsn
    o2[...] = t2 * c + t1 * s + x2 * dc + x1 * dsn
    return [out.reshape(x.shape)], 4
