"""Run one graph VJP case (op ``graph:NAME``, grad ``vjp``: issue 17 item 6) in the current
process: the forward graph case's inputs, the cotangents from the id, the reference (reverse mode
over the graph in float64, composing the CPU backend's per-op VJP rules, the ones single-op
derivative cases are judged against; a cast between floats is the identity), the error bound
propagated node by node backwards (judge/bounds/graph_grad.py), the VJP of the whole graph on the
backend under test (MlxBackend.run_graph_vjp: ``mx.vjp`` over the graph function run_graph
evaluates, in eager, lazy or compiled mode) and the comparison of every element of every
input's gradient. run/graphs.py hands every graph case with ``grad`` set here."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.cpu._grad import argument_sensitivity, largest_intermediate
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import KernelContractError, UnsupportedError, error_detail
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import make_graph_cotangents, make_graph_inputs, resolved
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge.bounds.graph import graph_bound
from rlx_conformance.judge.bounds.graph_grad import (
    accumulation_error,
    cast_back_error,
    finite_or_inf,
    node_own_error,
)
from rlx_conformance.judge.compare import Comparison, compare, wrong_summary
from rlx_conformance.judge.stability import output_digest
from rlx_conformance.judge.tolerances import default_tolerance
from rlx_conformance.ops import get_op
from rlx_conformance.ops.graphs import Resolved, RNode, differentiable_edges, primals
from rlx_conformance.run import graphs
from rlx_conformance.run.recent import Recent

# The coordinate secants of one node (the curvature term) cost two evaluations of its VJP rule
# per input element that carries forward error; beyond this many elements a node's bound is left
# unbounded (and the record says which node) rather than a run taking minutes. The library's
# largest node (a layer norm of 1,920 elements) is well below it.
SECANT_MAX = 8192


@dataclass
class GradReference:
    """What every target of one graph VJP id shares: the forward reference (values and forward
    error bounds of every array), the primals (graph inputs differentiated), the cotangents, and
    per primal the float64 gradient, its propagated error bound, its dtype and its undecided
    positions; notes on nodes the analysis could not bound."""

    forward: graphs.Reference
    primals: tuple[str, ...]
    cotangents: list[np.ndarray | None]
    grad: dict[str, np.ndarray] = field(default_factory=dict)
    error: dict[str, np.ndarray] = field(default_factory=dict)
    dtype: dict[str, str] = field(default_factory=dict)
    undecided: dict[str, np.ndarray] = field(default_factory=dict)
    unbounded_nodes: list[str] = field(default_factory=list)


@dataclass
class _Cot:
    """The cotangent arriving at one array: its consumers' contributions (float64) and their
    error bounds, and the positions left undecided."""

    parts: list[np.ndarray] = field(default_factory=list)
    errors: list[np.ndarray] = field(default_factory=list)
    undecided: np.ndarray | None = None

    def add(self, value: np.ndarray, error: np.ndarray, undecided: np.ndarray | None) -> None:
        self.parts.append(np.asarray(value, np.float64))
        self.errors.append(finite_or_inf(error))
        if undecided is not None and undecided.any():
            self.undecided = undecided if self.undecided is None else (self.undecided | undecided)

    def total(self, shape: tuple[int, ...], dtype: str) -> tuple[np.ndarray, np.ndarray]:
        if not self.parts:
            return np.zeros(shape), np.zeros(shape)
        return np.sum(self.parts, axis=0), accumulation_error(self.parts, self.errors, dtype)


def _names(node: RNode) -> list[str]:
    return [node.name] + [f"{node.name}#{k}" for k in range(1, len(node.outs))]


def _elementwise(node: RNode, xs: list[np.ndarray]) -> bool:
    """An elementwise activation of one input: its VJP at element i depends on x_i alone, so all
    coordinates' secants come from one perturbation of the whole array."""
    return get_op(node.op).family == "activation" and len(xs) == 1


def _broadcast_axes(shape: tuple[int, ...], out: tuple[int, ...]) -> set[int]:
    """The axes of the broadcast shape ``out`` along which an input of ``shape`` repeats."""
    full = (1,) * (len(out) - len(shape)) + tuple(shape)
    return {a for a, (s, o) in enumerate(zip(full, out)) if s == 1 and o != 1}


