"""Run one case in the current process: inputs → reference → target → comparison → CaseResult.
The runner calls this inside isolated worker processes."""
from __future__ import annotations

import time
import traceback
from collections import OrderedDict
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import KernelContractError, RlxError, UnsupportedError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, make_inputs
from rlx_conformance.judge import accuracy
from rlx_conformance.judge.compare import BIT_EXACT_TOLERANCE, compare
from rlx_conformance.judge.stability import output_digest
from rlx_conformance.judge.tolerances import tolerance_for


class _RefCache:
    """Inputs and reference outputs of the last few input ids (cases of one input id differ only
    in target and run back to back)."""

    def __init__(self, size: int = 4):
        self.size = size
        self._d: OrderedDict[str, tuple[list[np.ndarray], Any]] = OrderedDict()

    def get(self, case: Case) -> tuple[list[np.ndarray], Any]:
        hit = self._d.get(case.input_id)
        if hit is not None:
            return hit
        inputs = make_inputs(case)
        try:
            ref: Any = get_backend("cpu").run(case.op, [x.copy() for x in inputs], case.attr_dict)
        except Exception as e:  # noqa: BLE001 — recorded as the case's error
            ref = e
        self._d[case.input_id] = (inputs, ref)
        if len(self._d) > self.size:
            self._d.popitem(last=False)
        return inputs, ref


REF_CACHE = _RefCache()


def judge(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray],
          actual: list[np.ndarray]):
    """Compare every output under the op's policy; returns (ok, comparisons, tolerance)."""
    spec = case.spec
    attrs = case.attr_dict
    if spec.policy.check is not None:
        comps = spec.policy.check(inputs, attrs, expected, actual)
        return all(c.ok for c in comps), comps, None
    undefined = spec.undefined(inputs, attrs)
    comps = []
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
    return all(c.ok for c in comps), comps, tol


def run_case(case: Case, capture: dict[str, Any] | None = None) -> CaseResult:
    """``capture``: filled with the arrays of the case (inputs, expected, actual as far as they
    came), for the repro bundle of a failing case (bundle.py)."""
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
    kw: dict[str, Any] = {"kernel": "native" if entry is None or entry.native else "delegated"}
    if entry is not None and entry.origin != "builtin":
        kw["origin"] = entry.origin
    if tg.backend == "mlx" and entry is not None:
        stream = backend.stream_for(entry, [d for d in case.spec.case_dtypes(case.dtype, len(inputs))], tg.device)
        if stream != tg.device:
            kw["stream"] = stream
    t1 = time.perf_counter()
    try:
        out = backend.run(case.op, [x.copy() for x in inputs], case.attr_dict, tg.device, tg.mode,
                          force=not case.declared)
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
        detail = str(e) if isinstance(e, RlxError) else f"{type(e).__name__}: {e}\n" + \
            "".join(traceback.format_exception(e)[-3:])
        # A broken call convention (output count/shape/dtype, non-array, input written) is its own
        # outcome, never a numeric mismatch or a generic error.
        outcome = "contract" if isinstance(e, KernelContractError) else "error"
        return CaseResult.for_case(case, outcome, duration_s=dur, message=detail.strip(), **kw)
    kw["output_digest"] = output_digest(out)  # bit-stability across repeats and modes
    try:
        with np.errstate(all="ignore"):  # NaN/inf in the error arithmetic are expected, not news
            ok, comps, tol = judge(case, inputs, ref, out)
            # the precise oracle (accuracy.py): is the reference, is the target, right?
            ftz = backend.flushes_subnormals(tg.device)  # may the target flush subnormals to 0?
            orc = accuracy.assess(case, inputs, ref, out, ok, ftz=ftz) if case.declared else None
    except Exception as e:  # noqa: BLE001 — a bug in a judge is the harness's, reported as such
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0, **kw, message=(
            f"harness error while judging: {type(e).__name__}: {e}"))
    dur = time.perf_counter() - t0
    measured = dict(
        max_abs_err=max((c.max_abs_err for c in comps), default=0.0),
        max_rel_err=max((c.max_rel_err for c in comps), default=0.0),
        max_ulp=max((c.max_ulp for c in comps), default=0.0),
        tolerance=tol.to_json() if tol else None, duration_s=dur, **kw)
    msg = "; ".join(c.message for c in comps if c.message)
    if orc is not None:
        refbug, note = orc.pop("reference_bug"), orc.pop("note")
        measured.update(orc)
        if refbug:  # the reference itself is wrong: never a pass, never hidden by a divergence
            return CaseResult.for_case(case, "error", message=refbug + (f" [{msg}]" if msg else ""), **measured)
        if note and not ok:
            msg = f"{msg}; {note}"
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
