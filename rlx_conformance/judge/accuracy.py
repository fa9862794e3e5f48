"""Accuracy budgets (cases/accuracy.toml) and the precise oracle's verdict on a case.

The differential comparison (compare.py, tolerances.toml) says whether a backend agrees with the
CPU reference. This module says whether each of them is right: both are measured against the
precise oracle (precise.py: the exact result rounded once to the output dtype) in ULP of the
output dtype, and judged by the op's accuracy budget.

* The reference over budget is a **reference bug**: the case reports ``error`` with a message
  starting "reference bug:" (a known divergence never hides it: it is not the backend's).
* A failing case says which side the precise oracle supports.
* The backend over budget is recorded (``over_budget``); the case's outcome stays the
  differential verdict. Exhaustive mode (exhaustive.py) makes it a failure.
"""
from __future__ import annotations

import fnmatch
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge import precise
from rlx_conformance.judge.compare import asserted, element_errors, ulp_size
from rlx_conformance.spec.registry import OpSpec

_FIELDS = {"op", "dtype", "ulp", "atol", "bound", "reason"}


@dataclass(frozen=True)
class Budget:
    """Allowed distance from the correctly rounded result: ``ulp`` ULP of the output dtype, or
    ``atol`` absolute, or (accumulating ops) ``bound`` x the registry's Policy.bound plus ``ulp``
    ULP."""

    ulp: float
    atol: float = 0.0
    bound: float | None = None
    reason: str = ""
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"ulp": self.ulp, "atol": self.atol, "bound": self.bound, "source": self.source}


@cache
def _entries() -> tuple[dict[str, Any], ...]:
    raw = data.load("accuracy.toml").get("budget", [])
    out = []
    for i, e in enumerate(raw):
        where = f"cases/accuracy.toml budget #{i + 1} ({e.get('op', '?')})"
        unknown = set(e) - _FIELDS
        if unknown:
            raise RlxError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if not e.get("reason"):
            raise RlxError(f"{where}: needs a reason")
        ops = e.get("op")
        if isinstance(ops, str):
            ops = [ops]
        if not ops or not all(isinstance(o, str) for o in ops):
            raise RlxError(f"{where}: op must be a glob or a list of globs")
        if "ulp" not in e or not isinstance(e["ulp"], (int, float)) or e["ulp"] < 0:
            raise RlxError(f"{where}: needs ulp >= 0")
        dtypes = e.get("dtype")
        if isinstance(dtypes, str):
            dtypes = [dtypes]
        if dtypes is not None and (not dtypes or not all(d in dt.FLOATS for d in dtypes)):
            raise RlxError(f"{where}: dtype must be a float dtype or a list of them")
        for k in ("atol", "bound"):
            if k in e and (not isinstance(e[k], (int, float)) or e[k] < 0):
                raise RlxError(f"{where}: {k} must be a number >= 0")
        out.append({**e, "op": tuple(ops), "dtype": None if dtypes is None else tuple(dtypes), "index": i + 1})
    return tuple(out)


@dataclass(frozen=True)
class LowPrecision:
    """cases/accuracy.toml [low_precision]: outputs of these dtypes are computed in float32 and
    rounded once, so their budget is the float32 one with ``ulp`` at most ``max_ulp``."""

    dtypes: tuple[str, ...]
    max_ulp: float
    reason: str


@cache
def low_precision() -> LowPrecision:
    e = data.load("accuracy.toml").get("low_precision")
    where = "cases/accuracy.toml [low_precision]"
    if not isinstance(e, dict) or set(e) != {"dtypes", "max_ulp", "reason"}:
        raise RlxError(f"{where}: needs dtypes, max_ulp and reason")
    if not isinstance(e["dtypes"], list) or not all(d in dt.FLOATS and dt.compute_dtype(d) != d
                                                   for d in e["dtypes"]):
        raise RlxError(f"{where}: dtypes must be float dtypes computed in another dtype (float16, bfloat16)")
    if not isinstance(e["max_ulp"], (int, float)) or e["max_ulp"] < 0 or not e["reason"]:
        raise RlxError(f"{where}: needs max_ulp >= 0 and a reason")
    return LowPrecision(tuple(e["dtypes"]), float(e["max_ulp"]), e["reason"])


def _budget(e: dict[str, Any]) -> Budget:
    return Budget(ulp=float(e["ulp"]), atol=float(e.get("atol", 0.0)),
                  bound=None if e.get("bound") is None else float(e["bound"]), reason=e["reason"],
                  source=f"accuracy.toml#{e['index']}:{'|'.join(e['op'])}"
                         + (f"/{'|'.join(e['dtype'])}" if e["dtype"] else ""))


