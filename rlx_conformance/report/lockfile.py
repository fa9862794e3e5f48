"""The tolerance lock (cases/tolerance_lock.toml): the worst errors observed per (op, dtype, target)
over passing cases, committed so that accuracy can only ratchet: a run whose errors grew past the
lock is a regression, a run whose errors shrank well below it proposes tighter entries. Loosening
an entry takes a reason (by hand, or ``--update-lock --lock-reason TEXT``); tightening and adding
entries do not. The tolerances in cases/tolerances.toml say what passes; the lock says what this
backend has been seen to do, which is usually much better, and catches drift inside tolerance.

The file lists the targets it covers and only the groups that are not bit-exact: every group of a
covered target is locked at 0 ULP and 0 relative error unless a line says otherwise, and a line
keyed by backend-device ("exp/float32/mlx-cpu") stands for every covered mode of it.

The lock never holds a group above its accuracy budget (cases/accuracy.toml; issue 14 item 7): a
locked value past what a good implementation achieves ratchets nothing, and makes the error look
accepted. Such a group is a failure or a capped known divergence, not a lock line: the check
lists it apart (not compared with the lock; the diff's distribution drift still sees its errors
grow), flags a line that holds it (a regression), and --update-lock neither adds, raises nor
keeps one for it."""
from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.judge.accuracy import budget_for
from rlx_conformance.report.records import (
    GroupKey,
    Record,
    key_str,
    parse_key,
    split_subject,
)
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
# Format. `targets` lists the targets the lock covers. Every (op, dtype) group of a covered
# target is locked at max_ulp = 0 and max_rel_err = 0 (bit-exact against the reference) unless
# a line under [lock.groups] says otherwise; groups of other targets are not locked (a run
# lists them as unlocked, and --update-lock adds their targets). A line is keyed
# "op/dtype/backend-device" when every covered mode of that backend-device has the same
# values, else "op/dtype/backend-device-mode[-variant]" for one target (a one-target line
# overrides a backend-device line of the same group; a line of a target not in `targets` locks
# that group alone). {for_example}:
{examples}
# max_ulp: the largest max_ulp of the group's passing cases; max_rel_err likewise. A metric a
# line leaves out is not checked. A line may carry `reason = "why looser"`.
# A derivative's groups are keyed by op:KIND ("tanh:vjp/float32/mlx-cpu", KIND vjp, jvp or
# hvp): their errors are against the reference derivative, locked apart from the forward's.
# A graph case's groups are keyed by graph:NAME ("graph:swiglu/float32/mlx-cpu", issue 17): its
# errors are against the float64 composition of the reference kernels, judged by the bound
# propagated node by node (tolerance source graph:first-order-propagation), no accuracy budget.
# A layout case (inputs as views) is in its op's group: a view must not cost accuracy.
#
# No line holds a group above its accuracy budget (cases/accuracy.toml): where the precise
# oracle judged the group's cases, one passing case over budget; else, for a budget in ULP
# alone, a max_ulp above twice the budget (a target and a reference each within budget of the
# correctly rounded result). Such a group is a failure or a capped known divergence: the checks
# list it apart and flag a line that holds it (a regression); --update-lock removes such lines
# and never writes one.
#
# Checks (nightly, diff, report): a passing case's error above its group's locked value is a
# lock violation, which fails the nightly. Errors at or below half the locked value (and, for
# ULP, at least 1 ULP below) are proposed as tighter entries; --update-lock writes those and
# adds the targets the lock lacks (run it on a complete run: a covered target's groups that no
# run has shown are locked at 0), and never loosens an entry unless given --lock-reason TEXT,
# which it stores as the entry's `reason`. Loosening by hand: add or raise a line and give it a
# `reason`. Groups a run did not cover are left as they are.
"""
# Shown in the header when the lock has no line of that kind to quote.
_EXAMPLES = ('"exp/float32/mlx-cpu" = { max_ulp = 1.0, max_rel_err = 1.2e-07 }',
             '"fft/float32/mlx-cpu-compiled" = { max_ulp = 3.0, max_rel_err = 30.4 }')


@dataclass
class Entry:
    max_ulp: float | None = None
    max_rel_err: float | None = None
    reason: str | None = None
    # observed groups only (observe): the group's passing cases over their accuracy budget as the
    # precise oracle counted them; None where no case carries the oracle's field. Never in a lock.
    over_budget: int | None = None

    def get(self, metric: str) -> float | None:
        return getattr(self, metric)


def zero() -> Entry:
    """The locked values of a covered group the file has no line for: bit-exact."""
    return Entry(max_ulp=0.0, max_rel_err=0.0)


# What a run showed per group (observe); a lock's entries have the same form.
Observed = dict[GroupKey, Entry]


def backend_device(target: str) -> str:
    """"mlx-cpu" of "mlx-cpu-lazy" (or of "mlx-gpu-lazy-tf32:off")."""
    return "-".join(target.split("-")[:2])


@dataclass
class Lock:
    """A tolerance lock: the covered targets (whose groups default to :func:`zero`) and the
    groups with other values, one entry per (op, dtype, target)."""

    targets: set[str] = field(default_factory=set)
    entries: dict[GroupKey, Entry] = field(default_factory=dict)

    def get(self, key: GroupKey) -> Entry | None:
        """The group's locked values; None when the lock does not cover the group."""
        e = self.entries.get(key)
        if e is None and key[2] in self.targets:
            return zero()
        return e

    def __getitem__(self, key: GroupKey) -> Entry:
        e = self.get(key)
        if e is None:
            raise KeyError(key_str(key))
        return e

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and self.get(key) is not None  # type: ignore[arg-type]

    def normalized(self) -> Lock:
        """The same lock without entries equal to the default (what the file keeps)."""
        return Lock(set(self.targets), {k: e for k, e in self.entries.items()
                                         if not (k[2] in self.targets and e == zero())})


