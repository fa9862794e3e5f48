"""``rlx-conformance repro CASE_ID``: rerun one case from its id alone, in an isolated worker (a
crash or hang is reported, not suffered), print the verdict and (re)write the case's repro bundle
(bundle.py), whatever the outcome. Exit 1 while the case still fails (a known divergence that
still reproduces included), 0 once it passes, 2 for a bad id."""
from __future__ import annotations

import argparse
from pathlib import Path

from rlx_conformance.cli.options import STILL_FAILING
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.runner import DEFAULT_TIMEOUT, Runner
from rlx_conformance.run.session import find_case


def register(sub) -> None:
    p = sub.add_parser("repro", help="rerun one case by id and (re)write its repro bundle",
                       description=(__doc__ or "").split("\n\n")[0].replace("``", ""))
    p.add_argument("case_id", metavar="CASE_ID", help="a case id, as `rlx-conformance list` prints it")
    p.add_argument("--report", metavar="DIR", default="reports",
                   help="the bundle goes to DIR/repro/<case>/ (default: reports; give a run's report "
                        "dir to refresh its bundle)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help=f"seconds before the case counts as hung (default {DEFAULT_TIMEOUT:g})")
    p.set_defaults(fn=cmd_repro)


def cmd_repro(args: argparse.Namespace) -> int:
    case = find_case(args.case_id)
    report = Path(args.report)
    sink = BundleSink(report, always=True, timeout=args.timeout)
    (r,) = list(Runner(workers=1, timeout=args.timeout, bundles=sink).run([case]))
    print(f"{r.outcome}  {r.id}")
    if r.message:
        print("  " + r.message.replace("\n", "\n  "))
    if r.max_ulp is not None:
        print(f"  max abs {r.max_abs_err:.3g}, max rel {r.max_rel_err:.3g}, max ulp {r.max_ulp:g}")
    if r.outcome == "pass" and r.divergence is not None:
        print(f"  passes inside known divergence {r.divergence['entry']}: if none of its cases fails, "
              "the entry is stale")
    if r.repro:
        folder = report / r.repro
        print(f"bundle: {folder}/" + (f"  (python {folder / 'repro.py'})" if (folder / "repro.py").is_file()
                                      else "  (no repro.py: see case.json)"))
    return 1 if r.outcome in STILL_FAILING else 0
