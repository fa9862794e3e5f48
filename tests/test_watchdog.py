"""In-process runs (``--workers 0``; the pytest plugin's items under xdist) have no worker to kill,
so a hanging case ends the process with its id and tracebacks (run/watchdog.py) instead of
blocking the session for ever. Run in a child process: the watchdog exits the process."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rlx_conformance.run import watchdog

HERE = Path(__file__).parent

CHILD = """
import sys
sys.path.insert(0, {here!r})
import kernels_for_tests as kt
from rlx_conformance.generate import matrix
from rlx_conformance.run import runner
kt.install_broken_neg()
cases = [c for c in matrix.generate([matrix.Target("mlx", "cpu", "eager")], ops=["neg"], dtypes=["float32"])
         if c.vals == "random" and c.size() == kt.HANG_SIZE]
assert len(cases) == 1
print("case", cases[0].id, flush=True)
for r in runner.Runner(workers=0, timeout={timeout}).run(cases):
    print("returned", r.outcome, flush=True)
"""


def test_a_hang_in_process_ends_the_process_naming_the_case():
    timeout = 1.0
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", CHILD.format(here=str(HERE), timeout=timeout)],
                       capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    case = p.stdout.split("case ", 1)[1].split()[0]
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr[-2000:])
    assert "returned" not in p.stdout
    assert f"{case} ran past {watchdog.FACTOR * timeout:g} s in-process" in p.stderr
    assert "Thread" in p.stderr and "kernels_for_tests.py" in p.stderr  # the tracebacks, at the kernel
    assert took < 60  # the limit (2 s) plus interpreter start and imports, not a hang


def test_a_case_inside_its_limit_is_untouched():
    with watchdog.watch("x", 30.0):
        time.sleep(0.01)
    with watchdog.watch("y", 0):  # no limit
        pass