@cache
def budget_for(op: str, dtype: str) -> Budget:
    """The first entry matching (op, output dtype). A float16/bfloat16 output without an entry
    naming its dtype takes the op's float32 budget with ulp capped by [low_precision]. RlxError
    if none."""
    entries, low = _entries(), low_precision()
    for e in entries:
        if any(fnmatch.fnmatchcase(op, g) for g in e["op"]) and (
                dtype in e["dtype"] if e["dtype"] else dtype not in low.dtypes):
            return _budget(e)
    if dtype in low.dtypes:
        try:
            b = budget_for(op, dt.compute_dtype(dtype))
        except RlxError:
            pass
        else:
            return replace(b, ulp=min(b.ulp, low.max_ulp), reason=low.reason,
                           source=f"accuracy.toml[low_precision]/{dtype} from {b.source}")
    raise RlxError(f"cases/accuracy.toml has no budget for {op} on {dtype}")


def missing_budgets(specs: Iterable[OpSpec]) -> list[str]:
    """(op, dtype) pairs of ``specs`` that have an oracle but no budget: must be empty (a test
    checks, over the whole registry)."""
    out = []
    for spec in specs:
        if not precise.has_oracle(spec.name):
            continue
        for d in spec.dtypes:
            out_d = [d] if spec.name != "cast" else list(dt.FLOATS)
            for od in out_d:
                if dt.is_float(od):
                    try:
                        budget_for(spec.name, od)
                    except RlxError:
                        out.append(f"{spec.name}/{od}")
    return sorted(set(out))


# -- measuring one output against the precise oracle ---------------------------------------------
@dataclass
class Measure:
    """One implementation's output against the precise oracle, over the asserted positions."""

    max_ulp: float = 0.0
    over: int = 0  # positions over budget (value, NaN, inf or asserted signed-zero mismatches)
    nan: int = 0
    inf: int = 0
    signed_zero: int = 0  # sign-of-zero mismatches (counted over budget only where asserted)
    ftz: int = 0  # subnormal results accepted as flushed zeros (declared FTZ only)
    checked: int = 0
    worst: int | None = None  # flat index of the worst position over budget
    worst_ulp: float = 0.0
    over_mask: np.ndarray | None = field(default=None, repr=False)


def measure(got: np.ndarray, want: np.ndarray, budget: Budget, *, skip: np.ndarray | None = None,
            bound: np.ndarray | None = None, signed_zero: bool = False, ftz: bool = False,
            compute_dtype: str | None = None) -> Measure:
    """``got`` against the precise oracle's ``want`` (same dtype and shape), flattened.
    ``bound``: the registry's per-element bound (NaN = unasserted; used only by a budget with a
    ``bound`` factor); ``skip``: positions the spec leaves undefined. The per-element errors are
    compare.element_errors'; unlike compare(), an infinity is judged by its ULP distance (one past
    the largest finite value) like any other value."""
    name = dt.name_of(want.dtype)
    mask, b = asserted(want.shape, skip, bound if budget.bound is not None else None)
    mask = mask.reshape(-1)
    b = None if b is None else b.reshape(-1)
    err = element_errors(want.reshape(-1), got.reshape(-1))
    g, w, ulp = err.actual, err.expected, err.ulp
    nan_bad, inf_bad, both = err.nan_bad, err.inf_bad, ~err.nan
    with np.errstate(all="ignore"):
        abs_err = np.where(err.finite, err.abs_diff, np.inf)
        within = ulp <= budget.ulp
        if budget.atol:
            within |= abs_err <= budget.atol
        if b is not None:
            within |= abs_err <= budget.bound * np.where(np.isnan(b), np.inf, b) \
                + budget.ulp * ulp_size(w, name)
        sz = err.signed_zero
        flushed = np.zeros_like(mask)
        if ftz:
            tiny = dt.finfo(compute_dtype or dt.compute_dtype(name)).tiny
            flushed = both & (g == 0) & (w != 0) & (np.abs(w) < tiny)
    bad = (nan_bad | (both & ~within & ~flushed) | (sz if signed_zero else False)) & mask
    m = Measure(checked=int(mask.sum()), nan=int((nan_bad & mask).sum()),
                inf=int((inf_bad & mask).sum()), signed_zero=int((sz & mask).sum()),
                ftz=int((flushed & ~within & mask).sum()), over=int(bad.sum()), over_mask=bad)
    fin = mask & both
    if fin.any():
        m.max_ulp = float(np.max(np.where(fin, ulp, 0.0)))
    if m.over:
        score = np.where(bad, np.where(np.isnan(ulp), np.inf, ulp), -1.0)
        m.worst = int(np.argmax(score))
        m.worst_ulp = float(score[m.worst])
    return m


# -- per-case assessment -----------------------------------------------------------------------------
class _PreciseCache:
    """Precise oracle values (and the registry's bounds) of the last few input ids: the cases of
    one input id differ only in target and share them, as they share the reference."""

    def __init__(self, size: int = 4):
        self.size = size
        self._d: OrderedDict[str, Any] = OrderedDict()

    def get(self, key: str, make):
        if key in self._d:
            return self._d[key]
        v = make()
        self._d[key] = v
        if len(self._d) > self.size:
            self._d.popitem(last=False)
        return v


PRECISE_CACHE = _PreciseCache()


def _fmt(v) -> str:
    return repr(v.item() if hasattr(v, "item") else v)


