"""Graph declarations (issue 17): multi-op graphs of registry ops, read from cases/graphs.toml.

A graph names its inputs (shape as dimension symbols, dtype: the graph's type variable ``T`` or
a fixed one, value domain, or an index range), its nodes (a registry op, the names of the
arrays it reads, its attributes) and its outputs. Attribute values may be expressions over the
dimension symbols (``new_shape = ["B*S", "D"]``), resolved per shape set. Shape sets bind the
symbols; ``repeat`` unrolls a block of nodes N times (a graph larger than RLX's compile limit).
Every graph is checked at load, for every dtype and shape set it declares: each op exists, each
edge names an input or an earlier node (no cycles: a node may read only what is defined above
it), and the registry's own shape and dtype inference accepts every node. Errors are one line,
naming the graph and the node.

This module reads the registry only (``spec``), so that generation, the backends and the run
layer share one resolved form (:class:`Resolved`)."""
from __future__ import annotations

import ast
import difflib
import fnmatch
import json
import math
import operator
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, SpecError
from rlx_conformance.spec.registry import REGISTRY, OutSpec

PREFIX = "graph:"  # a graph case's op field and id start with it; no registry op has a colon in it


@dataclass(frozen=True)
class GraphInput:
    name: str
    shape: tuple[Any, ...]  # ints or dimension expressions
    dtype: str = "T"  # "T": the graph's dtype; else a fixed dtype
    domain: str = "real"
    index: Any = None  # index inputs: values in [0, index) (an expression)
    distinct_axis: int | None = None  # index inputs: distinct along this axis (scatter targets)


@dataclass(frozen=True)
class Node:
    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Graph:
    name: str
    doc: str
    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    dtypes: tuple[str, ...]
    shapes: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]  # (set name, dims)
    values: tuple[str, ...] = ("random",)
    # the inputs' seed stream key (streams ``<seed>#<input name>``); None: the case's contiguous
    # id. Set by the shrinker and the fuzzer, so that a graph cut down to some of its inputs
    # still draws those inputs' values, and a committed regression graph the values it failed on
    seed: str | None = None

    @property
    def op(self) -> str:
        return PREFIX + self.name


@dataclass(frozen=True)
class RNode:
    """A node resolved for one dtype and shape set: concrete attributes, its inputs' dtypes and
    shapes, and its outputs' (registry inference)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, Any]
    in_specs: tuple[OutSpec, ...]
    outs: tuple[OutSpec, ...]


@dataclass(frozen=True)
class Resolved:
    """A graph for one dtype and shape set: its inputs' (shape, dtype), the nodes in order."""

    graph: Graph
    dtype: str
    shape_set: str
    inputs: tuple[tuple[str, OutSpec], ...]
    nodes: tuple[RNode, ...]

    def input_spec(self, name: str) -> OutSpec:
        return dict(self.inputs)[name]

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.graph.outputs


# -- expressions over dimension symbols -------------------------------------------------------
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod}


def eval_expr(expr: Any, dims: Mapping[str, int], where: str) -> Any:
    """An int, or an arithmetic expression (+ - * // %) over the dimension symbols."""
    if not isinstance(expr, str):
        return expr

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.Name):
            if n.id not in dims:
                raise SpecError(f"{where}: unknown dimension {n.id!r} (known: {', '.join(sorted(dims))})")
            return dims[n.id]
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise SpecError(f"{where}: {expr!r} is not an arithmetic expression over dimensions")
    try:
        return ev(ast.parse(expr, mode="eval"))
    except SyntaxError:
        raise SpecError(f"{where}: {expr!r} is not an arithmetic expression over dimensions") from None


def _attr_value(op: str, name: str, value: Any, dims: Mapping[str, int], where: str) -> Any:
    kind = REGISTRY[op].attr(name).kind if name in {a.name for a in REGISTRY[op].attrs} else ""
    if kind in ("int", "ints") or (kind == "float" and isinstance(value, str)):
        if isinstance(value, list):
            return [eval_expr(v, dims, where) for v in value]
        return eval_expr(value, dims, where)
    return value


