"""Whether a run held the whole scope of a known divergence: the half of the stale-entry check
that needs case generation (judge/divergences.py decides the rest, and asks this).

A part of an entry none of whose cases failed is stale only if the run held every one of its
cases on the run's targets: a run of --ops reduce_sum, or of --dtypes float32, holds only part
of the entry for the empty reductions of every reduce_* op, and cannot say that it is gone. The
derivative kinds are a dimension like the dtypes: an entry scoped to ``grad = "vjp"`` is held
only by a run of the vjp cases (``--grad``), and a run of the forward alone (``--grad none``)
neither calls it stale nor warns that it matched no case.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from fnmatch import fnmatchcase
from types import SimpleNamespace

from rlx_conformance.backends import get_backend
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import generate_graphs, is_graph
from rlx_conformance.generate.matrix import GRAD_KINDS, Case, Target, generate
from rlx_conformance.judge import divergences as kd
from rlx_conformance.judge.divergences import Unit


def _every_variant(cases: Iterable[Case]) -> Iterable[Case]:
    """Each case in every backend variant it runs in (tf32:on and off): session.with_variants
    with "both", which this module cannot import (the session imports the runner, which imports
    this through run/outcomes.py)."""
    for c in cases:
        for v in get_backend(c.target.backend).variants(c.op, c.dtype, c.target.device, "both"):
            yield c if v == c.target.variant else replace(c, target=replace(c.target, variant=v))


# What the staleness checks generate: every case of an op, its derivative cases included (each
# entry's own scope, its ``grad`` among them, then says which of them it holds).
_EVERY_GRAD = ("", *GRAD_KINDS)


def _declared(t: Target, op: str, dtype: str) -> bool:
    """generate's ``supports`` filter, as session.supports (which this module cannot import, see
    _every_variant): derivative cases exist only for the dtypes the backend declares, so a scope
    generated without it would hold cases no run has, and no entry would ever be stale."""
    return get_backend(t.backend).supports(op, dtype, t.device)


def _layouts(d: kd.Divergence) -> str:
    """The layout cases (layouts.LAYOUT_SETTINGS) an entry's scope is judged over: none for an
    entry that holds contiguous cases (layout "*", the default: its contiguous cases decide, and
    layout cases are extra evidence), all for one scoped to layouts alone, which only a run of
    every layout case of its ops (--layouts all) can call stale."""
    return "none" if fnmatchcase("", d.layout) else "all"


def _scope(targets: Sequence[Target], ops: Sequence[str], layouts: str = "none",
           dtypes: Sequence[str] | None = None) -> list[Case]:
    """Every case of ``ops`` on ``targets`` (of ``dtypes``, all when None): the matrix's (in
    ``layouts`` too), and the graph cases' (op ``graph:NAME``, generate/graphs.py) for graph
    names."""
    graph_ops = [o for o in ops if is_graph(o)]
    rest = [o for o in ops if not is_graph(o)]
    cases = generate(targets, ops=rest, dtypes=dtypes, supports=_declared, grads=_EVERY_GRAD,
                     layouts=layouts) if rest or not ops else []
    graph_cases = generate_graphs(targets, graph_ops, supports=_declared, grads=_EVERY_GRAD) if graph_ops else []
    return cases + [c for c in graph_cases if dtypes is None or c.dtype in dtypes]


class _Scopes:
    """:func:`_scope` in every backend variant, per (op, layouts, target) and each generated once:
    the checks ask about a hundred-odd entry parts, most of them sharing ops (every reduce_* entry
    holds the same cases), and generating a part's ops on every target anew took 8.6 s of a
    32,000-case run's end."""

    def __init__(self) -> None:
        self._memo: dict[tuple[str, str, Target, tuple[str, ...] | None], list[Case]] = {}

    def cases(self, ops: Iterable[str], layouts: str, targets: Iterable[Target],
              dtypes: Sequence[str] | None = None) -> Iterable[Case]:
        """``dtypes``: only those (an entry's dtype list: no case of another dtype can match it,
        and generating one dtype of an op costs a fraction of all of them)."""
        key_dtypes = tuple(dtypes) if dtypes is not None else None
        for t in targets:
            for op in ops:
                key = (op, layouts, t, key_dtypes)
                if key not in self._memo:
                    self._memo[key] = list(_every_variant(_scope([t], [op], layouts, dtypes)))
                yield from self._memo[key]


