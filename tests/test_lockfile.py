"""The tolerance lock: observed worst errors per group, violations when they grow, tighter
proposals when they shrink, loosening only with a reason, and the file format (covered targets
locked at 0 by default, modes collapsed) round trip."""
from __future__ import annotations

import json
import math
import tomllib

import pytest
from grad_fixtures import dgroup
from results_fixtures import group, result, write

from rlx_conformance.cli import main as cli
from rlx_conformance.core.errors import RlxError
from rlx_conformance.report import lockfile
from rlx_conformance.report.lockfile import Entry, Lock

# ops without a budget in ULP (fft has none; vendor ops no budget at all): the lock mechanics alone
EXP = ("fft", "float32", "mlx-cpu-eager")
ADD = ("vendor.add", "float32", "mlx-cpu-eager")


def observed(results):
    return lockfile.observe([r.to_json() for r in results])


def test_observe_takes_the_worst_passing_case():
    rs = group("fft", "float32", [1.0, 14.0, 3.0]) + [result("fft", "float32", "fail", n=50, ulp=1e9, rel=1.0)]
    obs = observed(rs)
    assert obs[EXP].max_ulp == 14.0 and obs[EXP].max_rel_err == 14.0 * 2.0 ** -23


def test_check_violation_tighter_unlocked():
    lock = Lock(entries={EXP: Entry(max_ulp=10.0, max_rel_err=1e-6), ADD: Entry(max_ulp=16.0, max_rel_err=1e-6)})
    obs = {EXP: Entry(max_ulp=12.0, max_rel_err=1e-6),  # grew: violation (ulp)
           ADD: Entry(max_ulp=8.0, max_rel_err=1e-7),  # ≤ half: tighter (both)
           ("vendor.neg", "float32", "mlx-cpu-eager"): Entry(max_ulp=0.0, max_rel_err=0.0)}  # not locked
    chk = lockfile.check(lock, obs, "x.toml")
    assert chk.checked == 2
    assert [(v["group"], v["metric"], v["locked"], v["observed"]) for v in chk.violations] == [
        ("fft/float32/mlx-cpu-eager", "max_ulp", 10.0, 12.0)]
    assert {(t["group"], t["metric"], t["proposed"]) for t in chk.tighter} == {
        ("vendor.add/float32/mlx-cpu-eager", "max_ulp", 8.0), ("vendor.add/float32/mlx-cpu-eager", "max_rel_err", 1e-7)}
    assert [u["group"] for u in chk.unlocked] == ["vendor.neg/float32/mlx-cpu-eager"]


@pytest.mark.parametrize("locked,seen,tighter", [(14.0, 8.0, False), (14.0, 7.0, True), (1.0, 0.0, True),
                                                 (1.5, 0.5, True), (1.0, 0.4, False), (math.inf, 3.0, True)])
def test_tighter_needs_half_and_one_ulp(locked, seen, tighter):
    chk = lockfile.check(Lock(entries={EXP: Entry(max_ulp=locked)}), {EXP: Entry(max_ulp=seen)})
    assert bool(chk.tighter) == tighter and not chk.violations


def test_update_tightens_adds_and_refuses_to_loosen_without_reason():
    lock = Lock(entries={EXP: Entry(max_ulp=10.0), ADD: Entry(max_ulp=16.0, reason="GPU order")})
    obs = {EXP: Entry(max_ulp=12.0), ADD: Entry(max_ulp=2.0), ("vendor.neg", "float16", "mlx-cpu-lazy"): Entry(0.0, 0.0)}
    chk = lockfile.check(lock, obs)
    new, refused = lockfile.updated(lock, chk)
    assert refused == 1 and new[EXP].max_ulp == 10.0  # not loosened
    assert new[ADD].max_ulp == 2.0 and new[ADD].reason == "GPU order"
    assert new[("vendor.neg", "float16", "mlx-cpu-lazy")] == Entry(0.0, 0.0)
    # the unlocked group's target is covered now: its groups default to 0, no entry kept for neg
    assert new.targets == {"mlx-cpu-lazy"} and ("vendor.neg", "float16", "mlx-cpu-lazy") not in new.entries
    assert new[("fft", "float64", "mlx-cpu-lazy")] == Entry(0.0, 0.0)
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
    obs = {ADD: Entry(0.0, 0.0), EXP: Entry(1.0, 1e-7), ("fft", "float32", "mlx-gpu-lazy"): Entry(5.0, 1e-6)}
    chk = lockfile.check(lock, obs)
    assert chk.checked == 2 and [v["group"] for v in chk.violations] == ["fft/float32/mlx-cpu-eager"] * 2
    assert [u["group"] for u in chk.unlocked] == ["fft/float32/mlx-gpu-lazy"]
    new, refused = lockfile.updated(lock, chk, reason="exp is 1 ULP off")
    assert refused == 0 and new.targets == {"mlx-cpu-eager", "mlx-gpu-lazy"}
    assert new.entries == {EXP: Entry(1.0, 1e-7, "exp is 1 ULP off"),
                           ("fft", "float32", "mlx-gpu-lazy"): Entry(5.0, 1e-6)}


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


