"""The reference derivatives at the points where calculus does not decide (kinks, ties, poles).

Where a rule's smoothness radius (DerivativeRule.radius) is 0, finite differences cannot check it
(tests/test_reference_derivatives.py leaves those elements out): there the rule must return the
convention it declares (DerivativeRule.convention, as PyTorch documents its own). This file
checks that at the radius-0 points of the gradient-only value classes (spec/values.py: kink,
ties, near_zero), and that every op whose rule has such points gets the class that places them.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import numpy as np
import pytest
from test_reference_derivatives import check_point

from rlx_conformance.backends import get_backend
from rlx_conformance.cli.main import main
from rlx_conformance.generate.matrix import Case, Target, generate, make_inputs
from rlx_conformance.ops import REGISTRY
from rlx_conformance.spec import values

CPU = get_backend("cpu")
REF = Target("cpu", "cpu", "eager")
GRAD_OPS = sorted(n for n, s in REGISTRY.items() if s.grad_values)

# Ops whose reference rule has non-smooth points (a radius) but no gradient value class, and why.
NO_CLASS = {
    "tan": "its poles pi/2 + k pi are not floating-point numbers (no input lands on one)",
    "mod": "its jumps (a/b a nonzero integer) are a relation between the inputs: not placed yet",
    "atan2": "its branch cut (b < 0, a = 0) and singular origin involve both inputs: not placed yet",
    "onnx.ScatterElements": "duplicate targets are undefined (masked), not a convention",
    "onnx.ScatterND": "duplicate targets are undefined (masked), not a convention",
    "rlx_sparse.lu_solve": "singular matrices: its generate hook's classes (pivot, ill) approach them",
    "rlx_sparse.cg_solve": "singular matrices: its generate hook's ill class approaches them",
    "dense_solve": "singular matrices: its generate hook's classes (illcond, pivot) approach them",
    "batched_dense_solve": "singular matrices: its generate hook's illcond class approaches them",
    "cholesky": "matrices that are not positive definite: its generate hook's classes",
    "triangular_solve": "a zero on the diagonal: its generate hook's illcond class approaches it",
    "log_det": "singular matrices: its generate hook's singular class",
    "svd": "repeated and zero singular values: its generate hook's clustered class",
    "qr": "a singular R: its generate hook's rankdef class",
    "batch_norm_inference": "the pole at var = -eps: not placed yet (nn_var's special class has "
                            "0 and negatives)",
}


def _grad_cases(op: str, limit: int = 12) -> list[Case]:
    """Float64 vjp cases of the op's gradient-only classes with elements (first ``limit``)."""
    cls = set(REGISTRY[op].grad_values)
    cases = [c for c in generate([REF], ops=[op], dtypes=["float64"], grads=("vjp",))
             if c.vals in cls and c.size() > 0]
    return cases[:limit]


def _at_kinks(case: Case) -> tuple[list[np.ndarray], list[np.ndarray | None]]:
    """The case's inputs and, per input, where the reference's radius is 0 (None: smooth)."""
    xs = make_inputs(case)
    radii = CPU.smooth_radius(case.op, xs, case.attr_dict)
    return xs, [None if r is None else np.broadcast_to(np.asarray(r) == 0, x.shape)
                for r, x in zip(radii, xs)]


def test_every_non_smooth_rule_gets_a_class_or_says_why() -> None:
    with_radius = {op for op, r in CPU.derivatives.items() if r.radius is not None}
    assert {op for op in with_radius if not REGISTRY[op].grad_values} == set(NO_CLASS)
    for op in GRAD_OPS:
        rule = CPU.derivatives[op]
        assert rule.radius is not None and rule.convention.strip(), op
        assert set(REGISTRY[op].grad_values) <= set(values.GRAD_CLASSES), op


