"""Reference kernels for reductions and scans. Float sums and running sums are accumulated in
float64 by trees of depth ceil(log2 n) (pairwise sums over a contiguous last axis, doubling
scans) and rounded once, so the reference sits inside the accuracy budget of its own dtype
(cases/accuracy.toml: depth <= 3.5 ceil(log2 n)), float64 included, and far inside the error bound
that the registry allows any accumulation order. numpy alone would not: it adds along a
non-contiguous axis and scans sequentially (depth n - 1), which the precise oracle found over the
float64 budgets (constant and offset values at n = 10^6). Products are numpy's: every
multiplication rounds the whole product, so no order beats gamma_(n-1) (their budget)."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.backends.cpu._grad import (
    SAVED_TERMS,
    exclusive_products,
    multilinear,
    product_scan_suffix,
    product_scan_tangent,
    selection,
    selection_radius,
    softmax_centered,
    softmax_hvp_magnitude_parts,
    softmax_hvp_parts,
)
from rlx_conformance.judge.bounds.reduce import exclusive_sums

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
    n = math.prod(x.shape[a] for a in ax)  # explicit: -1 is ambiguous when the rest is empty
    return np.transpose(x, perm).reshape([x.shape[a] for a in rest] + [n]), perm


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

# Magnitudes: sums are linear with nonnegative coefficients (_grad.multilinear); max/min select
# with tie shares (_grad.selection): a VJP result receives one output's share, a JVP sums the tied
# elements (at most the reduced count).
BACKEND.magnitude("reduce_sum")(multilinear("reduce_sum"))
BACKEND.magnitude("reduce_mean")(multilinear("reduce_mean", lambda xs, attrs, kind: 1 if kind == "vjp"
                                             else max(_count(xs[0], attrs["axes"]), 1)))
for _op in ("reduce_max", "reduce_min"):
    BACKEND.magnitude(_op)(selection(_op, lambda xs, attrs, kind: 1 if kind == "vjp"
                                      else _count(xs[0], attrs["axes"])))


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
    dp = product_scan_tangent(rows, trows)[..., -1] if rows.shape[-1] else np.zeros(rows.shape[:-1])
    if attrs["keep_dim"]:
        dp = np.reshape(dp, [1 if a in _reduced(x, attrs["axes"]) else x.shape[a] for a in range(x.ndim)])
    return [dp]


# reduce_prod is multilinear in the elements (_grad.multilinear); an entry is a product of the
# other n - 1 elements, so a result carries n roundings whichever way it is formed.
BACKEND.magnitude("reduce_prod")(multilinear("reduce_prod", lambda xs, attrs, kind: max(_count(xs[0], attrs["axes"]), 1)))


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


def _softmax_saved(inputs, attrs, kind, seeds):
    """MLX (like PyTorch and JAX) differentiates softmax from its rounded output s as
    s (w - <s, w>): rounding s by a relative u moves that by u (s_j |w_j - <s, w>| + s_j <s, |w|>)
    <= u s_j (|w_j| + 2 <s, |w|>), which dominates the exact magnitude where s is nearly one-hot."""
    (x,) = inputs
    if not x.size:
        return [np.zeros(x.shape)]
    s, w = _softmax64(x, attrs["axis"]), np.abs(seeds[0])
    return [s * (w + 2 * np.sum(s * w, axis=attrs["axis"], keepdims=True))]


@BACKEND.magnitude("softmax")
def softmax_magnitude(inputs, attrs, kind, seeds):
    """|J| |w| for J = diag(s) - s sᵀ (symmetric, so one formula for vjp and jvp), exactly:
    s_j ((1 - s_j) |w_j| + sum_{i != j} s_i |w_i|) with 1 - s_j = sum_{i != j} s_i (no
    cancellation), plus the saved-output term (_softmax_saved); a result sums the n terms of
    <s, w> along the axis."""
    (x,) = inputs
    ax = attrs["axis"]
    if not x.size:
        return [np.zeros(x.shape)], 1
    s, w = _softmax64(x, ax), np.abs(seeds[0])
    exact = s * (exclusive_sums(s, ax) * w + exclusive_sums(s * w, ax))
    return [exact + _softmax_saved(inputs, attrs, kind, seeds)[0]], x.shape[ax]


SAVED_TERMS["softmax"] = _softmax_saved


@BACKEND.hvp("softmax")
def softmax_hvp(inputs, attrs, cots, tans):
    """The Hessian of <u, softmax(x)> times v: softmax_hvp_parts."""
    (x,) = inputs
    if not x.size:
        return [np.zeros(x.shape)]
    ax = attrs["axis"]
    return [softmax_hvp_parts(_softmax64(x, ax), cots[0], tans[0], ax)]


@BACKEND.hvp_magnitude("softmax")
def softmax_hvp_magnitude(inputs, attrs, cots, tans):
    """softmax_hvp_magnitude_parts at the reference's s."""
    (x,) = inputs
    if not x.size:
        return [np.zeros(x.shape)], 1
    ax = attrs["axis"]
    spread = np.abs(x - np.max(x, axis=ax, keepdims=True))
    mag, terms = softmax_hvp_magnitude_parts(_softmax64(x, ax), spread, cots[0], tans[0], ax)
    return [mag], terms


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
        out = _shift(out, 0.0)
    if attrs["reverse"]:
        out = np.flip(out, -1)
    return [np.moveaxis(out, -1, attrs["axis"])]