# the families whose ops compute position by position (a gradient element depends on the inputs at
# the positions summed into it alone): _curvature moves a whole input of theirs at once
POSITIONAL = ("activation", "binary")


def _moves_whole(xs: list[np.ndarray], j: int, g0: list[np.ndarray | None]) -> bool:
    """For a POSITIONAL op: whether moving every element of input ``j`` at once gives each
    gradient element the change that moving its one element of ``j`` alone gives, i.e. every
    gradient's element depends on at most one element of ``j``: each input with a gradient
    repeats along only axes that ``j`` repeats along too (a gradient summed over broadcast rows
    depends on one element of ``j`` in each row otherwise). The secants then come from two VJPs
    instead of two per element, with the same bits."""
    out = np.broadcast_shapes(*(np.shape(x) for x in xs))
    along_j = _broadcast_axes(np.shape(xs[j]), out)
    return all(_broadcast_axes(np.shape(x), out) <= along_j for x, g in zip(xs, g0) if g is not None)


def _secants_by_position(vjp_at: Callable[[list[np.ndarray]], list[np.ndarray | None]],
                         xs: list[np.ndarray], j: int, e: np.ndarray, g0: list[np.ndarray | None]
                         ) -> list[np.ndarray | None]:
    """_curvature's sum over input ``j``'s elements for a POSITIONAL op where _moves_whole does
    not hold (a gradient summed over rows along which ``j`` varies). The VJP is
    taken at inputs expanded to the broadcast shape, where it is position by position; moving
    every element of ``j`` at once then moves each position by its own element's secant. For
    gradient ``k`` and each of its elements q, the positions summed into q that share one element
    of ``j`` (they differ along axes both repeat along) are summed per sign; the larger magnitude
    of the two signs is then summed over ``j``'s elements (the axes only ``k`` repeats along). The
    same sums as moving one element at a time, less the rounding of each whole-row sum taken
    twice and subtracted (which can hide a secant far below the row's ulp)."""
    out_shape = np.broadcast_shapes(*(np.shape(x) for x in xs))
    full = [np.broadcast_to(x, out_shape).copy() for x in xs]
    ej = np.broadcast_to(e, out_shape)
    base = vjp_at(full)
    deltas = []
    for sign in (1.0, -1.0):
        g = vjp_at([np.where(ej > 0, y + sign * ej, y) if k == j else y for k, y in enumerate(full)])
        deltas.append([None if a is None or b is None else a - b for a, b in zip(g, base)])
    along_j = _broadcast_axes(np.shape(xs[j]), out_shape)
    best: list[np.ndarray | None] = []
    for k, g in enumerate(g0):
        if g is None:
            best.append(None)
            continue
        along_k = _broadcast_axes(np.shape(xs[k]), out_shape)
        shared = tuple(sorted(along_k & along_j))
        with np.errstate(invalid="ignore"):
            s = np.maximum(*(np.abs(np.sum(d[k], axis=shared, keepdims=True)) for d in deltas))
            s = np.sum(s, axis=tuple(sorted(along_k - along_j)), keepdims=True)
        best.append(np.reshape(s, g.shape))
    return best


