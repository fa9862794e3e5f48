"""cases/known_divergences.toml as data: the committed baselines judge under it exactly as they
record (every record's outcome, entry and message, every exhaustive row), nothing stale and no
part that matched nothing; entries are checked at load (keys, categories, the failure kinds an
entry excuses, the caps of an excused value failure); an op, dtype or id list goes stale item by
item, per op and per target, and a run of one device or one mode calls nothing stale that it did
not hold."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate import matrix
from rlx_conformance.generate.matrix import Target
from rlx_conformance.judge import divergences as kd
from rlx_conformance.judge.compare import Tolerance, compare, wrong_summary
from rlx_conformance.judge.divergences import Divergence
from rlx_conformance.report import records
from rlx_conformance.run import exhaustive
from rlx_conformance.run import outcomes as run_div

ROOT = Path(__file__).resolve().parent.parent
BASELINES = ("reports/baseline", "reports/gpu-baseline")
# the committed GPU runs that hold every case of their selection (no --sample-grad subset, whose
# entries would rightly say "matched no case"): judged again like the baselines; those of one
# target (device and mode) have no smaller one-mode subset to judge on its own
WHOLE_RUNS = ("reports/gpu-baseline/derivatives-eager-lazy", "reports/gpu-baseline/derivatives-huge",
              "reports/gpu-baseline/derivatives-tf32")
WHOLE_RUNS_OF_ONE_TARGET = ("reports/gpu-baseline/derivatives-compiled",)
# the committed runs with fewer than 2,500 excused cases, and the floor each stays above
SMALL_RUN_XFAIL_FLOOR = {"reports/gpu-baseline/derivatives-huge": 1000, "reports/gpu-baseline/derivatives-tf32": 1000}


def _case(op: str, dtype: str, case_id: str, target: Target) -> SimpleNamespace:
    return SimpleNamespace(op=op, dtype=dtype, id=case_id, target=target)


def _verdict(r: dict) -> tuple:
    return r["outcome"], (r.get("divergence") or {}).get("entry"), (r.get("divergence") or {}).get("excused"), \
        r.get("message")


@pytest.mark.parametrize("baseline", BASELINES + WHOLE_RUNS + WHOLE_RUNS_OF_ONE_TARGET)
def test_baseline_rejudges_to_what_it_records(baseline):
    """``merge --rejudge`` of a committed baseline under the file as it is gives every record
    back unchanged, marks nothing stale and warns of nothing: the data and the baseline agree
    (editing one without the other fails here)."""
    recs = records.load(ROOT / baseline / "results.json.gz").cases
    results = [run_div.rejudge(CaseResult.from_json(r)) for r in recs]
    # (entries about cases added to the matrix after a baseline was made scope cases it did not
    # select: silent, as for a sampled run)
    assert run_div.finalize(results) == []
    got = [_verdict(r.to_json()) for r in results]
    diff = [(r["id"], _verdict(r), g) for r, g in zip(recs, got) if _verdict(r) != g
            and not _pass_under_nondeterministic_entry(_verdict(r), g)]
    assert not diff, diff[:5]
    # a floor that an empty or unexcused file fails: each committed run has hundreds of excused
    # cases at least (the huge-shape derivative run 1,242, the TF32 one 1,446, the others over 2,500)
    assert sum(r["outcome"] == "xfail" for r in recs) > SMALL_RUN_XFAIL_FLOOR.get(baseline, 2500)
    assert not [r["id"] for r in recs if r["outcome"] == "xpass"]


def _pass_under_nondeterministic_entry(was: tuple, now: tuple) -> bool:
    """A pass the baseline recorded that now lies in the scope of a strict = false entry (a
    divergence that shows in some runs only, found after the baseline): still a pass, now
    annotated with the entry; any other change is a disagreement."""
    return was == ("pass", None, None, "") and now[0] == "pass" and now[1] is not None \
        and not kd.by_key()[now[1]].strict


@pytest.mark.parametrize("baseline", BASELINES + WHOLE_RUNS)
def test_a_one_mode_or_one_device_subset_of_a_baseline_rejudges_without_xpass(baseline):
    """Issue 19: what most users run is one mode or one device (``tox -e mlx`` runs the compiled
    mode only). Each such subset of a committed run, judged again on its own, reports no xpass:
    an entry goes stale only where every case of it that the subset holds passes, never because
    its failing cases lie in a mode or device the subset lacks."""
    recs = records.load(ROOT / baseline / "results.json.gz").cases
    targets = {(r["device"], r["mode"]) for r in recs}
    subsets = {f"mode {m}": lambda r, m=m: r["mode"] == m for m in {m for _, m in targets}}
    subsets |= {f"device {d}": lambda r, d=d: r["device"] == d for d in {d for d, _ in targets}}
    checked = 0
    for name, keep in subsets.items():
        subset = [r for r in recs if keep(r)]
        if len(subset) == len(recs):  # the whole run (each committed run has one device): the test above
            continue
        checked += 1
        results = [run_div.rejudge(CaseResult.from_json(r)) for r in subset]
        run_div.finalize(results)
        xpass = [r.id for r in results if r.outcome == "xpass"]
        assert not xpass, (name, xpass[:5])
    assert checked >= 2  # two modes at least


@pytest.mark.parametrize("sweep", [f"{b}/exhaustive.json" for b in BASELINES]
                         + ["reports/gpu-baseline/exhaustive-float32.json"])
def test_exhaustive_rows_rejudge_to_what_they_record(sweep):
    doc = json.loads((ROOT / sweep).read_text())
    again = exhaustive.rejudge(doc)
    assert [_verdict(r) for r in again["rows"]] == [_verdict(r) for r in doc["rows"]]
    assert again["summary"] == doc["summary"] and doc["summary"]["xfail"] > 0
    assert not doc["failed"]


def test_every_failure_of_the_baselines_is_excused_by_kind_and_cap():
    """The CPU baseline fails nothing; each xfail's kinds are among its entry's excuses and its
    measured error within the entry's caps (what rejudge checks, stated for one reader)."""
    by_key = kd.by_key()
    for r in records.load(ROOT / "reports/baseline/results.json.gz").cases:
        assert r["outcome"] not in ("fail", "error", "crash", "timeout", "contract"), r["id"]
        if r["outcome"] == "xfail":
            d = by_key[r["divergence"]["entry"]]
            m = CaseResult.from_json(r)
            m.outcome = r["divergence"]["was"]
            assert d.excuse(m) is None, (r["id"], d.excuse(m))


