"""Gradients of graphs (issue 17 item 6): the composed reference VJP against central finite
differences in float64 for every library graph, the backward bound rejecting deliberately wrong
MLX graph VJPs (a missing factor, a transposed matmul VJP, a stop_gradient where none belongs)
and accepting MLX's own, and the cases' ids (generated with --grad vjp only, stable, selectable)."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.cli._graphs import find_graph_cases
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate.graphs import generate_graphs, graph_inputs, make_graph_cotangents
from rlx_conformance.generate.matrix import Target
from rlx_conformance.ops.graphs import all_graphs, differentiable_edges, load_graphs, primals, resolve
from rlx_conformance.run import graph_grad as GG

LAZY = Target("mlx", "cpu", "lazy")


def _case(name: str, dtype: str | None = None, shape_set: str | None = None, mode: str = "lazy"):
    g = all_graphs()[name]
    dtype = dtype or g.dtypes[0]
    shape_set = shape_set or g.shapes[0][0]
    (c,) = [c for c in generate_graphs([Target("mlx", "cpu", mode)], [name], grads=("vjp",))
            if c.dtype == dtype and c.family == shape_set]
    return c


# -- the composed reference against finite differences ----------------------------------------
def _forward64(r, inputs: dict[str, np.ndarray], shifts: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The graph in float64 by the CPU backend's kernels, each cast between floats as the identity
    plus a constant: the rounding it made at the base point (``shifts``, filled on the first call
    there). At the base point that is the forward reference (which rounds at casts, as the
    backend does); around it, the smooth function whose derivative the reference VJP is (a cast's
    VJP the identity, each node's rule at the forward reference's values)."""
    cpu = get_backend("cpu")
    env = {k: (v.astype(np.float64) if dt.is_float(dt.name_of(v.dtype)) else v) for k, v in inputs.items()}
    for n in r.nodes:
        xs = [env[i] for i in n.inputs]
        with np.errstate(all="ignore"):
            outs = [np.asarray(o, np.float64) if dt.is_float(d) else o
                    for o, (_, d) in zip(cpu.run(n.op, [x.copy() for x in xs], n.attrs), n.outs)]
        if n.op == "cast" and dt.is_float(n.in_specs[0][1]) and dt.is_float(n.outs[0][1]):
            if n.name not in shifts:
                shifts[n.name] = outs[0] - xs[0]
            outs = [xs[0] + shifts[n.name]]
        env[n.name] = outs[0]
        env.update({f"{n.name}#{k}": o for k, o in enumerate(outs[1:], 1)})
    return [env[o] for o in r.outputs]


@pytest.mark.parametrize("name", sorted(all_graphs()))
def test_reference_vjp_matches_central_differences(name):
    """<g_p, v> (the reference gradient of primal p along a random direction v) against the
    central difference of L = sum_k <c_k, out_k> along v, in float64. The difference's own error
    is estimated by Richardson: |D(h) - D(h/2)| (its truncation error, O(h^2), is about 4/3 of
    that at h/2) plus the rounding of L's evaluations, ~ 1e-15 |L|-scale / h; the reference must
    lie within 10x that estimate of the extrapolated difference, and the estimate itself be small
    (a smooth point)."""
    c = _case(name, "float32" if "float32" in all_graphs()[name].dtypes else None)
    r = GG.resolved(c)
    inputs = GG.make_graph_inputs(c)
    cots = make_graph_cotangents(c)
    ref = GG.reference_of(r, inputs, cots)
    assert ref.primals == primals(r) and ref.primals
    rng = np.random.default_rng(17)

    shifts: dict[str, np.ndarray] = {}

    def loss(moved: dict[str, np.ndarray]) -> float:
        outs = _forward64(r, moved, shifts)
        return float(sum(np.sum(o * np.asarray(k, np.float64)) for o, k in zip(outs, cots) if k is not None))

    base = {k: (v.astype(np.float64) if dt.is_float(dt.name_of(v.dtype)) else v) for k, v in inputs.items()}
    scale = abs(loss(base)) + 1.0
    for p in ref.primals:
        if base[p].size == 0:
            continue
        v = rng.uniform(-1.0, 1.0, base[p].shape)
        want = float(np.sum(ref.grad[p] * v))

        def diff(h: float) -> float:
            up, down = dict(base), dict(base)
            up[p], down[p] = base[p] + h * v, base[p] - h * v
            return (loss(up) - loss(down)) / (2 * h)
        h = 1e-5 * (1.0 + float(np.max(np.abs(base[p]))))
        d1, d2 = diff(h), diff(h / 2)
        richardson = (4 * d2 - d1) / 3  # the O(h^2) term cancelled
        # the truncation error of d2 (an overestimate of Richardson's) plus the rounding of L's
        # evaluations: four float64 sums of ~|L| size, each to ~1e-15 relative, over h
        estimate = abs(richardson - d2) + 1e-15 * scale / h * 10
        assert estimate <= 1e-4 * (abs(d2) + 1.0), (p, d1, d2)  # a smooth point: the check means something
        assert abs(richardson - want) <= 10 * estimate + 1e-12, (name, p, want, richardson, estimate)


