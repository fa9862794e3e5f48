"""Shrinking a failing graph case to a minimal failing subgraph (issue 17 item 4).

A graph case fails when some output leaves its propagated bound (run/graphs.py). The node at
fault is usually one of many; the shrinker finds a small graph that still fails *the same way*
(:class:`Failure`: the outcome, and for a failed comparison its kinds, wrong values and/or a
wrong NaN/inf pattern, as cases/known_divergences.toml classifies failures), evaluating every
candidate with run/graphs.py exactly as a graph case is judged (float64 reference, bound
propagated node by node, the whole candidate on the backend in the case's mode).

The steps, each kept only while the candidate still fails the same way:

1. **Outputs.** Keep one failing output (the first that alone still fails; its failure, a part
   of the whole graph's kinds, is the one kept from then on). What no output needs goes.
2. **Shapes** (only where the inputs can be regenerated, i.e. they came from a seed stream:
   library cases and the fuzzer's graphs). Candidates, smallest first: the graph's other shape
   sets with fewer input elements, then the current set with one dimension symbol halved. A
   candidate must pass the graph's own validation (``ops.graphs.resolve``: the registry's shape
   inference, so a halving that breaks ``E//2`` or a reshape's product is refused, not forced),
   and its inputs are *new* draws from the same streams at the new shape: shape shrinking can
   lose a failure that needs particular values, and then it simply stops. It cannot shrink a
   dimension that an attribute fixes as a literal (a reshape to ``[6, 4]``), nor a graph given
   with concrete inputs only (``inputs``). Done before the cuts, where the shapes become
   concrete.
3. **Tail.** While the output node reads a floating node whose value alone still fails, that
   node becomes the output (what came after the fault goes).

Steps 1-3 keep the graph *declared*: symbolic shapes, inputs drawn from the original's seed
streams (every candidate gets the original's key as its ``seed``, so an input that stays keeps
its values). That graph (:attr:`Shrunk.declared`) is what a library case can reproduce, and
what the fuzzer commits as a regression case.

4. **Cuts, by delta debugging.** The graph becomes concrete (integer shapes, resolved
   attributes). ddmin over the live non-output nodes (chunks of halving size down to single
   nodes): cutting a node replaces its output by the reference's value of it, rounded once to the
   node's dtype, fed as a new graph input; what only fed the cut nodes is dead and goes. The
   reference then treats the cut value as exact, as it does any input: a fault upstream of a cut
   no longer reaches the output, so a cut is kept only where the failure does not need what it
   removed. Step 3 and the cuts repeat to a fixed point: then no single remaining node can be cut
   and the output cannot move up (1-minimal, as ddmin promises; not necessarily the smallest
   failing graph).

The result (:class:`Shrunk`) holds the minimal graph (a :class:`~rlx_conformance.ops.graphs.Graph`
with one concrete shape set, which ``ops.graphs.to_toml`` writes in the format of
cases/graphs.toml), its inputs, reference and evaluation, and a log of the accepted steps.
:func:`explained_by` says whether a known divergence already explains the minimal failure.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, SpecError
from rlx_conformance.generate.graphs import graph_inputs
from rlx_conformance.generate.matrix import Case, Target, fmt_shape
from rlx_conformance.judge.divergences import Divergence, divergences, failure_kinds, known_divergence
from rlx_conformance.ops.graphs import Graph, GraphInput, Node, Resolved, eval_expr, resolve
from rlx_conformance.run.graphs import Evaluation, Reference, evaluate, reference_of

FAILING = ("fail", "error", "contract")
CONCRETE = "shrunk"  # the shape set of a concrete (node-shrunk) graph: no dimension symbols


@dataclass(frozen=True)
class Failure:
    """How a graph fails: its outcome and, for a failed comparison, its kinds (value, nonfinite)."""

    outcome: str
    kinds: frozenset[str]

    def __str__(self) -> str:
        return f"{self.outcome} ({', '.join(sorted(self.kinds))})" if self.kinds else self.outcome


def failure_of(ev: Evaluation) -> Failure | None:
    """The failure an evaluation shows; None for a pass or a skip."""
    if ev.outcome not in FAILING:
        return None
    record = SimpleNamespace(outcome=ev.outcome, **{k: ev.fields.get(k) for k in
                                                   ("max_ulp", "max_rel_err", "max_abs_err", "nonfinite_mismatches")})
    return Failure(ev.outcome, failure_kinds(record))


@dataclass
class Trial:
    """One evaluated candidate."""

    resolved: Resolved
    inputs: dict[str, np.ndarray]
    reference: Reference
    evaluation: Evaluation
    failure: Failure | None


@dataclass
class Shrunk:
    """The minimal failing graph and how it was reached."""

    target: Target
    original: Trial
    final: Trial
    declared: Trial | None = None  # the last declared (symbolic) graph: a library case reproduces it
    steps: list[str] = field(default_factory=list)
    evaluations: int = 0
    complete: bool = True  # False: the evaluation or time budget ran out first

    @property
    def graph(self) -> Graph:
        return self.final.resolved.graph

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n.name for n in self.final.resolved.nodes)

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(n.op for n in self.final.resolved.nodes)


class _Budget(Exception):
    """The shrinker's evaluation or time budget is spent: stop with what was reached."""