def _curvature(node: RNode, xs: list[np.ndarray], errs: list[np.ndarray | None], cots: list[np.ndarray | None],
               g0: list[np.ndarray | None], whole: bool = True) -> list[np.ndarray | None]:
    """Per input, sum over the input elements j with forward error e_j > 0 of the larger change
    of the reference VJP (cotangents ``cots``) when x_j alone moves by +-e_j (judge/bounds/
    graph_grad.py: the curvature term); UnsupportedError beyond SECANT_MAX elements moved one at a
    time. ``whole``: move all of an input's elements at once for a POSITIONAL op (the same sums:
    _moves_whole, _secants_by_position; False: one at a time everywhere, what tests compare it
    with)."""
    cpu = get_backend("cpu")
    positional = whole and get_op(node.op).family in POSITIONAL
    out = [None if g is None else np.zeros(g.shape) for g in g0]

    def vjp_at(moved: list[np.ndarray]) -> list[np.ndarray | None]:
        return cpu.run_vjp(node.op, moved, node.attrs, cots)

    def secant(moved_j: Callable[[float], np.ndarray], j: int) -> list[np.ndarray | None]:
        best: list[np.ndarray | None] = [None if g is None else np.zeros(g.shape) for g in g0]
        for sign in (1.0, -1.0):
            g = vjp_at([moved_j(sign) if k == j else y for k, y in enumerate(xs)])
            best = [None if b is None else np.maximum(b, np.abs(a - c)) for b, a, c in zip(best, g, g0)]
        return best

    for j, (x, e) in enumerate(zip(xs, errs)):
        if e is None or not np.any(e > 0):
            continue
        e = np.where(np.isfinite(e), e, 0.0)  # an unbounded input error makes the node unbounded below
        if positional and _moves_whole(xs, j, g0):
            # an element without error stays as it is (x + 0 would turn -0 into +0)
            parts = [secant(lambda sign: np.where(e > 0, x + sign * e, x), j)]
        elif positional:
            parts = [_secants_by_position(vjp_at, xs, j, e, g0)]
        else:
            idx = np.flatnonzero(e > 0)
            if idx.size > SECANT_MAX:
                raise UnsupportedError(f"{idx.size} erroneous input elements > SECANT_MAX {SECANT_MAX}")

            def one(sign: float, i: int) -> np.ndarray:
                moved = x.copy()
                moved.flat[i] += sign * e.flat[i]
                return moved
            parts = (secant(lambda sign, i=i: one(sign, i), j) for i in idx)
        for best in parts:
            out = [None if o is None else o + b for o, b in zip(out, best)]
    with np.errstate(invalid="ignore"):
        return [None if o is None else np.where(np.isnan(o), np.inf, o) for o in out]


