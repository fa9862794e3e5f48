"""Exhaustive mode (rlx_conformance/run/exhaustive.py): a fast sweep of two ops, the disk cache, the
report, and crash isolation (a worker killed by a signal is a crash row; the sweep goes on)."""
from __future__ import annotations

import configparser
import json
from pathlib import Path

import numpy as np
import pytest

from rlx_conformance.cli import main as cli
from rlx_conformance.generate.matrix import Target
from rlx_conformance.run import exhaustive as ex

TARGET = Target("mlx", "cpu", "lazy")


def test_inputs_cover_every_pattern():
    for d in ("float16", "bfloat16"):
        x = ex.inputs_for(d)
        assert x.size == 65536 and len(np.unique(x.view(np.uint16))) == 65536
    f = ex.inputs_for("float32", 2048)
    exps = np.unique((f.view(np.uint32) >> 23) & 0xFF)
    assert len(exps) == 256 and np.signbit(f).any() and (~np.signbit(f)).any()


def test_unary_ops_selection():
    ops = dict.fromkeys(op for op, _ in ex.unary_ops())
    assert {"exp", "gelu", "neg", "cast", "clamp", "sign"} <= set(ops)
    assert "add" not in ops and "where" not in ops
    casts = [a["to"] for op, a in ex.unary_ops(["cast"])]
    assert sorted(casts) == sorted(["float32", "float16", "bfloat16", "float64"])


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    report = tmp_path_factory.mktemp("ex")
    cache = tmp_path_factory.mktemp("cache")
    doc = ex.run_exhaustive([TARGET], ["neg", "sign"], ["float16", "bfloat16"], report,
                            workers=1, cache_dir=cache)
    return doc, report, cache


def test_sweep_rows_and_report(sweep):
    doc, report, _ = sweep
    rows = {(r["op"], r["dtype"], r["target"]): r for r in doc["rows"]}
    assert len(rows) == 2 * 2 * 2  # ops x dtypes x (reference, target)
    neg = rows[("neg", "float16", str(TARGET))]
    assert neg["outcome"] == "pass" and neg["max_ulp"] == 0 and neg["n"] == 65536
    for d in ("float16", "bfloat16"):
        assert rows[("sign", d, "cpu-cpu-eager")]["outcome"] == "pass"  # the reference: sign(NaN) = NaN
        s = rows[("sign", d, str(TARGET))]
        # MLX's sign(NaN) = 0: every NaN pattern, reported as hex, recorded as a known divergence
        assert s["nan_mismatch"] == (2046 if d == "float16" else 254)
        assert s["outcome"] == "xfail" and s["divergence"]["category"] == "backend-bug"
        assert s["worst"][0]["input"].startswith("0x")
    saved = json.loads((report / "exhaustive.json").read_text())
    assert saved["schema"] == ex.SCHEMA and saved["summary"]["total"] == len(doc["rows"])
    assert not doc["failed"]


def test_oracle_cache_is_used(sweep):
    _, _, cache = sweep
    files = sorted(cache.glob("*.npy"))
    assert len(files) == 4  # (neg, sign) x (float16, bfloat16)
    x = ex.inputs_for("float16")
    # a tampered cache file is what comes back: proof that the cache, not MPFR, answered
    f = next(p for p in files if p.name.startswith("neg-float16"))
    bits = np.load(f)
    np.save(f, np.zeros_like(bits))
    assert not ex.oracle_for("neg", {}, "float16", x, "float16", cache).any()


def test_undefined_positions_get_no_assertion():
    """cast float -> int is undefined for NaN/inf/out of range; rows judge only the rest (the
    oracle only covers float outputs, so the judge is checked on a float op with a mask)."""
    x = np.float32([1.0, np.nan, 3.0])
    want = np.float32([1.0, 2.0, 3.0])
    row = ex.judge_row("exp", {}, x, want, want, ftz=False)
    assert row["over_budget"] == 0


def test_crash_is_isolated(tmp_path):
    """A target that kills its worker (SIGSEGV in MLX's neg for float16) is a crash row; the
    other targets and ops of the sweep still report."""
    doc = ex.run_exhaustive([TARGET], ["neg", "abs"], ["float16", "bfloat16"], tmp_path, workers=1,
                            cache_dir=tmp_path / "cache", timeout=60,
                            init="exhaustive_kernels:install_crashing_neg")
    rows = {(r["op"], r["dtype"], r["target"]): r for r in doc["rows"]}
    assert len(rows) == 8
    crashed = rows[("neg", "float16", str(TARGET))]
    assert crashed["outcome"] == "crash" and "SIGSEGV" in crashed["message"]
    assert rows[("neg", "bfloat16", str(TARGET))]["outcome"] == "pass"
    assert rows[("abs", "float16", str(TARGET))]["outcome"] == "pass"
    assert doc["failed"]


