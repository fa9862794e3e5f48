"""The command line: ``rlx-conformance run | ops | list`` here, further subcommands in
``rlx_conformance/cli/``. Bad input gets one line on stderr and
exit status 2; a run exits 1 when any case failed, errored, crashed, timed out or xpassed."""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RegistrationError, RlxError


def _split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [p for v in values for p in v.split(",") if p]


def _add_matrix_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="mlx", help="backend under test (default: mlx)")
    p.add_argument("--device", default="cpu", help="cpu, gpu or all (default: cpu)")
    p.add_argument("--mode", default=None, help="eager, lazy, compiled or all "
                   "(default: $RLX_MLX_MODE, else compiled)")
    p.add_argument("--ops", "--op", action="append", metavar="GLOB", help="op name globs (repeatable, comma-separated)")
    p.add_argument("--dtypes", action="append", metavar="GLOB", help="dtype globs")
    p.add_argument("--tf32", choices=("on", "off", "both"), default=None,
                   help="MLX_ENABLE_TF32 for the workers; the float32 matmul/conv family on a GPU "
                        "runs as target variant tf32:on / tf32:off, both ways with 'both' "
                        "(default: as the environment says)")


def _targets(args):
    from rlx_conformance.run.session import backend_targets

    modes = args.mode if args.mode in (None, "all") else _split([args.mode])
    return backend_targets(args.backend, args.device, modes)


def cmd_run(args) -> int:
    from rlx_conformance.run.session import build_cases, default_report_dir, execute, find_case, resume_cases

    if args.repeat < 1 or args.sample < 1:
        raise RlxError("--repeat and --sample want a count >= 1")
    if args.case:
        cases = [find_case(i) for i in args.case]
    else:
        cases = build_cases(_targets(args), _split(args.ops), _split(args.dtypes), tf32=args.tf32)
    shard = None
    if args.shard:
        i, n = _parse_shard(args.shard)
        cases = [c for k, c in enumerate(cases) if k % n == i - 1]
        shard = f"{i}/{n}"
    if args.sample > 1:
        cases = _sample(cases, args.sample)
    if not cases:
        raise RlxError("no cases selected")
    tf32 = _tf32_run(args, cases)
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
    progress = _progress(len(cases) * args.repeat, enabled=not args.no_progress and sys.stderr.isatty())
    with progress as bar:
        def on_result(r: res.CaseResult) -> None:
            counts[r.outcome] += 1
            bar(r, counts)
        try:
            run = execute(cases, report, workers=args.workers, timeout=args.timeout, on_result=on_result,
                          strict_divergences=not (args.case or args.shard or args.sample > 1),
                          repeat=args.repeat, bundles=not args.no_bundles, shard=shard,
                          prior=prior, prior_wall_s=prior_wall, **tf32)
        except KeyboardInterrupt:
            print(f"interrupted: partial results in {report / 'results.json'}", file=sys.stderr)
            return 130
    _print_summary(run, args.show)
    n_bundles = sum(1 for r in run.results if r.repro)
    if n_bundles:
        print(f"repro bundles: {n_bundles} under {report / 'repro'} (python <bundle>/repro.py)")
    return 1 if run.failed else 0


def _tf32_run(args, cases) -> dict:
    """execute() options for --tf32: the workers' MLX_ENABLE_TF32 (on/off: the whole run; both:
    per case, from its variant) and what the run metadata says about it."""
    variants = sorted({c.target.variant for c in cases if c.target.variant.startswith("tf32:")})
    meta = {"tf32": {"option": args.tf32 or "env", "variants": variants}}
    if args.tf32 in ("on", "off"):
        return {"env": {"MLX_ENABLE_TF32": "1" if args.tf32 == "on" else "0"}, "meta": meta}
    return {"meta": meta}


def _sample(cases, k: int):
    """Every k-th input set of each (op, dtype), with all of its targets (the modes of one input
    set are compared bit-wise), so every (op, dtype) keeps at least one."""
    seen: dict[tuple[str, str], dict[str, int]] = {}
    keep = []
    for c in cases:
        ids = seen.setdefault((c.op, c.dtype), {})
        if ids.setdefault(c.input_id, len(ids)) % k == 0:
            keep.append(c)
    return keep


def _parse_shard(s: str) -> tuple[int, int]:
    try:
        i, n = (int(v) for v in s.split("/"))
        if not 1 <= i <= n:
            raise ValueError
        return i, n
    except ValueError:
        raise RlxError(f"--shard wants I/N with 1 <= I <= N, got {s!r}") from None


