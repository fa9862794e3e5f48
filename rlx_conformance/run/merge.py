"""Merging the reports of a sharded run (``run --shard I/N`` on several machines) into one.

A shard cannot judge what depends on the whole set: whether a known divergence is stale (none of
its cases fails any more: its passes become xpass) and whether modes that must agree bit-wise do
(cases/bit_stable.toml). Shards leave both undone (session.execute with ``shard``); the merge
applies them, over the union of the shards' cases, with the same functions a whole run uses, so
merging the shards of a run gives the cases and summary of running it whole.

Shards merge only when they are parts of one selection: a shard of ``--ops exp`` and one of
``--ops log``, or of another mode, backend, data folder or harness version, would make a report
that looks whole and is not (check_selections refuses them, naming the option and both values).
"""
from __future__ import annotations

import datetime as _dt
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlx_conformance.core import provenance
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.stability import classify, enforce
from rlx_conformance.run.exhaustive import merge_docs, write_doc
from rlx_conformance.run.outcomes import finalize
from rlx_conformance.run.outcomes import rejudge as rejudge_record

TIMING = ("duration_s", "backend_s")  # may differ between two runs of one case
VERSIONS = ("python", "numpy", "ml_dtypes", "scipy", "mlx")  # shards run with different ones: a warning
_COMBINED = ("start", "wall_s", "targets", "backend", "device", "modes", "cases_planned", "interrupted",
             "same_worker_repeats", "bit_stability_failures", "warnings", "shard",
             "selection")  # combine_meta's own
# The keys of run.selection (session.selection) that shards of one run share, as the option that
# sets each: every key but the shard.
SELECTION_OPTIONS = {"ops": "--ops", "dtypes": "--dtypes", "grad": "--grad", "forward": "--no-forward",
                     "layouts": "--layouts", "contiguous": "--no-contiguous", "backend": "--backend", "devices": "--device",
                     "modes": "--mode", "tf32": "--tf32", "sample": "--sample", "sample_grad": "--sample-grad",
                     "skip_shapes": "--skip-shapes",
                     "graphs": "--graphs", "case": "--case",
                     "cases_dir": "--cases"}


@dataclass
class Shard:
    """One input report."""

    path: Path  # its results.json
    run: dict[str, Any]
    cases: list[dict[str, Any]]

    @property
    def dir(self) -> Path:
        return self.path.parent


