"""Helpers the reference derivative rules share (backends/base.py: DerivativeRule): undoing a
broadcast (a cotangent summed, a smoothness radius minimised over the broadcast dims), the
smoothness radius of ties among values that a selection compares, products of the other factors
(no division, zeros allowed), softmax's centering accurate near one-hot, and the unary rule
pattern.
Not a kernel module (the leading underscore keeps the loader from importing it as a family)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_conformance.backends.base import Grads
from rlx_conformance.backends.cpu import BACKEND


def _broadcast_axes(full: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    lead = len(full) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape) if d == 1 and full[lead + i] != 1)
    return axes, lead


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The cotangent of an operand broadcast to g's shape: g summed over the broadcast dims."""
    g = np.asarray(g)
    if g.shape == tuple(shape):
        return g
    axes, _ = _broadcast_axes(g.shape, tuple(shape))
    return np.sum(g, axis=axes, keepdims=True).reshape(shape) if g.size else np.zeros(shape)


def unbroadcast_min(r: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A per-output smoothness radius as one per operand element: the smallest over the outputs
    the element is broadcast to (inf where it reaches none)."""
    r = np.asarray(r, np.float64)
    if r.shape == tuple(shape):
        return r
    axes, _ = _broadcast_axes(r.shape, tuple(shape))
    if not r.size:
        return np.full(shape, np.inf)
    return np.min(r, axis=axes, keepdims=True).reshape(shape)


def selection_radius(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Smoothness radius of a max over ``axis`` (a min: pass -x): 0 for elements tied at the
    maximum (any perturbation breaks the tie), half the gap between the maximum and the next
    smaller value for the others (moving every element by less keeps the winner), inf for a lone
    element."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    if x.shape[-1] == 0:
        return np.moveaxis(x.copy(), -1, axis)
    top = np.max(x, axis=-1, keepdims=True)
    at_top = x == top
    below = np.where(at_top, -np.inf, x)
    second = np.max(below, axis=-1, keepdims=True)
    gap = np.where(np.isfinite(second), (top - second) / 2, np.inf)
    tied = at_top & (np.sum(at_top, axis=-1, keepdims=True) > 1)
    return np.moveaxis(np.where(tied, 0.0, np.broadcast_to(gap, x.shape)), -1, axis)


def sorted_gap_radius(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Smoothness radius of an ordering along ``axis`` (sort, top_k): half the distance from each
    element to its nearest other value along the axis, 0 for a tie (a permutation stays fixed
    while no two elements cross)."""
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    n = x.shape[-1]
    if n < 2:
        return np.moveaxis(np.full(x.shape, np.inf), -1, axis)
    order = np.argsort(x, axis=-1, kind="stable")
    s = np.take_along_axis(x, order, axis=-1)
    d = np.diff(s, axis=-1)
    inf = np.full(s.shape[:-1] + (1,), np.inf)
    near = np.minimum(np.concatenate([inf, d], -1), np.concatenate([d, inf], -1)) / 2
    out = np.empty_like(near)
    np.put_along_axis(out, order, near, axis=-1)
    return np.moveaxis(out, -1, axis)


def exclusive_products(rows: np.ndarray) -> np.ndarray:
    """prod_{j != i} x_j along the last axis without dividing (zeros allowed): the product of the
    prefix before i times the suffix after i."""
    ones = np.ones(rows.shape[:-1] + (1,))
    before = np.cumprod(np.concatenate([ones, rows[..., :-1]], -1), -1)
    after = np.flip(np.cumprod(np.concatenate([ones, np.flip(rows, -1)[..., :-1]], -1), -1), -1)
    return before * after


def softmax_centered(s: np.ndarray, w: np.ndarray, axis: int) -> np.ndarray:
    """w_i - sum_j s_j w_j along ``axis``, accurate also where s is nearly one-hot: at the
    largest s_m the difference cancels (w_m - (1 - eps) w_m - ...), so there it is summed as
    sum_j s_j (w_m - w_j) instead. Both rules of softmax (and of the ops built on it) use it."""
    c = w - np.sum(s * w, axis=axis, keepdims=True)
    m = np.argmax(s, axis=axis, keepdims=True)
    wm = np.take_along_axis(w, m, axis=axis)
    np.put_along_axis(c, m, np.sum(s * (wm - w), axis=axis, keepdims=True), axis=axis)
    return c


def unary_rule(op: str, deriv: Callable[[np.ndarray], np.ndarray], convention: str = "",
               radius: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """Register the rules of an elementwise unary op from its derivative f'(x): the VJP is u f'(x),
    the JVP t f'(x) (J is diagonal, so both are the one formula; finite differences and the MPFR
    oracle verify it). ``radius(x)``: distance to the nearest kink or pole."""
    def vjp(inputs: list[np.ndarray], attrs: dict, cots: Grads) -> Grads:
        return [cots[0] * deriv(inputs[0])]

    def jvp(inputs: list[np.ndarray], attrs: dict, tans: Grads) -> Grads:
        return [tans[0] * deriv(inputs[0])]

    BACKEND.vjp(op, convention=convention,
                radius=None if radius is None else (lambda xs, attrs: [radius(xs[0])]))(vjp)
    BACKEND.jvp(op)(jvp)
