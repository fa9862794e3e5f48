"""Structured matrices for the linear-algebra cases (SPD, prescribed singular values, triangular,
badly scaled), made bit-identically on any machine.

Case inputs must not depend on the BLAS or on numpy's reduction order, so nothing here calls
matmul or sum on floats: products are accumulated term by term with elementwise IEEE operations
(each correctly rounded, hence identical everywhere) and norms use math.fsum (correctly rounded).
Random numbers come only from the case's values.Stream.
"""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec.values import Stream


def dmm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in float64, accumulated in a fixed order with elementwise operations only."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    out = np.zeros(shape)
    for k in range(a.shape[-1]):
        out = out + a[..., :, k:k + 1] * b[..., k:k + 1, :]
    return out


def fsum_last(x: np.ndarray) -> np.ndarray:
    """Correctly rounded sum over the last axis."""
    flat = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
    return np.array([math.fsum(r) for r in flat]).reshape(x.shape[:-1])


def uniform(stream: Stream, shape: tuple[int, ...], lo: float, hi: float) -> np.ndarray:
    return stream.uniform(math.prod(shape), lo, hi).reshape(shape)


def orthogonal(stream: Stream, batch: tuple[int, ...], n: int, reflectors: int = 6) -> np.ndarray:
    """A dense orthogonal matrix per batch entry: a product of random Householder reflectors, a
    random permutation and random signs (all applied with deterministic arithmetic)."""
    q = np.broadcast_to(np.eye(n), batch + (n, n)).copy()
    for _ in range(min(n, reflectors)):
        v = uniform(stream, batch + (n, 1), -1, 1)
        s = fsum_last(v[..., 0] ** 2)[..., None, None]
        q = q - dmm(q, v) * (2.0 / s) * np.swapaxes(v, -1, -2)
    perm = np.argsort(stream.raw(n), kind="stable")
    signs = np.where(stream.coin(n), -1.0, 1.0)
    return q[..., perm] * signs


def geometric(n: int, cond: float) -> np.ndarray:
    """n values from 1 down to 1/cond, evenly spaced in log (1 for n == 1)."""
    if n <= 1:
        return np.ones(n)
    return np.exp(-np.log(cond) * np.arange(n) / (n - 1))


def with_singular_values(stream: Stream, batch: tuple[int, ...], m: int, n: int,
                         sigma: np.ndarray) -> np.ndarray:
    """U diag(sigma) V^T for random orthogonal U (m x m), V (n x n); sigma has min(m, n) entries."""
    k = min(m, n)
    u = orthogonal(stream, batch, m)[..., :, :k]
    v = orthogonal(stream, batch, n)[..., :, :k]
    return dmm(u * sigma, np.swapaxes(v, -1, -2))


def symmetric_from_eigen(stream: Stream, batch: tuple[int, ...], n: int, lam: np.ndarray) -> np.ndarray:
    """Q diag(lam) Q^T, exactly symmetric."""
    q = orthogonal(stream, batch, n)
    a = dmm(q * lam, np.swapaxes(q, -1, -2))
    return (a + np.swapaxes(a, -1, -2)) * 0.5


def pow2_scales(stream: Stream, shape: tuple[int, ...], max_exp: int) -> np.ndarray:
    """Exact powers of two 2^k, k uniform in [-max_exp, max_exp] (scaling by them is exact)."""
    k = stream.integers(math.prod(shape), -max_exp, max_exp).reshape(shape)
    return np.ldexp(1.0, k)


def target_cond(dtype: str, n: int) -> float:
    """An ill but safely nonsingular condition number for matrices stored in ``dtype``: about
    1e-3 / u of the storage dtype (so rounding the entries keeps the matrix far from singular),
    capped at 1e5 for float32 and 1e12 for float64."""
    u = dt.finfo(dtype).unit_roundoff
    return float(min(1e-3 / (u * max(n, 1)), {"float32": 1e5, "float64": 1e12}.get(dtype, 1e5)))


def exp_range(dtype: str) -> int:
    """Largest power-of-two exponent for badly scaled rows/columns that stays far inside the
    dtype's range after a product of a few such scales."""
    return {"float16": 3, "bfloat16": 12, "float32": 12, "float64": 60}[dtype]


def to_dtype(x: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(over="ignore", under="ignore"):
        return np.asarray(x, np.float64).astype(dt.np_dtype(dtype))
