"""Whether a run held the whole scope of a known divergence: the half of the stale-entry check
that needs case generation (judge/divergences.py decides the rest, and asks this).

A part of an entry none of whose cases failed is stale only if the run held every one of its
cases on the run's targets: a run of --ops reduce_sum, or of --dtypes float32, holds only part
of the entry for the empty reductions of every reduce_* op, and cannot say that it is gone.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase

from rlx_conformance.backends import get_backend
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, Target, generate
from rlx_conformance.judge import divergences as kd
from rlx_conformance.judge.divergences import Unit


def _every_variant(cases: Iterable[Case]) -> Iterable[Case]:
    """Each case in every backend variant it runs in (tf32:on and off): session.with_variants
    with "both", which this module cannot import (the session imports the runner, which imports
    this through run/outcomes.py)."""
    for c in cases:
        for v in get_backend(c.target.backend).variants(c.op, c.dtype, c.target.device, "both"):
            yield c if v == c.target.variant else replace(c, target=replace(c.target, variant=v))


def _run_targets(results: Sequence[CaseResult]) -> tuple[set[Target], list[Target]]:
    """The run's targets (with variants) and their base targets (backend variants such as
    tf32:on/off are not targets of their own: generate on the base targets, expand every variant,
    keep those the run had)."""
    targets = {Target.parse(r.id.rsplit("/", 1)[1]) for r in results}
    return targets, sorted({Target(t.backend, t.device, t.mode) for t in targets}, key=str)


def unmatched_news(parts: list[tuple[kd.Divergence, kd.Part]], results: Sequence[CaseResult]
                   ) -> list[tuple[kd.Divergence, kd.Part]]:
    """The entry parts among ``parts`` (none of the run's records matched them) worth a warning:
    a part that scopes no case of the whole matrix, on any target of the run's backends (a typo,
    or cases since removed), and a part that is the first entry of cases the run could have held
    (its targets, ops and dtypes). Silent about a part only other targets or dtypes hold (a
    CPU-only item of an entry in a GPU run, a float64 item in a --dtypes float32 run) or that an
    earlier entry shadows on this run's targets."""
    if not parts:
        return []
    targets, base = _run_targets(results)
    every = [Target(b, d, m) for b in sorted({t.backend for t in base})
             for d in get_backend(b).all_devices() for m in get_backend(b).modes]
    dtypes = {r.dtype for r in results}
    run_ops = {r.op for r in results}
    out = []
    for d, p in parts:
        ops = [o for o in run_ops if any(fnmatchcase(o, g) for g in d.part_ops(p))]
        held = [c for c in _every_variant(generate(every, ops=ops))
                if d.matches(c) and d.part(c.op, c.dtype, c.id) == p]
        # a case the run could hold that the part would have been recorded under (a record
        # carries the first entry scoping it)
        if not held or any(c.target in targets and c.dtype in dtypes and kd.known_divergence(c) is d
                           for c in held):
            out.append((d, p))
    return out


def fully_covered(units: list[Unit], results: Sequence[CaseResult]) -> list[Unit]:
    """The units (entry, part, op, device, mode) among ``units`` whose every case on the run's
    targets of that device and mode is in ``results``: only a run that holds the whole scope can
    say a divergence is gone."""
    ids = {r.id for r in results}
    targets, base = _run_targets(results)
    out = []
    for u in units:
        d, p, op, device, mode = u
        here = [t for t in base if (t.device, t.mode) == (device, mode)]
        scope = [c.id for c in _every_variant(generate(here, ops=[op]))
                 if c.target in targets and kd.known_divergence(c) is d and d.part(c.op, c.dtype, c.id) == p]
        if all(c in ids for c in scope):
            out.append(u)
    return out
