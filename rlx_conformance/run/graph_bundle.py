"""Repro bundles of graph cases (issue 17 items 4, 9): the minimal failing subgraph, standalone.

A failing graph case is first shrunk (run/shrink.py); its bundle then holds the *minimal* graph::

    inputs.npz     the minimal graph's inputs (in<k>, in the order of case.json run.graph.inputs;
                   a cut node's input holds the reference's value of it, rounded to its dtype)
    expected.npz   its reference outputs (out<k>) with their propagated error bounds (bound<k>)
                   and a discrete node's undecided positions (free<k>/allow<k>, or skip<k>)
    actual.npz     MLX's outputs of the minimal graph
    graph.toml     the minimal graph in the format of cases/graphs.toml (concrete shapes)
    case.json      as a single-op bundle's, plus ``graph`` (the original case, the shrink log, the
                   declared graph a library case reproduces) and ``run.graph`` (the nodes)
    repro.py       standalone: rebuilds the minimal graph in plain MLX (the nodes' kernels, as
                   the harness's MLX backend runs them: repro_runtime.run_graph_on_mlx) and
                   judges it against expected.npz with the harness's compare()

repro.py is assembled as a single-op one is (portable.Extractor over the kernels, their helpers
and repro_runtime): it imports numpy, ml_dtypes and mlx, never rlx_conformance, and it embeds
the kernels that ran, so a contributed or test kernel is reproduced as it was, not MLX's own.
A case that does not fail (``repro`` of a passing case) gets its whole graph, unshrunk.

This module says what the bundle holds; bundle.py writes it (write_graph_bundle), with the
files and case.json of every bundle.
"""
from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import compute_dtypes
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.matrix import Case
from rlx_conformance.judge.bounds.graph import graph_bound
from rlx_conformance.judge.compare import ANYTHING
from rlx_conformance.judge.tolerances import default_tolerance
from rlx_conformance.ops import get_op
from rlx_conformance.ops.graphs import get_graph, to_toml
from rlx_conformance.run.graphs import Evaluation, evaluate, reference
from rlx_conformance.run.portable import Extractor
from rlx_conformance.run.shrink import Shrunk, Trial, shrink

# Shrinking inside a run's worker: enough for the library's graphs (a few dozen evaluations,
# well under a second each), bounded so that a bundle never costs a run minutes.
SHRINK_EVALUATIONS = 300
SHRINK_SECONDS = 60.0


def shrunk_for_bundle(case: Case) -> tuple[Shrunk | None, str]:
    """The case's graph shrunk on its target, or (None, why not) where it does not fail here.
    A graph VJP case (``grad:vjp``) is not shrunk: the shrinker and repro.py reduce and rebuild
    the forward graph only, so its bundle says so and holds the whole forward graph."""
    if case.grad:
        return None, ("not shrunk: graph VJP cases (grad:vjp) have no shrinker or VJP repro.py yet; "
                      "this bundle holds the forward graph of the case, not its VJP")
    try:
        return shrink(get_graph(case.op), case.dtype, case.family, case.target, vals=case.vals,
                      max_evaluations=SHRINK_EVALUATIONS, time_budget=SHRINK_SECONDS), ""
    except RlxError as e:  # it does not fail here (a passing case's repro, a crash elsewhere)
        return None, f"not shrunk: {e}"


def minimal_trial(case: Case, shrunk: Shrunk | None) -> Trial:
    """The graph a bundle holds: the shrinker's minimal one, or the case's whole graph."""
    if shrunk is not None:
        return shrunk.final
    g, ref = reference(case)
    return Trial(g, ref.inputs, ref, evaluate(g, ref, case.target), None)


def graph_doc(case: Case, shrunk: Shrunk | None, ev: Evaluation, note: str) -> dict[str, Any]:
    """case.json's ``graph``: the case, the minimal graph's verdict, the shrink log, and the
    declared graph a library case reproduces."""
    return _graph_doc(case, shrunk, ev, note)


def _graph_doc(case: Case, shrunk: Shrunk | None, ev: Any, note: str) -> dict[str, Any]:
    out: dict[str, Any] = {"case": case.id, "minimal_outcome": ev.outcome, "minimal_message": ev.message}
    if shrunk is None:
        out.update(shrunk=False, note=note)
        return out
    out.update(shrunk=True, complete=shrunk.complete, evaluations=shrunk.evaluations, steps=shrunk.steps,
               failure=str(shrunk.original.failure), nodes=list(shrunk.nodes), ops=list(shrunk.ops),
               original_nodes=len(shrunk.original.resolved.nodes))
    if shrunk.declared is not None:
        d = shrunk.declared.resolved
        out["declared"] = {"toml": to_toml(d.graph), "dtype": d.dtype, "shape_set": d.shape_set,
                           "nodes": len(d.nodes)}
    return out


