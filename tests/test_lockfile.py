"""The tolerance lock: observed worst errors per group, violations when they grow, tighter
proposals when they shrink, loosening only with a reason, and the file format round trip."""
from __future__ import annotations

import json
import math
import tomllib

import pytest
from results_fixtures import group, result, write

from rlx_conformance.cli import main as cli
from rlx_conformance.core.errors import RlxError
from rlx_conformance.report import lockfile
from rlx_conformance.report.lockfile import Entry

EXP = ("exp", "float32", "mlx-cpu-eager")
ADD = ("add", "float32", "mlx-cpu-eager")


def observed(results):
    return lockfile.observe([r.to_json() for r in results])


def test_observe_takes_the_worst_passing_case():
    rs = group("exp", "float32", [1.0, 14.0, 3.0]) + [result("exp", "float32", "fail", n=50, ulp=1e9, rel=1.0)]
    obs = observed(rs)
    assert obs[EXP].max_ulp == 14.0 and obs[EXP].max_rel_err == 14.0 * 2.0 ** -23


def test_check_violation_tighter_unlocked():
    lock = {EXP: Entry(max_ulp=10.0, max_rel_err=1e-6), ADD: Entry(max_ulp=16.0, max_rel_err=1e-6)}
    obs = {EXP: Entry(max_ulp=12.0, max_rel_err=1e-6),  # grew: violation (ulp)
           ADD: Entry(max_ulp=8.0, max_rel_err=1e-7),  # ≤ half: tighter (both)
           ("neg", "float32", "mlx-cpu-eager"): Entry(max_ulp=0.0, max_rel_err=0.0)}  # not locked
    chk = lockfile.check(lock, obs, "x.toml")
    assert chk.checked == 2
    assert [(v["group"], v["metric"], v["locked"], v["observed"]) for v in chk.violations] == [
        ("exp/float32/mlx-cpu-eager", "max_ulp", 10.0, 12.0)]
    assert {(t["group"], t["metric"], t["proposed"]) for t in chk.tighter} == {
        ("add/float32/mlx-cpu-eager", "max_ulp", 8.0), ("add/float32/mlx-cpu-eager", "max_rel_err", 1e-7)}
    assert [u["group"] for u in chk.unlocked] == ["neg/float32/mlx-cpu-eager"]


@pytest.mark.parametrize("locked,seen,tighter", [(14.0, 8.0, False), (14.0, 7.0, True), (1.0, 0.0, True),
                                                 (1.5, 0.5, True), (1.0, 0.4, False), (math.inf, 3.0, True)])
def test_tighter_needs_half_and_one_ulp(locked, seen, tighter):
    chk = lockfile.check({EXP: Entry(max_ulp=locked)}, {EXP: Entry(max_ulp=seen)})
    assert bool(chk.tighter) == tighter and not chk.violations


def test_update_tightens_adds_and_refuses_to_loosen_without_reason():
    lock = {EXP: Entry(max_ulp=10.0), ADD: Entry(max_ulp=16.0, reason="GPU order")}
    obs = {EXP: Entry(max_ulp=12.0), ADD: Entry(max_ulp=2.0), ("neg", "float16", "mlx-cpu-lazy"): Entry(0.0, 0.0)}
    chk = lockfile.check(lock, obs)
    new, refused = lockfile.updated(lock, chk)
    assert refused == 1 and new[EXP].max_ulp == 10.0  # not loosened
    assert new[ADD].max_ulp == 2.0 and new[ADD].reason == "GPU order"
    assert new[("neg", "float16", "mlx-cpu-lazy")] == Entry(0.0, 0.0)
    assert lock[ADD].max_ulp == 16.0  # the input lock is left alone
    new, refused = lockfile.updated(lock, chk, reason="MLX 0.33 changed exp")
    assert refused == 0 and new[EXP] == Entry(max_ulp=12.0, reason="MLX 0.33 changed exp")


def test_file_round_trip(tmp_path):
    lock = {EXP: Entry(14.0, 8.25e-07), ADD: Entry(max_ulp=math.inf, reason='say "why"\nand ✓'),
            ("onnx.GatherND", "int64", "mlx-gpu-lazy-tf32:off"): Entry(max_rel_err=0.0)}
    path = lockfile.write(lock, tmp_path / "lock.toml")
    text = path.read_text()
    assert text.startswith("# Tolerance lock") and "Format:" in text
    tomllib.loads(text)  # valid TOML
    assert lockfile.load(path) == lock


def test_load_rejects_bad_entries(tmp_path):
    p = tmp_path / "lock.toml"
    p.write_text('[lock]\n"exp/float32/mlx-cpu-eager" = { max_ulps = 3 }\n')
    with pytest.raises(RlxError, match="must be a table"):
        lockfile.load(p)
    p.write_text('[lock]\n"exp-float32" = { max_ulp = 3 }\n')
    with pytest.raises(RlxError, match="bad group key"):
        lockfile.load(p)
    assert lockfile.load(tmp_path / "absent.toml") == {}


def test_committed_lock_parses():
    assert lockfile.default_path().is_file()
    lockfile.load()


def test_cli_lock_workflow(tmp_path, capsys):
    lock = tmp_path / "lock.toml"
    base = write(tmp_path / "base", group("exp", "float32", [4.0, 6.0]))
    # first: seed the lock from a run (unlocked groups get added); no regression
    assert cli.main(["diff", str(base), str(base), "--lock", str(lock), "--update-lock"]) == 0
    assert lockfile.load(lock)[EXP].max_ulp == 6.0
    # errors grow past the lock (within the drift thresholds): a violation, exit 1
    grown = write(tmp_path / "grown", group("exp", "float32", [4.0, 7.0]))
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock)]) == 1
    assert cli.main(["diff", str(base), str(grown), "--no-lock"]) == 0
    # --update-lock alone refuses to loosen; with a reason it loosens and the run passes
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock), "--update-lock"]) == 1
    assert lockfile.load(lock)[EXP].max_ulp == 6.0
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock), "--update-lock",
                     "--lock-reason", "new exp kernel"]) == 0
    assert lockfile.load(lock)[EXP] == Entry(7.0, 7.0 * 2.0 ** -23, "new exp kernel")
    # errors shrink: a proposal in the JSON, the lock unchanged without --update-lock
    better = write(tmp_path / "better", group("exp", "float32", [1.0, 2.0]))
    out = tmp_path / "d.json"
    assert cli.main(["diff", str(base), str(better), "--lock", str(lock), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {t["metric"] for t in doc["lock"]["tighter"]} == {"max_ulp", "max_rel_err"}
    assert lockfile.load(lock)[EXP].max_ulp == 7.0
    assert cli.main(["diff", str(base), str(better), "--lock", str(tmp_path / "none.toml")]) == 2
    capsys.readouterr()
