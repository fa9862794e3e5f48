"""The magnitudes of the normalizations' derivatives, and the error bounds of their backward ops.

One copy of the math that two layers need: the CPU reference backend's derivative magnitudes of
layer_norm, rms_norm, group_norm and batch_norm_inference (backends/cpu/nn.py: the derivative
cases' bound, judge/bounds/derivative.py) and the bounds of RLX's norm backward ops
(ops/backward.py, judged through judge/bounds/backward.py), which are those same VJPs computed
as ops. A judge may not import a backend, so the math lives here and backends/cpu/nn.py imports it.

The magnitude ``M`` of a VJP result is at least |J|ᵀ|dy| plus the op's sensitivity to the
rounding of the normalized values every implementation saves and differentiates from
(:func:`xhat_error`); an implementation that evaluates the textbook formula in unit roundoff u
is then within gamma_(terms + roundings)(u) M of the exact result (Higham Lemma 3.1; the
derivative judge's analysis, with ``roundings`` from cases/derivatives.toml).

A backward op also meets non-finite inputs (the ``special`` class). NaN propagates through every
formulation, so where one certainly reaches a result that result must be NaN exactly; an
infinity reaching a result gives +-inf or NaN depending on the formulation (inf - inf in
g - mean(g), inf * 0 where a normalized value rounds to zero): order-dependent, any non-finite
outcome (or a finite value within the bound); finite inputs whose intermediate sums or products
may overflow the compute dtype, which the float64 reference does not: any outcome.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.derivative import roundings_for
from rlx_conformance.judge.bounds.gamma import U64, gamma
from rlx_conformance.judge.bounds.reduce import sum_bound
from rlx_conformance.judge.compare import ANYTHING, NAN, NEG_INF, POS_INF, Bound



# -- magnitudes (shared with backends/cpu/nn.py) ---------------------------------------------------
def stats(x: np.ndarray, axes: tuple[int, ...], eps: float, rms: bool) -> tuple[np.ndarray, np.ndarray]:
    """(xhat, r): the normalized x and the denominator sqrt(var + eps) (sqrt(mean x^2 + eps))."""
    xhat, r, _ = _stats(x, axes, eps, rms)
    return xhat, r


def _stats(x, axes, eps, rms):
    """:func:`stats` and the mean it centred with (None for rms): what :func:`xhat_error` needs
    too, computed once by the magnitudes below (the same operations, so the same values)."""
    mean = None if rms else np.mean(x, axis=axes, keepdims=True)
    d = x if rms else x - mean
    r = np.sqrt(np.mean(d * d, axis=axes, keepdims=True) + eps)
    return d / r, r, mean


def xhat_error(x, axes, eps, rms, _st=None):
    """The scale of the rounding error of the normalized values every implementation saves and
    differentiates from: x - mean carries u (|x| + |mean|) (the centering's condition, large
    for values of small spread), so xhat carries u (|x| + |mean|) / r; rms: one relative
    rounding, u |xhat|. ``_st``: :func:`_stats` of the same arguments, where the caller has it."""
    xhat, r, mean = _st if _st is not None else _stats(x, axes, eps, rms)
    if rms:
        return np.abs(xhat)
    return (np.abs(x) + np.abs(mean)) / r


def _abs_xhat(x, axes, eps, rms, st):
    """|xhat| with its own rounding error added (xhat_error), from :func:`_stats` ``st``."""
    return np.abs(st[0]) + xhat_error(x, axes, eps, rms, st)


def normalize_magnitude(x, axes, eps, rms, w, _st=None, _ah=None):
    """The magnitude of the terms of J w for J of xhat = (x - mean) / r, symmetric ((I - 11ᵀ/n -
    xhat xhatᵀ/n) / r; rms: no 11ᵀ/n): (w + mean(w) + |xhat| mean(|xhat| w)) / r >= |J| w. It
    is the rounding scale of every implementation (MLX, PyTorch, JAX all form g - mean(g) -
    xhat mean(g xhat)), so it is kept where those terms cancel (a row of one element, values of
    small spread), where it exceeds |J| w by far: the cancellation is the error. |xhat| is
    taken with its own rounding error added (xhat_error). ``_st``, ``_ah``: :func:`_stats` and
    :func:`_abs_xhat` of the same arguments, where the caller has them."""
    st = _st if _st is not None else _stats(x, axes, eps, rms)
    _, r, _ = st
    ah = _ah if _ah is not None else _abs_xhat(x, axes, eps, rms, st)
    s = w + ah * np.mean(ah * w, axis=axes, keepdims=True)
    return (s if rms else s + np.mean(w, axis=axes, keepdims=True)) / r


def trailing_vjp_magnitude(x, gamma_, u, axes, eps, rms) -> tuple[list[np.ndarray], int]:
    """layer_norm / rms_norm over ``axes`` (x.shape[axis:]): normalize_magnitude for x (times
    |gamma|), |xhat| |u| and |u| summed over the rows for gamma and beta; ``u`` is |cotangent|.
    Terms: a result sums the n normalized elements, or gamma's and beta's sums over the rows,
    and three more terms, plus three."""
    n = int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1
    st = _stats(x, axes, eps, rms)
    ag, ah = np.abs(gamma_), _abs_xhat(x, axes, eps, rms, st)
    n = max(n + 3, x.size // max(gamma_.size, 1))  # gamma's and beta's sums over the rows
    lead = tuple(range(x.ndim - gamma_.ndim))
    return [normalize_magnitude(x, axes, eps, rms, u * ag, st, ah), np.sum(u * ah, axis=lead),
            np.sum(u, axis=lead)], n + 3


def per_channel(p: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel parameter [C] broadcastable to x [N, C, ...]."""
    return p.reshape((1, -1) + (1,) * (ndim - 2))


