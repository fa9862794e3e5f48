"""Options and output shared by several commands: matrix selection (--backend/--device/--mode/
--ops/--dtypes/--tf32, --grad: add_grad_option, --layouts: add_layouts_option, the devices
checked against this machine: check_devices), the time limits (--timeout, --timeout-floor,
--max-consecutive-failures: add_timeout_options), case ids (find_cases), sharding and sampling,
the progress bar and the end-of-run summary (text through cli/_output.py, or summary_doc for
--format json)."""
from __future__ import annotations

import argparse
import difflib
import sys
from collections import Counter
from collections.abc import Sequence

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)

from rlx_conformance.backends import get_backend
from rlx_conformance.cli import _output as out
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.layouts import LAYOUT_SETTINGS
from rlx_conformance.generate.matrix import DTYPE_ABBREVIATIONS, Case, Target
from rlx_conformance.judge.stability import classify, summary_line
from rlx_conformance.run.runner import (
    DEFAULT_MAX_FAILURES,
    DEFAULT_TIMEOUT,
    JIT_ALLOWANCE,
    KERNEL_FLOOR,
    REFERENCE_FACTOR,
)
from rlx_conformance.run.session import (
    backend_targets,
    build_cases,
    find_case,
    grad_kinds,
)

# --sample-grad in tox -e mlx (tox.ini): see session.thin_variants and README, Speed
SAMPLE_GRAD_TOX = 8
# --skip-shapes in tox -e mlx (tox.ini) and the tests' matrix (tests/conformance.toml): the
# 10^6-element families run in the nightly; the 2^17-element rows where the accumulation value
# classes start stay (session.skip_shapes; README, Speed)
SKIP_SHAPES_TOX = "huge"

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


def add_timeout_options(p: argparse.ArgumentParser) -> None:
    """--timeout, --timeout-floor and --max-consecutive-failures: how long a case may run and when
    a kernel that keeps crashing or hanging is stopped (run/runner.py)."""
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="S",
                   help="the most seconds a case may take, the harness's own work included; a "
                        "timed-out case is retried once, in a fresh worker, unless its kernel's "
                        f"previous case crashed or timed out too (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--timeout-floor", type=float, default=None, metavar="S",
                   help="the kernel call's limit is the larger of this floor and "
                        f"{REFERENCE_FACTOR:g}x the reference's time on the same inputs, at most "
                        "--timeout (default: " + ", ".join(f"{v:g} s on {d}" for d, v in KERNEL_FLOOR.items())
                        + ", plus " + ", ".join(f"{v:g} s on {d}" for d, v in JIT_ALLOWANCE.items())
                        + " for a compiled target's first JIT compile)")
    p.add_argument("--max-consecutive-failures", type=int, default=DEFAULT_MAX_FAILURES, metavar="K",
                   help="after K consecutive crashes or timeouts of one kernel (an op on a target), "
                        "its remaining cases are not run (outcome not-run; the run fails); 0: never "
                        f"stop (default {DEFAULT_MAX_FAILURES})")


def check_timeouts(args) -> None:
    """The timeout options' values (a usage error, exit 2, when out of range)."""
    if args.timeout <= 0 or (args.timeout_floor is not None and args.timeout_floor <= 0):
        raise RlxError("--timeout and --timeout-floor want seconds > 0")
    if args.max_consecutive_failures < 0:
        raise RlxError("--max-consecutive-failures wants a count >= 0 (0: never stop)")


def add_grad_option(p: argparse.ArgumentParser) -> None:
    """--grad: which derivative cases (issue 16) join the forward ones (session.grad_kinds)."""
    p.add_argument("--grad", default="all", metavar="KINDS",
                   help="derivative cases to run besides the forward ones: all (default), none, "
                        "or kinds among vjp, jvp, hvp, comma-separated")


def add_sample_grad_option(p: argparse.ArgumentParser) -> None:
    """--sample-grad: 1 in K input sets of the derivative and layout cases (session.thin_variants)."""
    p.add_argument("--sample-grad", type=int, default=1, metavar="K",
                   help="run 1 in K input sets (by a hash of the case id) of each derivative kind and "
                        "memory layout, at least one of each op x dtype x kind x layout; every forward "
                        f"case still runs (default 1: all; tox -e mlx uses {SAMPLE_GRAD_TOX})")


def add_skip_shapes_option(p: argparse.ArgumentParser) -> None:
    """--skip-shapes: leave out shape families by name (session.skip_shapes)."""
    p.add_argument("--skip-shapes", action="append", default=None, metavar="GLOB[,GLOB]",
                   help="leave out the cases of the shape families with these names (cases/shapes/*.toml; "
                        f"globs, repeatable, comma-separated; default: none; tox -e mlx uses {SKIP_SHAPES_TOX}, whose "
                        "10^6-element operands run in the nightly)")


