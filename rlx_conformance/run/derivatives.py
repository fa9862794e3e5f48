"""Run one derivative case (Case.grad: vjp, jvp or hvp) in the current process: the forward
case's inputs, the seeds from the id, the reference rules (float64, rounded once to each result's
dtype), the backend's own transform of the same kernel, and the derivative judge
(judge/bounds/derivative.py). run/execute.py hands every case with ``grad`` set here."""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import record_fields
from rlx_conformance.backends.cpu._grad import argument_sensitivity, largest_intermediate
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import KernelContractError, UnsupportedError, error_detail
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, Seeds, make_inputs, make_seeds
from rlx_conformance.judge.bounds.derivative import (
    argument_roundings_for,
    derivative_judgement,
    overflow_rule_for,
    roundings_for,
)
from rlx_conformance.judge.compare import Bound, Comparison, compare, wrong_summary
from rlx_conformance.judge.stability import output_digest
from rlx_conformance.judge.tolerances import default_tolerance
from rlx_conformance.run.recent import Recent


@dataclass
class Reference:
    """What every target of one derivative input id shares: inputs, seeds, the reference's
    results (None where an input or output has no derivative), their dtypes, the magnitudes and
    term count of the bound, the sensitivity to the rounding of the derivative formula's own
    arguments and its largest intermediate (None where the op declares none: judge/bounds/
    derivative.py), and the positions the spec leaves undefined."""

    inputs: list[np.ndarray]
    seeds: Seeds
    expected: list[np.ndarray | None]
    dtypes: list[str | None]
    magnitude: list[np.ndarray | None]
    terms: int
    undefined: list[np.ndarray | None]
    argument: list[np.ndarray | None] | None = None
    intermediate: list[np.ndarray | None] | None = None


def result_dtypes(case: Case, inputs: list[np.ndarray]) -> list[str | None]:
    """The dtype of each derivative result: an input's (vjp, hvp) or an output's (jvp)."""
    if case.grad == "jvp":
        _, outs = case.spec.validate([x.shape for x in inputs], [dt.name_of(x.dtype) for x in inputs],
                                     case.attr_dict)
        return [d if dt.is_float(d) else None for _, d in outs]
    return [dt.name_of(x.dtype) for x in inputs]


def reference(case: Case) -> Reference:
    """The reference side of ``case`` (raises what the reference raises)."""
    inputs = make_inputs(case)
    seeds = make_seeds(case, inputs)
    cpu = get_backend("cpu")
    attrs = case.attr_dict
    raw = cpu.run_derivative(case.op, case.grad, [x.copy() for x in inputs], attrs,
                             list(seeds.cotangents), list(seeds.tangents))
    dtypes = result_dtypes(case, inputs)
    expected = [None if r is None else r.astype(dt.np_dtype(d)) for r, d in zip(raw, dtypes)]
    seed_list = list(seeds.cotangents) if case.grad == "vjp" else list(seeds.tangents) \
        if case.grad == "jvp" else list(seeds.cotangents) + list(seeds.tangents)
    mags, terms = cpu.run_magnitude(case.op, case.grad, inputs, attrs, seed_list)
    undefined = cpu.undefined_positions(case.op, case.grad, inputs, attrs) or [None] * len(expected)
    args = argument_sensitivity(case.op, case.grad, inputs, attrs, seed_list)
    inter = largest_intermediate(case.op, case.grad, inputs, attrs)
    return Reference(inputs, seeds, expected, [d if r is not None else None for r, d in zip(raw, dtypes)],
                     list(mags), terms, list(undefined), args, inter)


def result_bound(case: Case, ref: Reference, k: int) -> Bound | None:
    """The judgement of derivative result ``k`` (judge/bounds/derivative.derivative_judgement:
    the magnitude's bound, the argument roundings, the overflow rule); None without a magnitude."""
    m = ref.magnitude[k]
    if m is None or ref.dtypes[k] is None:
        return None
    arg = None if ref.argument is None else ref.argument[k]
    inter = None if ref.intermediate is None else ref.intermediate[k]
    return derivative_judgement(case.op, ref.dtypes[k], m, ref.terms, native=case.spec.low_precision == "native",
                                argument=arg, intermediate=inter)


def handed_seeds(case: Case, seeds: Seeds) -> Seeds:
    """The seeds as the backend under test gets them: the same values, but for every other input
    id (by a hash of the id) each seed of rank >= 2 in column-major memory. MLX keeps a numpy
    array's strides, so a kernel's ``mx.custom_function`` VJP/JVP then gets a non-contiguous
    cotangent/tangent, as it does in a model after a transpose: one that reads its seed's buffer
    as if row-major (right only for contiguous seeds) fails those cases. The reference and the
    judge see the seeds as made."""
    if not zlib.crc32(case.input_id.encode()) & 1:
        return seeds

    def f(s: np.ndarray | None) -> np.ndarray | None:
        return s if s is None or s.ndim < 2 else np.asfortranarray(s)
    return Seeds(tuple(map(f, seeds.cotangents)), tuple(map(f, seeds.tangents)))


CACHE: Recent[Case, Reference] = Recent(reference, lambda case: case.input_id)


