"""Runs cases in isolated worker processes.

A kernel may kill its process (a signal from native code) or hang; neither may end the run or
lose results. Each worker runs a task (a few cases sharing inputs) and reports each result as it
finishes; when a worker dies, the first unreported case of its task is recorded as ``crash``, when
it is silent past the timeout it is killed and the case recorded as ``timeout``; the rest of the
task goes back on the queue and a fresh worker takes over. The worker loop itself is worker.py's.
"""
from __future__ import annotations

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
from rlx_conformance.generate.matrix import Case
from rlx_conformance.judge.divergences import known_divergence
from rlx_conformance.run import worker
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.execute import run_case
from rlx_conformance.run.outcomes import apply_divergence

DEFAULT_TIMEOUT = 60.0  # generous: MLX's CPU compile mode JIT-compiles C++ on first use


def _variant_groups(cases: Sequence[Case]) -> list[tuple[dict[str, str], list[Case]]]:
    """Cases grouped by the environment their target's backend variant needs (in order of first
    appearance); a run without variants is one group with an empty environment."""
    groups: dict[tuple[tuple[str, str], ...], list[Case]] = {}
    for c in cases:
        v = c.target.variant
        env = get_backend(c.target.backend).variant_env(v) if v else {}
        groups.setdefault(tuple(sorted(env.items())), []).append(c)
    return [(dict(k), g) for k, g in groups.items()]


def _quiet() -> None:
    """Worker setup. The reference meets singular matrices, empty means and overflow on purpose;
    numpy's and scipy's warnings about them would only bury the run's own output."""
    warnings.simplefilter("ignore")


def _run_task(bundles: BundleSink | None, task: list[Case], send: Callable[[Any], None]) -> None:
    """The runner's task function (worker.serve applies it to each task in a worker): run each
    case, send (index, result) as each finishes, and write the bundles of the failing ones."""
    for i, case in enumerate(task):
        capture: dict | None = {} if bundles is not None else None  # the arrays, for a repro bundle
        try:
            r = run_case(case, capture)
        except Exception as e:  # noqa: BLE001 — never let a harness bug take the worker down
            r = CaseResult.for_case(case, "error", message=f"harness error: {type(e).__name__}: {e}")
        if bundles is not None:
            bundles.collect(case, r, capture)
        send((i, r))


@dataclass
class _Worker(worker.Worker):
    """A worker and the task it runs: ``next`` is the first case of it not yet reported."""

    task: list[Case] = field(default_factory=list)
    next: int = 0
    deadline: float = float("inf")
    seen: set[str] = field(default_factory=set)  # the first case ids of the tasks it ran


