"""The CPU reference of every op with a precise oracle against it, over the generated case matrix:
the elementwise ops (MPFR through gmpy2, correctly rounded to the output dtype) and the
reductions and scans (reduce_sum/mean/prod, softmax, cumsum, cum_prod: x87 long double, rounded
once), within each op's accuracy budget (cases/accuracy.toml).

Every matrix run already measures the reference against the precise oracle on each case it runs
and reports a reference over budget as a "reference bug" (judge/accuracy.py); this file makes the
same verdict a test of the harness's own suite, on a subsample that runs in seconds. The oracle is
independent of the reference by construction (judge/precise.py's docstring; an import-linter
contract keeps backends/cpu from the precise oracles, tests/test_layers.py), and is itself checked
against mpmath at 200 bits (tests/test_precise.py::test_oracle_matches_mpmath) and exact
rationals (test_reductions_vs_fraction). The budgets are the project's accuracy contract: for
the elementwise ops ULP from the correctly rounded result (0 for the IEEE ops add, sub, mul,
div, fma, sqrt), for the accumulating ops gamma_D sum|x| with D the summation depth of a good
implementation.

Subsample: every elementwise case (their operands have at most a few thousand elements); the
reductions and scans in every dtype below SMALL input elements, and their 10^5 and 10^6-element
families once per family and value class, in float32.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_conformance.generate import matrix
from rlx_conformance.judge import accuracy, precise
from rlx_conformance.run import execute

from oracle_common import CPU, TARGET, assert_each_case
SMALL = 5000
OPS = sorted(precise.ELEMENTWISE) + list(precise.REDUCTIONS)


def size(c: matrix.Case) -> int:
    return sum(math.prod(s) for s in c.shapes)


def cases(op: str) -> list[matrix.Case]:
    out, seen = [], set()
    for c in matrix.generate([TARGET], ops=[op]):
        if size(c) < SMALL:
            out.append(c)
        elif c.dtype == "float32" and (c.family, c.vals) not in seen:
            seen.add((c.family, c.vals))
            out.append(c)
    return out


def verdict(case: matrix.Case, out: list[np.ndarray] | None = None) -> str | None:
    """The reference-bug message of the case (None: within budget, or nothing to measure)."""
    inputs = matrix.make_inputs(case)
    ref = CPU.run(case.op, [x.copy() for x in inputs], case.attr_dict)
    out = ref if out is None else out
    with np.errstate(all="ignore"):
        # the reference's worst-case bounds, as a run passes them: their order-dependent positions
        # (an intermediate overflow some legal order of the sum or product takes) are left out
        _, _, _, bounds = execute.judge_with_bounds(case, inputs, ref, ref)
        res = accuracy.assess(case, inputs, out, out, True, ftz=False, bounds=bounds)
    return None if res is None else res["reference_bug"]


@pytest.mark.parametrize("op", OPS)
def test_reference_within_budget_of_the_precise_oracle(op: str) -> None:
    assert_each_case(cases(op), lambda case: (verdict(case) or "")[:300] or None, show=10)


@pytest.mark.parametrize("op", ["exp", "add", "reduce_sum"])
def test_a_perturbed_reference_is_a_reference_bug(op: str) -> None:
    """The verdict can fail: the reference's float32 output moved 4 ulp (elementwise) or by
    2^-12 relative (a sum) is reported as a reference bug on the matrix's cases."""
    caught = 0
    for case in (c for c in cases(op) if c.dtype == "float32" and c.vals == "random"):
        inputs = matrix.make_inputs(case)
        (ref,) = CPU.run(case.op, [x.copy() for x in inputs], case.attr_dict)
        if op == "reduce_sum":
            bad = (ref.astype(np.float64) * (1 + 2.0 ** -12)).astype(np.float32)
        else:
            bad = np.where(np.isfinite(ref) & (ref != 0), (ref.view(np.int32) + 4).view(np.float32), ref)
        caught += verdict(case, [np.asarray(bad, np.float32)]) is not None
    assert caught > 0
