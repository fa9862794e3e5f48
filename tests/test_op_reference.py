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


# -- derivatives, layouts and graphs (issues 16 and 17) -----------------------------------------------
def _toml_entry(location: str) -> str:
    """The whole TOML table at ``location``: its header line up to the next table header."""
    path, line = _resolve(location)
    lines = path.read_text(encoding="utf-8").splitlines()
    end = next((n for n in range(line, len(lines)) if lines[n].startswith("[")), len(lines))
    return "\n".join(lines[line - 1:end])


def test_explain_shows_derivatives_layouts_and_graphs(capsys):
    assert main(["ops", "relu", "--explain"]) == 0
    out = capsys.readouterr().out
    for section in ("derivatives:", "layouts and graphs:"):
        assert section in out
    assert "relu'(0) = 0" in out and "gradient values also kink" in out
    assert re.search(r"\[(rlx_conformance/)?cases/derivatives\.toml:\d+\]", out)
    assert re.search(r"conv_bn_relu_pool .*\[(rlx_conformance/)?cases/graphs\.toml:\d+\]", out)
    assert main(["ops", "arg_max", "--explain"]) == 0
    out = capsys.readouterr().out
    assert f"none: {get_op('arg_max').not_differentiable}" in out


@pytest.mark.parametrize("op", ["relu", "gelu", "pow", "gather", "reduce_max", "cum_prod", "mat_mul"])
def test_derivative_facts_point_at_their_declarations(op):
    """Differentiable inputs are the registry's; the derivative kinds are the ones the matrix
    makes; each cases/derivatives.toml table shown names the op by a glob and holds the
    roundings shown, and the [[rule]] is the first whose globs match (else [default]); the
    convention's location is the line its text starts on."""
    spec = get_op(op)
    d = op_facts(spec)["derivatives"]
    assert d["differentiable"] and d["inputs"] == [i.name for i in spec.inputs if spec.input_differentiable(i)]
    assert list(d["cases"]) == list(spec.derivative_kinds()) and all(n > 0 for n in d["cases"].values())
    for key, e in d["bound"].items():
        if key == "native" or e is None:
            continue
        entry = _toml_entry(e["at"])
        assert entry.startswith(e["table"]) and re.search(rf"^roundings\s*=\s*{e['roundings']}\s*$", entry, re.M)
        if e["table"] != "[default]":
            assert any(fnmatch.fnmatchcase(op, g) for g in re.findall(r'"([^"]+)"', entry.split("reason")[0]))
    text = (ROOT / "cases" / "derivatives.toml").read_text(encoding="utf-8")
    rule = d["bound"]["rule"]  # [default] only where no [[rule]] matches
    earlier = text if rule["table"] == "[default]" else text[:text.index(_toml_entry(rule["at"]))]
    for block in earlier.split("\n[[rule]]\n")[1:]:  # each [[rule]]'s ops, up to its reason
        assert not any(fnmatch.fnmatchcase(op, g) for g in re.findall(r'"([^"]+)"', block.split("reason")[0]))
    if d["convention"]:
        path, line = _resolve(d["convention"]["at"])
        assert " ".join(d["convention"]["text"].split()[:3]) in path.read_text(encoding="utf-8").splitlines()[line - 1]


def test_derivative_bound_tables_per_op():
    facts = {op: op_facts(get_op(op))["derivatives"]["bound"] for op in ("gather", "gelu", "pow", "exp")}
    assert facts["gather"]["native"] and facts["gather"]["rule"]["roundings"] == 1
    assert facts["gelu"]["argument"] and not facts["gelu"]["overflow"]
    assert facts["pow"]["argument"] and facts["pow"]["overflow"]
    assert facts["exp"]["rule"]["table"] == "[default]" and not facts["exp"]["argument"]


def test_graphs_are_the_ones_with_a_node_of_the_op():
    """Each graph shown has a node ``op = "gelu"`` in its cases/graphs.toml entry; no graph left
    out has one."""
    text = (ROOT / "cases" / "graphs.toml").read_text(encoding="utf-8")
    using = {re.search(r'^name\s*=\s*"([^"]+)"', block, re.M).group(1)
             for block in text.split("[[graph]]")[1:] if re.search(r'op\s*=\s*"gelu"', block)}
    gs = op_facts(get_op("gelu"))["graphs"]
    assert using and {g["graph"] for g in gs} == using
    for g in gs:
        assert _toml_entry(g["at"]).startswith("[[graph]]") and f'name = "{g["graph"]}"' in _toml_entry(g["at"])


def test_layouts_of_structured_inputs_leave_out_broadcast():
    exp, gather = (op_facts(get_op(op))["layouts"] for op in ("exp", "gather"))
    assert "broadcast" in exp["default"] and exp["dtype"] == "float32" and exp["cases"] > 0
    assert gather["structured"] and gather["default"] and "broadcast" not in gather["default"]


def test_reference_page_states_derivatives_layouts_and_graphs():
    page = op_reference.markdown(builtin_ops(all_ops()))
    sections = page.split("\n### `")[1:]
    assert sections and all("\n- **derivatives**: " in s and "\n- **layouts**: " in s for s in sections)
    by = {s.split("`", 1)[0]: s for s in sections}
    assert f"- **derivatives**: none: {get_op('arg_max').not_differentiable}" in by["arg_max"]
    assert "relu'(0) = 0" in by["relu"] and "`conv_bn_relu_pool` (VJP)" in by["relu"]
    pow_ = by["pow"].split("- **derivatives**: ")[1].splitlines()[0]
    assert pow_.startswith("vjp, jvp in") and "[[argument]]" in pow_ and "[[overflow]]" in pow_