BACKEND.magnitude("cumsum")(multilinear("cumsum"))  # a running sum: coefficients 0 or 1


def _along(x: np.ndarray, attrs) -> np.ndarray:
    """x with the scan axis last, in scan order (reversed for reverse)."""
    w = np.moveaxis(x, attrs["axis"], -1)
    return np.flip(w, -1) if attrs["reverse"] else w


def _back(w: np.ndarray, attrs) -> np.ndarray:
    return np.moveaxis(np.flip(w, -1) if attrs["reverse"] else w, -1, attrs["axis"])


def _shift(w: np.ndarray, fill: float) -> np.ndarray:
    """An inclusive scan made exclusive: shifted by one, ``fill`` first (an empty scan axis stays
    empty: there is no first element to fill)."""
    if not w.shape[-1]:
        return w
    return np.concatenate([np.full(w.shape[:-1] + (1,), fill), w[..., :-1]], -1)


@vjp("cum_prod", convention="exact at zeros (no division)")
def cum_prod_vjp(inputs, attrs, cots):
    """y_j = prod_{i<=j} x_i (inclusive); g_i = P_{<i} R_i with R_i = u_i + x_{i+1} R_{i+1},
    the suffix recurrence of sum_{j>=i} u_j prod_{i<k<=j} x_k (exclusive: u shifted back)."""
    x, u = _along(inputs[0], attrs), _along(cots[0], attrs)
    n = x.shape[-1]
    if attrs["exclusive"]:  # y_j = inclusive_{j-1}: the cotangent of inclusive_i is u_{i+1}
        u = np.concatenate([u[..., 1:], np.zeros(u.shape[:-1] + (1,))], -1)
    g = product_scan_suffix(x, u)
    prefix = _shift(np.cumprod(x, -1), 1.0) if n else x
    # g = 0 (an element no output depends on: the last one of an exclusive scan) has derivative
    # 0 exactly, also where its prefix product overflowed float64 (0 * inf would be NaN)
    return [_back(np.where(g == 0, 0.0, g * prefix), attrs)]


@jvp("cum_prod")
def cum_prod_jvp(inputs, attrs, tans):
    """Forward mode along the scan: (p, dp) <- (p x_i, dp x_i + p t_i)."""
    x, t = _along(inputs[0], attrs), _along(tans[0], attrs)
    out = product_scan_tangent(x, t)
    if attrs["exclusive"]:
        out = _shift(out, 0.0)
    return [_back(out, attrs)]