def test_derivative_groups_are_locked_apart_from_the_forward(tmp_path):
    # exp has a ULP accuracy budget; its VJP has none (judged by its error bound): a derivative
    # group's errors are locked as measured, under its own key, and never capped by exp's budget
    cap = lockfile.ulp_cap("exp", "float32")
    assert cap is not None and lockfile.ulp_cap("exp:vjp", "float32") is None
    rs = group("exp", "float32", [1.0, 0.0]) + dgroup("vjp", "exp", "float32", [3.0, 4 * cap]) \
        + dgroup("jvp", "exp", "float32", [0.0])
    obs = observed(rs)
    fwd, vjp = ("exp", "float32", "mlx-cpu-eager"), ("exp:vjp", "float32", "mlx-cpu-eager")
    assert obs[fwd].max_ulp == 1.0 and obs[vjp].max_ulp == 4 * cap and ("exp:jvp", "float32", "mlx-cpu-eager") in obs
    chk = lockfile.check(Lock(targets={"mlx-cpu-eager"}), obs)
    assert not chk.over_budget
    assert {(v["group"], v["observed"]) for v in chk.violations if v["metric"] == "max_ulp"} == {
        ("exp/float32/mlx-cpu-eager", 1.0), ("exp:vjp/float32/mlx-cpu-eager", 4 * cap)}
    new, _ = lockfile.updated(Lock(targets={"mlx-cpu-eager"}), chk, reason="first derivative baseline")
    path = lockfile.write(new, tmp_path / "lock.toml")
    groups = tomllib.loads(path.read_text())["lock"]["groups"]
    assert set(groups) == {"exp/float32/mlx-cpu", "exp:vjp/float32/mlx-cpu"}
    back = lockfile.load(path)
    assert back[vjp].max_ulp == 4 * cap and back[fwd].max_ulp == 1.0
    assert back[("exp:jvp", "float32", "mlx-cpu-eager")] == lockfile.zero()
    # the VJP growing is the VJP's violation alone
    grown = observed(group("exp", "float32", [1.0]) + dgroup("vjp", "exp", "float32", [8 * cap]))
    assert {(v["group"], v["metric"]) for v in lockfile.check(back, grown).violations} == {
        ("exp:vjp/float32/mlx-cpu-eager", "max_ulp"), ("exp:vjp/float32/mlx-cpu-eager", "max_rel_err")}


def test_committed_lock_parses():
    assert lockfile.default_path().is_file()
    lockfile.load()


