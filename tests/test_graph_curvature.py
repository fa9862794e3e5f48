"""The curvature term of a graph VJP's bound (run/graph_grad._curvature) moves an input's
elements one at a time by their forward error, two reference VJPs each; for ops computed position
by position it moves a whole input at once. These tests hold the shortcuts to the definition:
the same bits where each gradient element depends on one element of the moved input, the same
sums up to the rounding of a row sum elsewhere (broadcast inputs), the same inf where a secant is
NaN or infinite."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.run import graph_grad as GG

SHAPES = [((4, 3), (4, 3)), ((4, 3), (3,)), ((3,), (4, 3)), ((4, 1), (1, 3)), ((2, 1, 3), (4, 1)),
          ((5,), ()), ((), (2, 3))]
BINARY = ["add", "sub", "mul", "div", "pow", "max", "min", "atan2"]
CURVED = ["mul", "div", "pow", "atan2"]  # a VJP that changes as an input moves (add's does not)


def _point(op: str, shapes, seed: int):
    rng = np.random.default_rng(seed)
    xs = [rng.uniform(0.5, 2.0, s) if op in ("pow", "div") else rng.standard_normal(s) for s in shapes]
    # forward errors of a few ulps of float16, zero on some elements (they must not move)
    errs = [np.abs(x) * 2.0 ** -9 * rng.integers(0, 3, np.shape(x)) for x in xs]
    out = np.broadcast_shapes(*shapes)
    cots = [rng.standard_normal(out)]
    g0 = get_backend("cpu").run_vjp(op, xs, {}, cots)
    return SimpleNamespace(op=op, attrs={}), xs, errs, cots, g0


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("shapes", SHAPES, ids=lambda s: "+".join("x".join(map(str, t)) or "0d" for t in s))
def test_whole_input_secants_equal_one_element_at_a_time(op, shapes):
    node, xs, errs, cots, g0 = _point(op, shapes, seed=len(op) * 7 + len(shapes[0]))
    whole = GG._curvature(node, xs, errs, cots, g0)
    each = GG._curvature(node, xs, errs, cots, g0, whole=False)
    exact = all(GG._moves_whole(xs, j, g0) for j in range(2))
    for w, e, g in zip(whole, each, g0):
        assert w.shape == e.shape == g.shape
        if exact:
            np.testing.assert_array_equal(w, e)
        else:
            # one at a time takes each secant as the difference of two rounded row sums
            slack = 8 * np.finfo(float).eps * (np.abs(g) + 1.0)
            assert np.all(np.abs(w - e) <= slack), (w, e)
    if op in CURVED:  # the test would notice a shortcut that moved nothing
        assert any(np.any(w > 0) for w in whole)


def test_only_the_erroneous_elements_move_and_nan_secants_are_unbounded():
    """An element without error keeps its -0 (x + 0 would make it +0: div by it flips the
    infinity); a NaN secant (inf - inf) makes its gradient element unbounded either way."""
    node = SimpleNamespace(op="div", attrs={})
    xs = [np.array([1.0, 2.0, 3.0]), np.array([-0.0, 0.5, 0.0])]
    errs = [np.array([0.0, 1e-3, 1e-3]), np.array([0.0, 1e-3, 1e-3])]
    cots = [np.ones(3)]
    with np.errstate(all="ignore"):
        g0 = get_backend("cpu").run_vjp("div", xs, {}, cots)
        whole = GG._curvature(node, xs, errs, cots, g0)
        each = GG._curvature(node, xs, errs, cots, g0, whole=False)
    for w, e in zip(whole, each):
        np.testing.assert_array_equal(w, e)
    assert np.isinf(whole[1][2]) and np.isfinite(whole[1][1])


def test_an_op_not_computed_by_position_moves_one_element_at_a_time(monkeypatch):
    """mat_mul's gradient element depends on a row of the other input: no shortcut, and the
    per-element count limit still applies."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((3, 4)), rng.standard_normal((4, 2))]
    node = SimpleNamespace(op="mat_mul", attrs={})
    assert GG.get_op("mat_mul").family not in GG.POSITIONAL
    errs = [np.full((3, 4), 1e-3), None]
    cots = [rng.standard_normal((3, 2))]
    g0 = get_backend("cpu").run_vjp("mat_mul", xs, {}, cots)
    monkeypatch.setattr(GG, "SECANT_MAX", 11)
    with pytest.raises(GG.UnsupportedError):
        GG._curvature(node, xs, errs, cots, g0)
