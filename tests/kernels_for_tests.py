"""Deliberately broken MLX kernels for the runner's isolation tests.

``install_broken_neg`` is a ``Runner(init="kernels_for_tests:install_broken_neg")`` hook: it runs
in every worker process at start and replaces the MLX ``neg`` kernel with one that misbehaves for
a few input sizes only, so the other cases of the same run show that nothing else was lost.
The module is importable in spawned workers because spawn hands the parent's sys.path to the
child, and tests/conftest.py puts tests/ on it.
"""
from __future__ import annotations

import os
import signal
import time

from fail_fast_kernels import replace_mlx_neg  # tests/ is on the path wherever this module is

# Sizes of the unary shape families in cases/shapes/core.toml (scalar and "one" both have size 1,
# so neither is used).
SEGV_SIZE = 7  # "odd", [[7]]: killed by SIGSEGV, as by a fault in native code
ABORT_SIZE = 15  # "matrix", [[3, 5]]: os.abort(), as by a failed assertion in native code
HANG_SIZE = 24  # "rank3", [[2, 3, 4]]: never returns within a test's timeout


def broken_neg(x):
    """-x, except for the sizes above. In compiled mode the misbehaviour happens while tracing
    (shapes are static there too), so every mode sees it."""
    import mlx.core as mx

    if x.size == SEGV_SIZE:
        os.kill(os.getpid(), signal.SIGSEGV)
    if x.size == ABORT_SIZE:
        os.abort()
    if x.size == HANG_SIZE:
        time.sleep(60)
    return mx.negative(x)


def install_broken_neg() -> None:
    replace_mlx_neg(broken_neg)


def broken_init() -> None:
    """An init hook that fails: the worker cannot start at all."""
    raise RuntimeError("deliberately broken init hook")


POISON_SIZE = 7  # "odd": leaves the process damaged; any later call in it aborts
_poisoned = False


def poisoning_neg(x):
    """-x, but the call for POISON_SIZE damages the process (as MLX's heap corruption does):
    it returns correctly, and every later call in the same process aborts."""
    import mlx.core as mx

    global _poisoned
    if _poisoned:
        os.abort()
    if x.size == POISON_SIZE:
        _poisoned = True
    return mx.negative(x)


def install_poisoning_neg() -> None:
    replace_mlx_neg(poisoning_neg)


def blas_threads(message, send):
    """A worker task: the thread counts of the BLAS libraries loaded in this process
    (threadpoolctl), for the runner's per-worker BLAS limit test."""
    from threadpoolctl import threadpool_info

    return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def global_symbol(message, send):
    """A worker task: whether ``message`` names a symbol of this process's global scope (what a
    library loaded RTLD_GLOBAL, run/worker.load_preloads, puts there)."""
    import ctypes

    return hasattr(ctypes.CDLL(None), message)


def has_module(message, send):
    """A worker task: whether the module ``message`` is loaded in this process."""
    import sys

    return message in sys.modules