class Runner:
    """Process pool with crash and timeout isolation. ``workers=0`` runs in-process (no isolation)."""

    def __init__(self, workers: int | None = None, timeout: float = DEFAULT_TIMEOUT,
                 task_size: int = 24, env: dict[str, str] | None = None, init: str | None = None,
                 bundles: BundleSink | None = None):
        self.workers = os.cpu_count() or 1 if workers is None else workers
        self.timeout = timeout
        self.task_size = task_size
        self.env = env or {}
        self.init = init
        # repro bundles of failing cases: written by the worker that has the arrays; for a crash or
        # timeout, from regenerated inputs and reference (in a child process: bundle.py)
        self.bundles = bundles
        self._retried: set[tuple[str, int]] = set()
        self.same_worker_repeats = 0  # --repeat tasks that had to run in a worker that ran them before
        self._split = False  # already one environment's share of a run (see run)
        self._ctx = worker.context()

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
        w = worker.start(self._ctx, functools.partial(_run_task, self.bundles), setup=_quiet, env=self.env,
                         init=self.init, hint="run with --workers 0 to see the error")
        return _Worker(w.proc, w.conn)

    def run(self, cases: Iterable[Case]) -> Iterator[CaseResult]:
        cases = list(cases)
        groups = _variant_groups(cases) if self.workers and not self._split else []
        if len(groups) > 1 or (groups and groups[0][0]):
            # Backend variants that need another environment (TF32 on/off: MLX reads it once per
            # process): one pool of workers per environment, one after the other.
            for genv, group in groups:
                sub = Runner(self.workers, self.timeout, self.task_size, {**self.env, **genv}, self.init,
                             bundles=self.bundles)
                sub._split = True
                yield from sub.run(group)
                self.same_worker_repeats += sub.same_worker_repeats
            return
        if self.workers == 0:
            worker.run_init(self.init)
            for c in cases:
                capture: dict | None = {} if self.bundles is not None else None
                r = run_case(c, capture)
                if self.bundles is not None:
                    self.bundles.collect(c, r, capture)
                yield apply_divergence(c, r)
            return
        tasks = self._tasks(cases)
        pool: list[_Worker] = []
        try:
            for _ in range(min(self.workers, len(tasks))):
                pool.append(self._spawn())
            idle = list(pool)
            while tasks or any(w.task for w in pool):
                while idle and tasks:
                    w = idle.pop()
                    w.task, w.next = self._pick(tasks, w, len(pool)), 0
                    w.deadline = time.monotonic() + self._timeout(w.task[0])
                    w.send(w.task)
                busy = [w for w in pool if w.task]
                timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                ready = worker.wait_any(busy, timeout)
                for w in busy:
                    answers, dead = w.answers(ready)
                    for i, res in answers:
                        if i == worker.DONE:
                            if any(self._isolated(c) for c in w.task):
                                self._retire(w, pool)
                                w = self._spawn()
                                pool.append(w)
                            w.task = []
                            idle.append(w)
                            break
                        w.next = i + 1
                        if w.next < len(w.task):
                            w.deadline = time.monotonic() + self._timeout(w.task[w.next])
                        yield apply_divergence(w.task[i], res)
                    if w.task and (dead or time.monotonic() > w.deadline):
                        yield from self._replace(w, pool, idle, tasks, timed_out=not dead)
        finally:
            worker.stop(pool)

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
    def _retire(w: _Worker, pool: list[_Worker]) -> None:
        worker.stop([w])
        pool.remove(w)

    def _timeout(self, case: Case) -> float:
        """The runner's timeout, or a known hang's shorter one (cases/known_divergences.toml)."""
        d = known_divergence(case)
        return d.timeout if d is not None and d.timeout else self.timeout

    def _replace(self, w: _Worker, pool, idle, tasks, timed_out: bool) -> Iterator[CaseResult]:
        """Record the in-flight case as crash/timeout, requeue the rest, start a fresh worker."""
        case = w.task[w.next]
        ended = w.end(hung=timed_out)
        rest = w.task[w.next + 1:]
        pool.remove(w)
        nw = self._spawn()
        pool.append(nw)
        idle.append(nw)
        d = known_divergence(case)
        if timed_out and (case.id, case.repeat) not in self._retried and not (d is not None and d.timeout):
            # One retry in a fresh worker: a load spike or a first-use compile on a busy machine
            # must not read as a hang. A case that hangs twice is recorded as a timeout.
            self._retried.add((case.id, case.repeat))
            tasks.appendleft([case] + rest)
            return
        if timed_out:
            limit = self._timeout(case)
            again = " (twice, in two fresh workers)" if (case.id, case.repeat) in self._retried else ""
            r = CaseResult.for_case(case, "timeout", duration_s=limit,
                                    message=f"no result within {limit:g} s{again}; worker killed")
        else:
            r = CaseResult.for_case(case, "crash", message=(
                f"worker process died ({ended}) while running this case"))
        if rest:
            tasks.appendleft(rest)
        if self.bundles is not None:  # the worker took the arrays with it: regenerated
            self.bundles.collect(case, r, None)
        yield apply_divergence(case, r)
