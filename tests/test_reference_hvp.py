"""The reference Hessian-vector products (issue 16, item 6): every ``second_order`` op's HVP rule in
backends/cpu/*.py (``BACKEND.hvp``: d/de VJP(x + e v, u), float64) and its magnitude
(``BACKEND.hvp_magnitude``, the scale of the derivative judge's bound) are verified here,
independently of their author, over the float64 HVP cases of the matrix (generate(...,
grads=("hvp",))), sampled as tests/test_reference_derivatives.py samples the forward's.

(a) Finite differences of the reference VJP rule along the tangent: for a weight w per input,
    <w, VJP(x + t v, u)> is differentiated at t = 0 by central differences at t = H0 / 2^j with
    Richardson extrapolation (test_reference_derivatives._ridders, its error estimate) and must
    match <w, HVP(u; v)>. The tolerance is twice the tableau's error estimate plus the VJP rule's
    rounding noise over the smallest step (16 eps times |J|ᵀ|u| + |VJP|, from Backend.run_magnitude
    less SAVED_TERMS where available, else |VJP| times the elements) plus 16 eps <|w|, |HVP|>;
    a check whose tolerance exceeds RESOLVED of the product is unresolved, never passed. The FD
    direction is the case's tangent scaled to each element (capped at the input's median
    deviation from its median) and kept inside a quarter of the rule's smoothness radius (DerivativeRule.radius:
    elu, softsign and hard_swish have f'' jumps at their kinks), rounded so every stencil point is
    exact.
(b) Symmetry of the Hessian: <HVP(u; v), w> = <v, HVP(u; w)> within 4 n kappa eps times
    <M(u; v), |w|> + <|v|, M(u; w)> (M the declared HVP magnitudes, which bound the rounding of
    each HVP entry's terms; n the elements of inputs and outputs; kappa the rule's condition).
(c) Elementwise: f''(x) from the HVP rule (u = v = 1) against a second central difference of the
    precise oracle's definition of the op (judge/precise.py ELEMENTWISE) at MP_PREC bits with step
    2^-64 max(|x|, 1) (its error ~2^-128 relative), within 64 eps times the rule's own magnitude
    (|f''| plus the absolute terms of the formula, i.e. its float64 rounding).
(d) Deliberately wrong rules (a missing factor, a missing term) fail (a) (and (b) where the wrong
    Hessian is not symmetric).
(e) The magnitude bounds the HVP and is not vacuous: on the sampled cases with at most DENSE
    differentiable elements, the dense Hessian column by column (HVP with unit tangents) gives
    |H| |v|; the magnitude must be >= |HVP| and >= |H| |v| elementwise; its sum is typically a
    small multiple of that of |H| |v| (median <= 10), and on at least 75% of the cases float32's
    bound from it rejects a 1% error (the rest: points where MLX's formulas cancel, where the
    absolute terms and the saved values' rounding are the honest error scale; counted, printed).

Exclusions are counted (non-finite VJP/HVP entries, elements at a kink); a case with no direction
left is "no direction", never a pass.
"""
from __future__ import annotations

import functools
import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import gmpy2
import numpy as np
import pytest
from gmpy2 import mpfr
from test_reference_derivatives import (
    EPS,
    H0,
    LEVELS,
    MP_PREC,
    RESOLVED,
    _dot,
    _mp_eval,
    _ridders,
    sample,
)

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import DerivativeRule, differentiable_arrays
from rlx_conformance.backends.cpu._grad import SAVED_TERMS
from rlx_conformance.core.errors import RlxError, UnsupportedError
from rlx_conformance.generate.matrix import (
    Case,
    Target,
    generate,
    make_inputs,
    make_seeds,
)
from rlx_conformance.judge import precise
from rlx_conformance.judge.bounds.derivative import derivative_bound
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.report.op_facts import builtin_ops
from rlx_conformance.spec import values

