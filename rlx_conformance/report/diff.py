"""The difference between two runs (a baseline and a new run), case by case and per error
distribution, and whether it is a regression that should fail CI.

Regression (exit 1): a new failure (a case bad in NEW that passed, xfailed or skipped in BASE, or
a bad case BASE did not have); a newly excused case (pass in BASE, xfail in NEW: a known
divergence now hides a failure the baseline did not have, which gates like any failure, or the
excuse would be a way around the gate); a new case excused by an entry no BASE record names (a
new case under an entry BASE already used is the known divergence covering more cases: listed
only); error drift (a case passing in both, or xfail in both, whose max ULP or max relative error
grew past the thresholds); distribution drift (a group whose p99 or max ULP, or count over budget,
grew over the cases both runs share: passing and excused cases apart); and tolerance-lock
violations or lock lines above their accuracy budget. Fixed cases (bad in BASE and not in NEW,
or xfail in BASE and passing in NEW), added or removed cases and other outcome changes are
reported but do not fail.

Layout and graph cases (issue 17) are cases like any other: a regression of one is listed with
its id, and its entry names its memory layout (``layout``) or its graph (``graph``), as counts()
counts them (``layout_regressions``, ``graph_regressions``); a group's distribution drift names the
case with its largest error, whose layout says whether views drove it.

A subset (NEW run with --ops, --dtypes, --device, --mode, --case, --shard or --sample, as its
``run.selection`` records, or as its records show where it has none) is compared over the cases
of its selection only: the baseline's other cases are counted as not run in this subset, never
listed as removed, and a case is "removed" only when the selection holds it and NEW lacks it.
A shard or a sample holds part of every op, so there "removed" cannot be told from "not drawn":
its absent cases are counted with the rest."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.report.records import (
    Record,
    Report,
    brief,
    group_key,
    is_bad,
    key_str,
    measure,
    split_subject,
    target,
)
from rlx_conformance.report.stats import Dist, Errors, distributions

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


@dataclass(frozen=True)
class Selection:
    """The part of the matrix a run holds: op and dtype globs, targets (None: all of them), and
    whether it is a shard, a sample or a list of case ids. ``grads``: the derivative kinds it ran
    besides the forward (None: every kind; (): the forward alone, as a run recorded before
    derivative cases existed). ``recorded``: read from ``run.selection`` (else inferred from the
    run's records, for a run that has none)."""

    ops: tuple[str, ...] | None = None
    dtypes: tuple[str, ...] | None = None
    grads: tuple[str, ...] | None = None
    targets: tuple[str, ...] | None = None
    cases: tuple[str, ...] | None = None
    shard: str | None = None
    sample: int = 1
    recorded: bool = True
    forward: bool = True  # false: the derivatives alone (run --no-forward)
    # --layouts: "none" holds no layout case (None: not recorded, any); contiguous: False for
    # --no-contiguous, the layout cases alone
    layouts: str | None = None
    contiguous: bool = True
    # --graphs as recorded (all, none or globs; None: not recorded): which graph cases it holds;
    # unrecorded, graph cases are held where the op globs are (none given: every graph)
    graphs: str | None = None
    # --sample-grad K (recorded only for K > 1): the run holds 1 in K of the derivative and layout
    # input sets; the baseline's others are outside it, not removed
    sample_grad: int = 1
    # --skip-shapes (recorded only when given): the shape families the run left out; the
    # baseline's cases of them are outside it, not removed
    skipped_shapes: tuple[str, ...] = ()

    @classmethod
    def of(cls, report: Report) -> Selection:
        """The selection of a run: its recorded ``run.selection``, else what its records hold."""
        sel = report.run.get("selection")
        targets = report.run.get("targets") or sorted({target(r) for r in report.cases})
        if isinstance(sel, dict):
            return cls(ops=_tuple(sel.get("ops")), dtypes=_tuple(sel.get("dtypes")),
                       grads=tuple(sel.get("grad") or ()), targets=tuple(targets),
                       cases=_tuple(sel.get("case")), shard=sel.get("shard"), sample=int(sel.get("sample") or 1),
                       forward=sel.get("forward", True) is not False, layouts=sel.get("layouts"),
                       contiguous=sel.get("contiguous", True) is not False, graphs=sel.get("graphs"),
                       sample_grad=int(sel.get("sample_grad") or 1),
                       skipped_shapes=tuple(sel.get("skip_shapes") or ()))
        return cls(ops=tuple(sorted({r["op"] for r in report.cases})),
                   dtypes=tuple(sorted({r["dtype"] for r in report.cases})),
                   grads=tuple(sorted({r.get("grad") for r in report.cases} - {None, ""})), targets=tuple(targets),
                   shard=report.run.get("shard"), recorded=False)

    @property
    def partial(self) -> bool:
        """A shard or a sample: it holds some cases of every op, dtype and target it names."""
        return self.shard is not None or self.sample > 1

    def holds(self, rec: Record) -> bool:
        """Whether ``rec``'s case is inside the selection's ops (graphs), dtypes, derivative kinds,
        layouts, targets and ids."""
        graph = str(rec.get("op") or "").startswith(GRAPH_PREFIX)
        if graph and self.graphs is not None:
            name = rec["op"].removeprefix(GRAPH_PREFIX)
            pats = [p.strip().removeprefix(GRAPH_PREFIX) for p in self.graphs.split(",") if p.strip()]
            in_graphs = self.graphs == "all" or (self.graphs != "none"
                                                 and any(fnmatchcase(name, p) for p in pats))
        else:
            in_graphs = self.ops is None or any(fnmatchcase(rec["op"], g) for g in self.ops)
        return ((self.cases is None or rec["id"] in self.cases)
                and (self.grads is None or not rec.get("grad") or rec["grad"] in self.grads)
                and (self.forward or bool(rec.get("grad")))
                and (not rec.get("layout") or self.layouts != "none")
                and (self.sample_grad <= 1 or not (rec.get("grad") or rec.get("layout")))
                and not any(fnmatchcase(str(rec.get("family") or ""), g) for g in self.skipped_shapes)
                and (self.contiguous or bool(rec.get("layout")) or graph)
                and in_graphs
                and (self.dtypes is None or any(fnmatchcase(rec["dtype"], g) for g in self.dtypes))
                and (self.targets is None or target(rec) in self.targets))

    def to_json(self) -> dict[str, Any]:
        return {"ops": _list(self.ops), "dtypes": _list(self.dtypes), "grad": _list(self.grads),
                "forward": self.forward,
                "targets": _list(self.targets),
                "case": _list(self.cases), "shard": self.shard, "sample": self.sample, "recorded": self.recorded,
                "layouts": self.layouts, "contiguous": self.contiguous, "graphs": self.graphs,
                "sample_grad": self.sample_grad, "skip_shapes": list(self.skipped_shapes)}

    def describe(self) -> str:
        """One line: what the subset was, e.g. "ops exp, log; dtypes float16; targets mlx-cpu-lazy"."""
        parts = [f"{name} {', '.join(v)}" for name, v in (("ops", self.ops), ("dtypes", self.dtypes),
                                                         ("targets", self.targets)) if v]
        if self.grads:  # some derivative kinds (a forward-only run's subset shows in its count)
            parts.append(f"derivatives {', '.join(self.grads)}" + ("" if self.forward else " only"))
        if self.layouts == "none":
            parts.append("no layout cases")
        if not self.contiguous:
            parts.append("layout cases only")
        if self.graphs is not None and self.graphs != "all":
            parts.append("no graphs" if self.graphs == "none" else f"graphs {self.graphs}")
        if self.skipped_shapes:
            parts.append(f"no shape families {', '.join(self.skipped_shapes)}")
        if self.cases:
            parts.append(f"{len(self.cases)} case id(s)")
        if self.shard:
            parts.append(f"shard {self.shard}")
        if self.sample > 1:
            parts.append(f"sample every {self.sample}")
        return "; ".join(parts) + ("" if self.recorded else " (inferred from its records)")


def _tuple(v: Any) -> tuple[str, ...] | None:
    return tuple(v) if v else None


def _list(v: tuple[str, ...] | None) -> list[str] | None:
    return list(v) if v is not None else None


@dataclass
class Diff:
    base: str | None  # results.json paths; base None = no baseline (every case is added)
    new: str
    thresholds: Thresholds
    new_failures: list[dict[str, Any]] = field(default_factory=list)
    # pass in BASE, xfail in NEW ("newly excused"): a regression
    newly_excused: list[dict[str, Any]] = field(default_factory=list)
    # xfail in NEW, absent or skipped in BASE ("new, excused"): a regression where new_entry
    new_excused: list[dict[str, Any]] = field(default_factory=list)
    fixed: list[dict[str, Any]] = field(default_factory=list)
    outcome_changes: list[dict[str, Any]] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # inside NEW's selection, absent from NEW
    # NEW's selection when it is a subset of BASE's cases (None: NEW holds the baseline's whole
    # scope), and how many BASE cases lie outside it (or, for a shard or sample, were not drawn)
    subset: Selection | None = None
    not_in_subset: int = 0
    still_bad: int = 0
    error_drift: list[dict[str, Any]] = field(default_factory=list)  # passing in both runs
    excused_drift: list[dict[str, Any]] = field(default_factory=list)  # xfail in both runs
    distribution_drift: list[dict[str, Any]] = field(default_factory=list)  # passing cases
    excused_distribution_drift: list[dict[str, Any]] = field(default_factory=list)  # xfail in both
    lock: Any = None  # lockfile.LockCheck, set by the front that checked the lock

    @property
    def lock_violations(self) -> int:
        return len(self.lock.violations) if self.lock is not None else 0

    @property
    def lock_over_budget(self) -> int:
        """Lock lines above their group's accuracy budget (a lock line cannot hold such a group)."""
        return len(self.lock.lines_over_budget) if self.lock is not None else 0

    @property
    def new_excused_by_new_entry(self) -> list[dict[str, Any]]:
        return [x for x in self.new_excused if x["new_entry"]]

    @property
    def regression(self) -> bool:
        return bool(self.new_failures or self.newly_excused or self.new_excused_by_new_entry
                    or self.error_drift or self.excused_drift or self.distribution_drift
                    or self.excused_distribution_drift or self.lock_violations or self.lock_over_budget)

    def case_regressions(self) -> list[dict[str, Any]]:
        """The case-level entries that make the diff a regression."""
        return [*self.new_failures, *self.newly_excused, *self.new_excused_by_new_entry, *self.error_drift,
                *self.excused_drift]

    def counts(self) -> dict[str, int]:
        regressions = self.case_regressions()
        return {"new_failures": len(self.new_failures), "newly_excused": len(self.newly_excused),
                "new_excused": len(self.new_excused),
                "new_excused_new_entry": len(self.new_excused_by_new_entry), "fixed": len(self.fixed),
                "outcome_changes": len(self.outcome_changes), "added": len(self.added),
                "removed": len(self.removed), "not_in_subset": self.not_in_subset, "still_bad": self.still_bad,
                "error_drift": len(self.error_drift), "excused_drift": len(self.excused_drift),
                "distribution_drift": len(self.distribution_drift),
                "excused_distribution_drift": len(self.excused_distribution_drift),
                "lock_violations": self.lock_violations, "lock_over_budget": self.lock_over_budget,
                "lock_tighter": len(self.lock.tighter) if self.lock is not None else 0,
                "lock_unlocked": len(self.lock.unlocked) if self.lock is not None else 0,
                # of the case-level regressions above (a case with two drifting metrics: twice)
                "layout_regressions": sum(1 for x in regressions if x.get("layout")),
                "graph_regressions": sum(1 for x in regressions if x.get("graph"))}

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "base": self.base, "new": self.new, "thresholds": asdict(self.thresholds),
                "regression": self.regression, "counts": self.counts(),
                "subset": None if self.subset is None else self.subset.to_json(),
                "new_failures": self.new_failures, "newly_excused": self.newly_excused,
                "new_excused": self.new_excused, "fixed": self.fixed,
                "outcome_changes": self.outcome_changes, "error_drift": self.error_drift,
                "excused_drift": self.excused_drift, "distribution_drift": self.distribution_drift,
                "excused_distribution_drift": self.excused_distribution_drift, "added": self.added,
                "removed": self.removed, "lock": None if self.lock is None else self.lock.to_json()}


