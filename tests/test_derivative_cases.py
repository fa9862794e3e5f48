"""Derivative cases (issue 16, items 3-5): ids, seeds, the MLX transforms per mode, and the
derivative judge, including deliberately wrong derivatives it must reject.

The reference rules themselves are verified in test_reference_derivatives.py; here the pipeline
around them: a derivative case shares its forward case's inputs, draws its seeds from its own id,
runs MLX's vjp/jvp/hvp over the same kernel graph in every mode, and is judged by the bound of
judge/bounds/derivative.py with every element asserted.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.matrix import Target, generate, make_inputs, make_seeds
from rlx_conformance.judge.divergences import Divergence
from rlx_conformance.run import derivatives
from rlx_conformance.run.execute import run_case

MODES = ("eager", "lazy", "compiled")
CPU = [Target("mlx", "cpu", m) for m in MODES]


def _cases(ops, dtypes=("float32",), grads=("vjp", "jvp"), targets=CPU):
    return generate(targets, ops=list(ops), dtypes=list(dtypes), grads=grads)


def test_ids_carry_the_derivative_and_share_the_forward_inputs():
    fwd = {c.input_id: c for c in _cases(["tanh"], grads=("",))}
    grads = _cases(["tanh"])
    assert grads and all(c.grad in ("vjp", "jvp") for c in grads)
    for c in grads[:6]:
        assert c.id == f"{c.forward_id}/grad:{c.grad}/{c.target}"
        assert f"/grad:{c.grad}/" in c.id
        twin = fwd[c.forward_id]
        for a, b in zip(make_inputs(c), make_inputs(twin)):
            assert a.tobytes() == b.tobytes()


def test_gradient_cases_leave_out_special_and_only_floating_dtypes():
    cs = _cases(["mul"], dtypes=("*",))
    assert cs and {c.dtype for c in cs} <= {"float16", "bfloat16", "float32", "float64"}
    assert all(c.vals != "special" for c in cs)
    assert not _cases(["arg_max"], dtypes=("*",))  # not differentiable: no derivative cases


def test_seeds_are_deterministic_per_id_and_differ_between_kinds():
    c = next(c for c in _cases(["mat_mul"]) if c.grad == "vjp")
    inputs = make_inputs(c)
    s1, s2 = make_seeds(c, inputs), make_seeds(c, inputs)
    assert s1.cotangents[0].tobytes() == s2.cotangents[0].tobytes()
    assert s1.cotangents[0].dtype == np.float32 and np.all(np.abs(s1.cotangents[0]) <= 1)
    j = dataclasses.replace(c, grad="jvp")
    t = make_seeds(j, inputs)
    assert not t.cotangents and len(t.tangents) == 2
    assert t.tangents[0].shape == inputs[0].shape


def test_unknown_derivative_is_a_one_line_error():
    with pytest.raises(RlxError, match="unknown derivative 'grad'"):
        generate(CPU, ops=["tanh"], grads=("grad",))


@pytest.mark.parametrize("op", ["tanh", "mat_mul", "softmax", "reduce_sum", "gather", "where"])
def test_mlx_derivatives_pass_in_every_mode(op):
    """Small float32 cases of ops whose derivatives MLX gets right pass in eager, lazy and
    compiled mode, with every element asserted."""
    cs = [c for c in _cases([op]) if c.size() <= 512 and c.vals == "random"][:12]
    assert cs
    for c in cs:
        r = run_case(c)
        assert r.outcome == "pass", (r.id, r.message)
        assert r.grad == c.grad


def _wrong(scale=None, transpose=False):
    """The MLX backend's run_derivative with its result corrupted."""
    real = get_backend("mlx").run_derivative

    def run(op, kind, *a, **kw):
        out = real(op, kind, *a, **kw)
        res = []
        for r in out:
            if r is None:
                res.append(r)
            elif transpose and r.ndim == 2 and r.shape[0] == r.shape[1]:
                res.append(np.ascontiguousarray(r.T))
            else:
                res.append((r * scale).astype(r.dtype) if scale is not None else r)
        return res
    return run


