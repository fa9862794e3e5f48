"""Crash and timeout isolation of rlx_conformance.run.runner.Runner.

One run (module fixture, ~10 s) of eight MLX ``neg`` cases through a worker whose kernel, for three
input sizes, dies by SIGSEGV, dies by SIGABRT, or hangs (tests/kernels_for_tests.py). Every case
must come back exactly once, the broken ones as crash/timeout, the rest as passes.
"""
from __future__ import annotations

import functools
import time

import kernels_for_tests as kt
import pytest

from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate import matrix
from rlx_conformance.judge import divergences as kd
from rlx_conformance.judge.divergences import Divergence
from rlx_conformance.run import outcomes, runner

TIMEOUT = 3.0
TARGET = matrix.Target("mlx", "cpu", "eager")


def neg_cases() -> list[matrix.Case]:
    cases = matrix.generate([TARGET], ops=["neg"], dtypes=["float32"])
    return [c for c in cases if c.vals == "random"]


@pytest.fixture(scope="module")
def broken_run():
    cases = neg_cases()
    r = runner.Runner(workers=1, timeout=TIMEOUT, task_size=3, init="kernels_for_tests:install_broken_neg")
    t0 = time.monotonic()
    results = list(r.run(cases))
    return cases, results, time.monotonic() - t0


def by_size(cases, results, size):
    ids = {c.id for c in cases if c.size() == size}
    assert len(ids) == 1, f"expected one case of size {size}; shape families changed?"
    return next(r for r in results if r.id in ids)


def test_cases_cover_the_broken_sizes():
    sizes = [c.size() for c in neg_cases()]
    for s in (kt.SEGV_SIZE, kt.ABORT_SIZE, kt.HANG_SIZE):
        assert sizes.count(s) == 1
    assert len(sizes) >= 6  # and some healthy ones besides


def test_no_result_lost_or_duplicated(broken_run):
    cases, results, _ = broken_run
    assert len(results) == len(cases)
    assert sorted(r.id for r in results) == sorted(c.id for c in cases)


def test_segfault_is_a_crash(broken_run):
    r = by_size(*broken_run[:2], kt.SEGV_SIZE)
    assert r.outcome == "crash"
    assert "SIGSEGV" in r.message and "worker process died" in r.message


def test_abort_is_a_crash(broken_run):
    r = by_size(*broken_run[:2], kt.ABORT_SIZE)
    assert r.outcome == "crash" and "SIGABRT" in r.message


def test_hang_is_a_timeout(broken_run):
    r = by_size(*broken_run[:2], kt.HANG_SIZE)
    assert r.outcome == "timeout"
    assert f"no result within {TIMEOUT:g} s" in r.message and r.duration_s == TIMEOUT


def test_other_cases_pass(broken_run):
    cases, results, _ = broken_run
    broken = {kt.SEGV_SIZE, kt.ABORT_SIZE, kt.HANG_SIZE}
    size = {c.id: c.size() for c in cases}
    healthy = [r for r in results if size[r.id] not in broken]
    assert healthy and all(r.outcome == "pass" for r in healthy), [(r.id, r.outcome, r.message)
                                                                   for r in healthy]


def test_crash_results_carry_case_metadata(broken_run):
    r = by_size(*broken_run[:2], kt.SEGV_SIZE)
    assert (r.op, r.dtype, r.shape, r.family) == ("neg", "float32", [[7]], "odd")
    assert (r.backend, r.device, r.mode) == ("mlx", "cpu", "eager")


def test_hang_costs_about_one_timeout(broken_run):
    """The hung worker is killed at the timeout, not left to finish its 60 s sleep."""
    assert broken_run[2] < 40


def test_init_runs_only_in_workers():
    from rlx_conformance.backends import get_backend

    assert get_backend("mlx").kernels["neg"].fn is not kt.broken_neg


def test_broken_init_fails_the_run_once():
    r = runner.Runner(workers=1, timeout=TIMEOUT, init="kernels_for_tests:broken_init")
    with pytest.raises(RlxError, match="failed to start"):
        list(r.run(neg_cases()[:1]))


def test_tasks_keep_input_ids_together():
    """Cases that share inputs (same input id, other targets) stay in one task: one reference."""
    targets = [matrix.Target("mlx", "cpu", m) for m in ("eager", "lazy", "compiled")]
    cases = matrix.generate(targets, ops=["neg"], dtypes=["float32"])
    tasks = runner.Runner(workers=1, task_size=2)._tasks(cases)
    assert [c for t in tasks for c in t] == cases
    for t in tasks:
        assert len(t) >= 2
    starts = [t[0].input_id for t in tasks]
    ends = [t[-1].input_id for t in tasks]
    for end, nxt in zip(ends, starts[1:]):
        assert end != nxt


