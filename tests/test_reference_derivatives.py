"""The reference derivatives (issue 16, items 1 and 2): every differentiable op's VJP and JVP rule
in backends/cpu/*.py (registered with ``BACKEND.vjp`` / ``BACKEND.jvp``, backends/base.py
DerivativeRule, evaluated in float64) is verified here independently of its author, over the
forward matrix's float64 cases. A rule that fails is a harness bug, not a finding.

(a) Finite differences. For a direction v and a cotangent u, the derivative of
    g(t) = <u, f(x + t v)> at 0 is estimated by central differences at t = H0 / 2^j (j < LEVELS),
    taken output by output, with Richardson extrapolation (Ridders' tableau). The tolerance is
    the tableau's own error estimate (twice the larger of the two differences behind the chosen
    entry) plus the forward's rounding noise over the smallest step (16 eps |f| per output, plus
    the op's declared error bound, Policy.bound, where it has one: sums, norms, determinants),
    so the test's own error is known; a check whose tolerance exceeds RESOLVED of the size of the
    product is counted as unresolved, never as a pass. The estimate must match <Jᵀu, v> from the
    VJP rule. Directions are relative to each element (capped at max(m, 1), m the input's median
    magnitude), kept inside the rule's smoothness radius (a quarter of it), and rounded so that
    every stencil point x + t v is exact.
(b) Adjoint test. <J·v, u> from the JVP rule must equal <v, Jᵀ·u> from the VJP rule to rounding:
    each entry of J·v (of Jᵀu) is a sum of at most n products (n: the elements of the inputs and
    outputs together), so each is within gamma_n of the exact sum of the magnitudes of its
    terms; |J·v|·|u| + |v|·|Jᵀu| stands for those magnitudes, and the factor 4 n (rather than a
    log n of a pairwise sum) covers the cancellation by which it understates them. Rules that
    solve with a matrix, or normalize values whose spread is small against their size, carry
    kappa eps relative error as the forward does: the bound is multiplied by the rule's declared
    condition number (DerivativeRule.condition, 1 for the others). A wrong rule (a factor
    missing, a transpose, a dropped duplicate) is wrong by O(1) of the product, far above this.
(c) The elementwise ops' derivative formulas against MPFR: the JVP of a unary op at x with
    tangent 1 (of a binary or ternary op, one operand's tangent 1 and the others' 0) against a
    central difference of the precise oracle's own definition of the op (judge/precise.py
    ELEMENTWISE) at MP_PREC = 320 bits with a step of 2^-96 max(|x|, 1), whose error (~2^-190
    relative) is far below float64's, at up to MP_POINTS points of the sampled cases.

Sampling (deterministic, ~20-40 s on one core): per differentiable op, its float64 cases with at
least one and at most MAX_ELEMENTS input elements (the smallest PER_OP if none is that small),
chosen greedily to cover every shape family, value class, attribute value and pair of attribute
values of those cases (ties in seed order), PER_OP per op. Cotangents, directions and
replacement values come from values.Stream keyed by the case's input id (``#cot``, ``#dir``,
``#fresh<k>``).

Exclusions, each counted per case (test_exclusions_are_counted_and_bounded prints the totals;
never silent): non-finite elements of a differentiable input (the special class), and elements
above BIG of inputs drawn per element, are replaced by a random value of the input's domain;
elements whose smallest step is below their resolution, elements the rule's radius
(DerivativeRule.radius) puts at a kink, tie or pole, and inputs the rule gives no derivative in
this case (attention's mask unless it is a bias) get no direction; outputs that are non-finite,
undefined by the spec (OpSpec.undefined), left unbounded by the op's error analysis or whose
tangent is not finite get no cotangent, and input elements whose cotangent is then not finite no
direction; a case left with no direction or no cotangent is not a check ("no direction"), nor is
a stencil that leaves the domain (a non-finite output, an error).
Ops without rules yet are listed in EXPECTED_GAPS, which must shrink as rules land.
"""
from __future__ import annotations