def default_path() -> Path:
    return data.data_path(LOCK_NAME)


def _expand(path: Path, key: str, targets: set[str]) -> list[GroupKey]:
    """The groups a line's key stands for: one target's, or those of every covered mode of a
    backend-device."""
    op, _, rest = key.partition("/")
    dtype, _, where = rest.partition("/")
    if op and dtype and where.count("-") == 1:
        keys = [(op, dtype, t) for t in sorted(targets) if backend_device(t) == where]
        if not keys:
            raise RlxError(f"{path}: line {key!r}: no target of {where} in targets")
        return keys
    return [parse_key(key)]


def load(path: Path | None = None) -> Lock:
    """The lock at ``path`` (default cases/tolerance_lock.toml); an absent file is an empty lock."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        return Lock()
    try:
        with path.open("rb") as f:
            raw = tomllib.load(f).get("lock", {})
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"{path}: {e}") from None
    if set(raw) - {"targets", "groups"}:
        raise RlxError(f"{path}: [lock] holds targets and [lock.groups] only, not "
                       f"{', '.join(sorted(set(raw) - {'targets', 'groups'}))}")
    targets = raw.get("targets", [])
    if not isinstance(targets, list) or not all(isinstance(t, str) and t.count("-") in (2, 3) for t in targets):
        raise RlxError(f"{path}: targets must be a list of backend-device-mode[-variant]")
    lock = Lock(targets=set(targets))
    # backend-device lines first, so that a one-target line of the same group overrides them
    lines = sorted(raw.get("groups", {}).items(), key=lambda kv: kv[0].rpartition("/")[2].count("-") != 1)
    for k, v in lines:
        if not isinstance(v, dict) or set(v) - {*METRICS, "reason"}:
            raise RlxError(f"{path}: entry {k!r} must be a table of {', '.join(METRICS)} and reason")
        for key in _expand(path, k, lock.targets):
            lock.entries[key] = Entry(**{m: float(v[m]) for m in METRICS if m in v}, reason=v.get("reason"))
    return lock


def observe(cases: list[Record]) -> Observed:
    """The worst errors of each group's passing cases, in lock form, with how many of them the
    oracle found over budget."""
    out: Observed = {}
    for key, d in distributions(cases).items():
        if d.max is not None or d.max_rel is not None:
            out[key] = Entry(max_ulp=d.max, max_rel_err=d.max_rel, over_budget=d.over_budget)
    return out


@cache
def ulp_cap(op: str, dtype: str) -> float | None:
    """The largest max ULP a group within its accuracy budget can show, where the budget is in
    ULP alone: twice the budget (max_ulp is the ordinal distance to the reference, which the
    oracle holds to the same budget, so the two results are within 2 x budget of each other).
    None where the op has no budget for the dtype, or a budget that allows an absolute error or
    a multiple of the registry's error bound (accumulating ops): no ULP count bounds those, and
    only the oracle's per-element verdict (the records' over_budget) can judge them. None for a
    derivative group ("exp:vjp"): a derivative is judged by its error bound, no accuracy budget."""
    if split_subject(op)[1]:
        return None
    try:
        b = budget_for(op, dtype)
    except RlxError:
        return None
    # an accumulating budget: a kind other than "ulp" (or, in older data, a bound multiple)
    if b.atol or getattr(b, "kind", "ulp") != "ulp" or getattr(b, "bound", None) is not None:
        return None
    return 2.0 * b.ulp


def above_budget(key: GroupKey, e: Entry) -> str | None:
    """Why a group (observed, or a lock line) is above its accuracy budget; None when it is not,
    or when nothing says. The oracle's count decides where it ran; else a ULP budget's cap."""
    if e.over_budget is not None:
        if e.over_budget > 0:
            return f"{e.over_budget} passing case(s) over the accuracy budget of {key[0]} on {key[1]}"
        return None
    cap = ulp_cap(key[0], key[1])
    if cap is not None and e.max_ulp is not None and e.max_ulp > cap:
        return f"max_ulp {e.max_ulp:g} > {cap:g}, twice the accuracy budget of {key[0]} on {key[1]}"
    return None


@dataclass
class LockCheck:
    """A run against the lock: violations (grew past it), tighter proposals, unlocked groups; the
    run's groups above their accuracy budget (no lock line can hold them, so they are not
    compared with the lock) and the lock lines above budget (a regression: the line must go)."""

    path: str
    checked: int = 0  # groups both in the run and in the lock
    violations: list[dict[str, Any]] = field(default_factory=list)
    tighter: list[dict[str, Any]] = field(default_factory=list)
    unlocked: list[dict[str, Any]] = field(default_factory=list)
    over_budget: list[dict[str, Any]] = field(default_factory=list)
    lines_over_budget: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return _jsonable({"path": self.path, "checked": self.checked, "violations": self.violations,
                          "tighter": self.tighter, "unlocked": self.unlocked,
                          "over_budget": self.over_budget, "lines_over_budget": self.lines_over_budget})


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


def check(lock: Lock, observed: Observed, path: str | Path = "") -> LockCheck:
    chk = LockCheck(path=str(path))
    judged: set[GroupKey] = set()  # groups whose budget verdict this run gave
    for key, seen in sorted(observed.items()):
        why = above_budget(key, seen)
        if seen.over_budget is not None or why:
            judged.add(key)
        if why:
            chk.over_budget.append({"group": key_str(key), "max_ulp": seen.max_ulp,
                                    "max_rel_err": seen.max_rel_err, "why": why})
            line = lock.entries.get(key)
            if line is not None:
                chk.lines_over_budget.append(_flag(key, line, why))
            continue
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
    # the lines of groups this run did not judge: by their own values against a ULP budget
    for key, line in sorted(lock.entries.items()):
        why = None if key in judged else above_budget(key, replace(line, over_budget=None))
        if why:
            chk.lines_over_budget.append(_flag(key, line, why))
    return chk


def _flag(key: GroupKey, line: Entry, why: str) -> dict[str, Any]:
    return {"group": key_str(key), "max_ulp": line.max_ulp, "max_rel_err": line.max_rel_err,
            "reason": line.reason, "why": why}


def updated(lock: Lock, chk: LockCheck, reason: str | None = None) -> tuple[Lock, int]:
    """The lock with the check's proposals applied: tighter values and unlocked groups always
    (an unlocked group's target joins the covered targets), looser values (violations) only with
    a reason, which the entry then carries; the lines above their accuracy budget removed (the
    check proposes no value for a group above budget: it is no lock line, reason or not).
    Returns the new lock and how many violations were refused for want of a reason."""
    new = Lock(set(lock.targets), {k: Entry(e.max_ulp, e.max_rel_err, e.reason) for k, e in lock.entries.items()})
    for f in chk.lines_over_budget:
        new.entries.pop(parse_key(f["group"]), None)

    def entry(group: str) -> Entry:
        key = parse_key(group)
        if key not in new.entries:
            new.entries[key] = zero() if key[2] in new.targets else Entry()
        return new.entries[key]

    for t in chk.tighter:
        setattr(entry(t["group"]), t["metric"], t["proposed"])
    for u in chk.unlocked:
        e = entry(u["group"])
        for m in METRICS:
            if u.get(m) is not None:
                setattr(e, m, u[m])
    new.targets |= {parse_key(u["group"])[2] for u in chk.unlocked}
    refused = 0
    for v in chk.violations:
        if not reason:
            refused += 1
            continue
        e = entry(v["group"])
        setattr(e, v["metric"], v["observed"])
        e.reason = reason
    return new.normalized(), refused


def _toml_float(x: float) -> str:
    return ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(float(x))


def _line(key: str, e: Entry) -> str:
    parts = [f"{m} = {_toml_float(e.get(m))}" for m in METRICS if e.get(m) is not None]
    if e.reason:
        parts.append(f"reason = {json.dumps(e.reason, ensure_ascii=False)}")
    return f"{json.dumps(key, ensure_ascii=False)} = {{ {', '.join(parts)} }}"


def _lines(lock: Lock) -> list[tuple[str, Entry]]:
    """The file's lines: per (op, dtype, backend-device), one line when every covered mode has
    the same values, else one per target whose values are not the default; none where all are
    the default. Targets the lock does not cover (a lock built by hand) keep their own lines."""
    by_bd: dict[str, list[str]] = {}
    for t in sorted(lock.targets):
        by_bd.setdefault(backend_device(t), []).append(t)
    out: list[tuple[str, Entry]] = []
    seen: set[tuple[str, str, str]] = set()
    for op, dtype, target in sorted(lock.entries):
        if target not in lock.targets:
            out.append((key_str((op, dtype, target)), lock.entries[(op, dtype, target)]))
            continue
        bd = backend_device(target)
        if (op, dtype, bd) in seen:
            continue
        seen.add((op, dtype, bd))
        values = [(t, lock.get((op, dtype, t))) for t in by_bd[bd]]
        if all(e == values[0][1] for _, e in values):
            out.append((f"{op}/{dtype}/{bd}", values[0][1]))
        else:
            out += [(key_str((op, dtype, t)), e) for t, e in values if e != zero()]
    return out


def dumps(lock: Lock) -> str:
    lines = _lines(lock.normalized())
    general = [_line(k, e) for k, e in lines if k.rpartition("/")[2].count("-") == 1]
    one = [_line(k, e) for k, e in lines if k.rpartition("/")[2].count("-") != 1]
    examples = [general[0] if general else _EXAMPLES[0], one[0] if one else _EXAMPLES[1]]
    quoted = "For example, from this file" if general and one else "For example"
    out = [HEADER.format(for_example=quoted, examples="\n".join(f"#   {x}" for x in examples)), "[lock]",
           f"targets = {json.dumps(sorted(lock.targets))}", "", "[lock.groups]"]
    out += [_line(k, e) for k, e in lines]
    return "\n".join(out) + "\n"


def write(lock: Lock, path: Path | None = None) -> Path:
    path = Path(path) if path is not None else default_path()
    atomic_write_text(path, dumps(lock))
    return path
