"""Runs cases in isolated worker processes.

A kernel may kill its process (a signal from native code) or hang; neither may end the run or
lose results. Each worker runs a task (a few cases sharing inputs) and reports each result as it
finishes; when a worker dies, the first unreported case of its task is recorded as ``crash``, when
it is silent past the timeout it is killed and the case recorded as ``timeout``; the rest of the
task goes back on the queue and a fresh worker takes over.
"""
from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import sys
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import TYPE_CHECKING

from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge.tolerances import known_divergence, stale_entries

if TYPE_CHECKING:
    from rlx_conformance.run.bundle import BundleSink

DEFAULT_TIMEOUT = 60.0  # generous: MLX's CPU compile mode JIT-compiles C++ on first use


def apply_divergence(case: Case, r: CaseResult) -> CaseResult:
    """A failure inside a known divergence's scope reports xfail; a pass inside it stays a pass
    but carries the entry, so that :func:`finalize` can tell when an entry has gone stale."""
    d = known_divergence(case, r.outcome)
    if d is None or r.outcome == "skip" or r.oracle_verdict == "reference-bug":
        return r  # a reference bug (accuracy.py) is the harness's, never a backend's known divergence
    r.divergence = {"entry": d.index, "category": d.category, "reason": d.reason, "link": d.link}
    if r.outcome in ("fail", "error", "contract", "crash", "timeout"):
        r.message = f"known divergence ({d.category}: {d.reason}) — was {r.outcome}: {r.message}"
        r.divergence["was"] = r.outcome  # validate re-checks these against the built-in kernel
        r.outcome = "xfail"
    return r


def rejudge(r: CaseResult) -> CaseResult:
    """A record of an earlier run judged again under cases/known_divergences.toml as it is now:
    back to the outcome its run measured (an xfail to what it was, an xpass to pass), then
    :func:`apply_divergence`; :func:`finalize` over the set marks stale entries again. For data
    edited after a run that is dear to repeat (a GPU machine's): the measurements stay."""
    from types import SimpleNamespace

    if r.divergence is not None:
        was = r.divergence.get("was")
        if r.outcome == "xfail" and was:
            r.outcome = was
            r.message = r.message.split(f" — was {was}: ", 1)[-1]
        elif r.outcome == "xpass":
            r.outcome, r.message = "pass", ""
        r.divergence = None
    target = Target(r.backend, r.device, r.mode, r.variant)
    return apply_divergence(SimpleNamespace(op=r.op, dtype=r.dtype, id=r.id, target=target), r)


def finalize(results: list[CaseResult]) -> list[str]:
    """Strict known divergences: the passes of an entry none of whose cases failed become xpass.
    Returns warnings (entries that matched no case)."""
    stale, unmatched = stale_entries(results)
    for r in results:
        if r.divergence is not None and r.divergence["entry"] in stale and r.outcome == "pass":
            r.outcome = "xpass"
            r.message = (f"known divergence #{r.divergence['entry']} ({r.divergence['category']}) no longer "
                         f"reproduces in any of its cases: remove it from cases/known_divergences.toml "
                         f"({r.divergence['reason']})")
    return [f"known divergence #{d.index} ({d.op}) matched no case" for d in unmatched]


def _variant_groups(cases: Sequence[Case]) -> list[tuple[dict[str, str], list[Case]]]:
    """Cases grouped by the environment their target's backend variant needs (in order of first
    appearance); a run without variants is one group with an empty environment."""
    from rlx_conformance.backends import get_backend

    groups: dict[tuple[tuple[str, str], ...], list[Case]] = {}
    for c in cases:
        v = c.target.variant
        env = get_backend(c.target.backend).variant_env(v) if v else {}
        groups.setdefault(tuple(sorted(env.items())), []).append(c)
    return [(dict(k), g) for k, g in groups.items()]


def _worker_main(conn: Connection, env: dict[str, str], init: str | None,
                 bundles: BundleSink | None = None) -> None:
    os.environ.update(env)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    # The reference meets singular matrices, empty means and overflow on purpose; numpy's and
    # scipy's warnings about them would only bury the run's own output.
    warnings.simplefilter("ignore")
    from rlx_conformance.run.execute import run_case

    run_init(init)
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        for i, case in enumerate(task):
            capture: dict | None = {} if bundles is not None else None  # the arrays, for a repro bundle
            try:
                r = run_case(case, capture)
            except Exception as e:  # noqa: BLE001 — never let a harness bug take the worker down
                r = CaseResult.for_case(case, "error", message=f"harness error: {type(e).__name__}: {e}")
            if bundles is not None:
                bundles.collect(case, r, capture)
            conn.send((i, r))
        conn.send(("done", None))


