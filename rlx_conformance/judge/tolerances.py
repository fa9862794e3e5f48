"""Tolerances (cases/tolerances.toml) and known divergences (cases/known_divergences.toml)."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import cache

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.compare import Tolerance

CATEGORIES = ("unimplemented", "undefined-by-spec", "backend-bug", "precision")


@cache
def tolerance_for(op: str, dtype: str) -> Tolerance:
    """The tolerance of (op, output dtype): the first matching override, else the dtype default."""
    table = data.load("tolerances.toml")
    for i, o in enumerate(table.get("override", [])):
        if not o.get("reason"):
            raise RlxError(f"cases/tolerances.toml override #{i + 1} ({o.get('op')}) has no reason")
        if fnmatch.fnmatchcase(op, o["op"]) and o.get("dtype", dtype) == dtype:
            d = table["defaults"].get(dtype, {})
            return Tolerance(max_ulp=float(o.get("max_ulp", d.get("max_ulp", 0))),
                             rtol=float(o.get("rtol", 0)), atol=float(o.get("atol", 0)),
                             source=f"override:{o['op']}" + (f"/{o['dtype']}" if "dtype" in o else ""))
    d = table["defaults"].get(dtype)
    if d is None:
        raise RlxError(f"cases/tolerances.toml has no [defaults.{dtype}]")
    return Tolerance(max_ulp=float(d.get("max_ulp", 0)), rtol=float(d.get("rtol", 0)),
                     atol=float(d.get("atol", 0)), source=f"default:{dtype}")


@dataclass(frozen=True)
class Divergence:
    """A known divergence. It scopes a set of cases; the failures among them report xfail. When
    none of its cases fails any more the entry is stale: its cases report xpass (strict)."""

    index: int  # position in the file, the entry's identity in reports
    op: str
    category: str
    reason: str
    dtype: str | None = None
    backend: str | None = None
    device: str | None = None
    mode: str | None = None
    id: str | None = None
    link: str | None = None
    timeout: float | None = None  # a known hang: kill its cases after this many seconds
    # false for a nondeterministic divergence (a hang or heap corruption that shows only in some
    # runs): its cases never report xpass, since passing once proves nothing.
    strict: bool = True
    # true for a divergence that corrupts the process (heap corruption): its cases run alone in
    # a worker that is replaced afterwards, so that nothing later runs on a damaged heap.
    isolate: bool = False

    def matches(self, case) -> bool:
        t = case.target
        return (fnmatch.fnmatchcase(case.op, self.op)
                and self.dtype in (None, case.dtype) and self.backend in (None, t.backend)
                and self.device in (None, t.device) and self.mode in (None, t.mode)
                and (self.id is None or fnmatch.fnmatchcase(case.id, self.id)))


@cache
def divergences() -> tuple[Divergence, ...]:
    raw = data.load("known_divergences.toml").get("divergence", [])
    out = []
    for i, d in enumerate(raw):
        where = f"cases/known_divergences.toml entry #{i + 1} ({d.get('op', '?')})"
        if d.get("category") not in CATEGORIES:
            raise RlxError(f"{where}: category must be one of {', '.join(CATEGORIES)}")
        if not d.get("reason"):
            raise RlxError(f"{where}: needs a reason")
        try:
            out.append(Divergence(index=i + 1, **d))
        except TypeError as e:
            raise RlxError(f"{where}: {e}") from None
    return tuple(out)


def stale_entries(results) -> tuple[list[int], list[Divergence]]:
    """Entries none of whose matched cases failed (xpass: the divergence is gone), and entries
    that matched no case at all (a warning: the scope is wrong or the cases were removed)."""
    matched: dict[int, bool] = {}
    for r in results:
        if r.divergence is not None:
            i = r.divergence["entry"]
            matched[i] = matched.get(i, False) or r.outcome == "xfail"
    nonstrict = {d.index for d in divergences() if not d.strict}
    stale = [i for i, failed in matched.items() if not failed and i not in nonstrict]
    if stale:  # a run that held only part of an entry's scope (--op, --dtypes) cannot tell
        stale = _fully_covered(stale, results)
    ops = {r.op for r in results}  # only entries about ops this run covered can be "unmatched"
    devices, modes = {r.device for r in results}, {r.mode for r in results}  # (a GPU entry in a CPU run)
    unmatched = [d for d in divergences() if d.index not in matched
                 and any(fnmatch.fnmatchcase(op, d.op) for op in ops)
                 and d.device in (None, *devices) and d.mode in (None, *modes)
                 and not (d.id and "vals:exhaustive" in d.id)]  # the exhaustive sweep's rows (exhaustive.py)
    return stale, unmatched


def _fully_covered(indices: list[int], results) -> list[int]:
    """The entries among ``indices`` whose every case on the run's targets is in ``results``:
    only a run that holds the whole scope can say a divergence is gone. (Entry 56 scopes the
    empty reductions of every reduce_* op; a run of reduce_sum alone must not call it stale.)"""
    from rlx_conformance.generate.matrix import Target, generate
    from rlx_conformance.run.session import with_variants

    ids = {r.id for r in results}
    targets = {Target.parse(i.rsplit("/", 1)[1]) for i in ids}
    # backend variants (tf32:on/off) are not targets of their own: generate on the base targets,
    # expand every variant, keep those the run had
    base = sorted({Target(t.backend, t.device, t.mode) for t in targets}, key=str)
    by_index = {d.index: d for d in divergences()}
    out = []
    for i in indices:
        d = by_index[i]
        scope = [c.id for c in with_variants(generate(base, ops=[d.op]), "both")
                 if c.target in targets and known_divergence(c) is d]
        if all(c in ids for c in scope):
            out.append(i)
    return out


# A precision entry explains wrong values, not a dead or failing process: a crash, timeout,
# error or contract breach under it must find a backend-bug / unimplemented entry or stay bad.
_EXCUSES_ONLY_VALUES = ("precision",)


class _ByOp:
    """The entries whose op glob matches each op name, in file order: the runner asks about every
    case several times (timeout, isolation, outcome), and 100-odd fnmatch calls per question
    cost seconds of the parent's CPU per run. Rebuilt whenever divergences() gives another tuple."""

    def __init__(self) -> None:
        self.divs: tuple[Divergence, ...] | None = None
        self.by_op: dict[str, list[Divergence]] = {}

    def __call__(self, op: str) -> list[Divergence]:
        divs = divergences()
        if divs is not self.divs:
            self.divs, self.by_op = divs, {}
        hit = self.by_op.get(op)
        if hit is None:
            hit = self.by_op[op] = [d for d in divs if fnmatch.fnmatchcase(op, d.op)]
        return hit


_entries_for = _ByOp()


def known_divergence(case, outcome: str | None = None) -> Divergence | None:
    """The first entry that scopes ``case`` (and, given the case's ``outcome``, whose category
    can explain it: a precision entry cannot excuse a crash)."""
    for d in _entries_for(case.op):
        if d.matches(case) and not (outcome not in (None, "fail", "pass")
                                    and d.category in _EXCUSES_ONLY_VALUES):
            return d
    return None