def test_tasks_of_different_ops_are_dealt_in_turn():
    """Workers side by side get different ops (a cold machine compiles each kernel once, not
    in every worker at once); every case is still run exactly once, each op's in its order."""
    cases = matrix.generate([matrix.Target("mlx", "cpu", "lazy")], ops=["neg", "exp", "abs"],
                            dtypes=["float32"])
    tasks = list(runner.Runner(workers=1, task_size=2)._tasks(cases))
    assert sorted(c.id for t in tasks for c in t) == sorted(c.id for c in cases)
    assert len({t[0].op for t in tasks[:3]}) == 3
    for op in ("neg", "exp", "abs"):
        assert [c for t in tasks for c in t if c.op == op] == [c for c in cases if c.op == op]


# -- known divergences -------------------------------------------------------------------------------
@pytest.mark.parametrize("outcome,expected", [
    ("pass", "pass"), ("fail", "xfail"), ("crash", "xfail"), ("timeout", "xfail"),
    ("error", "xfail"), ("skip", "skip"),
])
def test_apply_divergence(monkeypatch, outcome, expected):
    """Failures in a divergence's scope become xfail; passes stay passes but carry the entry."""
    case = neg_cases()[0]
    d = Divergence(key="entry-7", op=("neg",), category="backend-bug", reason="test reason")
    monkeypatch.setattr(outcomes, "known_divergence", lambda c, *_: d if c is case else None)
    r = outcomes.apply_divergence(case, CaseResult.for_case(case, outcome, message="m"))
    assert r.outcome == expected
    if expected == "skip":
        assert r.divergence is None
    else:
        assert r.divergence["entry"] == "entry-7"
    if expected == "xfail":
        assert "test reason" in r.message


def test_finalize_strict_divergences(monkeypatch):
    """An entry with at least one failure keeps its passes; an entry with none turns them into
    xpass (strict); an entry that matched nothing is a warning."""
    cases = neg_cases()[:4]
    live = Divergence(key="entry-1", op=("neg",), category="precision", reason="live")
    stale = Divergence(key="entry-2", op=("neg",), category="precision", reason="stale")
    unused = Divergence(key="entry-3", op=("neg",), dtype=("int8",), category="precision", reason="unused")
    monkeypatch.setattr(kd, "divergences", lambda: (live, stale, unused))
    scope = {cases[0].id: live, cases[1].id: live, cases[2].id: stale, cases[3].id: stale}
    monkeypatch.setattr(outcomes, "known_divergence", lambda c, *_: scope.get(c.id))
    monkeypatch.setattr(kd, "known_divergence", lambda c, *_: scope.get(c.id))
    seen = ["fail", "pass", "pass", "pass"]
    results = [outcomes.apply_divergence(c, CaseResult.for_case(c, o, message="m"))
               for c, o in zip(cases, seen)]
    warnings = outcomes.finalize(results)
    assert [r.outcome for r in results] == ["xfail", "pass", "xpass", "xpass"]
    assert "no longer reproduces" in results[2].message
    assert warnings == ["known divergence entry-3 (neg) matched no case"]


def test_partly_run_entry_is_not_stale(monkeypatch):
    """A run that holds only some of an entry's cases (an --op or --dtypes subset) cannot say the
    divergence is gone: the passes stay passes."""
    cases = neg_cases()[:3]
    entry = Divergence(key="entry-1", op=("neg",), category="precision", reason="scoped to three cases")
    monkeypatch.setattr(kd, "divergences", lambda: (entry,))
    scope = {c.id: entry for c in cases}
    monkeypatch.setattr(outcomes, "known_divergence", lambda c, *_: scope.get(c.id))
    monkeypatch.setattr(kd, "known_divergence", lambda c, *_: scope.get(c.id))
    partial = [outcomes.apply_divergence(c, CaseResult.for_case(c, "pass", message="")) for c in cases[:2]]
    outcomes.finalize(partial)
    assert [r.outcome for r in partial] == ["pass", "pass"]
    whole = [outcomes.apply_divergence(c, CaseResult.for_case(c, "pass", message="")) for c in cases]
    outcomes.finalize(whole)
    assert [r.outcome for r in whole] == ["xpass"] * 3


