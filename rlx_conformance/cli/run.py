"""rlx-conformance run: the case matrix (or --case IDs) on a backend against the CPU reference,
results.json, repro bundles and a summary (text, or ``--format json``: schema rlx-conformance/run/v1,
the keys of options.summary_doc plus repro_bundles, repro_dir and exit, and exhaustive with
--exhaustive: cli/exhaustive.py's sweep_after_run); exit 1 when any case is bad."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from rlx_conformance.backends import get_backend
from rlx_conformance.cli import _output as out
from rlx_conformance.cli.exhaustive import add_run_option as add_exhaustive_option
from rlx_conformance.cli.exhaustive import sweep_after_run
from rlx_conformance.cli._graphs import add_graphs_option, graphs_only, find_graph_cases, graph_cases
from rlx_conformance.cli.options import (
    add_grad_option,
    add_layouts_option,
    add_skip_shapes_option,
    add_sample_grad_option,
    add_matrix_options,
    add_timeout_options,
    check_timeouts,
    find_cases,
    grads,
    layout_cases,
    parse_shard,
    print_summary,
    progress,
    sample,
    split,
    summary_doc,
    targets,
    tf32_run,
)
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.graphs import is_graph
from rlx_conformance.generate.matrix import Case
from rlx_conformance.run import worker
from rlx_conformance.run.session import (
    build_cases,
    default_report_dir,
    execute,
    resume_cases,
    selection,
    thin_variants,
    skip_shapes,
)


def select_cases(args: argparse.Namespace) -> list[Case]:
    """The cases ``run ARGS`` selects before --shard and --sample take their part: by --case ids,
    else the matrix's (or the graphs' alone for ``--ops 'graph:*'``) with their layout and graph
    cases, --no-forward, --sample-grad and --skip-shapes applied (benchmarks/bench_cold.py builds
    its runs with it too)."""
    if args.case:
        graph_ids = [c for c in args.case if is_graph(c)]
        op_ids = [c for c in args.case if not is_graph(c)]
        return (find_cases(op_ids) if op_ids else []) + find_graph_cases(graph_ids)
    kinds = grads(args)
    if graphs_only(args):  # --ops 'graph:*': the graph cases alone
        cases = graph_cases(args)
    else:
        cases = build_cases(targets(args), split(args.ops), split(args.dtypes), tf32=args.tf32, grads=kinds,
                            layouts=args.layouts)
        cases = layout_cases(args, cases) + graph_cases(args)
    if args.no_forward:
        if not kinds:
            raise RlxError("--no-forward runs the derivative cases alone; --grad none leaves none")
        cases = [c for c in cases if c.grad]
    return skip_shapes(thin_variants(cases, args.sample_grad), split(args.skip_shapes))


def cmd_run(args) -> int:
    if args.repeat < 1 or args.sample < 1 or args.sample_grad < 1:
        raise RlxError("--repeat, --sample and --sample-grad want a count >= 1")
    check_timeouts(args)
    if args.workers != 0:
        worker.prestart()  # the workers' forkserver imports while the cases are generated
    kinds = grads(args)
    cases = select_cases(args)
    chosen = selection(cases, ops=split(args.ops), dtypes=split(args.dtypes), tf32=args.tf32,
                       sample=args.sample, case_ids=args.case, grads=kinds,
                       forward=not (args.no_forward and not args.case),
                       layouts="none" if args.case else args.layouts,
                       sample_grad=1 if args.case else args.sample_grad,
                       skipped_shapes=None if args.case else split(args.skip_shapes))  # before the shard takes its part
    if args.no_contiguous and not args.case:
        chosen["contiguous"] = False
    if not args.case:  # --graphs as it applied (all, none or globs; --case: the ids say): diff
        # compares a run over the graphs it held, merge refuses shards whose graphs differ
        chosen["graphs"] = args.graphs if args.graphs is not None else ("none" if args.ops else "all")
    shard = None
    if args.shard:
        i, n = parse_shard(args.shard)
        cases = [c for k, c in enumerate(cases) if k % n == i - 1]
        shard = f"{i}/{n}"
    if args.sample > 1:
        cases = sample(cases, args.sample)
    if not cases:
        raise RlxError("no cases selected")
    tf32 = tf32_run(args, cases)
    for name in sorted({c.target.backend for c in cases}):
        for why in get_backend(name).environment_warnings({c.target for c in cases if c.target.backend == name}):
            print(f"warning: {why}", file=sys.stderr)
    prior, prior_wall = [], 0.0
    if args.resume:
        if args.report or args.repeat > 1:
            raise RlxError("--resume DIR writes into DIR and does not combine with --report or --repeat")
        report = Path(args.resume)
        try:
            prior_meta, prior = res.load_resumable(report)
        except ValueError as e:
            raise RlxError(str(e)) from None
        prior_wall = prior_meta.get("wall_s") or 0.0
        cases = resume_cases(cases, prior)
        print(f"resuming {report}: {len(prior)} case(s) kept, {len(cases)} to run", file=sys.stderr)
    else:
        report = Path(args.report) if args.report else default_report_dir()
    counts: Counter[str] = Counter()
    with progress(len(cases) * args.repeat, enabled=not args.no_progress and sys.stderr.isatty()) as bar:
        def on_result(r: res.CaseResult) -> None:
            counts[r.outcome] += 1
            bar(r, counts)
        try:
            run = execute(cases, report, workers=args.workers, timeout=args.timeout, on_result=on_result,
                          strict_divergences=not (args.case or args.shard or args.sample > 1),
                          repeat=args.repeat, bundles=not args.no_bundles, shard=shard,
                          prior=prior, prior_wall_s=prior_wall, selection=chosen,
                          timeout_floor=args.timeout_floor, max_failures=args.max_consecutive_failures, **tf32)
        except KeyboardInterrupt:
            print(f"interrupted: partial results in {report / 'results.json'}", file=sys.stderr)
            return 130
    code = 1 if run.failed else 0
    n_bundles = sum(1 for r in run.results if r.repro)
    if args.format == "json":
        sweep = sweep_after_run(args, report) if args.exhaustive else None  # exhaustive.py: run --exhaustive
        code = max(code, sweep["exit"] if sweep else 0)
        out.emit_json("run", {**summary_doc(run), "repro_bundles": n_bundles,
                              "repro_dir": str(report / "repro") if n_bundles else None, "exit": code,
                              **({"exhaustive": sweep} if sweep else {})})
        return code
    print_summary(run, args.show)
    if n_bundles:
        out.line(f"repro bundles: {n_bundles} under {report / 'repro'} (python <bundle>/repro.py)")
    if args.exhaustive:
        code = max(code, sweep_after_run(args, report)["exit"])
    return code



def register(sub) -> None:
    r = sub.add_parser("run", help="run the case matrix (or --case IDs) and write results.json")
    add_matrix_options(r)
    add_grad_option(r)
    add_layouts_option(r)
    add_sample_grad_option(r)
    add_skip_shapes_option(r)
    add_graphs_option(r)
    r.add_argument("--no-forward", action="store_true",
                   help="run only the derivative cases (--grad) of the selection, not the ops themselves")
    r.add_argument("--case", action="append", metavar="ID", help="run exactly this case id (repeatable)")
    r.add_argument("--report", metavar="DIR", help="report directory (default: reports/run-<time>)")
    r.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core); 0 runs in this process, where a case past twice --timeout ends the run (resume with --resume)")
    add_timeout_options(r)
    r.add_argument("--shard", metavar="I/N", help="run only shard I of N (deterministic split)")
    r.add_argument("--resume", metavar="DIR",
                   help="finish the interrupted or killed run in DIR (same options as it had): "
                        "keep its records, run the cases it did not reach, write DIR/results.json")
    r.add_argument("--sample", type=int, default=1, metavar="K",
                   help="run every K-th input set of each op and dtype, all its targets (default 1: all)")
    r.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run each case N times, in different workers where possible, and classify "
                        "bit-stability over repeats and modes (default 1)")
    r.add_argument("--show", type=int, default=25, help="bad cases to list at the end (default 25)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_exhaustive_option(r)
    r.add_argument("--no-bundles", action="store_true",
                   help="no repro bundles (REPORT/repro/<case>/) for the cases that fail the run")
    out.add_format_option(r, help="text (default) or json: the summary as one document on stdout "
                                  "(schema rlx-conformance/run/v1: options.summary_doc, plus "
                                  "repro_bundles, repro_dir, exit), every bad case listed")
    r.set_defaults(fn=cmd_run)
