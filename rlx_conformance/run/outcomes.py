"""Known divergences (cases/known_divergences.toml) applied to a run's records: where a failure
is expected (xfail), where an entry has gone stale (xpass), and the records of an earlier run
judged again under the entries as they are now.

Its own module, below the runner, the bundles and the merge, which all apply them: each judges a
record the same way, whichever process or command made it.
"""
from __future__ import annotations

from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case
from rlx_conformance.judge.divergences import (
    known_divergence,
    part_of,
    scoping,
    stale_entries,
    unexcused,
)
from rlx_conformance.run.staleness import fully_covered, record_case, unmatched_news


def apply_divergence(case: Case, r: CaseResult) -> CaseResult:
    """A failure inside a known divergence's scope reports xfail, if the entry excuses its kind
    (and its measured error is within the entry's caps); a failure it does not excuse stays a
    failure, its message naming the entry and why. A pass inside a scope stays a pass but carries
    the entry, so that :func:`finalize` can tell when an entry has gone stale."""
    if r.outcome in ("skip", "not-run") or r.oracle_verdict == "reference-bug":
        # a reference bug (accuracy.py) is the harness's, never a backend's known divergence; a
        # case not run (runner.py: its kernel was stopped) measured nothing an entry could excuse
        return r
    bad = r.outcome in ("fail", "error", "contract", "crash", "timeout")
    d = known_divergence(case, r if bad else None)
    if d is None:
        if bad and (why := unexcused(case, r)):
            first = scoping(case)[0]
            # the entry still reproduces (not stale), but excuses nothing here
            r.divergence = {"entry": first.key, "category": first.category, "reason": first.reason,
                            "link": first.link, "excused": False}
            r.message = f"{r.message} [{why}]"
        return r
    r.divergence = {"entry": d.key, "category": d.category, "reason": d.reason, "link": d.link}
    if bad:
        r.message = f"known divergence {d.key} ({d.category}: {d.reason}) — was {r.outcome}: {r.message}"
        r.divergence["was"] = r.outcome  # validate re-checks these against the built-in kernel
        r.outcome = "xfail"
    return r


def rejudge(r: CaseResult) -> CaseResult:
    """A record of an earlier run judged again under cases/known_divergences.toml as it is now:
    back to the outcome its run measured (an xfail to what it was, an xpass to pass), then
    :func:`apply_divergence`; :func:`finalize` over the set marks stale entries again. For data
    edited after a run that is dear to repeat (a GPU machine's): the measurements stay."""
    if r.divergence is not None:
        was = r.divergence.get("was")
        if r.outcome == "xfail" and was:
            r.outcome = was
            r.message = r.message.split(f" — was {was}: ", 1)[-1]
        elif r.outcome == "xpass":
            r.outcome, r.message = "pass", ""
        elif r.divergence.get("excused") is False:
            r.message = r.message.rsplit(" [outside known divergence ", 1)[0]
        r.divergence = None
    return apply_divergence(record_case(r), r)


def finalize(results: list[CaseResult]) -> list[str]:
    """Strict known divergences: the passes of an entry none of whose cases failed become xpass,
    judged per op and per target within the entry (and per item of its dtype or id list), so that
    a fix on one device, in one mode or of one op of a glob shows. Returns warnings (entries, or
    items of their lists, that matched no case)."""
    stale, unmatched = stale_entries(results, fully_covered)
    for r in results:
        hit = part_of(r) if stale and r.outcome == "pass" else None
        if hit is None or (hit[0].key, hit[1], r.op, r.device, r.mode) not in stale:
            continue
        d, part = hit
        where = f"{r.op} {r.dtype if d.dtype and len(d.dtype) > 1 else ''} cases on {r.device}/{r.mode}".replace("  ", " ")
        r.outcome = "xpass"
        r.message = (f"known divergence {d.key} ({r.divergence['category']}) no longer reproduces in any "
                     f"of its {where}" + (f" ({d.describe(part)})" if part else "") +
                     ": narrow its scope (op, dtype, device, mode, id) to what still fails in "
                     f"cases/known_divergences.toml, or remove it ({r.divergence['reason']})")
    return [f"known divergence {d.key} ({d.describe(part)}) matched no case"
            for d, part in unmatched_news(unmatched, results)]
