"""A case that hangs in-process ends the process instead of the session never ending.

The isolated runner kills a worker that runs past its limit and records the case as ``timeout``.
In-process runs (``run --workers 0``, and the pytest plugin's items under pytest-xdist, where each
xdist worker runs its items itself) have no process to kill: a kernel stuck in native code would
block them forever. So an in-process case gets a watchdog: past its limit the process writes the
case id and every thread's traceback to stderr and exits with status 1. Under xdist that is a
crashed worker, which xdist reports against the item and replaces (the session goes on); a plain
``--workers 0`` run stops there, its journal holding every finished case (``run --resume``).

Two alarms, because a kernel may hang with or without the GIL: a Python monitor thread (which can
print the case id, but runs only if the hang releases the GIL) and, a few seconds later,
faulthandler's C-level timer (which always fires; it prints the tracebacks, not the id).
faulthandler's timer is process-wide: pytest's ``faulthandler_timeout`` setting, if set, is
replaced while a case runs.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

# The in-process limit is this many times the run's --timeout: an isolated run retries a first
# timeout once under the full --timeout, so a case may take up to twice that before it is
# recorded as a timeout there; in-process the cost of firing is the whole process, so no less.
FACTOR = 2.0
BACKSTOP_S = 10.0  # faulthandler's timer fires this long after the Python one


@dataclass(frozen=True)
class _Armed:
    case_id: str
    limit_s: float
    deadline: float  # time.monotonic()
    err: TextIO | None


class _Monitor:
    """One daemon thread per process that waits for the armed case's deadline (a timer thread a
    case cost 150 µs, 5 % of a small case in-process); arming and disarming only swap what it
    waits for under a condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.armed: _Armed | None = None
        self.pid = -1  # the process whose thread this is (none survives a fork)

    def arm(self, armed: _Armed) -> None:
        with self.cond:
            if self.pid != os.getpid():
                self.pid = os.getpid()
                threading.Thread(target=self._wait, name="rlx-watchdog", daemon=True).start()
            self.armed = armed
            self.cond.notify()

    def disarm(self) -> None:
        with self.cond:
            self.armed = None

    def _wait(self) -> None:
        with self.cond:
            while True:
                a = self.armed
                left = None if a is None else a.deadline - time.monotonic()
                if left is not None and left <= 0:
                    _fire(a)
                self.cond.wait(left)


_MONITOR = _Monitor()


def _fire(a: _Armed) -> None:
    if a.err is not None:
        a.err.write(f"rlx-conformance: {a.case_id} ran past {a.limit_s:g} s in-process, where there is no "
                    "worker process to stop; exiting (tracebacks follow)\n")
        a.err.flush()
        faulthandler.dump_traceback(file=a.err, all_threads=True)
    os._exit(1)


@contextlib.contextmanager
def watch(case_id: str, limit_s: float) -> Iterator[None]:
    """Run the block under a watchdog of ``limit_s`` seconds (<= 0: none)."""
    if limit_s <= 0:
        yield
        return
    err = _stderr()
    _MONITOR.arm(_Armed(case_id, limit_s, time.monotonic() + limit_s, err))
    if err is not None:
        faulthandler.dump_traceback_later(limit_s + BACKSTOP_S, exit=True, file=err)
    try:
        yield
    finally:
        _MONITOR.disarm()
        if err is not None:
            faulthandler.cancel_dump_traceback_later()


def _stderr():
    """A stream with a file descriptor for faulthandler: sys.stderr, or the process's own stderr
    where sys.stderr was replaced by one without (pytest's capsys); None if there is none."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return None
