"""``rlx-conformance validate OP --kernel MODULE:FUNC|path.py:FUNC``: validate a contributed
kernel against the CPU reference (rlx_conformance/run/validate.py) and print the verdict."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlx_conformance.cli import _output as out
from rlx_conformance.cli.options import add_timeout_options, check_devices, check_timeouts, split
from rlx_conformance.core import results as res
from rlx_conformance.run.session import grad_kinds
from rlx_conformance.run.validate import rerun_command, validate

SHOWN = ("pass", "fail", "xfail", "error", "contract", "crash", "timeout", "not-run", "skip")
UNRUN = ("skip", "not-run")  # not counted as run in the tables


def register(sub) -> None:
    p = sub.add_parser("validate", help="validate a contributed kernel for one op: the op's whole "
                       "matrix against the reference, error inputs, speed, optional fuzzing",
                       description="Registers FUNC for OP on the backend for this run only and runs "
                       "OP's case matrix against the CPU reference. Exit 0: every case passes; 1: a "
                       "case fails, errors, breaks the call convention, crashes or times out, an "
                       "error input is accepted, or fuzzing found a failure; 2: usage error. A kernel "
                       "that crashes or hangs on case after case is stopped (--max-consecutive-failures): "
                       "its remaining cases report not-run, and the error inputs, speed and fuzzing are "
                       "skipped.")
    p.add_argument("op", metavar="OP", help="registry op name (rlx-conformance ops)")
    p.add_argument("--kernel", required=True, metavar="MODULE:FUNC|path.py:FUNC",
                   help="the kernel: FUNC(*inputs, **attrs) in an importable module or a .py file")
    p.add_argument("--backend", default="mlx", help="backend the kernel is for (default: mlx)")
    p.add_argument("--device", default="cpu", help="cpu or gpu (default: cpu)")
    p.add_argument("--mode", default=None, help="eager, lazy or compiled (default: $RLX_MLX_MODE, else compiled)")
    p.add_argument("--dtypes", action="append", metavar="GLOB", help="only these dtypes (globs)")
    p.add_argument("--case", action="append", metavar="ID", help="only this case id of OP's matrix (repeatable)")
    p.add_argument("--grad", nargs="?", const="all", default="none", metavar="KINDS",
                   help="the op's derivative cases too, through the kernel (its mx.custom_function VJP/JVP "
                        "if it has one, else MLX's autodiff through it): all kinds the op declares when "
                        "given alone, or some of vjp, jvp, hvp, comma-separated (default: none)")
    p.add_argument("--report", metavar="DIR", help="report directory (default: reports/validate-OP-<time>)")
    p.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="after the matrix, N hypothesis examples of the op's input space (default 0)")
    p.add_argument("--derandomize", action="store_true",
                   help="deterministic fuzzing (for CI; also when $CI is set)")
    p.add_argument("--strict", action="store_true",
                   help="known divergences of the built-in kernel excuse nothing")
    p.add_argument("--speed-cases", type=int, default=8, metavar="K",
                   help="passing cases to time against the built-in kernel and the reference (default 8; 0: none)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: one per core); 0 runs in this process, where a case past twice --timeout ends it")
    add_timeout_options(p)
    p.add_argument("--show", type=int, default=5, help="worst cases to list (default 5)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    out.add_format_option(p)
    p.set_defaults(fn=cmd_validate)


def cmd_validate(args) -> int:
    interactive = not args.no_progress and sys.stderr.isatty()

    def stage(msg: str) -> None:  # one line per stage on a terminal (stderr)
        if interactive:
            print(f"validate: {msg}", file=sys.stderr)

    if args.device != "all":  # validate runs one device; "all" is refused by validate() itself
        check_devices(args.backend, args.device)
    check_timeouts(args)
    try:
        v = validate(args.op, args.kernel, backend=args.backend, device=args.device, mode=args.mode,
                     dtypes=split(args.dtypes), case_ids=args.case, report_dir=Path(args.report) if args.report else None,
                     workers=args.workers, timeout=args.timeout, fuzz=args.fuzz,
                     derandomize=args.derandomize, strict=args.strict, speed_cases=args.speed_cases,
                     on_stage=stage, grads=grad_kinds(args.grad), timeout_floor=args.timeout_floor,
                     max_failures=args.max_consecutive_failures)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    if args.format == "json":  # the document validate.json holds
        out.emit_json("validate", json.loads((v.report_dir / "validate.json").read_text()))
    else:
        print_verdict(v, show=args.show)
    return v.exit_code


def _table(title: str, key: str, v) -> object:
    counts = v.counts(key)
    cols = [o for o in SHOWN if o in ("pass", "fail") or any(c[o] for c in counts.values())]
    t = Table(title=title, title_justify="left")
    t.add_column({"dtype": "dtype", "grad": "derivative"}.get(key, "shape family"))
    t.add_column("run", justify="right")
    for o in cols:
        t.add_column(o, justify="right", style="red" if o in res.RUN_FAILING else None)
    for name in sorted(counts, key=lambda k: (-sum(counts[k].values()), k)) if key == "family" else counts:
        c = counts[name]
        run = sum(n for o, n in c.items() if o not in UNRUN)
        t.add_row(name or "forward", str(run), *[str(c[o]) if c[o] else "" for o in cols])
    return t


def _attr_table(v) -> object | None:
    """Outcome counts per attribute value (only attributes that take several values), so that
    "every batch_dims > 0 case fails and every batch_dims = 0 passes" reads off one table."""
    by = {k: vals for k, vals in v.attr_counts().items() if len(vals) > 1}
    if not by:
        return None
    rows = [(f"{k}={val}", c) for k, vals in by.items() for val, c in vals.items()]
    cols = [o for o in SHOWN if o in ("pass", "fail") or any(c[o] for _, c in rows)]
    t = Table(title="by attribute value", title_justify="left")
    t.add_column("attribute")
    t.add_column("run", justify="right")
    for o in cols:
        t.add_column(o, justify="right", style="red" if o in res.RUN_FAILING else None)
    for name, c in rows:
        t.add_row(name, str(sum(n for o, n in c.items() if o not in UNRUN)), *[str(c[o]) if c[o] else "" for o in cols])
    return t


def _line(console, text: str, indent: int = 0) -> None:
    """A line that must stay whole and copyable at any width (a case id, a command, a path):
    never wrapped, never cut, no markup read into it."""
    out.line(" " * indent + text)


def _figures(r) -> str:
    """The measured errors of a failing case in words: wrong positions for a bit-exact or integer
    output (a ULP distance says nothing there), ULP/relative/absolute for a rounded one, and the
    NaN/inf mismatches apart."""
    m = r.mismatch or {}
    kinds = ", ".join(f"{k} {n}" for k, n in (m.get("kinds") or {}).items())
    exact = bool(m.get("exact"))
    parts = []
    if m:
        parts.append(f"{m['count']}/{m['checked']} elements wrong" + (f" ({kinds})" if kinds else ""))
    if r.nonfinite_mismatches:
        parts.append(f"NaN/inf mismatches {r.nonfinite_mismatches}")
    if not exact:
        parts.append(f"max abs {_fmt(r.max_abs_err)}, max rel {_fmt(r.max_rel_err)}, max ulp {_fmt(r.max_ulp)}")
    return "; ".join(parts)


def _positions(console, r, indent: int) -> None:
    for row in (r.mismatch or {}).get("first", []):
        vals = [f"reference {row['expected']}"] if "expected" in row else []
        if "builtin" in row:
            vals.append(f"built-in {row['builtin']}")
        if "actual" in row:
            vals.append(f"contributed {row['actual']}")
        # a derivative case's row names its derivative (run.validate.derivative_label)
        at = f"{row.get('of') or 'output ' + str(row.get('output'))} at {tuple(row['at'])}"
        _line(console, f"{at}: {', '.join(vals)}" + (f"  <- {row['from']}" if row.get("from") else ""), indent)


def _fmt(x) -> str:
    if x is None:
        return ""
    x = float(x)
    if math.isnan(x):
        return "nan"
    return f"{x:.3g}"


def _ms(s) -> str:
    return "—" if s is None else (f"{s * 1e3:.3g} ms" if s >= 1e-4 else f"{s * 1e6:.3g} µs")


def print_verdict(v, show: int = 5) -> None:
    console = Console(highlight=False)
    if not console.is_terminal:  # a log or a pipe: room for case ids
        console.width = 140
    summary = res.summarize(v.results)
    console.print(f"[bold]validate {v.op}[/bold] — kernel {escape(v.origin)} on {v.target} "
                  f"({summary['total']} cases, {v.wall_s:.1f} s)", soft_wrap=True)
    console.print(_table("by dtype", "dtype", v))
    console.print(_table("by shape family", "family", v))
    if v.grads:
        console.print(_table("by derivative", "grad", v))
    attrs = _attr_table(v)
    if attrs is not None:
        console.print(attrs)

    # Case ids and commands on lines of their own, never wrapped or cut (copyable at any width).
    worst = v.worst(show)
    if worst:
        nfail = sum(1 for r in v.results if r.outcome == "fail")
        nx = sum(1 for r in worst if r.outcome == "xfail")
        console.print(f"[bold]worst errors[/bold] ({nfail} numeric failure(s) first"
                      + (", then excused ones" if nx else "") + "; NaN/inf: elements whose NaN/inf "
                      "pattern differs from the reference's, whatever the error figures say)")
        for i, r in enumerate(worst, 1):
            _line(console, f"{i}. {r.id}" + (" (xfail)" if r.outcome == "xfail" else ""))
            _line(console, _figures(r), 3)
            wrong = (r.mismatch or {}).get("derivatives")
            if wrong:
                _line(console, "wrong derivative: " + ", ".join(wrong), 3)
            for m in out.message_lines(r.message):
                _line(console, m, 3)
            _positions(console, r, 3)
            if r.outcome == "fail":
                _line(console, "rerun: " + rerun_command(r), 3)
    unrun = [r for r in v.bad_cases if r.outcome == "not-run"]
    if unrun:  # one reason for them all: said once, not per case
        _line(console, f"{len(unrun)} case(s) not run: {unrun[0].message.removeprefix('not run: ')}")
    other = [r for r in v.bad_cases if r.outcome not in ("fail", "not-run")]
    if other:
        console.print(f"[bold]{len(other)} case(s) that did not compute a comparable result[/bold]")
        for r in other[:show]:
            _line(console, f"{r.outcome}: {r.id}")
            for m in out.message_lines(r.message):
                _line(console, m, 3)
            _line(console, "rerun: " + rerun_command(r), 3)
            if r.repro:
                _line(console, f"bundle: {v.report_dir / r.repro / 'repro.py'}", 3)

    if v.stopped:
        console.print("error-input parity, speed and fuzzing: skipped (the kernel was stopped, above)")
    elif v.error_probes:
        t = Table(title="error-input parity", title_justify="left")
        for col in ("error input", "harness pre-validation", "kernel alone", "verdict"):
            t.add_column(col, overflow="fold")
        for p in v.error_probes:
            t.add_row(p.description, "rejects" if p.harness else "accepts", p.kernel[:90],
                      p.verdict if p.ok else f"[red]{p.verdict}[/red]")
        console.print(t)
    else:
        console.print(f"error-input parity: {v.op} declares no error inputs")

    sp = v.speed
    if sp.get("cases"):
        t = Table(title=f"speed: {len(sp['cases'])} passing case(s), median per call after a warm-up "
                  f"(matrix total in the kernel: {sp['matrix_backend_s']:.3g} s)", title_justify="left")
        for col in ("against", "cases", "its time", "contributed", "contributed ÷ it (geomean, range)"):
            t.add_column(col)
        for other, label in (("builtin", "built-in kernel"), ("reference", "CPU reference")):
            s = sp.get(other)
            if s is None:
                t.add_row(label, "0", "—", "—", "no built-in kernel" if other == "builtin" else "—")
                continue
            t.add_row(label, str(s["cases"]), _ms(s["total_s"]), _ms(s["contributed_total_s"]),
                      f"{s['ratio_geomean']:.2f}× ({s['ratio_min']:.2f}–{s['ratio_max']:.2f})")
        console.print(t)
    elif sp.get("note"):
        console.print(f"speed: {sp['note']}")

    if v.fuzz is not None:
        f = v.fuzz
        line = (f"fuzz: {f.examples} example(s) evaluated (shrinking included), {f.invalid} discarded by the spec"
                + (", derandomized" if f.derandomized else "")
                + (f", {f.known} shared with the built-in kernel (known divergence)" if f.known else ""))
        if f.failure is not None:
            console.print(line + f"; [red]FAILURE ({f.verdict.outcome})[/red], shrunk to {f.failure.describe()}: "
                          f"{(f.verdict.message or '').splitlines()[0][:200] if f.verdict.message else ''}")
            inputs = f.failure.small_values(limit=64) if f.failure.small_values() is None else None
            if inputs is not None:  # describe() shows only a few values
                _line(console, f"shrunk inputs: {json.dumps(inputs)}", 2)
            _positions(console, SimpleNamespace(mismatch=f.verdict.measured.get("mismatch")), 2)
            if v.fuzz_bundle:
                _line(console, f"bundle: {v.report_dir / v.fuzz_bundle}", 2)
            if f.note:
                console.print(f"  note: {f.note}")
        else:
            console.print(line + "; no failure" + (f" ({f.note})" if f.note else ""))

    for note in v.notes:
        console.print(f"note: {escape(note)}", soft_wrap=True)
    bad = v.bad_cases
    parts = [f"{summary[o]} {o}" for o in res.OUTCOMES if summary[o]]
    console.print("cases: " + ", ".join(parts))
    if v.bundles:
        _line(console, f"repro bundles: {v.bundles} under {v.report_dir / 'repro'}")
    if bad:
        _line(console, f"rerun one case: {rerun_command(bad[0])}")
    _line(console, f"report: {v.report_dir / 'validate.json'}, {v.report_dir / 'results.json'}")
    rejected = sum(1 for p in v.error_probes if not p.ok)
    if v.exit_code == 0:
        extra = [f"{summary[o]} {o}" for o in ("xfail", "skip") if summary[o]]
        console.print(f"[green bold]PASS[/green bold]: {v.op} with {escape(v.origin)} passes every case on {v.target}"
                      + (f" ({', '.join(extra)}: see above)" if extra else ""), soft_wrap=True)
    else:
        why = []
        if bad:
            kinds = [f"{summary[o]} {o}" for o in res.RUN_FAILING if summary[o]]
            why.append(f"{len(bad)} bad case(s) ({', '.join(kinds)})")
        if rejected:
            why.append(f"{rejected} error input(s) accepted")
        if v.fuzz is not None and v.fuzz.failure is not None:
            why.append("a fuzz failure")
        console.print(f"[red bold]FAIL[/red bold]: {v.op} with {escape(v.origin)} on {v.target}: " + ", ".join(why),
                      soft_wrap=True)
