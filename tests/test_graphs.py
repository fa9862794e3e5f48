"""Graph cases (issue 17): the format's validation, ids, the composed reference against plain
numpy, the propagated bound rejecting degraded executions and accepting MLX, and the modes."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from rlx_conformance.core.errors import SpecError, UnknownOpError
from rlx_conformance.generate.graphs import generate_graphs, make_graph_inputs
from rlx_conformance.generate.matrix import Target, generate
from rlx_conformance.ops.graphs import all_graphs, check, parse
from rlx_conformance.run import graphs as G

CPU = [Target("mlx", "cpu", m) for m in ("eager", "lazy", "compiled")]


def _graph(**over):
    g = {"name": "t", "dtypes": ["float32"], "outputs": ["y"],
         "input": [{"name": "x", "shape": ["B", "D"]}, {"name": "w", "shape": ["D", "N"]}],
         "node": [{"name": "y", "op": "mat_mul", "in": ["x", "w"]}],
         "shapes": [{"name": "s", "B": 2, "D": 3, "N": 4}]}
    g.update(over)
    return g


@pytest.mark.parametrize("over, message", [
    ({"node": [{"name": "y", "op": "matmul", "in": ["x", "w"]}]}, "unknown op 'matmul'"),
    ({"node": [{"name": "y", "op": "mat_mul", "in": ["x", "z"]}]}, "reads 'z'"),
    ({"node": [{"name": "a", "op": "exp", "in": ["y"]}, {"name": "y", "op": "exp", "in": ["a"]}]},
     "no cycles"),
    ({"input": [{"name": "x", "shape": ["B", "D"]}, {"name": "w", "shape": ["N", "D"]}]}, "node y: mat_mul"),
    ({"node": [{"name": "y", "op": "reshape", "in": ["x"], "attrs": {"new_shape": ["B*Q"]}}]},
     "unknown dimension 'Q'"),
    ({"outputs": ["q"]}, "output 'q'"),
])
def test_format_validation_errors_are_one_line(over, message):
    with pytest.raises((SpecError, UnknownOpError)) as e:
        check(parse(_graph(**over)))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_library_loads_and_keeps_batch_above_one():
    graphs = all_graphs()
    assert len(graphs) >= 14
    assert max(len(g.nodes) for g in graphs.values()) > 1536  # above RLX_MLX_COMPILE_MAX_NODES
    for g in graphs.values():
        for _, dims in g.shapes:
            d = dict(dims)
            assert d.get("B", d.get("N", 2)) > 1, g.name


def test_ids_are_distinct_selectable_and_leave_op_ids_alone():
    cases = generate_graphs(CPU)
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("graph:") for i in ids)
    assert "graph:rms_norm_matmul/float32/shape:2x5x16+16+16+16x12/vals:random/mlx-cpu-compiled" in ids
    assert {c.op for c in generate_graphs(CPU, ["graph:swig*"])} == {"graph:swiglu"}
    op_ids = [c.id for c in generate(CPU[:1], ops=["exp"], dtypes=["float32"])]
    assert op_ids and not any(i.startswith("graph:") for i in op_ids)
    c = cases[0]
    a, b = make_graph_inputs(c), make_graph_inputs(c)
    assert all(np.array_equal(a[k], b[k]) for k in a)  # inputs from the id's seed


def _case(name, dtype="float32", shape_set=None, mode="lazy"):
    cases = [c for c in generate_graphs([Target("mlx", "cpu", mode)], [name]) if c.dtype == dtype]
    return next(c for c in cases if shape_set is None or c.family == shape_set)


def test_reference_matches_plain_numpy_rms_norm_matmul():
    c = _case("rms_norm_matmul", shape_set="wide")
    g, ref = G.reference(c)
    x, gm, bt, w = (ref.inputs[k].astype(np.float64) for k in ("x", "g", "beta", "w"))
    h = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gm + bt
    want = h.reshape(-1, x.shape[-1]) @ w
    np.testing.assert_allclose(ref.value["y"], want, rtol=1e-12, atol=1e-12)


def test_reference_matches_plain_numpy_mixed_precision_cast():
    c = _case("mixed_precision_mlp", dtype="float16", shape_set="small")
    g, ref = G.reference(c)
    x, w, b = ref.inputs["x"].astype(np.float64), ref.inputs["w"].astype(np.float64), ref.inputs["bias"].astype(np.float64)
    from math import erf
    a16 = (x @ w + b).astype(np.float16).astype(np.float64)  # the graph's cast down, applied as it says
    want = a16 * 0.5 * (1 + np.vectorize(erf)(a16 / np.sqrt(2)))
    np.testing.assert_allclose(ref.value["y"], want, rtol=1e-12, atol=1e-15)


def _mlx_out(c):
    from rlx_conformance.backends import get_backend
    g, ref = G.reference(c)
    out, _ = get_backend("mlx").run_graph(g, ref.inputs, "cpu", c.target.mode)
    return g, ref, out


def test_judge_rejects_softmax_without_max_subtraction():
    c = _case("norm_gelu_softmax_shapes", shape_set="s3")
    g, ref = G.reference(c)
    # the softmax input scaled up to logits of ~100: exp overflows in float32 without the max
    logits = ref.value["a"] * 60.0
    naive = np.exp(logits.astype(np.float32)) / np.sum(np.exp(logits.astype(np.float32)), -1, keepdims=True)
    ref.value["y"] = np.exp(logits - logits.max(-1, keepdims=True))
    ref.value["y"] /= ref.value["y"].sum(-1, keepdims=True)
    comps = G.judge(g, ref, [naive.astype(np.float32)])
    assert not all(x.ok for x in comps)


def test_judge_rejects_float16_accumulating_matmul_and_accepts_mlx():
    c = _case("rms_norm_matmul", shape_set="wide")
    g, ref, out = _mlx_out(c)
    assert all(x.ok for x in G.judge(g, ref, out))
    r = ref.value["r"]
    w = ref.inputs["w"]
    acc = np.zeros((r.shape[0], w.shape[1]), np.float16)
    for k in range(r.shape[1]):  # a matmul accumulating in float16
        acc = (acc + (r[:, k:k + 1].astype(np.float16) * w[k].astype(np.float16))).astype(np.float16)
    assert not all(x.ok for x in G.judge(g, ref, [acc.astype(np.float32)]))


def test_judge_rejects_one_changed_element():
    c = _case("swiglu", shape_set="wide")
    g, ref, out = _mlx_out(c)
    assert all(x.ok for x in G.judge(g, ref, out))
    bad = out[0].copy()
    bad.flat[7] = np.nextafter(bad.flat[7], np.float32(np.inf), dtype=np.float32) * np.float32(1.001)
    comps = G.judge(g, ref, [bad])
    assert not comps[0].ok and comps[0].mismatches == 1


@pytest.mark.parametrize("name", ["attention_rope_causal", "conv_bn_relu_pool", "scatter_gathered_embedding",
                                  "broadcast_scan_reduce", "logits_cross_entropy", "transpose_slice_chain"])
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_mlx_passes_library_graphs(name, mode):
    for dtype in ("float32", "bfloat16"):
        c = _case(name, dtype=dtype, shape_set="wide", mode=mode)
        r = G.run(c)
        assert r.outcome == "pass", (c.id, r.message)
        assert r.output_digest and r.graph["nodes"] == len(G.resolved(c).nodes)


def test_modes_are_compared_and_the_compile_cache_retraces():
    from rlx_conformance.judge.stability import classify
    recs = []
    for mode in ("eager", "lazy", "compiled"):
        for s in ("s1", "s2", "s3", "s4"):  # one compiled function (per worker) traced at four shapes
            r = G.run(_case("norm_gelu_softmax_shapes", shape_set=s, mode=mode))
            assert r.outcome == "pass", r.message
            recs.append(r)
    groups = classify(recs)["groups"]
    assert {g["mode"] for g in groups} == {"eager", "lazy", "compiled"}
    # each mode's digests compared with the other modes' (bit-stable or mode-dependent: a finding)
    assert all(g["class"] in ("bit-stable", "mode-dependent") and len(g["compared_with"]) == 2 for g in groups)


def test_cli_runs_graph_cases_and_records_them(tmp_path):
    rep = tmp_path / "rep"
    p = subprocess.run([sys.executable, "-m", "rlx_conformance", "run", "--ops", "graph:swiglu", "--grad", "none",
                        "--mode", "all", "--dtypes", "float32", "--no-bundles", "--no-progress", "--workers", "1",
                        "--report", str(rep)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((rep / "results.json").read_text())
    recs = doc["cases"] if "cases" in doc else doc["results"]
    assert len(recs) == 6 and {r["op"] for r in recs} == {"graph:swiglu"}
    assert all(r["outcome"] == "pass" and r["graph"]["nodes"] == 5 for r in recs)
    groups = [g for g in doc["stability"]["groups"] if g["op"] == "graph:swiglu"]
    assert groups and all(g["class"] != "unknown" for g in groups)
