"""Run one graph case (op ``graph:NAME``, issue 17) in the current process: the graph inputs from
the id, the reference (the CPU backend's kernels composed in float64, casts applied as the graph
says), the error bound propagated node by node (judge/bounds/graph.py: each node's own rounding
plus the reference's JVP magnitude |J|·e of its inputs' error), the whole graph on the backend
under test (MlxBackend.run_graph: eager, lazy, or one mx.compile over the whole graph), and the
comparison of every output element. run/execute.py hands every graph case here."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import differentiable_arrays
from rlx_conformance.backends.cpu._grad import SAVED_TERMS
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import KernelContractError, UnsupportedError, error_detail
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import make_graph_inputs, resolved
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge.bounds.graph import (
    cast_error,
    decision_margin,
    graph_bound,
    own_error,
)
from rlx_conformance.judge.compare import Comparison, compare, wrong_summary
from rlx_conformance.judge.stability import output_digest
from rlx_conformance.judge.tolerances import default_tolerance, tolerance_for
from rlx_conformance.ops import get_op
from rlx_conformance.ops.graphs import Resolved, RNode
from rlx_conformance.run.recent import Recent


@dataclass
class Reference:
    """What every target of one graph input id shares: the inputs, each array's float64 reference
    value, its propagated error bound and its undecided positions (a discrete node's), and notes
    (nodes whose error the analysis could not bound)."""

    inputs: dict[str, np.ndarray]
    value: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, np.ndarray | None] = field(default_factory=dict)
    undecided: dict[str, np.ndarray] = field(default_factory=dict)
    dtype: dict[str, str] = field(default_factory=dict)
    unbounded_nodes: list[str] = field(default_factory=list)


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if dt.is_float(dt.name_of(x.dtype)) else x


def jacobian_product(op: str, kind: str, xs: list[np.ndarray], attrs: dict[str, Any],
                     seeds: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """|J| e (kind jvp, seeds the tangents e) or |J|ᵀ E (vjp, seeds the cotangents E) at ``xs``:
    the CPU backend's derivative magnitude (DerivativeRule.magnitude) less the part of it that is
    not the Jacobian's product with the seeds, the sensitivity to the rounding of the forward
    values a derivative is computed from (backends/cpu/_grad.SAVED_TERMS), which the derivative
    judge multiplies by u and which is no propagation of an input's error. UnsupportedError where
    the op declares no magnitude and the dense Jacobian is too large."""
    mags, _ = get_backend("cpu").run_magnitude(op, kind, xs, attrs, seeds)
    saved = SAVED_TERMS.get(op)
    if saved is None:
        return list(mags)
    with np.errstate(all="ignore"):
        extra = saved([np.asarray(x, np.float64) if dt.is_float(dt.name_of(np.asarray(x).dtype)) else x
                       for x in xs], attrs, kind,
                      [None if t is None else np.asarray(t, np.float64) for t in seeds])
        return [None if m is None else m if x is None else np.maximum(np.asarray(m) - np.asarray(x), 0.0)
                for m, x in zip(mags, extra)]


def _magnitude(node: RNode, xs: list[np.ndarray], errs: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """|J(x)|·e per output (the CPU backend's JVP magnitude). Where the op's smoothness radius
    is below the error (a kink within reach), the larger of the magnitudes at x, x + e, x - e;
    for an elementwise activation, at least the change of f at x +- e (curvature)."""
    cpu = get_backend("cpu")
    spec = get_op(node.op)
    diff = differentiable_arrays(spec, len(xs))
    tans = [np.asarray(e, np.float64) if d and e is not None else (np.zeros(np.shape(x)) if d else None)
            for x, e, d in zip(xs, errs, diff)]
    mags = jacobian_product(node.op, "jvp", xs, node.attrs, tans)
    rule = cpu.derivatives.get(node.op)
    if rule is not None and rule.radius is not None:
        rad = rule.radius(xs, node.attrs)
        near = any(r is not None and t is not None and np.any(np.asarray(r) < t)
                   for r, t in zip(rad, tans))
        if near:
            for sign in (1.0, -1.0):
                moved = [np.asarray(x + sign * t) if t is not None else x for x, t in zip(xs, tans)]
                other = jacobian_product(node.op, "jvp", moved, node.attrs, tans)
                mags = [None if m is None else np.maximum(m, o) for m, o in zip(mags, other)]
    if spec.family == "activation" and len(xs) == 1 and tans[0] is not None and mags[0] is not None:
        # curvature: |J(x)| e is first order; where e is not small on the scale over which f
        # bends (sin of an argument near 1e3 in float16, whose ulp there is 0.5: the product
        # feeding it is off by up to 0.25), the change of f between x and x +- e is what the
        # rounded input moves it by (found by fuzz-graphs: mul -> sin in float16). For an
        # elementwise f the larger of |J(x)| e and the changes at the two ends covers the interval
        # to second order (an extremum inside lies within |J(x)| e of f(x)).
        t, mags = tans[0], list(mags)
        with np.errstate(all="ignore"):
            f0 = np.asarray(cpu.run(node.op, [xs[0].copy()], node.attrs)[0], np.float64)
            for sign in (1.0, -1.0):
                moved = np.asarray(cpu.run(node.op, [np.asarray(xs[0] + sign * t)], node.attrs)[0], np.float64)
                change = np.abs(moved - f0)
                mags[0] = np.where(np.isfinite(change) & (change > mags[0]), change, mags[0])
    return list(mags)


def _influence(node: RNode, xs: list[np.ndarray], taints: list[np.ndarray | None]) -> list[np.ndarray]:
    """Which outputs the undecided input positions can reach: through the JVP magnitude for a
    differentiable input; every output for any other (an index or a condition)."""
    spec = get_op(node.op)
    diff = differentiable_arrays(spec, len(xs)) if spec.differentiable else [False] * len(xs)
    shapes = [s for s, _ in node.outs]
    if any(t is not None and t.any() and not d for t, d in zip(taints, diff)):
        return [np.ones(s, bool) for s in shapes]
    tans = [t.astype(np.float64) if t is not None else np.zeros(np.shape(x)) if d else None
            for x, t, d in zip(xs, taints, diff)]
    try:
        mags, _ = get_backend("cpu").run_magnitude(node.op, "jvp", xs, node.attrs, tans)
    except UnsupportedError:
        return [np.ones(s, bool) for s in shapes]
    return [np.ones(s, bool) if m is None else np.asarray(m) > 0 for m, s in zip(mags, shapes)]


def _overflow(value: np.ndarray, err: np.ndarray | None, undecided: np.ndarray | None, dtype: str
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A node's float64 value where its dtype's range ends: an element whose correctly rounded
    value in ``dtype`` is ±inf *is* ±inf in the graph (any backend's node returns it, and what
    reads it sees inf, not the float64 value: exp(exp(x)) in bfloat16, then a softmax of it), so
    the reference carries ±inf there, exactly (error 0). Where the propagated error reaches
    across the overflow threshold, the backend may round either way: those elements, and what
    they reach, are undecided (as a discrete node's near-ties)."""
    if not dt.is_float(dtype) or dtype == "float64" or err is None:
        return value, err, undecided
    v = np.asarray(value, np.float64)
    with np.errstate(all="ignore"):
        target = dt.np_dtype(dtype)
        rounded = v.astype(target)
        over = np.isinf(rounded) & np.isfinite(v)
        e = np.asarray(err, np.float64)
        lo, hi = np.isinf((np.abs(v) - e).astype(target)), np.isinf((np.abs(v) + e).astype(target))
        near = (lo != hi) & np.isfinite(v)
    if not over.any() and not near.any():
        return value, err, undecided
    value = np.where(over, rounded.astype(np.float64), v)
    err = np.where(over, 0.0, e)
    if near.any():
        undecided = near if undecided is None else (undecided | near)
    return value, err, undecided


def reference(case: Case) -> tuple[Resolved, Reference]:
    """The reference side of a graph case (raises what the reference raises)."""
    g = resolved(case)
    return g, reference_of(g, make_graph_inputs(case))


def reference_of(g: Resolved, inputs: dict[str, np.ndarray]) -> Reference:
    """The reference side of a resolved graph on given inputs: a library case's (:func:`reference`),
    or a graph outside the library (the shrinker's candidates, run/shrink.py; the fuzzer's)."""
    cpu = get_backend("cpu")
    ref = Reference(inputs)
    for name, (_, d) in g.inputs:
        ref.value[name] = _wide(ref.inputs[name])
        ref.error[name] = np.zeros(ref.inputs[name].shape) if dt.is_float(d) else None
        ref.dtype[name] = d
    for node in g.nodes:
        spec = get_op(node.op)
        xs = [ref.value[i] for i in node.inputs]
        errs = [ref.error[i] for i in node.inputs]
        taints = [ref.undecided.get(i) for i in node.inputs]
        out_dts = [d for _, d in node.outs]
        names = [node.name] + [f"{node.name}#{k}" for k in range(1, len(node.outs))]
        with np.errstate(all="ignore"):
            if node.op == "cast":  # applied as the graph says: a cast to float16 rounds there
                raw = cpu.run("cast", [xs[0].copy()], node.attrs)
            else:
                raw = cpu.run(node.op, [x.copy() for x in xs], node.attrs)
            outs = [_wide(r) for r in raw]
            erroneous = any(e is not None and np.any(e > 0) for e in errs)
            float_out = [dt.is_float(d) for d in out_dts]
            if node.op == "cast" and float_out[0] and dt.is_float(node.in_specs[0][1]):
                errors: list[np.ndarray | None] = [cast_error(xs[0], errs[0], out_dts[0])]
                undecided = [None]
            elif not spec.differentiable:  # discrete: the error decides, or not, what comes out
                errors = [np.zeros(s) if f else None for (s, _), f in zip(node.outs, float_out)]
                undecided = [decision_margin(node.op, xs, errs, s) if erroneous else None
                             for s, _ in node.outs]
            else:
                in_dt = [np.asarray(x).astype(dt.np_dtype(d)) for x, (_, d) in zip(xs, node.in_specs)]
                own = []
                for o, (s, d) in zip(outs, node.outs):
                    exact = spec.policy.exact or not dt.is_float(d)
                    bound = spec.policy.bound(in_dt, node.attrs, d) if spec.policy.bound is not None \
                        and not exact else None
                    own.append(own_error(bound, tolerance_for(node.op, d), o, d, exact))
                prop: list[np.ndarray | None] = [None] * len(outs)
                if erroneous:
                    try:
                        prop = _magnitude(node, xs, errs)
                    except UnsupportedError:
                        prop = [np.full(s, np.inf) for s, _ in node.outs]
                        ref.unbounded_nodes.append(node.name)
                errors = [None if not f else o if p is None else o + np.asarray(p, np.float64)
                          for o, p, f in zip(own, prop, float_out)]
                undecided = [None] * len(outs)
            if any(t is not None and t.any() for t in taints):
                reach = _influence(node, xs, taints)
                undecided = [r if u is None else (u | r) for u, r in zip(undecided, reach)]
        for n, o, e, u, d in zip(names, outs, errors, undecided, out_dts):
            o, e, u = _overflow(o, e, u, d)
            ref.value[n], ref.error[n], ref.dtype[n] = o, e, d
            if u is not None and u.any():
                ref.undecided[n] = u
    return ref


CACHE: Recent[Case, tuple[Resolved, Reference]] = Recent(reference, lambda case: case.input_id)


def expected_outputs(g: Resolved, ref: Reference) -> list[np.ndarray]:
    """The reference's graph outputs rounded once to their dtypes."""
    return [ref.value[o].astype(dt.np_dtype(ref.dtype[o])) for o in g.outputs]


def judge(g: Resolved, ref: Reference, actual: list[np.ndarray]) -> list[Comparison]:
    """Every element of every output within its propagated bound plus the dtype's final
    roundings (the reference's and the target's, as for single ops); NaN/inf exactly, and signed
    zeros where the whole bound is 0 (an exact graph); a discrete node's undecided positions
    unasserted."""
    comps = []
    for k, (o, e, a) in enumerate(zip(g.outputs, expected_outputs(g, ref), actual)):
        d = ref.dtype[o]
        err = ref.error.get(o)
        name = f"output {k} ({o})"
        if not dt.is_float(d):
            comps.append(compare(e, np.asarray(a), exact=True, signed_zero=False, tol=default_tolerance("float32"),
                                 skip=ref.undecided.get(o), name=name))
            continue
        exact = err is not None and not np.any(err)
        comps.append(compare(e, np.asarray(a), exact=False, signed_zero=exact, tol=default_tolerance(d),
                             bound=graph_bound(err, ref.undecided.get(o)), name=name))
    return comps


@dataclass
class Evaluation:
    """One graph run on the backend under test and judged: the outcome (pass, fail, error,
    contract, skip), its message, the comparisons (one per output; empty when the backend
    raised) and the record's fields (graph notes, measured errors, mismatch, timing)."""

    outcome: str
    message: str
    comps: list[Comparison] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)



def measured_fields(comps: list[Comparison], max_ulp: float, source: str) -> dict[str, Any]:
    """A graph case's record fields from its comparisons (forward outputs or VJP inputs): the
    worst errors, the bound's source with the dtypes' final-rounding ulps, and what went
    unasserted or non-finite."""
    measured: dict[str, Any] = {
        "max_abs_err": max((c.max_abs_err for c in comps), default=0.0),
        "max_rel_err": max((c.max_rel_err for c in comps), default=0.0),
        "max_ulp": max((c.max_ulp for c in comps), default=0.0),
        "tolerance": {"max_ulp": max_ulp, "rtol": 0.0, "atol": 0.0, "source": source}}
    unasserted = {"order_dependent": sum(c.order_dependent for c in comps),
                  "unbounded": sum(c.unbounded for c in comps)}
    if any(unasserted.values()):
        measured["unasserted"] = {k: v for k, v in unasserted.items() if v}
    nonfinite = sum(c.nonfinite for c in comps)
    if nonfinite:
        measured["nonfinite_mismatches"] = nonfinite
    return measured

def evaluate(g: Resolved, ref: Reference, target: Target, capture: dict[str, Any] | None = None) -> Evaluation:
    """``g`` on ``target`` (MlxBackend.run_graph) judged against ``ref``: the part of a graph
    case that :func:`run` records, and that the shrinker (run/shrink.py) and the graph fuzzer
    repeat on graphs outside the library."""
    if capture is not None:
        capture.update(inputs=list(ref.inputs.values()), expected=expected_outputs(g, ref))
    backend = get_backend(target.backend)
    info: dict[str, Any] = {"nodes": len(g.nodes)}
    kw: dict[str, Any] = {}
    t1 = time.perf_counter()
    try:
        if not hasattr(backend, "run_graph"):
            raise UnsupportedError(f"{backend.name} runs no graphs")
        out, notes = backend.run_graph(g, {k: v.copy() for k, v in ref.inputs.items()}, target.device, target.mode)
        kw["backend_s"] = time.perf_counter() - t1
        if notes.pop("stream", None):
            kw["stream"] = "cpu"
        info.update(notes)
        if capture is not None:
            capture["actual"] = out
    except UnsupportedError as e:
        return Evaluation("skip", str(e), fields={"graph": info})
    except Exception as e:  # noqa: BLE001 — any kernel failure is a result
        detail = error_detail(e)
        outcome = "contract" if isinstance(e, KernelContractError) else "error"
        return Evaluation(outcome, detail, fields={"graph": info, **kw})
    kw["output_digest"] = output_digest(out)  # bit-stability across modes (judge/stability.py)
    try:
        with np.errstate(all="ignore"):
            comps = judge(g, ref, out)
    except Exception as e:  # noqa: BLE001 — a bug in a judge is the harness's
        return Evaluation("error", f"harness error while judging: {type(e).__name__}: {e}",
                          fields={"graph": info, **kw})
    ok = all(c.ok for c in comps)
    undecided = sum(int(ref.undecided[o].sum()) for o in g.outputs if o in ref.undecided)
    if undecided:
        info["undecided"] = undecided  # outputs a discrete node may have decided otherwise
    if ref.unbounded_nodes:
        info["unbounded_nodes"] = ref.unbounded_nodes[:10]
    measured = measured_fields(
        comps, max(default_tolerance(ref.dtype[o]).max_ulp if dt.is_float(ref.dtype[o]) else 0.0
                   for o in g.outputs), "graph:first-order-propagation")
    if not ok:
        wrong = [(k, c) for k, c in enumerate(comps) if not c.ok and c.positions]
        if wrong:
            exp = expected_outputs(g, ref)
            measured["mismatch"] = {
                **wrong_summary(comps),
                "exact": all(c.exact for _, c in wrong),
                "first": [{"output": k, "at": list(p), "expected": str(exp[k][p]), "actual": str(out[k][p]),
                           "bound": float(np.asarray(ref.error[g.outputs[k]])[p])
                           if ref.error.get(g.outputs[k]) is not None else None}
                          for k, c in wrong for p in c.positions]}
    msg = "; ".join(c.message for c in comps if c.message)
    return Evaluation("pass" if ok else "fail", msg, comps, {"graph": info, **measured, **kw})


def run(case: Case, capture: dict[str, Any] | None = None) -> CaseResult:
    """A graph case end to end, as run_case does a forward one."""
    t0 = time.perf_counter()
    hit = CACHE.get(case)
    if isinstance(hit, Exception):
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0,
                                   message=f"reference failed: {type(hit).__name__}: {hit}")
    g, ref = hit
    ev = evaluate(g, ref, case.target, capture)
    return CaseResult.for_case(case, ev.outcome, message=ev.message, duration_s=time.perf_counter() - t0,
                               **ev.fields)
