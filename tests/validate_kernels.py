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


def softmax_nan_float64(x, *, axis):
    """softmax that returns NaN everywhere for float64 (MLX's built-in float64 softmax fails its
    cases too, by a few 1e-9 relative: a known divergence that must not excuse this)."""
    if x.dtype == mx.float64:
        return mx.full(x.shape, float("nan"), dtype=x.dtype)
    return mx.softmax(x, axis=axis)


def exp_constant_float64(x):
    """exp that returns 42.0 for float64 (the built-in's float64 exp is float32-accurate: known
    divergence float64-float32-grade-math, which must not excuse a constant)."""
    if x.dtype == mx.float64:
        return mx.full(x.shape, 42.0, dtype=x.dtype)
    return mx.exp(x)


def gather_nd_wrong_on_tables(data, indices, *, batch_dims):
    """GatherND right on rank >= 3 data and wrong on a rank-2 table (the embedding lookup): it
    reads the row after the one indexed (a classic off-by-one of a hand-rolled 2-D path)."""
    from rlx_conformance.backends.mlx.custom import gather_nd
    if data.ndim == 2 and batch_dims == 0 and indices.shape[-1] == 1:
        indices = (indices + 1) % data.shape[0]
    return gather_nd(data, indices, batch_dims=batch_dims)
