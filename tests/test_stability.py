"""Bit-stability (rlx_conformance/judge/stability.py): output digests, --repeat plumbing, the
classification of (op, dtype, backend, device, mode) groups, and the enforcement of the groups
recorded bit-stable in cases/bit_stable.toml."""
from __future__ import annotations

import json
import tomllib
from collections import deque

import numpy as np
import pytest

from rlx_conformance.cli import main as cli
from rlx_conformance.cli import stability as stability_cmd
from rlx_conformance.core import data
from rlx_conformance.core.dtypes import np_dtype
from rlx_conformance.core.results import CaseResult, write_results
from rlx_conformance.generate import matrix
from rlx_conformance.judge import stability
from rlx_conformance.run import runner


# -- digests -------------------------------------------------------------------------------------
def test_digest_is_deterministic_and_content_addressed():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((31, 17)).astype(np.float32)
    b = rng.integers(-5, 5, size=7).astype(np.int64)
    d = stability.output_digest([a, b])
    assert d == stability.output_digest([a.copy(), b.copy()])
    assert len(d) == 32 and int(d, 16) >= 0
    assert d == stability.output_digest([np.asfortranarray(a), b])  # layout does not matter, values do
    assert d != stability.output_digest([b, a])  # output order does
    c = a.copy()
    c[3, 4] = np.nextafter(c[3, 4], np.float32(np.inf))
    assert d != stability.output_digest([c, b])  # one ulp
    # the same bytes under another dtype or shape are another output
    assert stability.output_digest([a]) != stability.output_digest([a.view(np.int32)])
    assert stability.output_digest([a]) != stability.output_digest([a.reshape(17, 31)])


def test_digest_sees_every_bit():
    z = np.array([0.0, 1.0], np.float32)
    assert stability.output_digest([z]) != stability.output_digest([np.array([-0.0, 1.0], np.float32)])
    q = np.array([np.nan], np.float32)
    other_nan = q.view(np.uint32) | np.uint32(1)
    assert stability.output_digest([q]) != stability.output_digest([other_nan.view(np.float32)])


def test_digest_of_every_dtype_and_shape():
    for name in ("bfloat16", "float16", "float64", "bool", "uint8", "int64"):
        x = np.zeros((0, 3), np_dtype(name))
        assert stability.output_digest([x]) != stability.output_digest([np.zeros((3, 0), np_dtype(name))])
        assert stability.output_digest([np.ones((), np_dtype(name))]) == stability.output_digest(
            [np.ones((), np_dtype(name))])


# -- synthetic records ---------------------------------------------------------------------------
def case(op="exp", dtype="float32", mode="lazy", shape=(7,), vals="random", device="cpu", grad=""):
    return matrix.Case(op, dtype, (shape,), "odd", (), vals, matrix.Target("mlx", device, mode), grad=grad)


def rec(digests, outcome="pass", **kw) -> CaseResult:
    """A merged record: one digest, or a list of per-repeat digests."""
    r = CaseResult.for_case(case(**kw), outcome)
    if isinstance(digests, list):
        r.repeat_digests = digests
        r.output_digest = digests[0]
    else:
        r.output_digest = digests
    return r


def classes(section) -> dict[tuple[str, str, str], str]:
    return {(g["op"], g["dtype"], g["mode"]): g["class"] for g in section["groups"]}