def _reach(node: RNode, xs: list[np.ndarray], taint: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """Which input gradients the undecided positions of the node's output cotangents reach: the
    VJP magnitude seeded with them is positive there."""
    if not any(t is not None and t.any() for t in taint):
        return [None] * len(xs)
    seeds = [None if t is None else t.astype(np.float64) for t in taint]
    try:
        mags, _ = get_backend("cpu").run_magnitude(node.op, "vjp", xs, node.attrs, seeds)
    except UnsupportedError:
        return [np.ones(np.shape(x), bool) for x in xs]
    return [None if m is None else np.asarray(m) > 0 for m in mags]


def reference(case: Case) -> tuple[Resolved, GradReference]:
    """The reference side of a graph VJP case (raises what the reference raises)."""
    g = resolved(case)
    return g, reference_of(g, make_graph_inputs(case), make_graph_cotangents(case))


def reference_of(g: Resolved, inputs: dict[str, np.ndarray], cotangents: list[np.ndarray | None]) -> GradReference:
    """Reverse mode over ``g`` in float64 at ``inputs`` from ``cotangents`` (one per output,
    None for a non-floating one), with the error bound of every primal's gradient."""
    fwd = graphs.reference_of(g, inputs)
    ref = GradReference(fwd, primals(g), list(cotangents))
    arrivals: dict[str, _Cot] = {}
    for o, c in zip(g.outputs, cotangents):
        if c is not None:
            arrivals.setdefault(o, _Cot()).add(c, np.zeros(np.shape(c)), None)
    for node in reversed(g.nodes):
        edges = differentiable_edges(node)
        names = _names(node)
        if not any(edges) or not any(n in arrivals for n in names):
            continue
        cots: list[np.ndarray | None] = []
        cerrs: list[np.ndarray | None] = []
        taint: list[np.ndarray | None] = []
        for n, (s, d) in zip(names, node.outs):
            if not dt.is_float(d):
                cots.append(None)
                cerrs.append(None)
                taint.append(None)
                continue
            arr = arrivals.get(n, _Cot())
            c, e = arr.total(tuple(s), d)
            cots.append(c)
            cerrs.append(e)
            taint.append(arr.undecided)
        xs = [fwd.value[i] for i in node.inputs]
        fwd_errs = [fwd.error.get(i) for i in node.inputs]
        in_dts = [d for _, d in node.in_specs]
        # a forward position the graph bound leaves undecided (a discrete near-tie, an overflow
        # threshold within the error) at this node: its VJP may be anything there
        unsure = any(n in fwd.undecided for n in list(node.inputs) + names)
        with np.errstate(all="ignore"):
            if node.op == "cast":
                contrib = [(cots[0], cast_back_error(cots[0], cerrs[0], node.outs[0][1], in_dts[0]),
                            taint[0])]
            else:
                contrib = _node_vjp(ref, node, xs, fwd_errs, cots, cerrs, taint, edges)
        for k, (i, ok, part) in enumerate(zip(node.inputs, edges, contrib)):
            if not ok or part is None:
                continue
            value, err, und = part
            if unsure:
                und = np.ones(np.shape(value), bool)
            arrivals.setdefault(i, _Cot()).add(value, err, und)
    for p in ref.primals:
        shape, d = g.input_spec(p)
        arr = arrivals.get(p, _Cot())
        ref.grad[p], ref.error[p] = arr.total(tuple(shape), d)
        ref.dtype[p] = d
        if arr.undecided is not None and arr.undecided.any():
            ref.undecided[p] = arr.undecided
    return ref


def _node_vjp(ref: GradReference, node: RNode, xs: list[np.ndarray], fwd_errs: list[np.ndarray | None],
              cots: list[np.ndarray | None], cerrs: list[np.ndarray | None], taint: list[np.ndarray | None],
              edges: list[bool]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray | None] | None]:
    """One node backwards: per input, the reference's VJP, its error bound (own + |J|ᵀE +
    curvature) and its undecided positions (None for an input without a gradient)."""
    cpu = get_backend("cpu")
    spec = get_op(node.op)
    gs = cpu.run_vjp(node.op, xs, node.attrs, cots)
    native = spec.low_precision == "native"
    seed_c = [None if c is None else np.abs(c) + e for c, e in zip(cots, cerrs)]
    try:
        mag_c, terms = cpu.run_magnitude(node.op, "vjp", xs, node.attrs, seed_c)
        mag_e = graphs.jacobian_product(node.op, "vjp", xs, node.attrs, cerrs)
        curv = _curvature(node, xs, fwd_errs, cots, gs)
    except UnsupportedError:
        ref.unbounded_nodes.append(node.name)
        mag_c = mag_e = curv = [None if g is None else np.full(g.shape, np.inf) for g in gs]
        terms = 1
    # the single-op judge's allowances (cases/derivatives.toml [[argument]], [[overflow]]), from
    # the reference's declarations at the seeds' magnitudes, as run/derivatives.reference takes
    # them at the seeds: a node is held to what its op alone would be
    args = argument_sensitivity(node.op, "vjp", xs, node.attrs, seed_c)
    inter = largest_intermediate(node.op, "vjp", xs, node.attrs)
    reach = _reach(node, xs, taint)
    undefined = cpu.undefined_positions(node.op, "vjp", xs, node.attrs) or [None] * len(xs)
    radius = cpu.smooth_radius(node.op, xs, node.attrs) if not _elementwise(node, xs) else [None] * len(xs)
    out: list[tuple[np.ndarray, np.ndarray, np.ndarray | None] | None] = []
    for k, (g, d) in enumerate(zip(gs, [d for _, d in node.in_specs])):
        if g is None or not edges[k]:
            out.append(None)
            continue
        own = node_own_error(node.op, d, g, mag_c[k], terms, native,
                             argument=None if args is None else args[k],
                             intermediate=None if inter is None else inter[k])
        err = own + np.asarray(mag_e[k], np.float64) + np.asarray(curv[k], np.float64)
        und = reach[k]
        for mask in (undefined[k],
                     None if radius[k] is None or fwd_errs[k] is None else np.asarray(radius[k]) < fwd_errs[k]):
            if mask is not None and np.any(mask):
                und = np.asarray(mask, bool) if und is None else (und | np.asarray(mask, bool))
        out.append((g, err, und))
    return out


CACHE: Recent[Case, tuple[Resolved, GradReference]] = Recent(reference, lambda case: case.input_id)


def expected_grads(ref: GradReference) -> list[np.ndarray]:
    """The reference's gradient of every primal rounded once to its dtype."""
    return [ref.grad[p].astype(dt.np_dtype(ref.dtype[p])) for p in ref.primals]