def test_old_positions_name_entries_of_the_file():
    """Records from before keys named an entry by its position in the 118-entry file: the table
    that reads them (_KEYS_BY_OLD_POSITION) names entries that still exist."""
    assert len(kd._KEYS_BY_OLD_POSITION) == 118
    assert set(kd._KEYS_BY_OLD_POSITION) <= set(kd.by_key())
    assert kd.entry_key(1) == "float64-float32-grade-math" and kd.entry_key("x-y") == "x-y"


def test_keys_are_unique_and_named():
    keys = [d.key for d in kd.divergences()]
    assert len(keys) == len(set(keys)) and all(kd._KEY.fullmatch(k) for k in keys)
    assert all(d.category in kd.CATEGORIES and d.reason for d in kd.divergences())
    assert all(d.excuses and d.excuses <= kd.CATEGORY_KINDS[d.category] for d in kd.divergences())
    assert all(any(getattr(d, c) is not None for c in kd.CAPS) for d in kd.divergences() if "value" in d.excuses)


def _e(**kw):
    return {"key": "a", "op": "neg", "category": "precision", "reason": "r", "excuses": ["value"],
            "max_ulp": 4} | kw


@pytest.mark.parametrize("entries,error", [
    ([_e(), _e(op="abs")], "key 'a' is used by an earlier entry"),
    ([{k: v for k, v in _e().items() if k != "key"}], "needs a key"),
    ([_e(key="Not A Key")], "needs a key"),
    ([_e(category="rounding")], "category must be one of"),
    ([{k: v for k, v in _e().items() if k != "reason"}], "needs a reason"),
    ([_e(op=[])], "op must be a string or a non-empty list"),
    ([_e(dtypes="float32")], "unknown field(s) dtypes"),
    ([{k: v for k, v in _e().items() if k != "excuses"}], "excuses must list the failure kinds"),
    ([_e(excuses=["wrong"])], "excuses must list the failure kinds"),
    ([_e(excuses=["crash"], max_ulp=None)], "an entry of category precision cannot excuse crash"),
    ([_e(category="unimplemented", excuses=["value"])], "an entry of category unimplemented cannot excuse value"),
    ([_e(max_ulp=None)], "excuses value mismatches needs a cap"),
    ([_e(max_ulp=-1)], "max_ulp must be a non-negative number"),
    ([_e(max_rel_err=True)], "max_rel_err must be a non-negative number"),
    ([_e(category="backend-bug", excuses=["crash"])], "caps apply to value mismatches"),
])
def test_bad_entries_are_refused_at_load(monkeypatch, entries, error):
    entries = [{k: v for k, v in e.items() if v is not None} for e in entries]
    monkeypatch.setattr(kd.data, "load", lambda name: {"divergence": entries})
    kd.divergences.cache_clear()
    try:
        with pytest.raises(RlxError, match=error.replace("(", r"\(").replace(")", r"\)")):
            kd.divergences()
    finally:
        kd.divergences.cache_clear()


