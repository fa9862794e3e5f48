"""Reference kernels for linear algebra: numpy/scipy (LAPACK) in float64, rounded once. Products
of float64 operands are accumulated in long double so the reference stays well inside the bound
allowed to a float64 backend. Determinants are products of LU pivots kept as mantissa/exponent
pairs, so no intermediate over- or underflows."""
from __future__ import annotations

import math
import warnings

import numpy as np
import scipy.linalg

from rlx_conformance.backends.cpu import BACKEND
from rlx_conformance.judge.bounds.linalg import dot_general_canonical

kernel = BACKEND.kernel


def _mats(x: np.ndarray) -> np.ndarray:
    """[..., m, n] -> [batch, m, n] (also for empty batches or matrices)."""
    return x.reshape((math.prod(x.shape[:-2]),) + x.shape[-2:])


def _wide(x: np.ndarray) -> np.ndarray:
    """Accumulation dtype: long double for float64 operands, float64 otherwise."""
    return x.astype(np.longdouble if x.dtype == np.float64 else np.float64)


@kernel("mat_mul")
def mat_mul(a, b):
    return np.asarray(np.matmul(_wide(a), _wide(b))).astype(a.dtype)


@kernel("dot_general")
def dot_general(lhs, rhs, *, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch):
    attrs = dict(lhs_contracting=lhs_contracting, rhs_contracting=rhs_contracting,
                 lhs_batch=lhs_batch, rhs_batch=rhs_batch)
    A, B, out = dot_general_canonical(_wide(lhs), _wide(rhs), attrs)
    return np.matmul(A, B).reshape(out).astype(lhs.dtype)


def _solve(a, b):
    """LAPACK gesv per batch entry; an exactly singular matrix raises LinAlgError."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    vec = b.ndim == a.ndim - 1
    if vec:
        b64 = b64[..., None]
    out = np.empty(b64.shape)
    A, B, X = _mats(a64), _mats(b64), _mats(out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", scipy.linalg.LinAlgWarning)
        for i in range(A.shape[0]):
            if A.shape[-1]:
                X[i] = scipy.linalg.solve(A[i], B[i])
    return (out[..., 0] if vec else out).astype(a.dtype)


@kernel("dense_solve")
def dense_solve(A, b):
    return _solve(A, b)


@kernel("batched_dense_solve")
def batched_dense_solve(A, b):
    return _solve(A, b)


@kernel("cholesky")
def cholesky(A):
    """LAPACK potrf (lower); raises LinAlgError when A is not positive definite."""
    if A.shape[-1] == 0:
        return A.copy()
    return np.linalg.cholesky(A.astype(np.float64)).astype(A.dtype)


@kernel("triangular_solve")
def triangular_solve(A, B, *, lower, transpose):
    """LAPACK trtrs via scipy: reads only the selected triangle; a zero pivot raises."""
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    vec = B.ndim == A.ndim - 1
    if vec:
        b64 = b64[..., None]
    out = np.empty(b64.shape)
    Am, Bm, X = (_mats(v) for v in (a64, b64, out))
    n = A.shape[-1]
    for i in range(Am.shape[0]):
        if n:
            t = np.tril(Am[i]) if lower else np.triu(Am[i])  # never let the other triangle in
            if not np.all(np.diagonal(t)):
                raise np.linalg.LinAlgError("triangular_solve: zero on the diagonal (singular)")
            X[i] = scipy.linalg.solve_triangular(t, Bm[i], lower=lower, trans=1 if transpose else 0,
                                                 check_finite=False)
    return (out[..., 0] if vec else out).astype(A.dtype)


def _lu_pivots(a: np.ndarray) -> tuple[np.ndarray, int]:
    """Diagonal of U and the permutation's sign (LAPACK getrf via scipy)."""
    lu, piv = scipy.linalg.lu_factor(a, check_finite=False)
    sign = -1 if int(np.sum(piv != np.arange(len(piv)))) % 2 else 1
    return np.diagonal(lu).copy(), sign


def exact_product(values: np.ndarray) -> tuple[float, int]:
    """prod(values) as (mantissa, exponent) with mantissa in [0.5, 1): no over- or underflow."""
    m, e = 1.0, 0
    for v in values:
        fm, fe = math.frexp(float(v))
        m, e = m * fm, e + fe
        m, de = math.frexp(m)
        e += de
    return m, e


@kernel("det")
def det(A):
    a64 = _mats(A.astype(np.float64))
    out = np.ones(a64.shape[0])
    for i, a in enumerate(a64):
        if a.shape[-1] == 0:
            continue
        d, sign = _lu_pivots(a)
        m, e = exact_product(d)
        out[i] = sign * np.ldexp(m, e) if m != 0 else 0.0
    return out.reshape(A.shape[:-2]).astype(A.dtype)


@kernel("log_det")
def log_det(A):
    a64 = _mats(A.astype(np.float64))
    out = np.zeros(a64.shape[0])
    for i, a in enumerate(a64):
        if a.shape[-1] == 0:
            continue
        d, _ = _lu_pivots(a)
        with np.errstate(divide="ignore"):
            out[i] = math.fsum(np.log(np.abs(d))) if np.all(d != 0) else -math.inf
    return out.reshape(A.shape[:-2]).astype(A.dtype)


@kernel("svd")
def svd(A, *, part):
    a64 = A.astype(np.float64)
    m, n = A.shape[-2:]
    k = min(m, n)
    if a64.size == 0:
        shape = {"u": A.shape[:-2] + (m, k), "s": A.shape[:-2] + (k,), "vt": A.shape[:-2] + (k, n)}[part]
        return np.zeros(shape, A.dtype)
    if part == "s":
        return np.linalg.svd(a64, compute_uv=False).astype(A.dtype)
    u, s, vt = np.linalg.svd(a64, full_matrices=False)
    return (u if part == "u" else vt).astype(A.dtype)


@kernel("qr")
def qr(A, *, part):
    m, n = A.shape[-2:]
    k = min(m, n)
    if A.size == 0:
        shape = A.shape[:-2] + ((m, k) if part == "q" else (k, n))
        return np.zeros(shape, A.dtype)
    q, r = np.linalg.qr(A.astype(np.float64), mode="reduced")
    return (q if part == "q" else r).astype(A.dtype)