class Shrinker:
    """Evaluates candidates of one failing graph on one target (see the module docstring)."""

    def __init__(self, target: Target, *, vals: str = "random", regenerate: bool = True,
                 max_evaluations: int = 400, time_budget: float | None = None):
        self.target = target
        self.vals = vals
        self.regenerate = regenerate
        self.key = ""  # the original's input stream key, every declared candidate's (shrink sets it)
        self.max_evaluations = max_evaluations
        self.deadline = None if time_budget is None else time.monotonic() + time_budget
        self.evaluations = 0

    def trial(self, graph: Graph, dtype: str, shape_set: str, inputs: dict[str, np.ndarray]) -> Trial | None:
        """Resolve, reference and run a candidate; None where it is not a valid graph or its
        reference raises (a candidate the shrinker cannot judge is never kept)."""
        if self.evaluations >= self.max_evaluations or (self.deadline and time.monotonic() > self.deadline):
            raise _Budget()
        self.evaluations += 1
        try:
            r = resolve(graph, dtype, shape_set)
            with np.errstate(all="ignore"):
                ref = reference_of(r, dict(inputs))
        except (SpecError, RlxError, ValueError, FloatingPointError):
            return None
        ev = evaluate(r, ref, self.target)
        return Trial(r, inputs, ref, ev, failure_of(ev))

    def declared(self, graph: Graph, dtype: str, shape_set: str, base: Trial) -> Trial | None:
        """A candidate of the declared (symbolic) phase: its inputs drawn from the original's
        streams (its ``seed`` set to the original's key, :func:`case_key`: an input left keeps
        its values, and the graph saved as a library case draws what it failed on here); or,
        where the inputs were given, the base's inputs it keeps."""
        try:
            r = resolve(graph, dtype, shape_set)
        except (SpecError, RlxError, ValueError, ZeroDivisionError):
            return None  # the graph's own validation refuses it
        if self.regenerate:  # every candidate draws from the original's streams (Graph.seed)
            graph = replace(graph, seed=self.key)
            r = replace(r, graph=graph)
            inputs = graph_inputs(r, self.key, self.vals)
        else:
            inputs = {i.name: base.inputs[i.name] for i in graph.inputs}
        return self.trial(graph, dtype, shape_set, inputs)


def case_key(r: Resolved, vals: str = "random") -> str:
    """The seed stream key of the graph case ``r`` would be (its ``seed``, else its contiguous
    id: the target does not enter it), as generate.graphs.make_graph_inputs draws a library
    case's inputs."""
    if r.graph.seed is not None:
        return r.graph.seed
    shapes = tuple(s for _, (s, _) in r.inputs)
    return Case(r.graph.op, r.dtype, shapes, r.shape_set, (), vals, Target("-", "-", "-")).contiguous_id


def shrink(graph: Graph, dtype: str, shape_set: str, target: Target, *, inputs: dict[str, np.ndarray] | None = None,
           vals: str = "random", max_evaluations: int = 400, time_budget: float | None = None) -> Shrunk:
    """Shrink a failing graph (declared ``graph`` at ``dtype`` and ``shape_set``) on ``target``.
    Its inputs: ``inputs``, or (None) drawn as the graph case's of value class ``vals`` are
    (generate.graphs.graph_inputs with :func:`case_key`: for a library case, the case's own
    inputs), which lets the shapes shrink too. RlxError if the graph does not fail."""
    s = Shrinker(target, vals=vals, regenerate=inputs is None, max_evaluations=max_evaluations,
                 time_budget=time_budget)
    r = resolve(graph, dtype, shape_set)
    s.key = case_key(r, vals)
    if inputs is None:
        inputs = graph_inputs(r, s.key, vals)
    first = s.trial(graph, dtype, shape_set, inputs)
    if first is None or first.failure is None:
        raise RlxError(f"graph {graph.name} does not fail on {target} "
                       f"({'invalid or no reference' if first is None else first.evaluation.outcome})")
    out = Shrunk(target, first, first, first)
    try:
        cur = _one_output(s, first, out.steps)
        if s.regenerate:
            cur = _shapes(s, cur, out.steps)
        cur = out.declared = _tail(s, cur, out.steps, declared=True)
        out.final = cur
        out.final = _nodes(s, _concrete(cur), out.steps)
    except _Budget:
        out.complete = False
        out.steps.append(f"stopped: budget of {s.max_evaluations} evaluations or the time limit spent")
    out.evaluations = s.evaluations
    return out


