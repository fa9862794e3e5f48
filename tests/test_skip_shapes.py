"""``run --skip-shapes huge`` (session.skip_shapes, issue 18 item 1): `tox -e mlx` and the tests'
matrix leave the 10^6-element shape families to the nightly. What is left out is exactly the
named families, every target alike; the run records it, and diff, merge and the stale-entry
check count those cases as outside the run, not as removed or unmatched."""
from __future__ import annotations

import configparser
import json
import math
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from results_fixtures import result, write

from rlx_conformance.cli.main import main
from rlx_conformance.cli.options import SKIP_SHAPES_TOX
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.matrix import Target
from rlx_conformance.report import records
from rlx_conformance.report.diff import compare
from rlx_conformance.run import session
from rlx_conformance.run.merge import Shard, check_selections

ROOT = Path(__file__).parent.parent
TARGETS = [Target("mlx", "cpu", m) for m in ("lazy", "compiled")]


@pytest.fixture(scope="module")
def cases():
    return session.build_cases(TARGETS, ops=["reduce_sum", "softmax", "attention", "rlx_sparse.mat_vec", "exp"],
                               dtypes=["float32"])


def test_it_leaves_out_exactly_the_named_families(cases):
    kept = session.skip_shapes(cases, [SKIP_SHAPES_TOX])
    assert [c for c in cases if c.family != "huge"] == kept  # the rest, in matrix order
    assert len(kept) < len(cases)
    # every op keeps its cases of other families, the sparse ops' 10^4 x 10^4 logical CSR shape too
    assert {c.op for c in kept} == {c.op for c in cases}
    assert any(c.op == "rlx_sparse.mat_vec" and c.family == "large" for c in kept)
    # what it cuts is the 10^6-element operands
    assert all(max(math.prod(s) for s in c.shapes) >= 10**6 for c in cases if c.family == "huge")
    assert session.skip_shapes(cases, None) == list(cases) == session.skip_shapes(cases, [])
    assert session.skip_shapes(cases, ["huge*", "large*"]) == [c for c in cases
                                                               if not c.family.startswith(("huge", "large"))]


def test_a_glob_that_names_no_family_is_an_error_not_a_silent_no_op(cases, capsys):
    """A typo (``hgue``) would skip nothing and run the 10^6-element cases the user meant to leave
    out; it is a one-line error with the closest names. Graph shape sets count as families."""
    with pytest.raises(RlxError, match=r"no shape family matches 'hgue' \(did you mean huge"):
        session.skip_shapes(cases, ["huge", "hgue"])
    assert session.skip_shapes(cases, ["s1"]) == list(cases)  # a graph's shape set: valid, none here
    assert main(["run", "--ops", "relu", "--skip-shapes", "hgue", "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no shape family matches 'hgue'" in err[0]


def test_run_records_it_and_holds_no_such_case(tmp_path, capsys):
    """The run holds the other families' cases only, records the globs in run.selection, and the
    known-divergence item scoped to the huge cases (cumsum's float32 sequential-sum entry, whose
    ``*/shape:1000003/*`` item holds them) is not warned about as matching no case. One worker
    process, not in-process (``--workers 0``): a case that hangs in MLX is timed out there."""
    report = tmp_path / "r"
    code = main(["run", "--ops", "cumsum", "--dtypes", "float32", "--mode", "lazy", "--grad", "none",
                 "--layouts", "none", "--skip-shapes", "huge", "--workers", "1", "--no-bundles",
                 "--no-progress", "--report", str(report)])
    err = capsys.readouterr().err
    doc = json.loads((report / "results.json").read_text())
    expected = session.skip_shapes(session.build_cases([Target("mlx", "cpu", "lazy")], ops=["cumsum"],
                                                       dtypes=["float32"]), ["huge"])
    assert sorted(r["id"] for r in doc["cases"]) == sorted(c.id for c in expected)
    assert any(c.family == "huge" for c in session.build_cases([Target("mlx", "cpu", "lazy")], ops=["cumsum"],
                                                              dtypes=["float32"]))
    assert doc["run"]["selection"]["skip_shapes"] == ["huge"]
    assert code == 0, err
    assert "matched no case" not in err and not any("matched no case" in w for w in doc["run"].get("warnings", []))


def test_diff_counts_the_skipped_families_as_outside_the_run(tmp_path):
    huge = [replace(result(n=k), family="huge", id=result(n=k).id.replace("shape:", "shape:1000003x")) for k in (1, 2)]
    base = [result(n=k) for k in (1, 2, 3)] + huge
    new = [result(n=1), result(n=2)]
    sel = {"ops": None, "dtypes": None, "grad": [], "backend": ["mlx"], "devices": ["cpu"], "modes": ["eager"],
           "tf32": "env", "sample": 1, "case": None, "cases_dir": None}
    meta = {"start": "2026-01-01T00:00:00+00:00", "targets": ["mlx-cpu-eager"]}
    b = records.load(write(tmp_path / "base", base))
    skipped = compare(b, records.load(write(tmp_path / "new", new, {**meta, "selection": {**sel, "skip_shapes": ["huge"]}})))
    assert skipped.removed == [result(n=3).id] and skipped.not_in_subset == 2
    whole = compare(b, records.load(write(tmp_path / "all", new, {**meta, "selection": sel})))
    assert sorted(whole.removed) == sorted([result(n=3).id, *(r.id for r in huge)])


def test_merge_refuses_shards_that_skip_different_families():
    def shard(skip):
        sel = {"ops": None, "sample": 1, **({"skip_shapes": skip} if skip else {})}
        return Shard(path=Path(f"/s{skip}/results.json"), run={"selection": sel}, cases=[])

    check_selections([shard(["huge"]), shard(["huge"])])
    with pytest.raises(RlxError, match="--skip-shapes"):
        check_selections([shard(["huge"]), shard(None)])


def test_tox_mlx_and_the_tests_matrix_skip_the_documented_families_and_the_nightly_none():
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    assert f"--skip-shapes {SKIP_SHAPES_TOX} " in ini["testenv:mlx"]["commands"]
    assert "--skip-shapes" not in ini["testenv:nightly"]["commands"]
    with (ROOT / "tests" / "conformance.toml").open("rb") as f:
        assert tomllib.load(f)["matrix"]["skip_shapes"] == [SKIP_SHAPES_TOX]


def test_a_graphs_only_run_skips_as_it_records(tmp_path, capsys):
    """``--ops 'graph:*'`` takes the graphs-only path of cmd_run; --skip-shapes applies there too
    (it was recorded in run.selection but not applied: diff would then have counted the graph
    cases of the skipped sets as outside a run that held them)."""
    report = tmp_path / "g"
    code = main(["run", "--ops", "graph:rms_norm_matmul", "--dtypes", "float32", "--mode", "lazy", "--grad", "none",
                 "--skip-shapes", "wide", "--workers", "1", "--no-bundles", "--no-progress",
                 "--report", str(report)])
    capsys.readouterr()
    doc = json.loads((report / "results.json").read_text())
    assert code == 0 and doc["cases"], doc["summary"]
    assert doc["run"]["selection"]["skip_shapes"] == ["wide"]
    assert {c["family"] for c in doc["cases"]} and all(c["family"] != "wide" for c in doc["cases"])