def add_layouts_option(p: argparse.ArgumentParser, default: str = "default") -> None:
    """--layouts: which forward cases also run with their inputs as views (issue 17:
    layouts.LAYOUTS, matrix.generate), and --no-contiguous: those cases alone."""
    p.add_argument("--layouts", default=default, choices=LAYOUT_SETTINGS,
                   help="memory layouts (transposed, strided, offset, reversed, broadcast, mixed "
                        "views of the inputs) besides the contiguous cases: none; default, each layout "
                        "once per op and shape family; all, every forward case in every layout "
                        f"(default: {default})")
    p.add_argument("--no-contiguous", action="store_true",
                   help="only the layout cases (--layouts), not the contiguous ones (nor derivatives)")


def layout_cases(args, cases: list[Case]) -> list[Case]:
    """``cases`` less the contiguous ones under --no-contiguous (a usage error with --layouts none)."""
    if not getattr(args, "no_contiguous", False):
        return cases
    if args.layouts == "none":
        raise RlxError("--no-contiguous runs the layout cases alone; --layouts none leaves none")
    return [c for c in cases if c.layout]


def grads(args) -> tuple[str, ...]:
    """The derivative kinds of --grad (a bad word is a one-line usage error)."""
    return grad_kinds(args.grad)


_WARNED: set[str] = set()  # device warnings already printed by this process


def check_devices(backend: str, devices: str | Sequence[str]) -> str | list[str]:
    """``devices`` (a name, names or "all") after checking them against this machine: a device
    asked for by name that the machine lacks (``gpu`` without an MLX GPU) is a usage error
    (RlxError: one line, exit 2), not a run whose cases all skip; "all" runs the devices the
    machine has and says on stderr which it skips. Unknown names are left to backend_targets."""
    b = get_backend(backend)
    here = b.devices()
    if devices == "all":
        lacking = [d for d in b.all_devices() if d not in here]
        warning = (f"warning: {backend}: this machine has no {', '.join(lacking)}: skipped "
                   f"(running {', '.join(here)})")
        if lacking and warning not in _WARNED:  # once a process (run --exhaustive asks twice)
            _WARNED.add(warning)
            print(warning, file=sys.stderr)
        return devices
    names = [devices] if isinstance(devices, str) else list(devices)
    lacking = [d for d in names if d in b.all_devices() and d not in here]
    if lacking:
        raise RlxError(f"{backend}: this machine has no {', '.join(lacking)} (it has {', '.join(here)}); "
                       "--device all runs the devices it has")
    return names


def find_cases(ids: Sequence[str]) -> list[Case]:
    """The cases of these ids (``run --case``, ``repro``), dtype abbreviations accepted (f16,
    bf16: matrix.DTYPE_ABBREVIATIONS), each device checked against this machine; an id the
    matrix lacks is an error naming the closest ids of its op and target."""
    cases = []
    for case_id in ids:
        parts = case_id.strip().split("/")
        if len(parts) >= 4:
            parts[1] = DTYPE_ABBREVIATIONS.get(parts[1].lower(), parts[1])
        wanted = "/".join(parts)
        try:
            c = find_case(wanted)
        except RlxError as e:
            if not str(e).startswith("no case with id"):
                raise
            raise RlxError(f"{e}{_close_ids(wanted)}") from None
        check_devices(c.target.backend, c.target.device)
        cases.append(c)
    return cases


def _close_ids(case_id: str) -> str:
    """' (did you mean ...?)' with the ids of the same op and target closest to ``case_id``."""
    parts = case_id.split("/")
    t = Target.parse(parts[-1])
    ids = [c.id for c in build_cases([Target(t.backend, t.device, t.mode)], ops=[parts[0]],
                                     tf32="both" if t.variant else None, grads=grad_kinds("all"))]
    close = difflib.get_close_matches(case_id, ids, n=3, cutoff=0.8)
    return f" (did you mean {' or '.join(out.quote(i) for i in close)}?)" if close else ""


def targets(args) -> list[Target]:
    """The targets of --backend/--device/--mode, the devices checked against this machine."""
    modes = args.mode if args.mode in (None, "all") else split([args.mode])
    return backend_targets(args.backend, check_devices(args.backend, args.device), modes)


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


def bad_results(run) -> list[res.CaseResult]:
    """The cases that fail the run, in run order."""
    return [r for r in run.results if r.outcome in res.RUN_FAILING]