def case_kind(rec: Record) -> dict[str, str]:
    """What a case is besides an op's contiguous forward case, for a diff entry: its memory
    layout (``{"layout": "transposed"}``) or its graph (``{"graph": "swiglu"}``); {} for neither."""
    out = {}
    if rec.get("layout"):
        out["layout"] = rec["layout"]
    if str(rec.get("op") or "").startswith(GRAPH_PREFIX):
        out["graph"] = rec["op"].removeprefix(GRAPH_PREFIX)
    return out


def _entry(rec: Record) -> str | None:
    """The known divergence a record names (xfail, or a pass inside an entry's scope)."""
    div = rec.get("divergence")
    return div.get("entry") if isinstance(div, dict) else None


def _excused(cid: str, old: Record | None, cur: Record, base_entries: set[str]) -> dict[str, Any]:
    entry = _entry(cur)
    div = cur.get("divergence") or {}
    return {"id": cid, **case_kind(cur), "base": brief(old), "new": brief(cur), "entry": entry,
            "category": div.get("category"), "was": div.get("was"),
            "new_entry": entry is not None and entry not in base_entries}


def compare(base: Report | None, new: Report, thresholds: Thresholds = Thresholds()) -> Diff:
    b = base.by_id() if base is not None else {}
    n = new.by_id()
    d = Diff(base=str(base.path) if base is not None else None, new=str(new.path), thresholds=thresholds)
    # the entries BASE used (on any record: a pass inside an entry's scope names it too)
    base_entries = {e for e in map(_entry, b.values()) if e is not None}
    d.added = sorted(set(n) - set(b))
    absent = sorted(set(b) - set(n))
    sel = Selection.of(new)
    outside = [i for i in absent if sel.partial or not sel.holds(b[i])]
    if outside:  # a subset: the baseline's cases outside it are counted, not listed
        d.subset, d.not_in_subset = sel, len(outside)
        d.removed = [i for i in absent if not sel.partial and sel.holds(b[i])]
    else:
        d.removed = absent
    for cid in d.added:
        if is_bad(n[cid].get("outcome")):
            d.new_failures.append({"id": cid, **case_kind(n[cid]), "base": None, "new": brief(n[cid])})
        elif n[cid].get("outcome") == "xfail":
            d.new_excused.append(_excused(cid, None, n[cid], base_entries))
    common = sorted(set(b) & set(n))
    for cid in common:
        old, cur = b[cid], n[cid]
        o, c = old.get("outcome"), cur.get("outcome")
        if is_bad(c) and not is_bad(o):
            d.new_failures.append({"id": cid, **case_kind(cur), "base": brief(old), "new": brief(cur)})
        elif (is_bad(o) and not is_bad(c)) or (o == "xfail" and c == "pass"):
            d.fixed.append({"id": cid, **case_kind(cur), "base": brief(old), "new": brief(cur)})
        elif c == "xfail" and o == "pass":
            d.newly_excused.append(_excused(cid, old, cur, base_entries))
        elif c == "xfail" and o == "skip":  # it did not run in BASE: as a case BASE lacks
            d.new_excused.append(_excused(cid, old, cur, base_entries))
        elif o != c:
            d.outcome_changes.append({"id": cid, **case_kind(cur), "base": o, "new": c})
        if is_bad(o) and is_bad(c):
            d.still_bad += 1
        if o == c == "pass":
            d.error_drift.extend(_case_drift(cid, old, cur, thresholds))
        elif o == c == "xfail":
            d.excused_drift.extend(_case_drift(cid, old, cur, thresholds))
    d.new_failures.sort(key=lambda x: x["id"])
    d.distribution_drift = _distribution_drift([b[i] for i in common], [n[i] for i in common], thresholds)
    # excused errors over the cases excused in both runs: a case that became excused is already
    # listed as such, and its error would read as drift of the group besides
    both = [i for i in common if b[i].get("outcome") == n[i].get("outcome") == "xfail"]
    d.excused_distribution_drift = _distribution_drift([b[i] for i in both], [n[i] for i in both], thresholds,
                                                       excused=True)
    return d


