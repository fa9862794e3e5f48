"""The HTML report: one self-contained file (inline CSS and SVG, no script, no external resource)
made from a results.json's case records, optionally with the diff against a baseline and the
tolerance-lock check. It opens from disk, so a run on a GPU machine can be rendered anywhere.

This module turns records into a view model (scoreboard, failures, divergences, statistics);
templates/report.html.j2 lays it out; plots.py draws the pictures."""
from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rlx_conformance.core.results import OUTCOMES, RUN_FAILING, SWEEP_FAILING, atomic_write_text
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.report import plots, stats
from rlx_conformance.report.diff import Diff
from rlx_conformance.report.lockfile import LockCheck
from rlx_conformance.report.pairing import Pairing
from rlx_conformance.report.records import (
    SEVERITY,
    GroupKey,
    Record,
    Report,
    group_key,
    is_bad,
    measure,
    subject,
    target,
    worst,
)

DTYPE_ORDER = ("float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64",
               "uint8", "uint32", "bool")
DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int8": "i8",
               "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint32": "u32", "bool": "b"}
MODE_ORDER = ("eager", "lazy", "compiled")
MAX_FAILURE_ROWS = 3000  # beyond this the HTML lists counts only; results.json has every case
MAX_LIST = 300  # rows per diff / lock list
OPEN_ALL_BELOW = 40  # ops: small runs show every family expanded


@dataclass
class Cell:
    outcome: str
    title: str
    delegated: bool
    href: str | None


@dataclass
class OpRow:
    op: str
    cells: list[list[Cell | None]]  # [target][dtype]; None: the op has no case of that dtype there


@dataclass
class FamilyBoard:
    name: str
    dtypes: list[str]
    rows: list[OpRow]
    counts: dict[str, int]
    worst: str
    open: bool
    bar: list[tuple[str, float, int]] = field(default_factory=list)  # (outcome, percent, count)


def _target_sort(t: str) -> tuple:
    b, d, m = (t.split("-") + ["", "", ""])[:3]
    return (b, d != "cpu", d, MODE_ORDER.index(m) if m in MODE_ORDER else 9, m)


def _dtype_sort(d: str) -> tuple:
    return (DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER), d)


def fmt(v: Any) -> str:
    """A measured error for a table cell: — when absent, 3 significant digits otherwise."""
    x = measure(v)
    if x is None:
        return "—"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e7:
        return str(int(x))
    return f"{x:.3g}"


def _severity(item: tuple[str, int]) -> int:
    return SEVERITY.index(item[0]) if item[0] in SEVERITY else -1


def _bar(counts: Counter) -> list[tuple[str, float, int]]:
    total = sum(counts.values()) or 1
    return [(o, 100 * n / total, n) for o, n in sorted(counts.items(), key=_severity, reverse=True) if n]


def _cell(recs: list[Record], label: str, href: str | None) -> Cell:
    """A scoreboard cell: the worst outcome of its cases, their counts on hover."""
    c = Counter(r["outcome"] for r in recs)
    delegated = any(r.get("kernel") == "delegated" for r in recs)
    title = f"{label}: " + ", ".join(f"{n} {o}" for o, n in sorted(c.items(), key=_severity))
    if delegated:
        title += " · delegated kernel"
    return Cell(worst(c), title, delegated, href)


def scoreboard(cases: list[Record], targets: list[str], anchors: dict[GroupKey, str]) -> list[FamilyBoard]:
    """The forward scoreboard: op × dtype per target, families as panels. Derivative records
    (``grad`` set) are left to :func:`derivative_board`, graph records to :func:`graph_board`."""
    groups: dict[GroupKey, list[Record]] = defaultdict(list)
    for r in cases:
        if not r.get("grad") and not is_graph_record(r):
            groups[group_key(r)].append(r)
    fam_ops: dict[str, set[str]] = defaultdict(set)
    for op, _, _ in groups:
        fam_ops[stats.op_family(op)].add(op)
    n_ops = sum(len(v) for v in fam_ops.values())
    boards = []
    for fam in sorted(fam_ops):
        ops = sorted(fam_ops[fam])
        dtypes = sorted({d for (op, d, _) in groups if op in fam_ops[fam]}, key=_dtype_sort)
        fam_counts: Counter = Counter()
        rows = []
        for op in ops:
            cells = []
            for t in targets:
                row = []
                for d in dtypes:
                    recs = groups.get((op, d, t))
                    if not recs:
                        row.append(None)
                        continue
                    fam_counts.update(r["outcome"] for r in recs)
                    row.append(_cell(recs, f"{op} · {d} · {t}", anchors.get((op, d, t))))
                cells.append(row)
            rows.append(OpRow(op, cells))
        w = worst(fam_counts) if fam_counts else "skip"
        boards.append(FamilyBoard(fam, dtypes, rows, dict(fam_counts), w,
                                  open=n_ops <= OPEN_ALL_BELOW or any(is_bad(o) for o in fam_counts),
                                  bar=_bar(fam_counts)))
    return boards