def group_terms(x: np.ndarray, gamma_: np.ndarray, num_groups: int) -> int:
    """group_norm's term count: a group's elements (and three more), or a channel's sum."""
    return max(x.reshape(x.shape[0], num_groups, -1).shape[2] + 3, x.size // max(gamma_.size, 1))


def group_abs_xhat(x: np.ndarray, num_groups: int, eps: float, _st=None) -> np.ndarray:
    """|xhat| raised by its rounding error (xhat_error), per group, in x's shape. ``_st``:
    :func:`_stats` of the groups, where the caller has it."""
    xg = x.reshape(x.shape[0], num_groups, -1)
    st = _st if _st is not None else _stats(xg, (2,), eps, False)
    return _abs_xhat(xg, (2,), eps, False, st).reshape(x.shape)


def group_vjp_magnitude(x, gamma_, u, num_groups, eps) -> tuple[list[np.ndarray], int]:
    """As layer_norm's (normalize_magnitude) over each group, gamma and beta per channel; ``u``
    is |cotangent|."""
    n, g = x.shape[0], num_groups
    xg = x.reshape(n, g, -1)
    st = _stats(xg, (2,), eps, False)
    ah = group_abs_xhat(x, g, eps, st)
    ag = np.abs(per_channel(gamma_, x.ndim))
    other = (0,) + tuple(range(2, x.ndim))
    mx = normalize_magnitude(xg, (2,), eps, False, (u * ag).reshape(n, g, -1), st, ah.reshape(xg.shape))
    return [mx.reshape(x.shape), np.sum(u * ah, axis=other), np.sum(u, axis=other)], group_terms(x, gamma_, g)


def batch_norm_vjp_magnitude(x, gamma_, mean, var, u, eps) -> tuple[list[np.ndarray], int]:
    """batch_norm_inference's VJP (u gamma s, sum u (x - m) s, sum u, -sum u gamma s,
    -sum u (x - m) gamma s^3 / 2; s = (var + eps)^-1/2, sums over the rows) at x - m -> |x - m|,
    gamma -> |gamma|, u -> |u| (``u`` given as |cotangent|): every term is then nonnegative, so
    these are |J|ᵀ|u| exactly. Terms: a parameter's result sums the rows."""
    xm, g = np.abs(x - mean), np.abs(gamma_)
    lead = tuple(range(x.ndim - 1))
    s = 1 / np.sqrt(var + eps)
    su = np.sum(u, axis=lead)
    sux = np.sum(u * xm, axis=lead)
    rows = max(x.size // max(x.shape[-1], 1), 1) if x.ndim else 1
    return [np.abs(v) for v in (u * g * s, sux * s, su, -su * g * s, -0.5 * sux * g * s ** 3)], rows


# -- the backward ops' bounds --------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """Where a norm's reductions run, as functions on arrays of x's shape: ``group`` broadcasts a
    sum over each normalized group back to x's shape, ``column`` sums over the rows a parameter
    is shared by (to the parameter's shape), ``param`` broadcasts a parameter to x."""

    group: Callable[[np.ndarray], np.ndarray]
    column: Callable[[np.ndarray], np.ndarray]
    param: Callable[[np.ndarray], np.ndarray]
    size: int  # elements per group


def trailing_layout(x: np.ndarray, axis: int) -> Layout:
    """layer_norm / rms_norm: groups are x.shape[axis:], parameters of that shape."""
    a = axis % x.ndim
    axes, lead = tuple(range(a, x.ndim)), tuple(range(a))
    return Layout(lambda v: np.broadcast_to(np.sum(v, axis=axes, keepdims=True), x.shape),
                  lambda v: np.sum(v, axis=lead), lambda p: p, math.prod(x.shape[a:]))


def group_layout(x: np.ndarray, num_groups: int) -> Layout:
    """group_norm: groups of C/num_groups channels with their spatial dims, parameters per channel."""
    n = x.shape[0]
    other = (0,) + tuple(range(2, x.ndim))
    size = x.size // max(n * num_groups, 1)

    def group(v):
        vg = v.reshape(n, num_groups, -1)
        return np.broadcast_to(np.sum(vg, axis=2, keepdims=True), vg.shape).reshape(x.shape)
    return Layout(group, lambda v: np.sum(v, axis=other), lambda p: per_channel(p, x.ndim), size)


def _judgement(m: np.ndarray, terms: int, forward: str, out_dtype: str, certain_nan: np.ndarray,
               reached: np.ndarray, over: np.ndarray) -> Bound:
    """gamma_(terms + roundings) of the compute dtype, plus the float64 reference's own share,
    times the magnitude ``m`` (the derivative cases' bound: judge/bounds/derivative.py); exact
    where a NaN certainly reaches (``certain_nan``), any non-finite outcome where an infinity
    reaches (``reached``), any outcome where the compute dtype may overflow (``over``)."""
    k = terms + roundings_for(forward).count
    u = dt.finfo(dt.compute_dtype(out_dtype)).unit_roundoff
    with np.errstate(all="ignore"):
        b = (gamma(k, u) + gamma(k, U64)) * m
    over = (over | ~np.isfinite(b)) & ~certain_nan
    free = (reached | over) & ~certain_nan
    allow = np.where(over, ANYTHING, POS_INF | NEG_INF | NAN)
    b = np.where(np.isfinite(b) & ~certain_nan, b, 0.0)
    return Bound(b, free, np.where(free, allow, 0).astype(np.uint8))


def _finite(a: np.ndarray) -> np.ndarray:
    """``a`` in float64 with NaN and infinities made 0 (``a`` itself, read only here, when it
    has none)."""
    a64 = np.asarray(a, np.float64)
    fin = np.isfinite(a64)
    return a64 if fin.all() else np.where(fin, a64, 0.0)


def _normalized(x0: np.ndarray, lay: Layout, eps: float, rms: bool):
    """(xhat, r, |xhat| with its rounding error, overflow of the statistics' sums) on finite x0,
    in x's shape."""
    n = max(lay.size, 1)
    d = x0 if rms else x0 - lay.group(x0) / n
    r = np.sqrt(lay.group(d * d) / n + eps)
    xhat = d / r
    err = np.abs(xhat) if rms else (np.abs(x0) + np.abs(lay.group(x0) / n)) / r
    sums = lay.group(x0 * x0) if rms else np.maximum(lay.group(np.abs(x0)), lay.group(d * d))
    return xhat, r, np.abs(xhat) + err, sums


def norm_backward_bound(inputs: Sequence[np.ndarray], lay: Layout, eps: float, rms: bool, wrt: str,
                        forward: str, magnitude: Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[list, int]],
                        out_dtype: str) -> Bound:
    """The bound of a layer/rms/group norm VJP result (``wrt``: x or gamma) computed as the
    textbook formula: dx = (g - mean(g) - xhat mean(g xhat)) / r (rms: no mean(g)), g = dy gamma;
    dgamma = sum over the rows of dy xhat. ``magnitude(x, gamma, |dy|)`` is the forward's VJP
    magnitude (finite inputs). dbeta: :func:`channel_sum_bound`."""
    x, g, dy = (np.asarray(v, np.float64) for v in inputs)
    if x.size == 0:
        return Bound(np.zeros(x.shape if wrt == "x" else g.shape))
    big = dt.finfo(dt.compute_dtype(out_dtype)).max / 2
    x0, g0, dy0 = _finite(x), _finite(g), _finite(dy)
    bad_x = ~np.isfinite(x)
    with np.errstate(all="ignore"):
        mags, terms = magnitude(x0, g0, np.abs(dy0))
        _, r, ah, sums = _normalized(x0, lay, eps, rms)
        stats_over = sums > big
        if wrt == "x":
            gp = dy * lay.param(g)
            gp_fin = np.isfinite(gp)
            if not bad_x.any() and gp_fin.all():  # each group sums zeros: exactly 0, never > 0
                certain = np.zeros(x.shape, bool)  # the shape lay.group gives
                reached = certain
            else:
                certain = lay.group((bad_x | np.isnan(gp)).astype(float)) > 0
                reached = lay.group((bad_x | ~gp_fin).astype(float)) > 0
            ag = np.abs(dy0 * lay.param(g0))
            over = stats_over | (ag > big) | (lay.group(ag) > big) | (lay.group(ag * ah) > big) | \
                (mags[0] * r > big)
            return _judgement(mags[0], terms, forward, out_dtype, certain, reached, over)
        # gamma: sum over the rows of dy xhat
        in_bad_group = lay.group(bad_x.astype(float)) > 0
        xhat_nan = (lay.group(np.isnan(x).astype(float)) > 0) | np.isinf(x) if rms else in_bad_group
        certain = lay.column((np.isnan(dy) | xhat_nan).astype(float)) > 0
        reached = lay.column((~np.isfinite(dy) | in_bad_group).astype(float)) > 0
        over = (lay.column(np.abs(dy0) * ah) > big) | (lay.column(stats_over.astype(float)) > 0)
        return _judgement(mags[1], terms, forward, out_dtype, certain, reached, over)


def channel_sum_bound(dy: np.ndarray, axis: int, out_dtype: str) -> Bound:
    """dbeta = the sum of dy over every dim but the channel ``axis``: reduce_sum's bound (any
    order, its NaN/inf and overflow judgement)."""
    c = dy.shape[axis] if dy.ndim else 1
    rows = np.moveaxis(dy, axis, -1).reshape(-1, c) if dy.ndim else dy.reshape(1, 1)
    return sum_bound([rows], {"axes": (0,), "keep_dim": False}, out_dtype)


def batch_norm_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], wrt: str,
                              out_dtype: str) -> Bound:
    """batch_norm_inference's VJP results, s = (var + eps)^-1/2 per feature (last axis): dx =
    dy gamma s (a product: NaN exact, an infinite factor +-inf or NaN by the order with a zero
    or an underflow, overflow of a partial product any outcome); dgamma = s sum over the rows
    of dy (x - mean); dbeta = sum over the rows of dy (reduce_sum's bound)."""
    x, g, _, m, var, dy = (np.asarray(v, np.float64) for v in inputs)
    if wrt == "beta":
        return channel_sum_bound(dy, -1, out_dtype).map(lambda v: v.reshape(g.shape))
    eps = attrs["eps"]
    big = dt.finfo(dt.compute_dtype(out_dtype)).max / 2
    lead = tuple(range(x.ndim - 1))
    with np.errstate(all="ignore"):
        s = 1 / np.sqrt(var + eps)  # NaN for var + eps < 0, inf for 0
        x0, g0, m0, dy0 = _finite(x), _finite(g), _finite(m), _finite(dy)
        s0 = np.where(np.isfinite(s), s, 0.0)
        mags, terms = batch_norm_vjp_magnitude(x0, g0, m0, np.where(np.isfinite(s), var, 1.0),
                                               np.abs(dy0), eps)
        if wrt == "x":
            nan_in = np.isnan(dy) | np.isnan(g) | np.isnan(s)
            inf_in = ~np.isfinite(dy) | ~np.isfinite(g) | ~np.isfinite(s)
            over = (np.abs(dy0 * g0) > big) | (np.abs(dy0) * s0 > big) | (np.abs(g0) * s0 > big)
            out = _judgement(mags[0], terms, "batch_norm_inference", out_dtype, nan_in, inf_in & ~nan_in,
                             over & ~inf_in)
            # a partial product that underflows carries an absolute error of up to half the
            # smallest subnormal (Higham sec. 2.1: fl(a b) = a b (1 + d) + e), scaled by the
            # remaining factor: whichever two factors a backend multiplies first
            eta = dt.finfo(dt.compute_dtype(out_dtype)).smallest_subnormal
            under = eta * (np.abs(dy0) + np.abs(g0) + s0)
            return Bound(np.where(nan_in, 0.0, out.abs + under), out.free, out.allow)
        bad_row = ~np.isfinite(dy) | ~np.isfinite(x) | ~np.isfinite(m)
        certain = (np.sum(np.isnan(dy) | np.isnan(x) | np.isnan(m), axis=lead) > 0) | np.isnan(s)
        reached = (np.sum(bad_row, axis=lead) > 0) | ~np.isfinite(s)
        xm = np.abs(x0) + np.abs(m0)
        over = (np.max(xm, axis=lead, initial=0.0) > big) | \
            (np.sum(np.abs(dy0) * xm, axis=lead) * np.maximum(s0, 1) > big)
        return _judgement(mags[1], terms, "batch_norm_inference", out_dtype, certain, reached & ~certain,
                          over & ~reached)