def test_nonstrict_divergence_never_goes_xpass(monkeypatch):
    """A nondeterministic divergence (strict = false) whose cases all passed this time stays quiet."""
    case = neg_cases()[0]
    flaky = Divergence(key="entry-1", op=("neg",), category="backend-bug", reason="hangs sometimes", strict=False)
    monkeypatch.setattr(kd, "divergences", lambda: (flaky,))
    monkeypatch.setattr(outcomes, "known_divergence", lambda c, *_: flaky)
    results = [outcomes.apply_divergence(case, CaseResult.for_case(case, "pass", message=""))]
    assert outcomes.finalize(results) == [] and results[0].outcome == "pass"


@pytest.mark.parametrize("isolate", [False, True])
def test_isolated_divergence_cannot_poison_later_cases(monkeypatch, isolate):
    """A case under an ``isolate = true`` entry runs alone in a worker that is replaced after it,
    so the damage it leaves behind (heap corruption in MLX) crashes no later, unrelated case.
    Without isolation the same run blames an innocent case: the control half of the test."""
    cases = neg_cases()
    entry = Divergence(key="entry-1", op=("neg",), category="backend-bug", reason="poisons", strict=False,
                       isolate=isolate)
    def scope(c, *_):
        return entry if c.size() == kt.POISON_SIZE else None

    monkeypatch.setattr(runner, "known_divergence", scope)  # Runner._isolated's lookup
    monkeypatch.setattr(outcomes, "known_divergence", scope)
    r = runner.Runner(workers=1, timeout=TIMEOUT, task_size=len(cases),
                      init="kernels_for_tests:install_poisoning_neg")
    results = list(r.run(cases))
    assert sorted(x.id for x in results) == sorted(c.id for c in cases)
    later_crashed = [x for x in results if x.outcome == "crash"]
    if isolate:
        assert all(x.outcome == "pass" for x in results), [(x.id, x.outcome) for x in results]
    else:
        assert later_crashed, "the control run should show a later case crashing"


def test_precision_entry_cannot_excuse_a_crash(monkeypatch):
    """A precision entry explains wrong values: a crash in its scope looks further (a backend-bug
    entry) or stays a crash — never an xfail that blames rounding for a dead process."""
    case = neg_cases()[0]
    prec = Divergence(key="entry-1", op=("neg",), category="precision", reason="a few ulp",
                      excuses=frozenset({"value"}), max_ulp=4)
    bug = Divergence(key="entry-2", op=("neg",), category="backend-bug", reason="dies on this input",
                     excuses=frozenset({"crash"}))
    monkeypatch.setattr(outcomes, "known_divergence", kd.known_divergence)
    monkeypatch.setattr(kd, "divergences", lambda: (prec,))
    crash = outcomes.apply_divergence(case, CaseResult.for_case(case, "crash", message="SIGSEGV"))
    # still a crash; the record names the entry that scopes it and excuses nothing here
    assert crash.outcome == "crash" and crash.divergence["excused"] is False
    assert "entry-1 (it excuses value, not crash)" in crash.message
    fail = outcomes.apply_divergence(case, CaseResult.for_case(case, "fail", message="3 ulp"))
    assert fail.outcome == "xfail" and fail.divergence["entry"] == "entry-1"
    monkeypatch.setattr(kd, "divergences", lambda: (prec, bug))
    crash = outcomes.apply_divergence(case, CaseResult.for_case(case, "crash", message="SIGSEGV"))
    assert crash.outcome == "xfail" and crash.divergence["entry"] == "entry-2"


def test_undeclared_dtype_that_runs_fails_unless_the_input_is_empty():
    """A dtype the backend declares unsupported but whose kernel runs and matches is a failure
    (the declaration is wrong), except on empty inputs: nothing was computed, nothing is proved."""
    from dataclasses import replace

    from rlx_conformance.run.execute import run_case

    cases = [replace(c, declared=False) for c in matrix.generate(
        [matrix.Target("mlx", "cpu", "lazy")], ops=["neg"], dtypes=["float32"])]
    empty = [c for c in cases if any(0 in s for s in c.shapes)]
    full = [c for c in cases if c.vals == "random" and all(0 not in s for s in c.shapes)]
    assert empty and full
    r = run_case(full[0])
    assert r.outcome == "fail" and "add the dtype" in r.message
    r = run_case(empty[0])
    assert r.outcome == "skip" and "proves nothing" in r.message


