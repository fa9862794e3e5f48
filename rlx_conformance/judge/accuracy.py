"""Accuracy budgets (cases/accuracy.toml) and the verdict on whether an implementation meets them.

The differential comparison (compare.py, tolerances.toml, the worst-case bounds of judge/bounds)
says whether a backend agrees with the CPU reference as far as *any* correct implementation must.
This module says whether each of them is as *accurate* as a good implementation is, by the op's
accuracy budget:

* ``kind = "ulp"`` (elementwise ops): ULP of the output dtype from the precise oracle's correctly
  rounded result (precise.py);
* the accumulating kinds (``summation``, ``mean``, ``product``, ``softmax``, ``dot``, ``norm``,
  ``attention``, ``xent``: judge/budgets.py): a per-element allowance gamma_D sum|terms| for
  a summation of depth D (min(n - 1, c ceil(log2 n)) for sums, min(K - 1, b - 1 + ceil(K/b)) for
  K-blocked dot products), plus ``ulp`` for the final rounding;
  measured against the precise oracle where the op has one, else against the CPU reference with
  the reference's own worst-case error added to the allowance.

Verdicts:

* The reference over budget is a **reference bug**: the case reports ``error`` with a message
  starting "reference bug:" (a known divergence never hides it: it is not the backend's).
* The backend over budget **fails** the case (``over_budget`` > 0, the message names the budget:
  "over accuracy budget (accuracy.toml#N: op dtype ...)"), exactly like a value mismatch: only a
  known divergence of category ``precision`` excuses it (run/outcomes.py).
* A case failing the differential comparison says which side the precise oracle supports.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge import budgets, precise
from rlx_conformance.judge.budget_table import KINDS, Budget, budget_for, low_precision  # noqa: F401 — re-exported
from rlx_conformance.judge.compare import (
    Bound,
    asserted,
    bit_equal,
    element_errors,
    ulp_distance_bits,
    ulp_size_of,
)
from rlx_conformance.spec.registry import OpSpec


def missing_budgets(specs: Iterable[OpSpec]) -> list[str]:
    """(op, dtype) pairs of ``specs`` that need a budget and have none, or not of the kind they
    need: every float output of an op with a precise oracle, and of every accumulating op
    (judge/budgets.py ACCUMULATING) a budget of its kind, unless budgets.NO_BUDGET names the
    op/dtype with its reason. Must be empty (a test checks, over the
    whole registry)."""
    out = []
    for spec in specs:
        kind = budgets.ACCUMULATING.get(spec.name)
        if not precise.has_oracle(spec.name) and kind is None:
            continue
        for d in spec.dtypes:
            out_d = [d] if spec.name != "cast" else list(dt.FLOATS)
            for od in out_d:
                if dt.is_float(od) and f"{spec.name}/{od}" not in budgets.NO_BUDGET:
                    b = _budget_of(spec.name, od)
                    if b is None or (kind is not None and b.kind != kind):
                        out.append(f"{spec.name}/{od}")
    return sorted(set(out))


# -- measuring one output against the precise oracle ---------------------------------------------
@dataclass
class Measure:
    """One implementation's output against the precise oracle (or, for a budget of an op without
    one, the reference), over the asserted positions."""

    max_ulp: float = 0.0
    over: int = 0  # positions over budget (value, NaN, inf or asserted signed-zero mismatches)
    nan: int = 0
    inf: int = 0
    signed_zero: int = 0  # sign-of-zero mismatches (counted over budget only where asserted)
    ftz: int = 0  # subnormal results accepted as flushed zeros (declared FTZ only)
    checked: int = 0
    worst: int | None = None  # flat index of the worst position over budget
    worst_ulp: float = 0.0
    # accumulating kinds: the largest |error| / allowance over the assessed positions (> 1: over)
    max_ratio: float = 0.0
    worst_ratio: float = 0.0
    over_mask: np.ndarray | None = field(default=None, repr=False)


def measure(got: np.ndarray, want: np.ndarray, budget: Budget, *, skip: np.ndarray | None = None,
            bound: np.ndarray | Bound | None = None, allow: np.ndarray | None = None,
            signed_zero: bool = False, ftz: bool = False, compute_dtype: str | None = None) -> Measure:
    """``got`` against ``want`` (the precise oracle's value, or the reference's; same dtype and
    shape), flattened. ``bound``: the registry's worst-case bound (an array or a compare.Bound):
    only its order-dependent positions matter here, and they are left out (their outcome is not
    the oracle's to decide). ``allow``: an accumulating budget's per-element allowance
    (judge/budgets.py), to which ``budget.ulp`` ULP of the output dtype are added; a NaN or
    infinite allowance leaves the value there unassessed (its NaN/inf pattern still counts).
    ``skip``: positions the spec leaves undefined. The per-element errors are
    compare.element_errors'; unlike compare(), an infinity is judged by its ULP distance (one past
    the largest finite value) like any other value."""
    name = dt.name_of(want.dtype)
    mask, _ = asserted(want.shape, skip, Bound.of(bound))
    mask = mask.reshape(-1)
    if got.dtype == want.dtype and bit_equal(want, got):
        # every position is the same bits (a reference or target that rounds to the correctly
        # rounded result everywhere, as most do): 0 ULP and a zero error, within any budget and
        # allowance; no NaN, infinity or signed zero differs, nothing to flush; the general path
        # below gives exactly this Measure, at the cost of ~30 passes over the arrays
        return Measure(checked=int(mask.sum()), over_mask=np.zeros(mask.shape, bool))
    err = element_errors(want.reshape(-1), got.reshape(-1))
    g, w, ulp = err.actual, err.expected, err.ulp
    nan_bad, inf_bad, both = err.nan_bad, err.inf_bad, ~err.nan
    ratio = None
    with np.errstate(all="ignore"):
        abs_err = err.abs_diff if err.all_finite else np.where(err.finite, err.abs_diff, np.inf)
        within = ulp <= budget.ulp
        if budget.atol:
            within |= abs_err <= budget.atol
        if allow is not None:
            a = np.broadcast_to(np.asarray(allow, np.float64), want.shape).reshape(-1)
            assessed = np.isfinite(a)
            total = np.where(assessed, a, 0.0) + budget.ulp * ulp_size_of(want.reshape(-1))  # w's
            within |= ~assessed | (abs_err <= total)
            # abs_err / total, and where total is not positive (rare): inf for an error, else 0;
            # the same values as a select over every position, without its branchy passes
            per = abs_err / total
            nonpos = ~(total > 0)
            if nonpos.any():
                per[nonpos] = np.where(abs_err[nonpos] > 0, np.inf, 0.0)
            ratio = np.where(assessed & err.finite, per, 0.0)
        sz = err.signed_zero
        flushed = np.zeros_like(mask)
        if ftz:
            tiny = dt.finfo(compute_dtype or dt.compute_dtype(name)).tiny
            flushed = both & (g == 0) & (w != 0) & (np.abs(w) < tiny)
    bad = (nan_bad | (both & ~within & ~flushed) | (sz if signed_zero else False)) & mask
    m = Measure(checked=int(mask.sum()), nan=int((nan_bad & mask).sum()),
                inf=int((inf_bad & mask).sum()), signed_zero=int((sz & mask).sum()),
                ftz=int((flushed & ~within & mask).sum()), over=int(bad.sum()), over_mask=bad)
    fin = mask if err.all_finite else mask & both
    if fin.any():
        # every position assessed and finite: the masked copies would be ulp and ratio themselves
        # (both >= 0 and free of NaN there), so their maxima are read directly
        whole = err.all_finite and bool(mask.all())
        m.max_ulp = float(np.max(ulp if whole else np.where(fin, ulp, 0.0)))
        if ratio is not None:
            m.max_ratio = float(np.max(ratio if whole else np.where(fin, ratio, 0.0)))
    if m.over:
        key = ratio if ratio is not None else ulp
        score = np.where(bad, np.where(np.isnan(key), np.inf, key), -1.0)
        m.worst = int(np.argmax(score))
        m.worst_ulp = float(ulp[m.worst]) if not np.isnan(ulp[m.worst]) else float("inf")
        m.worst_ratio = float(score[m.worst]) if ratio is not None else 0.0
    return m


# -- settling most of a sweep's elements before measure() -------------------------------------------
@dataclass
class Settled:
    """:func:`settle`'s answer, as arrays of its array module."""

    mask: Any  # positions measure() certainly passes
    finite: Any  # both sides finite
    ulp: Any  # ULP distance (float64; meaningless where either side is NaN)