def judge(case: Case, ref: Reference, actual: list[np.ndarray | None]) -> list[Comparison]:
    """Each derivative result against the reference's within its bound (and the dtype's final
    roundings); NaN and infinities exactly; undefined positions unasserted."""
    comps = []
    for k, (e, d, a, m, skip) in enumerate(zip(ref.expected, ref.dtypes, actual, ref.magnitude,
                                               ref.undefined)):
        what = ("output" if case.grad == "jvp" else "input") + f" {k}"
        if e is None:
            # The reference's rule gives this input no derivative in this case (a selector, e.g.
            # attention's custom mask, or an input the case's attributes leave unused). A backend
            # that declares the input differentiable returns its derivative anyway: zeros (no
            # cotangent flows into it) agree with the reference; anything else does not.
            if a is not None and np.any(np.asarray(a) != 0):
                comps.append(Comparison(False, message=f"d/d {what}: a nonzero result where the "
                                                       "reference has no derivative"))
            continue
        if a is None:
            comps.append(Comparison(False, message=f"d/d {what}: no result"))
            continue
        bound = result_bound(case, ref, k)
        comps.append(compare(e, np.asarray(a), exact=False, signed_zero=False, tol=default_tolerance(d),
                             bound=bound, skip=skip, name=f"{case.grad} {what}"))
    return comps


def run(case: Case, capture: dict[str, Any] | None = None) -> CaseResult:
    """A derivative case end to end, as run_case does a forward one."""
    t0 = time.perf_counter()
    ref = CACHE.get(case)
    if isinstance(ref, Exception):
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0,
                                   message=f"reference failed: {type(ref).__name__}: {ref}")
    if capture is not None:
        capture.update(inputs=ref.inputs, expected=ref.expected, seeds=ref.seeds)
    tg = case.target
    backend = get_backend(tg.backend)
    entry = backend.kernels.get(case.op)
    kw = record_fields(entry)
    t1 = time.perf_counter()
    try:
        seeds = handed_seeds(case, ref.seeds)
        out = backend.run_derivative(case.op, case.grad, [x.copy() for x in ref.inputs], case.attr_dict,
                                     list(seeds.cotangents), list(seeds.tangents), tg.device, tg.mode)
        kw["backend_s"] = time.perf_counter() - t1
        if capture is not None:
            capture["actual"] = out
    except UnsupportedError as e:
        return CaseResult.for_case(case, "skip", duration_s=time.perf_counter() - t0, message=str(e), **kw)
    except Exception as e:  # noqa: BLE001 — a failing transform is a result
        detail = error_detail(e)
        outcome = "contract" if isinstance(e, KernelContractError) else "error"
        return CaseResult.for_case(case, outcome, duration_s=time.perf_counter() - t0,
                                   message=detail, **kw)
    kw["output_digest"] = output_digest([x for x in out if x is not None])
    try:
        with np.errstate(all="ignore"):
            comps = judge(case, ref, out)
    except Exception as e:  # noqa: BLE001 — a bug in a judge is the harness's
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0, **kw,
                                   message=f"harness error while judging: {type(e).__name__}: {e}")
    ok = all(c.ok for c in comps)
    measured: dict[str, Any] = {
        "max_abs_err": max((c.max_abs_err for c in comps), default=0.0),
        "max_rel_err": max((c.max_rel_err for c in comps), default=0.0),
        "max_ulp": max((c.max_ulp for c in comps), default=0.0),
        "tolerance": {"max_ulp": max((default_tolerance(d).max_ulp for d in ref.dtypes if d), default=0.0),
                      "rtol": 0.0, "atol": 0.0,
                      "source": _bound_source(case, ref)}}
    nonfinite = sum(c.nonfinite for c in comps)
    if nonfinite:
        measured["nonfinite_mismatches"] = nonfinite
    unbounded = sum(c.unbounded for c in comps)
    if unbounded:
        measured["unasserted"] = {"unbounded": unbounded}
    if not ok:
        if any(not c.ok and c.positions for c in comps):
            measured["mismatch"] = {**wrong_summary(comps), "exact": False,
                                    "first": _first(case, ref, out, comps)}
    msg = "; ".join(c.message for c in comps if c.message)
    return CaseResult.for_case(case, "pass" if ok else "fail", message=msg,
                               duration_s=time.perf_counter() - t0, **measured, **kw)


def _bound_source(case: Case, ref: Reference) -> str:
    """Where the derivative bound's figures come from: the [[rule]] and term count, and the
    [[argument]] and [[overflow]] tables of cases/derivatives.toml that apply."""
    src = f"derivative:{roundings_for(case.op).source}+{ref.terms}terms"
    arg = argument_roundings_for(case.op)
    if arg is not None and ref.argument is not None:
        src += f"+{arg.source}"
    over = overflow_rule_for(case.op)
    return src + (f"+{over.source}" if over is not None else "")


def _first(case: Case, ref: Reference, actual: list[np.ndarray | None], comps: list[Comparison]
           ) -> list[dict[str, Any]]:
    """The first wrong positions of each failing result: which input's (vjp, hvp) or output's
    (jvp) derivative, where, the reference's and the target's values."""
    rows: list[dict[str, Any]] = []
    results = [k for k, e in enumerate(ref.expected) if e is not None]
    for k, c in zip(results, comps):
        if c.ok:
            continue
        e, a = ref.expected[k], actual[k]
        for pos in c.positions:
            row: dict[str, Any] = {("output" if case.grad == "jvp" else "input"): k, "at": list(pos)}
            if e is not None and a is not None and e.shape == np.shape(a):
                row["expected"], row["actual"] = str(e[pos]), str(np.asarray(a)[pos])
            rows.append(row)
    return rows