def graph_plan(g: Any, ref: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """How run/graphs.judge judges the outputs, in data for repro_runtime.judge_outputs: a float
    output against its propagated bound (bound<k>), a discrete node's undecided positions free
    (free<k>, allow<k>: any outcome); a non-float output exactly, undecided positions skipped."""
    outputs, aux = [], {}
    for k, o in enumerate(g.outputs):
        d = ref.dtype[o]
        und = ref.undecided.get(o)
        if not dt.is_float(d):
            if und is not None:
                aux[f"skip{k}"] = np.asarray(und, bool)
            outputs.append({"name": f"output {k} ({o})", "exact": True, "signed_zero": False,
                            "tolerance": default_tolerance("float32").to_json(), "bound": False,
                            "skip": f"skip{k}" in aux})
            continue
        err = ref.error.get(o)
        b = graph_bound(err, und)
        aux[f"bound{k}"] = np.asarray(b.abs, np.float64)
        if b.free is not None:
            aux[f"free{k}"] = np.asarray(b.free, bool)
            aux[f"allow{k}"] = np.full(np.shape(b.free), ANYTHING, np.uint8)
        outputs.append({"name": f"output {k} ({o})", "exact": False,
                        "signed_zero": err is not None and not np.any(err), "tolerance": default_tolerance(d).to_json(),
                        "bound": True, "skip": False})
    return {"kind": "graph", "outputs": outputs,
            "bound_reason": "first-order error propagated node by node (judge/bounds/graph.py)"}, aux


_HEADER = '''#!/usr/bin/env python3
"""Standalone repro of one rlx-conformance graph case, shrunk to a minimal failing subgraph:

    {id}

Recorded outcome: {outcome}{reason}
Minimal graph ({n} of {total} nodes): {ops}
Rebuilds it in plain MLX ({device}, {mode} mode) from the nodes' kernels, on inputs.npz, and
judges the outputs against expected.npz (the float64 reference with its propagated error bound).
graph.toml holds the minimal graph in the format of cases/graphs.toml.
Exit 0: MLX agrees (fixed); 1: it disagrees or raises. Options: --save OUT.npz, --timeout S.

Needs {needs}; not rlx_conformance. Everything below is the harness's own code (the MLX
kernels, their helpers, the judge), extracted by rlx_conformance.run.portable.
"""
'''


def graph_script(case: Case, g: Any, doc: dict[str, Any], runtime: dict[str, Any],
                 own_modules: Callable[[Any], list[str]]) -> tuple[dict[str, Any], str, dict[str, str]]:
    """case.json's ``run`` (the minimal graph's nodes), repro.py's source, and the names its
    judge and judge attributes got there (for the self-check). ``runtime``: repro_runtime's
    ``main`` and ``judge_outputs`` (bundle.py loads it late: it loads MLX); ``own_modules``: a
    kernel's own module(s) to embed as source (bundle._own_module)."""
    judge_outputs, main = runtime["judge_outputs"], runtime["main"]
    backend = get_backend("mlx")
    if case.target.backend != "mlx":
        raise RlxError(f"repro.py is written for MLX cases only, not {case.target.backend}")
    nodes, kernels, dtypes = [], {}, []
    for n in g.nodes:
        entry = backend.entry(n.op)
        if not entry.native:
            raise RlxError(f"{n.op} (node {n.name}) runs through the host delegate: repro.py rebuilds MLX kernels only")
        kernels[n.op] = entry.fn
        in_dtypes = [d for _, d in n.in_specs]
        out_dtypes = [d for _, d in n.outs]
        dtypes += in_dtypes + out_dtypes
        nodes.append({"name": n.name, "op": n.op, "inputs": list(n.inputs),
                      "compute_dtypes": compute_dtypes(get_op(n.op), in_dtypes), "out_dtypes": out_dtypes})
    on_cpu = case.target.device == "cpu" or "float64" in dtypes or any(
        backend.entry(n.op).options.get("cpu_stream") for n in g.nodes)
    stream = "cpu" if on_cpu else "gpu"
    run = {"stream": stream, "graph": {"inputs": [name for name, _ in g.inputs],
                                       "in_dtypes": [d for _, (_, d) in g.inputs], "nodes": nodes,
                                       "outputs": list(g.outputs), "stream": stream}}
    local = sorted({m for fn in kernels.values() for m in own_modules(fn)})
    ex = Extractor(local=local)
    bound = {op: ex.bind(op.replace(".", "_").replace("-", "_") + "_kernel", fn, root=True)
             for op, fn in kernels.items()}
    names = [ex.bind(n, v) for n, v in (("main", main), ("sys", sys), ("pathlib", pathlib))]
    attrs = ex.bind("NODE_ATTRS", [dict(n.attrs) for n in g.nodes])
    judge_attrs = ex.bind("JUDGE_ATTRS", {})
    table = ", ".join(f"{op!r}: {name}" for op, name in bound.items())
    tail = (f"KERNELS = {{{table}}}  # backends/mlx: the kernel registered for each op\n"
            "CHECK = None  # a graph is judged by compare() per output\n\n"
            "if __name__ == \"__main__\":\n"
            f"    {names[1]}.exit({names[0]}({names[2]}.Path(__file__).resolve().parent, KERNELS, {attrs}, "
            f"CHECK, {judge_attrs}))\n")
    body = ex.source()
    needs = ["numpy", "ml_dtypes", "mlx"] + (["scipy"] if "import scipy" in body or "from scipy" in body else [])
    first = (doc["message"] or "").splitlines()[0][:300] if doc["message"] else ""
    header = _HEADER.format(**{k: str(v).replace("\\", "\\\\").replace('"""', "'''") for k, v in {
        "id": case.id, "outcome": doc["outcome"], "reason": f" — {first}" if first else "",
        "n": len(g.nodes), "total": doc["graph"].get("original_nodes", len(g.nodes)),
        "ops": " -> ".join(f"{n.name} = {n.op}({', '.join(n.inputs)})" for n in g.nodes),
        "device": case.target.device, "mode": case.target.mode, "needs": ", ".join(needs)}.items()})
    entry_points = {"judge_outputs": ex.name_of(judge_outputs), "judge_attrs": judge_attrs}
    return run, header + "from __future__ import annotations\n\n" + body + "\n" + tail, entry_points
