"""``rlx-conformance report RESULTS``: the self-contained HTML report of an existing results.json,
so a run made elsewhere (a GPU machine, a CI shard merge) gets its report where it is read."""
from __future__ import annotations

from pathlib import Path

from rlx_conformance.cli.diff import add_diff_options, check_lock, thresholds
from rlx_conformance.generate.coverage import coverage_of_run
from rlx_conformance.report import html as report_html
from rlx_conformance.report import junit, records
from rlx_conformance.report.diff import compare
from rlx_conformance.report.pairing import pair


def cmd_report(args) -> int:
    rep = records.load(args.results)
    d = compare(records.load(args.baseline), rep, thresholds(args)) if args.baseline else None
    lock = check_lock(args, rep)
    if d is not None:
        d.lock = lock
    out = Path(args.out) if args.out else rep.dir / "report.html"
    p = pair(rep, records.load(args.pair)) if args.pair else None
    report_html.write(rep, out, diff=d, lock=lock, with_plots=not args.no_plots, pairing=p,
                      coverage=coverage_of_run(r["op"] for r in rep.cases))
    print(f"report: {out}")
    if args.junit:
        junit.write(Path(args.junit), rep.cases)
        print(f"junit: {args.junit}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="render the HTML report of a results.json (or report dir)",
                       description=(__doc__ or "").splitlines()[0])
    p.add_argument("results", metavar="RESULTS_JSON_OR_DIR")
    p.add_argument("--out", metavar="FILE", help="HTML file to write (default: report.html beside results.json)")
    p.add_argument("--baseline", metavar="DIR", help="also show the diff against this report dir or results.json")
    p.add_argument("--pair", metavar="DIR", help="also pair the run, case by case, with this run of the "
                   "backend on another device (e.g. MLX gpu with MLX cpu: rlx-conformance pair)")
    p.add_argument("--junit", metavar="FILE", help="also write the run's JUnit XML (as the nightly's junit.xml) "
                   "to FILE, e.g. for a merged sharded run")
    p.add_argument("--no-plots", action="store_true", help="leave the plots out (faster; no matplotlib)")
    add_diff_options(p, lock_update=False)
    p.set_defaults(fn=cmd_report)
