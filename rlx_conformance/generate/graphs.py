"""Graph cases (issue 17): one :class:`~rlx_conformance.generate.matrix.Case` per graph × dtype ×
shape set × value class × target, with ``op`` = ``graph:NAME`` (no registry op has a colon, so
graph ids never collide with op ids, and ``graph:*`` globs select them). The shapes of the id are
the graph inputs' shapes; the inputs come from the id's seed, one stream per input name."""
from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.matrix import Case, Target, selected_dtypes
from rlx_conformance.ops.graphs import PREFIX, Graph, Resolved, eval_expr, get_graph, primals, resolve, select
from rlx_conformance.spec import values

# --graphs: every graph, none, or globs over graph names
GRAPH_SETTINGS = ("all", "none")


def is_graph(case: Case | str) -> bool:
    """Whether a case (or an op name / case id) is a graph case."""
    return (case.op if isinstance(case, Case) else case).startswith(PREFIX)


def resolved(case: Case) -> Resolved:
    """The case's graph resolved at its dtype and shape set (Case.family)."""
    return resolve(get_graph(case.op), case.dtype, case.family)


def generate_graphs(targets: Sequence[Target], patterns: Sequence[str] | None = None,
                    dtypes: Sequence[str] | None = None,
                    supports: Callable[[Target, str, str], bool] | None = None,
                    grads: Sequence[str] = ("",)) -> list[Case]:
    """Graph cases for ``targets``: each graph of ``patterns`` (globs; None: all) in each of its
    dtypes that ``dtypes`` selects, shape sets and value classes. A target whose backend does not
    declare every node's op in its dtype (``supports(target, op, dtype)``) gets no case of it.
    ``grads``: the forward ("") and, with "vjp" (issue 17 item 6), the graph's VJP case
    (``…/grad:vjp/<target>``, right after its forward twin) where the graph has a floating output
    that depends on a floating input through differentiable edges (ops/graphs.primals); the
    other derivative kinds have no graph cases."""
    dtypes = selected_dtypes(dtypes)
    kinds = [k for k in grads if k in ("", "vjp")]
    out: list[Case] = []
    for g in select(patterns):
        for t in g.dtypes:
            if dtypes and not any(fnmatch.fnmatchcase(t, p) for p in dtypes):
                continue
            for set_name, _ in g.shapes:
                r = resolve(g, t, set_name)
                shapes = tuple(s for _, (s, _) in r.inputs)
                ks = [k for k in kinds if not k or (dt.is_float(t) and primals(r))]
                for vals in g.values:
                    for k in ks:
                        for tg in targets:
                            if supports and not all(supports(tg, n.op, _type_var(n)) for n in r.nodes):
                                continue
                            out.append(Case(g.op, t, shapes, set_name, (), vals, tg, grad=k))
    return out


def _type_var(node) -> str:
    """The dtype a node's kernel must declare: its first floating input's (T), else its first."""
    return next((d for _, d in node.in_specs if dt.is_float(d)), node.in_specs[0][1])


def graph_patterns(option: str | None) -> list[str] | None:
    """--graphs's value as globs: None for all, [] for none."""
    if option is None or option == "all":
        return None
    if option == "none":
        return []
    return [p.strip() for p in option.split(",") if p.strip()]


def make_graph_cotangents(case: Case) -> list[np.ndarray | None]:
    """The cotangents of graph VJP case ``case``, one per graph output (None for a non-floating
    one), made from the id as a single-op derivative case's are (matrix.make_seeds: stream
    ``<input id>#cot<k>``, uniform in [-1, 1], rounded to the output's dtype)."""
    r = resolved(case)
    env = dict(r.inputs)
    for n in r.nodes:
        env[n.name] = n.outs[0]
        env.update({f"{n.name}#{k}": o for k, o in enumerate(n.outs[1:], 1)})
    out: list[np.ndarray | None] = []
    for k, o in enumerate(r.outputs):
        shape, dtype = env[o]
        if not dt.is_float(dtype):
            out.append(None)
            continue
        u = values.Stream(f"{case.input_id}#cot{k}").uniform(int(np.prod(shape)), -1.0, 1.0)
        out.append(dt.narrow(u, dtype).reshape(shape))  # one rounding on every machine (spec/values._to)
    return out


def make_graph_inputs(case: Case) -> dict[str, np.ndarray]:
    """The graph inputs of ``case`` by name, bit-identical for the same id: each drawn from its
    domain by its own stream (``<contiguous id>#<input name>``, or ``<seed>#<input name>`` for a
    graph with a ``seed``); index inputs uniform in their
    range, or (``distinct_axis``) distinct along that axis, as a scatter without a reduction needs."""
    r = resolved(case)
    return graph_inputs(r, r.graph.seed or case.contiguous_id, case.vals)


def graph_inputs(r: Resolved, key: str, vals: str = "random") -> dict[str, np.ndarray]:
    """The inputs of a resolved graph drawn from the streams ``<key>#<input name>`` (value class
    ``vals``): :func:`make_graph_inputs` for a library case; the shrinker and the graph fuzzer
    for graphs outside the library (run/shrink.py, generate/graph_fuzz.py)."""
    out = {}
    for gi in r.graph.inputs:
        shape, dtype = r.input_spec(gi.name)
        stream = values.Stream(f"{key}#{gi.name}")
        if gi.index is not None:
            n = int(_index_range(r, gi.index))
            out[gi.name] = _indices(stream, shape, n, gi.distinct_axis).astype(dt.np_dtype(dtype))
        else:
            out[gi.name] = values.make_array(stream, shape, dtype, gi.domain, vals, {})
    return out


def _index_range(r: Resolved, expr) -> int:
    return eval_expr(expr, dict(dict(r.graph.shapes)[r.shape_set]), f"graph {r.graph.name}")


def _indices(stream: values.Stream, shape: tuple[int, ...], n: int, distinct: int | None) -> np.ndarray:
    if distinct is None:
        return stream.integers(int(np.prod(shape)), 0, n - 1).astype(np.int64).reshape(shape)
    if shape[distinct] > n:
        raise RlxError(f"{shape[distinct]} distinct indices below {n} do not exist")
    moved = (shape[distinct],) + tuple(s for k, s in enumerate(shape) if k != distinct)
    cols = int(np.prod(moved[1:]))
    keys = stream.uniform(n * cols, 0.0, 1.0).reshape(cols, n)
    perm = np.argsort(keys, axis=1, kind="stable")[:, :shape[distinct]].T  # distinct per column
    return np.moveaxis(perm.reshape(moved), 0, distinct)


__all__ = ["GRAPH_SETTINGS", "Graph", "generate_graphs", "graph_inputs", "graph_patterns", "is_graph",
           "make_graph_cotangents", "make_graph_inputs",
           "resolved"]