# cum_prod is multilinear in the elements (_grad.multilinear): an entry is a product of up to
# n - 1 elements and a result sums up to n of them.
BACKEND.magnitude("cum_prod")(multilinear("cum_prod", lambda xs, attrs, kind: max(xs[0].shape[attrs["axis"]], 1)
                                          if xs[0].ndim else 1))


def _running_max_runs(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Along the last axis: whether each element holds its prefix's running max, the number of
    elements tied at the running max of each prefix (c_j), and the run each position belongs to
    (a run starts where the running max rises strictly; elements before it are smaller). O(n)."""
    m = np.maximum.accumulate(x, axis=-1)
    rise = np.ones(x.shape, bool)
    rise[..., 1:] = m[..., 1:] > m[..., :-1]
    run = np.cumsum(rise, axis=-1)
    holds = x == m  # x_i is the running max at i, hence tied at it for all j >= i in its run
    count = _within_run_cumsum(holds.astype(np.float64), run)
    return holds, count, run


def _within_run_cumsum(v: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Cumulative sums along the last axis restarting at each run (``run``: a nondecreasing run
    id per element, so a run is contiguous), each formed from its own run's terms alone: a
    segmented Hillis-Steele scan, ceil(log2 n) passes, in pass d each element adding the partial
    sum d places back where that element is in the same run. The error of an output is at most
    gamma_ceil(log2 n)(u) times the sum of |v| over its own run's prefix. (Not the difference of
    two whole-row cumsums, which loses u times the sum of every earlier run: up to 2.5e-14 off
    on a 317x331 float64 cum_max VJP, blamed on MLX until a GPU run showed the same bits.)"""
    out = np.array(v, np.float64)
    n = out.shape[-1]
    d = 1
    while d < n:
        same = run[..., d:] == run[..., :-d]
        out[..., d:] = out[..., d:] + np.where(same, out[..., :-d], 0.0)  # the right side is read whole first
        d *= 2
    return out


@vjp("cum_max", convention="each running max passes its cotangent to the element holding it; "
     "ties share it equally (as reduce_max)",
     radius=lambda xs, attrs: [_cum_max_radius(xs[0], attrs)])
def cum_max_vjp(inputs, attrs, cots):
    """g_i = sum over the later prefixes j of i's run where x_i is tied at the max of u_j / c_j:
    a suffix sum within the run, for the elements holding the running max."""
    x, u = _along(inputs[0], attrs), _along(cots[0], attrs)
    if attrs["exclusive"]:  # output j is the inclusive max of the prefix j-1
        u = np.concatenate([u[..., 1:], np.zeros(u.shape[:-1] + (1,))], -1)
    if x.shape[-1] == 0:
        return [_back(np.zeros(x.shape), attrs)]
    holds, count, run = _running_max_runs(x)
    w = u / np.maximum(count, 1)
    rev = np.flip(_within_run_cumsum(np.flip(w, -1), np.flip(-run, -1)), -1)  # suffix sums per run
    return [_back(np.where(holds, rev, 0.0), attrs)]


@jvp("cum_max")
def cum_max_jvp(inputs, attrs, tans):
    """out_j = the mean of the tangents of the elements tied at prefix j's max (they all lie in
    j's run)."""
    x, t = _along(inputs[0], attrs), _along(tans[0], attrs)
    if x.shape[-1] == 0:
        return [_back(np.zeros(x.shape), attrs)]
    holds, count, run = _running_max_runs(x)
    out = _within_run_cumsum(np.where(holds, t, 0.0), run) / np.maximum(count, 1)
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


# cum_max selects with tie shares (_grad.selection): a VJP result collects the outputs its element
# is the running max of, a JVP the tied elements of one prefix; both at most the scan length.
BACKEND.magnitude("cum_max")(selection("cum_max", lambda xs, attrs, kind: max(xs[0].shape[attrs["axis"]], 1)
                                       if xs[0].ndim else 1))