def settle(got_bits, want_bits, dtype: str, budget: Budget, xp=np) -> Settled:
    """The positions that :func:`measure` passes whatever its options, decided on the bits of
    two arrays of float ``dtype`` alone, so that the float32 sweep (run/exhaustive_f32.py) can
    settle the bulk of 2^32 elements on the device and send only the rest to measure() on the
    host: bit-equal, both NaN, or finite on both sides within ``budget.ulp`` ULP (the ordered-bit
    distance of compare.ulp_distance) and not zeros of opposite sign. measure() passes each of
    them (its ``skip``, ``signed_zero``, ``ftz`` and ``atol`` can only pass more) and finds the
    same ULP there; what is left (over the ULP budget, a NaN or infinity pattern that differs, a
    signed-zero mismatch) may pass or fail and is measure()'s to judge. ``xp``: numpy or CuPy;
    only operations the two share."""
    fi = dt.finfo(dtype)
    magnitude = xp.asarray((1 << (fi.bits - 1)) - 1, dtype=fi.uint)
    inf = xp.asarray(int(np.array(np.inf, dt.np_dtype(dtype)).view(fi.uint)), dtype=fi.uint)
    gm, wm = got_bits & magnitude, want_bits & magnitude
    finite = (gm < inf) & (wm < inf)
    ulp = ulp_distance_bits(got_bits, want_bits, fi.bits, xp)
    opposite_zeros = (gm == 0) & (wm == 0) & (got_bits != want_bits)
    mask = ((got_bits == want_bits) | ((gm > inf) & (wm > inf))
            | (finite & (ulp <= budget.ulp) & ~opposite_zeros))
    return Settled(mask, finite, ulp)


