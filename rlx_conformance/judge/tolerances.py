"""Tolerances (cases/tolerances.toml): how far a backend may be from the reference, per op and dtype.
Known divergences (cases/known_divergences.toml) are divergences.py's."""
from __future__ import annotations

import fnmatch
from functools import cache

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.budget_table import budget_for
from rlx_conformance.judge.compare import Tolerance


@cache
def tolerance_for(op: str, dtype: str) -> Tolerance:
    """The tolerance of (op, output dtype): the first matching override, else for an op of
    [from_budget] its accuracy budget in the dtype it computes in, else the dtype default."""
    table = data.load("tolerances.toml")
    for i, o in enumerate(table.get("override", [])):
        if not o.get("reason"):
            raise RlxError(f"cases/tolerances.toml override #{i + 1} ({o.get('op')}) has no reason")
        if fnmatch.fnmatchcase(op, o["op"]) and o.get("dtype", dtype) == dtype:
            d = table["defaults"].get(dtype, {})
            return Tolerance(max_ulp=float(o.get("max_ulp", d.get("max_ulp", 0))),
                             rtol=float(o.get("rtol", 0)), atol=float(o.get("atol", 0)),
                             source=f"override:{o['op']}" + (f"/{o['dtype']}" if "dtype" in o else ""))
    fb = table.get("from_budget", {})
    if fb and (set(fb) != {"ops", "reason"} or not fb["reason"] or not isinstance(fb["ops"], list)):
        raise RlxError("cases/tolerances.toml [from_budget] needs ops (a list of globs) and a reason")
    if any(fnmatch.fnmatchcase(op, g) for g in fb.get("ops", ())):
        b = budget_for(op, dt.compute_dtype(dtype))
        if b.kind != "ulp" or b.atol:
            raise RlxError(f"cases/tolerances.toml [from_budget] {op}: its budget ({b.source}) is not "
                           "a plain ULP count")
        return Tolerance(max_ulp=b.ulp, source=f"budget:{b.source}")
    return default_tolerance(dtype)


@cache
def default_tolerance(dtype: str) -> Tolerance:
    """The dtype's default (cases/tolerances.toml [defaults.DTYPE]): the final roundings of two
    implementations; derivative results are judged with it on top of their bound."""
    d = data.load("tolerances.toml")["defaults"].get(dtype)
    if d is None:
        raise RlxError(f"cases/tolerances.toml has no [defaults.{dtype}]")
    return Tolerance(max_ulp=float(d.get("max_ulp", 0)), rtol=float(d.get("rtol", 0)),
                     atol=float(d.get("atol", 0)), source=f"default:{dtype}")
