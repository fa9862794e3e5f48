"""Derivative cases (issue 16) in every run path: ``run --grad`` (and ``list``, ``nightly``, the
pytest plugin's ``--rlx-grad``) selects them, results.json records the selection, shards split
and merge them like forward cases, ``--case``/``-k`` select them by id, ``--repeat`` records their
digests, and a known divergence scoped to a derivative is judged stale, or warned of, only by a
run that held that derivative.

The runs are real and small (tanh, float32, MLX's compiled mode on the CPU); the staleness checks
judge records made without MLX under entries of this module's own (known_divergences patched)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlx_conformance.cli import main as cli
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import GRAD_KINDS, Target
from rlx_conformance.judge import divergences as kd
from rlx_conformance.judge.divergences import Divergence
from rlx_conformance.report.diff import Selection, compare
from rlx_conformance.report.records import load
from rlx_conformance.run import outcomes
from rlx_conformance.run.session import build_cases, grad_kinds

ROOT = Path(__file__).resolve().parent.parent
TARGET = Target("mlx", "cpu", "compiled")
RUN = ["run", "--ops", "tanh", "--dtypes", "f32", "--mode", "compiled", "--no-progress", "--no-bundles"]


def _ids(cases) -> list[str]:
    return sorted(c.id for c in cases)


def _doc(report: Path) -> dict:
    return json.loads((report / "results.json").read_text())


@pytest.mark.parametrize(("value", "kinds"), [
    ("all", GRAD_KINDS), (None, GRAD_KINDS), ("none", ()), ("vjp", ("vjp",)), ("hvp,vjp", ("vjp", "hvp")),
    (["jvp", "vjp"], ("vjp", "jvp")), ("VJP, jvp", ("vjp", "jvp"))])
def test_grad_option_values(value, kinds):
    assert grad_kinds(value) == kinds


@pytest.mark.parametrize("value", ["grad", "vjp,foo", "none,vjp", "all,jvp", "", ","])
def test_a_bad_grad_option_is_a_one_line_error(value, capsys):
    with pytest.raises(RlxError, match="--grad wants all, none or derivative kinds"):
        grad_kinds(value)
    assert cli.main(["list", "--ops", "tanh", "--grad", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlx-conformance: error: --grad wants") and len(err.splitlines()) == 1


def test_list_holds_the_derivative_cases_grad_selects(capsys):
    # as `list` builds them by default: with the memory-layout cases (--layouts default)
    fwd = build_cases([TARGET], ["tanh"], ["float32"], layouts="default")
    every = build_cases([TARGET], ["tanh"], ["float32"], grads=GRAD_KINDS, layouts="default")
    kinds = {c.grad for c in every}
    assert {"vjp", "jvp"} <= kinds and all(c.grad == "" for c in fwd)
    assert cli.main(["list", "--ops", "tanh", "--dtypes", "f32", "--mode", "compiled"]) == 0  # default: all
    assert sorted(capsys.readouterr().out.split()) == _ids(every)
    assert cli.main(["list", "--ops", "tanh", "--dtypes", "f32", "--mode", "compiled", "--grad", "none"]) == 0
    assert sorted(capsys.readouterr().out.split()) == _ids(fwd)
    assert cli.main(["list", "--ops", "tanh", "--dtypes", "f32", "--mode", "compiled", "--grad", "jvp",
                     "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {c["grad"] for c in doc["cases"]} == {"", "jvp"}
    assert doc["count"] == sum(1 for c in every if c.grad in ("", "jvp"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """tanh float32 compiled: whole with --grad vjp,jvp, with --grad none, as 2 shards (merged),
    and --repeat 2 of two derivative cases."""
    root = tmp_path_factory.mktemp("grad")
    codes = {"whole": cli.main([*RUN, "--grad", "vjp,jvp", "--workers", "1", "--report", str(root / "whole")]),
             "none": cli.main([*RUN, "--grad", "none", "--workers", "0", "--report", str(root / "none")])}
    for i in (1, 2):
        codes[f"s{i}"] = cli.main([*RUN, "--grad", "vjp,jvp", "--shard", f"{i}/2", "--workers", "1",
                                   "--report", str(root / f"s{i}")])
    codes["merged"] = cli.main(["merge", str(root / "merged"), str(root / "s1"), str(root / "s2")])
    return root, codes


def test_run_grad_runs_and_records_the_derivative_cases(runs):
    root, codes = runs
    assert codes["whole"] == 0 and codes["none"] == 0
    whole, none = _doc(root / "whole"), _doc(root / "none")
    want = build_cases([TARGET], ["tanh"], ["float32"], grads=("vjp", "jvp"), layouts="default")
    assert sorted(c["id"] for c in whole["cases"]) == _ids(want)
    assert {c["grad"] for c in whole["cases"]} == {"", "vjp", "jvp"}
    assert all(c["outcome"] == "pass" for c in whole["cases"])
    grad_recs = [c for c in whole["cases"] if c["grad"]]
    assert all(f"/grad:{c['grad']}/" in c["id"] for c in grad_recs)
    assert whole["run"]["selection"]["grad"] == ["vjp", "jvp"]
    assert none["run"]["selection"]["grad"] == []
    assert {c["grad"] for c in none["cases"]} == {""}
    assert sorted(c["id"] for c in none["cases"]) == sorted(c.id for c in want if not c.grad)


def test_derivative_cases_shard_and_merge_to_the_whole_run(runs):
    root, codes = runs
    assert codes["s1"] == 0 and codes["s2"] == 0 and codes["merged"] == 0
    s1, s2, whole, merged = (_doc(root / n) for n in ("s1", "s2", "whole", "merged"))
    assert any(c["grad"] for c in s1["cases"]) and any(c["grad"] for c in s2["cases"])
    assert not {c["id"] for c in s1["cases"]} & {c["id"] for c in s2["cases"]}
    assert sorted(c["id"] for c in merged["cases"]) == sorted(c["id"] for c in whole["cases"])
    assert {c["id"]: c["grad"] for c in merged["cases"]} == {c["id"]: c["grad"] for c in whole["cases"]}
    assert merged["run"]["selection"]["grad"] == ["vjp", "jvp"] and merged["run"]["selection"]["shard"] is None


def test_shards_of_another_grad_selection_do_not_merge(runs, tmp_path, capsys):
    root, _ = runs
    assert cli.main([*RUN, "--grad", "none", "--shard", "2/2", "--workers", "0", "--report", str(tmp_path / "s2")]) == 0
    capsys.readouterr()
    assert cli.main(["merge", str(tmp_path / "out"), str(root / "s1"), str(tmp_path / "s2")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--grad is vjp,jvp in " in err and "but none in " in err and len(err.splitlines()) == 1


def test_a_forward_only_run_is_a_subset_of_a_baseline_with_derivatives(runs):
    """diff: the baseline's derivative cases are outside a --grad none run's selection (counted,
    not listed as removed); the derivative kinds are read from run.selection, or the records."""
    root, _ = runs
    base, new = load(root / "whole"), load(root / "none")
    d = compare(base, new)
    n_grad = sum(1 for c in base.cases if c["grad"])
    assert d.removed == [] and d.not_in_subset == n_grad > 0 and d.subset.grads == ()
    assert d.to_json()["subset"]["grad"] == []
    sel = Selection.of(base)
    assert sel.grads == ("vjp", "jvp") and all(sel.holds(c) for c in base.cases)
    assert not Selection(grads=("jvp",)).holds(next(c for c in base.cases if c["grad"] == "vjp"))
    assert "derivatives vjp, jvp" in sel.describe()
    base.run.pop("selection")
    assert Selection.of(base).grads == ("jvp", "vjp") and not Selection.of(base).recorded


def test_a_derivative_case_runs_by_id_and_repeats(tmp_path, capsys):
    case = next(c for c in build_cases([TARGET], ["tanh"], ["float32"], grads=("vjp",)) if c.grad)
    report = tmp_path / "rep"
    assert cli.main(["run", "--case", case.id.replace("/float32/", "/f32/"), "--repeat", "2", "--workers", "0",
                     "--no-progress", "--report", str(report)]) == 0
    (rec,) = _doc(report)["cases"]
    assert rec["id"] == case.id and rec["grad"] == "vjp" and rec["outcome"] == "pass"
    assert len(rec["repeat_digests"]) == 2 and len(set(rec["repeat_digests"])) == 1
    capsys.readouterr()
    typo = case.id.replace("grad:vjp", "grad:vjq")
    assert cli.main(["run", "--case", typo, "--workers", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"did you mean '{case.id}'" in err


# -- the pytest plugin ----------------------------------------------------------------------------
def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "conformance.toml").write_text(
        '[matrix]\nbackend = "mlx"\ndevices = "cpu"\nmodes = ["compiled"]\nops = ["tanh"]\n'
        'dtypes = ["float32"]\ngrad = "vjp"\nlayouts = "none"\n')  # the derivative cases and their forward twins only
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", str(tmp_path / "conformance.toml"), "-p", "no:cacheprovider",
                           "-q", "--rlx-workers", "1", *args], check=False, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_plugin_runs_derivative_cases_selected_by_k(tmp_path):
    pytest.importorskip("mlx.core")
    every = build_cases([TARGET], ["tanh"], ["float32"], grads=("vjp",))
    n_vjp = sum(1 for c in every if c.grad == "vjp")
    proc = _pytest(tmp_path, "-k", "grad:vjp", f"--rlx-report={tmp_path / 'rep'}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"{n_vjp} passed, {len(every) - n_vjp} deselected" in proc.stdout
    recs = _doc(tmp_path / "rep")["cases"]
    assert len(recs) == n_vjp and {r["grad"] for r in recs} == {"vjp"}


def test_the_plugin_option_mirrors_grad(tmp_path):
    proc = _pytest(tmp_path, "--collect-only", "--rlx-grad", "none")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "/grad:" not in proc.stdout and "tanh/float32/" in proc.stdout
    proc = _pytest(tmp_path, "--collect-only", "--rlx-grad", "jvp")
    assert "/grad:jvp/" in proc.stdout and "/grad:vjp/" not in proc.stdout
    proc = _pytest(tmp_path, "--collect-only", "--rlx-grad", "bogus")
    assert proc.returncode != 0 and "--grad wants all, none or derivative kinds" in proc.stdout


# -- staleness of entries scoped to a derivative --------------------------------------------------
ON_VJP = Divergence(key="tanh-vjp", op=("tanh",), dtype=("float32",), category="precision", reason="r", grad="vjp",
                    excuses=frozenset({"value"}), max_ulp=16)
ON_ALL = Divergence(key="sigmoid-all-derivatives", op=("sigmoid",), dtype=("float32",), category="precision",
                    reason="r",
                    grad="?*", excuses=frozenset({"value"}), max_ulp=16)


@pytest.fixture
def entries(monkeypatch):
    table = (ON_VJP, ON_ALL)
    monkeypatch.setattr(kd, "divergences", lambda: table)


def _passing(grads, ops=("tanh", "sigmoid")) -> list[CaseResult]:
    cases = build_cases([TARGET], list(ops), ["float32"], grads=grads)
    return [outcomes.apply_divergence(c, CaseResult.for_case(c, "pass")) for c in cases]


def test_a_forward_run_neither_stales_nor_warns_of_a_derivative_entry(entries):
    recs = _passing(())
    assert outcomes.finalize(recs) == [] and {r.outcome for r in recs} == {"pass"}
    assert not any(r.divergence for r in recs)


def test_a_run_of_the_entry_s_derivative_calls_it_stale(entries):
    recs = _passing(("vjp",))
    assert outcomes.finalize(recs) == []
    stale = {r.id for r in recs if r.outcome == "xpass"}
    assert stale and stale == {r.id for r in recs if r.op == "tanh" and r.grad == "vjp"}
    # sigmoid's entry spans every derivative kind: a run of vjp alone did not hold its jvp cases
    assert not any(r.outcome == "xpass" for r in recs if r.op == "sigmoid")
    recs = _passing(GRAD_KINDS)
    assert outcomes.finalize(recs) == []
    assert {r.id for r in recs if r.outcome == "xpass"} == {
        r.id for r in recs if r.grad == "vjp" and r.op == "tanh" or r.grad and r.op == "sigmoid"}


def test_a_run_of_other_derivatives_is_silent_and_a_held_one_that_matched_nothing_warns(entries):
    recs = _passing(("jvp",))
    assert outcomes.finalize(recs) == [] and not any(r.outcome == "xpass" for r in recs if r.op == "tanh")
    # the control: the run held tanh's vjp cases, but no record names the entry (judged under
    # another): it warns; the same cases not selected (--sample-grad, a shard) say nothing
    held = _passing(("vjp",))
    for r in held:
        if r.op == "tanh" and r.grad:
            r.divergence = None
    assert outcomes.finalize(held) == ["known divergence tanh-vjp (tanh) matched no case"]
    kept = [r for r in _passing(("vjp",)) if not (r.op == "tanh" and r.grad)]
    assert outcomes.finalize(kept) == []
