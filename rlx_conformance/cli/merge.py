"""``rlx-conformance merge OUT_DIR REPORT...``: merge the reports of a sharded run (``run --shard
I/N`` on each machine) into OUT_DIR/results.json, with their repro bundles under OUT_DIR/repro/;
the checks that need the whole set (stale known divergences, bit-stability across modes) are
made on the merged cases. Exit 1 when a merged case fails the run, 2 on bad input (a missing or
repeated shard, a case two reports disagree on)."""
from __future__ import annotations

import argparse

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
    p.set_defaults(fn=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    m = merge(args.out_dir, args.reports, partial=args.partial, rejudge=args.rejudge)
    summary = res.summarize(m.results)
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary.get(o)]
    print(f"{summary['total']} cases from {len(args.reports)} report(s): " + ", ".join(parts))
    for w in m.meta.get("warnings", []):
        print(f"warning: {w}")
    print(f"results: {m.path}")
    return 1 if m.failed else 0
