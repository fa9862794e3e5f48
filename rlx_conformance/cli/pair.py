"""``rlx-conformance pair A B``: two runs of one backend on two devices (MLX gpu and MLX cpu) as a
pair of their own: identical bits, differing bits within tolerance, failures of one side only
(pairing.py). Writes pair.json; exit 0 (a pairing reports, it does not judge)."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.report import records
from rlx_conformance.report.pairing import pair

SHOW = 25


def cmd_pair(args) -> int:
    p = pair(records.load(args.a), records.load(args.b))
    out = Path(args.out) if args.out else records.results_path(args.a).parent / "pair.json"
    atomic_write_text(out, json.dumps(p.to_json(), indent=1, allow_nan=False) + "\n")
    console = Console(highlight=False, width=max(Console().width, 110))
    t = Table(title=f"A = {p.a}, B = {p.b}: groups where the two differ (first {SHOW}; "
                    "ulp: each side's worst error against the reference)")
    for col in ("op", "dtype", "mode", "same", "differ", "A bad", "B bad", "both bad", "ulp A", "ulp B"):
        t.add_column(col, overflow="fold", justify="left" if col in ("op", "dtype", "mode") else "right")
    shown = [g for g in p.groups if any(g.counts[c] for c in ("differ", "a_only", "b_only", "both"))]
    for g in shown[:SHOW]:
        t.add_row(g.op, g.dtype, g.mode, *(str(g.counts[c]) for c in ("identical", "differ", "a_only", "b_only", "both")),
                  _num(g.max_ulp_a), _num(g.max_ulp_b))
    if shown:
        console.print(t)
    tot = p.totals()
    console.print(f"{sum(tot.values())} pairs: " + ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in tot.items()))
    console.print(f"pairing: {out}")
    return 0


def _num(v) -> str:
    return "" if v is None else f"{v:g}"


def register(sub) -> None:
    p = sub.add_parser("pair", help="pair two runs of one backend on two devices, case by case",
                       description=(__doc__ or "").splitlines()[0])
    p.add_argument("a", metavar="A", help="results.json or report dir (e.g. the MLX gpu run)")
    p.add_argument("b", metavar="B", help="results.json or report dir (e.g. the MLX cpu run)")
    p.add_argument("--out", metavar="FILE", help="pair.json to write (default: beside A's results)")
    p.set_defaults(fn=cmd_pair)
