"""rlx-conformance coverage [OP ...]: what each op declares it accepts (input ranks, attribute
value classes, dtype combinations: generate/coverage.py) against what the case matrix exercises,
and with ``--fuzz N`` what N deterministic draws of the fuzz strategy exercise. Exit 1 when the
matrix never exercises a declared class the op does not justify (``OpSpec.uncovered``).

Text: with OPs, a table per op (one row per dimension, short cells), then its gaps and the
justified classes, each on a line of its own; without, one row per op and every gap on a line.
``--format json``: schema rlx-conformance/coverage/v1, ``ops`` (generate/coverage.py
``OpCoverage.to_json``: op, cases, declared, matrix, fuzz, gaps, fuzz_gaps, uncovered,
undeclared), ``gaps`` (total count), ``fuzz_examples``.
"""
from __future__ import annotations

import argparse
import difflib
import fnmatch

from rlx_conformance.cli import _output as out
from rlx_conformance.cli.options import split
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate import coverage as cov
from rlx_conformance.ops import all_ops
from rlx_conformance.spec.registry import OpSpec


def selected(patterns: list[str]) -> list[OpSpec]:
    """The ops named by ``patterns`` (names or globs), every op when none; a pattern that
    selects nothing is an error."""
    specs = list(all_ops())
    if not patterns:
        return specs
    for p in patterns:
        if not any(fnmatch.fnmatchcase(s.name, p) for s in specs):
            close = difflib.get_close_matches(p, [s.name for s in specs], n=3)
            raise RlxError(f"no op matches {p!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return [s for s in specs if any(fnmatch.fnmatchcase(s.name, p) for p in patterns)]


_LIST_LIMIT = 6  # a dimension with more classes shows counts; its gaps are listed below


def _names(keys: list[str]) -> str:
    return " ".join(k.partition("=")[2] for k in keys) or "—"


def _classes(keys: list[str], have: set[str] | None) -> str:
    if have is None:
        return "not sampled"
    hit = [k for k in keys if k in have]
    return _names(hit) if len(keys) <= _LIST_LIMIT else f"{len(hit)} of {len(keys)}"


def _detail(c: cov.OpCoverage) -> None:
    groups: dict[str, list[str]] = {}
    for k in c.declared:
        groups.setdefault(cov.dimension(k), []).append(k)
    rows = [(dim, _names(keys) if len(keys) <= _LIST_LIMIT else f"{len(keys)} classes",
             _classes(keys, c.matrix), _classes(keys, c.fuzz),
             str(sum(k in c.gaps for k in keys) or "—")) for dim, keys in groups.items()]
    out.table(f"{c.op}: {c.cases} cases", ("dimension", "declared", "matrix", "fuzz", "gaps"), rows)
    for g in c.gaps:
        out.line(f"  gap: {c.op} {g}")
    for k, reason in c.uncovered.items():
        out.line(f"  justified: {c.op} {k}: {reason}")
    for k in c.stale_justifications:
        out.line(f"  stale justification: {c.op} {k} (not declared, or the matrix exercises it)")


def cmd_coverage(args: argparse.Namespace) -> int:
    if args.fuzz < 0:
        raise RlxError(f"--fuzz {args.fuzz}: the number of examples must be >= 0")
    specs = selected(split(args.op))
    report = cov.coverage(specs, fuzz_examples=args.fuzz)
    gaps = sum(len(c.gaps) for c in report)
    if args.format == "json":
        out.emit_json("coverage", {"fuzz_examples": args.fuzz, "gaps": gaps,
                                   "ops": [c.to_json() for c in report]})
        return 1 if gaps else 0
    if args.op:
        for c in report:
            _detail(c)
    else:
        rows = [(c.op, str(c.cases), str(len(c.declared)),
                 str(sum(k in c.matrix for k in c.declared)), str(len(c.uncovered)),
                 str(len(c.gaps)) if c.gaps else "—") for c in report]
        out.table(f"coverage of {len(report)} ops (classes declared / exercised by the matrix)",
                  ("op", "cases", "declared", "matrix", "justified", "gaps"), rows,
                  right=("cases", "declared", "matrix", "justified"))
        for c in report:
            for g in c.gaps:
                out.line(f"gap: {c.op} {g}")
    out.line(f"{gaps} gap(s): declared classes the matrix never exercises" if gaps
             else "no gaps: the matrix exercises every declared rank, attribute class and dtype")
    return 1 if gaps else 0


def register(sub) -> None:
    p = sub.add_parser("coverage", help="per op: declared ranks, attribute classes and dtypes "
                       "against what the matrix (and fuzzing) exercises; exit 1 on a gap")
    p.add_argument("op", nargs="*", metavar="OP", help="op names or globs (default: every op, "
                   "one line each)")
    p.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="also draw N deterministic examples per op from the fuzz strategy "
                        "(validate --fuzz) and show what they exercise (default 0: not sampled)")
    out.add_format_option(p)
    p.set_defaults(fn=cmd_coverage)
