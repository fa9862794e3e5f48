"""Kernels that hang, crash or abort on every call, and one that loses its CUDA context once, for
tests/test_fail_fast.py and benchmarks/bench_hang.py (issue 18: a hanging or crashing kernel is
diagnosed without paying the full timeout on every case). Loaded by validate from this file's
path (``tests/fail_fast_kernels.py:NAME``) in every worker process, or installed by a Runner init
hook (``fail_fast_kernels:install_...``)."""
from __future__ import annotations

import ctypes
import os
import time


def hangs(x):
    """Never returns (time.sleep forever, as a deadlocked kernel would)."""
    while True:
        time.sleep(3600)


def segfaults(x):
    """Dies by SIGSEGV on every call: a read through a null pointer, as a fault in native code."""
    ctypes.string_at(0)


def aborts(x):
    """Dies by SIGABRT on every call, as a failed assertion in native code."""
    os.abort()


# The lost CUDA context, on the CPU: the first call that meets POISON_SIZE raises MLX's CUDA
# error; every later call in the same process then returns garbage, as it would on the GPU.
POISON_SIZE = 7  # "odd", [[7]]
CUDA_ERROR = "[cuda_check] cudaMemcpyAsync failed: an illegal memory access was encountered"
_lost = False


PID_LOG = "RLX_TEST_PID_LOG"  # when set: each call appends "<pid> <size>" to this file


def loses_cuda_context(x):
    """-x, until a call on POISON_SIZE elements raises MLX's illegal-memory-access error; from
    then on this process returns 42 everywhere (garbage, as a poisoned CUDA context does)."""
    import mlx.core as mx

    global _lost
    if os.environ.get(PID_LOG):
        with open(os.environ[PID_LOG], "a") as f:
            f.write(f"{os.getpid()} {x.size}\n")
    if _lost:
        return mx.full(x.shape, 42.0, dtype=x.dtype)  # what a poisoned context hands back
    if x.size == POISON_SIZE:
        _lost = True
        raise RuntimeError(CUDA_ERROR)
    return mx.negative(x)


def replace_mlx_neg(fn) -> None:
    """MLX's ``neg`` becomes ``fn`` in this process, with the original per-device dtype claims:
    only the behaviour changes, not the declaration (the Runner init hooks here and in
    kernels_for_tests.py)."""
    from rlx_conformance.backends import get_backend

    mlx = get_backend("mlx")
    mlx.register("neg", fn, devices=dict(mlx.kernels["neg"].dtypes), replace=True, origin="tests")


def install_cuda_neg() -> None:
    """Runner init hook: MLX's ``neg`` becomes :func:`loses_cuda_context` in this worker."""
    replace_mlx_neg(loses_cuda_context)


def aborts_on_odd_sizes(x):
    """-x, but dies by SIGABRT on an input of odd size: a kernel that crashes on some cases only,
    as MLX's CUDA build does on every empty array in compiled mode (~1,000 cases of the default GPU
    run): each crash costs the run a fresh worker (benchmarks/bench_worker_churn.py)."""
    import mlx.core as mx

    if x.size % 2:
        os.abort()
    return mx.negative(x)


def install_neg_aborts_on_odd_sizes() -> None:
    """Runner init hook: MLX's ``neg`` becomes :func:`aborts_on_odd_sizes` in this worker."""
    replace_mlx_neg(aborts_on_odd_sizes)
