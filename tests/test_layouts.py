"""Memory layouts as a matrix dimension (issue 17 item 1): ids, shared inputs, the views MLX
really gets, a layout-sensitive kernel the judge must reject, the divergence scope, the CLI
options, repro bundles, and a small run that passes.

A layout case hands the backend under test its inputs as views (transposed, strided, offset,
reversed, broadcast, mixed: generate/matrix.py); the reference sees the logical values, so a
layout case shares inputs and reference with its contiguous twin (broadcast aside, which changes
the values to the broadcast of the first slice, for the reference too).
"""
from __future__ import annotations

import dataclasses
import json

import mlx.core as mx
import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.cpu import CpuBackend
from rlx_conformance.backends.mlx import to_mlx, to_mlx_view
from rlx_conformance.cli.main import main as cli
from rlx_conformance.core.errors import UnsupportedError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.layouts import LAYOUTS, VIEWS, layout_buffer, layout_of_id, layout_view
from rlx_conformance.generate.matrix import Target, case_layouts, generate, make_inputs
from rlx_conformance.judge.divergences import _entry
from rlx_conformance.run.bundle import reproduce
from rlx_conformance.run.execute import run_case
from rlx_conformance.run.session import find_case, supports

EAGER = Target("mlx", "cpu", "eager")
COMPILED = Target("mlx", "cpu", "compiled")


def _cases(ops, layouts="all", dtypes=("float32",), targets=(COMPILED,)):
    return generate(list(targets), ops=list(ops), dtypes=list(dtypes), supports=supports, layouts=layouts)


# -- ids -----------------------------------------------------------------------------------------
def test_contiguous_ids_do_not_change_and_layout_ids_parse_back():
    ops = ["add", "mat_mul", "softmax", "gather", "concat"]
    plain = [c.id for c in _cases(ops, layouts="none", dtypes=("*",))]
    every = _cases(ops, dtypes=("*",))
    assert [c.id for c in every if not c.layout] == plain
    laid = [c for c in every if c.layout]
    assert {c.layout for c in laid} == set(LAYOUTS)
    for c in laid:
        assert c.id == f"{c.contiguous_id}/layout:{c.layout}/{c.target}"
        assert c.id.split("/")[-3].startswith("vals:")  # right after the vals segment
        assert layout_of_id(c.id) == c.layout
    c = next(c for c in laid if c.layout == "mixed")
    assert find_case(c.id) == c  # a layout id finds its case (run --case, repro)
    assert layout_of_id(plain[0]) == ""


def test_layout_cases_follow_their_contiguous_twin_and_skip_what_does_not_apply():
    cs = _cases(["exp"], dtypes=("float32",))
    for k, c in enumerate(cs):
        if c.layout:  # its twin (same contiguous id) comes before it, with nothing else between
            assert all(p.contiguous_id == c.contiguous_id for p in cs[k - 1:k])
    shapes = {c.shapes for c in cs if c.layout == "transposed"}
    assert shapes and all(len(s[0]) >= 2 for s in shapes)  # transposed: rank >= 2 only
    assert not any(c.layout for c in cs if np.prod(c.shapes[0]) < 2)  # nothing to lay out
    assert not any(c.layout == "mixed" for c in cs)  # one input: no mix


def test_default_setting_gives_each_layout_once_per_op_and_family_in_one_dtype():
    cs = [c for c in _cases(["add", "sort"], layouts="default", dtypes=("*",)) if c.layout]
    assert {c.dtype for c in cs if c.op == "add"} == {"float32"}
    seen = [(c.op, c.family, c.layout) for c in cs]
    assert len(seen) == len(set(seen)) and all(c.vals == "random" for c in cs if c.op == "add")
    assert {c.layout for c in cs if c.op == "add"} == set(LAYOUTS)


