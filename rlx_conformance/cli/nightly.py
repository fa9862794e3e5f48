"""``rlx-conformance nightly``: the whole matrix (its derivative cases too: ``--grad``, default all)
on every backend under test, every device this machine has and every mode, into a dated report dir (results.json, junit.xml, stats.json,
diff.json, report.html, repro/ bundles of the failing cases, exhaustive.json of the float16 /
bfloat16 sweep), diffed against the committed baseline and the tolerance lock. Exit 1 on
a regression (diff.py says what counts), not on known or baseline failures: the nightly gates on
what got worse."""
from __future__ import annotations

import datetime
import json
import sys
from collections import Counter
from pathlib import Path

from rlx_conformance.backends import BACKENDS, get_backend
from rlx_conformance.cli.diff import (
    add_diff_options,
    check_lock,
    print_diff,
    thresholds,
    write_json,
)
from rlx_conformance.cli.exhaustive import print_table
from rlx_conformance.cli.options import (
    add_grad_option,
    add_layouts_option,
    check_devices,
    grads,
    layout_cases,
    print_summary,
    progress,
    split,
    tf32_run,
)
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.coverage import coverage_of_run
from rlx_conformance.generate.matrix import Target
from rlx_conformance.report import html as report_html
from rlx_conformance.report import junit, records, stats
from rlx_conformance.report.diff import compare
from rlx_conformance.run import fuzz_graphs
from rlx_conformance.run.exhaustive import run_exhaustive, selected_dtypes, unary_ops
from rlx_conformance.run.session import (
    backend_targets,
    build_cases,
    default_report_dir,
    execute,
)

DEFAULT_BASELINE = Path("reports") / "baseline"
FUZZ_GRAPHS_S = 300.0  # the graph fuzzer's time after the matrix (some 300 graphs in three modes on a CPU)


def _backends(names: list[str] | None) -> list[str]:
    """The backends under test: those named, else every installed one but the CPU reference."""
    if names:
        return names
    found = []
    for name in BACKENDS:
        if name == "cpu":
            continue
        try:
            get_backend(name)
            found.append(name)
        except RlxError as e:
            print(f"nightly: skipping backend {name}: {e}", file=sys.stderr)
    if not found:
        raise RlxError("no backend under test is installed")
    return found


def targets(args):
    """The nightly's targets: every backend under test on the devices and modes asked for."""
    devices = args.device if args.device == "all" else split([args.device])
    modes = args.mode if args.mode == "all" else split([args.mode])
    return [t for b in _backends(split(args.backend))
            for t in backend_targets(b, check_devices(b, devices), modes)]


def write_stats(path: Path, cases: list[records.Record]) -> None:
    doc = {"schema": "rlx-conformance/stats/v1",
           "groups": {records.key_str(k): d.to_json() for k, d in stats.distributions(cases).items()}}
    res.atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


def cmd_nightly(args) -> int:
    tgs = targets(args)
    cases = layout_cases(args, build_cases(tgs, split(args.ops), split(args.dtypes), tf32=args.tf32,
                                           grads=grads(args), layouts=args.layouts))
    if not cases:
        raise RlxError("no cases selected")
    tholds = thresholds(args)  # bad options fail before the run, not after it
    report = Path(args.report) if args.report else default_report_dir("nightly")
    if (report / "results.json").exists():
        raise RlxError(f"{report} already holds a run; pick another --report")
    baseline = Path(args.baseline)
    counts: Counter[str] = Counter()
    with progress(len(cases), enabled=not args.no_progress and sys.stderr.isatty()) as bar:
        def on_result(r: res.CaseResult) -> None:
            counts[r.outcome] += 1
            bar(r, counts)
        try:
            run = execute(cases, report, workers=args.workers, timeout=args.timeout, on_result=on_result,
                          bundles=True, **tf32_run(args, cases))
        except KeyboardInterrupt:
            print(f"interrupted: partial results in {report / 'results.json'}", file=sys.stderr)
            return 130
    print_summary(run, args.show)

    new = records.load(run.path)
    junit.write(report / "junit.xml", new.cases)
    write_stats(report / "stats.json", new.cases)
    base = None
    try:
        base = records.load(baseline)
    except RlxError as e:
        print(f"nightly: no usable baseline ({e}): every bad case counts as new", file=sys.stderr)
    d = compare(base, new, tholds)
    d.lock = check_lock(args, new)
    write_json(d, report / "diff.json")
    print_diff(d, args.show)
    sweep = _exhaustive(args, report, tgs) if not args.no_exhaustive else None  # before the HTML, which shows it
    report_html.write(new, report / "report.html", diff=d, lock=d.lock, exhaustive=sweep,
                      coverage=coverage_of_run(r["op"] for r in new.cases))
    print(f"report: {report / 'report.html'}")
    fuzz_failed = _fuzz_graphs(args, report, tgs)
    return 1 if d.regression or (sweep is not None and sweep["failed"]) or fuzz_failed else 0


