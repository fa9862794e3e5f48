"""Options and output shared by several commands: matrix selection (--backend/--device/--mode/
--ops/--dtypes/--tf32), sharding and sampling, the progress bar and the end-of-run summary."""
from __future__ import annotations

import argparse
from collections import Counter

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.stability import classify, summary_line
from rlx_conformance.run.session import backend_targets

# Still failing, known divergences included (a run fails only on core.results.RUN_FAILING):
# what `repro` exits 1 on and what the end-of-run summary counts per op.
STILL_FAILING = res.RUN_FAILING + ("xfail",)


def split(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [p for v in values for p in v.split(",") if p]


def add_matrix_options(p: argparse.ArgumentParser) -> None:
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


def targets(args):
    modes = args.mode if args.mode in (None, "all") else split([args.mode])
    return backend_targets(args.backend, args.device, modes)


def tf32_run(args, cases) -> dict:
    """execute() options for --tf32: the workers' MLX_ENABLE_TF32 (on/off: the whole run; both:
    per case, from its variant) and what the run metadata says about it."""
    variants = sorted({c.target.variant for c in cases if c.target.variant.startswith("tf32:")})
    meta = {"tf32": {"option": args.tf32 or "env", "variants": variants}}
    if args.tf32 in ("on", "off"):
        return {"env": {"MLX_ENABLE_TF32": "1" if args.tf32 == "on" else "0"}, "meta": meta}
    return {"meta": meta}


def sample(cases, k: int):
    """Every k-th input set of each (op, dtype), with all of its targets (the modes of one input
    set are compared bit-wise), so every (op, dtype) keeps at least one."""
    seen: dict[tuple[str, str], dict[str, int]] = {}
    keep = []
    for c in cases:
        ids = seen.setdefault((c.op, c.dtype), {})
        if ids.setdefault(c.input_id, len(ids)) % k == 0:
            keep.append(c)
    return keep


def parse_shard(s: str) -> tuple[int, int]:
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
        self._p = Progress(TextColumn("[bold]cases"), BarColumn(), MofNCompleteColumn(),
                           TimeRemainingColumn(), TextColumn("{task.description}"), transient=True)
        self._p.__enter__()
        task = self._p.add_task("", total=self.total)

        def update(r, counts):
            bad = sum(counts[o] for o in res.RUN_FAILING)
            self._p.update(task, advance=1, description=f"pass {counts['pass']}  bad {bad}  {r.op}")
        return update

    def __exit__(self, *exc):
        if self.enabled:
            self._p.__exit__(*exc)
        return False


def progress(total: int, enabled: bool) -> _Progress:
    return _Progress(total, enabled)


def print_summary(run, show: int) -> None:
    console = Console(stderr=False, highlight=False)
    summary = res.summarize(run.results)
    bad = [r for r in run.results if r.outcome in res.RUN_FAILING]
    if bad:
        t = Table(title=f"{len(bad)} bad case(s) (first {min(show, len(bad))})", show_lines=False)
        for col in ("outcome", "case id", "max ulp", "message"):
            t.add_column(col, overflow="fold")
        for r in bad[:show]:
            t.add_row(r.outcome, r.id, "" if r.max_ulp is None else f"{r.max_ulp:g}", r.message.splitlines()[0][:160] if r.message else "")
        console.print(t)
    per_op = Counter((r.op, r.outcome) for r in run.results if r.outcome in STILL_FAILING)
    if per_op:
        ops = sorted({op for op, _ in per_op})
        console.print("by op: " + ", ".join(
            f"{op} ({', '.join(f'{o} {n}' for (p, o), n in sorted(per_op.items()) if p == op)})" for op in ops))
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary[o]]
    console.print(f"{summary['total']} cases in {run.meta.get('wall_s', 0):.1f} s: " + ", ".join(parts))
    console.print(summary_line(classify(run.results)))
    origins = sorted({(r.op, r.backend, r.origin) for r in run.results if r.origin != "builtin"})
    if origins:  # kernels from entry points (rlx_conformance.kernels) or validate --kernel
        console.print("kernels not built in: " + "; ".join(f"{op} on {b} from {o}" for op, b, o in origins))
    for w in run.meta.get("warnings", []):
        console.print(f"warning: {w}")
    if run.path:
        console.print(f"results: {run.path}")