# -- step 1: one output ------------------------------------------------------------------------
def _one_output(s: Shrinker, t: Trial, steps: list[str]) -> Trial:
    g = t.resolved.graph
    if len(g.outputs) == 1:
        return t
    bad = [o for o, c in zip(g.outputs, t.evaluation.comps) if not c.ok] or list(g.outputs)
    for o in bad:
        c = s.declared(_prune(replace(g, outputs=(o,))), t.resolved.dtype, t.resolved.shape_set, t)
        # one output shows part of what all showed (its kinds among theirs): from here on, the
        # failure kept is this output's
        if c is not None and c.failure is not None and c.failure.outcome == t.failure.outcome \
                and c.failure.kinds <= t.failure.kinds:
            steps.append(f"output {o} alone ({c.failure})")
            return c
    return t


# -- step 2: shapes ----------------------------------------------------------------------------
def _size(r: Resolved) -> int:
    return sum(int(np.prod(s)) for _, (s, _) in r.inputs)


def _shapes(s: Shrinker, t: Trial, steps: list[str]) -> Trial:
    while True:
        g, r = t.resolved.graph, t.resolved
        dims = dict(dict(g.shapes)[r.shape_set])
        cands: list[tuple[str, dict[str, int]]] = [(n, dict(d)) for n, d in g.shapes if n != r.shape_set]
        halved = [{**dims, k: v // 2} for k, v in dims.items() if v > 1]
        cands += [("shrunk-" + "-".join(f"{k}{v}" for k, v in d.items()), d) for d in halved]
        sized = []
        for name, d in cands:
            g2 = replace(g, shapes=((name, tuple(d.items())),))
            try:
                r2 = resolve(g2, r.dtype, name)
            except (SpecError, RlxError, ValueError, ZeroDivisionError):
                continue  # the graph's own validation refuses this shape
            if _size(r2) < _size(r):
                sized.append((_size(r2), name, g2, r2))
        for _, name, g2, _ in sorted(sized, key=lambda x: x[:2]):
            c = s.declared(g2, r.dtype, name, t)
            if c is not None and c.failure == t.failure:
                steps.append(f"shapes {dict(dict(g2.shapes)[name])}")
                t = c
                break
        else:
            return t


# -- step 3: nodes -----------------------------------------------------------------------------
def _jsonish(v: Any) -> Any:
    return [_jsonish(x) for x in v] if isinstance(v, (list, tuple)) else v


def _concrete(t: Trial) -> Trial:
    """The same graph with integer shapes and resolved attributes (one shape set, no symbols)."""
    r = t.resolved
    g = r.graph
    dims = dict(dict(g.shapes)[r.shape_set])
    inputs = tuple(replace(gi, shape=tuple(r.input_spec(gi.name)[0]),
                           index=None if gi.index is None else int(eval_expr(gi.index, dims, g.name)))
                   for gi in g.inputs)
    nodes = tuple(Node(n.name, n.op, n.inputs, tuple(sorted((k, _jsonish(v)) for k, v in n.attrs.items())))
                  for n in r.nodes)
    g2 = replace(g, inputs=inputs, nodes=nodes, shapes=((CONCRETE, ()),), dtypes=(r.dtype,))
    r2 = resolve(g2, r.dtype, CONCRETE)
    return replace(t, resolved=r2)


def _prune(g: Graph) -> Graph:
    """Without the nodes and inputs that no output needs."""
    need = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if n.name in need or any(f"{n.name}#{k}" in need for k in range(1, 8)):
            keep.append(n)
            need |= set(n.inputs)
    return replace(g, nodes=tuple(reversed(keep)), inputs=tuple(i for i in g.inputs if i.name in need))


def _cut(t: Trial, names: set[str]) -> tuple[Graph, dict[str, np.ndarray]]:
    """Nodes ``names`` replaced by graph inputs holding the reference's values rounded to their
    dtypes (every output of a node that something reads, NAME#k included)."""
    r, ref = t.resolved, t.reference
    g = r.graph
    read = {x for n in g.nodes if n.name not in names for x in n.inputs}
    new_inputs, values = list(g.inputs), dict(t.inputs)
    for n in r.nodes:
        if n.name not in names:
            continue
        for k, (shape, d) in enumerate(n.outs):
            name = n.name if k == 0 else f"{n.name}#{k}"
            if name in read:
                new_inputs.append(GraphInput(name, tuple(shape), "T" if d == r.dtype else d, "real"))
                with np.errstate(over="ignore"):  # rounds to inf where the node's dtype overflows, as MLX's does
                    values[name] = np.asarray(ref.value[name]).astype(dt.np_dtype(d))
    g2 = _prune(replace(g, inputs=tuple(new_inputs), nodes=tuple(n for n in g.nodes if n.name not in names)))
    return g2, {i.name: values[i.name] for i in g2.inputs}


def _try(s: Shrinker, t: Trial, g: Graph, inputs: dict[str, np.ndarray]) -> Trial | None:
    if not g.nodes:
        return None
    c = s.trial(g, t.resolved.dtype, CONCRETE, inputs)
    return c if c is not None and c.failure == t.failure else None


def _tail(s: Shrinker, t: Trial, steps: list[str], declared: bool = False) -> Trial:
    """While the output node reads a floating node whose value alone still fails, that node
    becomes the output (what came after the fault goes)."""
    while True:
        g = t.resolved.graph
        out = next((n for n in t.resolved.nodes if n.name == g.outputs[0]), None)
        if out is None:
            return t
        node_names = {n.name for n in t.resolved.nodes}
        for u in [i for i in out.inputs if i in node_names and dt.is_float(t.reference.dtype[i])]:
            g2 = _prune(replace(g, outputs=(u,)))
            c = s.declared(g2, t.resolved.dtype, t.resolved.shape_set, t) if declared else \
                _try(s, t, g2, {i.name: t.inputs[i.name] for i in g2.inputs})
            if c is not None and c.failure == t.failure:
                steps.append(f"output moved up to {u} (dropped {out.name})")
                t = c
                break
        else:
            return t


def _nodes(s: Shrinker, t: Trial, steps: list[str]) -> Trial:
    changed = True
    while changed:
        changed = False
        before = len(t.resolved.nodes)
        t = _tail(s, t, steps)
        changed = len(t.resolved.nodes) != before
        # (b) ddmin over cuts of the non-output nodes
        n_parts = 2
        while True:
            live = [n.name for n in t.resolved.nodes if n.name not in t.resolved.graph.outputs]
            if not live:
                break
            n_parts = min(n_parts, len(live))
            size = -(-len(live) // n_parts)
            chunks = [live[k:k + size] for k in range(0, len(live), size)]
            for chunk in chunks:
                g2, ins = _cut(t, set(chunk))
                c = _try(s, t, g2, ins)
                if c is not None:
                    steps.append(f"cut {', '.join(chunk)}")
                    t, changed = c, True
                    n_parts = max(n_parts - 1, 2)
                    break
            else:
                if n_parts >= len(live):
                    break
                n_parts = min(2 * n_parts, len(live))
    return t


# -- known divergences ---------------------------------------------------------------------------
def explained_by(shrunk: Shrunk, vals: str = "random") -> Divergence | None:
    """A known divergence that already explains the minimal failure, as apply_divergence
    excuses a case: an entry whose scope holds one of the minimal graph's nodes as a single-op
    case (its op, its dtype, the target; no layout, no derivative) and that excuses the minimal
    graph's failure (its kinds; its measured error within the entry's caps). An entry's value
    class, shape and id globs are not applied to a node: they describe which of the matrix's
    inputs reach the fault, and a node inside a graph sees other values (a softmax over an axis
    of random [-10, 10] values makes the tiny outputs the matrix's ``special`` class has); the
    caps still bound what is excused. The graph itself is tried too, exactly (library graphs'
    own entries)."""
    fin = shrunk.final
    tg = shrunk.target
    record = SimpleNamespace(outcome=fin.evaluation.outcome, **{k: fin.evaluation.fields.get(k) for k in
                             ("max_ulp", "max_rel_err", "max_abs_err", "nonfinite_mismatches")})
    for n in fin.resolved.nodes:
        d = next((x for _, x in n.in_specs if dt.is_float(x)), n.in_specs[0][1])
        shape = "+".join(fmt_shape(tuple(sh)) for sh, _ in n.in_specs)
        case = SimpleNamespace(op=n.op, dtype=d, target=tg, grad="", layout="",
                               id=f"{n.op}/{d}/shape:{shape}/vals:{vals}/{tg}")
        for entry in divergences():
            if replace(entry, vals=None, shape=None, id=None).matches(case) and entry.excuse(record) is None:
                return entry
    g = shrunk.original.resolved
    case = SimpleNamespace(op=g.graph.op, dtype=g.dtype, target=tg, grad="", layout="",
                           id=f"{g.graph.op}/{g.dtype}/shape:/vals:{vals}/{tg}")
    return known_divergence(case, record)
