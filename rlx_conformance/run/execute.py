"""Run one case in the current process: inputs → reference → target → comparison → CaseResult.
The runner calls this inside isolated worker processes."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import record_fields
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import KernelContractError, UnsupportedError, error_detail
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import is_graph
from rlx_conformance.generate.matrix import Case, case_layouts, make_inputs
from rlx_conformance.judge import accuracy
from rlx_conformance.judge.compare import (
    BIT_EXACT_TOLERANCE,
    Bound,
    Comparison,
    compare,
    wrong_summary,
)
from rlx_conformance.judge.positions import source
from rlx_conformance.judge.stability import output_digest
from rlx_conformance.judge.tolerances import tolerance_for
from rlx_conformance.run import derivatives, graph_grad, graphs


class _RefCache:
    """Inputs and reference outputs of the last few values ids (Case.values_id: cases of one id
    differ only in target, or in a layout that leaves the values alone, and run back to back),
    and the seconds the reference took (:meth:`seconds`: the runner scales a kernel's time
    limit from it)."""

    def __init__(self, size: int = 4):
        self.size = size
        self._d: OrderedDict[str, tuple[list[np.ndarray], Any]] = OrderedDict()
        self._s: dict[str, float] = {}

    def get(self, case: Case) -> tuple[list[np.ndarray], Any]:
        hit = self._d.get(case.values_id)
        if hit is not None:
            return hit
        inputs = make_inputs(case)
        t0 = time.perf_counter()
        try:
            ref: Any = get_backend("cpu").run(case.op, [x.copy() for x in inputs], case.attr_dict)
        except Exception as e:  # noqa: BLE001 — recorded as the case's error
            ref = e
        self._s[case.values_id] = time.perf_counter() - t0
        self._d[case.values_id] = (inputs, ref)
        if len(self._d) > self.size:
            gone, _ = self._d.popitem(last=False)
            self._s.pop(gone, None)
        return inputs, ref

    def seconds(self, case: Case) -> float:
        """How long the reference of ``case``'s values took (0 when not computed here)."""
        return self._s.get(case.values_id, 0.0)


REF_CACHE = _RefCache()


def judge(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray],
          actual: list[np.ndarray]):
    """Compare every output under the op's policy; returns (ok, comparisons, tolerance)."""
    ok, comps, tol, _ = judge_with_bounds(case, inputs, expected, actual)
    return ok, comps, tol


def judge_with_bounds(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray],
                      actual: list[np.ndarray]):
    """:func:`judge`, plus the worst-case bound of each output (None where it has none), which
    the accuracy budgets and the vacuity count read too (computed once: at 10^6 elements it is
    not free)."""
    spec = case.spec
    attrs = case.attr_dict
    if spec.policy.check is not None:
        comps = spec.policy.check(inputs, attrs, expected, actual)
        return all(c.ok for c in comps), comps, None, [None] * len(expected)
    undefined = spec.undefined(inputs, attrs)
    comps = []
    bounds: list[Bound | None] = []
    tol = None
    for k, (e, a) in enumerate(zip(expected, actual)):
        out_dt = dt.name_of(e.dtype)
        exact = spec.policy.exact or not dt.is_float(out_dt)
        tol = BIT_EXACT_TOLERANCE if exact else tolerance_for(case.op, out_dt)
        bound = None
        if spec.policy.bound is not None and not exact and e.shape == a.shape:
            bound = spec.policy.bound(inputs, attrs, out_dt)
        skip = None
        if undefined is not None and e.shape == a.shape:
            skip = np.broadcast_to(undefined, e.shape)
        comps.append(compare(e, a, exact=exact, signed_zero=spec.policy.signed_zero, tol=tol,
                             bound=bound, skip=skip, name=f"output {k}"))
        bounds.append(Bound.of(bound))
    return all(c.ok for c in comps), comps, tol, bounds


def vacuous(expected: list[np.ndarray], bounds: list[Bound | None]) -> int:
    """Elements whose worst-case bound exceeds |result| (finite result, asserted position): the
    bound leaves even the result's sign open there."""
    n = 0
    for e, b in zip(expected, bounds):
        if b is None or not dt.is_float(dt.name_of(e.dtype)):
            continue
        babs, free, _ = b.arrays(e.shape)
        with np.errstate(invalid="ignore"):
            e64 = e.astype(np.float64)
            n += int((~free & np.isfinite(e64) & np.isfinite(babs) & (babs > np.abs(e64))).sum())
    return n


def element_text(x: np.ndarray, pos: tuple[int, ...]) -> str:
    """One element in its dtype's shortest repr (float32 0.1 reads 0.1, not 0.10000000149)."""
    return str(np.asarray(x)[pos])