def certainly_over(settled: Settled, got_bits, want_bits, dtype: str, budget: Budget, *, ftz: bool,
                   xp=np):
    """The positions that :func:`measure` fails whatever its ``skip``-free options, decided on
    the bits alone: finite on both sides, an expected value that is not zero, more than
    ``budget.ulp`` ULP apart, and no absolute tolerance that could pass them (a budget with
    ``atol`` defers everything), for measure() without ``allow`` or ``bound`` (as the sweep calls
    it). Left out: under ``ftz`` a zero result where the expected value is subnormal (measure()
    accepts it as flushed); NaN and infinities (their pattern is its to count); and, to be safe
    rather than exhaustive, every expected zero (signed zeros are measure()'s to judge). The
    float32 sweep counts these on the device instead of sending them to the host: an op whose
    kernel is far off on a large share of the 2^32 inputs (elu's exp(x) - 1 below ~0.35) would
    otherwise move ~10^9 elements through measure() on the host. They carry
    ``settled.ulp`` as measure() computes it there."""
    if budget.atol:
        return xp.zeros(got_bits.shape, bool)
    fi = dt.finfo(dtype)
    magnitude = xp.asarray((1 << (fi.bits - 1)) - 1, dtype=fi.uint)
    want_mag = want_bits & magnitude
    keep = want_mag != 0
    if ftz:  # a zero for a subnormal may be a declared flush
        smallest_normal = xp.asarray(1 << fi.mant_bits, dtype=fi.uint)
        keep &= ((got_bits & magnitude) != 0) | (want_mag >= smallest_normal)
    return settled.finite & keep & (settled.ulp > budget.ulp)


# -- per-case assessment -----------------------------------------------------------------------------
class _Cache:
    """What the cases of one input id share (they differ only in target, and run back to back):
    the precise oracle's values and the budgets' allowances, for the last few input ids."""

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