def _where(shape, flat: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def assess(case, inputs: list[np.ndarray], expected: list[np.ndarray],
           actual: list[np.ndarray], ok: bool, *, ftz: bool) -> dict[str, Any] | None:
    """The precise oracle's judgement of one case: CaseResult fields plus ``reference_bug`` (a
    message or None) and ``note`` (appended to a failing case's message). None when the op has no
    precise oracle. ``ftz``: whether the target documents flushing subnormal results to zero
    (Backend.flushes_subnormals of its device), the one thing about the target the verdict needs;
    the caller knows the backend, this layer does not."""
    spec = case.spec
    if os.environ.get("RLX_CONFORMANCE_ORACLE", "").lower() in ("0", "off", "no"):
        return None  # switched off (to measure its overhead): no oracle fields, no verdict
    if not precise.has_oracle(case.op) or spec.policy.check is not None:
        return None
    attrs = case.attr_dict
    out_dtypes = [dt.name_of(e.dtype) for e in expected]
    if not any(precise.is_float_output(d) for d in out_dtypes):
        return None

    def make():
        orc = precise.compute(case.op, inputs, attrs, out_dtypes)
        bounds = [spec.policy.bound(inputs, attrs, d) if (spec.policy.bound is not None and o is not None)
                  else None for o, d in zip(orc, out_dtypes)]
        return orc, bounds

    orc, bounds = PRECISE_CACHE.get(case.input_id, make)
    undefined = spec.undefined(inputs, attrs)
    res: dict[str, Any] = {"oracle_ulp_ref": 0.0, "oracle_ulp_target": 0.0, "over_budget": 0,
                           "over_budget_ref": 0, "ftz_used": False}
    ref_msgs, tgt_msgs = [], []
    budget = None
    for k, (o, e, a, bnd, d) in enumerate(zip(orc, expected, actual, bounds, out_dtypes)):
        if o is None or e.shape != o.shape or a.shape != o.shape or a.dtype != o.dtype:
            continue
        budget = budget_for(case.op, d)
        skip = None if undefined is None else np.broadcast_to(undefined, o.shape)
        kw = dict(skip=skip, bound=bnd, signed_zero=spec.policy.signed_zero,
                  compute_dtype=dt.compute_dtype(d))
        r = measure(e, o, budget, **kw)
        t = measure(a, o, budget, ftz=ftz, **kw)
        res["oracle_ulp_ref"] = max(res["oracle_ulp_ref"], r.max_ulp)
        res["oracle_ulp_target"] = max(res["oracle_ulp_target"], t.max_ulp)
        res["over_budget_ref"] += r.over
        res["over_budget"] += t.over
        res["ftz_used"] |= t.ftz > 0
        for m, msgs, got in ((r, ref_msgs, e), (t, tgt_msgs, a)):
            if m.over:
                i = m.worst
                idx = _where(o.shape, i)
                ins = ""
                if spec.family in ("activation", "binary", "select", "cast"):
                    bins = np.broadcast_arrays(*inputs) if inputs else []
                    ins = "input " + ", ".join(_fmt(x.reshape(-1)[i]) for x in bins) + ": "
                msgs.append(f"output {k}: {m.over}/{m.checked} over budget, worst at {idx}: {ins}"
                            f"correctly rounded {_fmt(o.reshape(-1)[i])}, got {_fmt(got.reshape(-1)[i])} "
                            f"({m.worst_ulp:g} ulp; budget {budget.ulp:g} ulp"
                            + (f" + {budget.bound:g} x bound" if budget.bound is not None else "") + ")")
    if budget is None:
        return None
    res["budget"] = budget.to_json()
    ref_bad, tgt_bad = res["over_budget_ref"] > 0, res["over_budget"] > 0
    res["reference_bug"] = None
    res["note"] = ""
    if ref_bad:
        res["oracle_verdict"] = "reference-bug"
        side = ("the oracle supports the target (within budget, max "
                f"{res['oracle_ulp_target']:g} ulp)") if not tgt_bad else \
            "the target is over budget too: " + "; ".join(tgt_msgs)
        res["reference_bug"] = (f"reference bug: the CPU reference of {case.op}/{case.dtype} is farther "
                                f"from the correctly rounded result than its accuracy budget "
                                f"({budget.source}): " + "; ".join(ref_msgs) + f"; {side}")
    elif not ok:
        if tgt_bad:
            res["oracle_verdict"] = "supports-reference"
            res["note"] = ("oracle: supports the reference (within budget, max "
                           f"{res['oracle_ulp_ref']:g} ulp); the target is over budget: " + "; ".join(tgt_msgs))
        else:
            res["oracle_verdict"] = "both-within-budget"
            res["note"] = (f"oracle: both within the accuracy budget ({budget.ulp:g} ulp; reference max "
                           f"{res['oracle_ulp_ref']:g}, target max {res['oracle_ulp_target']:g} ulp): the "
                           "cross tolerance is tighter than the budget here")
    else:
        res["oracle_verdict"] = "target-over-budget" if tgt_bad else "ok"
        if tgt_bad:
            res["note"] = "oracle: target over budget: " + "; ".join(tgt_msgs)
    return res