CPU = get_backend("cpu")
HVP_OPS = sorted(s.name for s in builtin_ops(all_ops()) if s.second_order)
DENSE = 96  # cases with at most this many differentiable elements get the dense Hessian
VACUITY = 100.0
MP_STEP2 = 2 ** -64
MP_POINTS = 40


def test_second_order_ops_have_both_rules() -> None:
    """Every second_order op has an HVP rule and its magnitude; no other op has either."""
    assert HVP_OPS
    for op, rule in CPU.derivatives.items():
        declared = get_op(op).second_order
        assert (rule.hvp is not None) == declared, op
        assert (rule.hvp_magnitude is not None) == declared, op
    for op in HVP_OPS:
        assert get_op(op).derivative_kinds() == ("vjp", "jvp", "hvp")


@dataclass
class HVerdict:
    """One point's checks (a) and (b) and what was excluded."""

    where: str
    fd: str = ""  # pass | fail | unresolved | no direction | left domain
    fd_value: float = math.nan
    hvp_value: float = math.nan
    fd_tol: float = math.nan
    sym: str = ""  # pass | fail | no direction
    sym_diff: float = math.nan
    sym_tol: float = math.nan
    counts: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        return (f"{self.where}: fd {self.fd} (fd {self.fd_value:.17g}, hvp {self.hvp_value:.17g}, "
                f"tol {self.fd_tol:.3g}); symmetry {self.sym} (|diff| {self.sym_diff:.3g}, tol "
                f"{self.sym_tol:.3g}); {dict(self.counts)}")


def _f64(xs) -> list[np.ndarray | None]:
    return [None if x is None else np.asarray(x, np.float64) for x in xs]


def _fd_direction(x: np.ndarray, v: np.ndarray, r: np.ndarray | None, counts: Counter) -> np.ndarray:
    """The tangent scaled to each element (badly scaled inputs), no larger than the input's median
    deviation from its median (the spread class: large values of small variance, where a step
    relative to |x| would leave the region a norm is smooth in; max(median |x|, 1) where all
    values are equal), inside a quarter of the smoothness
    radius, rounded so x + t v is exact."""
    m = float(np.median(np.abs(x - np.median(x)))) if x.size else 0.0
    m = m if m > 0 else max(float(np.median(np.abs(x))) if x.size else 1.0, 1.0)  # one value
    d = v * np.where(x != 0, np.minimum(np.abs(x), m), m)
    if r is not None:
        counts["input elements at a kink"] += int((r <= 0).sum())
        d = np.sign(d) * np.minimum(np.abs(d), np.where(r > 0, r, 0.0) / (4 * H0))
    q = 2 * np.spacing(np.abs(x)) * 2.0 ** (LEVELS - 1) / H0
    return np.where(np.isfinite(q), np.round(d / q) * q, 0.0)


def _vjp_noise(op, xs, attrs, us, g) -> list[np.ndarray | None]:
    """The float64 VJP rule's scale per input: |J|ᵀ|u| + |VJP|, |J|ᵀ|u| being the declared (or
    dense) magnitude less its part for the rounding of a backend's saved forward values
    (SAVED_TERMS: float32 MLX's, not this rule's); where neither is available, |VJP| times the
    number of elements (a conservative stand-in: such cases tend to count as unresolved)."""
    try:
        mags, _ = CPU.run_magnitude(op, "vjp", xs, attrs, us)
    except UnsupportedError:
        n = sum(x.size for x in xs)
        return [None if r is None else n * np.abs(r) for r in g]
    saved = SAVED_TERMS.get(op)
    extra = saved(xs, attrs, "vjp", us) if saved is not None else [None] * len(mags)
    return [None if m is None else np.maximum(np.asarray(m) - (0.0 if e is None else e), 0.0) + np.abs(r)
            for m, e, r in zip(mags, extra, g)]


