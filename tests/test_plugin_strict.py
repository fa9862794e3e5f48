"""Strict known divergences through the pytest plugin where the session holds part of the matrix
or splits it: a stale entry fails a ``-k`` session that selected its every case and a
pytest-xdist session (the controller checks the records its workers send), and a ``-k`` session
that holds only part of an entry's scope cannot call it stale.

The fake stale entry lives in a ``--cases`` override folder ($RLX_CONFORMANCE_CASES) whose
known_divergences.toml replaces the shipped one: it "excuses" add on int32, which MLX gets right,
so none of its cases fails and the entry is stale wherever the session held all of them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlx_conformance import pytest_matrix, pytest_plugin
from rlx_conformance.run.session import backend_targets, build_cases

pytest.importorskip("mlx.core")

STALE = """\
[[divergence]]
key = "fake-stale-int32-add"
op = "add"
dtype = "int32"
category = "backend-bug"
excuses = ["value"]
max_ulp = 1
reason = "A made-up divergence for the tests: MLX adds int32 correctly, so this entry is stale."
"""

# the matrix of the sessions: the entry's 18 cases (add, int32, eager) and 18 others (sub)
MATRIX = """\
[matrix]
backend = "mlx"
devices = "cpu"
modes = ["eager"]
ops = ["add", "sub"]
dtypes = ["int32"]
"""

ADD_CASE = "add/int32/shape:3x5+scalar/vals:random/mlx-cpu-eager"


@pytest.fixture
def session_dir(tmp_path: Path) -> Path:
    cases = tmp_path / "cases"
    cases.mkdir()
    (cases / "known_divergences.toml").write_text(STALE)
    (tmp_path / "conformance.toml").write_text(MATRIX)
    return tmp_path


def pytest_run(where: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on the session folder's conformance.toml, in a fresh process with the override."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["RLX_CONFORMANCE_CASES"] = str(where / "cases")
    cmd = [sys.executable, "-m", "pytest", "conformance.toml", "-q", "-p", "no:cacheprovider",
           "--rlx-workers", "1", "--rlx-report", str(where / "report"), *args]
    return subprocess.run(cmd, cwd=where, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


def results(where: Path) -> list[dict]:
    return json.loads((where / "report" / "results.json").read_text())["cases"]


def test_ids_exist():
    """The exact case id the partial selection below uses is one of the matrix's; the plugin and
    the matrix name the record property alike (the plugin cannot import the matrix at its top)."""
    ids = {c.id for c in build_cases(backend_targets("mlx", ["cpu"], ["eager"]), ["add"], ["int32"])}
    assert ADD_CASE in ids and len(ids) > 1
    assert pytest_plugin._RECORD == pytest_matrix.RECORD


def test_stale_entry_fails_a_k_session_that_holds_its_every_case(session_dir):
    p = pytest_run(session_dir, "-k", "add/int32")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "known divergence fake-stale-int32-add no longer reproduces" in out
    recs = results(session_dir)
    assert recs and {r["op"] for r in recs} == {"add"}  # the selection: add alone
    assert {r["outcome"] for r in recs} == {"xpass"}


def test_k_session_holding_part_of_an_entry_does_not_call_it_stale(session_dir):
    p = pytest_run(session_dir, "-k", ADD_CASE)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "no longer reproduces" not in out
    assert [(r["id"], r["outcome"]) for r in results(session_dir)] == [(ADD_CASE, "pass")]


def test_stale_entry_fails_an_xdist_session(session_dir):
    pytest.importorskip("xdist")
    junit = session_dir / "junit.xml"
    p = pytest_run(session_dir, "-n", "2", "--junitxml", str(junit))
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "known divergence fake-stale-int32-add no longer reproduces" in out
    # the controller wrote the whole session's results.json: every worker's records
    recs = results(session_dir)
    assert len(recs) == 40 and {r["op"] for r in recs} == {"add", "sub"}
    assert {r["outcome"] for r in recs if r["op"] == "add"} == {"xpass"}
    assert {r["outcome"] for r in recs if r["op"] == "sub"} == {"pass"}
    # the record that carried each result to the controller is not a JUnit property
    text = junit.read_text()
    assert 'name="outcome"' in text and "rlx_record" not in text


def test_a_bad_divergence_entry_is_a_one_line_usage_error(session_dir):
    """An entry the loader refuses (here: it names no failure kinds) stops the session at
    collection with the loader's message, not with a traceback after every case ran."""
    (session_dir / "cases" / "known_divergences.toml").write_text(STALE.replace('excuses = ["value"]\nmax_ulp = 1\n', ""))
    p = pytest_run(session_dir)
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # a collection error: no case ran
    assert "fake-stale-int32-add (add): excuses must list the failure kinds" in out
    assert "Traceback (most recent call last)" not in out
    assert not (session_dir / "report" / "results.json").exists()