@dataclass
class _Worker:
    proc: mp.process.BaseProcess
    conn: Connection
    task: list[Case] = field(default_factory=list)
    next: int = 0
    deadline: float = float("inf")
    seen: set[str] = field(default_factory=set)  # the first case ids of the tasks it ran


def _context() -> mp.context.BaseContext:
    """Workers fork from a forkserver that has already imported numpy, scipy and the reference, so
    replacing a crashed worker costs milliseconds, not the seconds of a fresh interpreter. macOS
    (where forking after the Objective-C runtime starts is unsafe) spawns fresh interpreters."""
    if sys.platform != "linux":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # Not rlx_conformance.backends.mlx: importing MLX initialises CUDA on its CUDA build, and a CUDA context does
    # not survive fork ("cudaStreamCreateWithFlags ... initialization error"). Each worker
    # imports MLX itself (a fraction of a second).
    ctx.set_forkserver_preload(["rlx_conformance.run.execute", "rlx_conformance.backends.cpu"])
    return ctx


def start_worker(ctx: mp.context.BaseContext, target: Callable[..., None], args: tuple,
                 hint: str) -> tuple[mp.process.BaseProcess, Connection]:
    """Start a worker process ``target(conn, *args)`` and wait for its "ready". A worker that
    cannot even start (import error, bad environment) would otherwise be replaced forever, one
    "crash" per case: the run fails once, with the reason."""
    parent, child = ctx.Pipe()
    p = ctx.Process(target=target, args=(child, *args), daemon=True)
    p.start()
    child.close()
    why = None  # a worker that can say why it cannot start sends ("init-error", reason)
    try:
        msg = parent.recv() if parent.poll(120) else ("timeout", "no answer within 120 s")
        why = None if msg[0] == "ready" else msg[1]
    except (EOFError, OSError):
        why = ""
    if why is not None:
        p.kill()
        p.join()
        raise RlxError(f"a worker process failed to start ({why or _signal_name(p.exitcode)}); {hint}")
    return p, parent


def run_init(init: str | None) -> None:
    """Run a "module:function" init hook (e.g. registering a contributed kernel) in this process."""
    if init:
        import importlib

        mod, _, fn = init.partition(":")
        getattr(importlib.import_module(mod), fn)()


def stop_workers(workers: Sequence[tuple[mp.process.BaseProcess, Connection]]) -> None:
    """Ask each worker to stop (None on its pipe), then wait for all; kill the ones that linger."""
    for _, conn in workers:
        try:
            conn.send(None)
        except (OSError, BrokenPipeError):
            pass
    for proc, _ in workers:
        proc.join(timeout=2)
        if proc.is_alive():
            proc.kill()
            proc.join()


def _signal_name(code: int | None) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


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
        self._ctx = _context()

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
        p, conn = start_worker(self._ctx, _worker_main, (self.env, self.init, self.bundles),
                               "run with --workers 0 to see the error")
        return _Worker(p, conn)

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
            from rlx_conformance.run.execute import run_case

            run_init(self.init)
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
                    w.conn.send(w.task)
                busy = [w for w in pool if w.task]
                timeout = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout)
                for w in busy:
                    dead = False
                    while w.conn in ready or w.proc.sentinel in ready:
                        try:
                            if not w.conn.poll():
                                dead = not w.proc.is_alive() or w.proc.sentinel in ready
                                break
                            i, res = w.conn.recv()
                        except (EOFError, OSError):
                            dead = True
                            break
                        if i == "done":
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
            stop_workers([(w.proc, w.conn) for w in pool])

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
        stop_workers([(w.proc, w.conn)])
        pool.remove(w)

    def _timeout(self, case: Case) -> float:
        """The runner's timeout, or a known hang's shorter one (cases/known_divergences.toml)."""
        d = known_divergence(case)
        return d.timeout if d is not None and d.timeout else self.timeout

    def _replace(self, w: _Worker, pool, idle, tasks, timed_out: bool) -> Iterator[CaseResult]:
        """Record the in-flight case as crash/timeout, requeue the rest, start a fresh worker."""
        case = w.task[w.next]
        if timed_out:
            w.proc.kill()
        w.proc.join()
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
                f"worker process died ({_signal_name(w.proc.exitcode)}) while running this case"))
        if rest:
            tasks.appendleft(rest)
        if self.bundles is not None:  # the worker took the arrays with it: regenerated
            self.bundles.collect(case, r, None)
        yield apply_divergence(case, r)
