"""Runs cases in isolated worker processes.

A kernel may kill its process (a signal from native code) or hang; neither may end the run or
lose results. Each worker runs a task (a few cases sharing inputs) and reports each result as it
finishes; when a worker dies, the first unreported case of its task is recorded as ``crash``, when
it is silent past its limit it is killed and the case recorded as ``timeout``; the rest of the
task goes back on the queue and a fresh worker takes over. The worker loop itself is worker.py's.

Hangs and crashes fail fast (issue 18):

* **Limits.** The harness's own work on a case (inputs, reference, judging) may take up to
  ``timeout`` (--timeout); the kernel call alone (the worker marks when it starts on a board in
  shared memory: execute.run_case's phases) gets :func:`kernel_limit`, the larger of a per-device floor and 20x the reference's own
  time, plus an allowance for a compiled target's first JIT compile, never more than ``timeout``.
  Derivative and graph cases do not report their phases and keep ``timeout``.
* **Retry only when ambiguous.** A timeout right after cases of the same kernel came back (a load
  spike, a slow compile) is retried once, in a fresh worker, under the full ``timeout``, after the
  rest of the queue; a timeout that follows another crash or timeout of that kernel is not.
* **Stop.** After ``max_failures`` consecutive crashes or timeouts (not excused by a known
  divergence) of one kernel (an op on a target), its remaining cases are not run: each reports
  ``not-run`` with the reason, and the run fails.
* **Poisoned workers.** A worker whose case left an error of :data:`worker.POISON` (a lost CUDA
  context) is replaced before it runs another case; the rest of its task goes to a fresh worker.
* **Replacements do not hold up the pool.** A fresh worker is launched and joins the idle ones
  when it reports ready (after loading and warming up its backends); from the first replacement
  on, :meth:`Runner.spare_count` spares keep starting, so a crash's successor is usually ready
  (a GPU run meets about 1,000 known crashes).
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlx_conformance.backends import get_backend
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge.divergences import Divergence, known_divergence
from rlx_conformance.run import watchdog, worker
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.execute import marks_kernel_phase, run_case
from rlx_conformance.run.outcomes import apply_divergence

DEFAULT_TIMEOUT = 60.0  # generous: MLX's CPU compile mode JIT-compiles C++ on first use
# The kernel call's floor per device (--timeout-floor overrides). CPU: MLX's compiled mode
# JIT-compiles each new fused graph with g++, 1-2 s each (README, Speed; 0.9 s measured on the
# 2-core machine under load 3.4), a few per case at most: 10 s. GPU: CUDA JIT-compiling a
# derivative graph has taken up to 50 s a case on an H200 (README, MLX on a GPU): the old 60 s.
KERNEL_FLOOR = {"cpu": 10.0, "gpu": 60.0}
# A kernel may be this many times slower than the float64 reference: MLX's CPU kernels measured
# up to 7.2x slower than the reference (README's custom-op table: ScatterElements 1884 ms against
# 261 ms), with room for a loaded machine.
REFERENCE_FACTOR = 20.0
# Added for a compiled target's first cases of an (op, dtype) until one comes back (its JIT
# compile lands in MLX's on-disk cache, which every later worker reads): a few more g++ runs.
JIT_ALLOWANCE = {"cpu": 5.0}
# Consecutive crashes or timeouts of one kernel that stop its remaining cases (0: never). Each
# timeout costs a kernel limit, so 3 bounds a kernel that hangs on everything to about two limits
# with two workers; a kernel that crashes on one shape only rarely fails 3 cases in a row.
DEFAULT_MAX_FAILURES = 3
# A worker's phase board, shared memory the parent reads when it wakes (no message per case: two
# more pipe messages per case cut a 1,448-case lazy run from 370-550 to 245-305 cases/s):
# [phase (0 none, 1 kernel called, 2 kernel returned), case index, time.monotonic() of the call
# (CLOCK_MONOTONIC: one clock for every process), the reference's seconds].
KERNEL, RETURNED = 1.0, 2.0
POLL = 0.5  # seconds between the parent's looks at the boards while no worker answers (< any floor)
NOT_RUN = "not-run"
RECYCLED = (" [the worker process was replaced after this case: '{why}' means a lost CUDA context, "
            "which every later call in that process inherits]")


def kernel_limit(target: Target, ref_s: float, ceiling: float, floor: float | None = None,
                 first_compile: bool = False) -> float:
    """Seconds a kernel call on ``target`` may take: max(floor, REFERENCE_FACTOR x the reference's
    ``ref_s``), plus JIT_ALLOWANCE for a compiled target's ``first_compile``, at most ``ceiling``.
    ``floor`` None: KERNEL_FLOOR of the target's device (the ceiling for a device it lacks)."""
    dev = target.device
    base = max(KERNEL_FLOOR.get(dev, ceiling) if floor is None else floor, REFERENCE_FACTOR * ref_s)
    if first_compile and target.mode == "compiled":
        base += JIT_ALLOWANCE.get(dev, 0.0)
    return min(ceiling, base)


