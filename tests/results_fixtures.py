"""Synthetic results.json files for the report sinks' tests (diff, lockfile, stats, HTML), made
from CaseResult and results.write_results, so a schema change shows up here as a test failure."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rlx_conformance.core.results import CaseResult, write_results
from rlx_conformance.generate import matrix
from rlx_conformance.judge.stability import classify


def result(op: str = "exp", dtype: str = "float32", outcome: str = "pass", *, n: int = 7,
           vals: str = "random", mode: str = "eager", device: str = "cpu", ulp: float | None = 0.0,
           rel: float | None = 0.0, **kw: Any) -> CaseResult:
    """One case result; ``n`` (the shape) makes distinct ids within an (op, dtype, target)."""
    case = matrix.Case(op, dtype, ((n,),), "odd", (), vals, matrix.Target("mlx", device, mode))
    return CaseResult.for_case(case, outcome, max_ulp=ulp, max_rel_err=rel, max_abs_err=rel, **kw)


def group(op: str, dtype: str, ulps: list[float], outcome: str = "pass", start: int = 1, **kw: Any) -> list[CaseResult]:
    """Cases of one group with these max-ULP values (shapes start, start+1, ...)."""
    return [result(op, dtype, outcome, n=start + i, ulp=u, rel=u * 2.0 ** -23, **kw) for i, u in enumerate(ulps)]


def write(path: Path, results: list[CaseResult], run: dict[str, Any] | None = None) -> Path:
    """A report dir holding results.json; returns the dir."""
    path.mkdir(parents=True, exist_ok=True)
    write_results(path / "results.json", run or {"start": "2026-01-01T00:00:00+00:00", "targets": []}, results,
                  classify(results))
    return path