def check_hvp(op: str, inputs, attrs: dict[str, Any], cots, tans, key: str) -> HVerdict:
    """(a) and (b) at one point (module docstring)."""
    verdict = HVerdict(key)
    counts = verdict.counts
    xs = [np.asarray(x, np.float64) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.asarray(x)
          for x in inputs]
    us, vs = _f64(cots), _f64(tans)
    diff = differentiable_arrays(get_op(op), len(xs))
    g0 = CPU.run_vjp(op, xs, attrs, us)
    h = CPU.run_hvp(op, xs, attrs, us, vs)
    w_stream = values.Stream(key + "#w")
    ws = [w_stream.uniform(x.size, -1, 1).reshape(x.shape) if d else None for x, d in zip(xs, diff)]
    # entries whose VJP or HVP is not finite carry no weight
    for k, (g, hk, w) in enumerate(zip(g0, h, ws)):
        if w is not None:
            bad = ~np.isfinite(g) | ~np.isfinite(hk)
            counts["non-finite VJP or HVP entries"] += int(bad.sum())
            ws[k] = np.where(bad, 0.0, w)
    # (b) symmetry with the case's own tangent v and the weight w as the second tangent
    hw = CPU.run_hvp(op, xs, attrs, us, ws)
    m_v, _ = CPU.run_magnitude(op, "hvp", xs, attrs, us + vs)
    m_w, _ = CPU.run_magnitude(op, "hvp", xs, attrs, us + ws)
    keep = [None if w is None else (w != 0) & np.isfinite(hk) & np.isfinite(v)
            for w, hk, v in zip(ws, hw, vs)]
    parts_a = [_dot(hk, w, kp) for hk, w, kp in zip(h, ws, keep) if w is not None]
    parts_b = [_dot(v, hk, kp) for v, hk, kp in zip(vs, hw, keep) if v is not None]
    a = math.fsum(p[0] for p in parts_a)
    b = math.fsum(p[0] for p in parts_b)
    scale = math.fsum(_dot(m, np.abs(w), kp)[0] for m, w, kp in zip(m_v, ws, keep) if w is not None) + \
        math.fsum(_dot(np.abs(v), m, kp)[0] for v, m, kp in zip(vs, m_w, keep) if v is not None)
    if not any(kp is not None and kp.any() for kp in keep):
        verdict.fd = verdict.sym = "no direction"
        return verdict
    n = sum(x.size for x in xs) + sum(np.size(u) for u in us if u is not None)
    kappa = CPU.rule_condition(op, xs, attrs)
    verdict.sym_diff, verdict.sym_tol = abs(a - b), 4 * n * kappa * EPS * scale + 1e-300
    verdict.sym = "pass" if verdict.sym_diff <= verdict.sym_tol else "fail"

    # (a) finite differences of the VJP rule along a scaled, radius-bounded, exact direction
    radii = CPU.smooth_radius(op, xs, attrs)
    ds = [None if v is None else _fd_direction(x, v, r, counts) for x, v, r in zip(xs, vs, radii)]
    hd = CPU.run_hvp(op, xs, attrs, us, ds)
    ws = [None if w is None else np.where(np.isfinite(hk), w, 0.0) for w, hk in zip(ws, hd)]
    if not any(d is not None and d.any() for d in ds):
        verdict.fd = "no direction"
        return verdict
    target = math.fsum(_dot(hk, w, w != 0)[0] for hk, w in zip(hd, ws) if w is not None)
    target_abs = math.fsum(_dot(hk, w, w != 0)[1] for hk, w in zip(hd, ws) if w is not None)

    def at(t: float) -> list[np.ndarray | None]:
        moved = [x if d is None else np.where(d != 0, x + t * d, x) for x, d in zip(xs, ds)]
        out = CPU.run_vjp(op, moved, attrs, us)
        for g, w in zip(out, ws):
            if w is not None and not np.all(np.isfinite(g[w != 0])):
                raise FloatingPointError("a non-finite VJP inside the stencil")
        return out

    def central(step: float) -> float:
        up, down = at(step), at(-step)
        return math.fsum(_dot(gp - gm, w, w != 0)[0] for gp, gm, w in zip(up, down, ws)
                         if w is not None) / (2 * step)

    verdict.hvp_value = target
    try:
        fd, err = _ridders(central, H0, LEVELS)
    except (FloatingPointError, RlxError, ValueError) as e:
        verdict.fd = "left domain"
        counts[f"stencil left the domain ({type(e).__name__})"] += 1
        return verdict
    h_min = H0 / 2 ** (LEVELS - 1)
    scales = _vjp_noise(op, xs, attrs, us, g0)
    noise = math.fsum(_dot(s, np.abs(w), w != 0)[0] for s, w in zip(scales, ws) if w is not None)
    verdict.fd_value = fd
    verdict.fd_tol = 2 * err + 4 * 16 * EPS * noise / h_min + 16 * EPS * target_abs
    size = max(target_abs, abs(fd))
    if not math.isfinite(verdict.fd_tol) or (size > 0 and verdict.fd_tol > RESOLVED * size):
        verdict.fd = "unresolved"
    else:
        verdict.fd = "pass" if abs(fd - target) <= verdict.fd_tol else "fail"
    return verdict