def test_in_process_run_leaves_out_cases_known_to_kill_their_process(monkeypatch):
    """``workers=0`` has no process to lose: a case whose known divergence excuses a crash (here a
    kernel that really segfaults) is left out as a skip naming the entry, and the run goes on. The
    entry neither "matched no case" nor goes stale: what its unrun cases would show is unknown."""
    from rlx_conformance.backends import get_backend
    from rlx_conformance.run import staleness

    cases = [c for c in neg_cases() if c.size() not in (kt.ABORT_SIZE, kt.HANG_SIZE)]
    deadly = next(c for c in cases if c.size() == kt.SEGV_SIZE)
    entry = Divergence(key="entry-1", op=("neg",), category="backend-bug", reason="dies",
                       excuses=frozenset({"crash"}))

    def scope(c, *_):
        return entry if c.id == deadly.id else None

    for mod in (runner, outcomes, kd):
        monkeypatch.setattr(mod, "known_divergence", scope)
    monkeypatch.setattr(kd, "divergences", lambda: (entry,))
    mlx = get_backend("mlx")
    monkeypatch.setitem(mlx.kernels, "neg", mlx.kernels["neg"])  # undone after the test
    results = list(runner.Runner(workers=0, timeout=TIMEOUT, init="kernels_for_tests:install_broken_neg").run(cases))
    by_id = {r.id: r for r in results}
    assert len(by_id) == len(cases)
    left = by_id[deadly.id]
    assert left.outcome == "skip" and left.divergence["entry"] == "entry-1" and "--workers 0" in left.message
    assert all(r.outcome == "pass" for r in results if r.id != deadly.id)
    stale, unmatched = kd.stale_entries(results, staleness.fully_covered)
    assert not stale and not unmatched