@dataclass
class DerivativeRow:
    """One op × derivative kind × dtype of the derivative panel: a cell per target, the counts
    per outcome over every target, and the worst errors of its passing and excused cases."""

    op: str
    grad: str
    dtype: str
    family: str
    cells: list[Cell | None]  # [target]; None: no case of the row there
    counts: list[tuple[str, int]]  # (outcome, n), worst first
    worst: str
    max_ulp: float | None
    max_rel: float | None
    max_abs: float | None


def derivative_board(cases: list[Record], targets: list[str], anchors: dict[GroupKey, str]) -> list[DerivativeRow]:
    """The derivative panel: the op records with ``grad`` set (vjp, jvp, hvp; a graph's are in
    :func:`graph_board`), one row per op ×
    derivative kind × dtype, apart from the forward scoreboard. The worst errors are over the
    cases that passed or were excused (a failure's error is its outcome's, as in the statistics)."""
    groups: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
    for r in cases:
        if r.get("grad") and not is_graph_record(r):
            groups[(r["op"], r["grad"], r["dtype"])].append(r)
    rows = []
    for (op, grad, d), recs in sorted(groups.items(), key=lambda kv: (stats.op_family(kv[0][0]), kv[0][0],
                                                                       kv[0][1], _dtype_sort(kv[0][2]))):
        by_t: dict[str, list[Record]] = defaultdict(list)
        for r in recs:
            by_t[target(r)].append(r)
        key = f"{op}:{grad}"
        cells = [_cell(by_t[t], f"{key} · {d} · {t}", anchors.get((key, d, t))) if by_t.get(t) else None
                 for t in targets]
        c = Counter(r["outcome"] for r in recs)
        judged = [r for r in recs if r.get("outcome") in ("pass", "xfail")]
        rows.append(DerivativeRow(op, grad, d, stats.op_family(op), cells, sorted(c.items(), key=_severity),
                                  worst(c), *(_top(judged, k) for k in ("max_ulp", "max_rel_err", "max_abs_err"))))
    return rows


def layout_board(cases: list[Record]) -> dict[str, Any] | None:
    """The layouts panel (issue 17): forward op records (graphs have their own panel) per op
    family × memory layout (contiguous first, then the layouts the run has, by name), each cell the worst outcome of its cases over
    every target, the counts on hover; None when the run has no layout case."""
    fwd = [r for r in cases if not r.get("grad") and not is_graph_record(r)]
    if not any(r.get("layout") for r in fwd):
        return None
    cols = sorted({r.get("layout") or "" for r in fwd})  # "" (contiguous) sorts first
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in fwd:
        groups[(stats.op_family(r["op"]), r.get("layout") or "")].append(r)
    rows = []
    for fam in sorted({f for f, _ in groups}):
        cells = [_cell(groups[(fam, lay)], f"{fam} · {lay or 'contiguous'}", None) if groups.get((fam, lay))
                 else None for lay in cols]
        rows.append({"family": fam, "cells": cells})
    return {"layouts": [lay or "contiguous" for lay in cols], "rows": rows}


# Compiled vs lazy vs eager on one device, per graph input (issue 17 item 3), worst last: the
# modes' outputs bit-identical; different bits, every mode within the graph's propagated bound
# (passed); different bits and some mode outside it (a mode the others do not explain).
MODE_AGREEMENT = ("bit-identical", "within-bound", "divergent")
MAX_GRAPH_REPROS = 5  # repro links per graph row; the failures section lists every bad case


def is_graph_record(r: Record) -> bool:
    """Whether a record is a graph case's (op ``graph:NAME``, generate/graphs.py)."""
    return str(r.get("op") or "").startswith(GRAPH_PREFIX)