def _fuzz_graphs(args, report: Path, tgs: list[Target]) -> bool:
    """The graph fuzzer (issue 17 item 5) on the MLX targets for --fuzz-graphs seconds, seeded by
    the date so that each night draws other graphs (the summary line names the seed: rerun it
    with ``fuzz-graphs --seed``); True when it found a failure no known divergence explains (its
    graph and bundle go under the report dir)."""
    mlx = [t for t in tgs if t.backend == "mlx"]
    budget = args.fuzz_graphs if args.fuzz_graphs is not None else (0 if args.ops else FUZZ_GRAPHS_S)
    if budget <= 0 or not mlx:
        return False
    seed = int(datetime.date.today().strftime("%Y%m%d"))
    rep = fuzz_graphs.fuzz_graphs(None, seed, mlx, time_budget=budget, report_dir=report)
    print(rep.summary())
    return rep.failure is not None


def _exhaustive(args, report: Path, tgs: list[Target]) -> dict | None:
    """The exhaustive float16/bfloat16 sweep of the unary ops on the same targets, into
    report/exhaustive.json; its document (``failed``: a row over budget outside a known
    divergence, a crash, a timeout), or None when skipped: --ops selects no unary float op or
    --dtypes neither 16-bit float."""
    ops = split(args.ops)
    dtypes = selected_dtypes(split(args.dtypes))
    if not dtypes or not unary_ops(ops):
        return None
    doc = run_exhaustive(tgs, ops=ops, dtypes=dtypes, report_dir=report, workers=args.workers)
    print_table(doc, args.show)
    return doc


def register(sub) -> None:
    p = sub.add_parser("nightly", help="the whole matrix on every backend, device and mode, "
                       "with JUnit, HTML and a diff against the baseline",
                       description=(__doc__ or "").splitlines()[0])
    p.add_argument("--report", metavar="DIR", help="report dir (default: reports/nightly-<time>)")
    p.add_argument("--baseline", default=str(DEFAULT_BASELINE), metavar="DIR",
                   help=f"baseline report dir or results.json (default: {DEFAULT_BASELINE})")
    p.add_argument("--backend", action="append", metavar="NAME",
                   help="backends under test (default: every installed one but the cpu reference)")
    p.add_argument("--device", default="all", help="cpu, gpu or all (default: all this machine has)")
    p.add_argument("--mode", default="all", help="eager, lazy, compiled or all (default: all)")
    p.add_argument("--ops", "--op", action="append", metavar="GLOB", help="op name globs (default: all)")
    p.add_argument("--dtypes", action="append", metavar="GLOB", help="dtype globs (default: all)")
    p.add_argument("--tf32", choices=("on", "off", "both"), default=None,
                   help="MLX_ENABLE_TF32 for the workers, as for `run` (default: as the environment says)")
    add_grad_option(p)
    add_layouts_option(p, default="all")  # every layout of every forward case (issue 17)
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a case may run (default 60)")
    p.add_argument("--show", type=int, default=25, help="rows per list in the terminal (default 25)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--fuzz-graphs", type=float, default=None, metavar="SECONDS",
                   help=f"run the graph fuzzer this long after the matrix (default {FUZZ_GRAPHS_S:g} without "
                        "--ops, 0 with it: a run of some ops is about those ops; 0: not at all)")
    p.add_argument("--no-exhaustive", action="store_true",
                   help="skip the exhaustive float16/bfloat16 sweep of the unary ops")
    add_diff_options(p)
    p.set_defaults(fn=cmd_nightly)