import functools
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gmpy2
import numpy as np
import pytest
from gmpy2 import mpfr

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import DerivativeRule, differentiable_arrays
from rlx_conformance.cli.main import main
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.matrix import Case, Target, generate, make_inputs
from rlx_conformance.judge import precise
from rlx_conformance.judge.compare import Bound
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.report.op_facts import builtin_ops
from rlx_conformance.spec import values

CPU = get_backend("cpu")
EPS = float(np.finfo(np.float64).eps)
MAX_ELEMENTS = 4096
PER_OP = 16
H0 = 2.0 ** -4  # largest t-step: directions are O(|x|), so steps of 6% down to 0.05% of x
LEVELS = 8

BIG = 1e30  # larger elements (the special class's extremes) are replaced: their stencils overflow
RESOLVED = 1e-6  # a finite-difference check counts only if its tolerance is below this share of the product

# Differentiable ops without rules yet, and why. The list must shrink as rules land:
# test_gap_list_is_exact fails for an op that has rules and is still listed, and for one
# without rules that is not.
EXPECTED_GAPS: dict[str, str] = {}

# Ops whose rule differentiates the function their forward approximates rather than the
# forward's own arithmetic (DerivativeRule.convention): the finite differences are taken of that
# function, an op of the registry (the attributes it does not declare dropped). cg_solve's output
# is a CG iterate, within its tolerance of x* = A⁻¹ b; its rule is the implicit derivative of x*.
DIFFERENTIATES: dict[str, str] = {"rlx_sparse.cg_solve": "rlx_sparse.lu_solve"}