@dataclass
class GraphRow:
    """One graph (its forward, or one derivative kind of it) in the graphs panel: a cell per
    target, the counts per outcome over every target, the modes' agreement per device and the
    run's bit-stability class of its groups, and links to the repro bundles of its bad cases."""

    graph: str  # the name, without "graph:"
    grad: str  # "" for the forward
    dtypes: list[str]
    nodes: int | None  # the graph's node count as its records give it (the largest shape set's)
    cells: list[Cell | None]  # [target]
    counts: list[tuple[str, int]]  # (outcome, n), worst first
    worst: str
    modes: list[dict[str, Any]]  # per device: {"device", "class", "counts": [(class, n)], "title"}
    stability: dict[str, Any] | None  # {"class", "title"}: the worst class of its stability groups
    repros: list[tuple[str, str]]  # (case id, href) of bad cases with a repro bundle
    bad: int  # bad cases (RUN_FAILING)


def mode_agreement(recs: list[Record]) -> dict[str, dict[str, int]]:
    """Per device (backend-device[-variant]): how many of the graph's inputs (ids without the
    target) ran in two modes or more with an output, counted by :data:`MODE_AGREEMENT`. Read
    from the records alone: their output digests and outcomes."""
    by_input: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in recs:
        if r.get("output_digest") and r.get("outcome") not in ("skip", "error", "crash", "timeout", "contract"):
            dev = f"{r['backend']}-{r['device']}" + (f"-{r['variant']}" if r.get("variant") else "")
            by_input[(dev, r["id"].rsplit("/", 1)[0])].append(r)
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(MODE_AGREEMENT, 0))
    for (dev, _), rs in sorted(by_input.items()):
        if len({r["mode"] for r in rs}) < 2:
            continue
        if len({r["output_digest"] for r in rs}) == 1:
            cls = "bit-identical"
        elif all(r["outcome"] == "pass" for r in rs):
            cls = "within-bound"
        else:
            cls = "divergent"
        out[dev][cls] += 1
    return dict(out)


def _stability_of(section: dict | None, subj: str) -> dict[str, Any] | None:
    """The worst bit-stability class (STABILITY_CLASSES, worst: nondeterministic) over a graph's
    groups of the run's stability section, the groups that are not bit-stable on hover."""
    groups = [g for g in (section or {}).get("groups") or [] if g.get("op") == subj]
    if not groups:
        return None
    rank = ("nondeterministic", "mode-dependent", "unknown", "bit-stable")
    cls = min((g.get("class") for g in groups), key=lambda c: rank.index(c) if c in rank else -1)
    odd = [f"{g.get('dtype')} {g.get('device')} {g.get('mode')}: {g.get('class')}"
           + (f" (differs from {', '.join(g['differs_from'])})" if g.get("differs_from") else "")
           for g in groups if g.get("class") != "bit-stable"]
    return {"class": cls, "title": "; ".join(odd) or f"{len(groups)} groups bit-stable"}


def graph_board(cases: list[Record], targets: list[str], anchors: dict[GroupKey, str],
                stability: dict | None = None, report_dir: Path | None = None,
                out_dir: Path | None = None) -> list[GraphRow]:
    """The graphs panel (issue 17): one row per graph and derivative kind (the forward first), a
    cell per target (the worst outcome of its cases over every dtype, linked to its first bad
    case or its known divergence), the compiled vs lazy vs eager agreement per device
    (:func:`mode_agreement`), the class ``stability`` (results.json's section) gives its groups,
    and the repro bundles of its bad cases (``report_dir``: where results.json is; ``out_dir``:
    where the HTML goes, the links are relative to it)."""
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in cases:
        if is_graph_record(r):
            groups[(r["op"], r.get("grad") or "")].append(r)
    rows = []
    for (op, grad), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] != "", kv[0][1])):
        subj = f"{op}:{grad}" if grad else op
        dtypes = sorted({r["dtype"] for r in recs}, key=_dtype_sort)
        by_t: dict[str, list[Record]] = defaultdict(list)
        for r in recs:
            by_t[target(r)].append(r)
        cells = []
        for t in targets:
            if not by_t.get(t):
                cells.append(None)
                continue
            href = next((anchors[(subj, d, t)] for d in dtypes if (subj, d, t) in anchors), None)
            cells.append(_cell(by_t[t], f"{subj} · {t}", href))
        c = Counter(r["outcome"] for r in recs)
        modes = []
        for dev, n in sorted(mode_agreement(recs).items()):
            worst_cls = next((k for k in reversed(MODE_AGREEMENT) if n[k]), None)
            if worst_cls is None:
                continue
            modes.append({"device": dev, "class": worst_cls, "counts": [(k, n[k]) for k in MODE_AGREEMENT if n[k]],
                          "title": f"{dev}: " + ", ".join(f"{n[k]} input(s) {k}" for k in MODE_AGREEMENT if n[k])})
        bad = sorted((r for r in recs if is_bad(r.get("outcome"))), key=lambda r: r["id"])
        repros = []
        if report_dir is not None and out_dir is not None:
            for r in bad:
                href = _repro_href(report_dir, out_dir, r)
                if href:
                    repros.append((r["id"], href))
                if len(repros) == MAX_GRAPH_REPROS:
                    break
        nodes = [int((r.get("graph") or {}).get("nodes")) for r in recs
                 if isinstance(r.get("graph"), dict) and (r.get("graph") or {}).get("nodes") is not None]
        rows.append(GraphRow(op.removeprefix(GRAPH_PREFIX), grad, dtypes, max(nodes) if nodes else None, cells,
                             sorted(c.items(), key=_severity), worst(c), modes, _stability_of(stability, subj),
                             repros, len(bad)))
    return rows


