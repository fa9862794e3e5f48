"""A deliberately crashing MLX kernel for the exhaustive mode's isolation test
(tests/test_exhaustive.py): an init hook run in every exhaustive worker."""
from __future__ import annotations

import os
import signal


def install_crashing_neg() -> None:
    """MLX's neg dies by SIGSEGV on float16 input (as a fault in native code would)."""
    import mlx.core as mx

    from rlx_conformance.backends import get_backend

    mlx = get_backend("mlx")
    old = mlx.kernels["neg"]

    def neg(x):
        if x.dtype == mx.float32 and getattr(neg, "f16", False):
            os.kill(os.getpid(), signal.SIGSEGV)
        return mx.negative(x)

    def run(*a, **k):
        neg.f16 = any(getattr(v, "dtype", None) == __import__("numpy").float16 for v in a[1])
        return orig_run(*a, **k)

    orig_run = mlx.run
    mlx.run = run  # the instance attribute shadows the method
    mlx.register("neg", neg, devices=dict(old.dtypes), replace=True, origin="tests")
