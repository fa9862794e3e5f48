"""The graph fuzzer (generate/graph_fuzz.py, run/fuzz_graphs.py, cli/fuzz_graphs.py), issue 17
item 5: graphs the registry accepts, deterministic under a seed, MLX passing a few examples, an
injected fault found, shrunk and written out (graph snippet, bundle, regression case), and the
command's one-line errors."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tomllib
from pathlib import Path

import mlx.core as mx
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from rlx_conformance.backends import get_backend  # noqa: E402
from rlx_conformance.cli.main import main  # noqa: E402
from rlx_conformance.core import data  # noqa: E402
from rlx_conformance.generate.graph_fuzz import graph_strategy  # noqa: E402
from rlx_conformance.generate.matrix import Target  # noqa: E402
from rlx_conformance.ops.graphs import check, load_graphs, parse, to_toml  # noqa: E402
from rlx_conformance.run.fuzz_graphs import fuzz_graphs  # noqa: E402
from standalone import clean_run

ALL_MODES = [Target("mlx", "cpu", m) for m in ("eager", "lazy", "compiled")]
SEEN: list = []


@settings(max_examples=150, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(graph_strategy(max_nodes=10, max_dim=7))
def test_every_generated_graph_validates(g):
    """check() is what cases/graphs.toml's graphs pass; the TOML written for a graph reads back
    as the same graph, and as a library file."""
    assert check(g) is g
    assert 1 <= len(g.nodes) <= 10
    text = to_toml(g)
    assert parse(tomllib.loads(text)["graph"][0]) == g
    assert g.name in load_graphs(tomllib.loads(text))
    SEEN.append(g)


def test_strategy_covers_the_node_kinds():
    """Over the examples above (run first, in file order): every kind of node the fuzzer
    promises appears."""
    if not SEEN:
        pytest.skip("needs test_every_generated_graph_validates in the same session")
    ops = {n.op for g in SEEN for n in g.nodes}
    for need in ("add", "mul", "reduce_sum", "reshape", "transpose", "slice", "mat_mul", "softmax", "cast"):
        assert need in ops, need
    assert ops & {"layer_norm", "rms_norm"} and ops & {"tanh", "gelu", "silu", "sigmoid", "exp"}
    assert {g.dtypes[0] for g in SEEN} == {"float32", "float16", "bfloat16"}


def test_deterministic_under_a_seed():
    a = fuzz_graphs(4, 7, [Target("mlx", "cpu", "eager")])
    b = fuzz_graphs(4, 7, [Target("mlx", "cpu", "eager")])
    c = fuzz_graphs(4, 8, [Target("mlx", "cpu", "eager")])
    assert a.graphs == b.graphs and len(a.graphs) == 4
    assert a.outcomes == b.outcomes
    assert a.graphs != c.graphs


def test_mlx_passes_a_few_fuzzed_graphs_in_every_mode():
    """A short fuzz on MLX CPU finds nothing that no known divergence explains."""
    rep = fuzz_graphs(5, 0, ALL_MODES)
    assert rep.examples == 5 and rep.cases == 15
    assert rep.failure is None, rep.summary()
    assert not rep.reference_errors


def bad_tanh(x):
    """tanh with its largest-magnitude element off by 0.25: an injected fault."""
    y = mx.tanh(x)
    flat = y.reshape(-1)
    k = mx.argmax(mx.abs(flat))
    return (flat + mx.where(mx.arange(flat.size) == k, 0.25, 0.0).astype(flat.dtype)).reshape(y.shape)


@pytest.fixture
def broken_tanh(monkeypatch):
    mlx = get_backend("mlx")
    monkeypatch.setitem(mlx.kernels, "tanh", dataclasses.replace(mlx.kernels["tanh"], fn=bad_tanh))


def test_injected_fault_is_found_shrunk_and_written(broken_tanh, tmp_path):
    rep = fuzz_graphs(12, 0, [Target("mlx", "cpu", "lazy")], report_dir=tmp_path)
    f = rep.failure
    assert f is not None, rep.summary()
    assert f.shrunk.ops == ("tanh",)  # exactly the broken node
    assert f.shrunk.final.failure == f.shrunk.original.failure
    assert "FAILURE" in rep.summary() and "\n" not in rep.summary()
    assert rep.not_run == 12 - rep.examples  # the first failure ends the run
    # the snippet: one regression graph that the library accepts and that still holds the node
    g = check(parse(tomllib.loads(f.snippet.read_text())["graph"][0]))
    assert g.name.startswith("regression_") and "tanh" in {n.op for n in g.nodes}
    # the bundle's repro.py rebuilds the minimal graph with the kernel that ran, and fails
    p = clean_run(f.bundle / "repro.py", cwd=tmp_path)
    assert p.returncode == 1 and "STILL FAILS" in p.stdout, p.stdout + p.stderr


def _library_copy(tmp_path: Path) -> Path:
    cases = tmp_path / "cases"
    cases.mkdir()
    shutil.copy(data.shipped_dir() / "graphs.toml", cases / "graphs.toml")
    return cases


def test_found_failure_becomes_a_regression_case(broken_tanh, tmp_path, capsys, monkeypatch):
    """--save-regression appends the graph to the library (here a --cases copy); the library
    case of it fails as the fuzzer's graph did (its inputs come from the same streams)."""
    monkeypatch.delenv(data.ENV, raising=False)
    cases = _library_copy(tmp_path)
    code = main(["fuzz-graphs", "--examples", "12", "--seed", "0", "--mode", "lazy", "--report",
                 str(tmp_path / "r"), "--save-regression", "--cases", str(cases)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert out.splitlines()[0].startswith("fuzz-graphs: ") and "FAILURE" in out.splitlines()[0]
    lib = tomllib.loads((cases / "graphs.toml").read_text())["graph"]
    added = lib[-1]
    assert added["name"].startswith("regression_")
    from rlx_conformance.generate.graphs import generate_graphs
    from rlx_conformance.ops.graphs import all_graphs
    from rlx_conformance.run import graphs as G

    all_graphs.cache_clear()
    try:
        (case,) = generate_graphs([Target("mlx", "cpu", "lazy")], [added["name"]])
        assert G.run(case).outcome == "fail"
        # adding the same graph again is refused, in one line
        snippet = next((tmp_path / "r" / "fuzz-graphs").glob("*.toml"))
        assert main(["fuzz-graphs", "--add-regression", str(snippet), "--cases", str(cases)]) == 2
        assert "already has a graph named" in capsys.readouterr().err
    finally:
        data.set_override(None)
        os.environ.pop(data.ENV, None)
        data.load.cache_clear()
        all_graphs.cache_clear()


@pytest.mark.parametrize("argv, message", [
    (["--examples", "0"], "--examples must be at least 1"),
    (["--examples", "2", "--max-nodes", "0"], "--max-nodes must be at least 1"),
    (["--examples", "2", "--time-budget", "-1"], "--time-budget must be positive"),
    (["--examples", "2", "--mode", "fast"], "no mode 'fast'"),
    (["--examples", "2", "--dtypes", "float64"], "the fuzzer draws float32, float16, bfloat16"),
    ([], "needs --examples"),
])
def test_bad_options_are_one_line_errors(argv, message, capsys):
    assert main(["fuzz-graphs", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_add_regression_refuses_what_is_not_a_regression_graph(tmp_path, capsys):
    bad = tmp_path / "g.toml"
    bad.write_text('[[graph]]\nname = "mine"\ndtypes = ["float32"]\noutputs = ["y"]\n'
                   'input = [{name = "x", shape = [2]}]\nnode = [{name = "y", op = "exp", in = ["x"]}]\n'
                   'shapes = [{name = "s"}]\n')
    assert main(["fuzz-graphs", "--add-regression", str(bad)]) == 2
    assert "starts with regression_" in capsys.readouterr().err
    bad.write_text('[[graph]]\nname = "regression_x"\ndtypes = ["float32"]\noutputs = ["y"]\n'
                   'input = [{name = "x", shape = [2]}]\nnode = [{name = "y", op = "exp", in = ["nope"]}]\n'
                   'shapes = [{name = "s"}]\n')
    assert main(["fuzz-graphs", "--add-regression", str(bad)]) == 2
    assert "reads 'nope'" in capsys.readouterr().err


def test_cli_summary_line_and_exit_0(tmp_path, capsys):
    assert main(["fuzz-graphs", "--examples", "3", "--seed", "2", "--mode", "eager", "--report", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("fuzz-graphs: 3/3 graphs (seed 2), 3 runs") and "no failure" in out[0]


def test_nightly_runs_the_fuzzer_for_its_budget(tmp_path, capsys, monkeypatch):
    """The nightly's fuzz step: the MLX targets, the time budget (which ends it), a seed from the
    date (pinned here, so that the test sees the same graphs every day); the full matrix gets the
    default budget, an --ops run none unless asked."""
    import argparse
    import time

    from rlx_conformance.cli import nightly
    from rlx_conformance.run import fuzz_graphs as F

    seen = {}
    real = F.fuzz_graphs

    def pinned(n, seed, targets, **kw):
        seen.update(n=n, seed=seed, targets=targets, **kw)
        return real(n, 0, targets, **kw)

    monkeypatch.setattr(F, "fuzz_graphs", pinned)
    args = argparse.Namespace(fuzz_graphs=2.0, ops=None)
    t0 = time.monotonic()
    assert nightly._fuzz_graphs(args, tmp_path, ALL_MODES + [Target("cpu", "cpu", "eager")]) is False
    assert time.monotonic() - t0 < 60  # the budget, plus the graph in flight when it ran out
    assert seen["targets"] == ALL_MODES and seen["time_budget"] == 2.0
    assert seen["seed"] == int(time.strftime("%Y%m%d")) and seen["report_dir"] == tmp_path
    assert seen["n"] is None  # the budget ends it, not a number of examples
    line = capsys.readouterr().out.strip()
    assert line.startswith("fuzz-graphs: ") and "no failure" in line and "\n" not in line
    seen.clear()
    assert nightly._fuzz_graphs(argparse.Namespace(fuzz_graphs=None, ops=["exp"]), tmp_path,
                                [Target("mlx", "cpu", "eager")]) is False
    assert not seen and capsys.readouterr().out == ""


SIN_OF_ROUNDED_PRODUCT = '''
[[graph]]
name = "regression_b65b0de70d"
doc = "found by rlx-conformance fuzz-graphs"
dtypes = ["float16"]
seed = "regression_b65b0de70d"
outputs = ["n6"]
input = [{name = "x0", shape = ["C", "D"]},
         {name = "x1", shape = ["D", "D"]},
         {name = "x4", shape = ["C", "1", "1"], domain = "conv_x"}]
node = [{name = "n0", op = "reshape", in = ["x0"], attrs = {new_shape = ["C", "1", "D"]}},
        {name = "n2", op = "mat_mul", in = ["n0", "x1"]},
        {name = "n5", op = "mul", in = ["n2", "x4"]},
        {name = "n6", op = "sin", in = ["n5"]}]
shapes = [{name = "fuzz", A = 5, B = 11, C = 4, D = 10}]
'''


def test_curvature_of_an_activation_is_in_the_bound():
    """A fuzz finding that was the bound's, not MLX's (seed 3): a float16 product near 934
    (ulp 0.5) feeds sin; MLX returns sin of the rounded product exactly, which is further from
    sin of the exact product than the first-order |cos x| e allows (0.111 against 0.097). The
    bound now takes the change of sin over x +- e; the graph passes in every mode."""
    import numpy as np

    from rlx_conformance.generate.graphs import graph_inputs
    from rlx_conformance.ops.graphs import resolve
    from rlx_conformance.run.graphs import evaluate, reference_of

    g = parse(tomllib.loads(SIN_OF_ROUNDED_PRODUCT)["graph"][0])
    r = resolve(g, "float16", "fuzz")
    ref = reference_of(r, graph_inputs(r, g.seed))
    first = np.abs(np.cos(ref.value["n5"])) * ref.error["n5"]  # the first-order propagated part
    for t in ALL_MODES:
        capture: dict = {}
        ev = evaluate(r, ref, t, capture)
        assert ev.outcome == "pass", ev.message
        err = np.abs(capture["actual"][0].astype(np.float64) - ref.value["n6"])
        # the case needs more than first order: MLX's error exceeds |cos x| e by more than sin's
        # own rounding in float16 can (a few ulps of a value <= 1: 2^-10 each, well below 0.01)
        assert np.any(err > first + 0.01)


def test_reference_of_an_activation_of_a_scalar():
    """A reduction to a scalar feeding an activation (the fuzzer draws these): the reference
    and its bound handle 0-d arrays (the curvature term included)."""
    from rlx_conformance.generate.graphs import graph_inputs
    from rlx_conformance.ops.graphs import resolve
    from rlx_conformance.run.graphs import evaluate, reference_of

    g = parse(tomllib.loads('''
[[graph]]
name = "scalar_tanh"
dtypes = ["float16"]
outputs = ["t"]
input = [{name = "x", shape = ["A", "B"]}]
node = [{name = "s", op = "reduce_sum", in = ["x"], attrs = {axes = [0, 1]}},
        {name = "t", op = "tanh", in = ["s"]}]
shapes = [{name = "s", A = 3, B = 4}]
''')["graph"][0])
    r = resolve(g, "float16", "s")
    ref = reference_of(r, graph_inputs(r, "scalar-tanh"))
    assert ref.error["t"].shape == () and ref.error["t"] > 0
    assert evaluate(r, ref, Target("mlx", "cpu", "eager")).outcome == "pass"
    # relu's kink within reach of the error: its magnitude at x +- e, a 0-d array too
    kink = parse(tomllib.loads(to_toml(g).replace('op = "tanh"', 'op = "relu"').replace("scalar_tanh", "scalar_relu"))
                 ["graph"][0])
    r = resolve(kink, "float16", "s")
    x = graph_inputs(r, "scalar-relu")
    x["x"][...] = 0  # the sum is 0: exactly at the kink
    ref = reference_of(r, x)
    assert ref.error["t"].shape == ()


def test_an_intermediate_that_overflows_its_dtype_is_inf_in_the_reference():
    """A fuzz finding that was the reference's (seed 1): exp(exp(x)) in bfloat16 overflows
    (exp(90) = 1.2e39 > 3.4e38), so every backend's node returns inf, and a softmax of it NaN;
    the float64 composition kept 1.2e39 and expected a finite softmax. The reference now
    carries inf where a node's correctly rounded value overflows its dtype."""
    import numpy as np

    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.ops.graphs import resolve
    from rlx_conformance.run.graphs import evaluate, reference_of

    g = parse(tomllib.loads('''
[[graph]]
name = "exp_exp_softmax"
dtypes = ["bfloat16"]
outputs = ["p"]
input = [{name = "x", shape = [3, 2]}]
node = [{name = "a", op = "exp", in = ["x"]},
        {name = "b", op = "exp", in = ["a"]},
        {name = "p", op = "softmax", in = ["b"], attrs = {axis = 0}}]
shapes = [{name = "s"}]
''')["graph"][0])
    r = resolve(g, "bfloat16", "s")
    x = np.array([[1.0, 0.5], [2.0, -1.0], [4.5, 0.25]]).astype(dt.np_dtype("bfloat16"))
    ref = reference_of(r, {"x": x})
    assert np.isinf(ref.value["b"][2, 0]) and np.isfinite(ref.value["b"][:, 1]).all()
    assert np.isnan(ref.value["p"][:, 0]).all()  # inf - inf: what a softmax of inf gives
    for t in ALL_MODES:
        ev = evaluate(r, ref, t)
        assert ev.outcome == "pass", ev.message