def judge(ref: GradReference, actual: list[np.ndarray]) -> list[Comparison]:
    """Every element of every primal's gradient within its propagated bound plus the dtype's
    final roundings (as single-op derivative cases); NaN/inf exactly, signed zeros where the
    whole bound is 0; undecided and undefined positions unasserted."""
    comps = []
    for k, (p, e, a) in enumerate(zip(ref.primals, expected_grads(ref), actual)):
        d, err = ref.dtype[p], ref.error[p]
        exact = not np.any(err)
        comps.append(compare(e, np.asarray(a), exact=False, signed_zero=exact, tol=default_tolerance(d),
                             bound=graph_bound(err, ref.undecided.get(p)), name=f"vjp input {k} ({p})"))
    return comps


def evaluate(g: Resolved, ref: GradReference, target: Target, capture: dict[str, Any] | None = None
             ) -> graphs.Evaluation:
    """The VJP of ``g`` on ``target`` (MlxBackend.run_graph_vjp) judged against ``ref``."""
    if capture is not None:
        capture.update(inputs=list(ref.forward.inputs.values()), expected=expected_grads(ref),
                       cotangents=ref.cotangents)
    backend = get_backend(target.backend)
    info: dict[str, Any] = {"nodes": len(g.nodes), "primals": list(ref.primals)}
    kw: dict[str, Any] = {}
    t1 = time.perf_counter()
    try:
        if not hasattr(backend, "run_graph_vjp"):
            raise UnsupportedError(f"{backend.name} runs no graph VJPs")
        out, notes = backend.run_graph_vjp(g, {k: v.copy() for k, v in ref.forward.inputs.items()},
                                           ref.primals, [None if c is None else c.copy() for c in ref.cotangents],
                                           target.device, target.mode)
        kw["backend_s"] = time.perf_counter() - t1
        if notes.pop("stream", None):
            kw["stream"] = "cpu"
        info.update(notes)
        if capture is not None:
            capture["actual"] = out
    except UnsupportedError as e:
        return graphs.Evaluation("skip", str(e), fields={"graph": info})
    except Exception as e:  # noqa: BLE001 — any failure of the transform is a result
        detail = error_detail(e)
        outcome = "contract" if isinstance(e, KernelContractError) else "error"
        return graphs.Evaluation(outcome, detail, fields={"graph": info, **kw})
    kw["output_digest"] = output_digest(out)
    try:
        with np.errstate(all="ignore"):
            comps = judge(ref, out)
    except Exception as e:  # noqa: BLE001 — a bug in a judge is the harness's
        return graphs.Evaluation("error", f"harness error while judging: {type(e).__name__}: {e}",
                                 fields={"graph": info, **kw})
    ok = all(c.ok for c in comps)
    undecided = sum(int(u.sum()) for u in ref.undecided.values())
    if undecided:
        info["undecided"] = undecided
    if ref.unbounded_nodes:
        info["unbounded_nodes"] = ref.unbounded_nodes[:10]
    measured = graphs.measured_fields(
        comps, max((default_tolerance(d).max_ulp for d in ref.dtype.values()), default=0.0),
        "graph-vjp:first-order-backward-propagation")
    if not ok:
        wrong = [(k, c) for k, c in enumerate(comps) if not c.ok and c.positions]
        if wrong:
            exp = expected_grads(ref)
            measured["mismatch"] = {
                **wrong_summary(comps),
                "exact": False,
                "first": [{"input": k, "name": ref.primals[k], "at": list(p), "expected": str(exp[k][p]),
                           "actual": str(out[k][p]), "bound": float(ref.error[ref.primals[k]][p])}
                          for k, c in wrong for p in c.positions]}
    msg = "; ".join(c.message for c in comps if c.message)
    return graphs.Evaluation("pass" if ok else "fail", msg, comps, {"graph": info, **measured, **kw})


def run(case: Case, capture: dict[str, Any] | None = None) -> CaseResult:
    """A graph VJP case end to end, as graphs.run does a forward graph case."""
    t0 = time.perf_counter()
    hit = CACHE.get(case)
    if isinstance(hit, Exception):
        return CaseResult.for_case(case, "error", duration_s=time.perf_counter() - t0,
                                   message=f"reference failed: {type(hit).__name__}: {hit}")
    g, ref = hit
    ev = evaluate(g, ref, case.target, capture)
    return CaseResult.for_case(case, ev.outcome, message=ev.message, duration_s=time.perf_counter() - t0,
                               **ev.fields)