def mismatch(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray], actual: list[np.ndarray],
             comps: list[Comparison]) -> dict[str, Any] | None:
    """The failing outputs' wrong elements, for a record (only on failure, the first few
    positions): per kind counts (NaN, inf, value, signed zero...), and for each listed position
    the reference's and the target's values and, for a gather or scatter, the index tuple that
    produced it (judge/positions.py); ``exact``: every failing output is judged bit for bit
    (integers, data movement), where wrong positions say what ULP figures cannot. None when no
    comparison lists positions."""
    wrong = [(k, c) for k, c in enumerate(comps) if not c.ok and c.positions]
    if not wrong:
        return None
    first: list[dict[str, Any]] = []
    for k, c in wrong:
        e = expected[k] if k < len(expected) else None
        a = actual[k] if k < len(actual) else None
        for pos in c.positions:
            row: dict[str, Any] = {"output": k, "at": list(pos)}
            if e is not None and a is not None and e.shape == a.shape:
                row["expected"], row["actual"] = element_text(e, pos), element_text(a, pos)
            where = source(case.op, inputs, case.attr_dict, pos)
            if where:
                row["from"] = where
            first.append(row)
    return {**wrong_summary(comps), "exact": all(c.exact for _, c in wrong), "first": first}


@dataclass
class Verdict:
    """Every judge's say on one output of the backend under test: ``ok`` (the worst-case bound or
    tolerance, the non-finite pattern, the op's own check, and the accuracy budget), the message
    of what failed, the measured fields of the record, and, where the precise oracle found the
    *reference* wrong, why (a harness bug: the case errors)."""

    ok: bool
    message: str
    measured: dict[str, Any]
    reference_bug: str = ""


def verdict(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray], actual: list[np.ndarray],
            ftz: bool = False) -> Verdict:
    """Judge ``actual`` for ``case`` exactly as the matrix does (run_case calls it; so do the
    judge audit and the sensitivity benchmark, which hand it deliberately wrong outputs).
    ``ftz``: whether the target may flush subnormal results to zero."""
    with np.errstate(all="ignore"):  # NaN/inf in the error arithmetic are expected, not news
        ok, comps, tol, bounds = judge_with_bounds(case, inputs, expected, actual)
        # the accuracy budgets (accuracy.py): is the reference, is the target, accurate?
        orc = accuracy.assess(case, inputs, expected, actual, ok, ftz=ftz, bounds=bounds) \
            if case.declared else None
        n_vacuous = vacuous(expected, bounds)
    measured: dict[str, Any] = {
        "max_abs_err": max((c.max_abs_err for c in comps), default=0.0),
        "max_rel_err": max((c.max_rel_err for c in comps), default=0.0),
        "max_ulp": max((c.max_ulp for c in comps), default=0.0),
        "tolerance": tol.to_json() if tol else None}
    unasserted = {k: sum(getattr(c, k) for c in comps) for k in ("order_dependent", "unbounded")}
    if any(unasserted.values()):
        measured["unasserted"] = {k: v for k, v in unasserted.items() if v}
    if n_vacuous:
        measured["vacuous_bound"] = n_vacuous
    nonfinite = sum(c.nonfinite for c in comps)
    if nonfinite:
        measured["nonfinite_mismatches"] = nonfinite
    if not ok:
        wrong = mismatch(case, inputs, expected, actual, comps)
        if wrong:
            measured["mismatch"] = wrong
    msg = "; ".join(c.message for c in comps if c.message)
    if orc is None:
        return Verdict(ok, msg, measured)
    refbug, note, over = orc.pop("reference_bug"), orc.pop("note"), orc.pop("over_budget_message")
    measured.update(orc)
    if refbug:
        return Verdict(False, msg, measured, reference_bug=refbug)
    if note and not ok:
        msg = f"{msg}; {note}"
    elif over and ok:  # over its accuracy budget: a failure like any value mismatch
        ok = False
        msg = over + (f" (worst-case bound vacuous here: {n_vacuous} element(s) with bound > |result|)"
                      if n_vacuous else "")
    return Verdict(ok, msg, measured)


def layout_kw(case: Case, inputs: list[np.ndarray]) -> dict[str, Any]:
    """Backend.run's ``layout`` keyword for a layout case (none for a contiguous one, so that a
    backend without layouts runs contiguous cases as before)."""
    return {"layout": case_layouts(case, inputs)} if case.layout else {}


Phase = Callable[..., None]  # on_phase("kernel", reference seconds) / on_phase("judge")


