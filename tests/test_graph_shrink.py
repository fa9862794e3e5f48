"""Graph shrinking (run/shrink.py) and graph repro bundles (run/graph_bundle.py), issue 17 item 4.

A deliberately broken MLX kernel is injected into one node of a library graph: swiglu's silu
(5 nodes: three matmuls, silu, mul) made to return its largest-magnitude element 2^-6 too large
(about 1.3e5 float32 ulp, far beyond any bound; a single element, so it must survive two
matmuls downstream to be seen). The shrinker must return exactly that node, fed its input as a
graph input, and the minimal graph must still fail. MLX's own recorded divergence
(graph-gelu-erf-cancellation: matmul + bias + gelu) shows the bundle's repro.py reproduces a
failure of MLX's real kernels; the injected kernel shows repro.py embeds the kernel that ran.
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import generate_graphs
from rlx_conformance.generate.matrix import Target
from rlx_conformance.ops.graphs import get_graph, parse, resolve, to_toml
from rlx_conformance.run import shrink as S
from rlx_conformance.run.bundle import bundle_name, reproduce, write_graph_bundle
from rlx_conformance.run.graph_bundle import shrunk_for_bundle
from standalone import clean_run

MODES = ("eager", "lazy", "compiled")


def bad_silu(x):
    """silu with its largest-magnitude element 2^-6 (relative) too large: an injected fault."""
    y = x * mx.sigmoid(x)
    flat = y.reshape(-1)
    k = mx.argmax(mx.abs(flat))
    bump = mx.where(mx.arange(flat.size) == k, flat * 2.0 ** -6, mx.zeros_like(flat))
    return (flat + bump).reshape(y.shape)


@pytest.fixture
def broken_silu(monkeypatch):
    mlx = get_backend("mlx")
    monkeypatch.setitem(mlx.kernels, "silu", dataclasses.replace(mlx.kernels["silu"], fn=bad_silu))


@pytest.mark.parametrize("mode", MODES)
def test_injected_fault_shrinks_to_its_node(broken_silu, mode):
    g = get_graph("swiglu")
    assert len(g.nodes) >= 5
    sh = S.shrink(g, "float32", "wide", Target("mlx", "cpu", mode))
    assert sh.original.failure == S.Failure("fail", frozenset({"value"}))
    assert sh.complete
    assert sh.nodes == ("sg",) and sh.ops == ("silu",)  # exactly the broken node ...
    assert [name for name, _ in sh.final.resolved.inputs] == ["g"]  # ... fed what it needs
    assert sh.final.failure == sh.original.failure  # and the minimal graph still fails that way
    # the cut input holds the reference's value of g, rounded once to float32
    assert np.array_equal(sh.final.inputs["g"], sh.declared.reference.value["g"].astype(np.float32))
    # the declared graph (inputs from its own case's streams) keeps the node as its output
    assert sh.declared.resolved.graph.outputs == ("sg",)
    assert sh.declared.failure == sh.original.failure
    assert S.explained_by(sh) is None  # no known divergence explains an injected fault


def test_shrinking_needs_a_failure():
    """The real kernels pass swiglu in float32: nothing to shrink, said in one line."""
    with pytest.raises(RlxError, match="does not fail"):
        S.shrink(get_graph("swiglu"), "float32", "small", Target("mlx", "cpu", "eager"))


def test_shapes_shrink_only_where_the_graph_validates(broken_silu):
    """Every shape set the shrinker settled on passes the graph's own validation, and the
    minimal graph is no larger than the original's inputs."""
    sh = S.shrink(get_graph("swiglu"), "float32", "wide", Target("mlx", "cpu", "lazy"))
    d = sh.declared.resolved
    resolve(d.graph, d.dtype, d.shape_set)  # raises if not valid
    size = lambda r: sum(int(np.prod(s)) for _, (s, _) in r.inputs)  # noqa: E731
    assert size(d) < size(sh.original.resolved)
    # the attention graph's E must stay even (E//2 columns of cos and sin): halving E to an odd
    # value is refused by validation, never forced
    att = get_graph("attention_rope_causal")
    dims = dict(dict(att.shapes)["small"])
    odd = dataclasses.replace(att, shapes=(("odd", tuple({**dims, "E": 3}.items())),))
    with pytest.raises(Exception):
        resolve(odd, "float32", "odd")


