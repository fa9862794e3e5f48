"""A contributor's work, as it goes: port a kernel, validate it, read what validate says, fix the
kernel, validate again — for a gather, a scatter, a reduction, an activation and a custom sparse
op (the ports are in tests/validate_kernels.py: ``*_first_try`` with the bug, ``*_fixed``; the
activation is the porting guide's pair in examples/kernels/).

Each wrong port must be rejected (exit 1) with output that points at the bug: the per-attribute
breakdown (only the attribute value at fault fails), the wrong positions with the index tuple
that produced them, the reference's and the built-in kernel's values beside the port's, and a
rerun command on a line of its own. Each fixed port must pass (exit 0). Selections are small
(one dtype, a few case ids, no speed sampling) so that each workflow runs in seconds.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlx_conformance.cli import main as cli

ROOT = Path(__file__).resolve().parent.parent
KERNELS = Path(__file__).resolve().parent / "validate_kernels.py"
EXAMPLES = ROOT / "examples" / "kernels"
FAST = ["--mode", "eager", "--workers", "1", "--speed-cases", "0", "--dtypes", "float32", "--show", "3"]


def validate(tmp_path: Path, capsys, name: str, op: str, kernel: str, *extra: str) -> tuple[int, dict, str]:
    report = tmp_path / name
    code = cli.main(["validate", op, "--kernel", kernel, "--report", str(report), *FAST, *extra])
    out = capsys.readouterr().out
    return code, json.loads((report / "validate.json").read_text()), out


def attr_row(out: str, label: str) -> list[str]:
    """The cells of the "by attribute value" table's row ``label`` (e.g. batch_dims=1)."""
    for line in out.splitlines():
        cells = [c.strip() for c in re.split(r"[│|]", line) if c.strip()]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in:\n{out}")


def positions(out: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith("output 0 at (")]


def test_gather_nd_port_wrong_for_batch_dims(tmp_path, capsys):
    """The port forgets the batch offset: the breakdown shows every batch_dims = 0 case passing
    and batch_dims > 0 failing; each wrong element names the index tuple and its batch."""
    code, doc, out = validate(tmp_path, capsys, "first", "onnx.GatherND", f"{KERNELS}:gather_nd_first_try")
    assert code == 1
    by = doc["by_attr"]["batch_dims"]
    assert by["0"].get("fail", 0) == 0 and by["0"]["pass"] > 0
    assert by["1"]["fail"] > 0 and by["2"]["fail"] > 0
    assert attr_row(out, "batch_dims=0")[1] == attr_row(out, "batch_dims=0")[2]  # run == pass
    rows = positions(out)
    assert rows and all("<- indices[" in r and "(batch (" in r for r in rows)
    assert all("reference " in r and "built-in " in r and "contributed " in r for r in rows)
    # the built-in kernel agrees with the reference where the port is wrong: the port's bug
    first = doc["worst"][0]["mismatch"]["first"][0]
    assert first["builtin"] == first["expected"] != first["actual"]
    # no ULP figure for a bit-exact gather: the wrong positions instead
    assert "max ulp" not in out.split("worst errors")[1].split("error-input parity")[0]
    code, doc, out = validate(tmp_path, capsys, "fixed", "onnx.GatherND", f"{KERNELS}:gather_nd_fixed")
    assert code == 0 and "PASS" in out, out


SCATTER_CASES = [f"onnx.ScatterND/float32/shape:4x5+6x2/reduction:{r}/vals:random/mlx-cpu-eager"
                 for r in ("none", "add", "max")]


def test_scatter_nd_port_that_assigns_instead_of_adding(tmp_path, capsys):
    """reduction "add" written as an assignment: only reduction=add fails, and a wrong cell is
    traced to the updates (and their index tuples) that write it."""
    cases = [x for c in SCATTER_CASES for x in ("--case", c)]
    code, doc, out = validate(tmp_path, capsys, "first", "onnx.ScatterND", f"{KERNELS}:scatter_nd_first_try", *cases)
    assert code == 1
    by = doc["by_attr"]["reduction"]
    assert by["add"] == {"fail": 1} and by["none"] == {"pass": 1} and by["max"] == {"pass": 1}
    rows = positions(out)
    assert rows and all("<- written by updates[" in r and " via indices[" in r for r in rows)
    code, _, out = validate(tmp_path, capsys, "fixed", "onnx.ScatterND", f"{KERNELS}:scatter_nd_fixed", *cases)
    assert code == 0, out


REDUCE_CASES = [f"reduce_sum/float32/shape:1031/axes:{a}/keep_dim:false/vals:random/mlx-cpu-eager"
                for a in ("all", "0", "-1")]