PRECISE_CACHE = _Cache()
REF_MEASURE_CACHE = _Cache()


def _fmt(v) -> str:
    return repr(v.item() if hasattr(v, "item") else v)


def _where(shape, flat: int) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _budget_of(op: str, dtype: str) -> Budget | None:
    try:
        return budget_for(op, dtype)
    except RlxError:
        return None


def assess(case, inputs: list[np.ndarray], expected: list[np.ndarray],
           actual: list[np.ndarray], ok: bool, *, ftz: bool,
           bounds: list[Any] | None = None) -> dict[str, Any] | None:
    """The accuracy verdict on one case: CaseResult fields plus ``reference_bug`` (a message or
    None), ``over_budget_message`` (the failing verdict's message when the target is over budget,
    else "") and ``note`` (appended to a case failing the differential comparison). None when
    the op has neither a precise oracle nor an accumulating budget.

    ``ftz``: whether the target documents flushing subnormal results to zero
    (Backend.flushes_subnormals of its device), the one thing about the target the verdict needs;
    the caller knows the backend, this layer does not. ``bounds``: the worst-case bound of each
    output as the differential judge computed it (None entries where it has none): their
    order-dependent positions are left out."""
    spec = case.spec
    if os.environ.get("RLX_CONFORMANCE_ORACLE", "").lower() in ("0", "off", "no"):
        return None  # switched off (to measure its overhead): no oracle fields, no verdict
    attrs = case.attr_dict
    out_dtypes = [dt.name_of(e.dtype) for e in expected]
    floats = [precise.is_float_output(d) for d in out_dtypes]
    if not any(floats):
        return None
    budgets_ = [_budget_of(case.op, d) if f else None for d, f in zip(out_dtypes, floats)]
    oracle = precise.has_oracle(case.op) and spec.policy.check is None
    accumulating = any(b is not None and b.kind != "ulp" for b in budgets_)
    if not oracle and not accumulating:
        return None

    def make():
        orc = precise.compute(case.op, inputs, attrs, out_dtypes) if oracle else [None] * len(out_dtypes)
        allows = [budgets.KINDS[b.kind](case.op, inputs, attrs, d, b)
                  if b is not None and b.kind != "ulp" else None for b, d in zip(budgets_, out_dtypes)]
        return orc, allows

    orc, allows = PRECISE_CACHE.get(getattr(case, "values_id", None) or case.input_id, make)  # layouts share it
    bounds = bounds or [None] * len(expected)
    undefined = spec.undefined(inputs, attrs)
    res: dict[str, Any] = {"oracle_ulp_ref": 0.0 if oracle else None, "oracle_ulp_target": 0.0,
                           "over_budget": 0, "over_budget_ref": 0 if oracle else None, "ftz_used": False,
                           "budget_against": "oracle" if oracle else "reference"}
    ref_msgs, tgt_msgs = [], []
    budget = None
    ratio = None
    for k, (o, e, a, bnd, d, b, al) in enumerate(zip(orc, expected, actual, bounds, out_dtypes,
                                                     budgets_, allows)):
        if b is None or (oracle and o is None) or (not oracle and al is None):
            continue
        want = o if oracle else e
        if e.shape != want.shape or a.shape != want.shape or a.dtype != want.dtype:
            continue
        budget = b
        skip = None if undefined is None else np.broadcast_to(undefined, want.shape)
        allow = None
        if al is not None:  # the reference's own worst case widens a budget judged against it
            allow = al.abs + al.ref if not oracle else al.abs
        if not oracle:  # NaN and infinities are the worst-case judge's (or the op's own check's)
            fin = np.isfinite(e.astype(np.float64)) & np.isfinite(a.astype(np.float64))
            skip = ~fin if skip is None else (skip | ~fin)
        kw: dict[str, Any] = {"skip": skip, "bound": bnd, "allow": allow,
                              "signed_zero": spec.policy.signed_zero, "compute_dtype": dt.compute_dtype(d)}
        sides = []
        r = None
        if oracle:  # the reference's measure is the same for every target of the input id
            key = f"{case.input_id}#{k}#{hash(e.tobytes())}"  # keyed by its bytes: never stale
            r = REF_MEASURE_CACHE.get(key, partial(measure, e, want, budget, **kw))
            res["oracle_ulp_ref"] = max(res["oracle_ulp_ref"], r.max_ulp)
            res["over_budget_ref"] += r.over
            sides.append((r, ref_msgs, e))
        # measure() is a function of the bits it is given: a target output bit-identical to the
        # reference's, measured against the same value with the same options (ftz is the one the
        # reference's measure leaves off), measures as the reference did
        same = r is not None and not ftz and e.dtype == a.dtype and bit_equal(e, a)
        t = r if same else measure(a, want, budget, ftz=ftz, **kw)
        res["oracle_ulp_target"] = max(res["oracle_ulp_target"], t.max_ulp)
        res["over_budget"] += t.over
        res["ftz_used"] |= t.ftz > 0
        if al is not None:
            ratio = max(ratio or 0.0, t.max_ratio)
        sides.append((t, tgt_msgs, a))
        for m, msgs, got in sides:
            if m.over:
                i = m.worst
                idx = _where(want.shape, i)
                ins = ""
                if spec.family in ("activation", "binary", "select", "cast"):
                    bins = np.broadcast_arrays(*inputs) if inputs else []
                    ins = "input " + ", ".join(_fmt(x.reshape(-1)[i]) for x in bins) + ": "
                what = "correctly rounded" if oracle else "reference"
                size = (f"{m.worst_ratio:.3g} x the allowance {al.what}" if al is not None
                        else f"budget {budget.ulp:g} ulp")
                msgs.append(f"output {k}: {m.over}/{m.checked} over budget, worst at {idx}: {ins}"
                            f"{what} {_fmt(want.reshape(-1)[i])}, got {_fmt(got.reshape(-1)[i])} "
                            f"({m.worst_ulp:g} ulp; {size})")
    if budget is None:
        return None
    res["budget"] = budget.to_json()
    res["budget_ratio"] = ratio
    if not oracle:  # ULP from the reference are compare's max_ulp already, not an oracle's
        res["oracle_ulp_target"] = None
    ref_bad, tgt_bad = (res["over_budget_ref"] or 0) > 0, res["over_budget"] > 0
    res["reference_bug"] = None
    res["over_budget_message"] = ""
    res["note"] = ""
    named = f"over accuracy budget ({budget.describe(case.op, case.dtype)})"
    if tgt_bad:
        res["over_budget_message"] = named + ": " + "; ".join(tgt_msgs)
    if ref_bad:
        res["oracle_verdict"] = "reference-bug"
        side = ("the oracle supports the target (within budget, max "
                f"{res['oracle_ulp_target']:g} ulp)") if not tgt_bad else \
            "the target is over budget too: " + "; ".join(tgt_msgs)
        res["reference_bug"] = (f"reference bug: the CPU reference of {case.op}/{case.dtype} is farther "
                                f"from the correctly rounded result than its accuracy budget "
                                f"({budget.source}): " + "; ".join(ref_msgs) + f"; {side}")
    elif not ok:
        if not oracle:
            res["oracle_verdict"] = "target-over-budget" if tgt_bad else "ok"
            if tgt_bad:
                res["note"] = "also " + res["over_budget_message"]
        elif tgt_bad:
            res["oracle_verdict"] = "supports-reference"
            res["note"] = ("oracle: supports the reference (within budget, max "
                           f"{res['oracle_ulp_ref']:g} ulp); the target is over budget: " + "; ".join(tgt_msgs))
        else:
            res["oracle_verdict"] = "both-within-budget"
            res["note"] = (f"oracle: both within the accuracy budget ({budget.describe(case.op, case.dtype)}; "
                           f"reference max {res['oracle_ulp_ref']:g}, target max "
                           f"{res['oracle_ulp_target']:g} ulp): the cross tolerance is tighter than the budget here")
    else:
        res["oracle_verdict"] = "target-over-budget" if tgt_bad else "ok"
    return res