# -- the sample --------------------------------------------------------------------------------
@functools.cache
def _cases() -> dict[str, list[Case]]:
    by_op: dict[str, list[Case]] = defaultdict(list)
    for c in generate([Target("cpu", "cpu", "eager")], ops=HVP_OPS, dtypes=["float64"], grads=("hvp",)):
        by_op[c.op].append(c)
    return {op: sample(cs) for op, cs in by_op.items()}


def _point(c: Case) -> tuple[list[np.ndarray], Any]:
    inputs = make_inputs(c)
    return inputs, make_seeds(c, inputs)


@functools.cache
def verdicts(op: str) -> tuple[HVerdict, ...]:
    out = []
    for c in _cases()[op]:
        inputs, seeds = _point(c)
        out.append(check_hvp(op, inputs, c.attr_dict, seeds.cotangents, seeds.tangents, c.input_id))
    return tuple(out)


@pytest.mark.parametrize("op", HVP_OPS)
def test_hvp_matches_finite_differences_and_is_symmetric(op: str) -> None:
    vs = verdicts(op)
    assert vs, f"{op}: no float64 HVP case"
    bad = [str(v) for v in vs if v.fd == "fail" or v.sym == "fail"]
    assert not bad, f"{op}:\n" + "\n".join(bad)
    assert any(v.fd == "pass" for v in vs), f"{op}: none resolved:\n" + "\n".join(map(str, vs))
    assert any(v.sym == "pass" for v in vs)


def test_hvp_checks_are_mostly_resolved() -> None:
    status, counts = Counter(), Counter()
    for op in HVP_OPS:
        for v in verdicts(op):
            status[v.fd] += 1
            counts.update(v.counts)
    print(f"\nreference HVPs: {len(HVP_OPS)} ops, {sum(status.values())} cases; finite differences "
          f"{dict(status)}; exclusions {dict(counts)}")
    assert status["fail"] == 0
    assert status["pass"] >= 0.75 * sum(status.values()), dict(status)


# -- (c) f'' against MPFR ----------------------------------------------------------------------
ELEMENTWISE = [op for op in HVP_OPS if op in precise.ELEMENTWISE and len(get_op(op).inputs) == 1]


def mp_second(op: str, x: float) -> float:
    """f''(x) from the oracle's definition at MP_PREC bits: (f(x+h) - 2 f(x) + f(x-h)) / h^2 with
    h = MP_STEP2 max(|x|, 1)."""
    with gmpy2.context(gmpy2.get_context(), precision=MP_PREC):
        a = mpfr(float(x))
        hh = mpfr(MP_STEP2) * max(abs(a), mpfr(1))
        return float((_mp_eval(op, [a + hh], {}) - 2 * _mp_eval(op, [a], {}) + _mp_eval(op, [a - hh], {}))
                     / (hh * hh))


