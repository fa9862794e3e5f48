"""Two devices of one backend as a pair of their own (MLX gpu against MLX cpu, say): case by case,
did they produce the same bits, and where not, which side the CPU reference supports.

Each run judged its cases against the reference; the pair puts the two judgments side by side
by the case's input id and mode (the variant of one side, TF32 on a GPU, pairs with the other
side's plain case). Classes, per pair:

* ``identical``: both produced an output and the output digests agree, bit for bit;
* ``differ``: both passed their tolerance but the bits differ (rounding, reduction order,
  fusion): the size of the difference is bounded by the two errors against the reference;
* ``a_only`` / ``b_only``: only that side failed, crashed or timed out (xfail included: a known
  divergence of one device is still a difference between the devices);
* ``both``: both sides bad (a shared behaviour of the backend, or of the reference);
* ``unpaired``: a case one side did not run or skipped (float64 on a GPU that declares it off).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rlx_conformance.judge.stability import input_id, subject
from rlx_conformance.report.records import Record, Report, brief, measure

SCHEMA = "rlx-conformance/pair/v1"
CLASSES = ("identical", "differ", "a_only", "b_only", "both", "unpaired")
GOOD = ("pass", "xpass")
# Outcomes that make one side of a pair wrong: a run's failures (core.results.RUN_FAILING) with
# the known ones (xfail), without xpass (the values agree; only the known-divergence entry is stale).
PAIR_FAILING = ("fail", "xfail", "error", "crash", "timeout", "contract")


def pair_key(rec: Record) -> tuple[str, str]:
    """(input id, backend-mode): the case id without its target's device and variant."""
    return input_id(rec), f"{rec.get('backend')}-{rec.get('mode')}"


def classify(a: Record | None, b: Record | None) -> str:
    if a is None or b is None or a.get("outcome") == "skip" or b.get("outcome") == "skip":
        return "unpaired"
    bad_a, bad_b = a.get("outcome") in PAIR_FAILING, b.get("outcome") in PAIR_FAILING
    if bad_a and bad_b:
        return "both"
    if bad_a or bad_b:
        return "a_only" if bad_a else "b_only"
    da, db = a.get("output_digest"), b.get("output_digest")
    return "identical" if da is not None and da == db else "differ"


@dataclass
class Group:
    """One (op, dtype, mode) of the pair; a derivative's op is its subject ("exp:vjp"), so an
    op's forward and derivative cases are counted apart."""

    op: str
    dtype: str
    mode: str
    counts: Counter = field(default_factory=Counter)
    max_ulp_a: float | None = None
    max_ulp_b: float | None = None
    examples: dict[str, str] = field(default_factory=dict)  # class -> first case id (side a)

    def add(self, cls: str, a: Record | None, b: Record | None) -> None:
        self.counts[cls] += 1
        if cls != "unpaired":
            self.max_ulp_a = _max(self.max_ulp_a, measure(a.get("max_ulp")))
            self.max_ulp_b = _max(self.max_ulp_b, measure(b.get("max_ulp")))
        if cls not in ("identical", "unpaired"):
            self.examples.setdefault(cls, (a or b)["id"])

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "dtype": self.dtype, "mode": self.mode,
                "counts": {c: self.counts[c] for c in CLASSES if self.counts[c]},
                "max_ulp_a": self.max_ulp_a, "max_ulp_b": self.max_ulp_b, "examples": self.examples}


def _max(x: float | None, y: float | None) -> float | None:
    return y if x is None else x if y is None else max(x, y)


@dataclass
class Pairing:
    a: str  # a label per side: "mlx-gpu", "mlx-cpu"
    b: str
    groups: list[Group]
    records: list[dict[str, Any]]  # one per pair that is not identical or unpaired

    def totals(self) -> dict[str, int]:
        t: Counter = Counter()
        for g in self.groups:
            t.update(g.counts)
        return {c: t[c] for c in CLASSES}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "a": self.a, "b": self.b, "totals": self.totals(),
                "groups": [g.to_json() for g in self.groups], "cases": self.records}


def _side(report: Report) -> str:
    devs = sorted({(c.get("backend"), c.get("device")) for c in report.cases})
    return ", ".join(f"{b}-{d}" for b, d in devs) or "(empty)"


def pair(a: Report, b: Report) -> Pairing:
    """Pair the cases of two runs of one backend on two devices (or two machines)."""
    b_by_key: dict[tuple[str, str], Record] = {}
    for rec in b.cases:
        b_by_key.setdefault(pair_key(rec), rec)
    groups: dict[tuple[str, str, str], Group] = {}
    records: list[dict[str, Any]] = []
    seen_b: set[tuple[str, str]] = set()

    def group(rec: Record) -> Group:
        k = (subject(rec), rec["dtype"], rec.get("mode", ""))
        return groups.setdefault(k, Group(*k))

    for ra in a.cases:
        k = pair_key(ra)
        rb = b_by_key.get(k)
        seen_b.add(k)
        cls = classify(ra, rb)
        group(ra).add(cls, ra, rb)
        if cls not in ("identical", "unpaired"):
            records.append({"class": cls, "a": _case(ra), "b": _case(rb)})
    for k, rb in b_by_key.items():
        if k not in seen_b:
            group(rb).add("unpaired", None, rb)
    order = sorted(groups.values(), key=lambda g: (-(g.counts["a_only"] + g.counts["b_only"]),
                                                   -g.counts["both"], -g.counts["differ"], g.op, g.dtype, g.mode))
    return Pairing(_side(a), _side(b), order, records)


def _case(rec: Record) -> dict[str, Any]:
    return {"id": rec["id"], "digest": rec.get("output_digest"), **brief(rec)}
