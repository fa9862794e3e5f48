"""``rlx-conformance exhaustive``: every unary float op on all float16 and bfloat16 bit patterns
and, when asked (--dtypes float32, --float32-range, --float32-sample), on float32: all 2^32 bit
patterns where CuPy sees a GPU (``--dtypes float32 --device gpu``: a float64 oracle on the device,
run/exhaustive_f32.py), else a sample covering every exponent, against the precise oracle
(rlx_conformance/run/exhaustive.py).

The same sweep ends ``rlx-conformance run --exhaustive`` (:func:`sweep_after_run`): over the run's
own selection (--ops, --dtypes, --device, --mode, --shard, --workers) into the run's report
directory (REPORT/exhaustive.json beside results.json), its verdict joining the run's exit code;
so ``tox -e mlx -- OPTIONS`` is one command and every option reaches both.

Text output: a table of short cells (op, dtype, target, outcome, errors; no case ids), paths on
lines of their own. ``--format json``: the sweep's document on stdout (schema
rlx-conformance/exhaustive/v1: run, summary, failed, rows, path), as exhaustive.json holds it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rlx_conformance.cli import _output as out
from rlx_conformance.cli.options import add_matrix_options, parse_shard, split, targets
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import SWEEP_FAILING
from rlx_conformance.run import exhaustive_f32
from rlx_conformance.run.exhaustive import run_exhaustive, selected_dtypes, unary_ops
from rlx_conformance.run.session import default_report_dir


def register(sub) -> None:

    p = sub.add_parser("exhaustive", help="sweep every unary float op over all float16/bfloat16 bit "
                       "patterns against the precise oracle; writes exhaustive.json")
    add_matrix_options(p)
    p.add_argument("--float32-sample", type=int, default=0, metavar="N",
                   help="also sweep about N float32 patterns covering every exponent (default 0: none)")
    p.add_argument("--float32-range", choices=("auto", "sample", "full"), default=None,
                   help="float32 inputs: every one of the 2^32 bit patterns (full), a sample covering every "
                        "exponent (sample: --float32-sample N, default 2^20), or auto: full where CuPy sees a "
                        "GPU (the float64 oracle on the device), else the sample. Naming float32 in --dtypes "
                        "or giving this option sweeps float32 (default auto)")
    p.add_argument("--float32-chunk", type=int, default=None, metavar="N",
                   help="float32 patterns per chunk (default 2^26 with CuPy, 2^22 on numpy)")
    p.add_argument("--report", metavar="DIR", help="report directory (default: reports/exhaustive-<time>)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core, at most 4)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one target may run on one op (default 120)")
    p.add_argument("--shard", metavar="I/N", help="sweep only shard I of N of the (op, dtype) jobs")
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="oracle cache directory (default: $RLX_CONFORMANCE_CACHE or ~/.cache/rlx-conformance)/oracle")
    p.add_argument("--no-cache", action="store_true", help="compute the oracle afresh, cache nothing")
    p.add_argument("--no-reference", action="store_true", help="do not sweep the CPU reference itself")
    p.add_argument("--no-progress", action="store_true", help="no progress line")
    p.add_argument("--show", type=int, default=40, help="rows to list (bad first; default 40)")
    out.add_format_option(p, help="text (default) or json: the sweep's document on stdout (schema "
                                  "rlx-conformance/exhaustive/v1: run, summary, failed, rows, path)")
    p.set_defaults(fn=cmd_exhaustive)


def add_run_option(p: argparse.ArgumentParser) -> None:
    """``run --exhaustive``."""
    p.add_argument("--exhaustive", action="store_true",
                   help="then sweep the selected unary float ops over every float16/bfloat16 bit pattern "
                        "(the exhaustive command, same --ops/--dtypes/--device/--mode/--shard/--workers) "
                        "into REPORT/exhaustive.json; a failing row fails the run")


def _on_row(enabled: bool):
    """The one-line progress of a sweep on a terminal (stderr)."""
    done = []

    def on_row(r: dict[str, Any]) -> None:
        done.append(r)
        if enabled:
            print(f"\r{len(done)} rows: {r['op']} {r['dtype']} {r['target']} {r['outcome']}".ljust(78),
                  end="", file=sys.stderr, flush=True)
    return on_row


def _sweep(args, report: Path, dtypes: list[str], **kw: Any) -> dict[str, Any]:
    progress = sys.stderr.isatty() and not getattr(args, "no_progress", False)
    shard = parse_shard(args.shard) if getattr(args, "shard", None) else None
    doc = run_exhaustive(targets(args), split(args.ops), dtypes, report, workers=args.workers, shard=shard,
                         on_row=_on_row(progress), **kw)
    if progress:
        print(file=sys.stderr)
    return doc


def cmd_exhaustive(args) -> int:
    report = Path(args.report) if args.report else default_report_dir("exhaustive")
    cache = None if args.no_cache else (Path(args.cache) if args.cache else True)
    f32_range, f32_sample = float32_choice(args)
    dtypes = selected_dtypes(split(args.dtypes), f32_sample, f32_full=f32_range == "full")
    if not dtypes:
        raise RlxError("exhaustive: --dtypes selects no sweepable dtype (float16, bfloat16; float32 when "
                       "named, or with --float32-range / --float32-sample N)")
    doc = _sweep(args, report, dtypes,
                 f32_sample=f32_sample, f32_range=f32_range, f32_chunk=args.float32_chunk,
                 timeout=args.timeout, cache_dir=cache, reference=not args.no_reference)
    code = 1 if doc["failed"] else 0
    if args.format == "json":
        out.emit_json("exhaustive", {k: v for k, v in doc.items() if k != "schema"})
        return code
    print_table(doc, args.show)
    return code


F32_SAMPLE = 1 << 20  # the float32 sample when float32 is swept without a GPU and without --float32-sample


def float32_choice(args) -> tuple[str, int]:
    """(range, sample) of the float32 leg: float32 is swept when --dtypes names it (float32,
    f32), --float32-range is given or --float32-sample N > 0 (sample 0: not swept). auto is full
    where CuPy sees a GPU, else a sample of --float32-sample N (default F32_SAMPLE)."""
    named = any(g in ("float32", "f32") for g in split(args.dtypes) or [])
    rng = args.float32_range or ("sample" if args.float32_sample > 0 else "auto" if named else None)
    if rng is None:
        return "sample", 0
    if rng == "auto":
        rng = "full" if exhaustive_f32.cupy_module() is not None else "sample"
    return rng, (args.float32_sample or F32_SAMPLE) if rng == "sample" else args.float32_sample


def sweep_after_run(args, report: Path) -> dict[str, Any]:
    """``run --exhaustive``: the sweep of the run's selection into ``report``. Returns what the
    run's summary says of it: ``exit`` (1 when a row fails), ``path``, ``summary``, and
    ``skipped`` (why no sweep ran: --case, or no unary float op or 16-bit float dtype selected).
    Prints its table unless --format json."""
    dtypes = selected_dtypes(split(args.dtypes))
    skipped = ("--case runs single cases; the sweep is per op" if args.case
               else "--dtypes selects neither float16 nor bfloat16" if not dtypes
               else "--ops selects no unary float op" if not unary_ops(split(args.ops)) else None)
    if skipped:
        if args.format != "json":
            out.line(f"exhaustive: skipped ({skipped})")
        return {"exit": 0, "path": None, "summary": None, "skipped": skipped}
    doc = _sweep(args, report, dtypes)
    if args.format != "json":
        print_table(doc, args.show)
    return {"exit": 1 if doc["failed"] else 0, "path": doc.get("path"), "summary": doc["summary"], "skipped": None}


def print_table(doc, show: int = 40) -> None:
    """The sweep's rows in a table, failing ones first, then the known (xfail) ones; under it, the
    worst inputs (hex bit patterns) or the message of each listed row that did not pass, one row
    a line, then the summary and the report's path on lines of their own."""
    rows = doc["rows"]
    order = sorted(rows, key=lambda r: (r["outcome"] not in SWEEP_FAILING, r["outcome"] != "xfail"))[:show]

    def name(r: dict[str, Any]) -> str:
        attrs = ",".join(f"{k}={v}" for k, v in sorted(r["attrs"].items()))
        return r["op"] + (f"[{attrs}]" if attrs else "")

    table = [[name(r), r["dtype"], r["target"], r["outcome"],
              "" if "max_ulp" not in r else f"{r['max_ulp']:g}",
              "" if "over_budget" not in r else f"{r['over_budget']}/{r.get('budget', {}).get('ulp', 0):g}",
              "" if "nan_mismatch" not in r else
              f"{r['nan_mismatch']}/{r['inf_mismatch']}/{r['signed_zero_mismatch']}"
              + ("" if r.get("signed_zero_asserted") else "*")] for r in order]
    out.table(f"exhaustive: {len(rows)} rows (op x dtype x target), first {len(order)}",
              ["op", "dtype", "target", "outcome", "ulp", "over/budget", "NaN/inf/±0"], table,
              right=["ulp"])
    out.line("ulp: max ULP; over/budget: elements over the accuracy budget / the budget in ULP; "
             "±0 mismatches marked * are not asserted (the op's policy leaves the sign of zero free).")
    bad = [r for r in order if r["outcome"] not in ("pass", "skip")]
    for r in bad:
        worst = " ".join(f"{w['input']}({w['ulp']:g})" if w.get("ulp") is not None else w["input"]
                         for w in r.get("worst", [])[:3])
        out.line(f"  {r['outcome']}  {name(r)} {r['dtype']} {r['target']}: "
                 + (f"worst inputs {worst}" if worst else out.shorten(r.get("message", ""), 300)[0]))
    s = doc["summary"]
    out.line(f"{s['total']} rows in {doc['run']['wall_s']:.1f} s: "
             + ", ".join(f"{s[o]} {o}" for o in s if o != "total" and s[o]))
    if doc.get("path"):
        out.line(f"report: {doc['path']}")