def test_an_entry_excuses_only_its_kinds_under_its_caps():
    d = Divergence(key="k", op=("exp",), category="precision", reason="r", excuses=frozenset({"value"}),
                   max_ulp=16, max_rel_err=1e-6)

    def rec(outcome="fail", ulp=4.0, rel=1e-7, nonfinite=0):
        return SimpleNamespace(outcome=outcome, max_ulp=ulp, max_rel_err=rel, max_abs_err=None,
                               nonfinite_mismatches=nonfinite)

    assert d.excuse(rec()) is None
    assert "max_ulp 17 > cap 16" in d.excuse(rec(ulp=17))
    assert "max_rel_err 2e-06 > cap 1e-06" in d.excuse(rec(rel=2e-6))
    assert d.excuse(rec(nonfinite=3)) == "it excuses value, not nonfinite"
    assert d.excuse(rec(outcome="crash")) == "it excuses value, not crash"


def test_caps_bound_the_wrong_values_not_the_passing_ones():
    """A passing element can have any relative error (1e-9 where the reference is 0, within its
    absolute bound: inf); the caps bound how wrong the *excused* values are, so they are checked
    against the wrong elements' maxima (the record's mismatch), and against the record's maxima
    only where a record lacks them (written before), which is never looser."""
    expected = np.array([0.0, 1.0, 2.0], np.float32)
    bound = np.array([1e-8, 0.0, 0.0])
    d = Divergence(key="k", op=("exp",), category="precision", reason="r", excuses=frozenset({"value"}),
                   max_ulp=4, max_rel_err=1e-6)

    def record(actual):
        c = compare(expected, np.array(actual, np.float32), exact=False, signed_zero=True,
                    tol=Tolerance(), bound=bound)
        assert not c.ok and c.max_rel_err == np.inf  # the passing 1e-9 at the reference's 0
        return SimpleNamespace(outcome="fail", max_ulp=c.max_ulp, max_rel_err=c.max_rel_err,
                               max_abs_err=c.max_abs_err, nonfinite_mismatches=None,
                               mismatch=wrong_summary([c]))

    two_ulp = record([1e-9, np.nextafter(np.nextafter(np.float32(1), 2), 2), 2.0])
    assert two_ulp.mismatch["max_ulp"] == 2 and two_ulp.mismatch["max_rel_err"] < 1e-6
    assert d.excuse(two_ulp) is None
    far = record([1e-9, 1.5, 2.0])
    assert d.excuse(far).endswith("(of the wrong values)") and "max_rel_err 0.5 > cap 1e-06" in d.excuse(far)
    old = SimpleNamespace(**{**vars(two_ulp), "mismatch": {"count": 1}})  # a record from before
    assert "max_rel_err inf > cap 1e-06" in d.excuse(old)