def test_classify_all_classes():
    results = [
        # exp: the same bits in every mode and repeat
        rec(["a", "a"], mode="eager"), rec(["a", "a"], mode="lazy"), rec(["a", "a"], mode="compiled"),
        rec(["b", "b"], mode="eager", shape=(9,)), rec(["b", "b"], mode="lazy", shape=(9,)),
        # sin: compiled differs from eager and lazy on one input set
        rec("s", op="sin", mode="eager"), rec("s", op="sin", mode="lazy"), rec("t", op="sin", mode="compiled"),
        rec("u", op="sin", mode="eager", shape=(9,)), rec("u", op="sin", mode="compiled", shape=(9,)),
        # tanh: lazy gives two outputs over two repeats
        rec(["x", "y"], op="tanh", mode="lazy"), rec(["x", "x"], op="tanh", mode="eager"),
        # log: one run of one mode
        rec("l", op="log", mode="lazy"),
        # cos: no output at all (error): not a group
        rec(None, op="cos", mode="lazy", outcome="error"),
    ]
    s = stability.classify(results)
    c = classes(s)
    assert c == {
        ("exp", "float32", "eager"): "bit-stable", ("exp", "float32", "lazy"): "bit-stable",
        ("exp", "float32", "compiled"): "bit-stable",
        ("sin", "float32", "eager"): "mode-dependent", ("sin", "float32", "lazy"): "mode-dependent",
        ("sin", "float32", "compiled"): "mode-dependent",
        ("tanh", "float32", "lazy"): "nondeterministic", ("tanh", "float32", "eager"): "bit-stable",
        ("log", "float32", "lazy"): "unknown",
    }
    assert s["counts"] == {"bit-stable": 4, "mode-dependent": 3, "nondeterministic": 1, "unknown": 1}
    g = {(g["op"], g["mode"]): g for g in s["groups"]}
    assert g[("sin", "compiled")]["differs_from"] == ["eager", "lazy"]
    assert g[("sin", "lazy")]["differs_from"] == ["compiled"]
    assert g[("sin", "compiled")]["mode_dependent_cases"] == 1  # the second input set agrees
    assert g[("tanh", "lazy")]["examples"] == [case(op="tanh", mode="lazy").id]
    assert g[("exp", "eager")]["cases"] == 2 and g[("exp", "eager")]["repeated"] == 2
    # the same from the JSON records of results.json
    assert stability.classify([r.to_json() for r in results]) == s
    assert stability.summary_line(s).startswith(
        "stability: 4 bit-stable, 3 mode-dependent, 1 nondeterministic, 1 unknown")


def test_classify_repeats_alone_and_devices_apart():
    # repeats alone (one mode) are evidence; a different device is not a mode to compare with
    s = stability.classify([rec(["a", "a"], mode="lazy"), rec("b", mode="lazy", device="gpu")])
    assert {(g["device"], g["class"]) for g in s["groups"]} == {("cpu", "bit-stable"), ("gpu", "unknown")}
    assert "--repeat" in stability.summary_line(stability.classify([rec("a")]))
    # a backend variant (a numerics setting such as tf32:off) is compared within itself only
    v = rec("b", mode="eager")
    v.variant = "tf32:off"
    s = stability.classify([rec("a", mode="lazy"), rec("a", mode="eager"), v])
    assert {g["mode"]: (g["class"], g["compared_with"]) for g in s["groups"]} == {
        "lazy": ("bit-stable", ["eager"]), "eager": ("bit-stable", ["lazy"]), "eager-tf32:off": ("unknown", [])}


def test_stable_modes():
    s = stability.classify([
        rec("a", mode="eager"), rec("a", mode="lazy"), rec("b", mode="compiled"),  # compiled odd one out
        rec(["c", "c"], op="tanh", mode="lazy"), rec("d", op="tanh", mode="eager"),  # only repeats agree
        rec(["x", "y"], op="log", mode="lazy"), rec("x", op="log", mode="eager"),  # nothing stable
        rec("p", op="sin", mode="lazy"),  # unknown: nothing recorded
    ])
    assert stability.stable_modes(s) == {("exp", "float32", "mlx", "cpu"): ["eager", "lazy"],
                                         ("tanh", "float32", "mlx", "cpu"): ["lazy"]}


# -- --repeat plumbing ---------------------------------------------------------------------------
def test_repeat_cases_keep_ids_and_seeds():
    cs = [case(), case(shape=(9,))]
    rep = stability.repeat_cases(cs, 3)
    assert [c.repeat for c in rep] == [0, 0, 1, 1, 2, 2]
    assert [c.id for c in rep] == [c.id for c in cs] * 3
    assert {c.seed for c in rep} == {c.seed for c in cs}
    assert stability.repeat_cases(cs, 1) == cs