@dataclass
class Merged:
    """The merged report, as written."""

    path: Path
    meta: dict[str, Any]
    results: list[res.CaseResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(r.outcome in res.RUN_FAILING for r in self.results)


def load_shard(path: str | Path) -> Shard:
    """A report given as its directory or its results.json (results.load_report: one reader for all)."""
    rep = res.load_report(path)
    return Shard(rep.path, rep.run, rep.cases)


def check_shards(shards: Sequence[Shard]) -> list[str]:
    """The shards' I/N labels must be one split, each part once; returns the missing parts as
    "I/N" (an empty list when complete, or when the reports carry no labels)."""
    labels = [s.run.get("shard") for s in shards]
    if not any(labels):
        return []
    if not all(labels):
        unlabeled = [str(s.path) for s, lab in zip(shards, labels) if not lab]
        raise RlxError(f"mixing shard reports with whole runs: {', '.join(unlabeled)} is not a shard")
    parts = [tuple(int(v) for v in str(lab).split("/")) for lab in labels]
    ns = {n for _, n in parts}
    if len(ns) != 1:
        raise RlxError(f"shards of different splits: {', '.join(sorted(set(map(str, labels))))}")
    n = ns.pop()
    seen: dict[int, Path] = {}
    for (i, _), s in zip(parts, shards):
        if i in seen:
            raise RlxError(f"shard {i}/{n} given twice: {seen[i]} and {s.path}")
        seen[i] = s.path
    return [f"{i}/{n}" for i in range(1, n + 1) if i not in seen]


def _shown(v: Any) -> str:
    if v is None:
        return "(not given)"
    return (",".join(map(str, v)) or "none") if isinstance(v, list) else str(v)  # --grad none: []


def check_selections(shards: Sequence[Shard]) -> None:
    """Shards must be parts of one selection: the same run options (run.selection, all but the
    shard) and the same harness version. Raises RlxError naming the first option that differs and
    its values in two shards. Reports that record no selection (an older harness) are compared on
    the harness version alone."""
    first = shards[0]

    def values(s: Shard) -> dict[str, Any]:
        sel = s.run.get("selection")
        out = {k: (sel.get(k) if isinstance(sel, dict) else "(not recorded)") for k in SELECTION_OPTIONS}
        if not any(isinstance(x.run.get("selection"), dict) for x in shards):
            out = {}
        out["harness version"] = (s.run.get("harness") or {}).get("version")
        return out

    want = values(first)
    for s in shards[1:]:
        got = values(s)
        for k, v in want.items():
            if got.get(k) != v:
                name = SELECTION_OPTIONS.get(k, k)
                raise RlxError(f"shards of different selections: {name} is {_shown(v)} in {first.path} "
                               f"but {_shown(got.get(k))} in {s.path} (merge the shards of one run)")


def union_cases(shards: Sequence[Shard]) -> list[dict[str, Any]]:
    """Every case once, sorted by id. An id in two reports must be the same record there (timings
    aside): otherwise the reports are not of one run, and merging them would hide that."""
    by_id: dict[str, tuple[dict[str, Any], Path]] = {}
    for s in shards:
        for rec in s.cases:
            prev = by_id.get(rec["id"])
            if prev is None:
                by_id[rec["id"]] = (rec, s.path)
                continue
            a = {k: v for k, v in prev[0].items() if k not in TIMING}
            b = {k: v for k, v in rec.items() if k not in TIMING}
            if a != b:
                diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
                raise RlxError(f"case {rec['id']} is in {prev[1]} and {s.path} with different "
                               f"results ({', '.join(diff)})")
    return [by_id[k][0] for k in sorted(by_id)]


def combine_meta(shards: Sequence[Shard]) -> tuple[dict[str, Any], list[str]]:
    """Run metadata of the merged report: what all shards agree on, the union of targets, the
    earliest start, the longest wall time (shards run side by side), summed counts; and every
    shard's own metadata under ``merged.shards``. ``merged.by`` is the harness that merged (and,
    with --rejudge, judged again): ``run.harness`` stays the shards' when they agree, so a
    baseline rejudged by a newer harness would otherwise not say which judged it. Returns it with
    warnings (differing versions)."""
    metas = [s.run for s in shards]
    keys = list(dict.fromkeys(k for m in metas for k in m))
    meta = {k: metas[0].get(k) for k in keys if all(m.get(k) == metas[0].get(k) for m in metas)}
    differs = [k for k in keys if k not in meta and k not in _COMBINED]
    warnings = [f"shards ran with different {k}: {', '.join(sorted({str(m.get(k)) for m in metas}))}"
                for k in VERSIONS if k in differs]

    def union(k: str) -> list[Any]:
        return sorted({v for m in metas for v in (m.get(k) or [])})

    starts = [m["start"] for m in metas if m.get("start")]
    meta.update(
        start=min(starts) if starts else None,
        wall_s=max((m.get("wall_s") or 0 for m in metas), default=0),
        targets=union("targets"), backend=union("backend"), device=union("device"), modes=union("modes"),
        cases_planned=sum(m.get("cases_planned") or 0 for m in metas),
        interrupted=any(m.get("interrupted") for m in metas),
        same_worker_repeats=sum(m.get("same_worker_repeats") or 0 for m in metas),
        bit_stability_failures=sum(m.get("bit_stability_failures") or 0 for m in metas),
        merged={"at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "by": provenance.harness(),
                "from": [str(s.path) for s in shards], "differs": differs,
                "shards": [dict(m, path=str(s.path)) for m, s in zip(metas, shards)]})
    meta.pop("shard", None)
    sels = [m.get("selection") for m in metas]
    if all(isinstance(x, dict) for x in sels) and all({**x, "shard": None} == {**sels[0], "shard": None} for x in sels):
        meta["selection"] = {**sels[0], "shard": None}  # the whole selection the shards split
    return meta, warnings


def copy_bundles(shards: Sequence[Shard], out_dir: Path) -> int:
    """Copy each shard's repro bundles (``repro/<case>/``) under ``out_dir/repro/``."""
    n = 0
    for s in shards:
        src = s.dir / "repro"
        if not src.is_dir() or src.resolve() == (out_dir / "repro").resolve():
            continue
        for folder in sorted(p for p in src.iterdir() if p.is_dir() and not p.name.startswith(".")):
            dest = out_dir / "repro" / folder.name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(folder, dest)
            n += 1
    return n


def merge(out_dir: str | Path, inputs: Sequence[str | Path], *, partial: bool = False,
          rejudge: bool = False) -> Merged:
    """Merge shard reports into ``out_dir/results.json`` (and ``out_dir/repro/``). A split with
    missing shards is an error unless ``partial``; a partial merge skips the stale-divergence check
    (it needs every case of an entry) and says so in its warnings. ``rejudge``: judge every
    record again under the known divergences as they are now (outcomes.rejudge); one whole,
    uninterrupted run so re-judged also gets the checks over the whole set."""
    if not inputs:
        raise RlxError("merge needs at least one report")
    out = Path(out_dir)
    shards = [load_shard(p) for p in inputs]
    missing = check_shards(shards)
    if any(s.run.get("shard") for s in shards):
        check_selections(shards)
    if missing and not partial:
        raise RlxError(f"shard(s) {', '.join(missing)} missing (merge them too, or pass --partial)")
    results = [res.CaseResult.from_json(rec) for rec in union_cases(shards)]
    if rejudge:
        results = [rejudge_record(r) for r in results]
    meta, warnings = combine_meta(shards)
    whole = len(shards) == 1 and not shards[0].run.get("interrupted")
    if rejudge and whole and not shards[0].run.get("shard"):
        warnings += finalize(results)
        meta["bit_stability_failures"] = enforce(results)
        meta["rejudged"] = True
    elif not any(s.run.get("shard") for s in shards):
        warnings.append("merged whole runs (no shard labels): each keeps its own verdicts")
    elif missing:
        warnings.append(f"partial merge: shard(s) {', '.join(missing)} missing; stale known "
                        "divergences not checked")
        meta["bit_stability_failures"] = enforce(results)
    else:  # the judgments the shards left undone, over the whole set, as session.execute makes them
        warnings += finalize(results)
        meta["bit_stability_failures"] = enforce(results)
    # a rejudge judges the known divergences again: the shards' own warnings about entries (stale,
    # matched no case) were about the entries as they were, and finalize() said what holds now
    carried = [w for s in shards for w in s.run.get("warnings") or []
               if not (rejudge and w.startswith("known divergence "))]
    meta["warnings"] = list(dict.fromkeys(warnings + carried))
    path = out / "results.json"
    res.write_results(path, meta, results, classify(results))
    copy_bundles(shards, out)
    sweeps = [s.dir / "exhaustive.json" for s in shards if (s.dir / "exhaustive.json").is_file()]
    if sweeps:  # run --shard I/N --exhaustive: each shard swept its part of the jobs
        write_doc(merge_docs([json.loads(p.read_text()) for p in sweeps]), out)
    return Merged(path, meta, results, warnings)
