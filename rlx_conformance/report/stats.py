"""Error statistics of a run: per (op, dtype, target) group, the distribution of the cases' max ULP
errors (max, p99, p50) and how many cases went over their accuracy budget (issue 7 item 4).

Passing and excused (xfail) cases are two separate distributions of each group: a failure is
reported by its outcome, and one wrong NaN (2^31 ULP) among the excused cases would hide every
change among the cases that agree, so the two are never pooled; but an excused case's error is
still measured, and one that grows 100× is a regression of its own (issue 14 item 7), which the
baseline diff can only see if the excused errors have a distribution too. Bad cases (fail, crash,
...) enter neither. The baseline diff compares these distributions to catch accuracy that
degrades while every case keeps its outcome."""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from rlx_conformance.core.errors import RlxError
from rlx_conformance.ops import get_op
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.report.records import (
    GroupKey,
    Record,
    group_key,
    is_bad,
    measure,
    split_subject,
    subject,
)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return "inf" if isinstance(v, float) and math.isinf(v) else v


@dataclass(frozen=True)
class Errors:
    """The max-ULP distribution of one set of a group's cases (its passing or its excused ones).
    ``n`` counts the cases with a measured max ULP; ``over_budget`` is None when no case record
    carries the field (no oracle ran)."""

    n: int = 0
    p50: float | None = None
    p99: float | None = None
    max: float | None = None
    max_rel: float | None = None
    over_budget: int | None = None

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


@dataclass(frozen=True)
class Dist:
    """The error distribution of one group: the passing cases' (the flat fields, what the lock
    and the plots read) and, apart, the excused cases' (``excused``: xfail under a known
    divergence)."""

    cases: int
    passed: int
    bad: int
    n: int
    p50: float | None
    p99: float | None
    max: float | None
    max_rel: float | None
    over_budget: int | None
    xfailed: int = 0
    excused: Errors = field(default_factory=Errors)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(asdict(self))


def nearest_rank(sorted_values: list[float], q: float) -> float | None:
    """The q-th percentile by nearest rank: always an observed value, so the p99 of a group means
    "a case really had this error", and small groups get no interpolated values."""
    if not sorted_values:
        return None
    k = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[k - 1]


def _over_budget(rec: Record) -> int | None:
    """1 if the case went over its accuracy budget, 0 if not, None if it has no such field. The
    oracle writes a bool, or a count of elements; either way this counts cases."""
    v = rec.get("over_budget")
    if v is None:
        return None
    return 1 if v else 0


def errors(recs: Iterable[Record]) -> Errors:
    """The distribution of these records' errors, whatever their outcome (the caller picks)."""
    recs = list(recs)
    ulps = sorted(u for u in (measure(r.get("max_ulp")) for r in recs) if u is not None)
    rels = [x for x in (measure(r.get("max_rel_err")) for r in recs) if x is not None]
    budgets = [b for b in (_over_budget(r) for r in recs) if b is not None]
    return Errors(n=len(ulps), p50=nearest_rank(ulps, 50), p99=nearest_rank(ulps, 99),
                  max=ulps[-1] if ulps else None, max_rel=max(rels) if rels else None,
                  over_budget=sum(budgets) if budgets else None)


def distribution(recs: Iterable[Record]) -> Dist:
    recs = list(recs)
    passing = [r for r in recs if r.get("outcome") == "pass"]
    excused = [r for r in recs if r.get("outcome") == "xfail"]
    p = errors(passing)
    return Dist(cases=len(recs), passed=len(passing), bad=sum(is_bad(r.get("outcome")) for r in recs),
                n=p.n, p50=p.p50, p99=p.p99, max=p.max, max_rel=p.max_rel, over_budget=p.over_budget,
                xfailed=len(excused), excused=errors(excused))


def distributions(cases: Iterable[Record]) -> dict[GroupKey, Dist]:
    groups: dict[GroupKey, list[Record]] = defaultdict(list)
    for r in cases:
        groups[group_key(r)].append(r)
    return {k: distribution(v) for k, v in sorted(groups.items())}


@cache
def op_family(op: str) -> str:
    """The op's family from the registry (the case records hold only the shape family); an op
    this checkout does not know (a results.json from a newer harness) goes under "other". A
    derivative subject ("exp:vjp") is of its op's family; a graph case ("graph:NAME", issue 17)
    of the family "graph"."""
    op = split_subject(op)[0]
    if op.startswith(GRAPH_PREFIX):
        return "graph"
    try:
        return get_op(op).family
    except (KeyError, RlxError):
        return "custom" if "." in op else "other"


def ulps_by_family(cases: Iterable[Record]) -> dict[str, list[float]]:
    """The max ULP of every passing case, per op family (what the distribution plots draw); a
    derivative case's under its family and kind ("activation · vjp"), not pooled with forwards."""
    out: dict[str, list[float]] = defaultdict(list)
    for r in cases:
        u = measure(r.get("max_ulp"))
        if r.get("outcome") == "pass" and u is not None:
            out[op_family(r["op"]) + (f" · {r['grad']}" if r.get("grad") else "")].append(u)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Worst:
    op: str
    max_ulp: float
    id: str  # the case that has it


def worst_ops(cases: Iterable[Record], n: int = 20) -> list[Worst]:
    """The n ops with the largest max ULP among their passing cases (ops at 0 ULP left out); an
    op's derivatives rank apart, by their subject ("exp:vjp")."""
    best: dict[str, Worst] = {}
    for r in cases:
        u = measure(r.get("max_ulp"))
        if r.get("outcome") != "pass" or u is None or u <= 0:
            continue
        s = subject(r)
        w = best.get(s)
        if w is None or u > w.max_ulp:
            best[s] = Worst(s, u, r["id"])
    return sorted(best.values(), key=lambda w: (-w.max_ulp, w.op))[:n]