def test_a_nan_mismatch_among_passing_differences_is_of_kind_nonfinite_only():
    """A record whose only wrong element is a NaN mismatch fails by kind "nonfinite" even where
    its passing elements differ from the reference within their bound; a wrong finite value adds
    "value". A record without the judge's list (written before) counts any difference as
    "value", never fewer kinds."""
    expected = np.array([np.nan, 1.0, 0.0], np.float32)
    bound = np.array([0.0, 1e-6, 1e-8])
    d = Divergence(key="k", op=("exp",), category="precision", reason="r", excuses=frozenset({"nonfinite"}))

    def record(actual):
        c = compare(expected, np.array(actual, np.float32), exact=False, signed_zero=True,
                    tol=Tolerance(), bound=bound)
        return SimpleNamespace(outcome="fail", max_ulp=c.max_ulp, max_rel_err=c.max_rel_err,
                               max_abs_err=c.max_abs_err, nonfinite_mismatches=c.nonfinite,
                               mismatch=wrong_summary([c]))

    nan_only = record([2.0, np.nextafter(np.float32(1), 2), 1e-9])
    assert nan_only.max_ulp > 0 and kd.failure_kinds(nan_only) == {"nonfinite"}
    assert d.excuse(nan_only) is None
    also_value = record([2.0, 1.5, 1e-9])
    assert kd.failure_kinds(also_value) == {"nonfinite", "value"}
    assert d.excuse(also_value) == "it excuses nonfinite, not value"
    old = SimpleNamespace(**{**vars(nan_only), "mismatch": {"count": 1, "kinds": {"NaN": 1}}})
    assert kd.failure_kinds(old) == {"nonfinite", "value"}


def test_an_unexcused_failure_stays_a_failure_naming_the_entry(monkeypatch):
    entry = Divergence(key="exp-ulp", op=("exp",), category="precision", reason="r",
                       excuses=frozenset({"value"}), max_ulp=16)
    monkeypatch.setattr(kd, "divergences", lambda: (entry,))
    c = next(iter(matrix.generate([Target("mlx", "cpu", "eager")], ops=["exp"], dtypes=["float32"])))
    small = run_div.apply_divergence(c, CaseResult.for_case(c, "fail", message="m", max_ulp=8.0))
    big = run_div.apply_divergence(c, CaseResult.for_case(c, "fail", message="m", max_ulp=1e6))
    nan = run_div.apply_divergence(c, CaseResult.for_case(c, "fail", message="m", max_ulp=0.0,
                                                          nonfinite_mismatches=2))
    assert small.outcome == "xfail" and small.divergence["entry"] == "exp-ulp"
    assert big.outcome == "fail" and big.divergence["excused"] is False and "max_ulp 1e+06 > cap 16" in big.message
    assert nan.outcome == "fail" and "not nonfinite" in nan.message
    # judged again, the failure is still a failure, and says why once
    again = run_div.rejudge(CaseResult.from_json(big.to_json()))
    assert again.outcome == "fail" and again.message == big.message


def test_op_dtype_and_id_lists_vals_and_shape():
    d = Divergence(key="k", op=("exp", "si*"), dtype=("float32", "float64"), category="precision",
                   reason="r", vals="spec*", shape="0x*", id=("*/axis:0/*", "*/axis:1/*"))
    t = Target("mlx", "cpu", "eager")

    def case(op, dtype, middle):
        return _case(op, dtype, f"{op}/{dtype}/{middle}/mlx-cpu-eager", t)

    assert d.matches(case("sin", "float64", "shape:0x3/axis:1/vals:special"))
    assert not d.matches(case("cos", "float64", "shape:0x3/axis:1/vals:special"))  # op
    assert not d.matches(case("exp", "float16", "shape:0x3/axis:1/vals:special"))  # dtype
    assert not d.matches(case("exp", "float32", "shape:3x0/axis:1/vals:special"))  # shape
    assert not d.matches(case("exp", "float32", "shape:0x3/axis:1/vals:random"))  # vals
    assert not d.matches(case("exp", "float32", "shape:0x3/axis:2/vals:special"))  # id
    assert d.part("sinh", "float64", "sinh/float64/shape:0x3/axis:1/vals:special/mlx-cpu-eager") == \
        ("si*", "float64", "*/axis:1/*")
    assert len(d.parts()) == 8 and d.describe(("si*", "float64", "*/axis:1/*")) == "si* float64 */axis:1/*"
    one = Divergence(key="one", op=("reduce_*",), category="backend-bug", reason="r")
    assert one.parts() == [()] and one.part("reduce_sum", "int8", "x") == () and one.describe() == "reduce_*"


def _run(entry, monkeypatch, targets, ops, dtypes, failing):
    """The records of a run of ``ops`` x ``dtypes`` on ``targets`` under ``entry`` alone, where the
    cases ``failing(case)`` picks fail; returns (records, warnings)."""
    monkeypatch.setattr(kd, "divergences", lambda: (entry,))
    cases = matrix.generate(targets, ops=ops, dtypes=dtypes)
    results = [run_div.apply_divergence(c, CaseResult.for_case(c, "fail" if failing(c) else "pass",
                                                                 message="", max_ulp=1.0))
               for c in cases]
    return results, run_div.finalize(results)


