"""rlx-conformance list: the case ids of the matrix (its derivative cases as ``--grad`` says), one a
line (never wrapped: each line is a whole id to copy), or ``--format json``: schema
rlx-conformance/list/v1, ``count`` and ``cases`` (id, op, dtype, target, declared: whether the
backend declares the dtype there, grad: the derivative kind, "" for the forward, layout: the
memory layout, "" for contiguous, graph: a graph case's graph name, "" for an op's case;
``--layouts``, ``--no-contiguous`` and ``--graphs`` as for run)."""
from __future__ import annotations

import argparse

from rlx_conformance.cli import _output as out
from rlx_conformance.cli._graphs import add_graphs_option, graphs_only, graph_cases
from rlx_conformance.cli.options import (
    add_grad_option,
    add_layouts_option,
    add_matrix_options,
    grads,
    layout_cases,
    split,
    targets,
)
from rlx_conformance.generate.graphs import is_graph
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.run.session import build_cases


def cmd_list(args: argparse.Namespace) -> int:
    if graphs_only(args):  # --ops 'graph:*': the graph cases alone
        cases = graph_cases(args)
    else:
        cases = layout_cases(args, build_cases(targets(args), split(args.ops), split(args.dtypes), tf32=args.tf32,
                                               grads=grads(args), layouts=args.layouts))
        cases += graph_cases(args)
    if args.format == "json":
        out.emit_json("list", {"count": len(cases), "cases": [
            {"id": c.id, "op": c.op, "dtype": c.dtype, "target": str(c.target), "declared": c.declared,
             "grad": c.grad, "layout": c.layout, "graph": c.op.removeprefix(GRAPH_PREFIX) if is_graph(c) else ""}
            for c in cases]})
        return 0
    for c in cases:
        out.line(c.id)
    return 0


def register(sub) -> None:
    ls = sub.add_parser("list", help="print the case ids of the matrix")
    add_matrix_options(ls)
    add_grad_option(ls)
    add_layouts_option(ls)
    add_graphs_option(ls)
    out.add_format_option(ls, help="text (default: one id a line) or json "
                                   "(schema rlx-conformance/list/v1: count, cases)")
    ls.set_defaults(fn=cmd_list)