def _case_drift(cid: str, old: Record, cur: Record, t: Thresholds) -> list[dict[str, Any]]:
    out = []
    ou, nu = measure(old.get("max_ulp")), measure(cur.get("max_ulp"))
    kind = case_kind(cur)
    if t.grew_ulp(ou, nu):
        out.append({"id": cid, **kind, "metric": "max_ulp", "base": old.get("max_ulp"), "new": cur.get("max_ulp")})
    orl, nrl = measure(old.get("max_rel_err")), measure(cur.get("max_rel_err"))
    if t.grew_rel(orl, nrl, cur.get("dtype", "float64")):
        out.append({"id": cid, **kind, "metric": "max_rel_err", "base": old.get("max_rel_err"),
                    "new": cur.get("max_rel_err")})
    if out and cur.get("outcome") == "xfail":
        for x in out:
            x["entry"] = _entry(cur)
    return out


def _distribution_drift(base: list[Record], new: list[Record], t: Thresholds,
                        excused: bool = False) -> list[dict[str, Any]]:
    """Groups whose p99 or max ULP (or over-budget count) got worse, among their passing cases or
    (``excused``) their xfail cases. Computed over the cases both runs hold, so a subset run, a
    shard or newly added cases do not read as drift. An op's derivative groups ("exp:vjp") are
    their own (``grad`` in the row), never pooled with its forward's."""
    bd, nd = distributions(base), distributions(new)
    out = []
    keys: list[tuple[str, str, str]] = []  # the drifting groups', in out's order
    for key in sorted(set(bd) & set(nd)):
        be, ne = (bd[key].excused, nd[key].excused) if excused else (bd[key], nd[key])
        metrics = _worse(be, ne, t)
        if metrics:
            op, grad = split_subject(key[0])
            keys.append(key)
            out.append({"group": key_str(key), "op": op, "grad": grad, "dtype": key[1], "target": key[2],
                        "metrics": metrics, "all_pass": nd[key].bad == 0,
                        "base": be.to_json(), "new": ne.to_json(),
                        "worst": None})
    if out:  # the case that drove each drifting group
        by_group: dict[tuple[str, str, str], list[Record]] = {}
        for r in new:
            by_group.setdefault(group_key(r), []).append(r)
        for key, x in zip(keys, out):
            x["worst"] = _worst_case(by_group.get(key, []), "xfail" if excused else "pass")
    return out


def _worst_case(cases: list[Record], outcome: str) -> dict[str, Any] | None:
    """The case with the largest max ULP among ``outcome``'s of one group's, with its layout or
    graph (:func:`case_kind`): which case drove a group's drift (a group pools an op's contiguous
    and layout cases)."""
    recs = [(u, r) for r in cases if r.get("outcome") == outcome
            for u in [measure(r.get("max_ulp"))] if u is not None]
    if not recs:
        return None
    u, r = max(recs, key=lambda x: (x[0], x[1]["id"]))
    return {"id": r["id"], **case_kind(r), "max_ulp": r.get("max_ulp")}


def _worse(b: Dist | Errors, n: Dist | Errors, t: Thresholds) -> list[str]:
    worse = [m for m in ("p99", "max") if t.grew_ulp(getattr(b, m), getattr(n, m))]
    if b.over_budget is not None and n.over_budget is not None and n.over_budget > b.over_budget:
        worse.append("over_budget")
    return worse