def test_each_item_of_a_list_goes_stale_on_its_own(monkeypatch):
    """Two ops, two dtypes: four parts. neg's float32 cases all pass (stale: xpass, naming neg
    float32), abs's fail once (live); the float16 parts are outside this float32-only run (no
    warning: a --dtypes subset is no news)."""
    entry = Divergence(key="two-ops", op=("neg", "abs"), dtype=("float32", "float16"),
                       category="precision", reason="r", excuses=frozenset({"value"}), max_ulp=4)
    first = []
    results, warnings = _run(entry, monkeypatch, [Target("mlx", "cpu", "eager")], ["neg", "abs"], ["float32"],
                             lambda c: c.op == "abs" and not first and not first.append(c))
    assert {r.outcome for r in results if r.op == "neg"} == {"xpass"}
    assert {r.outcome for r in results if r.op == "abs"} == {"xfail", "pass"}
    neg = next(r for r in results if r.op == "neg")
    assert neg.message.startswith("known divergence two-ops (precision) no longer reproduces in any of "
                                  "its neg float32 cases")
    assert kd.entry_name(neg) == "two-ops (neg float32)"
    assert warnings == []


def test_staleness_is_per_device_and_mode_and_a_subset_run_calls_nothing_else_stale(monkeypatch):
    """An entry over both devices and every mode that still fails on the CPU in eager mode only:
    a run of all targets calls it stale on the others (each op, device, mode on its own); a run
    of the GPU in compiled mode alone, where it is fixed, calls it stale there and nowhere else; a
    run of the CPU in eager mode alone calls nothing stale."""
    entry = Divergence(key="neg-bug", op=("neg",), category="backend-bug", reason="r",
                       excuses=frozenset({"value"}), max_ulp=4)
    every = [Target("mlx", d, m) for d in ("cpu", "gpu") for m in ("eager", "lazy", "compiled")]

    def cpu_eager(c):
        return (c.target.device, c.target.mode) == ("cpu", "eager")

    results, warnings = _run(entry, monkeypatch, every, ["neg"], None, cpu_eager)
    outcome = {(r.device, r.mode): {x.outcome for x in results if (x.device, x.mode) == (r.device, r.mode)}
               for r in results}
    assert outcome.pop(("cpu", "eager")) == {"xfail"} and set(map(frozenset, outcome.values())) == {frozenset({"xpass"})}
    assert warnings == []
    one, warnings = _run(entry, monkeypatch, [Target("mlx", "gpu", "compiled")], ["neg"], None, cpu_eager)
    assert {r.outcome for r in one} == {"xpass"} and warnings == []
    alone, warnings = _run(entry, monkeypatch, [Target("mlx", "cpu", "eager")], ["neg"], None, cpu_eager)
    assert {r.outcome for r in alone} == {"xfail"} and warnings == []
    # a --dtypes subset of the stale GPU target holds only part of it: nothing stale
    part, warnings = _run(entry, monkeypatch, [Target("mlx", "gpu", "compiled")], ["neg"], ["float32"], cpu_eager)
    assert {r.outcome for r in part} == {"pass"} and warnings == []


def test_a_part_for_another_target_is_no_news_a_part_that_scopes_nothing_is(monkeypatch):
    """An id item that names the GPU is silent in a CPU run; an id item or a dtype that no case
    of the matrix matches (a typo, or an op that has no such dtype) warns in any run."""
    entry = Divergence(key="ids", op=("neg",), category="precision", reason="r", excuses=frozenset({"value"}),
                       max_ulp=4, id=("*/mlx-cpu-*", "*/mlx-gpu-*", "*/vals:no-such-class/*"))
    _, warnings = _run(entry, monkeypatch, [Target("mlx", "cpu", "eager")], ["neg"], ["float32"], lambda c: True)
    assert warnings == ["known divergence ids (*/vals:no-such-class/*) matched no case"]
    entry = Divergence(key="no-int8", op=("neg",), dtype=("float32", "int8"), category="precision", reason="r",
                       excuses=frozenset({"value"}), max_ulp=4)
    _, warnings = _run(entry, monkeypatch, [Target("mlx", "cpu", "eager")], ["neg"], ["float32"], lambda c: True)
    assert warnings == ["known divergence no-int8 (int8) matched no case"]