def test_ops_json_shows_conventions_and_grad_classes(capsys) -> None:
    assert main(["ops", "--format", "json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    for name, row in rows.items():
        rule = CPU.derivatives.get(name)
        assert row["grad_values"] == list(REGISTRY[name].grad_values), name
        assert row["convention"] == ((rule.convention or None) if rule else None), name
    assert rows["relu"]["grad_values"] == ["kink"] and "relu'(0) = 0" in rows["relu"]["convention"]


@pytest.mark.parametrize("op", GRAD_OPS)
def test_grad_classes_reach_the_rules_non_smooth_points(op: str) -> None:
    """The class an op declares puts elements where its rule's radius is 0 (the points really
    are its kinks, ties or poles), and kink/near_zero ops draw from a domain that declares them."""
    spec = REGISTRY[op]
    if {"kink", "near_zero"} & set(spec.grad_values):
        cases = _grad_cases(op, 1)
        assert any(values.kinks("float64", spec.inputs[k].domain, cases[0].attr_dict)
                   for k in spec.differentiable_inputs()), op
    hits = 0
    for case in _grad_cases(op):
        _, kinks = _at_kinks(case)
        hits += sum(int(k.sum()) for k in kinks if k is not None)
    assert hits, f"{op}: no element of its {spec.grad_values} cases is at a non-smooth point"


@pytest.mark.parametrize("op", GRAD_OPS)
def test_rules_verified_at_the_grad_classes(op: str) -> None:
    """tests/test_reference_derivatives.py's checks (finite differences, kept inside the radius,
    and the adjoint test) on the gradient-only classes' points: next to the kinks the rules are
    what calculus says; at them (radius 0) only the convention test below applies."""
    verdicts = [check_point(op, make_inputs(c), c.attr_dict, c.input_id) for c in _grad_cases(op, 6)]
    bad = [str(v) for v in verdicts if v.fd == "fail" or v.adjoint == "fail"]
    assert not bad, f"{op}:\n" + "\n".join(bad)
    assert any(v.adjoint == "pass" for v in verdicts) and any(v.fd == "pass" for v in verdicts), op


# The declared conventions as values, per op: f(inputs, vjp with all-ones cotangents, masks of
# radius 0 per input) -> list of (what, ok) to assert, only at the radius-0 points.
Check = Callable[[list[np.ndarray], list[np.ndarray], list[np.ndarray]], list[tuple[str, bool]]]


def _unary(at: Callable[[np.ndarray], np.ndarray]) -> Check:
    def check(xs, g, m):
        return [(f"x = {xs[0][m[0]][:4]}", bool(np.array_equal(g[0][m[0]], at(xs[0][m[0]]))))]
    return check


def _ties_split(xs, g, m):
    """max/min: a == b, the cotangent halved to each operand (same-shape cases)."""
    if xs[0].shape != xs[1].shape:
        return []
    t = xs[0] == xs[1]
    return [("a == b", bool(np.all(g[0][t] == 0.5) and np.all(g[1][t] == 0.5)))]


def _pow(xs, g, m):
    """d/db = 0 where a == 0 and b >= 0; d/da = 0 where b == 0 (same-shape cases)."""
    if xs[0].shape != xs[1].shape:
        return []
    a, b = xs
    zero = a == 0
    return [("d/db = 0 at a = 0, b >= 0", bool(np.all(g[1][zero & (b >= 0)] == 0))),
            ("d/da = 0 at b = 0", bool(np.all(g[0][b == 0] == 0)))]


def _clamp(xs, g, m):
    """1 on the closed interval: at min and at max."""
    return [("1 at the bounds", bool(np.all(g[0][m[0]] == 1)))]


CONVENTIONS: dict[str, Check] = {
    "relu": _unary(lambda x: np.zeros_like(x)),                      # relu'(0) = 0
    "abs": _unary(lambda x: np.zeros_like(x)),                       # abs'(0) = 0
    "elu": _unary(lambda x: np.ones_like(x)),                        # elu'(0) = 1
    "softsign": _unary(lambda x: np.ones_like(x)),                   # softsign'(0) = 1
    "hard_swish": _unary(lambda x: np.where(x < 0, -0.5, 1.5)),      # -1/2 at -3, 3/2 at 3
    "hard_sigmoid": _unary(lambda x: np.zeros_like(x)),              # 0 at +-3
    "log": _unary(lambda x: np.full_like(x, np.inf)),                # log'(0) = +inf
    "sqrt": _unary(lambda x: np.full_like(x, np.inf)),               # sqrt'(0) = +inf
    "rsqrt": _unary(lambda x: np.full_like(x, -np.inf)),             # rsqrt'(0) = -inf
    "recip": _unary(lambda x: np.full_like(x, -np.inf)),             # -1/x^2 at 0: -inf
    "clamp": _clamp,
    "max": _ties_split,
    "min": _ties_split,
    "pow": _pow,
}


def _tied_extreme_share(op: str, x: np.ndarray, g: np.ndarray, attrs: dict) -> bool:
    """reduce_max/min: every element equal to its slice's extreme gets 1/(number of them)."""
    axes = tuple(attrs["axes"]) or tuple(range(x.ndim))
    ext = (np.max if op == "reduce_max" else np.min)(x, axis=axes, keepdims=True)
    at = x == ext
    count = np.sum(at, axis=axes, keepdims=True)
    return bool(np.allclose(g[at], np.broadcast_to(1.0 / count, x.shape)[at], rtol=1e-15, atol=0)
                and np.all(g[~at] == 0))


def _stable_sort_vjp(x: np.ndarray, u: np.ndarray, attrs: dict) -> np.ndarray:
    """sort: tied keys keep their input order (descending too), so the cotangent of output
    position j goes to the element a stable sort puts there."""
    order = np.argsort(-x if attrs["descending"] else x, axis=attrs["axis"], kind="stable")
    g = np.zeros(x.shape)
    np.put_along_axis(g, order, u, axis=attrs["axis"])
    return g


def _cum_max_share_vjp(x: np.ndarray, u: np.ndarray, axis: int) -> np.ndarray:
    """cum_max (inclusive, forward): output j's cotangent shared equally by the elements of the
    prefix equal to its running max."""
    w, v = np.moveaxis(x, axis, -1), np.moveaxis(u, axis, -1)
    g = np.zeros(w.shape)
    for j in range(w.shape[-1]):
        tied = w[..., : j + 1] == w[..., : j + 1].max(axis=-1, keepdims=True)
        g[..., : j + 1] += tied * (v[..., j: j + 1] / tied.sum(axis=-1, keepdims=True))
    return np.moveaxis(g, -1, axis)


TIE_RULES = ["reduce_max", "reduce_min", "sort", "cum_max"]


@pytest.mark.parametrize("op", sorted(CONVENTIONS) + TIE_RULES)
def test_rules_return_their_convention_at_radius_zero(op: str) -> None:
    checked = 0
    for case in _grad_cases(op, limit=40):
        xs, kinks = _at_kinks(case)
        attrs = case.attr_dict
        if not any(k is not None and k.any() for k in kinks) or (
                op == "cum_max" and (attrs["exclusive"] or attrs["reverse"])):
            continue
        _, specs = REGISTRY[op].validate([x.shape for x in xs], [x.dtype.name for x in xs], attrs)
        # all-ones cotangents for the pointwise conventions, distinct ones where order matters
        cots = [np.ones(s, np.float64) if op in CONVENTIONS or op.startswith("reduce_") else
                np.arange(1.0, 1.0 + np.prod(s)).reshape(s) for s, _ in specs]
        with np.errstate(all="ignore"):
            g = CPU.run_vjp(op, xs, attrs, cots)
        if op in ("reduce_max", "reduce_min"):
            assert _tied_extreme_share(op, xs[0], g[0], attrs), case.id
        elif op == "sort":
            assert np.array_equal(g[0], _stable_sort_vjp(xs[0], cots[0], attrs)), case.id
        elif op == "cum_max":
            assert np.allclose(g[0], _cum_max_share_vjp(xs[0], cots[0], attrs["axis"]),
                               rtol=1e-14, atol=0), case.id
        if op in TIE_RULES:
            checked += 1
            continue
        masks = [np.zeros(x.shape, bool) if k is None else k for k, x in zip(kinks, xs)]
        for what, ok in CONVENTIONS[op](xs, g, masks):
            assert ok, f"{case.id}: the rule breaks its convention ({CPU.derivatives[op].convention}) at {what}"
            checked += 1
    assert checked, f"{op}: no radius-0 point checked"


def test_another_convention_is_caught(monkeypatch) -> None:
    """relu'(0) = 1 (the other one-sided derivative) and reduce_max routing a tie's whole
    cotangent to one element both fail the check."""
    relu = CPU.derivatives["relu"]
    monkeypatch.setitem(CPU.derivatives, "relu", dataclasses.replace(
        relu, vjp=lambda xs, attrs, cots: [cots[0] * (xs[0] >= 0)]))
    with pytest.raises(AssertionError, match="breaks its convention"):
        test_rules_return_their_convention_at_radius_zero("relu")
    rmax = CPU.derivatives["reduce_max"]

    def first_only(xs, attrs, cots):
        (x,), (u,) = xs, cots
        flat = x.reshape(-1)
        g = np.zeros_like(flat)
        if not attrs["axes"] or len(attrs["axes"]) == x.ndim:
            g[int(np.argmax(flat))] = float(np.sum(u))
            return [g.reshape(x.shape)]
        return rmax.vjp(xs, attrs, cots)
    monkeypatch.setitem(CPU.derivatives, "reduce_max", dataclasses.replace(rmax, vjp=first_only))
    with pytest.raises(AssertionError):
        test_rules_return_their_convention_at_radius_zero("reduce_max")
