"""MLX kernels for linear algebra, all native mlx.core. mat_mul and dot_general run wherever the
device is; mx.linalg has no GPU implementation, so the factorizations, solvers and determinants
register with cpu_stream=True and run on the CPU stream of a GPU device (the result records it).
MLX has no LU solve: mx.linalg.solve and solve_triangular are what MLX offers, whatever their
numerical properties; finding those is the matrix's job."""
from __future__ import annotations

import math

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND

kernel = BACKEND.kernel
LINALG = dict(cpu_stream=True, note="mx.linalg has no GPU implementation: runs on the CPU stream")


@kernel("mat_mul")
def mat_mul(a, b):
    return mx.matmul(a, b)


@kernel("dot_general")
def dot_general(lhs, rhs, *, lhs_contracting, rhs_contracting, lhs_batch, rhs_batch):
    """Transpose to [batch, free, contracting] x [batch, contracting, free], one matmul, reshape."""
    # The axes read here, not with the reference's helper (a mistake in one reading then shows as
    # a mismatch); the attributes were validated by the op's shape inference before the kernel runs.
    lc, lbt = (tuple(d % lhs.ndim for d in v) for v in (lhs_contracting, lhs_batch))
    rc, rbt = (tuple(d % rhs.ndim for d in v) for v in (rhs_contracting, rhs_batch))
    lf = tuple(d for d in range(lhs.ndim) if d not in lc + lbt)
    rf = tuple(d for d in range(rhs.ndim) if d not in rc + rbt)
    size = lambda x, dims: math.prod(x.shape[d] for d in dims)  # noqa: E731
    a = mx.transpose(lhs, lbt + lf + lc).reshape(size(lhs, lbt), size(lhs, lf), size(lhs, lc))
    b = mx.transpose(rhs, rbt + rc + rf).reshape(size(rhs, rbt), size(rhs, rc), size(rhs, rf))
    out = tuple(lhs.shape[d] for d in lbt) + tuple(lhs.shape[d] for d in lf) + tuple(rhs.shape[d] for d in rf)
    return mx.matmul(a, b).reshape(out)


def _solve(A, b):
    vec = b.ndim == A.ndim - 1
    x = mx.linalg.solve(A, b[..., None] if vec else b, stream=mx.cpu)
    return x[..., 0] if vec else x


kernel("dense_solve", **LINALG)(lambda A, b: _solve(A, b))
kernel("batched_dense_solve", **LINALG)(lambda A, b: _solve(A, b))


@kernel("cholesky", **LINALG)
def cholesky(A):
    return mx.linalg.cholesky(A, upper=False, stream=mx.cpu)


@kernel("triangular_solve", **LINALG)
def triangular_solve(A, B, *, lower, transpose):
    """op(T) = T^T is the opposite triangle of A^T, so solve with A^T and the flipped flag."""
    vec = B.ndim == A.ndim - 1
    a = mx.swapaxes(A, -1, -2) if transpose else A
    upper = lower if transpose else not lower
    x = mx.linalg.solve_triangular(a, B[..., None] if vec else B, upper=upper, stream=mx.cpu)
    return x[..., 0] if vec else x


@kernel("det", **LINALG)
def det(A):
    return mx.linalg.det(A, stream=mx.cpu)


@kernel("log_det", **LINALG)
def log_det(A):
    return mx.linalg.slogdet(A, stream=mx.cpu)[1]


@kernel("svd", **LINALG)
def svd(A, *, part):
    k = min(A.shape[-2:])
    if part == "s":
        return mx.linalg.svd(A, compute_uv=False, stream=mx.cpu)
    u, _, vt = mx.linalg.svd(A, stream=mx.cpu)
    return u[..., :, :k] if part == "u" else vt[..., :k, :]


@kernel("qr", **LINALG)
def qr(A, *, part):
    q, r = mx.linalg.qr(A, stream=mx.cpu)
    return q if part == "q" else r