def test_reduce_sum_port_that_drops_the_last_element(tmp_path, capsys):
    """Off by one on axis -1 only: the breakdown pins it on axes=-1; a reduction's error is a
    rounded value, so the figures are ULP/relative ones, with the values beside."""
    cases = [x for c in REDUCE_CASES for x in ("--case", c)]
    code, doc, out = validate(tmp_path, capsys, "first", "reduce_sum", f"{KERNELS}:reduce_sum_first_try", *cases)
    assert code == 1
    by = doc["by_attr"]["axes"]
    assert by["-1"] == {"fail": 1} and by["all"] == {"pass": 1} and by["0"] == {"pass": 1}
    assert "max ulp" in out and positions(out)
    (bad,) = doc["bad"]
    rerun = f"rerun: {bad['rerun']}"
    assert any(line.strip() == rerun for line in out.splitlines())  # whole, on its own line
    code, _, out = validate(tmp_path, capsys, "fixed", "reduce_sum", f"{KERNELS}:reduce_sum_fixed", *cases)
    assert code == 0, out


def test_activation_port_broken_then_good(tmp_path, capsys):
    """The porting guide's hard_sigmoid pair: the broken port's cancellation near x = -3 shows as
    wrong values with the reference's and the built-in kernel's beside; the good one passes."""
    code, _, out = validate(tmp_path, capsys, "first", "hard_sigmoid", f"{EXAMPLES / 'broken_hard_sigmoid.py'}:hard_sigmoid")
    assert code == 1
    rows = positions(out)
    assert rows and all("reference " in r and "built-in " in r and "contributed " in r for r in rows)
    assert "<-" not in "".join(rows)  # not a gather: no index tuple
    code, _, out = validate(tmp_path, capsys, "fixed", "hard_sigmoid", f"{EXAMPLES / 'good_hard_sigmoid.py'}:hard_sigmoid")
    assert code == 0, out


MATVEC_CASES = [f"rlx_sparse.mat_vec/float32/shape:{s}/vals:{v}/mlx-cpu-eager"
                for s in ("7x5", "300x300") for v in ("random", "empty_rows")]


def test_sparse_mat_vec_port_wrong_after_empty_rows(tmp_path, capsys):
    """Row ids go wrong after an empty row: the empty_rows cases fail (and a large random matrix,
    which has empty rows too), a small one without empty rows passes; the wrong rows are listed
    with the reference's and the built-in kernel's values beside the port's."""
    cases = [x for c in MATVEC_CASES for x in ("--case", c)]
    code, doc, out = validate(tmp_path, capsys, "first", "rlx_sparse.mat_vec", f"{KERNELS}:mat_vec_first_try", *cases)
    assert code == 1
    bad = {b["id"] for b in doc["bad"]}
    assert {c for c in MATVEC_CASES if "/vals:empty_rows/" in c} <= bad
    assert MATVEC_CASES[0] not in bad  # 7x5 random: no empty row
    rows = positions(out)
    assert rows and all("built-in " in r and "contributed " in r for r in rows)
    code, _, out = validate(tmp_path, capsys, "fixed", "rlx_sparse.mat_vec", f"{KERNELS}:mat_vec_fixed", *cases)
    assert code == 0, out


@pytest.mark.parametrize("columns", ["80", "200"])
def test_case_ids_and_commands_are_never_wrapped(tmp_path, capsys, monkeypatch, columns):
    """Piped (pytest captures stdout) at any COLUMNS: every case id and rerun command is printed
    whole on one line."""
    monkeypatch.setenv("COLUMNS", columns)
    code, doc, out = validate(tmp_path, capsys, "first", "onnx.GatherND", f"{KERNELS}:gather_nd_first_try",
                              "--case", "onnx.GatherND/float32/shape:2x3x4x2+2x2x1/batch_dims:1/vals:special/mlx-cpu-eager")
    assert code == 1
    lines = [line.strip() for line in out.splitlines()]
    for b in doc["bad"]:
        assert f"1. {b['id']}" in lines
        assert f"rerun: {b['rerun']}" in lines


def test_format_json_prints_validate_json(tmp_path, capsys):
    code, doc, out = validate(tmp_path, capsys, "first", "reduce_sum", f"{KERNELS}:reduce_sum_first_try",
                              "--case", REDUCE_CASES[2], "--format", "json")
    assert code == 1 and json.loads(out) == doc


def test_html_report_of_a_validate_run_shows_validate_sections_not_lock_proposals(tmp_path, capsys):
    """``rlx-conformance report`` on a validate run: the verdict, the per-attribute breakdown,
    error-input parity, speed and fuzz sections; no tolerance-lock section (nightly-only), which
    the same results without validate.json do get."""
    code, _, _ = validate(tmp_path, capsys, "first", "reduce_sum", f"{KERNELS}:reduce_sum_first_try",
                          *[x for c in REDUCE_CASES for x in ("--case", c)])
    assert code == 1
    report = tmp_path / "first"
    assert cli.main(["report", str(report), "--out", str(tmp_path / "v.html"), "--no-plots"]) == 0
    page = (tmp_path / "v.html").read_text()
    assert 'id="validate"' in page and "reduce_sum_first_try" in page
    for heading in ("By attribute value", "Error-input parity", "Speed", "Fuzz"):
        assert f"<h3>{heading}</h3>" in page, heading
    assert "axes=-1" in page and 'id="lock"' not in page
    (report / "validate.json").unlink()
    assert cli.main(["report", str(report), "--out", str(tmp_path / "plain.html"), "--no-plots"]) == 0
    plain = (tmp_path / "plain.html").read_text()
    assert 'id="validate"' not in plain and 'id="lock"' in plain
