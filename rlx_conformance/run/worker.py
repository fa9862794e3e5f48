"""The one worker loop behind every isolated process of the harness: the matrix runner
(runner.py), the exhaustive sweeps (exhaustive.py) and validate's service worker (validate.py).

A kernel may kill its process (a signal from native code) or hang. So whatever runs a kernel runs
in a worker process that the parent can lose without losing the run: the parent starts it
(:func:`start`, which waits for its "ready"), sends it messages, reads what it answers, and
replaces it when it dies or stays silent too long (:meth:`Worker.end`).

The protocol, the same for every caller::

    worker -> parent   READY once the worker is set up, or ("init-error", why) and it exits
    parent -> worker   a message (what it means is the caller's task function's business)
    worker -> parent   whatever the task sends while it runs, then (DONE, what the task returned)
                       or (RECYCLE, why) when the task found the process poisoned: it then exits
    parent -> worker   STOP: the worker returns (as it does when the parent's end closes)

A poisoned process (:func:`poisoned`: on MLX's CUDA build, once a kernel hits an illegal memory
access every later call in that process errors or returns garbage) must not run another case:
the task raises :class:`Poisoned` after sending what it has, the worker answers (RECYCLE, why)
and exits, and the parent starts a fresh one for the rest of the work.

Callers differ only in the task function applied to each message (and an optional setup run
before "ready"); both must be picklable (module-level functions, or functools.partial of them):
a worker is started from a fresh interpreter or a forkserver, never forked from the parent.
"""
from __future__ import annotations

import ctypes
import importlib
import multiprocessing as mp
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from rlx_conformance.backends.base import PRELOAD_ENV
from rlx_conformance.core.errors import RlxError

STOP = None  # the parent's last message to a worker
READY = ("ready", None)  # a worker's first message: set up, waiting for work
DONE = "done"  # tags a worker's last answer to a message: (DONE, the task's return value)
RECYCLE = "recycle"  # tags a poisoned worker's last message, (RECYCLE, why), before it exits
START_TIMEOUT = 120.0  # seconds a worker may take to set up (imports, an init hook) before "ready"

Task = Callable[[Any, Callable[[Any], None]], Any]  # task(message, send) -> the DONE payload

# Errors after which a process's CUDA context is lost for good ("sticky" errors: the CUDA runtime
# returns them for every later call in the process), as MLX's CUDA build words them (its
# cuda_check raises "<call> failed: <cudaGetErrorString>") and as CUDA names them. Matched
# case-insensitively anywhere in a result's message; a false match costs one worker restart.
POISON = ("an illegal memory access was encountered", "cudaErrorIllegalAddress", "misaligned address",
          "an illegal instruction was encountered", "unspecified launch failure", "CUDA error",
          "cuda_check")


def poisoned(message: str | None) -> str | None:
    """The :data:`POISON` phrase in ``message`` (a kernel's error text), or None."""
    low = (message or "").lower()
    return next((p for p in POISON if p.lower() in low), None)


class Poisoned(Exception):
    """Raised by a task (after sending its results) when the process must not run anything
    more: :func:`serve` answers (RECYCLE, why) and exits."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


def context() -> mp.context.BaseContext:
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


def prestart() -> None:
    """Start the forkserver now (Linux; a no-op if it runs): its imports (numpy, scipy, the
    reference: 1.4 s on a 2-core machine) then overlap with the caller's own work, such as
    generating the cases, instead of delaying the first worker; the first worker then forks in
    about 15 ms."""
    if sys.platform == "linux":
        import multiprocessing.forkserver

        context()  # its preload list
        multiprocessing.forkserver.ensure_running()


def run_init(init: str | None) -> None:
    """Run a "module:function" init hook (e.g. registering a contributed kernel) in this process."""
    if init:
        mod, _, fn = init.partition(":")
        getattr(importlib.import_module(mod), fn)()


def load_preloads() -> None:
    """Load the libraries :data:`~rlx_conformance.backends.base.PRELOAD_ENV` names into this
    process's global symbol scope (a backend's worker_env asks for them: MLX's NVRTC shim)."""
    for lib in filter(None, os.environ.get(PRELOAD_ENV, "").split(os.pathsep)):
        ctypes.CDLL(lib, mode=os.RTLD_GLOBAL)


def serve(conn: Connection, task: Task, setup: Callable[[], None] | None = None,
          env: dict[str, str] | None = None, init: str | None = None) -> None:
    """A worker process's main: its environment (``env``, set before anything reads it: MLX reads
    MLX_ENABLE_TF32 once per process), ``setup`` and the ``init`` hook, then READY; then
    ``task(message, send)`` for each message, each answered last by (DONE, its return value),
    until STOP, or by (RECYCLE, why) when the task raises :class:`Poisoned` (the worker exits).
    A setup that fails is reported as ("init-error", why): the parent fails once, with the
    reason, instead of replacing a worker that can never start."""
    os.environ.update(env or {})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C
    try:
        load_preloads()  # before setup and init, which may import a backend
        if setup is not None:
            setup()
        run_init(init)
    except BaseException as e:  # noqa: BLE001 — whatever it is, the parent reports it
        conn.send(("init-error", f"{type(e).__name__}: {e}"))
        return
    conn.send(READY)
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the parent is gone
            return
        if msg is STOP:
            return
        try:
            out = task(msg, conn.send)
        except Poisoned as p:
            conn.send((RECYCLE, p.why))
            return
        conn.send((DONE, out))