def test_selected_dtypes_follow_the_dtype_globs():
    """One --dtypes means the same to `run --exhaustive` and `exhaustive`: the 16-bit floats it
    matches, float32 only with a sample."""
    assert ex.selected_dtypes(None) == ["float16", "bfloat16"]
    assert ex.selected_dtypes(["*float16"]) == ["float16", "bfloat16"]
    assert ex.selected_dtypes(["float32", "int8"]) == []
    assert ex.selected_dtypes(["float32"], f32_sample=64) == ["float32"]
    assert ex.selected_dtypes(None, f32_sample=64) == ["float16", "bfloat16", "float32"]


def test_a_shard_sweeps_its_part_of_the_jobs(tmp_path):
    """--shard I/N sweeps every N-th (op, dtype) job: the shards together sweep each job once."""
    rows = []
    for i in (1, 2):
        doc = ex.run_exhaustive([TARGET], ["neg", "abs"], ["float16"], None, workers=1, cache_dir=tmp_path,
                                reference=False, shard=(i, 2))
        assert doc["run"]["shard"] == f"{i}/2" and len(doc["rows"]) == 1
        rows += [r["op"] for r in doc["rows"]]
    assert sorted(rows) == ["abs", "neg"]


def test_run_exhaustive_sweeps_the_runs_selection_into_its_report(tmp_path, monkeypatch, capsys):
    """`run --exhaustive` (tox -e mlx's one command): the run's --ops/--dtypes/--mode select the
    sweep, which writes REPORT/exhaustive.json beside results.json; its table follows the run's
    summary; --format json carries its summary; a selection with nothing to sweep says so."""
    monkeypatch.setenv("RLX_CONFORMANCE_CACHE", str(tmp_path / "cache"))
    report = tmp_path / "r"
    argv = ["run", "--ops", "neg", "--dtypes", "float16", "--mode", "lazy", "--workers", "1", "--no-progress",
            "--no-bundles", "--exhaustive", "--report", str(report)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert text.index(f"results: {report / 'results.json'}") < text.index(f"report: {report / 'exhaustive.json'}")
    doc = json.loads((report / "exhaustive.json").read_text())
    assert {(r["op"], r["dtype"], r["target"]) for r in doc["rows"]} == {
        ("neg", "float16", "cpu-cpu-eager"), ("neg", "float16", str(TARGET))}
    assert cli.main([*argv[:-1], str(tmp_path / "j"), "--format", "json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["exit"] == 0 and run["exhaustive"]["summary"]["total"] == 2
    assert run["exhaustive"]["path"] == str(tmp_path / "j" / "exhaustive.json")
    argv = ["run", "--ops", "add", "--dtypes", "int8", "--mode", "lazy", "--workers", "1", "--no-progress",
            "--no-bundles", "--exhaustive", "--report", str(tmp_path / "none")]
    assert cli.main(argv) == 0
    assert "exhaustive: skipped (--dtypes selects neither float16 nor bfloat16)" in capsys.readouterr().out
    assert not (tmp_path / "none" / "exhaustive.json").exists()


def test_tox_mlx_is_one_command_that_passes_its_options_to_the_sweep():
    """tox -e mlx -- OPTIONS: one `run ... --exhaustive {posargs}`, so --ops, --report and the rest
    reach the sweep too (no second command with its own defaults)."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(Path(__file__).resolve().parent.parent / "tox.ini")
    commands = [c for c in tox["testenv:mlx"]["commands"].splitlines() if c.strip()]
    assert len(commands) == 1 and "--exhaustive" in commands[0] and commands[0].rstrip().endswith("{posargs}")
    assert commands[0].split()[:2] == ["rlx-conformance", "run"]


def test_in_budget_rounding_beside_a_nan_mismatch_is_a_nonfinite_failure_alone():
    """A float32 row of softsign on CUDA: NaN at +-inf (the exhaustive-softsign-inf-over-inf
    entry, which excuses nonfinite failures only) and 1 ulp elsewhere, within the 2-ulp budget.
    The row's max_ulp is the worst over every input; it must not make the row a value failure.
    A worst beyond the budget still is one, and the entry does not excuse it."""
    job = {"op": "softsign", "attrs": {}, "dtype": "float32"}
    target = Target("mlx", "gpu", "eager")
    row = {"n": 1 << 32, "max_ulp": 1.0, "over_budget": 2, "nan_mismatch": 2, "inf_mismatch": 0,
           "budget": {"ulp": 2.0}}
    assert ex._verdict(dict(row), job, target)["outcome"] == "xfail"
    over = ex._verdict(dict(row, max_ulp=3.0, over_budget=5), job, target)
    assert over["outcome"] == "fail" and "not value" in over["message"]
