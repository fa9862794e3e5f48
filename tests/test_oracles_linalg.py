"""The CPU reference of mat_mul and dot_general against correctly rounded dot products, over every
case of the generated matrix in every dtype and value class (special values included).

The oracle reads docs/ops.md (linalg): mat_mul is numpy matmul (batch dims broadcast, a 1-D lhs a
row and a 1-D rhs a column, both dropped from the result); dot_general is XLA DotGeneral (contract
lhs_contracting with rhs_contracting, batch over lhs_batch / rhs_batch, output dims batch, lhs
free, rhs free, each in order). Both are brought here, by code written in this file, to batched
products [B, M, K] x [B, K, N]; each output is math.fsum of its K float64 products (exact products
for float32, float16 and bfloat16 operands, so the sum is the exact one rounded once; float64
operands' products are rounded once each).

The bound, as tests/test_independent_oracles.py's for conv (the reference evaluates in float64, long
double for float64 operands, and rounds once to the output dtype, the 16-bit dtypes through
float32):

    |reference - oracle| <= u_out |oracle| + 3 gamma_(K+1)(2^-53) sum|a||b| + eta

(Higham 3.5: both evaluations' summation errors and the oracle's product roundings; eta half the
smallest subnormal of the output dtype). Non-finite results are asserted exactly from IEEE's
rules for a sum of products (NaN from a NaN, an inf * 0 or opposite infinities; else an infinite
product's sign); an exact sum whose whole error interval lies past the dtype's range must be
+-inf, one straddling it may be either; outputs whose float64 products or sum|a||b| overflow
(float64 operands only) are not asserted.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, ETA, TARGET, UNIT, U64 as U, assert_each_case


def mat_mul_operands(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """[B, M, K], [B, K, N] and the output shape of numpy matmul."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = np.broadcast_to(a2, batch + a2.shape[-2:]).reshape((math.prod(batch),) + a2.shape[-2:])
    b3 = np.broadcast_to(b2, batch + b2.shape[-2:]).reshape((math.prod(batch),) + b2.shape[-2:])
    out = batch + (() if a.ndim == 1 else (a2.shape[-2],)) + (() if b.ndim == 1 else (b2.shape[-1],))
    return a3, b3, out


