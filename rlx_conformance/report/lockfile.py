"""The tolerance lock (cases/tolerance_lock.toml): the worst errors observed per (op, dtype, target)
over passing cases, committed so that accuracy can only ratchet: a run whose errors grew past the
lock is a regression, a run whose errors shrank well below it proposes tighter entries. Loosening
an entry takes a reason (by hand, or ``--update-lock --lock-reason TEXT``); tightening and adding
entries do not. The tolerances in cases/tolerances.toml say what passes; the lock says what this
backend has been seen to do, which is usually much better, and catches drift inside tolerance."""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.report.records import GroupKey, Record, key_str, parse_key
from rlx_conformance.report.stats import distributions

LOCK_NAME = "tolerance_lock.toml"
METRICS = ("max_ulp", "max_rel_err")
SHRINK = 2.0  # errors at or below locked / SHRINK propose a tighter entry
ULP_SLACK = 1.0  # ... and, for ULP, at least this many ULP below it (no 1 → 0 ULP churn)

HEADER = """\
# Tolerance lock: the worst errors observed per (op, dtype, backend-device-mode[-variant]) over passing
# cases. Written by `rlx-conformance nightly --update-lock` (or `diff ... --update-lock`); this
# header is rewritten with the file.
#
# Format: one line per group under [lock], keyed "op/dtype/backend-device-mode[-variant]":
#   "exp/float32/mlx-cpu-compiled" = { max_ulp = 14.0, max_rel_err = 8.3e-07 }
#   "sum/float32/mlx-gpu-lazy" = { max_ulp = 9.0, max_rel_err = 1e-06, reason = "why looser" }
# max_ulp: the largest max_ulp of the group's passing cases; max_rel_err likewise. A metric that
# is absent is not checked.
#
# Checks (nightly, diff, report): a passing case's error above its group's locked value is a
# lock violation, which fails the nightly. Errors at or below half the locked value (and, for
# ULP, at least 1 ULP below) are proposed as tighter entries; --update-lock writes those and
# adds groups the lock lacks, and never loosens an entry unless given --lock-reason TEXT, which
# it stores as the entry's `reason`. Loosening by hand: raise the value and add a `reason`.
# Groups a run did not cover are left as they are.
"""


@dataclass
class Entry:
    max_ulp: float | None = None
    max_rel_err: float | None = None
    reason: str | None = None

    def get(self, metric: str) -> float | None:
        return getattr(self, metric)


Lock = dict[GroupKey, Entry]


def default_path() -> Path:
    return data.data_path(LOCK_NAME)


def load(path: Path | None = None) -> Lock:
    """The lock at ``path`` (default cases/tolerance_lock.toml); an absent file is an empty lock."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        return {}
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f).get("lock", {})
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"{path}: {e}") from None
    lock: Lock = {}
    for k, v in raw.items():
        if not isinstance(v, dict) or set(v) - {*METRICS, "reason"}:
            raise RlxError(f"{path}: entry {k!r} must be a table of {', '.join(METRICS)} and reason")
        lock[parse_key(k)] = Entry(**{m: float(v[m]) for m in METRICS if m in v}, reason=v.get("reason"))
    return lock


def observe(cases: list[Record]) -> Lock:
    """The worst errors of each group's passing cases, in lock form."""
    out: Lock = {}
    for key, d in distributions(cases).items():
        if d.max is not None or d.max_rel is not None:
            out[key] = Entry(max_ulp=d.max, max_rel_err=d.max_rel)
    return out


@dataclass
class LockCheck:
    """A run against the lock: violations (grew past it), tighter proposals, unlocked groups."""

    path: str
    checked: int = 0  # groups both in the run and in the lock
    violations: list[dict[str, Any]] = field(default_factory=list)
    tighter: list[dict[str, Any]] = field(default_factory=list)
    unlocked: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return _jsonable({"path": self.path, "checked": self.checked, "violations": self.violations,
                          "tighter": self.tighter, "unlocked": self.unlocked})


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _tighter(metric: str, locked: float, seen: float) -> bool:
    if math.isinf(locked):
        return not math.isinf(seen)
    slack = ULP_SLACK if metric == "max_ulp" else 0.0
    return seen <= locked / SHRINK and locked - seen >= slack and seen < locked


def check(lock: Lock, observed: Lock, path: str | Path = "") -> LockCheck:
    chk = LockCheck(path=str(path))
    for key, seen in sorted(observed.items()):
        entry = lock.get(key)
        if entry is None:
            chk.unlocked.append({"group": key_str(key), "max_ulp": seen.max_ulp, "max_rel_err": seen.max_rel_err})
            continue
        chk.checked += 1
        missing = {}
        for m in METRICS:
            locked, now = entry.get(m), seen.get(m)
            if now is None:
                continue
            if locked is None:
                missing[m] = now
            elif now > locked:
                chk.violations.append({"group": key_str(key), "metric": m, "locked": locked,
                                       "observed": now, "reason": entry.reason})
            elif _tighter(m, locked, now):
                chk.tighter.append({"group": key_str(key), "metric": m, "locked": locked,
                                    "proposed": now, "reason": entry.reason})
        if missing:
            chk.unlocked.append({"group": key_str(key), **missing})
    return chk


def updated(lock: Lock, chk: LockCheck, reason: str | None = None) -> tuple[Lock, int]:
    """The lock with the check's proposals applied: tighter values and unlocked groups always,
    looser values (violations) only with a reason, which the entry then carries. Returns the new
    lock and how many violations were refused for want of a reason."""
    new = {k: Entry(e.max_ulp, e.max_rel_err, e.reason) for k, e in lock.items()}
    for t in chk.tighter:
        setattr(new[parse_key(t["group"])], t["metric"], t["proposed"])
    for u in chk.unlocked:
        e = new.setdefault(parse_key(u["group"]), Entry())
        for m in METRICS:
            if u.get(m) is not None:
                setattr(e, m, u[m])
    refused = 0
    for v in chk.violations:
        if not reason:
            refused += 1
            continue
        e = new[parse_key(v["group"])]
        setattr(e, v["metric"], v["observed"])
        e.reason = reason
    return new, refused


def _toml_float(x: float) -> str:
    return ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(float(x))


def dumps(lock: Lock) -> str:
    lines = [HEADER, "[lock]"]
    for key in sorted(lock):
        e = lock[key]
        parts = [f"{m} = {_toml_float(e.get(m))}" for m in METRICS if e.get(m) is not None]
        if e.reason:
            parts.append(f"reason = {json.dumps(e.reason, ensure_ascii=False)}")
        lines.append(f"{json.dumps(key_str(key), ensure_ascii=False)} = {{ {', '.join(parts)} }}")
    return "\n".join(lines) + "\n"


def write(lock: Lock, path: Path | None = None) -> Path:
    path = Path(path) if path is not None else default_path()
    atomic_write_text(path, dumps(lock))
    return path