@pytest.mark.parametrize("kind", ["scale", "transpose"])
def test_judge_rejects_wrong_derivatives(monkeypatch, kind):
    """A derivative off by a factor 1.001 (a missing term of that size) or transposed fails."""
    derivatives.CACHE._d.clear()
    mlx = get_backend("mlx")
    monkeypatch.setattr(mlx, "run_derivative", _wrong(scale=1.001) if kind == "scale" else _wrong(transpose=True))
    ops = ["tanh", "softmax"] if kind == "scale" else ["mat_mul"]
    cs = [c for c in _cases(ops, targets=CPU[2:]) if c.vals == "random" and 4 <= c.size() <= (10000 if kind == "transpose" else 512)]
    if kind == "transpose":
        cs = [c for c in cs if all(len(s) == 2 for s in c.shapes) and c.shapes[0][0] == c.shapes[0][1] and c.shapes[1][0] == c.shapes[1][1]]
    assert cs
    for c in cs:
        r = run_case(c)
        assert r.outcome == "fail", (r.id, r.outcome, r.message)
        assert r.mismatch and r.mismatch["first"]
        key = "output" if c.grad == "jvp" else "input"
        assert key in r.mismatch["first"][0]


def test_nan_in_the_reference_is_asserted(monkeypatch):
    """Where the reference derivative is NaN, a finite value fails whatever the bound."""
    c = next(c for c in _cases(["log"], targets=CPU[2:]) if c.grad == "vjp" and c.vals == "random")
    ref = derivatives.reference(c)
    e = ref.expected[0].copy()
    e.flat[0] = np.nan
    ref.expected[0] = e
    actual = [ref.expected[0].copy()]
    actual[0].flat[0] = 1.0
    comps = derivatives.judge(c, ref, actual)
    assert not comps[0].ok and comps[0].nonfinite == 1


def test_a_result_where_the_reference_has_no_derivative_must_be_zero():
    """attention's custom mask selects: its rule gives the mask no derivative, while the backend
    (the mask is differentiable as a bias) returns one. Zeros agree (no cotangent flows into a
    selector); a nonzero element does not."""
    c = next(c for c in _cases(["attention"], targets=CPU[:1], grads=("vjp",))
             if c.attr_dict["mask_kind"] == "custom" and c.vals == "random")
    ref = derivatives.reference(c)
    assert ref.expected[3] is None and all(e is not None for e in ref.expected[:3])
    zeros = np.zeros(ref.inputs[3].shape, np.float32)
    comps = derivatives.judge(c, ref, [e.copy() for e in ref.expected[:3]] + [zeros])
    assert all(x.ok for x in comps)
    zeros.flat[0] = 1e-30
    comps = derivatives.judge(c, ref, [e.copy() for e in ref.expected[:3]] + [zeros])
    assert [x.message for x in comps if not x.ok] == [
        "d/d input 3: a nonzero result where the reference has no derivative"]


def test_divergence_entries_scope_forward_and_derivatives_apart():
    fwd = SimpleNamespace(op="exp", dtype="float32", id="exp/float32/shape:3/vals:random/mlx-cpu-eager",
                          target=Target("mlx", "cpu", "eager"), grad="")
    vjp = SimpleNamespace(op="exp", dtype="float32", id="exp/float32/shape:3/vals:random/grad:vjp/mlx-cpu-eager",
                          target=Target("mlx", "cpu", "eager"), grad="vjp")
    plain = Divergence(key="k", op=("exp",), category="precision", reason="r")
    on_vjp = Divergence(key="k", op=("exp",), category="precision", reason="r", grad="vjp", vals="random")
    both = Divergence(key="k", op=("exp",), category="precision", reason="r", grad="*")
    assert plain.matches(fwd) and not plain.matches(vjp)
    assert on_vjp.matches(vjp) and not on_vjp.matches(fwd)
    assert both.matches(vjp) and both.matches(fwd)
