"""The tolerance lock: observed worst errors per group, violations when they grow, tighter
proposals when they shrink, loosening only with a reason, and the file format (covered targets
locked at 0 by default, modes collapsed) round trip."""
from __future__ import annotations

import json
import math
import tomllib

import pytest
from results_fixtures import group, result, write

from rlx_conformance.cli import main as cli
from rlx_conformance.core.errors import RlxError
from rlx_conformance.report import lockfile
from rlx_conformance.report.lockfile import Entry, Lock

EXP = ("exp", "float32", "mlx-cpu-eager")
ADD = ("add", "float32", "mlx-cpu-eager")


def observed(results):
    return lockfile.observe([r.to_json() for r in results])


def test_observe_takes_the_worst_passing_case():
    rs = group("exp", "float32", [1.0, 14.0, 3.0]) + [result("exp", "float32", "fail", n=50, ulp=1e9, rel=1.0)]
    obs = observed(rs)
    assert obs[EXP].max_ulp == 14.0 and obs[EXP].max_rel_err == 14.0 * 2.0 ** -23


def test_check_violation_tighter_unlocked():
    lock = Lock(entries={EXP: Entry(max_ulp=10.0, max_rel_err=1e-6), ADD: Entry(max_ulp=16.0, max_rel_err=1e-6)})
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
    chk = lockfile.check(Lock(entries={EXP: Entry(max_ulp=locked)}), {EXP: Entry(max_ulp=seen)})
    assert bool(chk.tighter) == tighter and not chk.violations


def test_update_tightens_adds_and_refuses_to_loosen_without_reason():
    lock = Lock(entries={EXP: Entry(max_ulp=10.0), ADD: Entry(max_ulp=16.0, reason="GPU order")})
    obs = {EXP: Entry(max_ulp=12.0), ADD: Entry(max_ulp=2.0), ("neg", "float16", "mlx-cpu-lazy"): Entry(0.0, 0.0)}
    chk = lockfile.check(lock, obs)
    new, refused = lockfile.updated(lock, chk)
    assert refused == 1 and new[EXP].max_ulp == 10.0  # not loosened
    assert new[ADD].max_ulp == 2.0 and new[ADD].reason == "GPU order"
    assert new[("neg", "float16", "mlx-cpu-lazy")] == Entry(0.0, 0.0)
    # the unlocked group's target is covered now: its groups default to 0, no entry kept for neg
    assert new.targets == {"mlx-cpu-lazy"} and ("neg", "float16", "mlx-cpu-lazy") not in new.entries
    assert new[("exp", "float64", "mlx-cpu-lazy")] == Entry(0.0, 0.0)
    assert lock[ADD].max_ulp == 16.0  # the input lock is left alone
    new, refused = lockfile.updated(lock, chk, reason="MLX 0.33 changed exp")
    assert refused == 0 and new[EXP] == Entry(max_ulp=12.0, reason="MLX 0.33 changed exp")


def test_file_round_trip(tmp_path):
    lock = Lock(entries={EXP: Entry(14.0, 8.25e-07), ADD: Entry(max_ulp=math.inf, reason='say "why"\nand ✓'),
                         ("onnx.GatherND", "int64", "mlx-gpu-lazy-tf32:off"): Entry(max_rel_err=0.0)})
    path = lockfile.write(lock, tmp_path / "lock.toml")
    text = path.read_text()
    assert text.startswith("# Tolerance lock") and "Format." in text
    tomllib.loads(text)  # valid TOML
    assert lockfile.load(path) == lock


CPU = {"mlx-cpu-compiled", "mlx-cpu-eager", "mlx-cpu-lazy"}


