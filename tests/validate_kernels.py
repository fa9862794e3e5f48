"""Kernels for tests/test_validate.py: each breaks one rule, so validate must report that rule.

All are for hard_sigmoid (one float input, no attributes, 14 cases per dtype and mode) unless
named otherwise. Loaded by validate from this file's path (``tests/validate_kernels.py:NAME``),
in every worker process.
"""
from __future__ import annotations

import os
import signal
import time

import mlx.core as mx
import numpy as np


def _hs(x):
    return mx.clip((x + 3) / 6, 0.0, 1.0)


def crash_or_hang(x):
    """Right, except that it kills its process on 7 elements (family "odd") and hangs on 24
    (family "rank3")."""
    if x.size == 7:
        os.kill(os.getpid(), signal.SIGSEGV)
    if x.size == 24:
        time.sleep(120)
    return _hs(x)


def wrong_shape(x):
    return mx.expand_dims(_hs(x), 0)


def wrong_dtype(x):
    return _hs(x).astype(mx.int32)


def not_an_array(x):
    return np.array(_hs(x))  # a numpy array, not an mx.array


def mutates_input(x):
    y = _hs(x)
    x[...] = 0  # writes to the input the harness handed over
    return y


def two_inputs(x, y):
    """Does not fit hard_sigmoid's signature (one input): registration fails (exit 2)."""
    return x


def planted_bug(x):
    """Right on every shape of the matrix, wrong on 1-D inputs of 2 to 4 elements (fuzzing
    draws such shapes from the family "odd", [7] in the matrix)."""
    y = _hs(x)
    if x.ndim == 1 and 2 <= x.shape[0] <= 4:
        return y + 0.25
    return y


def sign_like_builtin(x):
    """sign as the built-in MLX kernel computes it (mx.sign(NaN) = 0, a known divergence)."""
    return mx.sign(x)


def cholesky_unchecked(A):
    """mx.linalg.cholesky as is: returns garbage for a matrix that is not positive definite."""
    return mx.linalg.cholesky(A, upper=False, stream=mx.cpu)


def cholesky_checked(A):
    """Rejects what is not positive definite, as the spec asks (an error, not garbage)."""
    L = mx.linalg.cholesky(A, upper=False, stream=mx.cpu)
    d = mx.diagonal(L, axis1=-2, axis2=-1)
    mx.eval(d)
    if A.shape[-1] and not bool(mx.all(mx.isfinite(L)).item() and mx.all(d > 0).item()):
        raise ValueError("cholesky: the matrix is not positive definite")
    return L
