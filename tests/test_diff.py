"""The baseline diff: new failures, fixed, added/removed, error drift, distribution drift, and the
exit status of ``rlx-conformance diff`` (1 on regressions only)."""
from __future__ import annotations

import json

import pytest
from grad_fixtures import derivative, dgroup
from results_fixtures import group, result, write

from rlx_conformance.cli import main as cli
from rlx_conformance.report import records
from rlx_conformance.report.diff import Thresholds, compare


def diff_of(tmp_path, base, new, **kw):
    b = records.load(write(tmp_path / "base", base))
    n = records.load(write(tmp_path / "new", new))
    return compare(b, n, Thresholds(**kw))


def ids(xs):
    return sorted(x["id"] if isinstance(x, dict) else x for x in xs)


def test_outcome_transitions(tmp_path):
    pairs = {  # n: (base outcome, new outcome)
        1: ("pass", "fail"), 2: ("xfail", "crash"), 3: ("skip", "error"),  # new failures
        4: ("fail", "fail"), 5: ("fail", "timeout"),  # still bad
        6: ("fail", "pass"), 7: ("crash", "xfail"), 11: ("xfail", "pass"),  # fixed
        8: ("pass", "xfail"),  # newly excused
        12: ("skip", "xfail"),  # new, excused (did not run in BASE)
        9: ("pass", "skip"),  # other changes
        10: ("pass", "pass"),
    }
    base = [result(outcome=o, n=k) for k, (o, _) in pairs.items()] + [result(n=20)]  # 20: removed
    new = [result(outcome=o, n=k) for k, (_, o) in pairs.items()] + [result(n=30), result(outcome="xpass", n=31)]
    d = diff_of(tmp_path, base, new)
    by_n = {k: result(n=k).id for k in (*pairs, 20, 30, 31)}
    assert ids(d.new_failures) == sorted([by_n[1], by_n[2], by_n[3], by_n[31]])
    assert ids(d.fixed) == sorted([by_n[6], by_n[7], by_n[11]])
    assert ids(d.newly_excused) == [by_n[8]] and ids(d.new_excused) == [by_n[12]]
    assert d.still_bad == 2
    assert {(x["id"], x["base"], x["new"]) for x in d.outcome_changes} == {
        (by_n[5], "fail", "timeout"), (by_n[9], "pass", "skip")}
    assert d.added == sorted([by_n[30], by_n[31]]) and d.removed == [by_n[20]]
    assert d.regression
    nf = {x["id"]: x for x in d.new_failures}
    assert nf[by_n[31]]["base"] is None and nf[by_n[1]]["base"]["outcome"] == "pass"


def div(entry: str, was: str = "fail") -> dict:
    """A record's divergence field as apply_divergence writes it."""
    return {"entry": entry, "category": "precision", "reason": "why", "link": None, "was": was}


def test_pass_to_xfail_is_a_regression_alone(tmp_path):
    """A known divergence that starts excusing a case which passed is a way around the gate:
    "newly excused" fails the diff like a new failure."""
    base = [result(n=1), result(n=2)]
    new = [result(n=1), result(outcome="xfail", n=2, ulp=300.0, divergence=div("exp-ulp"))]
    d = diff_of(tmp_path, base, new)
    assert not d.new_failures and d.regression
    [x] = d.newly_excused
    assert (x["id"], x["entry"], x["was"], x["base"]["outcome"], x["new"]["max_ulp"]) == (
        result(n=2).id, "exp-ulp", "fail", "pass", 300.0)
    assert d.counts()["newly_excused"] == 1


