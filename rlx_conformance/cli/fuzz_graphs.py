"""``rlx-conformance fuzz-graphs``: random well-typed graphs of registry ops (hypothesis, seeded),
each run on MLX in the modes asked for and judged as graph cases are; the first failure that no
known divergence explains is shrunk to its minimal failing subgraph and written under --report:
``fuzz-graphs/<name>.toml`` (the graph in the format of cases/graphs.toml) and its repro bundle.
One summary line; exit 1 on such a failure, 0 without, 2 on bad options. ``--add-regression
FILE`` appends a written graph to the graph library (cases/graphs.toml) as a regression case;
``--save-regression`` does so right away for the failure found."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlx_conformance.cli.options import check_devices, split
from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.graph_fuzz import DTYPES, MAX_DIM, MAX_NODES
from rlx_conformance.run.fuzz_graphs import add_regression, fuzz_graphs
from rlx_conformance.run.session import backend_targets, default_report_dir

GRAPHS_FILE = "graphs.toml"


def graphs_file() -> Path:
    """The graph library a regression is appended to: the --cases folder's graphs.toml where
    it has one, else the shipped cases/graphs.toml."""
    return data.data_path(GRAPHS_FILE)


def _positive(name: str, value: float | None, integer: bool = True) -> None:
    if value is not None and (value < 1 if integer else value <= 0):
        raise RlxError(f"{name} must be {'at least 1' if integer else 'positive'}, not {value:g}")


def cmd_fuzz_graphs(args: argparse.Namespace) -> int:
    if args.add_regression:
        g = add_regression(Path(args.add_regression), graphs_file())
        data.load.cache_clear()
        print(f"fuzz-graphs: added graph {g.name} ({len(g.nodes)} node(s), {g.dtypes[0]}) to {graphs_file()}")
        return 0
    if args.examples is None:
        raise RlxError("fuzz-graphs needs --examples N (or --add-regression FILE)")
    for name, v in (("--examples", args.examples), ("--max-nodes", args.max_nodes), ("--max-dim", args.max_dim)):
        _positive(name, v)
    _positive("--time-budget", args.time_budget, integer=False)
    dtypes = tuple(split(args.dtypes) or DTYPES)
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise RlxError(f"--dtypes: the fuzzer draws {', '.join(DTYPES)}, not {', '.join(bad)}")
    modes = args.mode if args.mode == "all" else split([args.mode])
    tgs = backend_targets("mlx", check_devices("mlx", args.device if args.device == "all" else split([args.device])),
                          modes)
    report = Path(args.report) if args.report else default_report_dir("fuzz-graphs")
    rep = fuzz_graphs(args.examples, args.seed, tgs, max_nodes=args.max_nodes, max_dim=args.max_dim, dtypes=dtypes,
                      time_budget=args.time_budget, report_dir=report)
    print(rep.summary())
    f = rep.failure
    if f is None:
        return 0
    steps = [f"{n.name} = {n.op}({', '.join(n.inputs)})" for n in f.shrunk.final.resolved.nodes]
    print(f"  minimal graph: {' -> '.join(steps)}")
    print(f"  graph: {f.snippet}   bundle: {f.bundle}/   python {f.bundle}/repro.py")
    if args.save_regression:
        g = add_regression(f.snippet, graphs_file())
        print(f"  added graph {g.name} to {graphs_file()}")
    else:
        print(f"  commit it: rlx-conformance fuzz-graphs --add-regression {f.snippet}")
    sys.stdout.flush()
    return 1


def register(sub) -> None:
    p = sub.add_parser("fuzz-graphs", help="random graphs of ops on MLX in every mode; shrink and bundle a failure",
                       description=(__doc__ or "").split("\n\n")[0].replace("``", ""))
    p.add_argument("--examples", type=int, metavar="N", help="graphs to draw")
    p.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same seed draws the same graphs (default 0)")
    p.add_argument("--max-nodes", type=int, default=MAX_NODES, metavar="K",
                   help=f"nodes per graph at most (default {MAX_NODES})")
    p.add_argument("--max-dim", type=int, default=MAX_DIM, metavar="D",
                   help=f"each dimension symbol in [1, D] (default {MAX_DIM})")
    p.add_argument("--mode", default="all", help="eager, lazy, compiled or all (default: all)")
    p.add_argument("--device", default="cpu", help="cpu, gpu or all (default: cpu)")
    p.add_argument("--dtypes", action="append", metavar="DTYPE",
                   help=f"the graphs' dtypes (default: {', '.join(DTYPES)})")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="stop drawing after this many seconds (the graphs left count as not run)")
    p.add_argument("--report", metavar="DIR", help="where a failure's graph and bundle go "
                                                   "(default: reports/fuzz-graphs-<time>)")
    p.add_argument("--save-regression", action="store_true",
                   help="append a found failure's graph to the graph library (cases/graphs.toml)")
    p.add_argument("--add-regression", metavar="FILE",
                   help="append the graph of FILE (written by an earlier run) to the graph library, and exit")
    p.set_defaults(fn=cmd_fuzz_graphs)
