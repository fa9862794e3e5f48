"""``rlx-conformance repro CASE_ID``: rerun one case from its id alone, in an isolated worker (a
crash or hang is reported, not suffered), print the verdict and (re)write the case's repro bundle
(bundle.py), whatever the outcome. Exit 1 while the case still fails (a known divergence that
still reproduces included), 0 once it passes, 2 for a bad id."""
from __future__ import annotations

import argparse
from pathlib import Path

from rlx_conformance.cli import _output as out
from rlx_conformance.cli._graphs import find_graph_cases
from rlx_conformance.cli.options import STILL_FAILING, find_cases
from rlx_conformance.generate.graphs import is_graph
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.runner import DEFAULT_TIMEOUT, Runner


def register(sub) -> None:
    p = sub.add_parser("repro", help="rerun one case by id and (re)write its repro bundle",
                       description=(__doc__ or "").split("\n\n")[0].replace("``", ""))
    p.add_argument("case_id", metavar="CASE_ID", help="a case id, as `rlx-conformance list` prints it")
    p.add_argument("--report", metavar="DIR", default="reports",
                   help="the bundle goes to DIR/repro/<case>/ (default: reports; give a run's report "
                        "dir to refresh its bundle)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds before the case counts as hung (default {DEFAULT_TIMEOUT:g})")
    out.add_format_option(p, help="text (default) or json (schema rlx-conformance/repro/v1: id, "
                                  "grad (the derivative kind, \"\" for the forward), outcome, message, max_ulp, "
                                  "max_abs_err, max_rel_err, divergence, bundle, repro_py, exit)")
    p.set_defaults(fn=cmd_repro)


def cmd_repro(args: argparse.Namespace) -> int:
    # a graph case (graph:NAME/...) is regenerated from cases/graphs.toml; its bundle holds the
    # shrunk graph (run/graph_bundle.py)
    (case,) = find_graph_cases([args.case_id]) if is_graph(args.case_id) else find_cases([args.case_id])
    report = Path(args.report)
    sink = BundleSink(report, always=True, timeout=args.timeout)
    (r,) = list(Runner(workers=1, timeout=args.timeout, bundles=sink).run([case]))
    code = 1 if r.outcome in STILL_FAILING else 0
    folder = report / r.repro if r.repro else None
    script = folder / "repro.py" if folder is not None and (folder / "repro.py").is_file() else None
    if args.format == "json":
        out.emit_json("repro", {"id": r.id, "grad": r.grad, "outcome": r.outcome, "message": r.message,
                                "max_ulp": r.max_ulp, "max_abs_err": r.max_abs_err,
                                "max_rel_err": r.max_rel_err,
                                "divergence": (r.divergence or {}).get("entry"),
                                "bundle": str(folder) if folder else None,
                                "repro_py": str(script) if script else None, "exit": code})
        return code
    errors = out.errors_text(r.max_ulp, r.max_abs_err, r.max_rel_err)
    details = out.message_lines(r.message, where=f"{folder / 'case.json'}" if folder else "the bundle")
    out.case_item(r.outcome, r.id, details + ([errors] if errors else []), indent="")
    if r.outcome == "pass" and r.divergence is not None:
        out.line(f"{out.DETAIL}passes inside known divergence {r.divergence['entry']}: if none of its "
                 "cases fails, the entry is stale")
    if folder is not None:
        out.line(f"bundle: {folder}/")
        out.line(f"  python {script}" if script else "  (no repro.py: see case.json)")
    return code