def marks_kernel_phase(case: Case) -> bool:
    """Whether :func:`run_case` tells ``on_phase`` when ``case``'s kernel is called: an op's own
    case does; a derivative or graph case (its own transform, several calls) does not."""
    return not (is_graph(case) or case.grad)


def run_case(case: Case, capture: dict[str, Any] | None = None, on_phase: Phase | None = None) -> CaseResult:
    """``capture``: filled with the arrays of the case (inputs, expected, actual as far as they
    came), for the repro bundle of a failing case (bundle.py). ``on_phase``: told when the
    target's kernel is called (``"kernel"``, with the seconds the reference took) and when it
    returned (``"judge"``): the runner gives the kernel call a limit scaled from the reference's
    time and the harness's own work (inputs, reference, judging) the generous one."""
    if is_graph(case):  # a graph of ops (issue 17): composed reference, propagated bound; its VJP
        return (graph_grad.run if case.grad else graphs.run)(case, capture)
    if case.grad:  # a derivative of the op: its own reference, transform and judge
        return derivatives.run(case, capture)
    t0 = time.perf_counter()
    inputs, ref = REF_CACHE.get(case)
    if capture is not None:
        capture.update(inputs=inputs, expected=ref)
    if isinstance(ref, Exception):
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0,
                                   message=f"reference failed: {type(ref).__name__}: {ref}")
    tg = case.target
    backend = get_backend(tg.backend)
    entry = backend.kernels.get(case.op)
    kw = record_fields(entry)
    if tg.backend == "mlx" and entry is not None:
        stream = backend.stream_for(entry, [d for d in case.spec.case_dtypes(case.dtype, len(inputs))], tg.device)
        if stream != tg.device:
            kw["stream"] = stream
    if on_phase is not None:
        on_phase("kernel", REF_CACHE.seconds(case))
    t1 = time.perf_counter()
    try:
        out = backend.run(case.op, [x.copy() for x in inputs], case.attr_dict, tg.device, tg.mode,
                          force=not case.declared, **layout_kw(case, inputs))
        kw["backend_s"] = time.perf_counter() - t1
        if capture is not None:
            capture["actual"] = out
    except UnsupportedError as e:
        return CaseResult.for_case(case, "skip", duration_s=time.perf_counter() - t0, message=str(e), **kw)
    except Exception as e:  # noqa: BLE001 — any kernel failure is a result, not a harness crash
        dur = time.perf_counter() - t0
        if not case.declared:
            return CaseResult.for_case(case, "skip", duration_s=dur, **kw, message=(
                f"declared unsupported on {tg.backend}/{tg.device}; the kernel rejects it as declared: "
                f"{type(e).__name__}: {e}"))
        detail = error_detail(e)
        # A broken call convention (output count/shape/dtype, non-array, input written) is its own
        # outcome, never a numeric mismatch or a generic error.
        outcome = "contract" if isinstance(e, KernelContractError) else "error"
        return CaseResult.for_case(case, outcome, duration_s=dur, message=detail, **kw)
    finally:
        if on_phase is not None:
            on_phase("judge")
    kw["output_digest"] = output_digest(out)  # bit-stability across repeats and modes
    try:
        v = verdict(case, inputs, ref, out, ftz=backend.flushes_subnormals(tg.device))
    except Exception as e:  # noqa: BLE001 — a bug in a judge is the harness's, reported as such
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0, **kw, message=(
            f"harness error while judging: {type(e).__name__}: {e}"))
    measured = dict(v.measured, duration_s=time.perf_counter() - t0, **kw)
    ok, msg = v.ok, v.message
    if v.reference_bug:  # the reference itself is wrong: never a pass, never hidden by a divergence
        return CaseResult.for_case(case, "error", message=v.reference_bug + (f" [{msg}]" if msg else ""),
                                   **measured)
    if not case.declared:
        if ok and not any(np.size(x) for x in inputs):
            # nothing to compute: running without an error says nothing about the dtype (MLX
            # launches no kernel for an empty array, so one it lacks is never looked up)
            return CaseResult.for_case(case, "skip", message=(
                f"declared unsupported on {tg.backend}/{tg.device}; empty inputs run, which proves "
                "nothing about the dtype"), **measured)
        if ok:
            return CaseResult.for_case(case, "fail", message=(
                f"declared unsupported on {tg.backend}/{tg.device}, but the kernel runs {case.dtype} and "
                "matches the reference: add the dtype to the kernel's declaration"), **measured)
        return CaseResult.for_case(case, "skip", message=(
            f"declared unsupported on {tg.backend}/{tg.device} (runs, but disagrees: {msg})"), **measured)
    return CaseResult.for_case(case, "pass" if ok else "fail", message=msg, **measured)
