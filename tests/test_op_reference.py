"""The op reference: docs/ops.md is the registry's current rendering, and ``ops OP --explain``
shows every fact about an op with a location that points at where it is written."""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

import pytest

import rlx_conformance
from rlx_conformance.cli.main import main
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.report import op_reference
from rlx_conformance.report.op_facts import builtin_ops, op_facts

ROOT = Path(__file__).resolve().parent.parent
EXPLAINED = ("exp", "add", "gather", "onnx.GatherND", "dense_solve", "reduce_sum", "attention")


def test_docs_ops_md_is_current():
    """The committed page equals what the registry renders now (regenerate when it fails)."""
    path = op_reference.doc_path(ROOT)
    want = op_reference.markdown(builtin_ops(all_ops()))
    have = path.read_text(encoding="utf-8") if path.exists() else ""
    if have != want:
        first = next((n for n, (a, b) in enumerate(zip(have.splitlines(), want.splitlines()), 1) if a != b),
                     min(len(have.splitlines()), len(want.splitlines())) + 1)
        pytest.fail(f"{op_reference.DOC} is out of date with the op registry (from line {first}); "
                    f"regenerate it with: {op_reference.COMMAND}", pytrace=False)


def test_reference_covers_every_builtin_op():
    page = op_reference.markdown(builtin_ops(all_ops()))
    for spec in builtin_ops(all_ops()):
        assert f"### `{spec.name}`" in page
    assert op_reference.COMMAND in "\n".join(page.splitlines()[:3])


def _resolve(location: str) -> tuple[Path, int | None]:
    path, _, line = location.rpartition(":")
    if not line.isdigit():
        path, line = location, ""
    for root in (Path(rlx_conformance.__file__).resolve().parent.parent, Path.cwd()):
        if (root / path).exists():
            return root / path, int(line) if line else None
    p = Path(path)
    assert p.is_absolute() and p.exists(), f"{location}: no such file"
    return p, int(line) if line else None


def _locations(obj):
    """Every ``at`` in a facts dict."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "at" and v:
                yield v
            else:
                yield from _locations(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _locations(v)


@pytest.mark.parametrize("op", EXPLAINED)
def test_every_location_points_into_its_file(op):
    facts = op_facts(get_op(op))
    for loc in _locations(facts):
        path, line = _resolve(loc)
        if line is not None:
            lines = path.read_text(encoding="utf-8").splitlines()
            assert 1 <= line <= len(lines), loc
            if path.suffix == ".toml":  # a data entry: its table header or its key
                assert lines[line - 1].lstrip().startswith(("[", "key")), (loc, lines[line - 1])


def test_declaration_site_names_the_op():
    for op in ("onnx.GatherND", "rlx_sparse.cg_solve", "gather", "dense_solve"):
        path, line = _resolve(op_facts(get_op(op))["at"])
        text = path.read_text(encoding="utf-8").splitlines()[line - 1]
        assert op in text or "declare(" in text or "custom_op(" in text, (op, text)


def _entry(location: str) -> str:
    """The data entry at ``location``: its header line and the few lines after it."""
    path, line = _resolve(location)
    return "\n".join(path.read_text(encoding="utf-8").splitlines()[line - 1:line + 4])


@pytest.mark.parametrize("op", ("exp", "add", "reduce_sum", "softmax"))
def test_tolerance_and_budget_entries_are_the_matching_ones(op):
    """Each tolerance points at the entry its source names (tolerance_for's source): a dtype
    default, an override naming the op, or [from_budget] listing it; each budget at an entry of
    cases/accuracy.toml with its reason."""
    facts = op_facts(get_op(op))
    assert facts["judge"]["tolerances"]
    for d, t in facts["judge"]["tolerances"].items():
        entry, kind = _entry(t["at"]), t["source"].partition(":")[0]
        assert t["reason"], (d, t)
        if kind == "default":
            assert entry.startswith(f"[defaults.{d}]"), (d, entry)
        elif kind == "override":
            assert re.search(r'op\s*=\s*"([^"]*)"', entry), (d, entry)
        else:
            assert entry.startswith("[from_budget]") and f'"{op}"' in entry, (d, entry)
    for d, b in facts["oracles"]["precise"]["budgets"].items():
        assert b["reason"] and re.match(r"(rlx_conformance/)?cases/accuracy\.toml:\d+$", b["at"]), (d, b)
        assert _entry(b["at"]).startswith(("[[budget]]", "[low_precision]")), (d, b)


def test_divergences_are_the_ones_whose_op_globs_match():
    for op in EXPLAINED:
        for d in op_facts(get_op(op))["divergences"]:
            assert any(fnmatch.fnmatchcase(op, g) for g in d["ops"]), (op, d)
            assert d["category"] and d["reason"]


def test_judges_and_oracles():
    f = op_facts(get_op("dense_solve"))
    assert f["judge"]["kind"] == "check" and f["judge"]["check"]["reason"]
    assert f["judge"]["tolerances"] == {}
    f = op_facts(get_op("reduce_sum"))
    assert f["judge"]["kind"] == "bound" and f["judge"]["bound"]["at"]
    assert f["oracles"]["precise"]["available"]
    f = op_facts(get_op("onnx.GatherND"))
    assert f["oracles"]["onnx"]["op_type"] == "GatherND"
    assert f["codec"] == [{"attr": "batch_dims", "format": "i32", "codes": None}]
    assert f["judge"]["exact"] and not f["oracles"]["precise"]["available"]


def test_explain_plain_output(capsys):
    assert main(["ops", "exp", "--explain"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("exp — ")
    for section in ("declaration:", "kernels:", "judge:", "oracles:", "known divergences ("):
        assert section in out
    for data in ("tolerances.toml:", "shapes/core.toml:", "domains/core.toml:"):  # a wheel: rlx_conformance/cases/
        assert re.search(rf"\[(rlx_conformance/)?cases/{re.escape(data)}\d+\]", out), data
    assert "numpy.exp" in out and "mlx.core.exp" in out


def test_explain_json(capsys):
    assert main(["ops", "gather", "--explain", "--format", "json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["op"] == "gather" and facts["shapes"]["families"]
    assert {"inputs", "attrs", "kernels", "judge", "oracles", "divergences"} <= set(facts)
    assert facts["kernels"]["cpu"]["kernel"] == "native"


def test_unknown_op_is_one_line_with_suggestions(capsys):
    assert main(["ops", "gatherr", "--explain"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown op 'gatherr'" in err and "gather" in err.split("did you mean")[1]


def test_listing_json_carries_declared_at(capsys):
    assert main(["ops", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in rows}
    assert re.fullmatch(r"rlx_conformance/ops/elementwise\.py:\d+", by["exp"]["declared_at"])
    assert by["onnx.GatherND"]["declared_at"].startswith("rlx_conformance/ops/custom.py:")