def test_file_keeps_non_default_groups_and_collapses_modes(tmp_path):
    fft = ("fft", "float32")
    entries = {**{("exp", "float32", t): Entry(1.0, 1e-7) for t in CPU},
               **{("add", "int32", t): Entry(0.0, 0.0) for t in CPU},  # the default: no line
               (*fft, "mlx-cpu-compiled"): Entry(9.0, 3.0), (*fft, "mlx-cpu-eager"): Entry(9.0, 2.0),
               (*fft, "mlx-cpu-lazy"): Entry(9.0, 2.0),
               ("sum", "float32", "mlx-gpu-lazy"): Entry(4.0, 1e-6, "atomics")}  # a target not covered
    lock = Lock(set(CPU), entries)
    text = lockfile.dumps(lock)
    groups = tomllib.loads(text)["lock"]["groups"]
    assert groups == {"exp/float32/mlx-cpu": {"max_ulp": 1.0, "max_rel_err": 1e-7},
                      "fft/float32/mlx-cpu-compiled": {"max_ulp": 9.0, "max_rel_err": 3.0},
                      "fft/float32/mlx-cpu-eager": {"max_ulp": 9.0, "max_rel_err": 2.0},
                      "fft/float32/mlx-cpu-lazy": {"max_ulp": 9.0, "max_rel_err": 2.0},
                      "sum/float32/mlx-gpu-lazy": {"max_ulp": 4.0, "max_rel_err": 1e-6, "reason": "atomics"}}
    # the header quotes the file's own lines
    assert '#   "exp/float32/mlx-cpu" = { max_ulp = 1.0, max_rel_err = 1e-07 }' in text
    back = lockfile.load(lockfile.write(lock, tmp_path / "lock.toml"))
    assert back == lock.normalized()
    assert all(back.get(k) == e for k, e in entries.items())
    # covered: the zero default; not covered: not locked
    assert back.get(("neg", "bfloat16", "mlx-cpu-eager")) == Entry(0.0, 0.0)
    assert back.get(("neg", "bfloat16", "mlx-gpu-lazy")) is None


def test_one_target_line_overrides_a_backend_device_line(tmp_path):
    p = tmp_path / "lock.toml"
    p.write_text('[lock]\ntargets = ["mlx-cpu-eager", "mlx-cpu-lazy"]\n[lock.groups]\n'
                 '"exp/float32/mlx-cpu-lazy" = { max_ulp = 3.0 }\n"exp/float32/mlx-cpu" = { max_ulp = 1.0 }\n')
    lock = lockfile.load(p)
    assert lock[("exp", "float32", "mlx-cpu-eager")] == Entry(max_ulp=1.0)
    assert lock[("exp", "float32", "mlx-cpu-lazy")] == Entry(max_ulp=3.0)
    p.write_text('[lock]\ntargets = ["mlx-cpu-eager"]\n[lock.groups]\n"exp/float32/mlx-gpu" = { max_ulp = 1.0 }\n')
    with pytest.raises(RlxError, match="no target of mlx-gpu"):
        lockfile.load(p)


def test_zero_default_checks_covered_groups():
    lock = Lock({"mlx-cpu-eager"})
    obs = {ADD: Entry(0.0, 0.0), EXP: Entry(1.0, 1e-7), ("exp", "float32", "mlx-gpu-lazy"): Entry(5.0, 1e-6)}
    chk = lockfile.check(lock, obs)
    assert chk.checked == 2 and [v["group"] for v in chk.violations] == ["exp/float32/mlx-cpu-eager"] * 2
    assert [u["group"] for u in chk.unlocked] == ["exp/float32/mlx-gpu-lazy"]
    new, refused = lockfile.updated(lock, chk, reason="exp is 1 ULP off")
    assert refused == 0 and new.targets == {"mlx-cpu-eager", "mlx-gpu-lazy"}
    assert new.entries == {EXP: Entry(1.0, 1e-7, "exp is 1 ULP off"),
                           ("exp", "float32", "mlx-gpu-lazy"): Entry(5.0, 1e-6)}


def test_load_rejects_bad_entries(tmp_path):
    p = tmp_path / "lock.toml"
    p.write_text('[lock.groups]\n"exp/float32/mlx-cpu-eager" = { max_ulps = 3 }\n')
    with pytest.raises(RlxError, match="must be a table"):
        lockfile.load(p)
    p.write_text('[lock.groups]\n"exp-float32" = { max_ulp = 3 }\n')
    with pytest.raises(RlxError, match="bad group key"):
        lockfile.load(p)
    p.write_text('[lock]\n"exp/float32/mlx-cpu-eager" = { max_ulp = 3 }\n')  # the old format
    with pytest.raises(RlxError, match="targets and"):
        lockfile.load(p)
    assert lockfile.load(tmp_path / "absent.toml") == Lock()


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