def record_case(r: CaseResult) -> SimpleNamespace:
    """A record as the case the known-divergence scoping asks about (kd.CaseLike): its op, dtype,
    id, target with its variant, derivative kind and layout."""
    return SimpleNamespace(op=r.op, dtype=r.dtype, id=r.id, target=Target(r.backend, r.device, r.mode, r.variant),
                           grad=r.grad, layout=getattr(r, "layout", ""))


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
    or cases since removed), and a part that is the first entry of cases the run held (a whole
    run's records are its selection) but no record names. Silent about a part whose cases the run
    did not select (a CPU-only item of an entry in a GPU run, a float64 item in a --dtypes float32
    run, a vjp entry in a --grad none run, the input sets --sample-grad K or a shard or a pytest -k
    left out) or that an earlier entry shadows on this run's targets."""
    if not parts:
        return []
    targets, base = _run_targets(results)
    every = [Target(b, d, m) for b in sorted({t.backend for t in base})
             for d in get_backend(b).all_devices() for m in get_backend(b).modes]
    dtypes = {r.dtype for r in results}
    ids = {r.id for r in results}
    run_ops = {r.op for r in results}
    scopes = _Scopes()
    # the run's cases as the scoping sees them, by op: what it held is its records (a whole run's
    # records are its selection), so no case generation asks about them
    held_by_op: dict[str, list[SimpleNamespace]] = {}
    for r in results:
        held_by_op.setdefault(r.op, []).append(record_case(r))

    out = []
    for d, p in parts:
        ops = sorted(o for o in run_ops if any(fnmatchcase(o, g) for g in d.part_ops(p)))
        layouts = _layouts(d)
        on = [t for t in every if d.device in (None, t.device) and d.mode in (None, t.mode)]
        here = [t for t in on if t in base]  # the run's targets first: only they can warn

        def part_of(c, d=d, p=p) -> bool:
            return d.matches(c) and d.part(c.op, c.dtype, c.id) == p

        # the run's cases of the part's scope on those targets (the layout cases only where the
        # part is judged over them: _layouts)
        held = [c for o in ops for c in held_by_op[o]
                if Target(c.target.backend, c.target.device, c.target.mode) in here
                and (layouts == "all" or not c.layout) and part_of(c)]
        # warn of a case the run held that the part would have been recorded under (a record
        # carries the first entry scoping it); a case of the run's targets, dtypes, derivative
        # kinds, families and layouts that it did not select says nothing of the entry. An entry
        # of layout cases alone: only a run that held every layout case of its ops on its targets
        # and dtypes (--layouts all; default holds a few) could have held the part
        if any(kd.known_divergence(c) is d for c in held) and (layouts == "none" or {
                c.id for c in scopes.cases(ops, layouts, here)
                if c.layout and c.target in targets and c.dtype in dtypes} <= ids):
            out.append((d, p))
        elif not held and not any(part_of(c) for c in scopes.cases(ops, layouts, on, d.dtype)):
            out.append((d, p))  # no case of the whole matrix, on any target of the run's backends
    return out


def fully_covered(units: list[Unit], results: Sequence[CaseResult]) -> list[Unit]:
    """The units (entry, part, op, device, mode) among ``units`` whose every case on the run's
    targets of that device and mode is in ``results``: only a run that holds the whole scope can
    say a divergence is gone."""
    ids = {r.id for r in results}
    targets, base = _run_targets(results)
    scopes = _Scopes()
    out = []
    for u in units:
        d, p, op, device, mode = u
        here = [t for t in base if (t.device, t.mode) == (device, mode)]
        scope = [c.id for c in scopes.cases([op], _layouts(d), here, d.dtype)
                 if c.target in targets and kd.known_divergence(c) is d and d.part(c.op, c.dtype, c.id) == p]
        if all(c in ids for c in scope):
            out.append(u)
    return out