def signal_name(code: int | None) -> str:
    """How a process ended, for a crash message: the signal that killed it, or its exit code."""
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


@dataclass
class Worker:
    """A started worker process and the parent's end of its pipe."""

    proc: mp.process.BaseProcess
    conn: Connection
    ready: bool = True  # False from :func:`launch` until its READY came (:meth:`await_ready`)
    since: float = 0.0  # time.monotonic() of its launch

    def await_ready(self, hint: str, timeout: float = START_TIMEOUT) -> bool:
        """Wait up to ``timeout`` seconds for the worker's READY: True once it came, False while
        it is still setting up (under START_TIMEOUT since its launch). A worker that cannot even
        start (import error, bad environment, silent for START_TIMEOUT) would otherwise be replaced
        forever, one "crash" per case: it is killed and the run fails once, with the reason and
        ``hint`` (RlxError)."""
        if self.ready:
            return True
        why = None  # a worker that can say why it cannot start sends ("init-error", reason)
        try:
            if self.conn.poll(timeout):
                msg = self.conn.recv()
                why = None if msg == READY else msg[1]
            elif self.proc.is_alive() and time.monotonic() - self.since < START_TIMEOUT:
                return False
            else:
                why = f"no answer within {START_TIMEOUT:g} s" if self.proc.is_alive() else ""
        except (EOFError, OSError):
            why = ""
        if why is not None:
            self.proc.kill()
            self.proc.join()
            raise RlxError(f"a worker process failed to start ({why or signal_name(self.proc.exitcode)}); {hint}")
        self.ready = True
        return True

    def send(self, msg: Any) -> None:
        self.conn.send(msg)

    def answers(self, ready: Collection[Any]) -> tuple[list[Any], bool]:
        """What the worker has sent, once :func:`wait_any` woke for it (``ready``), up to and
        including a DONE; and whether it died (its pipe closed, or it exited with nothing left to
        read)."""
        got: list[Any] = []
        while self.conn in ready or self.proc.sentinel in ready:
            try:
                if not self.conn.poll():
                    return got, not self.proc.is_alive() or self.proc.sentinel in ready
                msg = self.conn.recv()
            except (EOFError, OSError):
                return got, True
            got.append(msg)
            if msg[0] in (DONE, RECYCLE):
                break
        return got, False

    def end(self, hung: bool) -> str:
        """Reap a worker that died, or kill one that ``hung``; returns how it ended."""
        if hung:
            self.proc.kill()
        self.proc.join()
        return signal_name(self.proc.exitcode)


def launch(ctx: mp.context.BaseContext, task: Task, *, setup: Callable[[], None] | None = None,
           env: dict[str, str] | None = None, init: str | None = None) -> Worker:
    """Start a worker process (:func:`serve` with these arguments) without waiting for its READY
    (:meth:`Worker.await_ready`): a runner replacing a crashed worker goes on serving the others
    while the new one forks, imports and sets up."""
    parent, child = ctx.Pipe()
    p = ctx.Process(target=serve, args=(child, task, setup, env, init), daemon=True)
    p.start()
    child.close()
    return Worker(p, parent, ready=False, since=time.monotonic())


def start(ctx: mp.context.BaseContext, task: Task, *, setup: Callable[[], None] | None = None,
          env: dict[str, str] | None = None, init: str | None = None, hint: str) -> Worker:
    """:func:`launch`, then wait for the worker's READY (RlxError, with ``hint``, if it cannot
    start)."""
    w = launch(ctx, task, setup=setup, env=env, init=init)
    w.await_ready(hint)
    return w


def wait_any(workers: Iterable[Worker], timeout: float) -> list[Any]:
    """Block until one of ``workers`` has sent something or exited, or ``timeout`` seconds pass;
    what woke (pass it to :meth:`Worker.answers`)."""
    workers = list(workers)
    return wait([w.conn for w in workers] + [w.proc.sentinel for w in workers], timeout)


def stop(workers: Iterable[Worker], grace: float = 2.0) -> None:
    """Ask each worker to stop (STOP on its pipe), wait ``grace`` seconds for them all, then kill
    the ones that linger. One deadline for the pool, not one per worker: a run interrupted while
    15 workers sit in a long JIT compile (NVRTC on a GPU: tens of seconds) ends in ``grace``, not
    in 15 x ``grace`` (a device call's kill came first on the H200)."""
    workers = list(workers)
    for w in workers:
        try:
            w.conn.send(STOP)
        except (OSError, BrokenPipeError):
            pass
    deadline = time.monotonic() + grace
    for w in workers:
        w.proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.proc.is_alive():
            w.proc.kill()
            w.proc.join()
