"""The difference between two runs (a baseline and a new run), case by case and per error
distribution, and whether it is a regression that should fail CI.

Regression (exit 1): a new failure (a case bad in NEW that passed, xfailed or skipped in BASE, or
a bad case BASE did not have), error drift (a case passing in both whose max ULP or max relative
error grew past the thresholds), distribution drift (a group whose p99 or max ULP, or count over
budget, grew over the cases both runs share) and tolerance-lock violations. Fixed cases, added or
removed cases and other outcome changes are reported but do not fail."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from rlx_conformance.report.records import (
    Record,
    Report,
    brief,
    is_bad,
    key_str,
    measure,
)
from rlx_conformance.report.stats import Dist, distributions

SCHEMA = "rlx-conformance/diff/v1"


@dataclass(frozen=True)
class Thresholds:
    """When a grown error counts as drift: it must exceed ``growth`` times the old value AND the
    old value plus a floor, so a 0→1 ULP change (a last-bit difference that stays in tolerance)
    or float noise does not fail a nightly, while 1→8 ULP does. The relative-error floor is in
    machine epsilons of the case's dtype, so one setting fits float16 and float64 alike."""

    ulp_growth: float = 2.0
    ulp_floor: float = 2.0
    rel_growth: float = 2.0
    rel_floor_eps: float = 4.0

    def grew(self, old: float | None, new: float | None, growth: float, floor: float) -> bool:
        if old is None or new is None:
            return False
        if math.isinf(new):
            return not math.isinf(old)
        return new > old * growth and new - old > floor

    def grew_ulp(self, old: float | None, new: float | None) -> bool:
        return self.grew(old, new, self.ulp_growth, self.ulp_floor)

    def grew_rel(self, old: float | None, new: float | None, dtype: str) -> bool:
        return self.grew(old, new, self.rel_growth, self.rel_floor_eps * _eps(dtype))


# Machine epsilon per float dtype; other dtypes (ints, bool: bit-exact) get float64's.
_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}


def _eps(dtype: str) -> float:
    return _EPS.get(dtype, _EPS["float64"])


@dataclass
class Diff:
    base: str | None  # results.json paths; base None = no baseline (every case is added)
    new: str
    thresholds: Thresholds
    new_failures: list[dict[str, Any]] = field(default_factory=list)
    fixed: list[dict[str, Any]] = field(default_factory=list)
    outcome_changes: list[dict[str, Any]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    still_bad: int = 0
    error_drift: list[dict[str, Any]] = field(default_factory=list)
    distribution_drift: list[dict[str, Any]] = field(default_factory=list)
    lock: Any = None  # lockfile.LockCheck, set by the front that checked the lock

    @property
    def lock_violations(self) -> int:
        return len(self.lock.violations) if self.lock is not None else 0

    @property
    def regression(self) -> bool:
        return bool(self.new_failures or self.error_drift or self.distribution_drift or self.lock_violations)

    def counts(self) -> dict[str, int]:
        return {"new_failures": len(self.new_failures), "fixed": len(self.fixed),
                "outcome_changes": len(self.outcome_changes), "added": len(self.added),
                "removed": len(self.removed), "still_bad": self.still_bad,
                "error_drift": len(self.error_drift), "distribution_drift": len(self.distribution_drift),
                "lock_violations": self.lock_violations,
                "lock_tighter": len(self.lock.tighter) if self.lock is not None else 0,
                "lock_unlocked": len(self.lock.unlocked) if self.lock is not None else 0}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "base": self.base, "new": self.new, "thresholds": asdict(self.thresholds),
                "regression": self.regression, "counts": self.counts(),
                "new_failures": self.new_failures, "fixed": self.fixed,
                "outcome_changes": self.outcome_changes, "error_drift": self.error_drift,
                "distribution_drift": self.distribution_drift, "added": self.added,
                "removed": self.removed, "lock": None if self.lock is None else self.lock.to_json()}


def compare(base: Report | None, new: Report, thresholds: Thresholds = Thresholds()) -> Diff:
    b = base.by_id() if base is not None else {}
    n = new.by_id()
    d = Diff(base=str(base.path) if base is not None else None, new=str(new.path), thresholds=thresholds)
    d.added = sorted(set(n) - set(b))
    d.removed = sorted(set(b) - set(n))
    for cid in d.added:
        if is_bad(n[cid].get("outcome")):
            d.new_failures.append({"id": cid, "base": None, "new": brief(n[cid])})
    common = sorted(set(b) & set(n))
    for cid in common:
        old, cur = b[cid], n[cid]
        o, c = old.get("outcome"), cur.get("outcome")
        if is_bad(c) and not is_bad(o):
            d.new_failures.append({"id": cid, "base": brief(old), "new": brief(cur)})
        elif is_bad(o) and not is_bad(c):
            d.fixed.append({"id": cid, "base": brief(old), "new": brief(cur)})
        elif o != c:
            d.outcome_changes.append({"id": cid, "base": o, "new": c})
        if is_bad(o) and is_bad(c):
            d.still_bad += 1
        if o == c == "pass":
            d.error_drift.extend(_case_drift(cid, old, cur, thresholds))
    d.new_failures.sort(key=lambda x: x["id"])
    d.distribution_drift = _distribution_drift([b[i] for i in common], [n[i] for i in common], thresholds)
    return d


def _case_drift(cid: str, old: Record, cur: Record, t: Thresholds) -> list[dict[str, Any]]:
    out = []
    ou, nu = measure(old.get("max_ulp")), measure(cur.get("max_ulp"))
    if t.grew_ulp(ou, nu):
        out.append({"id": cid, "metric": "max_ulp", "base": old.get("max_ulp"), "new": cur.get("max_ulp")})
    orl, nrl = measure(old.get("max_rel_err")), measure(cur.get("max_rel_err"))
    if t.grew_rel(orl, nrl, cur.get("dtype", "float64")):
        out.append({"id": cid, "metric": "max_rel_err", "base": old.get("max_rel_err"), "new": cur.get("max_rel_err")})
    return out


def _distribution_drift(base: list[Record], new: list[Record], t: Thresholds) -> list[dict[str, Any]]:
    """Groups whose p99 or max ULP (or over-budget count) got worse. Computed over the cases both
    runs hold, so a subset run, a shard or newly added cases do not read as drift."""
    bd, nd = distributions(base), distributions(new)
    out = []
    for key in sorted(set(bd) & set(nd)):
        metrics = _worse(bd[key], nd[key], t)
        if metrics:
            out.append({"group": key_str(key), "op": key[0], "dtype": key[1], "target": key[2],
                        "metrics": metrics, "all_pass": nd[key].bad == 0,
                        "base": bd[key].to_json(), "new": nd[key].to_json()})
    return out


def _worse(b: Dist, n: Dist, t: Thresholds) -> list[str]:
    worse = [m for m in ("p99", "max") if t.grew_ulp(getattr(b, m), getattr(n, m))]
    if b.over_budget is not None and n.over_budget is not None and n.over_budget > b.over_budget:
        worse.append("over_budget")
    return worse