def test_cli_lock_workflow(tmp_path, capsys):
    lock = tmp_path / "lock.toml"
    base = write(tmp_path / "base", group("fft", "float32", [4.0, 6.0]))
    # first: seed the lock from a run (unlocked groups get added); no regression
    assert cli.main(["diff", str(base), str(base), "--lock", str(lock), "--update-lock"]) == 0
    assert lockfile.load(lock)[EXP].max_ulp == 6.0
    # errors grow past the lock (within the drift thresholds): a violation, exit 1
    grown = write(tmp_path / "grown", group("fft", "float32", [4.0, 7.0]))
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock)]) == 1
    assert cli.main(["diff", str(base), str(grown), "--no-lock"]) == 0
    # --update-lock alone refuses to loosen; with a reason it loosens and the run passes
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock), "--update-lock"]) == 1
    assert lockfile.load(lock)[EXP].max_ulp == 6.0
    assert cli.main(["diff", str(base), str(grown), "--lock", str(lock), "--update-lock",
                     "--lock-reason", "new exp kernel"]) == 0
    assert lockfile.load(lock)[EXP] == Entry(7.0, 7.0 * 2.0 ** -23, "new exp kernel")
    # errors shrink: a proposal in the JSON, the lock unchanged without --update-lock
    better = write(tmp_path / "better", group("fft", "float32", [1.0, 2.0]))
    out = tmp_path / "d.json"
    assert cli.main(["diff", str(base), str(better), "--lock", str(lock), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {t["metric"] for t in doc["lock"]["tighter"]} == {"max_ulp", "max_rel_err"}
    assert lockfile.load(lock)[EXP].max_ulp == 7.0
    assert cli.main(["diff", str(base), str(better), "--lock", str(tmp_path / "none.toml")]) == 2
    capsys.readouterr()


# -- groups above their accuracy budget (cases/accuracy.toml) are no lock lines ----------------------
SOFTMAX = ("softmax", "float32", "mlx-cpu-eager")
REAL_EXP = ("exp", "float32", "mlx-cpu-eager")  # EXP above is fft: no budget caps it


def test_observe_carries_the_oracle_over_budget_count():
    rs = group("softmax", "float32", [3.0, 900.0], over_budget=0)
    rs[1].over_budget = 5  # elements over budget: counts as one case
    assert observed(rs)[SOFTMAX].over_budget == 1
    assert observed(group("exp", "float32", [1.0]))[REAL_EXP].over_budget is None  # no oracle ran


def test_group_over_budget_is_listed_apart_and_its_line_flagged():
    obs = {SOFTMAX: Entry(900.0, 1e-4, over_budget=2), REAL_EXP: Entry(1.0, 1e-7, over_budget=0)}
    # covered target, no line: the group is not compared with the default 0 (no violation)
    chk = lockfile.check(Lock({"mlx-cpu-eager"}, {REAL_EXP: Entry(1.0, 1e-7)}), obs)
    assert [g["group"] for g in chk.over_budget] == ["softmax/float32/mlx-cpu-eager"]
    assert "2 passing case(s) over the accuracy budget" in chk.over_budget[0]["why"]
    assert not chk.violations and not chk.lines_over_budget and not chk.unlocked
    # a line holding it, even one the run stays within, is above budget: flagged
    lock = Lock({"mlx-cpu-eager"}, {REAL_EXP: Entry(1.0, 1e-7), SOFTMAX: Entry(1000.0, 1e-3)})
    chk = lockfile.check(lock, obs)
    assert [(f["group"], f["max_ulp"]) for f in chk.lines_over_budget] == [("softmax/float32/mlx-cpu-eager", 1000.0)]
    assert not chk.violations and not chk.tighter
    new, refused = lockfile.updated(lock, chk, reason="accept it")  # no reason makes it a lock line
    assert refused == 0 and SOFTMAX not in new.entries and new.entries == {REAL_EXP: Entry(1.0, 1e-7)}
    # a not-covered target: never added as unlocked
    chk = lockfile.check(Lock(), {SOFTMAX: Entry(900.0, 1e-4, over_budget=1)})
    assert not chk.unlocked and len(chk.over_budget) == 1
    assert lockfile.updated(Lock(), chk)[0] == Lock()


def test_ulp_budget_caps_lines_and_runs_the_oracle_did_not_judge():
    """Without the oracle's count, a budget in ULP alone caps max_ulp at twice the budget (target
    and reference each within it); budgets of accumulating ops and ops without one cap nothing."""
    cap = lockfile.ulp_cap("exp", "float32")
    assert cap is not None and cap >= 0
    assert lockfile.ulp_cap("reduce_sum", "float32") is None  # an accumulating budget
    assert lockfile.ulp_cap("qr", "float64") is None  # no budget
    qr = ("qr", "float64", "mlx-cpu-eager")
    lock = Lock({"mlx-cpu-eager"}, {REAL_EXP: Entry(cap + 1, 1e-5), qr: Entry(9.2e18, 1.77)})
    chk = lockfile.check(lock, {})  # the lines alone: the run has neither group
    assert [f["group"] for f in chk.lines_over_budget] == ["exp/float32/mlx-cpu-eager"]
    assert "twice the accuracy budget" in chk.lines_over_budget[0]["why"]
    # a run without oracle fields over the cap: listed apart, and the line flagged once
    chk = lockfile.check(lock, {REAL_EXP: Entry(cap + 3, 1e-5)})
    assert [g["group"] for g in chk.over_budget] == ["exp/float32/mlx-cpu-eager"]
    assert len(chk.lines_over_budget) == 1 and not chk.violations
    # the oracle's verdict overrides the cap: within budget by its count, the line is judged as usual
    chk = lockfile.check(lock, {REAL_EXP: Entry(cap + 1, 1e-5, over_budget=0)})
    assert not chk.lines_over_budget and not chk.over_budget and not chk.violations


def test_committed_lock_holds_no_group_above_a_ulp_budget():
    chk = lockfile.check(lockfile.load(), {})
    assert chk.lines_over_budget == []


def test_cli_update_lock_removes_lines_above_budget(tmp_path, capsys):
    lock = tmp_path / "lock.toml"
    lockfile.write(Lock({"mlx-cpu-eager"}, {SOFTMAX: Entry(5547899.0, 1.0), REAL_EXP: Entry(1.0, 2.0 ** -23)}), lock)
    run = group("softmax", "float32", [5.0, 5547899.0], over_budget=0) + group("exp", "float32", [1.0], start=50)
    run[1].over_budget = 14
    rep = write(tmp_path / "run", run)
    out = tmp_path / "d.json"
    assert cli.main(["diff", str(rep), str(rep), "--lock", str(lock), "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    assert doc["counts"]["lock_over_budget"] == 1 and doc["counts"]["lock_violations"] == 0
    assert doc["lock"]["lines_over_budget"][0]["group"] == "softmax/float32/mlx-cpu-eager"
    assert cli.main(["diff", str(rep), str(rep), "--lock", str(lock), "--update-lock"]) == 0
    assert "removed the line of softmax/float32/mlx-cpu-eager" in capsys.readouterr().err
    assert SOFTMAX not in lockfile.load(lock).entries and lockfile.load(lock)[REAL_EXP].max_ulp == 1.0
    # and never writes one back, reason or not
    assert cli.main(["diff", str(rep), str(rep), "--lock", str(lock), "--update-lock", "--lock-reason", "x"]) == 0
    assert SOFTMAX not in lockfile.load(lock).entries
    assert "not locking softmax/float32/mlx-cpu-eager" in capsys.readouterr().err