def _points(op: str) -> list[float]:
    """Finite points of the op's sampled HVP cases at least 2^-40 (|x| + 1) from a kink or pole."""
    out: list[float] = []
    for c in _cases()[op]:
        (x,) = make_inputs(c)
        x = np.asarray(x, np.float64).ravel()
        (r,) = CPU.smooth_radius(op, [x], {})
        ok = np.isfinite(x) & np.isfinite(CPU.run(op, [x], {})[0])
        if r is not None:
            ok &= r > 2.0 ** -40 * (np.abs(x) + 1)
        idx = np.flatnonzero(ok)
        out += [float(x[i]) for i in idx[:: max(1, len(idx) // 8)][:8]]
    return out[:MP_POINTS]


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_second_derivatives_match_mpfr(op: str) -> None:
    points = _points(op)
    assert points, f"{op}: no point away from kinks"
    bad = []
    for x in points:
        one = np.ones(1)
        (rule,) = CPU.run_hvp(op, [np.array([x])], {}, [one], [one])
        (mag,), _ = CPU.run_magnitude(op, "hvp", [np.array([x])], {}, [one, one])
        want = mp_second(op, x)
        tol = 64 * EPS * (abs(want) + float(mag[0]))
        if not abs(float(rule[0]) - want) <= tol:
            bad.append(f"f''({x!r}): rule {float(rule[0])!r}, MPFR {want!r}, tol {tol:.3g}")
    assert not bad, f"{op}:\n" + "\n".join(bad)


# -- (d) deliberately wrong rules are caught --------------------------------------------------------
def _with_hvp(monkeypatch, op: str, hvp) -> None:
    rule = CPU.derivatives[op]
    monkeypatch.setitem(CPU.derivatives, op, DerivativeRule(
        op, rule.vjp, rule.jvp, rule.convention, rule.radius, rule.condition, hvp,
        rule.magnitude, rule.hvp_magnitude, rule.undefined))


def _random(key: str, *shapes) -> list[np.ndarray]:
    s = values.Stream(key)
    return [s.uniform(math.prod(sh), -2, 2).reshape(sh) for sh in shapes]


def test_a_missing_factor_is_caught(monkeypatch) -> None:
    """sigmoid'' without its (1 - 2 s) factor: FD of the VJP rejects it (a diagonal Hessian stays
    symmetric, so (b) cannot)."""
    def wrong(xs, attrs, cots, tans):
        s = 1 / (1 + np.exp(-xs[0]))
        return [cots[0] * tans[0] * s * (1 - s)]

    _with_hvp(monkeypatch, "sigmoid", wrong)
    x, u, v = _random("self#sigmoid", (7, 5), (7, 5), (7, 5))
    verdict = check_hvp("sigmoid", [x], {}, [u], [v], "self#sigmoid")
    assert verdict.fd == "fail", verdict


def test_a_missing_term_is_caught(monkeypatch) -> None:
    """softmax's HVP without the -s <u, ds> term: wrong and not symmetric."""
    def wrong(xs, attrs, cots, tans):
        x, ax = xs[0], attrs["axis"]
        e = np.exp(x - np.max(x, axis=ax, keepdims=True))
        s = e / np.sum(e, axis=ax, keepdims=True)
        ds = s * (tans[0] - np.sum(s * tans[0], axis=ax, keepdims=True))
        return [ds * (cots[0] - np.sum(s * cots[0], axis=ax, keepdims=True))]

    _with_hvp(monkeypatch, "softmax", wrong)
    x, u, v = _random("self#softmax", (4, 6), (4, 6), (4, 6))
    verdict = check_hvp("softmax", [x], {"axis": 1}, [u], [v], "self#softmax")
    assert verdict.fd == "fail" and verdict.sym == "fail", verdict


# -- (e) the magnitude ------------------------------------------------------------------------------
def _dense_abs_hv(op: str, xs, attrs, us, vs) -> list[np.ndarray | None]:
    """|H| |v| per input, from the HVP rule with one unit tangent per differentiable element."""
    out = [None if v is None else np.zeros(x.shape) for x, v in zip(xs, vs)]
    for k, v in enumerate(vs):
        if v is None:
            continue
        for j in range(v.size):
            e = [None if t is None else np.zeros(t.shape) for t in vs]
            e[k].flat[j] = 1.0
            col = CPU.run_hvp(op, xs, attrs, us, e)
            for i, c in enumerate(col):
                if c is not None:
                    out[i] = out[i] + np.abs(c) * abs(v.flat[j])
    return out


@functools.cache
def _magnitude_checks() -> tuple[list[str], list[tuple[str, float, float]]]:
    """(magnitudes below |HVP| or |H||v|, and per case: id, sum M / sum |H||v|, and float32's
    normwise relative bound sum derivative_bound(M) / sum |H||v|)."""
    bad: list[str] = []
    ratios: list[tuple[str, float, float]] = []
    for op in HVP_OPS:
        for c in _cases()[op]:
            inputs, seeds = _point(c)
            xs = [np.asarray(x, np.float64) for x in inputs]
            us, vs = _f64(seeds.cotangents), _f64(seeds.tangents)
            if sum(v.size for v in vs if v is not None) > DENSE:
                continue
            h = CPU.run_hvp(op, xs, c.attr_dict, us, vs)
            mags, terms = CPU.run_magnitude(op, "hvp", xs, c.attr_dict, us + vs)
            dense = _dense_abs_hv(op, xs, c.attr_dict, us, vs)
            tot_m = tot_d = tot_b = 0.0
            for k, (hk, m, d) in enumerate(zip(h, mags, dense)):
                if hk is None:
                    continue
                fin = np.isfinite(hk) & np.isfinite(d)
                if np.any(m[fin] < np.abs(hk[fin]) * (1 - 1e-12)) or np.any(m[fin] < d[fin] * (1 - 1e-9)):
                    bad.append(f"{c.id} input {k}: magnitude below |HVP| or |H||v|")
                tot_m += float(np.sum(m[fin]))
                tot_b += float(np.sum(derivative_bound(op, "float32", m[fin], terms)))
                tot_d += float(np.sum(d[fin]))
            if tot_d > 0:
                ratios.append((c.id, tot_m / tot_d, tot_b / tot_d))
    return bad, ratios


def test_magnitude_bounds_the_hvp() -> None:
    bad, ratios = _magnitude_checks()
    assert ratios, "no case small enough for the dense Hessian"
    assert not bad, "\n".join(bad)


def test_magnitude_is_not_vacuous() -> None:
    """Typically within a small factor of |H||v| (median <= 10), and on at least 75% of the cases
    tight enough that float32's bound rejects a 1% error. The rest are points where the formulas
    MLX differentiates cancel (saturated tanh/sigmoid forms: 1 - t^2 from a rounded t; a nearly
    one-hot softmax in the spread class; norms of large mean and small variance): there the
    rounding of the saved values is the error a correct float32 HVP makes, |H||v| is not."""
    _, ratios = _magnitude_checks()
    worst = sorted(ratios, key=lambda r: -r[1])[:8]
    tight = sum(1 for _, _, b in ratios if b <= 0.01)
    print(f"\nHVP magnitude / |H||v| over {len(ratios)} cases: median "
          f"{float(np.median([r for _, r, _ in ratios])):.3g}; float32 bound <= 1% in {tight}; "
          f"ratio > {VACUITY:g} in {sum(1 for _, r, _ in ratios if r > VACUITY)}; worst:\n  "
          + "\n  ".join(f"{i}: {r:.3g} (float32 bound {b:.3g})" for i, r, b in worst))
    assert float(np.median([r for _, r, _ in ratios])) <= 10
    assert tight >= 0.75 * len(ratios)
