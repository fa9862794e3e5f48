"""``rlx-conformance merge OUT_DIR REPORT...``: merge the reports of a sharded run (``run --shard
I/N`` on each machine) into OUT_DIR/results.json, with their repro bundles under OUT_DIR/repro/;
the checks that need the whole set (stale known divergences, bit-stability across modes) are
made on the merged cases. Exit 1 when a merged case fails the run, 2 on bad input (a missing or
repeated shard, shards of different selections, a case two reports disagree on).

Text output: a count line, then the warnings and the results path on lines of their own (paths are
never wrapped); ``--format json``: one document (schema rlx-conformance/merge/v1: results, reports,
summary, warnings, exit)."""
from __future__ import annotations

import argparse

from rlx_conformance.cli import _output as out
from rlx_conformance.core import results as res
from rlx_conformance.run.merge import merge


def register(sub) -> None:
    p = sub.add_parser("merge", help="merge shard reports (run --shard I/N) into one report",
                       description=(__doc__ or "").replace("``", ""))
    p.add_argument("out_dir", metavar="OUT_DIR", help="report dir to write (results.json, repro/)")
    p.add_argument("reports", metavar="REPORT", nargs="+", help="shard report dirs or their results.json")
    p.add_argument("--partial", action="store_true",
                   help="merge even if shards of the split are missing (no stale-divergence check)")
    p.add_argument("--rejudge", action="store_true",
                   help="judge every record again under cases/known_divergences.toml as it is now "
                        "(after editing it for a run that is dear to repeat, e.g. a GPU machine's)")
    out.add_format_option(p, help="text (default) or json: one document on stdout (schema "
                                  "rlx-conformance/merge/v1: results, reports, summary, warnings, exit)")
    p.set_defaults(fn=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    m = merge(args.out_dir, args.reports, partial=args.partial, rejudge=args.rejudge)
    summary = res.summarize(m.results)
    code = 1 if m.failed else 0
    warnings = m.meta.get("warnings", [])
    if args.format == "json":
        out.emit_json("merge", {"results": str(m.path), "reports": list(map(str, args.reports)),
                                "summary": summary, "warnings": warnings, "exit": code})
        return code
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary.get(o)]
    out.line(f"{summary['total']} cases from {len(args.reports)} report(s): " + ", ".join(parts))
    for w in warnings:
        out.line(f"warning: {w}")
    out.line(f"results: {m.path}")
    return code
