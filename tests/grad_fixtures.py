"""Derivative case records for the report sinks' tests: results_fixtures.result with the case's
derivative kind (CaseResult.grad) and its id segment (``…/grad:vjp/<target>``, as matrix.Case
spells it), so that forward and derivative records of one op sit side by side in one run."""
from __future__ import annotations

from typing import Any

from results_fixtures import result

from rlx_conformance.core.results import CaseResult


def derivative(grad: str, op: str = "exp", dtype: str = "float32", outcome: str = "pass", **kw: Any) -> CaseResult:
    """A ``grad`` (vjp, jvp, hvp) case record of ``op``; the other arguments as result's."""
    r = result(op, dtype, outcome, **kw)
    base, _, tgt = r.id.rpartition("/")
    r.id, r.grad = f"{base}/grad:{grad}/{tgt}", grad
    return r


def dgroup(grad: str, op: str, dtype: str, ulps: list[float], outcome: str = "pass", start: int = 1,
           **kw: Any) -> list[CaseResult]:
    """Derivative cases of one group with these max-ULP values, as results_fixtures.group."""
    return [derivative(grad, op, dtype, outcome, n=start + i, ulp=u, rel=u * 2.0 ** -23, **kw)
            for i, u in enumerate(ulps)]
