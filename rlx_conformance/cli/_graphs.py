"""--graphs, shared by run and list: which graph cases (issue 17; generate/graphs.py) join the
matrix. Default: every graph when no --ops selection is given (243 cases per device in all three
modes, some 10-15 s on one MLX CPU worker, the 1,600-node graph's compile most of it; as many VJP
cases again where --grad has vjp, some 70 s, issue 17 item 6), none
when --ops selects ops (a run of some ops is about those ops); ``--graphs all``, ``none`` or
globs over graph names (``--graphs 'attention*,swiglu'``) say it outright."""
from __future__ import annotations

import argparse
from collections.abc import Sequence

from rlx_conformance.cli.options import split, targets
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.graphs import generate_graphs, graph_patterns
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.run.session import grad_kinds, supports, with_variants


def add_graphs_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graphs", metavar="all|none|GLOB[,GLOB]", default=None,
                   help="graph cases (cases/graphs.toml) to add: all, none or globs over graph names "
                        "(default: all without --ops, none with it)")


def graphs_only(args: argparse.Namespace) -> bool:
    """--ops patterns that start with ``graph:`` select graphs (``--ops 'graph:*'``): they move
    from ``args.ops`` to ``args.graphs``. True when --ops then selects graphs alone (the op
    matrix is left out)."""
    pats = split(args.ops) or []
    graph_pats = [p for p in pats if p.startswith("graph:")]
    if not graph_pats:
        return False
    rest = [p for p in pats if not p.startswith("graph:")]
    args.graphs = ",".join(([args.graphs] if args.graphs not in (None, "all", "none") else []) + graph_pats)
    args.ops = rest or None  # a list, as the repeatable --ops gives it (split() joins its items' globs)
    return not rest


def graph_cases(args: argparse.Namespace) -> list[Case]:
    """The graph cases ``args`` select, for the run's targets and --dtypes."""
    option = args.graphs if args.graphs is not None else ("none" if args.ops else "all")
    patterns = graph_patterns(option)
    if patterns == []:
        return []
    base = sorted({Target(t.backend, t.device, t.mode) for t in targets(args)}, key=str)
    # the graphs' VJP cases (issue 17 item 6) as --grad says (vjp; --grad none leaves them out),
    # the forward ones left out under --no-forward
    kinds = grad_kinds(getattr(args, "grad", "none"))
    forward = () if getattr(args, "no_forward", False) else ("",)
    # in each backend variant a graph runs in (MLX on a GPU: tf32:on/off for graphs with a matmul
    # or convolution node, as for those ops' own cases)
    return with_variants(generate_graphs(base, patterns, split(args.dtypes), supports, grads=(*forward, *kinds)),
                         getattr(args, "tf32", None))


def find_graph_cases(ids: Sequence[str]) -> list[Case]:
    """The graph cases with these ids (regenerated from cases/graphs.toml)."""
    out = []
    for case_id in ids:
        parts = case_id.strip().split("/")
        target = Target.parse(parts[-1])
        base = Target(target.backend, target.device, target.mode)
        grads = ("", "vjp") if parts[-2] == "grad:vjp" else ("",)
        cases = with_variants(generate_graphs([base], [parts[0]], grads=grads), "both" if target.variant else None)
        hit = [c for c in cases if c.id == case_id.strip()]
        if not hit:
            raise RlxError(f"no graph case with id {case_id!r}")
        out += hit
    return out