def test_workers_share_the_cores_among_their_blas_threads(monkeypatch):
    """Each worker's numpy/scipy OpenBLAS gets cores // workers threads (at least 1), set in the
    worker although the forkserver loaded numpy before; a thread count the user set stands."""
    from rlx_conformance.run import worker

    for v in runner.BLAS_THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(runner.os, "cpu_count", lambda: 8)
    assert [runner.blas_threads(n) for n in (0, 1, 2, 3, 8, 16)] == [None, 8, 4, 2, 1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert runner.blas_threads(2) is None
    ctx = worker.context()
    w = worker.start(ctx, kt.blas_threads, setup=functools.partial(runner._setup, 1), hint="")
    try:
        w.conn.send("threads?")
        tag, counts = w.conn.recv()
    finally:
        worker.stop([w])
    assert counts and set(counts) == {1}, counts


def test_prestarted_forkserver_serves_the_workers():
    """run starts the forkserver before generating its cases (worker.prestart): calling it again
    is harmless and the workers still fork from it with the BLAS limit and the preload."""
    from rlx_conformance.run import worker

    worker.prestart()
    worker.prestart()
    w = worker.start(worker.context(), kt.blas_threads, setup=functools.partial(runner._setup, 1), hint="")
    try:
        w.conn.send("threads?")
        assert w.conn.recv()[0] is not None
    finally:
        worker.stop([w])


def test_known_hang_is_killed_at_its_own_limit_from_the_kernel_call(monkeypatch):
    """A case under an entry with ``timeout`` is killed that long after its kernel call starts
    (not after the runner's whole-case timeout), the message naming the entry, and excused."""
    cases = neg_cases()
    hang = next(c for c in cases if c.size() == kt.HANG_SIZE)
    entry = Divergence(key="entry-1", op=("neg",), category="backend-bug", reason="hangs",
                       excuses=frozenset({"timeout"}), timeout=1.0, strict=False)

    def scope(c, *_):
        return entry if c.id == hang.id else None

    monkeypatch.setattr(runner, "known_divergence", scope)
    monkeypatch.setattr(outcomes, "known_divergence", scope)
    r = runner.Runner(workers=1, timeout=30.0, init="kernels_for_tests:install_broken_neg")
    t0 = time.monotonic()
    results = list(r.run([hang]))
    took = time.monotonic() - t0
    (res,) = results
    assert res.outcome == "xfail", (res.outcome, res.message)
    assert "no result within 1 s from the kernel (known divergence entry-1's timeout)" in res.message
    assert took < 15  # the runner's 30 s case limit was not the one that fired


def test_stopping_a_busy_pool_takes_one_grace_period_not_one_per_worker():
    """worker.stop waits one shared deadline for the whole pool, then kills what lingers: on the
    H200 an interrupted run with 15 workers inside NVRTC compiles took 2 s a worker to stop, past
    the device call's kill. Fake processes that never exit: the joins before the kills must add
    up to the grace period once, whatever the number of workers."""
    import time as _time
    from types import SimpleNamespace

    from rlx_conformance.run import worker

    waited = []

    class Stuck:
        def __init__(self):
            self.killed = False

        def join(self, timeout=None):
            if not self.killed and timeout:
                waited.append(timeout)
                _time.sleep(timeout)

        def is_alive(self):
            return not self.killed

        def kill(self):
            self.killed = True

    class Pipe:
        def send(self, msg):
            pass

    pool = [SimpleNamespace(proc=Stuck(), conn=Pipe()) for _ in range(6)]
    worker.stop(pool, grace=0.3)
    assert sum(waited) <= 0.3 + 1e-9  # per-worker waits would add up to 6 x 0.3 s
    assert all(w.proc.killed for w in pool)


def test_launch_does_not_wait_for_the_worker_to_start():
    """A crashed worker's replacement is launched, not awaited: the runner serves the others while
    it forks, imports and sets up (on an H100 host 1-4 s)."""
    from rlx_conformance.run import worker

    worker.stop([worker.start(worker.context(), kt.global_symbol, hint="")])  # the forkserver up (its imports)
    t0 = time.monotonic()
    w = worker.launch(worker.context(), kt.global_symbol, setup=functools.partial(time.sleep, 2.0))
    try:
        assert time.monotonic() - t0 < 1.5
        assert not w.await_ready("", timeout=0)
        assert w.await_ready("") and w.ready
    finally:
        worker.stop([w])


def test_a_launched_worker_that_cannot_start_says_why():
    from rlx_conformance.run import worker

    w = worker.launch(worker.context(), kt.global_symbol, init="kernels_for_tests:broken_init")
    with pytest.raises(RlxError, match="failed to start.*deliberately broken init hook.*the hint"):
        w.await_ready("the hint")
    assert not w.proc.is_alive()


def test_spares_start_after_a_crash_only_and_end_with_the_run(monkeypatch):
    spawned = []
    spawn = runner.Runner._spawn

    def spy(self):
        w = spawn(self)
        spawned.append(w)
        return w

    fresh = runner.Runner._fresh
    replaced = []

    def spy_fresh(self):
        replaced.append(1)
        return fresh(self)

    monkeypatch.setattr(runner.Runner, "_spawn", spy)
    monkeypatch.setattr(runner.Runner, "_fresh", spy_fresh)
    cases = neg_cases()
    assert all(r.outcome == "pass" for r in runner.Runner(workers=2, timeout=30.0, task_size=3).run(cases))
    assert len(spawned) == 2, "a run without crashes starts no spare"
    spawned.clear()
    r = runner.Runner(workers=2, timeout=TIMEOUT, task_size=3, init="kernels_for_tests:install_broken_neg")
    results = list(r.run(cases))
    crashes = sum(res.outcome == "crash" for res in results)
    assert crashes >= 2 and len(results) == len(cases)
    assert len(spawned) == 2 + len(replaced) + 1, "one spare (2 workers) kept starting from the first replacement on"
    assert r._spares == [] and not any(w.proc.is_alive() for w in spawned), "every worker and spare ended"


def test_a_worker_loads_and_warms_up_its_backends_before_it_is_ready():
    """So that a spare takes a crashed worker's place ready to run (MLX's import and CUDA's
    start-up are not left to its first case); the forkserver itself never imports MLX."""
    from rlx_conformance.backends import get_backend
    from rlx_conformance.run import worker

    for devices, expected in ((None, False), ({"mlx": ["cpu", "gpu"]}, True)):
        w = worker.start(worker.context(), kt.has_module, setup=functools.partial(runner._setup, None, devices),
                         hint="")
        try:
            w.send("mlx.core")
            assert w.conn.recv() == (worker.DONE, expected)
        finally:
            worker.stop([w])
    get_backend("mlx").warm_up(["cpu", "gpu"])  # a device the machine lacks is left alone


def test_a_failing_warm_up_is_left_to_the_cases(monkeypatch):
    """The warm-up is an optimisation: where it fails, the worker starts and runs its cases, which
    report what fails (here nothing), as before it existed."""
    from rlx_conformance.backends import get_backend

    calls = []

    def fails(self, devices):
        calls.append(devices)
        raise RuntimeError("deliberately failing warm-up (a device that cannot start)")

    monkeypatch.setattr(type(get_backend("mlx")), "warm_up", fails)
    runner._setup(None, {"mlx": ["cpu"]})  # no exception
    assert calls == [["cpu"]]