# -- the judge rejects wrong MLX graph VJPs, and accepts MLX's ----------------------------------
def _with_kernel(monkeypatch, op: str, fn) -> None:
    mlx = get_backend("mlx")
    monkeypatch.setitem(mlx.kernels, op, dataclasses.replace(mlx.kernels[op], fn=fn))


def _verdict(c):
    return GG.run(c)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gelu_vjp_missing_its_factor_is_rejected(monkeypatch, dtype):
    c = _case("matmul_bias_gelu", dtype, "wide")
    assert _verdict(c).outcome == "pass"

    @mx.custom_function
    def gelu(x):
        return nn.gelu(x)

    @gelu.vjp
    def gelu_vjp(primals, cotangent, output):  # the derivative gelu'(x) left out
        return cotangent
    _with_kernel(monkeypatch, "gelu", lambda x: gelu(x))
    r = _verdict(c)
    assert r.outcome == "fail" and r.mismatch["count"] > 0, r.message


SQUARE = load_graphs({"graph": [{
    "name": "square_matmul_tanh", "dtypes": ["float32", "bfloat16"], "outputs": ["y"],
    "input": [{"name": "x", "shape": ["B", "D"], "domain": "conv_x"},
              {"name": "w", "shape": ["D", "D"], "domain": "conv_w"}],
    "node": [{"name": "m", "op": "mat_mul", "in": ["x", "w"]}, {"name": "y", "op": "tanh", "in": ["m"]}],
    "shapes": [{"name": "s", "B": 5, "D": 12}]}]})["square_matmul_tanh"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_transposed_matmul_vjp_inside_a_graph_is_rejected(monkeypatch, dtype):
    r = resolve(SQUARE, dtype, "s")
    inputs = graph_inputs(r, "square-test")
    rng = np.random.default_rng(3)
    cots = [rng.uniform(-1, 1, (5, 12)).astype(dt.np_dtype(dtype))]
    ref = GG.reference_of(r, inputs, cots)
    assert GG.evaluate(r, ref, LAZY).outcome == "pass"

    @mx.custom_function
    def matmul(a, b):
        return mx.matmul(a, b)

    @matmul.vjp
    def matmul_vjp(primals, cotangent, output):
        a, b = primals
        c = cotangent[0] if isinstance(cotangent, (list, tuple)) else cotangent
        return mx.matmul(c, b.T), mx.matmul(c.T, a)  # dB transposed: (aᵀc)ᵀ
    _with_kernel(monkeypatch, "mat_mul", lambda a, b: matmul(a, b))
    ev = GG.evaluate(r, ref, LAZY)
    assert ev.outcome == "fail", ev.message
    bad = [k for k, cmp in enumerate(ev.comps) if not cmp.ok]
    assert bad == [ref.primals.index("w")]  # x's gradient is still right


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_stop_gradient_where_none_belongs_is_rejected(monkeypatch, mode):
    c = _case("matmul_bias_gelu", "float32", "small", mode)
    assert _verdict(c).outcome == "pass"
    _with_kernel(monkeypatch, "add", lambda a, b: mx.add(a, mx.stop_gradient(b)))
    r = _verdict(c)
    assert r.outcome == "fail" and all(f["name"] == "bias" for f in r.mismatch["first"]), r.mismatch


def test_one_gradient_element_off_by_a_little_is_rejected():
    c = _case("swiglu", "float32", "wide")
    g, ref = GG.reference(c)
    out, _ = get_backend("mlx").run_graph_vjp(g, ref.forward.inputs, ref.primals, ref.cotangents, "cpu", "lazy")
    assert all(x.ok for x in GG.judge(ref, out))
    k = ref.primals.index("wd")
    bad = [o.copy() for o in out]
    bad[k].flat[5] *= np.float32(1.001)
    comps = GG.judge(ref, bad)
    assert not comps[k].ok and comps[k].mismatches == 1
    # and the bound is tight enough to mean it: far below the gradient's own scale in float32
    assert float(np.max(ref.error["wd"])) < 1e-4 * float(np.max(np.abs(ref.grad["wd"])))


@pytest.mark.parametrize("name", sorted(n for n in all_graphs() if n != "deep_tanh_chain"))
def test_mlx_graph_vjps_pass(name):
    for dtype in all_graphs()[name].dtypes[:1] + (("bfloat16",) if "bfloat16" in all_graphs()[name].dtypes else ()):
        r = _verdict(_case(name, dtype, all_graphs()[name].shapes[-1][0], "compiled"))
        assert r.outcome == "pass", (name, dtype, r.message)


# -- generation, ids, stop_gradient at discrete edges ------------------------------------------
def test_vjp_cases_only_with_grad_vjp_and_ids_are_stable():
    fwd = generate_graphs([LAZY])
    both = generate_graphs([LAZY], grads=("", "vjp"))
    vjp = [c for c in both if c.grad]
    assert [c for c in both if not c.grad] == fwd  # forward ids unchanged
    assert {c.op for c in vjp} == {g.op for g in all_graphs().values()}
    for c in vjp:
        assert c.id == c.id.replace("/mlx-cpu-lazy", "") + "/mlx-cpu-lazy"
        assert c.id.endswith("/grad:vjp/mlx-cpu-lazy") and c.id.startswith(c.op + "/")
        assert find_graph_cases([c.id]) == [c]
    ids = [c.id for c in vjp]
    assert len(set(ids)) == len(ids)
    # the cotangents come from the id: the same for every target
    a = _case("swiglu", "float16", mode="eager")
    b = _case("swiglu", "float16", mode="compiled")
    assert all(np.array_equal(x, y) for x, y in zip(make_graph_cotangents(a), make_graph_cotangents(b)))


def test_discrete_edges_stop_the_gradient_and_discrete_graphs_get_no_case():
    graphs = load_graphs({"graph": [
        {"name": "masked", "dtypes": ["float32"], "outputs": ["y"],
         "input": [{"name": "x", "shape": [3, 4]}, {"name": "z", "shape": [3, 4]}],
         "node": [{"name": "p", "op": "gt", "in": ["x", "z"]}, {"name": "f", "op": "cast", "in": ["p"],
                                                                 "attrs": {"to": "float32"}},
                  {"name": "y", "op": "mul", "in": ["x", "f"]}],
         "shapes": [{"name": "s"}]},
        {"name": "only_discrete", "dtypes": ["float32"], "outputs": ["p"],
         "input": [{"name": "x", "shape": [3, 4]}],
         "node": [{"name": "p", "op": "gt", "in": ["x", "x"]}],
         "shapes": [{"name": "s"}]}]})
    m = resolve(graphs["masked"], "float32", "s")
    assert [differentiable_edges(n) for n in m.nodes] == [[False, False], [False], [True, True]]
    assert primals(m) == ("x",)  # z reaches the output through the comparison alone
    assert primals(resolve(graphs["only_discrete"], "float32", "s")) == ()
    inputs = graph_inputs(m, "masked-test")
    cots = [np.random.default_rng(5).uniform(-1, 1, (3, 4)).astype(np.float32)]
    ref = GG.reference_of(m, inputs, cots)
    mask = (inputs["x"] > inputs["z"]).astype(np.float64)
    assert 0 < mask.sum() < mask.size and np.array_equal(ref.grad["x"], cots[0] * mask)
    assert GG.evaluate(m, ref, LAZY).outcome == "pass"


def test_failing_vjp_case_bundle_says_it_holds_the_forward_graph(monkeypatch, tmp_path):
    from rlx_conformance.run.bundle import write_bundle
    c = _case("matmul_bias_gelu", "float32", "small")
    _with_kernel(monkeypatch, "add", lambda a, b: mx.add(a, mx.stop_gradient(b)))
    r = GG.run(c)
    assert r.outcome == "fail"
    folder = write_bundle(c, r, tmp_path, {})
    doc = json.loads((folder / "case.json").read_text())
    assert doc["id"] == c.id and "forward graph" in doc["graph"]["note"], doc["graph"]


def test_cli_runs_graph_vjp_cases_and_grad_none_leaves_them_out(tmp_path):
    cli = [sys.executable, "-m", "rlx_conformance"]
    listed = subprocess.run(cli + ["list", "--ops", "graph:swiglu", "--grad", "none", "--mode", "lazy"],
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed and not any("grad:" in i for i in listed)
    rep = tmp_path / "r"
    p = subprocess.run(cli + ["run", "--ops", "graph:swiglu", "--grad", "vjp", "--no-forward", "--mode", "lazy",
                              "--layouts", "none", "--workers", "1", "--no-bundles", "--no-progress",
                              "--report", str(rep)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = json.loads((rep / "results.json").read_text())["cases"]
    assert recs and all(r["grad"] == "vjp" and r["outcome"] == "pass" and r["id"].startswith("graph:swiglu/")
                        for r in recs)
    assert {tuple(r["graph"]["primals"]) for r in recs} == {("x", "wg", "wu", "wd")}


def test_a_node_gets_its_single_op_argument_allowance(monkeypatch):
    """A graph node is held to what its op alone would be: gelu's VJP forms rounded arguments
    (x / sqrt 2, its square) before e^(-x^2/2) amplifies them ([[argument]] in
    cases/derivatives.toml), and the graph bound now adds that allowance as the single-op judge
    does: larger somewhere, smaller nowhere, and still far below the gradient's scale."""
    c = _case("matmul_bias_gelu", "float32")
    _, ref = GG.reference(c)
    monkeypatch.setattr(GG, "argument_sensitivity", lambda *a, **k: None)
    _, without = GG.reference(c)
    assert ref.primals == without.primals
    for p in ref.primals:
        assert np.all(ref.error[p] >= without.error[p]), p
    assert any(np.any(ref.error[p] > without.error[p]) for p in ref.primals)
    for p in ref.primals:
        assert float(np.max(ref.error[p])) < 1e-4 * float(np.max(np.abs(ref.grad[p]))), p
