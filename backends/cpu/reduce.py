"""Reference kernels for reductions and scans. Float sums and running sums are accumulated in
float64 by trees of depth ceil(log2 n) (pairwise sums over a contiguous last axis, doubling
scans) and rounded once, so the reference sits inside the accuracy budget of its own dtype
(cases/accuracy.toml: depth <= 3.5 ceil(log2 n)), float64 included, and far inside the error bound
that the registry allows any accumulation order. numpy alone would not: it adds along a
non-contiguous axis and scans sequentially (depth n - 1), which the precise oracle found over the
float64 budgets (constant and offset values at n = 10^6). Products are numpy's: every
multiplication rounds the whole product, so no order beats gamma_(n-1) (their budget)."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import (
    exclusive_products,
    selection_radius,
    softmax_centered,
)

kernel = BACKEND.kernel


def _axes(x, axes):
    return tuple(axes) if axes else None


def _over_last(x: np.ndarray, axes, keep_dim: bool, fn) -> np.ndarray:
    """``fn`` over the reduced axes moved last, flattened into one contiguous axis (numpy's
    pairwise summation applies only to a contiguous inner axis), shaped back."""
    ax = tuple(a % x.ndim for a in axes) if axes and x.ndim else tuple(range(x.ndim))
    rest = [a for a in range(x.ndim) if a not in ax]
    n = int(np.prod([x.shape[a] for a in ax]))
    w = np.ascontiguousarray(np.transpose(x, rest + list(ax))).reshape([x.shape[a] for a in rest] + [n])
    r = fn(w)
    if keep_dim:
        r = np.reshape(r, [1 if a in ax else x.shape[a] for a in range(x.ndim)])
    return np.asarray(r)


def _acc(fn, tree):
    """Reduce ints in their own dtype (wrapping), floats in float64 over the reduced axes made one
    contiguous last axis (``tree``), rounded once."""
    def run(x, *, axes, keep_dim):
        if np.issubdtype(x.dtype, np.floating):
            return _over_last(x.astype(np.float64), axes, keep_dim, tree).astype(x.dtype)
        return np.asarray(fn(x, axis=_axes(x, axes), keepdims=keep_dim, dtype=x.dtype))
    return run


kernel("reduce_sum")(_acc(np.sum, lambda w: np.sum(w, axis=-1)))
kernel("reduce_prod")(_acc(np.prod, lambda w: np.prod(w, axis=-1)))


@kernel("reduce_mean")
def reduce_mean(x, *, axes, keep_dim):
    return _over_last(x.astype(np.float64), axes, keep_dim, lambda w: np.mean(w, axis=-1)).astype(x.dtype)


@kernel("reduce_max")
def reduce_max(x, *, axes, keep_dim):
    return np.asarray(np.max(x, axis=_axes(x, axes), keepdims=keep_dim))  # NaN propagates


@kernel("reduce_min")
def reduce_min(x, *, axes, keep_dim):
    return np.asarray(np.min(x, axis=_axes(x, axes), keepdims=keep_dim))


@kernel("arg_max")
def arg_max(x, *, axis, keep_dim):
    """First index of the max; NaN counts as the max and the first NaN wins (numpy's rule)."""
    return np.asarray(np.argmax(x, axis=axis, keepdims=keep_dim)).astype(np.int64)


@kernel("arg_min")
def arg_min(x, *, axis, keep_dim):
    return np.asarray(np.argmin(x, axis=axis, keepdims=keep_dim)).astype(np.int64)


@kernel("softmax")
def softmax(x, *, axis):
    if x.size == 0:
        return x.copy()
    x64 = x.astype(np.float64)
    m = np.max(x64, axis=axis, keepdims=True)
    # exp(x - m) turns the rounding of x - m (|x - m| u absolute) into a relative error of
    # |x - m| u: carry its exact error (TwoSum) into exp(d + err) = exp(d)(1 + err). Found by the
    # precise oracle: float64 outputs near 1e-8 were 14 ulp off (float32 inputs: x - m is exact).
    with np.errstate(invalid="ignore"):
        d = x64 - m
        bb = d - x64
        err = (x64 - (d - bb)) + (-m - bb)
        e = np.exp(d) * (1 + np.where(np.isfinite(err), err, 0.0))
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def _doubling(combine):
    """An inclusive scan by recursive doubling (Hillis and Steele, "Data parallel algorithms",
    CACM 1986): after step k each position holds the combination of the 2^k terms ending there,
    so every result is a balanced tree of depth ceil(log2 n) rather than a chain of n - 1."""
    def run(a, axis, dtype):
        w = np.moveaxis(a, axis, -1).astype(dtype, copy=True)
        s = 1
        with np.errstate(all="ignore"):
            while s < w.shape[-1]:
                w[..., s:] = combine(w[..., s:], w[..., :-s])  # the right side is evaluated first
                s *= 2
        return np.moveaxis(w, -1, axis)
    return run


def _scan(accumulate, identity, tree=None):
    """Inclusive/exclusive, forward/reverse scan; ints in their dtype, floats via float64 (by
    ``tree`` where given: a doubling scan)."""
    def run(x, *, axis, exclusive, reverse):
        flt = np.issubdtype(x.dtype, np.floating)
        work = x.astype(np.float64) if flt else x
        if reverse:
            work = np.flip(work, axis)
        out = (tree if flt and tree is not None and work.ndim else accumulate)(work, axis=axis, dtype=work.dtype)
        if exclusive and out.shape[axis]:
            ident = np.full_like(np.take(out, [0], axis=axis), identity(x.dtype))
            out = np.concatenate([ident, np.take(out, np.arange(out.shape[axis] - 1), axis=axis)], axis=axis)
        if reverse:
            out = np.flip(out, axis)
        return out.astype(x.dtype)
    return run


def _lowest(dtype):
    return -np.inf if np.issubdtype(dtype, np.floating) else np.iinfo(dtype).min


kernel("cumsum")(_scan(np.cumsum, lambda d: 0, _doubling(np.add)))
kernel("cum_prod")(_scan(np.cumprod, lambda d: 1))
kernel("cum_max")(_scan(lambda a, axis, dtype: np.maximum.accumulate(a, axis=axis, dtype=dtype), _lowest))


# -- reference derivatives (float64) ---------------------------------------------------------------
vjp = BACKEND.vjp
jvp = BACKEND.jvp


def _reduced(x: np.ndarray, axes) -> tuple[int, ...]:
    return tuple(a % x.ndim for a in axes) if axes and x.ndim else tuple(range(x.ndim))


def _spread_back(u: np.ndarray, x: np.ndarray, axes, keep_dim: bool) -> np.ndarray:
    """A reduction's cotangent broadcast back over the reduced axes (restored when not kept)."""
    if not keep_dim:
        u = np.expand_dims(u, _reduced(x, axes))
    return np.broadcast_to(u, x.shape)


@vjp("reduce_sum")
def reduce_sum_vjp(inputs, attrs, cots):
    (x,) = inputs
    return [np.array(_spread_back(cots[0], x, attrs["axes"], attrs["keep_dim"]))]


@jvp("reduce_sum")
def reduce_sum_jvp(inputs, attrs, tans):
    (x,) = inputs
    return [np.sum(tans[0], axis=_reduced(x, attrs["axes"]), keepdims=attrs["keep_dim"])]


def _count(x: np.ndarray, axes) -> int:
    return int(np.prod([x.shape[a] for a in _reduced(x, axes)]))


@vjp("reduce_mean")
def reduce_mean_vjp(inputs, attrs, cots):
    (x,) = inputs
    return [_spread_back(cots[0], x, attrs["axes"], attrs["keep_dim"]) / max(_count(x, attrs["axes"]), 1)]


@jvp("reduce_mean")
def reduce_mean_jvp(inputs, attrs, tans):
    (x,) = inputs
    return [np.mean(tans[0], axis=_reduced(x, attrs["axes"]), keepdims=attrs["keep_dim"])]


def _rows(x: np.ndarray, axes) -> tuple[np.ndarray, tuple[int, ...]]:
    """x with the reduced axes moved last and flattened into one: [rest..., n]; and the perm."""
    ax = _reduced(x, axes)
    rest = [a for a in range(x.ndim) if a not in ax]
    perm = tuple(rest + list(ax))
    return np.transpose(x, perm).reshape([x.shape[a] for a in rest] + [-1]), perm


def _unrows(r: np.ndarray, x: np.ndarray, perm: tuple[int, ...]) -> np.ndarray:
    return np.transpose(r.reshape([x.shape[a] for a in perm]), np.argsort(perm))


def _extreme_rule(op: str, pick) -> None:
    """reduce_max / reduce_min: the cotangent goes to the extreme element; ties share it equally
    (PyTorch amax/amin, JAX's reduce_max). ``pick`` is np.max or np.min."""
    sign = 1.0 if pick is np.max else -1.0

    def weights(x, axes):
        rows, perm = _rows(x, axes)
        hit = rows == pick(rows, axis=-1, keepdims=True)
        return _unrows(hit / np.maximum(hit.sum(-1, keepdims=True), 1), x, perm)

    def _vjp(inputs, attrs, cots):
        (x,) = inputs
        return [weights(x, attrs["axes"]) * _spread_back(cots[0], x, attrs["axes"], attrs["keep_dim"])]

    def _jvp(inputs, attrs, tans):
        (x,) = inputs
        ax = _reduced(x, attrs["axes"])
        return [np.sum(weights(x, attrs["axes"]) * tans[0], axis=ax, keepdims=attrs["keep_dim"])]

    def _radius(inputs, attrs):
        (x,) = inputs
        rows, perm = _rows(sign * x, attrs["axes"])
        return [_unrows(selection_radius(rows), x, perm)]

    vjp(op, convention="ties share the cotangent equally (PyTorch amax/amin, JAX)",
        radius=_radius)(_vjp)
    jvp(op)(_jvp)


_extreme_rule("reduce_max", np.max)
_extreme_rule("reduce_min", np.min)


@vjp("reduce_prod", convention="exact at zeros: the product of the other elements (no division)")
def reduce_prod_vjp(inputs, attrs, cots):
    (x,) = inputs
    rows, perm = _rows(x, attrs["axes"])
    others = _unrows(exclusive_products(rows), x, perm) if rows.shape[-1] else np.ones(x.shape)
    return [others * _spread_back(cots[0], x, attrs["axes"], attrs["keep_dim"])]


@jvp("reduce_prod")
def reduce_prod_jvp(inputs, attrs, tans):
    """Forward mode along each row: (p, dp) <- (p x_i, dp x_i + p t_i)."""
    (x,) = inputs
    rows, _ = _rows(x, attrs["axes"])
    trows, _ = _rows(tans[0], attrs["axes"])
    p = np.ones(rows.shape[:-1])
    dp = np.zeros(rows.shape[:-1])
    for i in range(rows.shape[-1]):
        p, dp = p * rows[..., i], dp * rows[..., i] + p * trows[..., i]
    if attrs["keep_dim"]:
        dp = np.reshape(dp, [1 if a in _reduced(x, attrs["axes"]) else x.shape[a] for a in range(x.ndim)])
    return [dp]


def _softmax64(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


@vjp("softmax")
@jvp("softmax")
def softmax_vjp(inputs, attrs, vs):
    """J·v = s * (v - <v, s>) along the axis, the derivative of exp(x_i) / sum exp(x_j); J is
    symmetric (diag(s) - s sᵀ), so the same product is the VJP and the JVP."""
    (x,) = inputs
    if not x.size:
        return [np.zeros(x.shape)]
    s = _softmax64(x, attrs["axis"])
    return [s * softmax_centered(s, vs[0], attrs["axis"])]


# scans: a linear scan's transpose runs the other way (an exclusive scan stays exclusive)
@vjp("cumsum")
def cumsum_vjp(inputs, attrs, cots):
    """Jᵀ of a running sum: the running sum of u from the other end."""
    return [_scan(np.cumsum, lambda d: 0)(cots[0], axis=attrs["axis"], exclusive=attrs["exclusive"],
                                           reverse=not attrs["reverse"])]


@jvp("cumsum")
def cumsum_jvp(inputs, attrs, tans):
    t = np.moveaxis(tans[0], attrs["axis"], -1)
    if attrs["reverse"]:
        t = np.flip(t, -1)
    out = np.cumsum(t, -1)
    if attrs["exclusive"]:
        out = np.concatenate([np.zeros(out.shape[:-1] + (1,)), out[..., :-1]], -1)
    if attrs["reverse"]:
        out = np.flip(out, -1)
    return [np.moveaxis(out, -1, attrs["axis"])]


def _along(x: np.ndarray, attrs) -> np.ndarray:
    """x with the scan axis last, in scan order (reversed for reverse)."""
    w = np.moveaxis(x, attrs["axis"], -1)
    return np.flip(w, -1) if attrs["reverse"] else w


def _back(w: np.ndarray, attrs) -> np.ndarray:
    return np.moveaxis(np.flip(w, -1) if attrs["reverse"] else w, -1, attrs["axis"])


def _shift(w: np.ndarray, fill: float) -> np.ndarray:
    """An inclusive scan made exclusive: shifted by one, ``fill`` first."""
    return np.concatenate([np.full(w.shape[:-1] + (1,), fill), w[..., :-1]], -1)


@vjp("cum_prod", convention="exact at zeros (no division)")
def cum_prod_vjp(inputs, attrs, cots):
    """y_j = prod_{i<=j} x_i (inclusive); g_i = P_{<i} R_i with R_i = u_i + x_{i+1} R_{i+1},
    the suffix recurrence of sum_{j>=i} u_j prod_{i<k<=j} x_k (exclusive: u shifted back)."""
    x, u = _along(inputs[0], attrs), _along(cots[0], attrs)
    n = x.shape[-1]
    if attrs["exclusive"]:  # y_j = inclusive_{j-1}: the cotangent of inclusive_i is u_{i+1}
        u = np.concatenate([u[..., 1:], np.zeros(u.shape[:-1] + (1,))], -1)
    g = np.zeros(x.shape)
    r = np.zeros(x.shape[:-1])
    for i in range(n - 1, -1, -1):
        r = u[..., i] + (x[..., i + 1] * r if i + 1 < n else 0.0)
        g[..., i] = r
    prefix = _shift(np.cumprod(x, -1), 1.0) if n else x
    return [_back(g * prefix, attrs)]


@jvp("cum_prod")
def cum_prod_jvp(inputs, attrs, tans):
    """Forward mode along the scan: (p, dp) <- (p x_i, dp x_i + p t_i)."""
    x, t = _along(inputs[0], attrs), _along(tans[0], attrs)
    out = np.zeros(x.shape)
    p = np.ones(x.shape[:-1])
    dp = np.zeros(x.shape[:-1])
    for i in range(x.shape[-1]):
        p, dp = p * x[..., i], dp * x[..., i] + p * t[..., i]
        out[..., i] = dp
    if attrs["exclusive"]:
        out = _shift(out, 0.0)
    return [_back(out, attrs)]


def _running_argmax_weights(x: np.ndarray) -> list[np.ndarray]:
    """Per prefix j (scan order, last axis): weights over i <= j, 1/count on the elements tied at
    the running max."""
    out = []
    for j in range(x.shape[-1]):
        pre = x[..., : j + 1]
        hit = pre == np.max(pre, -1, keepdims=True)
        out.append(hit / np.maximum(hit.sum(-1, keepdims=True), 1))
    return out


@vjp("cum_max", convention="each running max passes its cotangent to the element holding it; "
     "ties share it equally (as reduce_max)",
     radius=lambda xs, attrs: [_cum_max_radius(xs[0], attrs)])
def cum_max_vjp(inputs, attrs, cots):
    x, u = _along(inputs[0], attrs), _along(cots[0], attrs)
    if attrs["exclusive"]:  # output j is the inclusive max of the prefix j-1
        u = np.concatenate([u[..., 1:], np.zeros(u.shape[:-1] + (1,))], -1)
    g = np.zeros(x.shape)
    for j, w in enumerate(_running_argmax_weights(x)):
        g[..., : j + 1] += w * u[..., j : j + 1]
    return [_back(g, attrs)]


@jvp("cum_max")
def cum_max_jvp(inputs, attrs, tans):
    x, t = _along(inputs[0], attrs), _along(tans[0], attrs)
    out = np.zeros(x.shape)
    for j, w in enumerate(_running_argmax_weights(x)):
        out[..., j] = np.sum(w * t[..., : j + 1], -1)
    if attrs["exclusive"]:
        out = _shift(out, 0.0)
    return [_back(out, attrs)]


def _cum_max_radius(x: np.ndarray, attrs) -> np.ndarray:
    """Every prefix is a max: an element's radius is its smallest selection radius over the
    prefixes that contain it."""
    w = _along(x, attrs)
    r = np.full(w.shape, np.inf)
    for j in range(w.shape[-1]):
        r[..., : j + 1] = np.minimum(r[..., : j + 1], selection_radius(w[..., : j + 1]))
    return _back(r, attrs)