def test_new_excused_case_gates_only_under_an_entry_the_baseline_never_named(tmp_path):
    # BASE names entry "known" (on a passing case inside its scope); NEW adds xfail cases under it
    # and under an entry no BASE record names
    base = [result(n=1, divergence=div("known")), result(n=2)]
    old_entry = [result(n=1, divergence=div("known")), result(n=2),
                 result(outcome="xfail", n=3, divergence=div("known"))]
    d = diff_of(tmp_path / "a", base, old_entry)
    assert ids(d.new_excused) == [result(n=3).id] and not d.new_excused[0]["new_entry"]
    assert not d.regression and d.counts()["new_excused_new_entry"] == 0
    new_entry = old_entry + [result(outcome="xfail", n=4, divergence=div("brand-new", was="crash"))]
    d = diff_of(tmp_path / "b", base, new_entry)
    assert [(x["id"], x["new_entry"], x["was"]) for x in d.new_excused] == [
        (result(n=3).id, False, "fail"), (result(n=4).id, True, "crash")]
    assert d.regression and ids(d.new_excused_by_new_entry) == [result(n=4).id]


def test_excused_error_drift_is_its_own_regression(tmp_path):
    """An excused case whose error grows 100x is a regression, listed apart from passing drift;
    an excused case whose error stays is none."""
    base = [result(outcome="xfail", n=1, ulp=10.0, rel=1e-6, divergence=div("e")),
            result(outcome="xfail", n=2, ulp=10.0, rel=1e-6, divergence=div("e")), result(n=3, ulp=1.0)]
    new = [result(outcome="xfail", n=1, ulp=1000.0, rel=1e-4, divergence=div("e")),
           result(outcome="xfail", n=2, ulp=10.0, rel=1e-6, divergence=div("e")), result(n=3, ulp=1.0)]
    d = diff_of(tmp_path, base, new)
    assert not d.error_drift and not d.distribution_drift
    assert {(x["id"], x["metric"], x["entry"]) for x in d.excused_drift} == {
        (result(n=1).id, "max_ulp", "e"), (result(n=1).id, "max_rel_err", "e")}
    [g] = d.excused_distribution_drift
    assert g["group"] == "exp/float32/mlx-cpu-eager" and set(g["metrics"]) == {"p99", "max"}  # 2 cases: p99 = max
    assert (g["base"]["max"], g["new"]["max"]) == (10.0, 1000.0)
    assert d.regression
    same = diff_of(tmp_path / "same", base, base)
    assert not same.excused_drift and not same.excused_distribution_drift and not same.regression


def test_excused_distribution_is_over_cases_excused_in_both_runs(tmp_path):
    """A case that became excused is listed as newly excused, not as drift of the group's excused
    errors besides."""
    base = [result(outcome="xfail", n=1, ulp=10.0, divergence=div("e")), result(n=2, ulp=0.0)]
    new = [result(outcome="xfail", n=1, ulp=10.0, divergence=div("e")),
           result(outcome="xfail", n=2, ulp=1e6, divergence=div("e"))]
    d = diff_of(tmp_path, base, new)
    assert ids(d.newly_excused) == [result(n=2).id]
    assert not d.excused_distribution_drift and not d.excused_drift


def test_added_and_removed_alone_are_not_a_regression(tmp_path):
    d = diff_of(tmp_path, [result(n=1), result(n=2)], [result(n=2), result(n=3), result(outcome="xfail", n=4)])
    assert d.added and d.removed and not d.new_failures and not d.regression
    assert ids(d.new_excused) == [result(n=4).id]  # excused by no entry: nothing new to gate


def test_case_error_drift_thresholds(tmp_path):
    base_ulps = {1: 1.0, 2: 0.0, 3: 3.0, 4: 3.0, 5: 2.0}
    new_ulps = {1: 8.0, 2: 1.0, 3: 6.0, 4: 7.0, 5: float("inf")}
    base = [result(n=k, ulp=u, rel=0.0) for k, u in base_ulps.items()]
    new = [result(n=k, ulp=u, rel=0.0) for k, u in new_ulps.items()]
    d = diff_of(tmp_path, base, new)
    drifted = {x["id"] for x in d.error_drift if x["metric"] == "max_ulp"}
    # 1→8 and 3→7 exceed ×2 and +2 ULP; 0→1 (last bit) and 3→6 (exactly ×2) do not; 2→inf does
    assert drifted == {result(n=1).id, result(n=4).id, result(n=5).id}
    assert d.regression
    d2 = diff_of(tmp_path / "loose", base, new, ulp_growth=10.0)
    assert {x["id"] for x in d2.error_drift} == {result(n=5).id}


