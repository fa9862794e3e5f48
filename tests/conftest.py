"""Test setup shared by the harness's unit tests.

tests/ goes on sys.path explicitly: Runner workers use the spawn start method, and spawn hands
the parent's sys.path to each child, so ``init="kernels_for_tests:..."`` imports there as it does
here. (Runner(env={"PYTHONPATH": ...}) cannot do this: the worker sets its environment after its
interpreter has started, when sys.path is already fixed.) The repository root does not: the tests
import the installed package (the wheel under tox, or an editable install), and the root's
rlx_conformance/ would shadow it without rlx_conformance.backends and .cases, which only the
installation maps in from backends/ and cases/.
"""
from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import settings

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# No example database on disk (tests run from a shared checkout), no per-example deadline
# (the machine is shared and timings jitter).
settings.register_profile("rlx", database=None, deadline=None)
settings.load_profile("rlx")
