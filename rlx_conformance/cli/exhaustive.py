"""``rlx-conformance exhaustive``: every unary float op on all float16 and bfloat16 bit patterns
(optionally a float32 sample) against the precise oracle (rlx_conformance/run/exhaustive.py)."""
from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlx_conformance.cli.options import add_matrix_options, split, targets
from rlx_conformance.run.exhaustive import DTYPES, SWEEP_FAILING, run_exhaustive
from rlx_conformance.run.session import default_report_dir


def register(sub) -> None:

    p = sub.add_parser("exhaustive", help="sweep every unary float op over all float16/bfloat16 bit "
                       "patterns against the precise oracle; writes exhaustive.json")
    add_matrix_options(p)
    p.add_argument("--float32-sample", type=int, default=0, metavar="N",
                   help="also sweep about N float32 patterns covering every exponent (default 0: none)")
    p.add_argument("--report", metavar="DIR", help="report directory (default: reports/exhaustive-<time>)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core, at most 4)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one target may run on one op (default 120)")
    p.add_argument("--cache", metavar="DIR", default=None,
                   help="oracle cache directory (default: $RLX_CONFORMANCE_CACHE or ~/.cache/rlx-conformance)/oracle")
    p.add_argument("--no-cache", action="store_true", help="compute the oracle afresh, cache nothing")
    p.add_argument("--no-reference", action="store_true", help="do not sweep the CPU reference itself")
    p.add_argument("--show", type=int, default=40, help="rows to list (bad first; default 40)")
    p.set_defaults(fn=cmd_exhaustive)


def cmd_exhaustive(args) -> int:
    dtypes = ["float16", "bfloat16"] + (["float32"] if args.float32_sample else [])
    if args.dtypes:
        globs = split(args.dtypes)
        dtypes = [d for d in DTYPES if any(fnmatch.fnmatchcase(d, g) for g in globs)]
    report = Path(args.report) if args.report else default_report_dir("exhaustive")
    cache = None if args.no_cache else (Path(args.cache) if args.cache else True)
    done = []

    def on_row(r):
        done.append(r)
        if sys.stderr.isatty():
            print(f"\r{len(done)} rows: {r['op']} {r['dtype']} {r['target']} {r['outcome']}".ljust(78),
                  end="", file=sys.stderr, flush=True)

    doc = run_exhaustive(targets(args), split(args.ops), dtypes, report, f32_sample=args.float32_sample,
                         workers=args.workers, timeout=args.timeout, cache_dir=cache,
                         reference=not args.no_reference, on_row=on_row)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print_table(doc, args.show)
    return 1 if doc["failed"] else 0


def print_table(doc, show: int = 40) -> None:
    """The sweep's rows in a table, failing ones first, then the known (xfail) ones."""
    rows = doc["rows"]
    order = sorted(rows, key=lambda r: (r["outcome"] not in SWEEP_FAILING, r["outcome"] != "xfail"))
    t = Table(title=f"exhaustive: {len(rows)} rows (op x dtype x target), first {min(show, len(rows))}")
    for col in ("op", "dtype", "target", "outcome", "max ulp", "over budget", "NaN/inf/±0", "worst inputs"):
        t.add_column(col, overflow="fold")
    for r in order[:show]:
        attrs = ",".join(f"{k}={v}" for k, v in sorted(r["attrs"].items()))
        worst = " ".join(f"{w['input']}({w['ulp']:g})" if w.get("ulp") is not None else w["input"]
                         for w in r.get("worst", [])[:3])
        budget = r.get("budget", {}).get("ulp")
        t.add_row(r["op"] + (f"[{attrs}]" if attrs else ""), r["dtype"], r["target"], r["outcome"],
                  "" if "max_ulp" not in r else f"{r['max_ulp']:g}",
                  "" if "over_budget" not in r else f"{r['over_budget']} (budget {budget:g})",
                  "" if "nan_mismatch" not in r else
                  f"{r['nan_mismatch']}/{r['inf_mismatch']}/{r['signed_zero_mismatch']}"
                  + ("" if r.get("signed_zero_asserted") else "*"),
                  worst or r.get("message", "")[:80])
    c = Console(highlight=False)
    c.print(t)
    c.print("±0 mismatches marked * are not asserted (the op's policy leaves the sign of zero free).")
    s = doc["summary"]
    c.print(f"{s['total']} rows in {doc['run']['wall_s']:.1f} s: "
            + ", ".join(f"{s[o]} {o}" for o in s if o != "total" and s[o]))
    if doc.get("path"):
        c.print(f"report: {doc['path']}")
