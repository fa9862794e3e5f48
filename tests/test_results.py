"""results.json and the journal: strict JSON, atomic replacement, no debris on failure."""
from __future__ import annotations

import json
import math
import os

import pytest

from rlx_conformance.core import results
from rlx_conformance.core.results import (
    CaseResult,
    Journal,
    atomic_write_text,
    write_results,
)
from rlx_conformance.generate import matrix
from rlx_conformance.judge.stability import classify

T = matrix.Target("mlx", "cpu", "eager")
CASE = matrix.Case("reduce_sum", "float32", ((3, 5),), "matrix", (("axes", (1,)), ("keep_dim", False)),
                   "random", T)


def result(outcome="pass", **kw) -> CaseResult:
    return CaseResult.for_case(CASE, outcome, **kw)


def strict_loads(text: str):
    def bad_constant(c):
        raise ValueError(f"non-standard JSON constant {c}")

    return json.loads(text, parse_constant=bad_constant)


# -- CaseResult.to_json ------------------------------------------------------------------------------
def test_to_json_nonfinite_measurements():
    r = result("fail", max_abs_err=math.nan, max_rel_err=math.inf, max_ulp=-math.inf)
    d = r.to_json()
    assert d["max_abs_err"] is None and d["max_rel_err"] == "inf" and d["max_ulp"] == "-inf"
    strict_loads(json.dumps(d, allow_nan=False))


def test_to_json_finite_and_metadata():
    d = result(max_abs_err=0.25, max_ulp=2.0).to_json()
    assert d["max_abs_err"] == 0.25 and d["max_ulp"] == 2.0 and d["max_rel_err"] is None
    assert d["id"] == CASE.id and d["attrs"] == {"axes": [1], "keep_dim": False}
    assert d["shape"] == [[3, 5]] and d["seed"] == CASE.seed
    assert strict_loads(json.dumps(d, allow_nan=False)) == d


# -- write_results -----------------------------------------------------------------------------------
def test_write_results_document(tmp_path):
    rs = [result("pass"), result("fail", max_ulp=math.inf), result("crash", message="SIGSEGV")]
    path = tmp_path / "sub" / "results.json"
    write_results(path, {"argv": ["x"]}, rs, classify(rs))
    doc = strict_loads(path.read_text())
    assert set(doc) == {"schema", "run", "summary", "stability", "cases"}
    assert doc["schema"] == results.SCHEMA and doc["run"] == {"argv": ["x"]}
    assert doc["summary"]["total"] == 3
    assert (doc["summary"]["pass"], doc["summary"]["fail"], doc["summary"]["crash"]) == (1, 1, 1)
    assert set(doc["summary"]) == set(results.OUTCOMES) | {"total"}
    assert [c["outcome"] for c in doc["cases"]] == ["pass", "fail", "crash"]
    assert doc["cases"][1]["max_ulp"] == "inf"
    assert results.load_results(path) == doc
    assert os.listdir(path.parent) == ["results.json"]  # no temp file left


def test_load_results_checks_schema(tmp_path):
    p = tmp_path / "other.json"
    p.write_text('{"schema": "something/else"}')
    with pytest.raises(ValueError, match="not a results file"):
        results.load_results(p)


def test_write_results_refuses_nan_in_metadata_and_keeps_old(tmp_path):
    path = tmp_path / "results.json"
    write_results(path, {}, [result()], classify([result()]))
    before = path.read_text()
    with pytest.raises(ValueError):
        write_results(path, {"x": math.nan}, [result()], classify([result()]))
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["results.json"]


# -- atomic_write_text ---------------------------------------------------------------------------------
@pytest.fixture
def old_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("old contents\n")
    return path


def _assert_intact(path):
    assert path.read_text() == "old contents\n"
    assert os.listdir(path.parent) == [path.name], "a temporary file was left behind"


def test_atomic_write_replaces(old_file):
    atomic_write_text(old_file, "new\n")
    assert old_file.read_text() == "new\n"
    assert os.listdir(old_file.parent) == [old_file.name]


def test_atomic_write_replace_fails(old_file, monkeypatch):
    def boom(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(results.os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        atomic_write_text(old_file, "new\n" * 1000)
    monkeypatch.undo()
    _assert_intact(old_file)


def test_atomic_write_fails_after_partial_write(old_file, monkeypatch):
    """The write has put bytes in the temporary file when fsync fails (interrupt mid-write)."""
    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_text(old_file, "x" * 100_000)
    monkeypatch.undo()
    _assert_intact(old_file)


def test_atomic_write_fails_midway_through_write(old_file, monkeypatch):
    """A write that raises halfway (e.g. ENOSPC) after writing part of the text."""
    real_fdopen = os.fdopen

    class HalfFile:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()
            return False

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(28, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(results.os, "fdopen", lambda fd, mode: HalfFile(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(old_file, "y" * 10_000)
    monkeypatch.undo()
    _assert_intact(old_file)


def test_write_results_atomic_when_serialisation_fails(old_file, monkeypatch):
    def broken_dumps(*a, **kw):
        raise RuntimeError("serialiser died")

    monkeypatch.setattr(results.json, "dumps", broken_dumps)
    with pytest.raises(RuntimeError):
        write_results(old_file, {}, [result()], classify([result()]))
    monkeypatch.undo()
    _assert_intact(old_file)


# -- Journal -----------------------------------------------------------------------------------------
def test_journal_appends_lines_and_removes(tmp_path):
    path = tmp_path / "run" / "results.jsonl"
    j = Journal(path)
    j.add(result("pass"))
    j.add(result("fail", max_abs_err=math.nan, max_ulp=math.inf))
    lines = path.read_text().splitlines()  # flushed per line: readable while the run goes on
    assert len(lines) == 2
    recs = [strict_loads(line) for line in lines]
    assert [r["outcome"] for r in recs] == ["pass", "fail"]
    assert recs[1]["max_abs_err"] is None and recs[1]["max_ulp"] == "inf"
    j.close(remove=True)
    assert not path.exists()


def test_journal_kept_when_asked(tmp_path):
    path = tmp_path / "results.jsonl"
    j = Journal(path)
    j.add(result("timeout"))
    j.close(remove=False)
    assert strict_loads(path.read_text())["outcome"] == "timeout"
