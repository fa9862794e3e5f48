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


# Below this many rows a scan's recurrence runs row by row on Python floats: the same IEEE double
# operations in the same order (CPython's float * and + round each result, no fused multiply-add,
# as numpy's ufuncs), without numpy's per-call cost at each of a long row's steps (a 10^5-element
# row: 100 ms a rule call through 0-d arrays, 15 ms so). tests/test_scan_recurrences.py checks the
# two paths bit for bit.
SHORT_BATCH = 32


def _by_rows(*arrays: np.ndarray) -> list[np.ndarray] | None:
    """The arrays as [rows, n] (one row a scan), where there are few enough rows for the per-row
    path; None otherwise (or for an empty scan axis)."""
    n = arrays[0].shape[-1]
    batch = arrays[0].size // n if n else 0
    if not n or batch > SHORT_BATCH:
        return None
    return [a.reshape(batch, n) for a in arrays]


def product_scan_tangent(x: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Along the last axis, dp after each step of (p, dp) <- (p x_i, dp x_i + p t_i) from (1, 0):
    the forward-mode derivative of a running product (no division: exact at zeros), in float64
    (what the rules get: Backend._derivative_call widens every floating input), shape of x."""
    x, t = np.asarray(x, np.float64), np.asarray(t, np.float64)
    out = np.zeros(x.shape)
    rows = _by_rows(x, t)
    if rows is not None:
        flat = out.reshape(rows[0].shape)
        for b, (xr, tr) in enumerate(zip(rows[0].tolist(), rows[1].tolist())):
            p, dp, acc = 1.0, 0.0, []
            for xi, ti in zip(xr, tr):
                p, dp = p * xi, dp * xi + p * ti
                acc.append(dp)
            flat[b] = acc
        return out
    p = np.ones(x.shape[:-1])
    dp = np.zeros(x.shape[:-1])
    for i in range(x.shape[-1]):
        p, dp = p * x[..., i], dp * x[..., i] + p * t[..., i]
        out[..., i] = dp
    return out


def product_scan_suffix(x: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Along the last axis, R_i = u_i + x_{i+1} R_{i+1} from the end (R_{n-1} = u_{n-1} + 0):
    sum_{j>=i} u_j prod_{i<k<=j} x_k, the suffix half of a running product's VJP, in float64."""
    x, u = np.asarray(x, np.float64), np.asarray(u, np.float64)
    n = x.shape[-1]
    out = np.zeros(x.shape)
    rows = _by_rows(x, u)
    if rows is not None:
        flat = out.reshape(rows[0].shape)
        for b, (xr, ur) in enumerate(zip(rows[0].tolist(), rows[1].tolist())):
            acc = [0.0] * n
            r = ur[n - 1] + 0.0
            acc[n - 1] = r
            for i in range(n - 2, -1, -1):
                r = ur[i] + xr[i + 1] * r
                acc[i] = r
            flat[b] = acc
        return out
    r = np.zeros(x.shape[:-1])
    for i in range(n - 1, -1, -1):
        r = u[..., i] + (x[..., i + 1] * r if i + 1 < n else 0.0)
        out[..., i] = r
    return out


def softmax_centered(s: np.ndarray, w: np.ndarray, axis: int) -> np.ndarray:
    """w_i - sum_j s_j w_j along ``axis``, accurate also where s is nearly one-hot: at the
    largest s_m the difference cancels (w_m - (1 - eps) w_m - ...), so there it is summed as
    sum_j s_j (w_m - w_j) instead. Both rules of softmax (and of the ops built on it) use it."""
    c = w - np.sum(s * w, axis=axis, keepdims=True)
    m = np.argmax(s, axis=axis, keepdims=True)
    wm = np.take_along_axis(w, m, axis=axis)
    np.put_along_axis(c, m, np.sum(s * (wm - w), axis=axis, keepdims=True), axis=axis)
    return c


def softmax_hvp_parts(s: np.ndarray, u: np.ndarray, v: np.ndarray, axis: int) -> np.ndarray:
    """d/de of the VJP s (u - <s, u>) along x + e v: ds (u - <s, u>) - s <u, ds> with
    ds = s (v - <s, v>) (softmax's JVP), the centered factors by softmax_centered. Shared by the
    ops built on softmax (softmax_cross_entropy)."""
    ds = s * softmax_centered(s, v, axis)
    return ds * softmax_centered(s, u, axis) - s * np.sum(u * ds, axis=axis, keepdims=True)


def softmax_hvp_magnitude_parts(s: np.ndarray, spread: np.ndarray, u: np.ndarray, v: np.ndarray,
                                axis: int) -> tuple[np.ndarray, int]:
    """The absolute-value version of softmax_hvp_parts' terms, (|v| + <s, |v|>) s (|u| +
    <s, |u|>) + s <|u|, s (|v| + <s, |v|>)>, with each s_j scaled by 1 + spread_j / (n + 2)
    (spread = |x - max x|: exp of the rounded x - max is off by that many u relative); terms
    3 (n + 2) + 2: the terms are cubic in s and each computed s carries up to (n + 2 + spread) u
    relative error (the sum of n exponentials, the exp, the division), so gamma_(3(n+2)) times
    the weighted cubic bounds their effect, and the sums along the axis are n products each."""
    n = s.shape[axis]
    sw = s * (1 + spread / (n + 2))
    au, av = np.abs(u), np.abs(v)
    dsa = sw * (av + np.sum(sw * av, axis=axis, keepdims=True))
    mag = dsa * (au + np.sum(sw * au, axis=axis, keepdims=True)) + sw * np.sum(au * dsa, axis=axis, keepdims=True)
    return mag, 3 * (n + 2) + 2


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


def unary_second_rule(op: str, second: Callable[[np.ndarray], np.ndarray],
                      extra: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
    """Register the second-order rules of an elementwise unary op from f''(x): the HVP is
    u v f''(x) (d/de of u f'(x + e v); the Hessian of <u, f> is diagonal), and its magnitude
    (|f''(x)| + extra(x)) |u| |v| with 2 terms (the products u v and (u v) f'').

    ``extra(x) >= 0``: what a backend's own evaluation of f'' can add beyond |f''| per unit of
    rounding: the sensitivity |d f''/d y| |y| to the rounding of a saved forward value y it
    computes f'' from (a tanh or sigmoid reused by the VJP: near saturation f'' cancels while
    y's error does not), that to a rounded inner argument (x / sqrt 2, x^2, c (x + a x^3): a
    relative u of the argument moves f'' by its derivative times the argument), and the
    absolute values of the terms autodiff sums to f'' where they cancel (product and quotient
    rules). None: f'' is a product of powers of rounded values, one relative rounding each, which
    cases/derivatives.toml's roundings count."""
    def hvp(inputs: list[np.ndarray], attrs: dict, cots: Grads, tans: Grads) -> Grads:
        return [cots[0] * tans[0] * second(inputs[0])]

    def hvp_magnitude(inputs: list[np.ndarray], attrs: dict, cots: Grads, tans: Grads
                      ) -> tuple[Grads, int]:
        x = inputs[0]
        scale = np.abs(second(x)) + (0.0 if extra is None else extra(x))
        return [scale * np.abs(cots[0]) * np.abs(tans[0])], 2

    BACKEND.hvp(op)(hvp)
    BACKEND.hvp_magnitude(op)(hvp_magnitude)


# -- derivative magnitudes (DerivativeRule.magnitude): the scale the derivative judge's bound
# multiplies, per result >= |J|^T |u| (vjp) or |J| |v| (jvp). A few generic strategies evaluate
# the op's own registered rules on transformed inputs and seeds, so each is exact for the class
# of Jacobians it names and costs one or two rule calls; ``saved`` terms add the sensitivity to
# the rounding of forward values a backend's derivative is computed from (see diagonal). Each
# returns the magnitude function; the family file registers it (BACKEND.magnitude(op)(...)).
Mags = tuple[Grads, int]


def _rule_call(op: str, kind: str, inputs: list[np.ndarray], attrs: dict, seeds: Grads) -> Grads:
    """The registered vjp or jvp rule of ``op`` (looked up at call time: the rules of a family
    are registered after its magnitude's decorator runs)."""
    rule = BACKEND.derivatives[op]
    return list((rule.vjp if kind == "vjp" else rule.jvp)(inputs, attrs, seeds))


def _abs(xs: Grads) -> Grads:
    return [None if x is None else np.abs(x) for x in xs]


def _is_float(x: np.ndarray) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.floating)


def _ones_like(xs: Grads) -> Grads:
    return [None if x is None else np.ones(np.shape(x)) for x in xs]


def _max_count(res: Grads) -> int:
    """The largest entry of a rule evaluated on ones: how many products a result sums."""
    return max((int(np.ceil(np.max(r))) for r in res if r is not None and np.size(r)), default=1)


def multilinear(op: str, terms: Callable[[list[np.ndarray], dict, str], int] | None = None
                ) -> Callable[..., Mags]:
    """The magnitude of an op that is linear in each differentiable input separately and whose
    coefficients are products of its floating inputs with constant nonnegative factors, up to
    one sign per result (mat_mul, conv, dot_general, reduce_sum/mean/prod, cumsum, cum_prod,
    fma, the layout ops, gather/scatter of data, sparse mat_vec): rule(|x|, |seed|) is then
    exactly |J|-product. ``terms(inputs, attrs, kind)``, by default the rule on all-ones
    floating inputs and seeds: the products one result sums (an op with coefficients below 1,
    a mean, must pass its own)."""
    def magnitude(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Mags:
        ax = [np.abs(x) if _is_float(x) else x for x in inputs]
        mags = _abs(_rule_call(op, kind, ax, attrs, _abs(seeds)))
        if terms is not None:
            return mags, int(terms(inputs, attrs, kind))
        ones = [np.ones(x.shape) if _is_float(x) else x for x in inputs]
        return mags, _max_count(_rule_call(op, kind, ones, attrs, _ones_like(seeds)))

    return magnitude


def selection(op: str, terms: Callable[[list[np.ndarray], dict, str], int] | None = None
              ) -> Callable[..., Mags]:
    """The magnitude of an op whose Jacobian is nonnegative and depends on the values only
    through which elements are selected (max/min reductions, sort, top_k, cum_max, max pooling,
    scatter max/min: entries 0, 1 or a tie's share 1/k): rule(x, |seed|) is exactly |J|-product.
    ``terms(inputs, attrs, kind)``: the most selected elements one result sums; by default the
    rule on ones seeds, exact where the entries are 0 or 1 (a tie-sharing op must pass its own)."""
    def magnitude(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Mags:
        mags = _abs(_rule_call(op, kind, inputs, attrs, _abs(seeds)))
        if terms is not None:
            return mags, int(terms(inputs, attrs, kind))
        return mags, _max_count(_rule_call(op, kind, inputs, attrs, _ones_like(seeds)))

    return magnitude


def _partials_at(op: str, inputs: list[np.ndarray], attrs: dict) -> tuple[Grads, tuple[int, ...]]:
    """The partials of an elementwise (broadcasting) op at the broadcast point: its VJP with the
    floating inputs broadcast to the output shape and a cotangent of ones (nothing is summed)."""
    shape = np.broadcast_shapes(*(x.shape for x in inputs))
    full = [np.array(np.broadcast_to(x, shape)) for x in inputs]
    return _rule_call(op, "vjp", full, attrs, [np.ones(shape)]), shape


def _diagonal(op: str, inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads,
              d: Grads, shape: tuple[int, ...]) -> Mags:
    """unbroadcast(d_k |u|) per input (vjp) or sum_k d_k |v_k| per output (jvp), d_k >= 0 at the
    broadcast point; terms: an input's broadcast count (vjp), the differentiable inputs (jvp)."""
    if kind == "vjp":
        u = np.abs(seeds[0])
        mags = [None if p is None else unbroadcast(p * u, x.shape) for p, x in zip(d, inputs)]
        return mags, max((int(np.prod(shape)) // max(x.size, 1) for x, p in zip(inputs, d)
                          if p is not None), default=1)
    out = np.zeros(shape)
    for p, v in zip(d, seeds):
        if p is not None and v is not None:
            out = out + p * np.abs(np.broadcast_to(v, shape))
    return [out], sum(1 for p in d if p is not None)


def diagonal(op: str, saved: Callable[[list[np.ndarray], dict], Grads] | None = None
             ) -> Callable[..., Mags]:
    """The magnitude of an elementwise op with broadcasting (each output element
    depends on one element of each input): from the partials d_k at the broadcast point,
    unbroadcast(|d_k| |u|) per input (vjp) and sum_k |d_k| |v_k| per output (jvp), exact.

    ``saved(broadcast inputs, attrs)``: per input, |dg/dy| |y| where an established
    implementation computes the partial g from the op's rounded forward output y (MLX's tanh
    VJP is 1 - y^2, sigmoid's y (1 - y), exp's y): rounding y by a relative u moves g by u times
    that, which dominates g where g cancels (1 - y^2 near saturation). It is added to |d_k|, and
    the judge's gamma multiplies it by u; :data:`SAVED_TERMS` keeps that part on its own."""
    def exact(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Mags:
        parts, shape = _partials_at(op, inputs, attrs)
        return _diagonal(op, inputs, attrs, kind, seeds, _abs(parts), shape)

    if saved is None:
        return exact

    def saved_part(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Grads:
        shape = np.broadcast_shapes(*(x.shape for x in inputs))
        extra = saved([np.array(np.broadcast_to(x, shape)) for x in inputs], attrs)
        return _diagonal(op, inputs, attrs, kind, seeds, extra, shape)[0]

    def magnitude(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Mags:
        mags, terms = exact(inputs, attrs, kind, seeds)
        return add_grads(mags, saved_part(inputs, attrs, kind, seeds)), terms

    SAVED_TERMS[op] = saved_part
    return magnitude


def argument(op: str, sensitivity: Callable[[list[np.ndarray], dict], Grads]) -> None:
    """Declare the sensitivity of an elementwise op's first derivatives to the rounding of their
    formula's own arguments (judge/bounds/derivative.py, [[argument]] in cases/derivatives.toml):
    ``sensitivity(broadcast inputs, attrs)`` gives per input, at the broadcast point, how far a
    relative rounding of one unit moves that input's partial (|dg/dw| |w| for the argument w of
    the partial g, summed over its arguments), >= 0; scaled by the seeds as the magnitude is."""
    def part(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Grads:
        shape = np.broadcast_shapes(*(x.shape for x in inputs))
        extra = sensitivity([np.array(np.broadcast_to(x, shape)) for x in inputs], attrs)
        return _diagonal(op, inputs, attrs, kind, seeds, extra, shape)[0]

    ARGUMENT_TERMS[op] = part


# op -> the sensitivity of its first derivatives to the rounding of their formula's own arguments
# (argument above), with the magnitude's signature; the derivative judge adds gamma_k(u) times it.
ARGUMENT_TERMS: dict[str, Callable[[list[np.ndarray], dict, str, Grads], Grads]] = {}


def argument_sensitivity(op: str, kind: str, inputs: list[np.ndarray], attrs: dict,
                         seeds: Grads) -> Grads | None:
    """ARGUMENT_TERMS[op] for a vjp (seeds: cotangents) or jvp (tangents), float64, one array
    (or None) per result; None where the op declares none or for an HVP (whose magnitude holds
    its arguments' roundings: unary_second_rule's ``extra``)."""
    fn = ARGUMENT_TERMS.get(op)
    if fn is None or kind not in ("vjp", "jvp"):
        return None
    with np.errstate(all="ignore"):
        xs = [np.asarray(x, np.float64) for x in inputs]
        return list(fn(xs, dict(attrs), kind, [None if v is None else np.asarray(v, np.float64) for v in seeds]))


def intermediates(op: str, largest: Callable[[list[np.ndarray], dict, str], Grads]) -> None:
    """Declare the largest intermediate a good implementation's derivative formula for ``op``
    forms before the seeds scale it (pow's a^(b-1), which overflows where b a^(b-1) need not):
    ``largest(inputs, attrs, kind) -> one array (or None) per result``, for the [[overflow]]
    rule of judge/bounds/derivative.py besides the terms' magnitude."""
    INTERMEDIATES[op] = largest


INTERMEDIATES: dict[str, Callable[[list[np.ndarray], dict, str], Grads]] = {}


def largest_intermediate(op: str, kind: str, inputs: list[np.ndarray], attrs: dict) -> Grads | None:
    """INTERMEDIATES[op] for a vjp or jvp, float64; None where the op declares none."""
    fn = INTERMEDIATES.get(op)
    if fn is None or kind not in ("vjp", "jvp"):
        return None
    with np.errstate(all="ignore"):
        return list(fn([np.asarray(x, np.float64) for x in inputs], dict(attrs), kind))


def add_grads(a: Grads, b: Grads) -> Grads:
    """a + b per result (None where either is None)."""
    return [None if x is None or y is None else x + y for x, y in zip(a, b)]


# op -> the part of its declared magnitude that is not |J|-product: the sensitivity to the
# rounding of saved forward values (or, for a solve, of its own backward-stable solves), with
# the magnitude's signature (tests/test_derivative_magnitude.py takes it apart).
SAVED_TERMS: dict[str, Callable[[list[np.ndarray], dict, str, Grads], Grads]] = {}


def _swap(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def solve_magnitude(a: np.ndarray, x: np.ndarray, kind: str, w: np.ndarray, wa: np.ndarray | None = None,
                    skeel: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """The magnitudes of x = A⁻¹ B's derivatives (B, x: columns), with N = |A⁻¹|: the exact
    |J|-products, vjp (w = |u|; gB = A⁻ᵀ u, gA = -gB xᵀ): Nᵀ w and (Nᵀ w) |x|ᵀ; jvp (w = |dB|,
    wa = |dA|; dx = A⁻¹ (dB - dA x)): N (w + wa |x|). With ``skeel``, only what the solves' own
    rounding adds: a backward stable solve of A y = r returns the solution of (A + dA) y = r,
    |dA| <= gamma |A| (Higham ch. 9, |L||U| ~ |A| with pivoting), an error of gamma N |A| |y|
    (Skeel), not gamma N |r|; vjp: Nᵀ |A|ᵀ |gB| for gB, that times |x|ᵀ plus |gB| (N |A| |x|)ᵀ
    (the forward x reused) for gA; jvp: N (|A| |dx| + wa N |A| |x|). Returns (for B, for A)."""
    n = np.linalg.inv(a)
    nn, aa, ax = np.abs(n), np.abs(a), np.abs(x)
    dx_x = nn @ (aa @ ax)  # the forward x's own error scale
    if kind == "vjp":
        if not skeel:
            mb = _swap(nn) @ w
            return mb, mb @ _swap(ax)
        gb = np.abs(np.linalg.solve(_swap(a), w))
        mb = _swap(nn) @ (_swap(aa) @ gb)
        return mb, mb @ _swap(ax) + gb @ _swap(dx_x)
    if not skeel:
        return nn @ (w + (0.0 if wa is None else wa @ ax)), None
    dx = n @ (w - (0.0 if wa is None else wa @ x))
    return nn @ (aa @ np.abs(dx) + (0.0 if wa is None else wa @ dx_x)), None


def fan_in(op: str, terms: Callable[[list[np.ndarray], dict, str], int],
           gather: Callable[[Grads], Grads]) -> Callable[..., Mags]:
    """The magnitude of an op each of whose differentiable input elements feeds exactly one
    output element (det, log_det: one matrix to one scalar): the VJP at a unit cotangent is then
    each element's partial p, |VJP(x, |u|)| is exactly |J|ᵀ|u| (one product per result) and
    ``gather``(|p| |v|), the sums over the elements feeding each output, exactly |J||v|.
    ``terms(inputs, attrs, kind)``: the products a result sums and the roundings of its partial."""
    def magnitude(inputs: list[np.ndarray], attrs: dict, kind: str, seeds: Grads) -> Mags:
        if kind == "vjp":
            return _abs(_rule_call(op, "vjp", inputs, attrs, _abs(seeds))), int(terms(inputs, attrs, kind))
        outs = _rule_call(op, "jvp", inputs, attrs, seeds)
        parts = _rule_call(op, "vjp", inputs, attrs, _ones_like(outs))
        return gather([None if v is None else np.abs(v) * np.abs(p) for v, p in zip(seeds, parts)]), \
            int(terms(inputs, attrs, kind))

    return magnitude