def test_relative_error_floor_scales_with_dtype(tmp_path):
    eps64, eps32 = 2.0 ** -52, 2.0 ** -23
    base = [result(dtype="float64", n=1, ulp=None, rel=1 * eps64), result(dtype="float32", n=2, ulp=None, rel=1 * eps32)]
    new = [result(dtype="float64", n=1, ulp=None, rel=10 * eps64), result(dtype="float32", n=2, ulp=None, rel=3 * eps32)]
    d = diff_of(tmp_path, base, new)
    assert [(x["id"], x["metric"]) for x in d.error_drift] == [(result(dtype="float64", n=1).id, "max_rel_err")]


def test_distribution_drift_while_every_case_passes(tmp_path):
    base = group("exp", "float32", [1.0] * 100)
    new = group("exp", "float32", [1.0] * 95 + [10.0] * 5)
    d = diff_of(tmp_path, base, new)
    assert len(d.distribution_drift) == 1
    g = d.distribution_drift[0]
    assert g["group"] == "exp/float32/mlx-cpu-eager" and g["all_pass"]
    assert set(g["metrics"]) == {"p99", "max"} and g["base"]["p99"] == 1.0 and g["new"]["p99"] == 10.0
    assert d.regression


def test_distribution_is_compared_over_shared_cases_only(tmp_path):
    base = group("exp", "float32", [1.0] * 10)
    new = group("exp", "float32", [1.0] * 10) + group("exp", "float32", [500.0], start=100)  # a new, worse case
    d = diff_of(tmp_path, base, new)
    assert d.added == [result(n=100).id] and not d.distribution_drift and not d.regression


def test_derivative_records_are_diffed_apart_from_the_forward(tmp_path):
    # the forward and the VJP of exp share op, dtype, shape and target: distinct ids, distinct groups
    base = group("exp", "float32", [1.0] * 100) + dgroup("vjp", "exp", "float32", [1.0] * 100)
    new = group("exp", "float32", [1.0] * 100) + dgroup("vjp", "exp", "float32", [1.0] * 95 + [10.0] * 5) \
        + [derivative("jvp", n=1, outcome="fail", tolerance={"max_ulp": 1.0, "rtol": 0.0, "atol": 0.0,
                                                             "source": "derivative:default+1terms"})]
    d = diff_of(tmp_path, base, new)
    assert [(g["group"], g["op"], g["grad"]) for g in d.distribution_drift] == [
        ("exp:vjp/float32/mlx-cpu-eager", "exp", "vjp")]
    assert set(d.distribution_drift[0]["metrics"]) == {"p99", "max"}
    assert d.added == [derivative("jvp", n=1).id] and ids(d.new_failures) == [derivative("jvp", n=1).id]
    assert d.new_failures[0]["new"]["tolerance"] == "derivative:default+1terms"
    assert not d.removed and d.regression
    # a derivative case's error drift is listed by its own id, the forward's unchanged
    cur = dgroup("vjp", "exp", "float32", [1.0] * 99 + [50.0])
    d = diff_of(tmp_path / "b", base, group("exp", "float32", [1.0] * 100) + cur)
    assert ids(d.error_drift) == [cur[-1].id, cur[-1].id] and "/grad:vjp/" in cur[-1].id


def test_over_budget_count_drift(tmp_path):
    base, new = group("exp", "float32", [1.0, 1.0]), group("exp", "float32", [1.0, 1.0])
    bd = write(tmp_path / "b", base)
    nd = write(tmp_path / "n", new)
    for path, flags in ((bd, [False, False]), (nd, [True, False])):  # the oracle's field, as it writes it
        doc = json.loads((path / "results.json").read_text())
        for c, f in zip(doc["cases"], flags):
            c["over_budget"] = f
        (path / "results.json").write_text(json.dumps(doc))
    d = compare(records.load(bd), records.load(nd))
    assert [x["metrics"] for x in d.distribution_drift] == [["over_budget"]]


