"""Merging shard reports (rlx_conformance/run/merge.py): the shards of a run, merged, give the cases,
summary and stability section of the whole run, the checks that need the whole set included.

One module fixture runs a small matrix (neg and exp, float64, eager and lazy) through the CLI
whole and as 3 shards, against a copy of cases/ in which the first known divergence's float64 exp
is moved onto float64 neg: exp's cases then fail (and get repro bundles) and the entry's neg item,
whose cases all pass, is stale: xpass, which only the whole set (or the merge) can tell.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlx_conformance.cli import main as cli
from rlx_conformance.core import provenance
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.stability import classify
from rlx_conformance.run.exhaustive import run_exhaustive
from rlx_conformance.run.merge import merge

ROOT = Path(__file__).resolve().parent.parent
TIMING = ("duration_s", "backend_s")
RUN = ["run", "--ops", "neg,exp", "--dtypes", "float64", "--mode", "eager,lazy", "--workers", "1",
       "--no-progress"]


def _make_runs(root: Path) -> dict[str, subprocess.CompletedProcess]:
    """The module's CLI runs (see the module docstring), under ``root``."""
    root.mkdir()
    cases = root / "cases"
    shutil.copytree(ROOT / "cases", cases)
    kd = cases / "known_divergences.toml"
    text = kd.read_text()
    entry = 'op = ["exp", '
    first = text[text.index("[[divergence]]"):text.index("[[divergence]]", text.index("[[divergence]]") + 1)]
    assert entry in first and 'dtype = "float64"' in first, "the first known divergence is no longer float64 exp"
    kd.write_text(text.replace(entry, 'op = ["neg", ', 1))
    env = dict(os.environ, RLX_CONFORMANCE_CASES=str(cases))

    def cli_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlx_conformance", *args], check=False, env=env, cwd=root,
                              capture_output=True, text=True, timeout=600)

    out = {"whole": cli_run(*RUN, "--report", str(root / "whole"))}
    for i in (1, 2, 3):
        out[f"s{i}"] = cli_run(*RUN, "--shard", f"{i}/3", "--report", str(root / f"s{i}"))
    out["merged"] = cli_run("merge", str(root / "merged"), *(str(root / f"s{i}") for i in (1, 2, 3)))
    # a run killed outright after a third of its cases: its journal, the last line torn
    whole_recs = json.loads((root / "whole" / "results.json").read_text())["cases"]
    (root / "resumed").mkdir()
    lines = [json.dumps(c) for c in whole_recs[: len(whole_recs) // 3]]
    (root / "resumed" / "results.partial.jsonl").write_text("\n".join(lines) + '\n{"id": "neg/flo')
    out["resumed"] = cli_run(*RUN, "--resume", str(root / "resumed"))
    out["rejudged"] = cli_run("merge", str(root / "rejudged"), str(root / "whole"), "--rejudge")
    out["stray"] = cli_run(*RUN[:2], "neg", *RUN[3:], "--resume", str(root / "resumed"))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, worker_id):
    """The runs, made once per test session: under pytest-xdist every worker that gets one of
    this module's tests would set this module fixture up (some 40 s of CLI runs each); the first
    makes them in the session's shared temporary folder and the others, waiting on a lock, read
    what it recorded (the runs' reports stay where the tests read them, the processes' exit
    codes and output in merge-runs.json)."""
    if worker_id == "master":  # not under xdist: this process's own folder
        root = tmp_path_factory.getbasetemp() / "merge-runs"
        procs = _make_runs(root)
    else:
        root = tmp_path_factory.getbasetemp().parent / "merge-runs"
        record = root.parent / "merge-runs.json"
        with open(root.parent / "merge-runs.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if record.is_file():
                procs = {k: subprocess.CompletedProcess(**v) for k, v in json.loads(record.read_text()).items()}
            else:
                shutil.rmtree(root, ignore_errors=True)  # a worker that failed here left part of it
                procs = _make_runs(root)
                record.write_text(json.dumps({k: {"args": p.args, "returncode": p.returncode, "stdout": p.stdout,
                                                  "stderr": p.stderr} for k, p in procs.items()}))
    out = dict(procs)
    stray = out.pop("stray")
    assert stray.returncode == 2 and "outside this selection" in stray.stderr
    assert len(stray.stderr.strip().splitlines()) <= 2, stray.stderr  # "resuming ..." + the error
    for name, p in out.items():
        assert p.returncode in (0, 1), f"{name}: {p.stdout}\n{p.stderr}"
    docs = {name: json.loads((root / name / "results.json").read_text()) for name in out}
    return root, out, docs


def without_timing(doc) -> dict[str, dict]:
    return {c["id"]: {k: v for k, v in c.items() if k not in TIMING} for c in doc["cases"]}


def test_shards_merge_to_the_whole_run(runs):
    _, out, docs = runs
    whole, merged = docs["whole"], docs["merged"]
    assert without_timing(merged) == without_timing(whole)
    assert merged["summary"] == whole["summary"]
    assert merged.get("stability") == whole.get("stability")
    assert sum(len(docs[f"s{i}"]["cases"]) for i in (1, 2, 3)) == len(whole["cases"])
    assert out["merged"].returncode == out["whole"].returncode == 1  # exp fails
    assert merged["run"]["targets"] == whole["run"]["targets"]
    assert [m["shard"] for m in merged["run"]["merged"]["shards"]] == ["1/3", "2/3", "3/3"]


def test_resume_finishes_a_killed_run(runs):
    """--resume keeps the journal's records, runs only the rest, and judges the whole set:
    the same cases, outcomes (xpass included), summary and stability as the uninterrupted run."""
    _, out, docs = runs
    whole, resumed = docs["whole"], docs["resumed"]
    assert out["resumed"].returncode == out["whole"].returncode
    assert without_timing(resumed) == without_timing(whole)
    assert resumed["summary"] == whole["summary"] and resumed.get("stability") == whole.get("stability")
    kept = len(whole["cases"]) // 3
    assert resumed["run"]["resumed"] == {"kept": kept, "ran": len(whole["cases"]) - kept}
    assert resumed["run"]["cases_planned"] == len(whole["cases"])
    assert resumed["run"]["targets"] == whole["run"]["targets"]


def test_rejudge_gives_the_run_back_under_unchanged_data(runs):
    """merge --rejudge takes every record back to what its run measured and judges it again:
    with the known divergences unchanged, the run's own verdicts (xfail, xpass) come back."""
    _, out, docs = runs
    assert out["rejudged"].returncode == out["whole"].returncode
    assert without_timing(docs["rejudged"]) == without_timing(docs["whole"])
    assert docs["rejudged"]["summary"] == docs["whole"]["summary"] and docs["rejudged"]["run"]["rejudged"]


def test_stale_divergence_is_judged_on_the_merged_set(runs):
    """The shards leave strictness to the merge: none of them has an xpass, the merge has the
    whole run's."""
    _, _, docs = runs
    xpass = {c["id"] for c in docs["whole"]["cases"] if c["outcome"] == "xpass"}
    assert xpass and all(i.startswith("neg/float64/") for i in xpass)
    assert not [c for i in (1, 2, 3) for c in docs[f"s{i}"]["cases"] if c["outcome"] == "xpass"]
    assert {c["id"] for c in docs["merged"]["cases"] if c["outcome"] == "xpass"} == xpass


def test_bundles_follow_their_cases(runs):
    root, _, docs = runs
    failing = {c["id"] for c in docs["whole"]["cases"] if c["outcome"] == "fail"}
    assert failing and all(i.startswith("exp/float64/") for i in failing)
    for name in ("whole", "merged"):
        recs = [c for c in docs[name]["cases"] if c.get("repro")]
        assert {c["id"] for c in recs} == failing
        assert sorted(p.name for p in (root / name / "repro").iterdir()) == sorted(
            Path(c["repro"]).name for c in recs)
        assert all((root / name / c["repro"] / "repro.py").is_file() for c in recs)


# -- refusals (synthetic reports) -------------------------------------------------------------------
def record(cid: str, outcome: str = "pass", **kw) -> res.CaseResult:
    op, dtype = cid.split("/")[:2]
    kw.setdefault("attrs", {})
    return res.CaseResult(id=cid, op=op, dtype=dtype, shape=[[3]], family="odd", vals="random",
                          backend="mlx", device="cpu", mode="eager", outcome=outcome, **kw)


def report(path: Path, shard: str | None, *recs: res.CaseResult) -> Path:
    res.write_results(path / "results.json", {"shard": shard} if shard else {}, list(recs), classify(list(recs)))
    return path


def test_records_round_trip_through_case_results():
    """merge re-judges records as CaseResults and writes them back: nothing may change on the way
    (infinite errors are stored as strings, NaN as null)."""
    r = record("neg/float32/shape:3/vals:random/mlx-cpu-eager", "fail", max_abs_err=float("inf"),
               max_rel_err=float("nan"), max_ulp=3.0, attrs={"min": float("-inf")}, message="m")
    rec = r.to_json()
    back = res.CaseResult.from_json(json.loads(json.dumps(rec)))
    assert back.to_json() == rec and back.max_abs_err == float("inf") and back.max_rel_err is None
    assert res.CaseResult.from_json({**rec, "field_of_a_newer_harness": 1}).to_json() == rec


def test_refuses_a_repeated_or_missing_shard(tmp_path):
    a = report(tmp_path / "a", "1/2", record("neg/float32/shape:3/vals:random/mlx-cpu-eager"))
    with pytest.raises(RlxError, match="given twice"):
        merge(tmp_path / "out", [a, a])
    with pytest.raises(RlxError, match="2/2 missing"):
        merge(tmp_path / "out", [a])
    m = merge(tmp_path / "out", [a], partial=True)
    assert any("partial merge" in w for w in m.warnings)
    assert cli.main(["merge", str(tmp_path / "out"), str(a), str(a)]) == 2
    assert cli.main(["merge", str(tmp_path / "out"), str(tmp_path / "nowhere")]) == 2


def test_a_case_in_two_reports_must_agree(tmp_path):
    cid = "neg/float32/shape:3/vals:random/mlx-cpu-eager"
    a = report(tmp_path / "a", "1/2", record(cid, duration_s=0.1))
    b = report(tmp_path / "b", "2/2", record(cid, duration_s=0.2))  # timings may differ
    assert [r.id for r in merge(tmp_path / "out", [a, b]).results] == [cid]
    c = report(tmp_path / "c", "2/2", record(cid, outcome="fail", message="boom"))
    with pytest.raises(RlxError, match=r"different results \(message, outcome\)"):
        merge(tmp_path / "out", [a, c])


def _selection(**kw):
    """A run.selection as session.selection and execute write it."""
    return {"ops": ["neg"], "dtypes": None, "grad": ["vjp", "jvp", "hvp"], "backend": ["mlx"], "devices": ["cpu"],
            "modes": ["eager"],
            "tf32": "env", "sample": 1, "case": None, "cases_dir": None, "shard": None, **kw}


def selected(path: Path, shard: str, sel: dict, *recs: res.CaseResult, version: str = "1.0") -> Path:
    meta = {"shard": shard, "selection": {**sel, "shard": shard}, "harness": {"version": version}}
    res.write_results(path / "results.json", meta, list(recs), classify(list(recs)))
    return path


@pytest.mark.parametrize(("key", "other", "option", "shown"), [
    ("ops", ["neg", "exp"], "--ops", "neg,exp"), ("modes", ["lazy"], "--mode", "lazy"),
    ("dtypes", ["float32"], "--dtypes", "float32"), ("backend", ["other"], "--backend", "other"),
    ("devices", ["gpu"], "--device", "gpu"), ("tf32", "on", "--tf32", "on"), ("sample", 2, "--sample", "2"),
    ("cases_dir", "/my/cases", "--cases", "/my/cases"), ("case", ["neg/x"], "--case", "neg/x"),
    ("grad", [], "--grad", "none"), ("grad", ["vjp"], "--grad", "vjp"),
    ("graphs", "none", "--graphs", "none"), ("sample_grad", 8, "--sample-grad", "8")])
def test_refuses_shards_of_different_selections(tmp_path, capsys, key, other, option, shown):
    """Shards made with another --ops, --mode, ... are not parts of one run: a one-line error
    naming the option and both values (exit 2); shards of one selection still merge."""
    a = selected(tmp_path / "a", "1/2", _selection(), record("neg/float32/shape:3/vals:random/mlx-cpu-eager"))
    b = selected(tmp_path / "b", "2/2", _selection(**{key: other}), record("neg/float32/shape:4/vals:random/mlx-cpu-eager"))
    with pytest.raises(RlxError, match=f"{option} is .* in .* but {shown} in ") as e:
        merge(tmp_path / "out", [a, b])
    assert "\n" not in str(e.value)
    assert cli.main(["merge", str(tmp_path / "out"), str(a), str(b)]) == 2
    err = capsys.readouterr().err.strip()
    assert "error: shards of different selections" in err and len(err.splitlines()) == 1
    same = selected(tmp_path / "c", "2/2", _selection(), record("neg/float32/shape:4/vals:random/mlx-cpu-eager"))
    m = merge(tmp_path / "out", [a, same])
    assert len(m.results) == 2 and m.meta["selection"] == _selection()  # the whole selection, no shard


def test_refuses_shards_of_different_harness_versions_and_prints_json(tmp_path, capsys):
    a = selected(tmp_path / "a", "1/2", _selection(), record("neg/float32/shape:3/vals:random/mlx-cpu-eager"))
    b = selected(tmp_path / "b", "2/2", _selection(), record("neg/float32/shape:4/vals:random/mlx-cpu-eager"),
                 version="2.0")
    with pytest.raises(RlxError, match="harness version is 1.0 in .* but 2.0 in "):
        merge(tmp_path / "out", [a, b])
    b = selected(tmp_path / "b", "2/2", _selection(), record("neg/float32/shape:4/vals:random/mlx-cpu-eager"))
    assert cli.main(["merge", str(tmp_path / "out"), str(a), str(b), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/merge/v1" and doc["summary"]["total"] == 2 and doc["exit"] == 0
    assert doc["results"] == str(tmp_path / "out" / "results.json")


def test_the_merge_records_the_harness_that_merged(tmp_path):
    """run.harness is the shards' (they must agree on the version); run.merged.by is the harness
    that merged or rejudged, which may be newer: a rejudged baseline says what judged it."""
    old = {"name": "rlx-conformance", "version": "0.0.1", "commit": "0" * 40}
    rec = record("neg/float32/shape:3/vals:random/mlx-cpu-eager")
    path = tmp_path / "old"
    res.write_results(path / "results.json", {}, [rec], classify([rec]))
    doc = json.loads((path / "results.json").read_text())
    doc["run"]["harness"] = old  # as an older harness wrote it
    (path / "results.json").write_text(json.dumps(doc))
    m = merge(tmp_path / "out", [path], rejudge=True)
    written = json.loads((tmp_path / "out" / "results.json").read_text())["run"]
    assert m.meta["rejudged"] and written["harness"] == old
    assert written["merged"]["by"] == provenance.harness() != old
    assert written["merged"]["by"]["version"] == provenance.version()


def test_the_shards_sweeps_merge_with_them(tmp_path):
    """run --shard I/N --exhaustive: each shard swept its part of the jobs into its exhaustive.json;
    the merge writes one exhaustive.json with every row."""
    dirs = []
    for i in (1, 2):
        d = selected(tmp_path / f"s{i}", f"{i}/2", _selection(),
                     record(f"neg/float32/shape:{i + 2}/vals:random/mlx-cpu-eager"))
        run_exhaustive([], ["neg", "abs"], ["float16"], d, workers=1, cache_dir=tmp_path / "cache", shard=(i, 2))
        dirs.append(d)
    merge(tmp_path / "out", dirs)
    doc = json.loads((tmp_path / "out" / "exhaustive.json").read_text())
    assert sorted(r["op"] for r in doc["rows"]) == ["abs", "neg"] and doc["summary"]["total"] == 2
    assert "shard" not in doc["run"] and not doc["failed"]


def test_shards_of_layout_and_graph_cases_merge_to_the_whole_run(tmp_path, capsys):
    """A selection with layout and graph cases (issue 17): two shards, merged, give the whole
    run's records (the layout and graph ones among them), summary and stability section."""
    sel = ["run", "--ops", "relu,mat_mul,graph:residual*", "--layouts", "default", "--grad", "none",
           "--dtypes", "float32", "--mode", "eager,compiled", "--workers", "1", "--no-progress", "--no-bundles"]

    def cli_run(*args: str) -> None:
        # in this process (the cases still run in the runner's worker processes): what is tested
        # is the records, not the command's process, and four interpreter starts cost ~12 s
        code = cli.main(list(args))
        out, err = capsys.readouterr()
        assert code in (0, 1), out + err

    cli_run(*sel, "--report", str(tmp_path / "whole"))
    for i in (1, 2):
        cli_run(*sel, "--shard", f"{i}/2", "--report", str(tmp_path / f"s{i}"))
    cli_run("merge", str(tmp_path / "merged"), str(tmp_path / "s1"), str(tmp_path / "s2"))
    docs = {k: json.loads((tmp_path / k / "results.json").read_text()) for k in ("whole", "s1", "s2", "merged")}
    whole, merged = without_timing(docs["whole"]), without_timing(docs["merged"])
    assert merged == whole
    assert any(c["layout"] for c in whole.values()) and any(c["op"].startswith("graph:") for c in whole.values())
    for k in ("s1", "s2"):  # each shard holds some of each kind
        recs = docs[k]["cases"]
        assert any(c["layout"] for c in recs) and any(c["op"].startswith("graph:") for c in recs)
        assert any(not c["layout"] and not c["op"].startswith("graph:") for c in recs)
    assert docs["merged"]["summary"] == docs["whole"]["summary"]
    assert docs["merged"].get("stability") == docs["whole"].get("stability")
    assert docs["merged"]["run"]["selection"]["layouts"] == "default"


def test_run_records_the_graphs_it_held(tmp_path):
    """run.selection.graphs says which graph cases a run held (diff compares over them, merge
    refuses shards that differ): none for an --ops run without --graphs, the globs given."""
    base = ["run", "--ops", "neg", "--dtypes", "float32", "--mode", "eager", "--grad", "none",
            "--layouts", "none", "--no-progress", "--no-bundles"]
    assert cli.main([*base, "--report", str(tmp_path / "a")]) == 0
    assert json.loads((tmp_path / "a" / "results.json").read_text())["run"]["selection"]["graphs"] == "none"
    assert cli.main([*base, "--graphs", "rms_norm_matmul", "--report", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "results.json").read_text())["run"]["selection"]["graphs"] == "rms_norm_matmul"
