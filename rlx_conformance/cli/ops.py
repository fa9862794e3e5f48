"""rlx-conformance ops: the registry's ops with per-backend kernel support (table or JSON)."""
from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.table import Table

from rlx_conformance.backends import BACKENDS, get_backend
from rlx_conformance.core.errors import RegistrationError, RlxError
from rlx_conformance.ops import all_ops


def cmd_ops(args) -> int:
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
                           "variadic": i.variadic} for i in spec.inputs],
               "attrs": [{"name": a.name, "kind": a.kind,
                          "default": None if repr(a.default) == "REQUIRED" else _jsonable(a.default),
                          "required": repr(a.default) == "REQUIRED",
                          "choices": list(a.choices) if a.choices else None} for a in spec.attrs],
               "dtypes": list(spec.dtypes), "backends": {}}
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
    Console().print(t)
    return 0


def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v



def _jsonable(v):
    return list(v) if isinstance(v, tuple) else v


def register(sub) -> None:
    o = sub.add_parser("ops", help="list the registry's ops with per-backend support")
    o.add_argument("--format", choices=("table", "json"), default="table")
    o.set_defaults(fn=cmd_ops)