def _top(recs: list[Record], key: str) -> float | None:
    """The largest measured ``key`` of the records (None: none measured)."""
    xs = [x for x in (measure(r.get(key)) for r in recs) if x is not None]
    return max(xs) if xs else None


def _repro_href(report_dir: Path, out_dir: Path, rec: Record) -> str | None:
    """The case's repro.py, when the repro-bundle sink wrote one: the record's ``repro`` folder
    (relative to the report dir), else repro/<id>/; a link relative to the HTML file."""
    folders = ([report_dir / rec["repro"]] if rec.get("repro") else []) + [report_dir / "repro" / rec["id"]]
    for folder in folders:
        p = folder / "repro.py"
        if p.is_file():
            return quote(Path(os.path.relpath(p, out_dir)).as_posix())
    return None


def failures(cases: list[Record], report_dir: Path, out_dir: Path) -> tuple[list[dict], dict[GroupKey, str], int]:
    """The bad cases grouped by op (rows capped), and the anchor of each group's first one."""
    bad = sorted((r for r in cases if is_bad(r.get("outcome"))), key=lambda r: (subject(r), r["id"]))
    by_op: dict[str, list[dict]] = defaultdict(list)
    anchors: dict[GroupKey, str] = {}
    for i, r in enumerate(bad[:MAX_FAILURE_ROWS]):
        anchor = f"f{i}"
        anchors.setdefault(group_key(r), "#" + anchor)
        msg = r.get("message") or ""
        by_op[subject(r)].append({"anchor": anchor, "id": r["id"], "outcome": r["outcome"],
                               "abs": fmt(r.get("max_abs_err")), "rel": fmt(r.get("max_rel_err")),
                               "ulp": fmt(r.get("max_ulp")), "message": _clip((msg.splitlines() or [""])[0], 220),
                               "full": msg[:3000], "repro": _repro_href(report_dir, out_dir, r),
                               "kernel": r.get("kernel")})
    groups = [{"op": op, "rows": rows, "counts": Counter(x["outcome"] for x in rows),
               "open": len(bad) <= 60} for op, rows in sorted(by_op.items())]
    return groups, anchors, max(0, len(bad) - MAX_FAILURE_ROWS)