def test_no_baseline_counts_every_bad_case_as_new(tmp_path):
    n = records.load(write(tmp_path / "new", [result(n=1), result(outcome="fail", n=2)]))
    d = compare(None, n)
    assert ids(d.new_failures) == [result(n=2).id] and len(d.added) == 2 and d.regression


def test_cli_exit_status_and_json(tmp_path, capsys):
    b = write(tmp_path / "base", [result(n=1), result(n=2)])
    same = write(tmp_path / "same", [result(n=1), result(n=2), result(n=3)])
    worse = write(tmp_path / "worse", [result(n=1), result(outcome="crash", n=2)])
    assert cli.main(["diff", str(b), str(same / "results.json"), "--no-lock"]) == 0
    out = tmp_path / "d.json"
    assert cli.main(["diff", str(b), str(worse), "--no-lock", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["schema"] == "rlx-conformance/diff/v1" and doc["regression"] is True
    assert doc["counts"]["new_failures"] == 1 and doc["new_failures"][0]["new"]["outcome"] == "crash"
    assert "REGRESSION" in capsys.readouterr().out
    excused = write(tmp_path / "excused", [result(n=1), result(outcome="xfail", n=2, divergence=div("e"))])
    assert cli.main(["diff", str(b), str(excused), "--no-lock", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["counts"]["newly_excused"] == 1 and doc["newly_excused"][0]["entry"] == "e"
    assert "newly excused" in capsys.readouterr().out
    assert cli.main(["diff", str(excused), str(b), "--no-lock", "--json", str(out)]) == 0  # xfail -> pass: fixed
    assert json.loads(out.read_text())["counts"]["fixed"] == 1


@pytest.mark.parametrize("argv", [["diff", "/nonexistent", "/nonexistent"], ["diff", ".", ".", "--ulp-growth", "0.5"]])
def test_cli_bad_input_exits_2(argv, tmp_path, capsys):
    if argv[1] == ".":
        d = str(write(tmp_path / "r", [result()]))
        argv = argv[:1] + [d, d] + argv[3:]
    assert cli.main(argv + ["--no-lock"]) == 2
    assert "error:" in capsys.readouterr().err


def _sel(**kw):
    """A run.selection as run/session.selection writes it (the fields diff reads)."""
    return {"ops": None, "dtypes": None, "backend": ["mlx"], "devices": ["cpu"], "modes": ["eager"], "tf32": "env",
            "shard": None, "sample": 1, "case": None, "cases_dir": None, **kw}


def _run_meta(targets, **sel):
    return {"start": "2026-01-01T00:00:00+00:00", "targets": targets, "selection": _sel(**sel)}


def test_a_subset_is_compared_over_its_selection_and_counts_the_rest(tmp_path):
    """A --ops subset of a whole baseline: the baseline's other ops are counted as not run in this
    subset, not listed as removed (diff.json stays small); a case of the subset's own op that the
    new run lacks is still removed; the diff says what the subset was."""
    base = [result("exp", n=k) for k in (1, 2, 3)] + [result("log", n=k) for k in range(1, 51)]
    new = [result("exp", n=1), result("exp", outcome="fail", n=2)]
    b = records.load(write(tmp_path / "base", base))
    n = records.load(write(tmp_path / "new", new, _run_meta(["mlx-cpu-eager"], ops=["exp"])))
    d = compare(b, n)
    assert d.removed == [result("exp", n=3).id] and d.not_in_subset == 50
    assert ids(d.new_failures) == [result("exp", n=2).id]
    doc = d.to_json()
    assert doc["subset"]["ops"] == ["exp"] and doc["counts"]["not_in_subset"] == 50
    assert not any("log/" in i for i in doc["removed"]) and len(json.dumps(doc)) < 3000
    assert d.subset.describe() == "ops exp; targets mlx-cpu-eager"


def test_a_subset_by_dtype_and_target_and_one_without_a_recorded_selection(tmp_path):
    """--dtypes and --mode subsets (the targets the run had), and a run from a front that records
    no selection (nightly --ops, the pytest plugin): its ops, dtypes and targets are read off its
    records, and the description says so."""
    base = ([result(dtype="float32", n=k) for k in (1, 2)] + [result(dtype="float16", n=k) for k in (1, 2)]
            + [result(dtype="float32", mode="lazy", n=k) for k in (1, 2)])
    new = [result(dtype="float32", n=1)]
    b = records.load(write(tmp_path / "base", base))
    for name, run in (("dtypes", _run_meta(["mlx-cpu-eager"], dtypes=["float32"])),
                      ("plain", {"start": "2026-01-01T00:00:00+00:00", "targets": ["mlx-cpu-eager"]})):
        d = compare(b, records.load(write(tmp_path / name, new, run)))
        assert d.removed == [result(dtype="float32", n=2).id] and d.not_in_subset == 4, name
    assert d.subset.describe() == "ops exp; dtypes float32; targets mlx-cpu-eager (inferred from its records)"


def test_a_shard_calls_nothing_removed(tmp_path):
    """A shard holds part of every op: a baseline case it lacks may be another shard's, so it is
    counted as not in the subset, never removed."""
    base = [result(n=k) for k in range(1, 7)]
    new = [result(n=k) for k in (1, 3, 5)]
    b = records.load(write(tmp_path / "base", base))
    d = compare(b, records.load(write(tmp_path / "new", new, _run_meta(["mlx-cpu-eager"], shard="1/2"))))
    assert d.removed == [] and d.not_in_subset == 3 and "shard 1/2" in d.subset.describe()
    whole = compare(b, records.load(write(tmp_path / "whole", new, _run_meta(["mlx-cpu-eager"]))))
    assert whole.subset is None and len(whole.removed) == 3  # the whole selection: they are removed


def test_cli_lists_outcome_changes_regressions_first_ids_unbroken(tmp_path, capsys, monkeypatch):
    """The terminal lists every outcome change: each case id whole on its line (at 40 columns too),
    old → new outcome before it, the message on a line of its own; regressions before fixes.
    --format json is the same diff as one document on stdout."""
    monkeypatch.setenv("COLUMNS", "40")
    long_n = 123456789  # a long id
    b = write(tmp_path / "base", [result(n=long_n), result(outcome="fail", n=2), result(n=3, outcome="xfail"),
                                  result(n=4, outcome="skip")])
    nw = write(tmp_path / "new", [result(outcome="fail", n=long_n, message="values differ at [0]: 1 vs 2"),
                                  result(n=2), result(n=3, outcome="pass"), result(n=4, outcome="pass")])
    assert cli.main(["diff", str(b), str(nw), "--no-lock"]) == 1
    text = capsys.readouterr().out
    lines = text.splitlines()
    failing = result(n=long_n).id
    i = next(k for k, ln in enumerate(lines) if ln.endswith(failing))
    assert "pass → fail" in lines[i] and lines[i + 1].strip() == "values differ at [0]: 1 vs 2"
    fixed = [k for k, ln in enumerate(lines) if ln.endswith((result(n=2).id, result(n=3).id))]
    assert len(fixed) == 2 and all(k > i for k in fixed)
    assert any(ln.endswith(result(n=4).id) and "skip → pass" in ln for ln in lines)
    assert cli.main(["diff", str(b), str(nw), "--no-lock", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/diff/v1" and ids(doc["new_failures"]) == [failing]
    assert ids(doc["fixed"]) == sorted([result(n=2).id, result(n=3).id])
    assert doc["outcome_changes"] == [{"id": result(n=4).id, "base": "skip", "new": "pass"}]
