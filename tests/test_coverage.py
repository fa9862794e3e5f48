"""Coverage of each op's declared domain (generate/coverage.py, ``rlx-conformance coverage``):
the matrix exercises every declared input rank class, attribute value class and dtype
combination of every op; declarations agree with shape inference; and the detector itself finds
a gap in a synthetic op that has one."""
from __future__ import annotations

import dataclasses
import json

import pytest

from rlx_conformance.cli.main import main
from rlx_conformance.core.errors import SpecError
from rlx_conformance.generate import coverage as cov
from rlx_conformance.generate.matrix import attr_combinations
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.spec.registry import REGISTRY, Attr, Input

REPORT = cov.matrix_coverage(all_ops())


@pytest.mark.parametrize("c", REPORT, ids=lambda c: c.op)
def test_matrix_exercises_every_declared_class(c: cov.OpCoverage) -> None:
    assert c.gaps == [], f"{c.op}: declared but never exercised by the matrix: {c.gaps}"
    assert c.stale_justifications == [], f"{c.op}: stale OpSpec.uncovered entries"
    assert all(reason.strip() for reason in c.uncovered.values())


@pytest.mark.parametrize("c", REPORT, ids=lambda c: c.op)
def test_matrix_exercises_nothing_undeclared(c: cov.OpCoverage) -> None:
    """A rank (or class) the matrix runs must be declared: a declaration never narrower than
    what the op is tested on."""
    assert c.matrix - set(c.declared) == set()


def _accepted_ranks(spec, dims=(4, 6), max_rank=5) -> set[str]:
    out = set()
    for r in range(max_rank + 1):
        for d in dims:
            shapes = ((d,) * r,)
            for attrs in attr_combinations(spec, shapes):
                try:
                    spec.validate(shapes, [spec.dtypes[0]], attrs)
                except SpecError:
                    continue
                out.add(cov.rank_class(r))
                break
    return out


SINGLE_INPUT = [s for s in all_ops() if s.generate is None and len(s.inputs) == 1 and not s.inputs[0].variadic]


@pytest.mark.parametrize("spec", SINGLE_INPUT, ids=lambda s: s.name)
def test_declared_ranks_not_narrower_than_validate(spec) -> None:
    """Every rank that shape inference accepts (with the op's swept attributes) is declared."""
    declared = set(cov.declared_rank_classes(spec.inputs[0]))
    assert _accepted_ranks(spec) <= declared


def test_restricted_declarations_match_validate() -> None:
    """Ops that declare a restriction reject the ranks outside it."""
    assert _accepted_ranks(get_op("trilu")) == {"2", "3+"}
    assert "0" not in _accepted_ranks(get_op("sort"))
    assert _accepted_ranks(get_op("pool")) == {"3+"}
    with pytest.raises(SpecError):
        get_op("mat_mul").validate([(), (3,)], ["float32", "float32"])


def test_declared_rank_classes() -> None:
    assert cov.declared_rank_classes(Input("x")) == ["0", "1", "2", "3+"]
    assert cov.declared_rank_classes(Input("x", ranks=(1, 1))) == ["1"]
    assert cov.declared_rank_classes(Input("x", ranks=(2, None))) == ["2", "3+"]
    assert cov.declared_rank_classes(Input("x", ranks=(4, 5))) == ["3+"]


def test_value_classes() -> None:
    axis = Attr("axis", "int", default=0, sweep="axis")
    assert {cov.value_class(axis, v) for v in (0, 2, -1)} == {"non-negative", "negative"}
    n = Attr("n", "int", default=0, sweep=(0, 3))
    assert [cov.value_class(n, v) for v in (-2, 0, 3)] == ["negative", "zero", "positive"]
    f = Attr("f", "float", default=0.0)
    assert [cov.value_class(f, v) for v in (float("nan"), float("-inf"), 0.5)] == ["nan", "-inf", "positive"]
    t = Attr("t", "ints", default=())
    assert [cov.value_class(t, v) for v in ((), (0, 1), (1, -1))] == ["empty", "non-negative", "negative"]
    assert cov.value_class(Attr("b", "bool", default=False), True) == "true"


# -- the detector on synthetic ops ----------------------------------------------------------------
def _synthetic(monkeypatch, **changes):
    """relu under a new name, with ``changes``, registered for the test only."""
    spec = dataclasses.replace(get_op("relu"), name="test.coverage_synthetic", **changes)
    monkeypatch.setitem(REGISTRY._ops, spec.name, spec)
    return spec


def test_detector_reports_a_missing_rank(monkeypatch) -> None:
    # trilu's families hold rank-2 and rank-3 data only; relu accepts every rank
    spec = _synthetic(monkeypatch, shapes="trilu")
    (c,) = cov.matrix_coverage([spec])
    assert c.gaps == ["rank:x=0", "rank:x=1"]
    assert {"rank:x=2", "rank:x=3+"} <= c.matrix