# -- inputs ------------------------------------------------------------------------------------------
def test_layout_cases_share_inputs_and_reference_key_with_their_twin():
    cs = _cases(["mat_mul", "add", "gather"])
    twins = {c.contiguous_id: c for c in cs if not c.layout}
    checked = set()
    for c in cs:
        if not c.layout:
            continue
        twin = twins[c.contiguous_id]
        a, b = make_inputs(c), make_inputs(twin)
        lays = case_layouts(c, a)
        if "broadcast" not in lays:
            assert c.values_id == twin.input_id
            assert all(x.tobytes() == y.tobytes() and x.shape == y.shape for x, y in zip(a, b))
        else:  # the broadcast of the first slice of the twin's values, for the reference too
            assert c.values_id == c.input_id != twin.input_id
            for x, y, lay in zip(a, b, lays):
                want = np.broadcast_to(y[:1], y.shape) if lay == "broadcast" else y
                assert np.array_equal(x, want, equal_nan=True)
        checked.add(c.layout)
    assert checked == set(LAYOUTS)


def test_mixed_gives_different_layouts_to_different_inputs_deterministically():
    mixed = [c for c in _cases(["add", "mat_mul", "where"]) if c.layout == "mixed"]
    assert mixed
    for c in mixed:
        lays = case_layouts(c, make_inputs(c))
        assert len(set(lays)) >= 2 and any(lays)
        assert lays == case_layouts(dataclasses.replace(c), make_inputs(c))


# -- the views MLX gets ----------------------------------------------------------------------------
def _buffer_and_view(x: np.ndarray, layout: str):
    buf = to_mlx(layout_buffer(x, layout), "float32")
    view = layout_view(buf, layout, x.shape, mx)
    mx.eval(buf, view)
    return np.asarray(memoryview(buf)), np.asarray(memoryview(view))


@pytest.mark.parametrize("layout", VIEWS)
def test_mlx_gets_a_real_view_for_each_layout(layout):
    """The array handed to the kernel reads the buffer through strides (memoryview exposes MLX's
    own strides and data pointer): never a contiguous copy, and its logical values are x's."""
    x = np.arange(24, dtype=np.float32).reshape(4, 6) - 7
    buf, view = _buffer_and_view(x, layout)
    got = to_mlx_view(x, "float32", layout)
    assert memoryview(got).strides == view.strides  # what the backend builds is this view
    want = np.broadcast_to(x[:1], x.shape) if layout == "broadcast" else x
    assert np.array_equal(np.array(got), want)
    item = x.itemsize
    if layout == "transposed":
        assert view.strides == (item, 4 * item) and not view.flags.c_contiguous
    elif layout == "strided":
        assert buf.size == 2 * x.size and view.strides == (12 * item, 2 * item)
        assert np.isnan(buf[:, 1::2]).all()  # what the view skips is poison
    elif layout == "offset":
        assert buf.size == x.size + 6 and view.ctypes.data - buf.ctypes.data == 6 * item
        assert np.isnan(buf[0]).all()
    elif layout == "reversed":
        assert view.strides == (-6 * item, -item)
    elif layout == "broadcast":
        assert buf.size == 6 and view.strides == (0, item)


def _contiguous_only_neg(x):
    """neg, right only when its input is row-contiguous in memory: what a kernel that reads its
    buffer as if row-major would return for a view (eager and lazy: it reads the memory)."""
    return mx.negative(x) if memoryview(x).c_contiguous else mx.negative(x) + 1


@pytest.fixture
def layout_sensitive_neg():
    mlx = get_backend("mlx")
    saved = mlx.kernels["neg"]
    mlx.register("neg", _contiguous_only_neg, devices=dict(saved.dtypes), replace=True, origin="tests")
    yield
    mlx.kernels["neg"] = saved


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_the_judge_rejects_a_kernel_that_only_handles_contiguous_inputs(layout_sensitive_neg, mode):
    cs = [c for c in generate([Target("mlx", "cpu", mode)], ops=["neg"], dtypes=["float32"], layouts="all")
          if c.vals == "random" and c.shapes == ((3, 5),)]
    outcome = {c.layout: run_case(c).outcome for c in cs}
    # offset stays row-contiguous (a view one row into its buffer): only a kernel that ignores
    # the offset would show it, which this one does not
    assert outcome == {"": "pass", "offset": "pass", "transposed": "fail", "strided": "fail",
                       "reversed": "fail", "broadcast": "fail"}