def test_merge_repeats():
    def run(shape, k, outcome, digest):
        r = CaseResult.for_case(matrix.Case("exp", "float32", (shape,), "odd", (), "random",
                                            matrix.Target("mlx", "cpu", "lazy"), repeat=k), outcome)
        r.output_digest = digest
        return r

    raw = [run((9,), 1, "pass", "b"), run((7,), 0, "pass", "a"), run((9,), 0, "pass", "b"),
           run((7,), 1, "timeout", None)]
    assert [r.repeat for r in raw] == [1, 0, 0, 1]
    merged = stability.merge_repeats(raw)
    assert [r.shape for r in merged] == [[[9]], [[7]]]  # order of first arrival
    assert merged[0].outcome == "pass" and merged[0].repeat_digests == ["b", "b"] and merged[0].repeat == 0
    assert merged[1].outcome == "timeout" and merged[1].repeat_digests == ["a", None]
    assert "outcome differs between 2 repeats (pass, timeout)" in merged[1].message
    assert stability.digests_of(merged[1]) == ["a"]


def test_tasks_of_repeats_line_up_and_go_to_other_workers():
    cs = matrix.generate([matrix.Target("mlx", "cpu", "eager"), matrix.Target("mlx", "cpu", "lazy")],
                         ops=["neg"], dtypes=["float32"])
    r = runner.Runner(workers=2, task_size=5)
    tasks = r._tasks(stability.repeat_cases(cs, 2))
    first = [[c.id for c in t] for t in tasks if t[0].repeat == 0]
    second = [[c.id for c in t] for t in tasks if t[0].repeat == 1]
    assert first == second and all(len({c.repeat for c in t}) == 1 for t in tasks)
    a = runner._Worker(proc=None, conn=None)
    b = runner._Worker(proc=None, conn=None)
    q = deque(tasks)
    for w in [a, b] * (len(first) // 2):  # repeat 0: alternating
        r._pick(q, w, 2)
    while q:  # repeat 1: each worker takes the tasks the other one ran, as long as there are any
        for w in (a, b):
            if q:
                r._pick(q, w, 2)
    assert r.same_worker_repeats <= 1  # only an odd task count can force one


def test_repeat_run(tmp_path):
    out = tmp_path / "r"
    rc = cli.main(["run", "--repeat", "2", "--op", "exp", "--dtypes", "float32", "--mode", "eager,lazy",
                   "--workers", "1", "--report", str(out), "--no-progress", "--grad", "none",
                   "--layouts", "none"])
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    cases = doc["cases"]
    assert doc["run"]["repeat"] == 2 and doc["run"]["cases_planned"] == len(cases) == 28
    assert len({c["id"] for c in cases}) == len(cases)  # merged per id
    for c in cases:
        assert c["repeat"] == 0 and len(c["repeat_digests"]) == 2 and c["output_digest"]
        assert len(set(c["repeat_digests"])) == 1, c["id"]
    st = doc["stability"]
    assert st["counts"]["bit-stable"] == 2 and st["counts"]["nondeterministic"] == 0
    assert {g["mode"]: g["compared_with"] for g in st["groups"]} == {"eager": ["lazy"], "lazy": ["eager"]}
    assert not (out / "results.partial.jsonl").exists()
    # two runs of the same cases are repeats of each other
    recs, run = stability_cmd.load_runs([str(out / "results.json")] * 2)
    assert len(recs) == 28 and run["repeat"] == 2
    assert all(len(r["repeat_digests"]) == 4 for r in recs)
    # the stability command reads it back, and --update writes a file enforce can load
    f = tmp_path / "bit_stable.toml"
    assert cli.main(["stability", str(out / "results.json"), "--update", "--file", str(f)]) == 0
    tables = tomllib.loads(f.read_text())["stable"]
    assert [{k: v for k, v in t.items() if k != "recorded"} for t in tables] == [
        {"backend": "mlx", "device": "cpu", "host": stability.host(), "modes": ["eager", "lazy"],
         "ops": [{"dtypes": ["float32"], "ops": ["exp"]}]}]
    assert len(tables[0]["recorded"]) == 1 and "1 run(s), the first with repeat 2" in tables[0]["recorded"][0]


def test_bad_repeat_is_a_usage_error(capsys):
    assert cli.main(["run", "--repeat", "0", "--op", "exp"]) == 2
    assert "--repeat" in capsys.readouterr().err


# -- enforcement ---------------------------------------------------------------------------------
RECORDED = {("exp", "float32", "mlx", "cpu"): frozenset({"eager", "lazy", "compiled"}),
            ("sin", "float32", "mlx", "cpu"): frozenset({"eager", "lazy"})}


def test_enforce_fails_the_odd_mode_out():
    rs = [rec("a", mode="eager"), rec("a", mode="lazy"), rec("b", mode="compiled")]
    assert stability.enforce(rs, RECORDED) == 1
    assert [r.outcome for r in rs] == ["pass", "pass", "fail"]
    assert rs[2].message.startswith("bit-stability: mode compiled disagrees bit-wise with eager and lazy, "
                                    "for a group recorded bit-stable")


def test_enforce_fails_both_of_two_disagreeing_modes():
    rs = [rec("a", mode="lazy"), rec("b", mode="compiled", outcome="xfail")]
    rs[1].message = "known divergence (precision: ...)"
    assert stability.enforce(rs, RECORDED) == 2
    assert [r.outcome for r in rs] == ["fail", "fail"]
    assert rs[0].message == ("bit-stability: modes compiled and lazy disagree bit-wise, for a group "
                             "recorded bit-stable in cases/bit_stable.toml")
    assert rs[1].message.endswith("— was xfail: known divergence (precision: ...)")


def test_enforce_fails_disagreeing_repeats():
    rs = [rec(["a", "b"], mode="lazy"), rec(["a", "a"], mode="eager")]
    assert stability.enforce(rs, RECORDED) == 1
    assert rs[0].outcome == "fail" and "2 repeats gave 2 different outputs in mode lazy" in rs[0].message
    assert rs[1].outcome == "pass"


def test_enforce_leaves_what_is_not_recorded_alone():
    rs = [rec("a", op="sin", mode="lazy"), rec("b", op="sin", mode="compiled"),  # compiled not recorded
          rec("a", op="tanh", mode="lazy"), rec("b", op="tanh", mode="eager"),  # op not recorded
          rec("a", dtype="float16", mode="lazy"), rec("b", dtype="float16", mode="eager"),  # dtype not
          rec("a", mode="lazy", device="gpu"), rec("b", mode="eager", device="gpu"),  # device not
          rec("a", mode="lazy", shape=(9,)), rec("b", mode="eager", outcome="skip", shape=(9,)),  # a skip
          rec("a", mode="lazy", shape=(5,)), rec("b", mode="eager", shape=(3,))]  # other inputs
    before = [(r.outcome, r.message) for r in rs]
    assert stability.enforce(rs, RECORDED) == 0
    assert [(r.outcome, r.message) for r in rs] == before


def test_derivative_digests_are_their_own_groups():
    # the forward and the VJP of one op and input set: each compared across its own modes and
    # repeats, never with the other's outputs
    rs = [rec("f", mode="eager"), rec("f", mode="lazy"),
          rec("g", mode="eager", grad="vjp"), rec("h", mode="lazy", grad="vjp"),
          rec(["j", "k"], mode="eager", grad="jvp")]
    assert {r.id.split("/")[-2] for r in rs[2:]} == {"grad:vjp", "grad:jvp"}
    s = stability.classify(rs)
    assert classes(s) == {("exp", "float32", "eager"): "bit-stable", ("exp", "float32", "lazy"): "bit-stable",
                          ("exp:vjp", "float32", "eager"): "mode-dependent",
                          ("exp:vjp", "float32", "lazy"): "mode-dependent",
                          ("exp:jvp", "float32", "eager"): "nondeterministic"}
    assert stability.stable_modes(s) == {("exp", "float32", "mlx", "cpu"): ["eager", "lazy"]}
    assert stability.classify([r.to_json() for r in rs]) == s
    # recorded bit-stable: the forward's record says nothing of the derivative, and the other way
    assert stability.enforce([rec("g", mode="eager", grad="vjp"), rec("h", mode="lazy", grad="vjp")],
                             RECORDED) == 0
    rs = [rec("f", mode="eager"), rec("f", mode="lazy"), rec("g", mode="eager", grad="vjp"),
          rec("h", mode="lazy", grad="vjp")]
    assert stability.enforce(rs, {("exp:vjp", "float32", "mlx", "cpu"): frozenset({"eager", "lazy"})}) == 2
    assert [r.outcome for r in rs] == ["pass", "pass", "fail", "fail"]


def test_committed_file_loads():
    path = data.data_path(stability.RECORDED_FILE)
    text = path.read_text()
    assert text.startswith("# ") and "rlx-conformance stability --update" in text
    tables = tomllib.loads(text)["stable"]
    assert tables and all(set(t) <= {"backend", "device", "host", "modes", "recorded", "note", "ops"} for t in tables)
    assert all(t["modes"] and set(t["modes"]) <= {"eager", "lazy", "compiled"} for t in tables)
    rec_ = stability.load_recorded()  # this host's groups only
    assert len(rec_) == sum(len(o["ops"]) * len(o["dtypes"]) for t in tables if t["host"] == stability.host()
                            for o in t["ops"])
    if any(t["host"] == stability.host() for t in tables):
        assert ("exp", "float32", "mlx", "cpu") in rec_


def test_update_keeps_uncovered_groups(tmp_path):
    here = stability.host()
    f = tmp_path / "b.toml"

    def table(host, ops, recorded=("then",), note=None):
        t = {"backend": "mlx", "device": "cpu", "host": host, "modes": ["eager", "lazy"], "recorded": list(recorded)}
        return {**t, **({"note": note} if note else {}),
                "ops": [{"dtypes": d, "ops": o} for d, o in ops]}

    f.write_text(f'[[stable]]\nbackend = "mlx"\ndevice = "cpu"\nhost = "{here}"\nmodes = ["eager", "lazy"]\n'
                 'recorded = ["then"]\nnote = "by hand"\n'
                 '[[stable.ops]]\ndtypes = ["float16", "float32"]\nops = ["log"]\n'
                 '[[stable.ops]]\ndtypes = ["float32"]\nops = ["exp"]\n\n'
                 '[[stable]]\nbackend = "mlx"\ndevice = "cpu"\nhost = "Plan9-mips"\nmodes = ["eager", "lazy"]\n'
                 'recorded = ["then"]\n[[stable.ops]]\ndtypes = ["float32"]\nops = ["exp"]\n')
    s = stability.classify([rec("a", mode="eager"), rec("b", mode="lazy"),  # exp no longer stable here
                            rec("c", op="log", mode="eager"), rec("c", op="log", mode="lazy")])
    assert stability_cmd.update_file(f, s, {"repeat": 1}) == 3
    now = stability_cmd.provenance_line({"repeat": 1}, 1, ["exp", "log"], ["exp"])
    assert "not bit-stable in any mode: exp" in now
    assert tomllib.loads(f.read_text())["stable"] == [
        table(here, [(["float16", "float32"], ["log"])], ("then", now), "by hand"),  # + this update's line
        table("Plan9-mips", [(["float32"], ["exp"])])]  # another host's observation is kept
    assert stability.host("macOS-14.4-arm64-arm-64bit", "arm64") == "macOS-arm64"


def test_results_json_carries_the_section(tmp_path):
    p = tmp_path / "results.json"
    rs = [rec("a", mode="eager"), rec("a", mode="lazy")]
    write_results(p, {}, rs, stability.classify(rs))
    doc = json.loads(p.read_text())
    assert doc["stability"]["counts"]["bit-stable"] == 2
    assert doc["cases"][0]["output_digest"] == "a"


@pytest.mark.parametrize("outcome", ["error", "crash", "timeout"])
def test_no_output_no_group(outcome):
    assert stability.classify([rec(None, outcome=outcome)])["groups"] == []


def test_enforce_leaves_out_an_xfail_of_a_nondeterministic_entry(monkeypatch):
    """An xfail under a strict = false entry (its wrong output comes and goes) is not compared
    bit-wise; the other modes still are. Under a strict entry it is (the test above)."""
    from rlx_conformance.judge import divergences as kd

    loose = kd.Divergence(key="varies", op=("exp",), category="backend-bug", reason="garbage at times",
                          excuses=frozenset({"nonfinite"}), strict=False)
    monkeypatch.setattr(kd, "by_key", lambda: {"varies": loose})
    rs = [rec("a", mode="lazy"), rec("b", mode="compiled", outcome="xfail"), rec("a", mode="eager")]
    rs[1].divergence = {"entry": "varies"}
    assert stability.enforce(rs, RECORDED) == 0
    assert [r.outcome for r in rs] == ["pass", "xfail", "pass"]
    rs = [rec("a", mode="lazy"), rec("b", mode="compiled", outcome="xfail"), rec("c", mode="eager")]
    rs[1].divergence = {"entry": "varies"}
    assert stability.enforce(rs, RECORDED) == 2  # lazy and eager still disagree between themselves