def _clip(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def divergences(cases: list[Record]) -> list[dict]:
    """Known-divergence entries that scoped cases of this run, with their cases' outcomes."""
    entries: dict[Any, dict] = {}
    for r in cases:
        d = r.get("divergence")
        if not d:
            continue
        e = entries.setdefault(d.get("entry"), {"entry": d.get("entry"), "category": d.get("category"),
                                                "reason": d.get("reason"), "link": d.get("link"),
                                                "counts": Counter(), "ops": set(), "dtypes": set()})
        e["counts"][r["outcome"]] += 1
        e["ops"].add(subject(r))
        e["dtypes"].add(r["dtype"])
    # by key; a results.json from before entries had keys names them by position (a number)
    out = sorted(entries.values(), key=lambda e: (e["entry"] is None, isinstance(e["entry"], str),
                                                  e["entry"] if isinstance(e["entry"], int) else 0,
                                                  str(e["entry"])))
    for e in out:
        e["ops"], e["dtypes"] = sorted(e["ops"]), sorted(e["dtypes"], key=_dtype_sort)
    return out


def stats_tables(cases: list[Record], drifted: set[str],
                 excused_drifted: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """The error statistics per family: a row per group with a measured error among its passing
    or its excused cases (the two distributions side by side, never pooled)."""
    fams: dict[str, list[dict]] = defaultdict(list)
    for (op, dtype, tgt), d in stats.distributions(cases).items():
        if d.n == 0 and d.excused.n == 0:
            continue
        key = f"{op}/{dtype}/{tgt}"
        fams[stats.op_family(op)].append({"op": op, "dtype": dtype, "target": tgt, "d": d,
                                          "drift": key in drifted or key in excused_drifted})
    out = []
    for f, rows in sorted(fams.items()):
        top = max(rows, key=lambda r: r["d"].max if r["d"].max is not None else -1.0)
        out.append({"family": f, "rows": rows, "drift": sum(r["drift"] for r in rows), "top": top})
    return out


# -- bit-stability, the exhaustive sweep, the oracle's verdicts ---------------------------------------
STABILITY_CLASSES = ("bit-stable", "mode-dependent", "nondeterministic", "unknown")
ORACLE_VERDICTS = ("ok", "target-over-budget", "supports-reference", "both-within-budget", "reference-bug")
MAX_REF_BUGS = 50  # reference-bug cases listed in the red block


def _stability_doc(report: Report) -> dict | None:
    """results.json's top-level ``stability`` section; None when the run has none (older runs)."""
    return report.stability


def stability_view(report: Report) -> dict | None:
    """Counts per class, the mode-dependent and nondeterministic groups, and how many cases
    failed a bit-stability check (cases/bit_stable.toml); None when there is nothing to show."""
    section = _stability_doc(report)
    failed = sum(1 for r in report.cases if (r.get("message") or "").startswith("bit-stability:"))
    if section is None and not failed:
        return None
    section = section or {}
    raw = section.get("counts") or {}
    counts = {c: int(raw.get(c, 0) or 0) for c in STABILITY_CLASSES}
    groups = []
    for g in section.get("groups") or []:
        cls = g.get("class")
        if cls not in ("mode-dependent", "nondeterministic"):
            continue
        groups.append({"op": g.get("op"), "dtype": g.get("dtype"), "backend": g.get("backend"),
                       "device": g.get("device"), "mode": g.get("mode"), "class": cls,
                       "differs_from": g.get("differs_from") or [], "cases": g.get("cases", 0),
                       "affected": g.get("nondeterministic_cases", g.get("mode_dependent_cases", 0)),
                       "examples": g.get("examples") or []})
    groups.sort(key=lambda g: (g["class"] != "nondeterministic", g["op"] or "", _dtype_sort(g["dtype"] or ""),
                               g["backend"] or "", g["device"] or "", g["mode"] or ""))
    return {"present": bool(section), "counts": counts, "groups": groups[:MAX_LIST],
            "groups_total": len(groups), "failed": failed}


EXHAUSTIVE_FILES = ("exhaustive.json", "exhaustive-float32.json")  # the 16-bit sweep; the float32 one beside it


def _exhaustive_doc(report_dir: Path) -> dict | None:
    """The sweep documents beside results.json as one: exhaustive.json and, where a float32 sweep
    was kept apart (the GPU baseline's whole-range sweep), exhaustive-float32.json."""
    docs = []
    for name in EXHAUSTIVE_FILES:
        p = report_dir / name
        if not p.is_file():
            continue
        try:
            doc = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
            docs.append(doc)
    if len(docs) < 2:
        return docs[0] if docs else None
    rows = [r for d in docs for r in d["rows"]]
    runs = [d.get("run") or {} for d in docs]
    summary = Counter(r.get("outcome") or "error" for r in rows)
    return {"rows": rows, "summary": dict(summary), "failed": any(d.get("failed") for d in docs),
            "run": {"dtypes": [t for r in runs for t in r.get("dtypes") or []],
                    "wall_s": sum(r.get("wall_s") or 0 for r in runs)}}


def validate_view(report: Report) -> dict | None:
    """A validate run's own sections (validate.json beside results.json, run/validate.py): the
    verdict, the per-attribute breakdown, error-input parity, speed and fuzzing; None for any
    other run."""
    p = report.dir / "validate.json"
    if not report.run.get("validate") or not p.is_file():
        return None
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    speed = doc.get("speed") or {}
    return {"kernel": doc.get("kernel"), "op": doc.get("op"), "target": doc.get("target"),
            "exit_code": doc.get("exit_code"),
            "by_attr": [(f"{k}={v}", c) for k, vals in (doc.get("by_attr") or {}).items() if len(vals) > 1
                        for v, c in vals.items()],
            "error_inputs": doc.get("error_inputs") or [],
            "speed": [(label, speed[k]) for k, label in (("builtin", "built-in kernel"), ("reference", "CPU reference"))
                      if isinstance(speed.get(k), dict)],
            "speed_note": speed.get("note"), "fuzz": doc.get("fuzz")}


def exhaustive_view(doc: dict | None) -> dict | None:
    """The sweep's rows (failing first, then xfail/xpass, then the rest, in sweep order) with
    their error figures, worst inputs as hex and the known divergence of xfail rows."""
    if not doc:
        return None
    rank = {o: i for i, o in enumerate((*SWEEP_FAILING, "xfail"))}
    rows = []
    for i, r in enumerate(doc.get("rows") or []):
        o = r.get("outcome") or "error"
        attrs = r.get("attrs") or {}
        budget = r.get("budget") or {}
        div = r.get("divergence") or {}
        worst_in = [f"{w.get('input')}" + (f" ({fmt(w['ulp'])} ulp)" if w.get("ulp") is not None else "")
                    for w in (r.get("worst") or [])[:3]]
        rng = r.get("float32_range")  # float32 rows: all 2^32 patterns or a sample
        span = "all 2^32" if rng == "full" else f"sample of {r.get('n')}" if rng else ""
        if o == "xfail" and div:
            entry = div.get("entry")
            name = entry if isinstance(entry, str) else f"#{entry}"  # a position, before entries had keys
            note = f"{name} ({div.get('category')}): {div.get('reason') or ''}"
        else:
            note = (r.get("message") or "").splitlines()[0] if r.get("message") else ""
        rows.append({"key": (rank.get(o, len(rank)), i), "op": r.get("op"), "dtype": r.get("dtype"),
                     "attrs": ",".join(f"{k}={v}" for k, v in sorted(attrs.items())),
                     "target": r.get("target"), "outcome": o, "max_ulp": fmt(r.get("max_ulp")),
                     "budget": fmt(budget.get("ulp")), "over": r.get("over_budget"),
                     "checked": r.get("checked", r.get("n")), "nan": r.get("nan_mismatch"),
                     "inf": r.get("inf_mismatch"), "sz": r.get("signed_zero_mismatch"),
                     "sz_asserted": r.get("signed_zero_asserted", True), "worst": worst_in,
                     "note": _clip(note, 300), "full": (r.get("message") or note)[:2000],
                     "span": span, "seconds": fmt(r.get("seconds")),
                     "first_over": (r.get("first_over") or [])[:3], "oracle": r.get("oracle")})
    rows.sort(key=lambda x: x["key"])
    summary = doc.get("summary") or dict(Counter(x["outcome"] for x in rows))
    bad = sum(1 for x in rows if x["outcome"] in SWEEP_FAILING)
    run = doc.get("run") or {}
    return {"rows": rows, "summary": {o: n for o, n in summary.items() if o != "total" and n},
            "total": len(rows), "bad": bad, "failed": bool(doc.get("failed", bad)),
            "dtypes": run.get("dtypes") or sorted({x["dtype"] for x in rows if x["dtype"]}, key=_dtype_sort),
            "wall_s": run.get("wall_s"), "open": bool(bad) or len(rows) <= 60}


def oracle_view(cases: list[Record]) -> dict | None:
    """Counts per oracle verdict, per op the worst oracle ULP of target and reference with the
    budget, the ops whose target is over budget, and the reference-bug cases; None when no case
    carries an oracle verdict (older runs, ops without an oracle)."""
    judged = [r for r in cases if r.get("oracle_verdict")]
    if not judged:
        return None
    verdicts = Counter(r["oracle_verdict"] for r in judged)
    ops: dict[str, dict] = {}
    for r in cases:
        t, ref = measure(r.get("oracle_ulp_target")), measure(r.get("oracle_ulp_ref"))
        if t is None and ref is None and not r.get("oracle_verdict"):
            continue
        e = ops.setdefault(r["op"], {"op": r["op"], "target": None, "ref": None, "budget": None, "dtype": None,
                                     "cases": 0, "over": 0, "ref_bugs": 0, "budgets": set()})
        e["cases"] += 1
        b = measure((r.get("budget") or {}).get("ulp"))
        if b is not None:
            e["budgets"].add(b)
        if t is not None and (e["target"] is None or t > e["target"]):
            e["target"], e["dtype"], e["budget"] = t, r.get("dtype"), b
        if ref is not None and (e["ref"] is None or ref > e["ref"]):
            e["ref"] = ref
        if (r.get("over_budget") or 0) > 0:
            e["over"] += 1
        if r.get("oracle_verdict") == "reference-bug":
            e["ref_bugs"] += 1
    rows = sorted(ops.values(), key=lambda e: (-e["over"], -e["ref_bugs"], e["op"]))
    for e in rows:
        bs = sorted(e.pop("budgets"))
        e["budget_all"] = "—" if not bs else fmt(bs[0]) if len(bs) == 1 else f"{fmt(bs[0])}–{fmt(bs[-1])}"
    bugs = sorted((r for r in judged if r["oracle_verdict"] == "reference-bug"), key=lambda r: r["id"])
    return {"counts": [(v, verdicts.get(v, 0)) for v in ORACLE_VERDICTS]
                      + sorted((v, n) for v, n in verdicts.items() if v not in ORACLE_VERDICTS),
            "judged": len(judged), "ops": rows, "over_ops": [e for e in rows if e["over"]],
            "ref_bugs": len(bugs),
            "bug_groups": sorted(Counter(f"{r['op']}/{r['dtype']}" for r in bugs).items()),
            "bugs": [{"id": r["id"], "op": r["op"], "dtype": r["dtype"], "outcome": r["outcome"],
                      "ref": fmt(r.get("oracle_ulp_ref")), "budget": fmt((r.get("budget") or {}).get("ulp")),
                      "message": _clip(((r.get("message") or "").splitlines() or [""])[0], 260)}
                     for r in bugs[:MAX_REF_BUGS]]}


def coverage_view(docs: list[dict] | None) -> dict | None:
    """The coverage section from generate/coverage.py's per-op documents (``coverage_of_run``,
    computed by the caller: a report reads only results): the declared ranks, attribute classes
    and dtypes the matrix never exercises, per op, and those an op justifies."""
    if not docs:
        return None
    return {"ops": len(docs), "declared": sum(len(c["declared"]) for c in docs),
            "gaps": [{"op": c["op"], "classes": c["gaps"]} for c in docs if c["gaps"]],
            "justified": [{"op": c["op"], "cls": k, "reason": why} for c in docs
                          for k, why in c["uncovered"].items()]}


def pairing_view(p: Pairing | None) -> dict | None:
    """The pair's totals and its groups where the two sides differ (worst first)."""
    if p is None:
        return None
    groups = [g.to_json() for g in p.groups if any(g.counts[c] for c in ("differ", "a_only", "b_only", "both"))]
    return {"a": p.a, "b": p.b, "totals": p.totals(), "groups": groups[:MAX_LIST],
            "groups_total": len(groups)}


def _meta(run: dict[str, Any]) -> tuple[list[tuple[str, str]], str | None]:
    """(label, value) rows for the header, and the TF32 setting if the run recorded one."""
    known = [("start", "started"), ("wall_s", "wall seconds"), ("platform", "platform"),
             ("machine", "machine"), ("python", "python"), ("numpy", "numpy"), ("mlx", "mlx"),
             ("cases_planned", "cases planned"), ("interrupted", "interrupted")]
    rows = [(label, str(run[k])) for k, label in known if k in run and run[k] is not None]
    skip = {k for k, _ in known} | {"targets", "backend", "device", "modes", "warnings", "env", "seed"}
    for k in sorted(run):
        if k not in skip and run[k] not in (None, "", [], {}):
            v = run[k]
            rows.append((k, v if isinstance(v, str) else json.dumps(v)[:300]))
    env = run.get("env") or {}
    if env:
        rows.append(("environment", " ".join(f"{k}={v}" for k, v in sorted(env.items()))))
    parts = []
    for k, v in [*run.items(), *env.items()]:
        if "tf32" in k.lower():
            if isinstance(v, dict):
                v = ", ".join(f"{a} {b if isinstance(b, str) else json.dumps(b)}" for a, b in v.items() if b not in (None, "", []))
            parts.append(f"{k}: {v}")
    tf32 = "; ".join(parts) or None
    return rows, tf32


def context(report: Report, *, diff: Diff | None = None, lock: LockCheck | None = None,
            out_path: Path | None = None, with_plots: bool = True,
            exhaustive: dict | None = None, pairing: Pairing | None = None,
            coverage: list[dict] | None = None) -> dict[str, Any]:
    """``exhaustive``: the sweep's document; default: exhaustive.json beside results.json, if any.
    ``pairing``: this run paired with a run on another device (pairing.py). ``coverage``: the
    run's ops' coverage documents (generate/coverage.py ``coverage_of_run``), or None."""
    cases = report.cases
    out_dir = (out_path or report.dir / "report.html").resolve().parent
    targets = sorted({target(r) for r in cases} | set(report.run.get("targets") or []), key=_target_sort)
    fail_groups, anchors, fail_more = failures(cases, report.dir, out_dir)
    div = divergences(cases)
    for r in cases:  # xfail cells link to their divergence entry
        if r.get("outcome") == "xfail" and r.get("divergence"):
            anchors.setdefault(group_key(r), f"#div{r['divergence'].get('entry')}")
    seen_outcomes = sorted({r["outcome"] for r in cases} - set(OUTCOMES))
    per_target: dict[str, Counter] = {t: Counter() for t in targets}
    for r in cases:
        per_target[target(r)][r["outcome"]] += 1
    drifted = {x["group"] for x in diff.distribution_drift} if diff is not None else set()
    excused_drifted = {x["group"] for x in diff.excused_distribution_drift} if diff is not None else set()
    meta_rows, tf32 = _meta(report.run)
    summary = {o: int(report.summary.get(o, 0)) for o in OUTCOMES}
    ctx = {
        "title": f"rlx-conformance report — {report.run.get('start', report.path.parent.name)}",
        "source": str(report.path), "run": report.run, "meta": meta_rows, "tf32": tf32,
        "targets": targets, "summary": summary, "total": sum(summary.values()),
        "bad_total": sum(summary[o] for o in RUN_FAILING), "bad_outcomes": RUN_FAILING, "outcomes": OUTCOMES,
        "colors": {o: plots.OUTCOME_COLORS.get(o, plots.UNKNOWN_COLOR) for o in (*OUTCOMES, *seen_outcomes)},
        "warnings": report.run.get("warnings") or [],
        "per_target": {t: [(o, c[o]) for o in OUTCOMES if c.get(o)] for t, c in per_target.items()},
        "boards": scoreboard(cases, targets, anchors), "dtype_short": DTYPE_SHORT,
        "derivatives": derivative_board(cases, targets, anchors), "layouts": layout_board(cases),
        "graphs": graph_board(cases, targets, anchors, report.stability, report.dir, out_dir),
        "mode_agreement": MODE_AGREEMENT,
        "failures": fail_groups, "failures_more": fail_more, "divergences": div,
        "stats": stats_tables(cases, drifted, excused_drifted), "diff": diff, "lock": lock,
        "diff_counts": diff.counts() if diff is not None else None, "max_list": MAX_LIST,
        "plots": dict.fromkeys(("hist", "worst", "outcomes")), "worst": stats.worst_ops(cases),
        "stability": stability_view(report), "oracle": oracle_view(cases),
        "pairing": pairing_view(pairing),
        "coverage": coverage_view(coverage),
        "exhaustive": exhaustive_view(exhaustive if exhaustive is not None else _exhaustive_doc(report.dir)),
        "validate": validate_view(report),
    }
    if ctx["validate"] is not None:  # a contributed kernel's run: no nightly tolerance-lock proposals
        ctx["lock"] = None
    if with_plots:
        ctx["plots"] = {"hist": plots.ulp_histograms(stats.ulps_by_family(cases)),
                        "worst": plots.worst_ops(ctx["worst"]),
                        "outcomes": plots.outcome_bars({t: dict(c) for t, c in per_target.items()})}
    return ctx


def render(report: Report, **kw: Any) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("rlx_conformance.report", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = fmt
    env.filters["short"] = lambda d: DTYPE_SHORT.get(d, d)
    return env.get_template("report.html.j2").render(**context(report, **kw))


def write(report: Report, out_path: Path, **kw: Any) -> Path:
    out_path = Path(out_path)
    atomic_write_text(out_path, render(report, out_path=out_path, **kw))
    return out_path