def test_detector_honours_declared_ranges_and_reasons(monkeypatch) -> None:
    spec = _synthetic(monkeypatch, shapes="trilu", inputs=(Input("x", ranks=(1, None)),),
                      uncovered=(("rank:x=1", "a reason"), ("rank:x=2", "stale")))
    (c,) = cov.matrix_coverage([spec])
    assert "rank:x=0" not in c.declared
    assert c.gaps == []
    assert c.stale_justifications == ["rank:x=2"]


def test_detector_reports_attribute_and_dtype_gaps(monkeypatch) -> None:
    spec = _synthetic(monkeypatch, attrs=(Attr("flag", "bool", default=False, sweep=(False,)),),
                      inputs=(Input("x", dtypes=("float32", "float64")),), dtypes=("float32",))
    (c,) = cov.matrix_coverage([spec])
    # the matrix gives an input with dtype alternatives its first one only
    assert c.gaps == ["attr:flag=true", "dtype/x=float32:float64"]


# -- the command ------------------------------------------------------------------------------------
def test_command_summary_and_detail(capsys) -> None:
    assert main(["coverage"]) == 0
    text = capsys.readouterr().out
    assert "no gaps" in text and "onnx.GatherElements" in text
    assert main(["coverage", "onnx.Gather*"]) == 0
    text = capsys.readouterr().out
    assert "onnx.GatherND: " in text and "rank:data" in text


def test_command_gap_exits_1_with_whole_lines(monkeypatch, capsys) -> None:
    _synthetic(monkeypatch, shapes="trilu", attrs=(Attr("a_long_attribute_name_for_width", "int",
                                                       default=0, sweep=(0, -1, 3, 4)),))
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["coverage", "test.coverage_synthetic"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "  gap: test.coverage_synthetic rank:x=0" in lines
    assert "  gap: test.coverage_synthetic rank:x=1" in lines
    assert main(["coverage"]) == 1
    assert "gap: test.coverage_synthetic rank:x=0" in capsys.readouterr().out.splitlines()


def test_command_json(monkeypatch, capsys) -> None:
    assert main(["coverage", "gather", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/coverage/v1" and doc["gaps"] == 0
    (g,) = doc["ops"]
    assert {"rank:x=1", "rank:x=2", "rank:indices=3+", "dtype/indices=bool:int32"} <= set(g["matrix"])
    assert g["fuzz"] is None
    _synthetic(monkeypatch, shapes="trilu")
    assert main(["coverage", "test.coverage_synthetic", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["gaps"] == 2 and doc["ops"][0]["gaps"] == ["rank:x=0", "rank:x=1"]


def test_command_fuzz_sampling_is_deterministic(capsys) -> None:
    pytest.importorskip("hypothesis")
    docs = []
    for _ in range(2):
        assert main(["coverage", "onnx.GatherND", "--fuzz", "8", "--format", "json"]) == 0
        docs.append(json.loads(capsys.readouterr().out)["ops"][0]["fuzz"])
    assert docs[0] == docs[1] and docs[0]


def test_command_bad_input(capsys) -> None:
    assert main(["coverage", "gathr"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlx-conformance: error: no op matches 'gathr'")
    assert main(["coverage", "--fuzz", "-1"]) == 2


def test_html_report_has_a_collapsed_coverage_section(monkeypatch, tmp_path) -> None:
    from results_fixtures import result, write

    from rlx_conformance.report import html as report_html
    from rlx_conformance.report import records

    _synthetic(monkeypatch, shapes="trilu")
    rep = records.load(write(tmp_path / "rep", [result("test.coverage_synthetic"), result("one_hot")]))
    docs = cov.coverage_of_run(r["op"] for r in rep.cases)
    assert [d["op"] for d in docs] == ["one_hot", "test.coverage_synthetic"]
    html = report_html.render(rep, with_plots=False, coverage=docs)
    section = html[html.index('<section class="card" id="coverage">'):]
    section = section[:section.index("</section>")]
    assert 'href="#coverage"' in html and "1 op with gaps" in html
    assert "<details><summary>1 op with classes the matrix never exercises" in section
    assert "test.coverage_synthetic" in section and "rank:x=0 rank:x=1" in section
    assert "one_hot" in section and "rank:indices=0" in section  # one_hot's justified class, with its reason
    clean = records.load(write(tmp_path / "clean", [result("exp")]))
    assert "No gaps" in report_html.render(clean, with_plots=False, coverage=cov.coverage_of_run(["exp"]))
    assert 'id="coverage"' not in report_html.render(clean, with_plots=False)


def test_report_command_renders_coverage(tmp_path) -> None:
    from results_fixtures import result, write

    report = write(tmp_path / "rep", [result("exp")])
    assert main(["report", str(report), "--no-plots"]) == 0
    assert 'id="coverage"' in (report / "report.html").read_text()