def _forward(backend, op: str, xs: Sequence[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The function ``op``'s rule differentiates (DIFFERENTIATES), at ``xs``."""
    target = get_op(DIFFERENTIATES.get(op, op))
    return backend.run(target.name, xs, {a.name: attrs[a.name] for a in target.attrs if a.name in attrs})

DIFFERENTIABLE = sorted(s.name for s in builtin_ops(all_ops()) if s.differentiable)
WITH_RULES = [op for op in DIFFERENTIABLE if op not in EXPECTED_GAPS]


# -- registry and rule bookkeeping -------------------------------------------------------------
def _has_rules(op: str) -> bool:
    r = CPU.derivatives.get(op)
    return r is not None and r.vjp is not None and r.jvp is not None


def test_gap_list_is_exact() -> None:
    missing = [op for op in DIFFERENTIABLE if not _has_rules(op) and op not in EXPECTED_GAPS]
    stale = [op for op in EXPECTED_GAPS if op not in DIFFERENTIABLE or _has_rules(op)]
    assert not missing, f"differentiable ops without reference rules, not in EXPECTED_GAPS: {missing}"
    assert not stale, f"EXPECTED_GAPS lists ops that have rules (or are not differentiable): {stale}"


def test_rules_only_for_differentiable_ops() -> None:
    for op, rule in CPU.derivatives.items():
        assert get_op(op).differentiable, op
        assert rule.vjp is not None and rule.jvp is not None, f"{op}: a VJP without a JVP or back"
        if rule.radius is not None:
            assert rule.convention.strip(), f"{op}: non-smooth points (a radius) but no convention"
    with pytest.raises(RlxError, match="not differentiable"):
        CPU.vjp("eq")(lambda inputs, attrs, cots: [None, None])


def test_declarations() -> None:
    """The derived default (floating data inputs) and the explicit declarations, as the issue
    lists them."""
    facts = {op: [get_op(op).input_differentiable(i) for i in get_op(op).inputs]
             for op in ("gather", "where", "dequantize", "scatter_add", "one_hot", "onnx.ScatterND")}
    assert facts == {"gather": [True, False], "where": [False, True, True],
                     "dequantize": [False, True, False], "scatter_add": [True, False],
                     "one_hot": [False, True], "onnx.ScatterND": [True, False, True]}
    for op in ("eq", "lt", "arg_max", "arg_sort", "rng_uniform", "rng_normal", "quantize",
               "fake_quantize", "round", "non_zero", "bit_and", "shl", "cast"):
        assert not get_op(op).differentiable and get_op(op).not_differentiable_reason(), op
    assert get_op("top_k").differentiable and get_op("sort").differentiable


def test_ops_json_shows_differentiability(capsys) -> None:
    assert main(["ops", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gather"]["differentiable"] is True and rows["gather"]["not_differentiable"] is None
    assert [i["differentiable"] for i in rows["gather"]["inputs"]] == [True, False]
    assert rows["arg_max"]["differentiable"] is False
    assert "index" in rows["arg_max"]["not_differentiable"]


# -- the checks ----------------------------------------------------------------------------------
@dataclass
class Verdict:
    """One point's checks and what was excluded from them."""

    where: str
    fd: str = ""  # pass | fail | unresolved | left domain | no direction
    fd_value: float = math.nan
    vjp_value: float = math.nan
    fd_tol: float = math.nan
    adjoint: str = ""  # pass | fail | no direction
    adj_diff: float = math.nan
    adj_tol: float = math.nan
    counts: Counter = field(default_factory=Counter)

    def __str__(self) -> str:
        return (f"{self.where}: fd {self.fd} (fd {self.fd_value:.17g}, vjp {self.vjp_value:.17g}, "
                f"tol {self.fd_tol:.3g}); adjoint {self.adjoint} (|diff| {self.adj_diff:.3g}, "
                f"tol {self.adj_tol:.3g}); {dict(self.counts)}")


def _dot(a: np.ndarray, b: np.ndarray, keep: np.ndarray) -> tuple[float, float]:
    """(sum a b, sum |a| |b|) over ``keep``, each correctly rounded (fsum; inf where it
    overflows)."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = (a * b)[keep]
    try:
        return math.fsum(p.ravel().tolist()), math.fsum(np.abs(p).ravel().tolist())
    except OverflowError:
        return math.inf, math.inf


def _differentiable(op: str, n: int) -> list[bool]:
    return differentiable_arrays(get_op(op), n)


def _ridders(central, h0: float, levels: int) -> tuple[float, float]:
    """Central differences ``central(h)`` at h = h0 / 2^j with Richardson extrapolation (Ridders'
    tableau): (estimate, error estimate)."""
    table: list[list[float]] = []
    best, err = math.nan, math.inf
    for j in range(levels):
        row = [central(h0 / 2 ** j)]
        for k in range(1, j + 1):
            row.append(row[k - 1] + (row[k - 1] - table[j - 1][k - 1]) / (4 ** k - 1))
            e = max(abs(row[k] - row[k - 1]), abs(row[k] - table[j - 1][k - 1]))
            if e <= err:
                best, err = row[k], e
        table.append(row)
    return best, err


def check_point(op: str, inputs: Sequence[np.ndarray], attrs: dict[str, Any], key: str,
                backend=CPU) -> Verdict:
    """(a) and (b) at one point (module docstring), every exclusion counted."""
    spec = get_op(op)
    verdict = Verdict(key)
    counts = verdict.counts
    diff = _differentiable(op, len(inputs))
    xs = [np.asarray(x).copy() for x in inputs]
    for k, x in enumerate(xs):
        if diff[k] and x.size:
            # huge values only where the input is drawn per element (a generate hook's structure,
            # e.g. det's rows scaled by 2^+-600, is the point of its case)
            bad = ~np.isfinite(x) | ((np.abs(x) > BIG) if spec.generate is None else False)
            if bad.any():
                inp = spec.inputs[min(k, len(spec.inputs) - 1)]
                fresh = values.make_array(values.Stream(f"{key}#fresh{k}"), x.shape, "float64",
                                          inp.domain, "random", attrs)
                xs[k] = np.where(bad, fresh, x)
                counts["replaced input elements"] += int(bad.sum())
    ys = _forward(backend, op, xs, attrs)
    floating = [dt.is_float(dt.name_of(y.dtype)) for y in ys]
    cot_stream = values.Stream(key + "#cot")
    us = [cot_stream.uniform(y.size, -1, 1).reshape(y.shape) if f else None for y, f in zip(ys, floating)]
    out_mask = [~np.isfinite(y) if f else None for y, f in zip(ys, floating)]
    undefined = spec.undefined(xs, attrs)
    if undefined is not None:
        out_mask[0] = out_mask[0] | np.broadcast_to(undefined, ys[0].shape)
    counts["outputs non-finite or undefined"] += sum(int(m.sum()) for m in out_mask if m is not None)
    # The forward's own error where the op declares an error bound (Policy.bound: sums, norms,
    # solves, determinants err by far more than eps |f|); outputs it leaves unbounded (their
    # value depends on the order of evaluation) are excluded like undefined ones.
    bound = None
    if spec.policy.bound is not None and len(ys) == 1:
        with np.errstate(all="ignore"):
            bound = np.broadcast_to(np.asarray(Bound.of(spec.policy.bound(xs, attrs, "float64")),
                                               np.float64), ys[0].shape)
        unbounded = ~np.isfinite(bound) & ~out_mask[0]
        counts["outputs the error analysis leaves unbounded"] += int(unbounded.sum())
        out_mask[0] = out_mask[0] | unbounded
    radii = backend.smooth_radius(op, xs, attrs)
    dir_stream = values.Stream(key + "#dir")
    vs: list[np.ndarray | None] = []
    for x, d, r in zip(xs, diff, radii):
        if not d:
            vs.append(None)
            continue
        # Relative to each element (badly scaled inputs: the balanced and scaled classes), no
        # larger than max(m, 1) for m the input's median magnitude (the special class's outliers),
        # m for an exact zero
        m = max(float(np.median(np.abs(x))) if x.size else 1.0, 2.0 ** -20)
        scale = np.where(x != 0, np.minimum(np.abs(x), max(m, 1.0)), m)
        v = dir_stream.uniform(x.size, -1, 1).reshape(x.shape) * scale
        if r is not None:
            counts["input elements at a kink, tie or pole"] += int((r <= 0).sum())
            v = np.sign(v) * np.minimum(np.abs(v), np.where(r > 0, r, 0.0) / (4 * H0))
        # Every stencil point x + t v exact: t v a multiple of 2 ulp(x) at the smallest t.
        q = 2 * np.spacing(np.abs(x)) * 2.0 ** (LEVELS - 1) / H0
        with np.errstate(over="ignore", invalid="ignore"):  # q = inf next to the largest float
            quantized = np.where(np.abs(v) > q * 2.0 ** 60, v, np.round(v / q) * q)
        quantized = np.where(np.isfinite(q), quantized, 0.0)

        counts["input elements whose step is below their resolution"] += int(((quantized == 0) & (v != 0)).sum())
        vs.append(quantized)
    # Outputs whose tangent is not finite lose their cotangent, then inputs whose cotangent is not
    # finite lose their direction (each can cause the other: iterate to a fixed point).
    for _ in range(4):
        u_eff = [None if u is None else np.where(m, 0.0, u) for u, m in zip(us, out_mask)]
        gs = backend.run_vjp(op, xs, attrs, u_eff)
        for k, (g, v) in enumerate(zip(gs, vs)):
            if g is None and v is not None and v.any():  # no derivative in this case (a selector)
                counts["input elements without a derivative here"] += v.size
                vs[k] = np.zeros_like(v)
        jv = backend.run_jvp(op, xs, attrs, vs)
        changed = False

        for k, (g, v) in enumerate(zip(gs, vs)):
            if v is not None and g is not None:
                bad = ~np.isfinite(g) & (v != 0)
                if bad.any():
                    vs[k] = np.where(bad, 0.0, v)
                    counts["input elements with a non-finite cotangent"] += int(bad.sum())
                    changed = True
        for k, t in enumerate(jv):
            if t is not None:
                bad = ~np.isfinite(t) & ~out_mask[k]
                if bad.any():
                    out_mask[k] = out_mask[k] | bad
                    counts["outputs with a non-finite tangent"] += int(bad.sum())
                    changed = True
        if not changed:
            break
    else:
        raise AssertionError(f"{key}: the exclusions did not settle")
    keep_out = [None if m is None else ~m for m in out_mask]
    a = b = a_abs = b_abs = 0.0
    parts = [_dot(t, u, k) for t, u, k in zip(jv, u_eff, keep_out) if t is not None]
    a, a_abs = math.fsum(p[0] for p in parts), math.fsum(p[1] for p in parts)
    parts = [_dot(g, v, v != 0) for g, v in zip(gs, vs) if v is not None and g is not None]
    b, b_abs = math.fsum(p[0] for p in parts), math.fsum(p[1] for p in parts)
    if not any(v is not None and np.any(v != 0) for v in vs) or \
            not any(u is not None and np.any(u != 0) for u in u_eff):
        verdict.fd = verdict.adjoint = "no direction"
        return verdict
    n = sum(x.size for x in xs) + sum(y.size for y in ys)
    kappa = backend.rule_condition(op, xs, attrs)
    verdict.adj_diff = abs(a - b)
    verdict.adj_tol = 4 * n * kappa * EPS * (a_abs + b_abs) + 1e-300
    verdict.adjoint = "pass" if verdict.adj_diff <= verdict.adj_tol else "fail"

    y0 = [None if u is None else y[k] for y, u, k in zip(ys, u_eff, keep_out)]
    changed = [None if y is None else np.zeros(y.shape, bool) for y in y0]

    def at(t: float) -> list[np.ndarray | None]:
        # where v is 0, x itself: -0.0 + 0.0 would flip the sign of a zero (atan2's branch cut)
        moved = [x if v is None else np.where(v != 0, x + t * v, x) for x, v in zip(xs, vs)]
        out = []
        for y, y_0, kp, ch in zip(_forward(backend, op, moved, attrs), y0, keep_out, changed):
            if y_0 is None:
                out.append(None)
                continue
            y = y[kp]
            if not np.all(np.isfinite(y)):
                raise FloatingPointError("a non-finite output inside the stencil")
            ch |= y != y_0
            out.append(y)
        return out

    def central(h: float) -> float:
        """sum_i u_i (y_i(h) - y_i(-h)) / 2h, the differences taken per output (an output that
        does not move contributes exactly 0, however large it is)."""
        parts = [_dot(u[k], yp - ym, np.ones(yp.shape, bool))[0]
                 for u, k, yp, ym in zip(u_eff, keep_out, at(h), at(-h)) if yp is not None]
        return math.fsum(parts) / (2 * h)

    verdict.vjp_value = b
    try:
        fd, err = _ridders(central, H0, LEVELS)
    except (FloatingPointError, RlxError, np.linalg.LinAlgError, ValueError) as e:
        verdict.fd = "left domain"
        counts[f"stencil left the domain ({type(e).__name__})"] += 1
        return verdict
    # The forward's own error per output: 16 eps |y|, plus its error bound where it declares one,
    # divided by the smallest step. An output that never moved contributes at most what the JVP
    # says it should have moved (if less: the rule's claim is then checked at that size).
    h_min = H0 / 2 ** (LEVELS - 1)
    noise = 0.0
    for k, (u, y_0, ch, t) in enumerate(zip(u_eff, y0, changed, jv)):
        if y_0 is None:
            continue
        w = np.abs(u[keep_out[k]]) * (16 * EPS * np.abs(y_0) + (2 * bound[keep_out[k]] if bound is not None else 0.0))
        w = np.where(ch, w, np.minimum(w, np.abs(u[keep_out[k]] * t[keep_out[k]]) * h_min))
        noise += 4 * math.fsum(w.tolist()) / h_min
    verdict.fd_value = fd
    verdict.fd_tol = 2 * err + noise + 16 * EPS * b_abs
    size = max(b_abs, abs(fd))
    if not math.isfinite(verdict.fd_tol) or (size > 0 and verdict.fd_tol > RESOLVED * size):
        verdict.fd = "unresolved"
    elif abs(fd - b) <= verdict.fd_tol:
        verdict.fd = "pass"
    else:
        verdict.fd = "fail"
    return verdict


# -- the sample --------------------------------------------------------------------------------
def _features(c: Case) -> set[tuple]:
    """What a case covers: its shape family, value class, attribute values and pairs of them
    (the branches of a rule often depend on two attributes together: fft's inverse and norm)."""
    attrs = [(k, repr(v)) for k, v in c.attrs]
    return ({("family", c.family), ("vals", c.vals)} | {("attr",) + a for a in attrs}
            | {("pair",) + a + b for i, a in enumerate(attrs) for b in attrs[i + 1:]})


def sample(cases: Sequence[Case]) -> list[Case]:
    """Greedy cover of the cases' shape families, attribute values and value classes (module
    docstring), in seed order."""
    cases = [c for c in cases if c.size()]  # an empty case has no direction to differentiate in
    pool = [c for c in cases if c.size() <= MAX_ELEMENTS] or sorted(cases, key=Case.size)[:PER_OP]
    pool = sorted(pool, key=lambda c: c.seed)
    chosen: list[Case] = []
    covered: set[tuple] = set()
    while pool and len(chosen) < PER_OP:
        best = max(pool, key=lambda c: len(_features(c) - covered))  # the first of equals: seed order
        chosen.append(best)
        covered |= _features(best)
        pool.remove(best)
    return chosen


@functools.cache
def _float64_cases() -> tuple[Case, ...]:
    return tuple(generate([Target("cpu", "cpu", "eager")], ops=WITH_RULES, dtypes=["float64"]))


@functools.cache
def _matrix() -> dict[str, list[Case]]:
    by_op: dict[str, list[Case]] = defaultdict(list)
    for c in _float64_cases():
        by_op[c.op].append(c)
    return {op: sample(cs) for op, cs in by_op.items()}


@functools.cache
def verdicts(op: str) -> tuple[Verdict, ...]:
    return tuple(check_point(op, make_inputs(c), c.attr_dict, c.input_id) for c in _matrix()[op])


@pytest.mark.parametrize("op", WITH_RULES)
def test_rules_match_finite_differences_and_each_other(op: str) -> None:
    vs = verdicts(op)
    assert vs, f"{op}: no float64 case to check"
    bad = [str(v) for v in vs if v.fd == "fail" or v.adjoint == "fail"]
    assert not bad, f"{op}:\n" + "\n".join(bad)
    assert any(v.fd == "pass" for v in vs), f"{op}: no case resolved by finite differences:\n" + \
        "\n".join(map(str, vs))
    assert any(v.adjoint == "pass" for v in vs)


def test_exclusions_are_counted_and_bounded() -> None:
    """Every exclusion is counted; the share of cases the finite differences could not check
    stays small (the checks are not vacuous)."""
    status = Counter()
    counts = Counter()
    per_op = {}
    for op in WITH_RULES:
        vs = verdicts(op)
        per_op[op] = Counter(v.fd for v in vs)
        status.update(v.fd for v in vs)
        for v in vs:
            counts.update(v.counts)
    print(f"\nreference derivatives: {len(WITH_RULES)} ops, {sum(status.values())} cases; "
          f"finite differences {dict(status)}; exclusions {dict(counts)}")
    for op, c in per_op.items():
        if c["pass"] < sum(c.values()):
            print(f"  {op}: {dict(c)}")
    assert status["fail"] == 0
    assert status["pass"] >= 0.75 * sum(status.values()), dict(status)


# -- (c) elementwise formulas against MPFR -------------------------------------------------------
MP_PREC = 320
MP_STEP = 2 ** -96
MP_POINTS = 40
ELEMENTWISE = [op for op in WITH_RULES if op in precise.ELEMENTWISE]


def _mp_eval(op: str, args: list, attrs: dict) -> Any:
    _, fn = precise.ELEMENTWISE[op]
    return fn(args, attrs)


def mp_partial(op: str, point: Sequence[float], k: int, attrs: dict) -> tuple[float, float]:
    """(d f / d x_k, |f|) at ``point`` from the oracle's definition at MP_PREC bits, with the step
    MP_STEP max(|x_k|, 1): the points lie at least 2^-40 (|x_k| + 1) from any kink or pole, and
    an absolute step for small x_k keeps f(x +- h) - f(x) far above MP_PREC's resolution."""
    with gmpy2.context(gmpy2.get_context(), precision=MP_PREC):
        args = [mpfr(float(p)) for p in point]
        h = mpfr(MP_STEP) * max(abs(args[k]), mpfr(1))

        up, down = list(args), list(args)
        up[k] += h
        down[k] -= h
        d = (_mp_eval(op, up, attrs) - _mp_eval(op, down, attrs)) / (2 * h)
        return float(d), float(abs(_mp_eval(op, args, attrs)))


def _elementwise_points(op: str) -> list[tuple[tuple[float, ...], dict]]:
    """Points of the op's sampled cases in its domain (finite operands and result), away from
    kinks and poles (radius), each operand broadcast."""
    out = []
    for c in _matrix()[op]:
        xs = make_inputs(c)
        attrs = c.attr_dict
        diff = _differentiable(op, len(xs))
        radii = CPU.smooth_radius(op, xs, attrs)
        arrays = np.broadcast_arrays(*xs)
        ok = np.isfinite(CPU.run(op, xs, attrs)[0])

        for x, d, r, full in zip(xs, diff, radii, arrays):
            if d:
                ok &= np.isfinite(full) & (np.abs(full) < BIG)
                if r is not None:
                    ok &= np.broadcast_to(r, ok.shape) > 2.0 ** -40 * (np.abs(full) + 1)
        idx = np.flatnonzero(ok.ravel())
        for i in idx[:: max(1, len(idx) // 8)][:8]:
            out.append((tuple(float(a.ravel()[i]) for a in arrays), attrs))
    return out[:MP_POINTS]


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_elementwise_derivatives_match_mpfr(op: str) -> None:
    """(c): f'(x) from the JVP rule within 64 ulp of MPFR's, plus 8 eps |f(x)| / max(1, |x|) for the
    cancellation of x g(x) forms (gelu, silu, mish: f' = g + x g', terms of size |f / x|)."""
    points = _elementwise_points(op)
    assert points, f"{op}: no finite point away from kinks"
    diff = _differentiable(op, len(points[0][0]))
    bad = []
    for point, attrs in points:
        xs = [np.array(p) for p in point]
        for k in (k for k, d in enumerate(diff) if d):
            tans = [np.ones(()) if j == k else (np.zeros(()) if diff[j] else None) for j in range(len(xs))]
            (rule,) = CPU.run_jvp(op, xs, attrs, tans)
            want, f = mp_partial(op, point, k, attrs)
            tol = 64 * EPS * abs(want) + 8 * EPS * f / max(1.0, abs(point[k]))
            if not (abs(float(rule) - want) <= tol or (math.isinf(want) and float(rule) == want)):
                bad.append(f"d/dx{k} at {point}: rule {float(rule)!r}, MPFR {want!r}, tol {tol:.3g}")
    assert not bad, f"{op}:\n" + "\n".join(bad)


# -- self-tests: deliberately wrong rules are caught -----------------------------------------------
def _with_rule(monkeypatch, op: str, **changes) -> None:
    rule = CPU.derivatives[op]
    monkeypatch.setitem(CPU.derivatives, op, DerivativeRule(
        op, changes.get("vjp", rule.vjp), changes.get("jvp", rule.jvp), rule.convention, rule.radius))


def _inputs(op: str, shapes, key: str, ints=None):
    s = values.Stream(key)
    xs = [s.uniform(math.prod(sh), -2, 2).reshape(sh) for sh in shapes]
    return xs + list(ints or [])


def test_a_missing_factor_is_caught(monkeypatch) -> None:
    _with_rule(monkeypatch, "sigmoid", vjp=lambda xs, attrs, cots: [cots[0] * (1 / (1 + np.exp(-xs[0])))])
    v = check_point("sigmoid", _inputs("sigmoid", [(7, 5)], "self#sigmoid"), {}, "self#sigmoid")
    assert v.fd == "fail" and v.adjoint == "fail", v


def test_a_transposed_matmul_vjp_is_caught(monkeypatch) -> None:
    _with_rule(monkeypatch, "mat_mul", vjp=lambda xs, attrs, cots: [cots[0] @ xs[1], xs[0].T @ cots[0]])
    v = check_point("mat_mul", _inputs("mat_mul", [(6, 6), (6, 6)], "self#mm"), {}, "self#mm")
    assert v.fd == "fail" and v.adjoint == "fail", v


def test_a_gather_vjp_that_drops_duplicates_is_caught(monkeypatch) -> None:
    def dropping(xs, attrs, cots):
        x, idx = xs
        g = np.zeros_like(x)
        g[np.where(idx < 0, idx + x.shape[0], idx)] = cots[0]  # assignment: the last duplicate wins
        return [g, None]

    _with_rule(monkeypatch, "gather", vjp=dropping)
    idx = np.array([0, 3, 3, 1, 3, -1, 0], np.int64)
    v = check_point("gather", _inputs("gather", [(5, 4)], "self#gather", [idx]), {"axis": 0}, "self#gather")
    assert v.fd == "fail" and v.adjoint == "fail", v


def test_readme_figures_are_current() -> None:
    """The README's "Reference derivatives" figures, recomputed (a change that moves one fails
    here until the text says the new number)."""
    readme = re.sub(r"\s+", " ", (Path(__file__).resolve().parent.parent / "README.md").read_text())
    m = re.search(r"(\d+) of the (\d+) differentiable built-in ops have a VJP", readme)
    assert m and (int(m.group(1)), int(m.group(2))) == (len(WITH_RULES), len(DIFFERENTIABLE))
    m = re.search(r"for the (\d+) elementwise ops, f'\(x\)", readme)
    assert m and int(m.group(1)) == len(ELEMENTWISE)
    status = Counter(v.fd for op in WITH_RULES for v in verdicts(op))
    cases = sum(status.values())
    m = re.search(r"over ([\d,]+) float64 cases .*?: ([\d,]+) cases resolved and passing, the rest "
                  r"counted, never passed \(([\d,]+) with no direction .*?; ([\d,]+) unresolved.*?; "
                  r"([\d,]+) whose stencil leaves the domain\).*? in all ([\d,]+) cases with a direction",
                  readme)
    figures = tuple(int(g.replace(",", "")) for g in m.groups()) if m else None
    assert figures == (cases, status["pass"], status["no direction"], status["unresolved"],
                       status["left domain"], cases - status["no direction"])


def _empty_cases() -> list[Case]:
    """The float64 cases with an empty output or an empty input; of those whose output is not
    empty (an empty input beside others: attention's absent mask, a 0-element sentinel), the one
    with the smallest inputs per op, attributes and pattern of empty inputs: how a rule treats
    them does not depend on the other inputs' size (attention's 10^6-key cases made this test
    take 46 s on CI)."""
    out: list[Case] = []
    smallest: dict[tuple, Case] = {}
    for c in _float64_cases():
        empty = tuple(not math.prod(s) for s in c.shapes)
        if not c.size():
            out.append(c)
        elif any(empty):
            key = (c.op, c.attrs, empty)
            if key not in smallest or max(map(math.prod, c.shapes)) < max(map(math.prod, smallest[key].shapes)):
                smallest[key] = c
    return out + list(smallest.values())


def test_rules_keep_the_shapes_of_empty_cases() -> None:
    """The sample above leaves out empty cases (no direction to differentiate in), but the matrix
    runs them: every rule must return results of its inputs' (VJP) and outputs' (JVP, HVP)
    shapes there too (an exclusive scan's shift once turned a 0-element scan axis into 1)."""
    bad = []
    for c in _empty_cases():
        xs, attrs = make_inputs(c), c.attr_dict
        diff = _differentiable(c.op, len(xs))
        ys = _forward(CPU, c.op, xs, attrs)
        cots = [np.zeros(y.shape) if dt.is_float(dt.name_of(y.dtype)) else None for y in ys]
        tans = [np.zeros(x.shape) if d else None for x, d in zip(xs, diff)]
        try:
            CPU.run_vjp(c.op, xs, attrs, cots)
            CPU.run_jvp(c.op, xs, attrs, tans)
            if CPU.derivatives[c.op].hvp is not None:
                CPU.run_hvp(c.op, xs, attrs, cots, tans)
        except RlxError as e:
            bad.append(f"{c.input_id}: {e}")
    assert not bad, "\n".join(dict.fromkeys(bad))