def kernel_key(case: Case) -> tuple[str, str]:
    """The unit the runner stops: an op on a target (its variant included)."""
    return case.op, str(case.target)


def _variant_groups(cases: Sequence[Case]) -> list[tuple[dict[str, str], list[Case]]]:
    """Cases grouped by the environment their target's backend variant needs (in order of first
    appearance); a run without variants is one group with an empty environment."""
    groups: dict[tuple[tuple[str, str], ...], list[Case]] = {}
    for c in cases:
        v = c.target.variant
        env = get_backend(c.target.backend).variant_env(v) if v else {}
        groups.setdefault(tuple(sorted(env.items())), []).append(c)
    return [(dict(k), g) for k, g in groups.items()]


def backend_env(cases: Sequence[Case]) -> dict[str, str]:
    """The environment the backends of ``cases`` want their processes to start with
    (Backend.worker_env: MLX's, a g++ that compiles its JIT's kernels with a precompiled header)."""
    env: dict[str, str] = {}
    for name in sorted({c.target.backend for c in cases}):
        env.update(get_backend(name).worker_env())
    return env


@contextlib.contextmanager
def environ(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in this process for the duration (an in-process run), as it was afterwards."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_threads(workers: int) -> int | None:
    """BLAS threads per worker process: the machine's cores shared out among the workers, at
    least one. numpy's and scipy's OpenBLAS each start a thread per core in every process, so N
    workers on N cores ran N^2 BLAS threads that spin against each other (attention, matmul and
    conv cases took twice the wall time, 2.4x the CPU, with one other worker busy: issue 18).
    None (leave BLAS as it is) in-process, or where the user set one of :data:`BLAS_THREAD_VARS`."""
    if workers <= 0 or any(v in os.environ for v in BLAS_THREAD_VARS):
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def _setup(threads: int | None = None, devices: dict[str, list[str]] | None = None) -> None:
    """Worker setup, before the worker reports ready. The reference meets singular matrices, empty
    means and overflow on purpose; numpy's and scipy's warnings about them would only bury the
    run's own output. ``threads``: the BLAS thread limit (:func:`blas_threads`), set through
    threadpoolctl, since the worker's numpy was loaded by the forkserver before the worker's
    environment existed (its OpenBLAS read OPENBLAS_NUM_THREADS then). ``devices``: per backend,
    the devices the run's cases use: each backend is loaded and warmed up on them
    (Backend.warm_up: MLX's import and CUDA's start-up, 1-4 s on an H100 host), so that a spare
    worker replacing a crashed one is ready to run at once, and a worker's first case is timed
    like the others. A warm-up that fails is left to the cases to report (each, as before),
    never a worker that cannot start."""
    warnings.simplefilter("ignore")
    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")
    for name, devs in (devices or {}).items():
        try:
            get_backend(name).warm_up(devs)
        except Exception:  # noqa: BLE001 — an optimisation only: the cases report what fails, as before
            pass


def _phase(board, i: int, kind: str, ref_s: float | None = None) -> None:
    """execute.run_case's on_phase: the kernel of case ``i`` is called now, or has returned."""
    if kind == "kernel":
        board[0] = 0.0
        board[1], board[2], board[3] = float(i), time.monotonic(), ref_s or 0.0
        board[0] = KERNEL
    else:
        board[0] = RETURNED


def _run_task(bundles: BundleSink | None, board, task: list[Case], send: Callable[[Any], None]) -> None:
    """The runner's task function (worker.serve applies it to each task in a worker): run each
    case, mark its phases on ``board`` (when its kernel is called and returns), send (index,
    result) as each finishes, and write the bundles of the failing ones. After a result that
    names a lost CUDA context (worker.poisoned) the worker is replaced: nothing more runs in
    this process."""
    for i, case in enumerate(task):
        capture: dict | None = {} if bundles is not None else None  # the arrays, for a repro bundle
        try:
            r = run_case(case, capture, on_phase=functools.partial(_phase, board, i))
        except Exception as e:  # noqa: BLE001 — never let a harness bug take the worker down
            r = CaseResult.for_case(case, "error", message=f"harness error: {type(e).__name__}: {e}")
        why = worker.poisoned(r.message)
        if why:
            r.message += RECYCLED.format(why=why)
        if bundles is not None:
            bundles.collect(case, r, capture)
        send((i, r))
        if why:
            raise worker.Poisoned(f"{case.id}: {why}")


def _left_out(case: Case, d: Divergence) -> CaseResult:
    """The record of a case an in-process run leaves out (Runner._fatal_in_process): a skip that
    names its entry, so that the entry is neither "matched no case" nor, with its crashing cases
    unrun, stale (judge/divergences.stale_entries)."""
    r = CaseResult.for_case(case, "skip", message=(
        f"not run in-process (--workers 0): known divergence {d.key} kills or corrupts the process "
        "that runs it; a run with worker processes runs it, isolated"))
    r.divergence = {"entry": d.key, "category": d.category, "reason": d.reason, "link": d.link, "ran": False}
    return r


@dataclass
class _Worker(worker.Worker):
    """A worker and the task it runs: ``next`` is the first case of it not yet reported."""

    task: list[Case] = field(default_factory=list)
    next: int = 0
    deadline: float = float("inf")  # the whole case's
    board: Any = None  # the worker's phase board (shared memory: _phase)
    seen: set[str] = field(default_factory=set)  # the first case ids of the tasks it ran
    limit: float = 0.0  # the seconds the deadline allowed, for a timeout's message
    why: str = ""  # what the limit is (the case, or its kernel call), for that message
    known_hang: float | None = None  # a known divergence's timeout for the current case
    case_limit: float = 0.0  # the whole current case's limit (_arm)


class Runner:
    """Process pool with crash and timeout isolation. ``workers=0`` runs in-process (no isolation:
    a case past twice ``timeout`` ends the process, run/watchdog.py).
    ``timeout``: the most seconds a case may take; ``floor``: the kernel call's floor (None: per
    device, KERNEL_FLOOR); ``max_failures``: consecutive crashes or timeouts of one kernel that
    stop its remaining cases (0: never); see the module docstring."""

    def __init__(self, workers: int | None = None, timeout: float = DEFAULT_TIMEOUT,
                 task_size: int = 24, env: dict[str, str] | None = None, init: str | None = None,
                 bundles: BundleSink | None = None, floor: float | None = None,
                 max_failures: int = DEFAULT_MAX_FAILURES):
        self.workers = os.cpu_count() or 1 if workers is None else workers
        self.timeout = timeout
        self.floor = floor
        self.max_failures = max_failures
        self.task_size = task_size
        self.env = env or {}
        self.init = init
        # repro bundles of failing cases: written by the worker that has the arrays; for a crash or
        # timeout, from regenerated inputs and reference (in a child process: bundle.py)
        self.bundles = bundles
        self._retried: set[tuple[str, int]] = set()
        self._deferred: dict[tuple[str, int], CaseResult] = {}  # first timeouts whose retry is queued
        self._streak: dict[tuple[str, str], list[str]] = {}  # per kernel: its consecutive crash/timeout
        self._stopped: dict[tuple[str, str], str] = {}  # per kernel: why its remaining cases do not run
        self._purge = False  # the queue may hold cases of a stopped kernel
        self._compiled: set[tuple[str, str, str]] = set()  # (op, dtype, target)s that came back once
        self.same_worker_repeats = 0  # --repeat tasks that had to run in a worker that ran them before
        self.recycled = 0  # workers replaced after a lost CUDA context (worker.poisoned)
        self._split = False  # already one environment's share of a run (see run)
        self._ctx = worker.context()
        self._spares: list[_Worker] = []  # launched replacements in waiting (_fresh)
        self._devices: dict[str, list[str]] = {}  # per backend, the devices of the cases run (_setup)

    def _tasks(self, cases: Sequence[Case]) -> deque[list[Case]]:
        """Tasks of ~task_size cases; cases sharing an input id stay together (one reference).
        The tasks of different ops are dealt out in turn (op A's first, op B's first, ..., op A's
        second, ...): workers running side by side then need different kernels, so a cold
        machine does not JIT-compile the same kernel in every worker at once (MLX's g++ cache
        on a CPU, its NVRTC/PTX cache on a GPU, both shared on disk once written)."""
        by_op: dict[str, list[list[Case]]] = {}
        for t in self._chunks(cases):
            by_op.setdefault(t[0].op, []).append(t)
        tasks: deque[list[Case]] = deque()
        for rnd in itertools.zip_longest(*by_op.values()):
            tasks.extend(t for t in rnd if t is not None)
        return tasks

    def _chunks(self, cases: Sequence[Case]) -> list[list[Case]]:
        tasks: list[list[Case]] = []
        cur: list[Case] = []
        for i, c in enumerate(cases):
            if self._isolated(c):  # alone in a task, in a worker retired after it
                if cur:
                    tasks.append(cur)
                    cur = []
                tasks.append([c])
                continue
            cur.append(c)
            nxt = cases[i + 1] if i + 1 < len(cases) else None
            if (len(cur) >= self.task_size and (nxt is None or nxt.input_id != c.input_id)
                    or nxt is not None and nxt.repeat != c.repeat):  # repeats: the same tasks again
                tasks.append(cur)
                cur = []
        if cur:
            tasks.append(cur)
        return tasks

    def _spawn(self) -> _Worker:
        """A new worker, launched, not yet ready: it joins the idle ones when its READY comes
        (:meth:`_started`), so the pool is served meanwhile. A crash costs a fresh worker, and a GPU
        run meets about 1,000 known crashes (MLX's CUDA build aborts on every empty array in
        compiled mode); waiting for each replacement's start (its fork, setup and imports) held up
        every other worker (benchmarks/bench_worker_churn.py)."""
        board = self._ctx.Array("d", 4, lock=False)  # the worker's phase board (_phase)
        w = worker.launch(self._ctx, functools.partial(_run_task, self.bundles, board),
                          setup=functools.partial(_setup, blas_threads(self.workers), self._devices),
                          env=self.env, init=self.init)
        return _Worker(w.proc, w.conn, ready=False, since=w.since, board=board)

    def _fresh(self) -> _Worker:
        """A crashed or retired worker's replacement: a spare launched after an earlier
        replacement (already started, or starting), else a new one; then the spares are topped
        up to :meth:`spare_count`. A run without crashes starts no spare."""
        w = self._spares.pop(0) if self._spares else self._spawn()
        while len(self._spares) < self.spare_count():
            self._spares.append(self._spawn())
        return w

    def spare_count(self) -> int:
        """Spare workers kept starting once a worker had to be replaced: one per 4 workers, at
        least one. On an H100 host a fresh worker's first case took 1-4 s more than the rest (its
        MLX import and CUDA start-up), at about 4 crashes a second in the default GPU run."""
        return max(1, self.workers // 4)

    @staticmethod
    def _started(starting: list[_Worker], idle: list[_Worker]) -> None:
        """The launched workers whose READY has come join ``idle`` (RlxError for one that cannot
        start: the run fails once, with the reason)."""
        for w in starting:
            if w.await_ready("run with --workers 0 to see the error", timeout=0):
                idle.append(w)

    def run(self, cases: Iterable[Case]) -> Iterator[CaseResult]:
        cases = list(cases)
        if not self._split:  # what the backends' processes start with (MLX: its JIT's compiler)
            self.env = {**backend_env(cases), **self.env}
        groups = _variant_groups(cases) if self.workers and not self._split else []
        if len(groups) > 1 or (groups and groups[0][0]):
            # Backend variants that need another environment (TF32 on/off: MLX reads it once per
            # process): one pool of workers per environment, one after the other.
            for genv, group in groups:
                sub = Runner(self.workers, self.timeout, self.task_size, {**self.env, **genv}, self.init,
                             bundles=self.bundles, floor=self.floor, max_failures=self.max_failures)
                sub._split = True
                yield from sub.run(group)
                self.same_worker_repeats += sub.same_worker_repeats
                self.recycled += sub.recycled
            return
        if self.workers == 0:
            with environ(backend_env(cases)):
                yield from self._run_in_process(cases)
            return
        tasks = self._tasks(cases)
        self._devices = {b: sorted({c.target.device for c in cases if c.target.backend == b})
                         for b in sorted({c.target.backend for c in cases})}
        pool: list[_Worker] = []
        try:
            for _ in range(min(self.workers, len(tasks))):  # launched together: they start side by side
                pool.append(self._spawn())
            idle: list[_Worker] = []
            while tasks or any(w.task for w in pool):
                while idle and tasks:
                    w = idle.pop()
                    w.task, w.next = self._pick(tasks, w, len(pool)), 0
                    w.board[0] = 0.0  # the last task's phase says nothing about this one
                    self._arm(w)
                    w.send(w.task)
                busy = [w for w in pool if w.task]
                starting = [w for w in pool if not w.ready]
                if not busy and not starting:
                    continue
                timeout = POLL
                if busy:  # a kernel call's deadline shows only on its worker's board: looked at every POLL
                    timeout = min(POLL, max(0.0, min(self._deadline(w) for w in busy) - time.monotonic()))
                ready = worker.wait_any(busy + starting, timeout)
                self._started(starting, idle)
                for w in busy:
                    answers, dead = w.answers(ready)
                    recycle = None
                    for tag, payload in answers:
                        if tag == worker.DONE:
                            if any(self._isolated(c) for c in w.task):
                                self._retire(w, pool)
                                pool.append(self._fresh())
                            else:
                                idle.append(w)
                            w.task = []
                            break
                        if tag == worker.RECYCLE:
                            recycle = payload
                            break
                        w.next = tag + 1
                        if w.next < len(w.task):
                            self._arm(w)
                        yield from self._settle(w.task[tag], payload)
                    if recycle is not None:
                        self._recycle(w, pool, idle, tasks)
                    elif w.task and (dead or time.monotonic() > self._deadline(w)):
                        yield from self._replace(w, pool, idle, tasks, timed_out=not dead)
                if self._stopped:
                    yield from self._stop_cases(pool, idle, tasks)
        finally:
            worker.stop(pool + self._spares)
            self._spares = []

    def _run_in_process(self, cases: list[Case]) -> Iterator[CaseResult]:
        """``workers=0``: each case in this process, a watchdog instead of a process to kill."""
        worker.run_init(self.init)
        for c in cases:
            d = self._fatal_in_process(c)
            if d is not None:  # it would end the run (SIGFPE, heap corruption): nothing isolates it here
                yield _left_out(c, d)
                continue
            capture: dict | None = {} if self.bundles is not None else None
            with watchdog.watch(c.id, watchdog.FACTOR * self.timeout):  # no process to kill: see watchdog
                r = run_case(c, capture)
            if self.bundles is not None:
                self.bundles.collect(c, r, capture)
            yield apply_divergence(c, r)

    # -- limits ---------------------------------------------------------------------------------
    def _arm(self, w: _Worker) -> None:
        """The deadline of the case ``w`` starts: the whole case's limit, the runner's timeout;
        :meth:`_deadline` narrows it while the case's kernel runs (to a known hang's own limit,
        cases/known_divergences.toml, where one holds the case)."""
        case = w.task[w.next]
        d = known_divergence(case)
        w.known_hang = d.timeout if d is not None and d.timeout else None
        # a case that never says when its kernel runs (derivative, graph) has the known hang's
        # limit for the whole case
        whole = w.known_hang if w.known_hang and not marks_kernel_phase(case) else None
        w.case_limit = w.limit = whole or self.timeout
        w.why = "case"
        w.deadline = time.monotonic() + w.limit

    def _deadline(self, w: _Worker) -> float:
        """When ``w``'s current case times out: while its kernel runs (the worker's board says
        since when), the kernel call's limit from then (:func:`kernel_limit`; a retry gets the
        whole timeout; a known hang its entry's ``timeout``, counted from the kernel call so that
        a worker's first imports or a slow reference never use it up); otherwise the whole case's
        deadline. Sets the limit and what it bounds, for a timeout's message."""
        b = w.board
        if b is None or b[0] != KERNEL or int(b[1]) != w.next:
            w.limit, w.why = w.case_limit, "case"
            return w.deadline
        if w.known_hang:
            w.limit, w.why = w.known_hang, "known hang"
            return min(w.deadline, b[2] + w.limit)
        case = w.task[w.next]
        retry = (case.id, case.repeat) in self._deferred  # the whole limit, no guessing
        w.limit = self.timeout if retry else kernel_limit(
            case.target, b[3], self.timeout, self.floor,
            first_compile=(case.op, case.dtype, str(case.target)) not in self._compiled)
        w.why = "kernel"
        return min(w.deadline, b[2] + w.limit)

    # -- results, streaks and stops -------------------------------------------------------------
    def _settle(self, case: Case, r: CaseResult) -> Iterator[CaseResult]:
        """A case's record, judged under the known divergences, counted in its kernel's streak."""
        r = apply_divergence(case, r)
        self._deferred.pop((case.id, case.repeat), None)
        if r.outcome in ("crash", "timeout"):
            self._count(case, r.outcome)
        else:
            self._streak.pop(kernel_key(case), None)
            if r.outcome != "xfail":
                self._compiled.add((case.op, case.dtype, str(case.target)))
        yield r

    def _count(self, case: Case, outcome: str) -> None:
        """One more crash or timeout of ``case``'s kernel; the kernel stops at max_failures."""
        key = kernel_key(case)
        streak = self._streak.setdefault(key, [])
        streak.append(outcome)
        if self.max_failures and len(streak) >= self.max_failures and key not in self._stopped:
            plural = {"timeout": "timeouts", "crash": "crashes"}
            kinds = ", ".join(f"{streak.count(o)} {o if streak.count(o) == 1 else plural[o]}"
                              for o in ("timeout", "crash") if o in streak)
            self._purge = True
            self._stopped[key] = (
                f"not run: {case.op} on {case.target} was stopped after {len(streak)} consecutive crashes "
                f"or timeouts ({kinds}; the last: {case.id}); --max-consecutive-failures 0 runs every case")

    def _not_run(self, case: Case) -> CaseResult:
        """The record of a stopped kernel's case (a first timeout whose retry was queued keeps it)."""
        first = self._deferred.pop((case.id, case.repeat), None)
        why = self._stopped[kernel_key(case)]
        if first is not None:
            first.message += f"; not retried: {why.removeprefix('not run: ')}"
            return apply_divergence(case, first)
        return CaseResult.for_case(case, NOT_RUN, message=why)

    def _stop_cases(self, pool: list[_Worker], idle: list[_Worker], tasks: deque[list[Case]]
                    ) -> Iterator[CaseResult]:
        """The stopped kernels' cases leave the queue as not-run; a worker in the middle of one is
        killed (the case is not-run) and the rest of its task requeued."""
        stopped = self._stopped
        if self._purge:  # only after a new stop or a requeue: the queue may be long
            self._purge = False
            kept: deque[list[Case]] = deque()
            for t in tasks:
                rest = [c for c in t if kernel_key(c) not in stopped]
                for c in t:
                    if kernel_key(c) in stopped:
                        yield self._not_run(c)
                if rest:
                    kept.append(rest)
            tasks.clear()
            tasks.extend(kept)
        for w in list(pool):
            # w.next == len(w.task): every case of the task answered, DONE not read yet
            if w.next >= len(w.task) or kernel_key(w.task[w.next]) not in stopped:
                continue
            w.end(hung=True)
            rest = w.task[w.next:]
            pool.remove(w)
            pool.append(self._fresh())
            for c in rest:
                if kernel_key(c) in stopped:
                    yield self._not_run(c)
            rest = [c for c in rest if kernel_key(c) not in stopped]
            if rest:
                tasks.appendleft(rest)

    def _recycle(self, w: _Worker, pool: list[_Worker], idle: list[_Worker], tasks: deque[list[Case]]) -> None:
        """A worker that found its process poisoned exits after its last result: a fresh worker
        takes the rest of its task."""
        w.end(hung=False)
        rest = w.task[w.next:]
        w.task = []
        pool.remove(w)
        pool.append(self._fresh())
        self.recycled += 1
        if rest:
            tasks.appendleft(rest)
            self._purge = bool(self._stopped)

    def _pick(self, tasks: deque[list[Case]], w: _Worker, n_workers: int) -> list[Case]:
        """The next task for worker ``w``: the first one it has not run before (under --repeat a
        case's repeats run in different processes where possible, so that process-level state
        such as compile caches cannot hide nondeterminism), else the first."""
        k = 0
        if n_workers > 1 and tasks[0][0].id in w.seen:
            k = next((i for i, t in enumerate(tasks) if t[0].id not in w.seen), 0)
        task = tasks[k]
        del tasks[k]
        if task[0].id in w.seen:
            self.same_worker_repeats += 1
        w.seen.add(task[0].id)
        return task

    @staticmethod
    def _isolated(case: Case) -> bool:
        """A known divergence that corrupts its process (cases/known_divergences.toml,
        ``isolate = true``) runs alone, and its worker is replaced after it: heap corruption must
        neither pass for a clean run nor crash a later, unrelated case."""
        d = known_divergence(case)
        return d is not None and d.isolate

    @staticmethod
    def _fatal_in_process(case: Case) -> Divergence | None:
        """The known divergence for which an in-process run (``workers=0``) leaves ``case`` out:
        one that kills or corrupts its process (it excuses a crash, or is isolated) would end the
        whole run there, and a resumed run would meet it again. Workers run it, isolated."""
        d = known_divergence(case)
        return d if d is not None and (d.isolate or "crash" in d.excuses) else None

    @staticmethod
    def _retire(w: _Worker, pool: list[_Worker]) -> None:
        worker.stop([w])
        pool.remove(w)

    def _replace(self, w: _Worker, pool, idle, tasks, timed_out: bool) -> Iterator[CaseResult]:
        """Record the in-flight case as crash/timeout, requeue the rest, start a fresh worker. A
        timeout is retried (once, after the rest of the queue, under the whole limit) only when it
        is ambiguous: the first of its kernel's streak, and not a known hang's."""
        if w.next >= len(w.task):  # it answered every case, then died (or hung) before DONE
            w.end(hung=timed_out)
            pool.remove(w)
            pool.append(self._fresh())
            return
        case = w.task[w.next]
        ended = w.end(hung=timed_out)
        rest = w.task[w.next + 1:]
        pool.remove(w)
        pool.append(self._fresh())
        if rest:
            tasks.appendleft(rest)
            self._purge = bool(self._stopped)
        d = known_divergence(case)
        key = (case.id, case.repeat)
        limit, what = w.limit, ("from the kernel" if w.why in ("kernel", "known hang") else "")
        if timed_out:
            first = self._deferred.get(key)
            msg = f"no result within {limit:g} s{' ' + what if what else ''}"
            if w.why == "known hang" and d is not None:
                msg += f" (known divergence {d.key}'s timeout)"
            elif w.why == "kernel" and first is None:
                msg += (f" (its limit: the larger of the {self._floor_text(case)} floor and "
                        f"{REFERENCE_FACTOR:g}x the reference's time, at most --timeout {self.timeout:g} s)")
            if first is not None:
                msg = f"{first.message.removesuffix('; worker killed')}; retried: {msg} in a fresh worker"
            r = CaseResult.for_case(case, "timeout", duration_s=limit, message=f"{msg}; worker killed")
            ambiguous = (first is None and key not in self._retried and not (d is not None and d.timeout)
                         and not self._streak.get(kernel_key(case)))
            if ambiguous:
                # A load spike or a first-use compile on a busy machine must not read as a hang:
                # retried in a fresh worker when the rest of the queue has run. The timeout still
                # counts in its kernel's streak unless a known divergence excuses it.
                self._retried.add(key)
                self._deferred[key] = r
                if apply_divergence(case, CaseResult.for_case(case, "timeout")).outcome == "timeout":
                    self._count(case, "timeout")
                tasks.append([case])
                return
        else:
            r = CaseResult.for_case(case, "crash", message=(
                f"worker process died ({ended}) while running this case"))
        if self.bundles is not None:  # the worker took the arrays with it: regenerated
            self.bundles.collect(case, r, None)
        yield from self._settle(case, r)

    def _floor_text(self, case: Case) -> str:
        if self.floor is not None:
            return f"--timeout-floor {self.floor:g} s"
        return f"{KERNEL_FLOOR.get(case.target.device, self.timeout):g} s {case.target.device}"