class _Progress:
    """A rich progress bar with live outcome counts; silent when stderr is not a terminal."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled

    def __enter__(self):
        if not self.enabled:
            return lambda r, counts: None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._p = Progress(TextColumn("[bold]cases"), BarColumn(), MofNCompleteColumn(),
                           TimeRemainingColumn(), TextColumn("{task.description}"), transient=True)
        self._p.__enter__()
        task = self._p.add_task("", total=self.total)

        def update(r, counts):
            bad = sum(counts[o] for o in res.BAD)
            self._p.update(task, advance=1, description=f"pass {counts['pass']}  bad {bad}  {r.op}")
        return update

    def __exit__(self, *exc):
        if self.enabled:
            self._p.__exit__(*exc)
        return False


def _progress(total: int, enabled: bool) -> _Progress:
    return _Progress(total, enabled)


def _print_summary(run, show: int) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, highlight=False)
    summary = res.summarize(run.results)
    bad = [r for r in run.results if r.outcome in res.BAD]
    if bad:
        t = Table(title=f"{len(bad)} bad case(s) (first {min(show, len(bad))})", show_lines=False)
        for col in ("outcome", "case id", "max ulp", "message"):
            t.add_column(col, overflow="fold")
        for r in bad[:show]:
            t.add_row(r.outcome, r.id, "" if r.max_ulp is None else f"{r.max_ulp:g}", r.message.splitlines()[0][:160] if r.message else "")
        console.print(t)
    per_op = Counter((r.op, r.outcome) for r in run.results if r.outcome in res.BAD + ("xfail",))
    if per_op:
        ops = sorted({op for op, _ in per_op})
        console.print("by op: " + ", ".join(
            f"{op} ({', '.join(f'{o} {n}' for (p, o), n in sorted(per_op.items()) if p == op)})" for op in ops))
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary[o]]
    console.print(f"{summary['total']} cases in {run.meta.get('wall_s', 0):.1f} s: " + ", ".join(parts))
    from rlx_conformance.judge.stability import classify, summary_line

    console.print(summary_line(classify(run.results)))
    origins = sorted({(r.op, r.backend, r.origin) for r in run.results if r.origin != "builtin"})
    if origins:  # kernels from entry points (rlx_conformance.kernels) or validate --kernel
        console.print("kernels not built in: " + "; ".join(f"{op} on {b} from {o}" for op, b, o in origins))
    for w in run.meta.get("warnings", []):
        console.print(f"warning: {w}")
    if run.path:
        console.print(f"results: {run.path}")


def cmd_ops(args) -> int:
    from rlx_conformance.backends import BACKENDS, get_backend

    from rlx_conformance.spec.registry import all_ops

    backends = {}
    for name in BACKENDS:
        try:
            backends[name] = get_backend(name)
        except RegistrationError:
            raise  # a kernel that does not fit (an entry point's): not "backend not installed"
        except RlxError:
            pass
    rows = []
    for spec in all_ops():
        row = {"name": spec.name, "family": spec.family, "doc": spec.doc,
               "inputs": [{"name": i.name, "role": i.role,
                           "dtypes": list(spec.dtypes) if i.dtypes == "T" else list(i.dtypes),
                           "variadic": i.variadic} for i in spec.inputs],
               "attrs": [{"name": a.name, "kind": a.kind,
                          "default": None if repr(a.default) == "REQUIRED" else _jsonable(a.default),
                          "required": repr(a.default) == "REQUIRED",
                          "choices": list(a.choices) if a.choices else None} for a in spec.attrs],
               "dtypes": list(spec.dtypes), "backends": {}}
        for bname, b in backends.items():
            e = b.kernels.get(spec.name)
            row["backends"][bname] = None if e is None else {
                "kernel": "native" if e.native else "delegated", "origin": e.origin, "note": e.note,
                "devices": {d: [t for t in spec.dtypes if t in ds] for d, ds in e.dtypes.items()}}
        rows.append(row)
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{len(rows)} ops")
    t.add_column("op")
    t.add_column("family")
    for bname in backends:
        t.add_column(bname)
    for row in rows:
        cells = []
        for bname in backends:
            b = row["backends"][bname]
            if b is None:
                cells.append("—")
                continue
            devs = "; ".join(f"{d}: {len(ds)}/{len(row['dtypes'])} dtypes" for d, ds in b["devices"].items())
            cells.append(f"{b['kernel']} ({devs})" + ("" if b["origin"] == "builtin" else f" [{b['origin']}]"))
        t.add_row(row["name"], row["family"], *cells)
    Console().print(t)
    return 0


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def cmd_list(args) -> int:
    from rlx_conformance.run.session import build_cases

    for c in build_cases(_targets(args), _split(args.ops), _split(args.dtypes), tf32=args.tf32):
        print(c.id)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlx-conformance", description=(
        "Differential conformance harness: runs the op matrix on a backend and on the CPU reference."))
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run the case matrix (or --case IDs) and write results.json")
    _add_matrix_options(r)
    r.add_argument("--case", action="append", metavar="ID", help="run exactly this case id (repeatable)")
    r.add_argument("--report", metavar="DIR", help="report directory (default: reports/run-<time>)")
    r.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core)")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds a case may run before it is killed (default 60)")
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
    r.add_argument("--no-bundles", action="store_true",
                   help="no repro bundles (REPORT/repro/<case>/) for the cases that fail the run")
    r.set_defaults(fn=cmd_run)
    o = sub.add_parser("ops", help="list the registry's ops with per-backend support")
    o.add_argument("--format", choices=("table", "json"), default="table")
    o.set_defaults(fn=cmd_ops)
    ls = sub.add_parser("list", help="print the case ids of the matrix")
    _add_matrix_options(ls)
    ls.set_defaults(fn=cmd_list)
    for mod in _command_modules():
        mod.register(sub)
    return p


def _command_modules():
    """Further subcommands live one per module in rlx_conformance/cli/, each with a
    ``register(subparsers)`` that adds its parser and sets ``fn``; they are found, not listed."""
    import importlib
    import pkgutil

    from rlx_conformance import cli as commands

    return [importlib.import_module(f"{commands.__name__}.{m.name}")
            for m in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name)
            if not m.name.startswith("_") and m.name not in ("main", "options")]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except RlxError as e:
        print(f"rlx-conformance: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
