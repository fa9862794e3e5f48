"""Reading a results.json back for the sinks that work after a run (HTML, diff, lockfile, JUnit,
error statistics). They take the case records as results.json holds them (``CaseResult.to_json``),
not CaseResult objects, so that a file from another machine or a newer harness, with fields this
one does not know (oracle errors, budgets), still reports and keeps those fields."""
from __future__ import annotations

import math
from collections import Counter
from typing import Any

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError

# The reader of results.json lives with its writer (core.results), so that the run layer, which
# merges and resumes reports, need not import the report layer; re-exported here for the sinks.
from rlx_conformance.core.results import Record, Report, results_path  # noqa: F401
from rlx_conformance.core.results import load_report as load  # noqa: F401
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.judge.stability import subject

# (op, dtype, target): the unit of the scoreboard, the error statistics and the tolerance lock;
# target is "backend-device-mode[-variant]" as in case ids, e.g. ("exp", "float32", "mlx-cpu-compiled").
# A derivative case's group names its subject, "op:KIND" ("exp:vjp": judge.stability.subject),
# so that an op's forward and derivative records never share a group, a lock line or a diff row.
GroupKey = tuple[str, str, str]

# Severity, worst first: a scoreboard cell shows the worst outcome among its cases. skip ranks
# below pass so that a cell of passes and skips reads as passing.
SEVERITY = ("crash", "timeout", "not-run", "contract", "error", "fail", "xpass", "xfail", "pass", "skip")


def summarize(cases: list[Record]) -> dict[str, int]:
    """Counts per outcome (every outcome present, plus total), as results.summarize does."""
    c = Counter(r.get("outcome") for r in cases)
    return {o: c.get(o, 0) for o in res.OUTCOMES} | {"total": len(cases)}


def measure(v: Any) -> float | None:
    """A measured error as results.json stores it: a number, "inf"/"-inf", or null (not measured,
    or NaN, which results.json cannot tell apart)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    v = float(v)
    return None if math.isnan(v) else v


def brief(rec: Record | None) -> dict[str, Any]:
    """A record in short, for the lists of diff.json and pair.json: outcome, errors, what judged
    them (the tolerance's source: a tolerances.toml entry, or "derivative:..." for a derivative
    case's bound), first line."""
    if rec is None:
        return {"outcome": None}
    msg = (rec.get("message") or "").splitlines()
    return {"outcome": rec.get("outcome"), "max_ulp": rec.get("max_ulp"),
            "max_rel_err": rec.get("max_rel_err"), "tolerance": (rec.get("tolerance") or {}).get("source"),
            "message": msg[0][:300] if msg else ""}


def target(rec: Record) -> str:
    """The target as case ids spell it (matrix.Target's str), variant included when there is one."""
    base = f"{rec['backend']}-{rec['device']}-{rec['mode']}"
    return f"{base}-{rec['variant']}" if rec.get("variant") else base


def group_key(rec: Record) -> GroupKey:
    return (subject(rec), rec["dtype"], target(rec))


def split_subject(s: str) -> tuple[str, str]:
    """(op, derivative kind) of a group's subject: ("exp", "") or ("exp", "vjp"). A graph case's
    op has a colon of its own: ("graph:swiglu", "") of "graph:swiglu", ("graph:swiglu", "vjp") of
    "graph:swiglu:vjp"."""
    head = GRAPH_PREFIX if s.startswith(GRAPH_PREFIX) else ""
    op, _, grad = s.removeprefix(head).partition(":")
    return head + op, grad


def key_str(key: GroupKey) -> str:
    """"op/dtype/target", the lockfile's and the JSON outputs' spelling of a group."""
    return "/".join(key)


def parse_key(s: str) -> GroupKey:
    op, sep, rest = s.partition("/")
    dtype, sep2, tgt = rest.partition("/")
    if not (sep and sep2 and op and dtype and tgt.count("-") in (2, 3)):
        raise RlxError(f"bad group key {s!r}: expected op/dtype/backend-device-mode[-variant]")
    return (op, dtype, tgt)


def is_bad(outcome: str | None) -> bool:
    return outcome in res.RUN_FAILING


def worst(outcomes) -> str:
    """The most severe of some outcomes (an unknown outcome counts as worst of all)."""
    rank = {o: i for i, o in enumerate(SEVERITY)}
    return min(outcomes, key=lambda o: rank.get(o, -1))