def test_a_backend_without_layouts_rejects_them_and_the_reference_ignores_them():
    class NoLayouts(CpuBackend):
        layouts = ""

    b = NoLayouts()
    b.kernels = get_backend("cpu").kernels
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with pytest.raises(UnsupportedError, match="contiguous only"):
        b.run("neg", [x], layout=("strided",))
    assert np.array_equal(b.run("neg", [x], layout=("",))[0], -x)
    assert np.array_equal(get_backend("cpu").run("neg", [x], layout=("reversed",))[0], -x)


# -- divergences, records, bundles -------------------------------------------------------------------
def test_divergence_layout_scope_defaults_to_every_layout():
    base = {"key": "k", "op": "neg", "category": "backend-bug", "reason": "r", "excuses": ["value"],
            "max_ulp": 1}
    every, only = _entry(base, "t"), _entry({**base, "layout": "reversed"}, "t")
    contiguous = _entry({**base, "layout": ""}, "t")
    cs = {c.layout: c for c in _cases(["neg"]) if c.shapes == ((3, 5),) and c.vals == "random"}
    assert all(every.matches(c) for c in cs.values())
    assert [k for k, c in cs.items() if only.matches(c)] == ["reversed"]
    assert [k for k, c in cs.items() if contiguous.matches(c)] == [""]
    with pytest.raises(Exception, match="layout must be a string"):
        _entry({**base, "layout": 1}, "t")


def test_results_record_the_layout():
    c = next(c for c in _cases(["neg"]) if c.layout == "strided")
    r = CaseResult.for_case(c, "pass")
    assert r.layout == "strided" and CaseResult.from_json(r.to_json()).layout == "strided"


def test_repro_bundle_rebuilds_the_view(tmp_path):
    c = next(c for c in _cases(["mat_mul"]) if c.layout == "mixed" and c.vals == "random")
    r = reproduce(c, tmp_path)
    doc = json.loads((tmp_path / r.repro / "case.json").read_text())
    assert doc["layout"] == "mixed" and doc["run"]["layouts"] == list(case_layouts(c, make_inputs(c)))
    assert doc["self_check"] == "agrees"
    src = (tmp_path / r.repro / "repro.py").read_text()
    assert "def to_mlx_view(" in src and "def layout_view(" in src


# -- CLI ---------------------------------------------------------------------------------------------
def test_list_selects_by_layout(capsys):
    small = ["list", "--ops", "add", "--dtypes", "float32", "--mode", "eager", "--grad", "none", "--format", "json"]
    assert cli(small + ["--layouts", "none"]) == 0
    none = json.loads(capsys.readouterr().out)
    assert none["count"] and not any(c["layout"] for c in none["cases"])
    assert cli(small + ["--layouts", "all", "--no-contiguous"]) == 0
    only = json.loads(capsys.readouterr().out)
    assert only["count"] and all(c["layout"] for c in only["cases"])
    assert {c["layout"] for c in only["cases"]} == set(LAYOUTS)
    assert cli(small + ["--layouts", "none", "--no-contiguous"]) == 2


def test_small_layout_run_passes(tmp_path):
    """exp, mat_mul and softmax in every layout and mode (float32, the default layout cases): no
    case fails the run (the known divergences of their values hold under every layout)."""
    assert cli(["run", "--ops", "exp,mat_mul,softmax", "--dtypes", "float32", "--layouts", "default",
                "--no-contiguous", "--mode", "all", "--grad", "none", "--workers", "1", "--no-bundles",
                "--no-progress", "--report", str(tmp_path / "r")]) == 0
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    assert doc["run"]["selection"]["layouts"] == "default" and doc["run"]["selection"]["contiguous"] is False
    assert {c["layout"] for c in doc["cases"]} == set(LAYOUTS)
    assert {c["mode"] for c in doc["cases"]} == {"eager", "lazy", "compiled"}