def _by_op(run) -> dict[str, dict[str, int]]:
    """Per op, the counts of its still-failing outcomes (known divergences included)."""
    per_op = Counter((r.op, r.outcome) for r in run.results if r.outcome in STILL_FAILING)
    out: dict[str, dict[str, int]] = {}
    for (op, o), n in sorted(per_op.items()):
        out.setdefault(op, {})[o] = n
    return out


def summary_doc(run, show: int | None = None) -> dict:
    """The end-of-run summary as data (``run --format json``, schema rlx-conformance/run/v1):
    ``summary`` (counts per outcome and ``total``), ``wall_s``, ``bad_total`` and ``bad`` (the
    first ``show`` bad cases, all when None: id, outcome, message, max_ulp, max_abs_err,
    max_rel_err, repro, rerun), ``by_op`` (per op, its still-failing outcome counts),
    ``stability`` (class counts), ``kernels_not_builtin``, ``warnings``, ``results`` (path)."""
    bad = bad_results(run)
    return {
        "summary": res.summarize(run.results),
        "wall_s": run.meta.get("wall_s", 0),
        "bad_total": len(bad),
        "bad": [{"id": r.id, "outcome": r.outcome, "message": r.message, "max_ulp": r.max_ulp,
                 "max_abs_err": r.max_abs_err, "max_rel_err": r.max_rel_err, "repro": r.repro,
                 "rerun": out.rerun_command(r.id)} for r in (bad if show is None else bad[:show])],
        "by_op": _by_op(run),
        "stability": classify(run.results)["counts"],
        "kernels_not_builtin": [{"op": op, "backend": b, "origin": o} for op, b, o in _origins(run)],
        "warnings": list(run.meta.get("warnings", [])),
        "results": str(run.path) if run.path else None,
    }


def _origins(run) -> list[tuple[str, str, str]]:
    # kernels from entry points (rlx_conformance.kernels) or validate --kernel
    return sorted({(r.op, r.backend, r.origin) for r in run.results if r.origin != "builtin"})


def excused_line(results: Sequence[res.CaseResult]) -> str:
    """How many cases known divergences excused, by how many entries, per category (largest
    first); empty when none did."""
    xf = [r for r in results if r.outcome == "xfail"]
    if not xf:
        return ""
    div = [r.divergence or {} for r in xf]
    cats = Counter(d.get("category") or "uncategorised" for d in div)
    entries = {d.get("entry") for d in div if d.get("entry")}
    per = ", ".join(f"{c} {n}" for c, n in sorted(cats.items(), key=lambda kv: (-kv[1], kv[0])))
    return (f"{len(xf)} xfail: excused by {len(entries)} known divergence(s) ({per}); "
            "per op and entry in results.json and its HTML report")


def print_summary(run, show: int) -> None:
    """The end-of-run summary for terminals and logs: each bad case's outcome and id on a line
    of its own with its errors and message under it, a table of the failing outcomes of the ops
    that have one, a line for the cases known divergences excused, the counts, and the command
    that reruns one case, never wrapped."""
    summary = res.summarize(run.results)
    bad = bad_results(run)
    if bad:
        out.line(f"{len(bad)} bad case(s) (first {min(show, len(bad))}; all of them in results.json):")
        for r in bad[:show]:
            errors = out.errors_text(r.max_ulp, r.max_abs_err, r.max_rel_err)
            out.case_item(r.outcome, r.id, ([errors] if errors else []) + out.message_lines(r.message))
    # the table: the ops with an outcome that fails the run (their excused cases beside them);
    # the excused cases of the others are one line, by category (a green run's table of dozens
    # of xfail-only ops said nothing the line does not; results.json and `report` hold them all)
    by_op = {op: c for op, c in _by_op(run).items() if any(o in c for o in res.RUN_FAILING)}
    if by_op:
        cols = [o for o in STILL_FAILING if any(o in c for c in by_op.values())]
        out.table("by op", ["op", *cols],
                  [[op, *(str(c.get(o, "")) for o in cols)] for op, c in by_op.items()], right=cols)
    excused = excused_line(run.results)
    if excused:
        out.line(excused)
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary[o]]
    out.line(f"{summary['total']} cases in {run.meta.get('wall_s', 0):.1f} s: " + ", ".join(parts))
    out.line(summary_line(classify(run.results)))
    origins = _origins(run)
    if origins:
        out.line("kernels not built in:")
        for op, b, o in origins:
            out.line(f"  {op} on {b} from {o}")
    for w in run.meta.get("warnings", []):
        out.line(f"warning: {w}")
    if bad:
        out.line("rerun one case:")
        out.line(f"  {out.rerun_command(bad[0].id)}")
    if run.path:
        out.line(f"results: {run.path}")
