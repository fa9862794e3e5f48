"""``rlx-conformance pair A B``: two runs of one backend on two devices (MLX gpu and MLX cpu) as a
pair of their own: identical bits, differing bits within tolerance, failures of one side only
(pairing.py). Writes pair.json (the per-case pairs too) and prints the groups that differ, or
``--format json``: schema rlx-conformance/pair/v1; exit 0 (a pairing reports, it does not judge)."""
from __future__ import annotations

import json
from pathlib import Path

from rlx_conformance.cli import _output as out
from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.report import records
from rlx_conformance.report.pairing import pair

SHOW = 25


def cmd_pair(args) -> int:
    p = pair(records.load(args.a), records.load(args.b))
    path = Path(args.out) if args.out else records.results_path(args.a).parent / "pair.json"
    atomic_write_text(path, json.dumps(p.to_json(), indent=1, allow_nan=False) + "\n")
    if args.format == "json":
        doc = p.to_json()
        out.emit_json("pair", {"a": doc["a"], "b": doc["b"], "totals": doc["totals"],
                               "groups": doc["groups"], "pairing": str(path)})
        return 0
    shown = [g for g in p.groups if any(g.counts[c] for c in ("differ", "a_only", "b_only", "both"))]
    if shown:
        cols = ("same", "differ", "A bad", "B bad", "both bad", "ulp A", "ulp B")
        out.table(f"A = {p.a}, B = {p.b}: groups where the two differ (first {SHOW}; "
                  "ulp: each side's worst error against the reference)",
                  ("op", "dtype", "mode", *cols),
                  [[g.op, g.dtype, g.mode, *(str(g.counts[c]) for c in ("identical", "differ", "a_only", "b_only", "both")),
                    _num(g.max_ulp_a), _num(g.max_ulp_b)] for g in shown[:SHOW]], right=cols)
    tot = p.totals()
    out.line(f"{sum(tot.values())} pairs: " + ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in tot.items()))
    out.line(f"pairing: {path}")
    return 0


def _num(v) -> str:
    return "" if v is None else f"{v:g}"


def register(sub) -> None:
    p = sub.add_parser("pair", help="pair two runs of one backend on two devices, case by case",
                       description=(__doc__ or "").splitlines()[0])
    p.add_argument("a", metavar="A", help="results.json or report dir (e.g. the MLX gpu run)")
    p.add_argument("b", metavar="B", help="results.json or report dir (e.g. the MLX cpu run)")
    p.add_argument("--out", metavar="FILE", help="pair.json to write (default: beside A's results)")
    out.add_format_option(p, help="text (default) or json (schema rlx-conformance/pair/v1: a, b, "
                                  "totals, groups as pair.json has them, pairing: pair.json's path)")
    p.set_defaults(fn=cmd_pair)
