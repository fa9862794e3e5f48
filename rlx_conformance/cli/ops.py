"""rlx-conformance ops: the registry's ops with per-backend kernel support (table or JSON), one
op's every fact (``ops OP --explain``), or the op reference page (``--format markdown``)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from rlx_conformance.backends import BACKENDS, get_backend
from rlx_conformance.cli import _output as out
from rlx_conformance.core.errors import RegistrationError, RlxError
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.report import op_explain, op_reference
from rlx_conformance.report.op_facts import builtin_ops, declaration_at, op_facts


def cmd_ops(args: argparse.Namespace) -> int:
    if args.op is not None or args.explain:
        return _explain(args)
    if args.format == "markdown":
        # the built-in ops only: a custom op declared by a test or plugin module is not the
        # harness's, and the committed page must not depend on what else was imported
        sys.stdout.write(op_reference.markdown(builtin_ops(all_ops())))
        return 0
    return _listing(args)


def _explain(args: argparse.Namespace) -> int:
    """Every fact about one op (report/op_facts.py), on one screen or as JSON."""
    if args.op is None:
        raise RlxError("ops --explain needs an op name: rlx-conformance ops OP --explain")
    if args.format == "markdown":
        raise RlxError("ops OP: --format markdown is the whole reference; use table or json")
    facts = op_facts(get_op(args.op))  # unknown op: UnknownOpError with close names
    if args.format == "json":
        print(op_explain.to_json(facts))
        return 0
    op_explain.render(facts, Console(highlight=False))
    return 0


def _listing(args: argparse.Namespace) -> int:
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
                           "variadic": i.variadic,
                           "differentiable": spec.input_differentiable(i)} for i in spec.inputs],
               "attrs": [{"name": a.name, "kind": a.kind,
                          "default": None if repr(a.default) == "REQUIRED" else _jsonable(a.default),
                          "required": repr(a.default) == "REQUIRED",
                          "choices": list(a.choices) if a.choices else None} for a in spec.attrs],
               "dtypes": list(spec.dtypes), "backends": {},
               "differentiable": spec.differentiable,
               "not_differentiable": spec.not_differentiable_reason() or None,
               "grad_values": list(spec.grad_values),
               "declared_at": declaration_at(spec)}
        # What the reference's derivative returns at kinks, ties and domain edges.
        rule = backends["cpu"].derivatives.get(spec.name) if "cpu" in backends else None
        row["convention"] = (rule.convention or None) if rule is not None else None
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
    out.console().print(t)
    return 0


def _jsonable(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


def register(sub) -> None:
    o = sub.add_parser("ops", help="list the registry's ops with per-backend support; "
                       "OP --explain: everything about one op; --format markdown: docs/ops.md")
    o.add_argument("op", nargs="?", metavar="OP",
                   help="one op: show everything about it (as --explain)")
    o.add_argument("--explain", action="store_true",
                   help="with OP: its declaration, kernels, shape families, value domains, "
                        "tolerances, accuracy budgets, judge, oracles and known divergences, "
                        "each with the file:line it comes from")
    out.add_format_option(o, choices=("table", "json", "markdown"), default="table",
                          help="table (default), json (a list, one object per op: the shape "
                               "docs/porting-a-kernel.md reads), or markdown: the op reference page "
                               f"({op_reference.COMMAND})")
    o.set_defaults(fn=cmd_ops)