# -- loading -----------------------------------------------------------------------------------
def _unroll(g: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    """The nodes with ``[[graph.repeat]]`` blocks unrolled: block k's node ``n`` is ``n.k``, its
    reads of ``prev`` the previous block's ``out`` (the block's input before the first)."""
    nodes = [dict(n) for n in g.get("node", [])]
    for r in g.get("repeat", []):
        times, first, body = int(r["times"]), r["input"], r["node"]
        prev = first
        for k in range(times):
            local = {n["name"] for n in body}
            for n in body:
                ins = [prev if i == "prev" else f"{i}.{k}" if i in local else i for i in n["in"]]
                nodes.append({**n, "name": f"{n['name']}.{k}", "in": ins})
            prev = f"{r['out']}.{k}"
        nodes.append({"name": r["result"], "op": "reshape", "in": [prev],
                      "attrs": {"new_shape": r["result_shape"]}})
    if not nodes:
        raise SpecError(f"{where}: no nodes")
    return nodes


def parse(g: Mapping[str, Any]) -> Graph:
    """One [[graph]] table as a :class:`Graph` (structure only; :func:`check` validates it)."""
    name = g.get("name")
    if not name or not isinstance(name, str) or "/" in name or ":" in name:
        raise SpecError(f"cases/graphs.toml: a graph needs a name without '/' or ':' (got {name!r})")
    where = f"graph {name}"
    try:
        inputs = tuple(GraphInput(i["name"], tuple(i["shape"]), i.get("dtype", "T"), i.get("domain", "real"),
                                  i.get("index"), i.get("distinct_axis")) for i in g["input"])
        nodes = tuple(Node(n["name"], n["op"], tuple(n["in"]), tuple(sorted(n.get("attrs", {}).items())))
                      for n in _unroll(g, where))
        shapes = tuple((s["name"], tuple((k, int(v)) for k, v in s.items() if k != "name"))
                       for s in g["shapes"])
        return Graph(name, g.get("doc", ""), inputs, nodes, tuple(g["outputs"]), tuple(g["dtypes"]), shapes,
                     tuple(g.get("values", ("random",))), g.get("seed"))
    except KeyError as e:
        raise SpecError(f"{where}: missing field {e.args[0]!r}") from None


def resolve(graph: Graph, dtype: str, shape_set: str) -> Resolved:
    """``graph`` for one dtype and shape set, every node through the registry's validation
    (attributes, dtypes, shape inference); SpecError naming the graph, set and node."""
    dims = dict(dict(graph.shapes).get(shape_set, ()))
    where = f"graph {graph.name} ({dtype}, shapes {shape_set})"
    if shape_set not in dict(graph.shapes):
        raise SpecError(f"{where}: no shape set {shape_set!r}")
    env: dict[str, OutSpec] = {}
    ins = []
    for i in graph.inputs:
        d = dtype if i.dtype == "T" else i.dtype
        if d not in dt.ALL:
            raise SpecError(f"{where}: input {i.name} has unknown dtype {d!r}")
        spec = (tuple(int(eval_expr(s, dims, f"{where} input {i.name}")) for s in i.shape), d)
        if i.name in env:
            raise SpecError(f"{where}: input {i.name} is defined twice")
        env[i.name] = spec
        ins.append((i.name, spec))
    nodes = []
    for n in graph.nodes:
        at = f"{where} node {n.name}"
        if n.op not in REGISTRY:
            REGISTRY[n.op]  # raises UnknownOpError with the close names
        if n.name in env:
            raise SpecError(f"{at}: the name {n.name} is defined twice")
        missing = [x for x in n.inputs if x not in env]
        if missing:
            raise SpecError(f"{at}: reads {missing[0]!r}, which is neither an input nor a node above it "
                            "(edges must point backwards: a graph has no cycles)")
        spec = REGISTRY[n.op]
        attrs = {k: _attr_value(n.op, k, v, dims, at) for k, v in n.attrs}
        if n.op == "cast" and attrs.get("to") == "T":
            attrs["to"] = dtype
        in_specs = tuple(env[x] for x in n.inputs)
        try:
            resolved, outs = spec.validate([s for s, _ in in_specs], [d for _, d in in_specs], attrs)
        except SpecError as e:
            raise SpecError(f"{at}: {e}") from None
        if any(None in s for s, _ in outs):
            raise SpecError(f"{at}: {n.op} has a data-dependent output shape, which a graph cannot hold")
        env[n.name] = outs[0]
        for k, o in enumerate(outs[1:], 1):
            env[f"{n.name}#{k}"] = o  # a second output reads as NAME#1
        nodes.append(RNode(n.name, n.op, n.inputs, resolved, in_specs, tuple(outs)))
    for o in graph.outputs:
        if o not in env:
            raise SpecError(f"{where}: output {o!r} is not a node or input")
    return Resolved(graph, dtype, shape_set, tuple(ins), tuple(nodes))


def differentiable_edges(node: RNode) -> list[bool]:
    """Whether a gradient flows along each of ``node``'s input edges, as the registry says
    (the single-op derivative cases' rule: the op is differentiable and declares that input so,
    a variadic input's arrays sharing its declaration) and the input is floating. A cast between
    floats is the exception: the registry declares cast non-differentiable (it has no derivative
    case), but a float-to-float cast is the identity on the reals, and a graph's VJP passes
    through it (the reference takes it as the identity; MLX's astype VJP casts the cotangent
    back)."""
    spec = REGISTRY[node.op]
    floats = [dt.is_float(d) for _, d in node.in_specs]
    if node.op == "cast":
        return [floats[0] and dt.is_float(node.outs[0][1])]
    if not spec.differentiable:
        return [False] * len(node.inputs)
    return [f and spec.input_differentiable(spec.inputs[min(k, len(spec.inputs) - 1)])
            for k, f in enumerate(floats)]


def primals(r: Resolved) -> tuple[str, ...]:
    """The graph inputs a graph VJP case differentiates with respect to: the floating inputs
    with a differentiable edge into some node (:func:`differentiable_edges`); () where no
    floating output depends on one through differentiable edges (a graph whose only outputs
    are discrete gets no VJP case)."""
    live: set[str] = set()
    ins: list[str] = []
    for n in r.nodes:
        for x, k in zip(n.inputs, differentiable_edges(n)):
            if k and x in dict(r.inputs) and x not in ins:
                ins.append(x)
            if k and (x in live or x in dict(r.inputs)):
                live.update([n.name] + [f"{n.name}#{j}" for j in range(1, len(n.outs))])
    env = dict(r.inputs)
    env.update({nm: o for n in r.nodes for nm, o in
                zip([n.name] + [f"{n.name}#{j}" for j in range(1, len(n.outs))], n.outs)})
    if not any(o in live and dt.is_float(env[o][1]) for o in r.outputs):
        return ()
    return tuple(i for i, _ in r.inputs if i in ins)


def check(graph: Graph) -> Graph:
    """Validate ``graph`` in every dtype and shape set it declares (:func:`resolve`)."""
    if not graph.dtypes or not graph.shapes or not graph.outputs:
        raise SpecError(f"graph {graph.name}: needs dtypes, shapes and outputs")
    for d in graph.dtypes:
        if d not in dt.ALL:
            raise SpecError(f"graph {graph.name}: unknown dtype {d!r}")
        for s, _ in graph.shapes:
            resolve(graph, d, s)
    return graph


def load_graphs(table: Mapping[str, Any]) -> dict[str, Graph]:
    """The graphs of a parsed graphs file, each validated; names must be unique."""
    out: dict[str, Graph] = {}
    for g in table.get("graph", []):
        graph = check(parse(g))
        if graph.name in out:
            raise SpecError(f"cases/graphs.toml: graph {graph.name} is declared twice")
        out[graph.name] = graph
    return out


@cache
def all_graphs() -> dict[str, Graph]:
    """The graph library (cases/graphs.toml), validated once per process."""
    return load_graphs(data.load("graphs.toml"))


def get_graph(name: str) -> Graph:
    """A graph by name (``graph:`` prefix allowed); RlxError naming the close ones otherwise."""
    name = name.removeprefix(PREFIX)
    graphs = all_graphs()
    if name not in graphs:

        close = difflib.get_close_matches(name, graphs, n=3)
        raise RlxError(f"unknown graph {name!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
    return graphs[name]


def select(patterns: Sequence[str] | None) -> list[Graph]:
    """The graphs whose name (or ``graph:NAME``) matches one of ``patterns`` (globs; None: all);
    a pattern that matches none is an error, as --ops is."""
    graphs = list(all_graphs().values())
    if patterns is None:
        return graphs
    for p in patterns:
        if not any(fnmatch.fnmatchcase(g.name, p) or fnmatch.fnmatchcase(g.op, p) for g in graphs):
            raise RlxError(f"no graph matches {p!r} (graphs: {', '.join(g.name for g in graphs)})")
    return [g for g in graphs if any(fnmatch.fnmatchcase(g.name, p) or fnmatch.fnmatchcase(g.op, p)
                                     for p in patterns)]


# -- writing -----------------------------------------------------------------------------------
def _toml(v: Any) -> str:
    """A TOML value (inline) for the values a graph holds: bool, int, float, str, lists, tables."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml(x)}" for k, x in v.items()) + "}"
    raise SpecError(f"graph: cannot write {v!r} ({type(v).__name__}) as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml(k)


def to_toml(graph: Graph) -> str:
    """``graph`` as a ``[[graph]]`` table of cases/graphs.toml (repeat blocks written unrolled),
    which :func:`parse` reads back as the same graph."""
    lines = ["[[graph]]", f"name = {_toml(graph.name)}", f"doc = {_toml(graph.doc)}",
             f"dtypes = {_toml(list(graph.dtypes))}"]
    if graph.values != ("random",):
        lines.append(f"values = {_toml(list(graph.values))}")
    if graph.seed is not None:
        lines.append(f"seed = {_toml(graph.seed)}")
    lines.append(f"outputs = {_toml(list(graph.outputs))}")
    ins = []
    for i in graph.inputs:
        t: dict[str, Any] = {"name": i.name, "shape": list(i.shape)}
        if i.dtype != "T":
            t["dtype"] = i.dtype
        if i.domain != "real":
            t["domain"] = i.domain
        if i.index is not None:
            t["index"] = i.index
        if i.distinct_axis is not None:
            t["distinct_axis"] = i.distinct_axis
        ins.append(_toml(t))
    lines.append("input = [" + ",\n         ".join(ins) + "]")
    nodes = [_toml({"name": n.name, "op": n.op, "in": list(n.inputs), **({"attrs": dict(n.attrs)} if n.attrs else {})})
             for n in graph.nodes]
    lines.append("node = [" + ",\n        ".join(nodes) + "]")
    lines.append("shapes = " + _toml([{"name": s, **dict(d)} for s, d in graph.shapes]))
    return "\n".join(lines) + "\n"