def dot_general_operands(lhs: np.ndarray, rhs: np.ndarray,
                         at: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    """[B, M, K], [B, K, N] and the output shape (batch, lhs free, rhs free) of XLA DotGeneral."""
    lc, rc, lb, rb = (list(at[k]) for k in ("lhs_contracting", "rhs_contracting", "lhs_batch", "rhs_batch"))
    lf = [d for d in range(lhs.ndim) if d not in lc + lb]
    rf = [d for d in range(rhs.ndim) if d not in rc + rb]
    batch = tuple(lhs.shape[d] for d in lb)
    lfree, rfree = tuple(lhs.shape[d] for d in lf), tuple(rhs.shape[d] for d in rf)
    k = math.prod(lhs.shape[d] for d in lc)
    a3 = np.transpose(lhs, lb + lf + lc).reshape(math.prod(batch), math.prod(lfree), k)
    b3 = np.transpose(rhs, rb + rc + rf).reshape(math.prod(batch), k, math.prod(rfree))
    return a3, b3, batch + lfree + rfree


def exact_sums(a3: np.ndarray, b3: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per output [B, M, N]: the oracle's value, sum|a||b|, whether a product is non-finite and
    then the expected non-finite result, and whether it is unasserted."""
    a64, b64 = a3.astype(np.float64), b3.astype(np.float64)
    bsz, m, k = a64.shape
    n = b64.shape[-1]
    want = np.zeros((bsz, m, n))
    mag = np.zeros((bsz, m, n))
    special = np.full((bsz, m, n), np.nan)
    has_special = np.zeros((bsz, m, n), bool)
    free = np.zeros((bsz, m, n), bool)
    with np.errstate(all="ignore"):
        for bi in range(bsz):
            terms = a64[bi][:, None, :] * np.transpose(b64[bi])[None, :, :]  # [M, N, K]
            # a product of finite float64 operands that overflows float64: its true value is finite
            overflow = ~np.isfinite(terms) & np.isfinite(a64[bi])[:, None, :] & np.isfinite(b64[bi]).T[None, :, :]
            for i in range(m):
                for j in range(n):
                    t = terms[i, j]
                    ok = np.isfinite(t)
                    if not ok.all():
                        if overflow[i, j].any():
                            free[bi, i, j] = True
                            continue
                        has_special[bi, i, j] = True
                        special[bi, i, j] = float(np.sum(t[~ok]))  # NaN, or opposite infinities -> NaN
                        continue
                    s = float(np.abs(t).sum())
                    if not math.isfinite(s):
                        free[bi, i, j] = True
                        continue
                    want[bi, i, j] = math.fsum(t)
                    mag[bi, i, j] = s
    return want, mag, has_special, special, free


def check(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    x, y = matrix.make_inputs(case)
    if out is None:
        (out,) = CPU.run(case.op, [x.copy(), y.copy()], case.attr_dict)
    out = np.asarray(out)
    a3, b3, shape = (mat_mul_operands(x, y) if case.op == "mat_mul"
                      else dot_general_operands(x, y, case.attr_dict))
    if out.shape != shape or out.dtype != x.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {shape} {x.dtype}"
    want, mag, spec_pos, special, free = (v.reshape(shape) for v in exact_sums(a3, b3))
    got = out.astype(np.float64)
    k = a3.shape[-1]
    gamma = (k + 1) * U / (1 - (k + 1) * U)
    w, g = special[spec_pos], got[spec_pos]
    if not np.all((g == w) | (np.isnan(w) & np.isnan(g))):
        return f"non-finite outputs differ: got {g[:5]}, want {w[:5]}"
    allowed = UNIT[case.dtype] * np.abs(want) + 3 * gamma * mag + ETA[case.dtype]
    fin = ~spec_pos & ~free
    with np.errstate(over="ignore", invalid="ignore"):
        must = fin & np.isinf((np.abs(want) - allowed).clip(0).astype(out.dtype))
        may = fin & np.isinf((np.abs(want) + allowed).astype(out.dtype))
        if not np.array_equal(got[must], np.sign(want[must]) * np.inf):
            return "an exact sum past the dtype's range is finite"
        fin &= ~may
        err = np.abs(got - want)
    over = fin & ~(err <= allowed)
    if over.any():
        i = np.unravel_index(np.argmax(np.where(over, err, 0)), shape)
        return f"{int(over.sum())} outputs over the bound; worst at {i}: got {got[i]}, want {want[i]}"
    return None


CASES = list(matrix.generate([TARGET], ops=["mat_mul", "dot_general"]))


@pytest.mark.parametrize("op", ["mat_mul", "dot_general"])
def test_reference_against_correctly_rounded_dot_products(op: str) -> None:
    assert_each_case((c for c in CASES if c.op == op), check)


@pytest.mark.parametrize("op", ["mat_mul", "dot_general"])
def test_the_oracle_rejects_a_wrong_product(op: str) -> None:
    """The comparison can fail: the reference's result with its last output element moved by
    2^-10 of sum|a||b| (a dropped or doubled term is of that order) is caught."""
    caught = 0
    for case in (c for c in CASES if c.op == op and c.dtype == "float32" and c.vals == "random"):
        x, y = matrix.make_inputs(case)
        (out,) = CPU.run(case.op, [x.copy(), y.copy()], case.attr_dict)
        if out.size == 0:
            continue
        a3, b3, _ = mat_mul_operands(x, y) if op == "mat_mul" else dot_general_operands(x, y, case.attr_dict)
        mag = exact_sums(a3, b3)[1]
        bad = out.astype(np.float64).reshape(-1)
        bad[-1] += max(mag.reshape(-1)[-1], 1.0) * 2.0 ** -10
        caught += check(case, bad.reshape(out.shape).astype(np.float32)) is not None
    assert caught > 0
