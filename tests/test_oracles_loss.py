"""The CPU reference of softmax_cross_entropy against a high-precision evaluation of its definition,
over the generated case matrix.

docs/ops.md (loss): per row (last axis = classes), -sum_c t_c log_softmax(x)_c = sum_c t_c (lse -
x_c) with lse = log sum_c exp(x_c), targets probabilities of the logits' shape. The oracle:
mpmath at 113 bits (lse = m + log sum exp(x_c - m), m the row's max, exact float inputs) for rows
of at most MP_ROW classes; longer rows (10^5 and 10^6 classes) with Python's math.exp / math.log
(float64 libm, within 1 ulp: measured practice of glibc) and math.fsum (correctly rounded sums).

The bound (the reference evaluates in float64, u = 2^-53, n classes): its lse errs by at most
D = gamma_(2n+4)(u) (1 + |lse|) (the subtractions x_c - m, the exponentials, the sum S in [1, n]
whose relative error becomes an absolute one through log, the final addition), and its sum of
n products t_c (lse - x_c) by sum|t_c| D + gamma_(n+2)(u) sum|t_c| |lse - x_c| (Higham 3.1, 4.2).
Twice that covers the fsum oracle too (same analysis, fewer roundings); plus the output dtype's
rounding u_out |loss| (16-bit dtypes: and float32's, as their results may round through float32)
and half its smallest subnormal.

Rows with a non-finite logit or target are asserted by docs/ops.md's rule for them (IEEE
arithmetic through sum_c t_c (lse - x_c)), written here with Python floats: NaN for a NaN
anywhere, a +inf logit, or every logit -inf; else each class adds t_c * inf for x_c = -inf and
t_c (lse - x_c) otherwise (lse by the float64 formula, math.fsum), and the row is their IEEE sum
(NaN where +inf meets -inf): never finite, asserted exactly.

Subsample: every case of the short families in every dtype; the 10^5 / 10^6-class families once
per value class in float32.
"""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, ETA, TARGET, UNIT, assert_each_case, gamma
MP_ROW = 2000
LONG = 10000


def row_oracle(x: list[float], t: list[float]) -> tuple[float, float]:
    """(loss, lse) of one finite row."""
    n = len(x)
    m = max(x)
    if n <= MP_ROW:
        with mpmath.workprec(113):
            s = mpmath.fsum(mpmath.exp(mpmath.mpf(v) - m) for v in x)
            lse = m + mpmath.log(s)
            loss = mpmath.fsum(mpmath.mpf(tc) * (lse - v) for tc, v in zip(t, x))
            return float(loss), float(lse)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    return math.fsum(tc * (lse - v) for tc, v in zip(t, x)), lse


def nonfinite_row(x: list[float], t: list[float]) -> float:
    """docs/ops.md's value of a row with a non-finite logit or target, by IEEE rules on Python
    floats (0 * inf is NaN, inf + -inf is NaN); finite only where every term is."""
    if any(math.isnan(v) for v in x + t) or math.inf in x or all(v == -math.inf for v in x):
        return math.nan
    m = max(x)
    lse = m + math.log(math.fsum(math.exp(v - m) for v in x))
    terms = [tc * math.inf if v == -math.inf else tc * (lse - v) for tc, v in zip(t, x)]
    if any(math.isnan(v) for v in terms) or (math.inf in terms and -math.inf in terms):
        return math.nan
    if math.inf in terms or -math.inf in terms:
        return math.inf if math.inf in terms else -math.inf
    return math.fsum(terms)


def check(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    logits, targets = matrix.make_inputs(case)
    if out is None:
        (out,) = CPU.run(case.op, [logits.copy(), targets.copy()], {})
    out = np.asarray(out)
    if out.shape != logits.shape[:-1] or out.dtype != logits.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {logits.shape[:-1]} {logits.dtype}"
    n = logits.shape[-1]
    xs = logits.astype(np.float64).reshape(-1, n)
    ts = targets.astype(np.float64).reshape(-1, n)
    got = out.astype(np.float64).reshape(-1)
    bad = []
    for r in range(xs.shape[0]):
        if n == 0:
            continue
        if not (np.isfinite(xs[r]).all() and np.isfinite(ts[r]).all()):
            want = nonfinite_row(xs[r].tolist(), ts[r].tolist())
            if not (math.isnan(want) and math.isnan(got[r]) or want == got[r]):
                bad.append(f"row {r} (non-finite inputs): got {got[r]!r}, want {want!r}")
            continue  # a row with a non-finite input has a non-finite value (t_c * inf, NaN)
        x, t = xs[r].tolist(), ts[r].tolist()
        want, lse = row_oracle(x, t)
        at = np.abs(ts[r])
        d = gamma(2 * n + 4) * (1 + abs(lse))
        e_ref = at.sum() * d + gamma(n + 2) * float((at * np.abs(lse - xs[r])).sum())
        bound = UNIT[case.dtype] * abs(want) + 2 * e_ref + ETA[case.dtype]
        if not abs(got[r] - want) <= bound:
            bad.append(f"row {r}: got {got[r]!r}, want {want!r} (bound {bound:.3g})")
    return "; ".join(bad[:3]) if bad else None


def cases() -> list[matrix.Case]:
    out, seen = [], set()
    for c in matrix.generate([TARGET], ops=["softmax_cross_entropy"]):
        if c.shapes[0][-1] < LONG:
            out.append(c)
        elif c.dtype == "float32" and (c.family, c.vals) not in seen:
            seen.add((c.family, c.vals))
            out.append(c)
    return out


CASES = cases()


def test_softmax_cross_entropy_against_high_precision() -> None:
    assert_each_case(CASES, check)


@pytest.mark.parametrize("wrong", ["no max shift", "mean not sum", "targets swapped", "0 log 0 = 0"])
def test_the_oracle_rejects_a_wrong_loss(wrong: str) -> None:
    """The comparison can fail: a loss without the max shift (overflows on large logits), the
    mean over classes instead of the sum, the log of the targets instead of the logits' (the
    arguments swapped), or a loss that leaves out classes of target 0 (0 log 0 = 0: finite where
    a -inf logit meets a zero target, NaN by the spec) is caught on the matrix's float32 cases."""
    caught = 0
    for case in (c for c in CASES if c.dtype == "float32" and c.shapes[0][-1] < LONG):
        x, t = (v.astype(np.float64) for v in matrix.make_inputs(case))
        with np.errstate(all="ignore"):
            if wrong == "no max shift":
                out = (t * (np.log(np.exp(x).sum(-1, keepdims=True)) - x)).sum(-1)
            elif wrong == "mean not sum":
                m = x.max(-1, keepdims=True)
                out = (t * (m + np.log(np.exp(x - m).sum(-1, keepdims=True)) - x)).mean(-1)
            elif wrong == "0 log 0 = 0":  # a class with target 0 left out (a -inf logit there: not NaN)
                m = x.max(-1, keepdims=True)
                lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
                out = np.where(t == 0, 0.0, t * (lse - x)).sum(-1)
            else:
                (out,) = CPU.run("softmax_cross_entropy", [t.astype(np.float32), x.astype(np.float32)], {})
        caught += check(case, np.asarray(out).astype(np.float32)) is not None
    assert caught > 0