def test_mlx_gelu_divergence_shrinks_to_gelu_and_is_known():
    """matmul + bias + gelu fails on MLX's own gelu (graph-gelu-erf-cancellation): the minimal
    graph is the gelu node alone, and a known divergence explains it."""
    case = next(c for c in generate_graphs([Target("mlx", "cpu", "compiled")], ["matmul_bias_gelu"])
                if c.dtype == "float32")
    sh = S.shrink(get_graph(case.op), case.dtype, case.family, case.target)
    assert sh.ops == ("gelu",)
    d = S.explained_by(sh)
    assert d is not None and "gelu" in d.key


def test_minimal_graph_round_trips_through_toml(broken_silu):
    sh = S.shrink(get_graph("swiglu"), "float32", "small", Target("mlx", "cpu", "eager"))
    import tomllib

    for g in (sh.graph, sh.declared.resolved.graph):
        assert parse(tomllib.loads(to_toml(g))["graph"][0]) == g


# -- bundles -------------------------------------------------------------------------------------
def _bundle_doc(folder: Path) -> dict:
    return json.loads((folder / "case.json").read_text())


def test_mlx_failure_bundle_repro_reports_it(tmp_path):
    """A graph case failing on MLX's real gelu: the bundle holds the minimal graph and a
    standalone repro.py that rebuilds it in plain MLX and still fails (exit 1)."""
    case = next(c for c in generate_graphs([Target("mlx", "cpu", "lazy")], ["matmul_bias_gelu"])
                if c.dtype == "float32")
    r = reproduce(case, tmp_path)
    folder = tmp_path / r.repro
    doc = _bundle_doc(folder)
    assert doc["graph"]["shrunk"] and doc["graph"]["ops"] == ["gelu"]
    assert doc["self_check"] == "agrees"
    assert (folder / "graph.toml").read_text().count("op = ") == 1
    src = (folder / "repro.py").read_text()
    assert not re.search(r"^\s*(import|from) (rlx_conformance|backends)\b", src, re.M)  # nothing of the harness
    p = clean_run(folder / "repro.py", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "STILL FAILS" in p.stdout and "output 0 (y)" in p.stdout


def test_injected_fault_bundle_embeds_the_kernel_that_ran(broken_silu, tmp_path):
    """The injected kernel is what repro.py rebuilds the minimal graph with (its source is
    embedded, as a contributed kernel's is), so the standalone repro reproduces the failure."""
    case = next(c for c in generate_graphs([Target("mlx", "cpu", "compiled")], ["swiglu"])
                if c.dtype == "float32" and c.family == "wide")
    rec = CaseResult.for_case(case, "fail", message="injected")
    shrunk, note = shrunk_for_bundle(case)
    assert shrunk is not None, note
    folder = write_graph_bundle(tmp_path / bundle_name(case.id), case, rec, shrunk)
    doc = _bundle_doc(folder)
    assert doc["graph"]["nodes"] == ["sg"] and doc["graph"]["original_nodes"] == 5
    assert doc["self_check"] == "agrees"
    src = (folder / "repro.py").read_text()
    assert "an injected fault" in src  # bad_silu, embedded as the silu kernel
    p = clean_run(folder / "repro.py", cwd=tmp_path)
    assert p.returncode == 1 and "STILL FAILS" in p.stdout, p.stdout + p.stderr


def test_passing_graph_bundle_is_whole_and_repro_passes(tmp_path):
    """repro of a passing graph case: no shrinking; repro.py rebuilds the whole graph, exit 0."""
    case = next(c for c in generate_graphs([Target("mlx", "cpu", "eager")], ["swiglu"])
                if c.dtype == "float32" and c.family == "small")
    r = reproduce(case, tmp_path)
    assert r.outcome == "pass"
    folder = tmp_path / r.repro
    doc = _bundle_doc(folder)
    assert not doc["graph"]["shrunk"] and len(doc["run"]["graph"]["nodes"]) == 5
    p = clean_run(folder / "repro.py", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


def test_repro_command_takes_a_graph_case_id(tmp_path, capsys):
    """``rlx-conformance repro GRAPH_ID`` runs the graph case in a worker and writes its shrunk
    bundle there (exit 1: MLX's gelu divergence still reproduces)."""
    from rlx_conformance.cli.main import main

    case_id = "graph:matmul_bias_gelu/float32/shape:2x4x8+8x6+6/vals:random/mlx-cpu-eager"
    assert main(["repro", case_id, "--report", str(tmp_path)]) == 1
    folder = tmp_path / "repro" / bundle_name(case_id)
    doc = _bundle_doc(folder)
    assert doc["graph"]["ops"] == ["gelu"] and (folder / "repro.py").is_file() and (folder / "graph.toml").is_file()
    assert f"bundle: {folder}/" in capsys.readouterr().out
