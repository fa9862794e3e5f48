"""hypothesis strategies for random well-typed graphs (issue 17 item 5), in the format of
cases/graphs.toml (ops/graphs.Graph), for ``rlx-conformance fuzz-graphs``.

A graph is built node by node. Every array carries a *symbolic* shape (expressions over the
dimension symbols A, B, C, D, as a library graph's) and a dtype label (``T``, the graph's type
variable, or a fixed float dtype after a cast), so that each node is drawn well typed:

* elementwise unary (tanh, sigmoid, gelu, silu, relu, neg, abs, sin, exp) of any array;
* elementwise binary (add, sub, mul) of an array and an array of the same shape and dtype, or a
  new input broadcast against it (leading axes dropped, others 1);
* reductions (reduce_sum, reduce_mean, reduce_max) over a nonempty set of axes, kept or not;
* reshape (two adjacent axes merged, ``(A)*(B)``, or a unit axis inserted), transpose (any
  permutation), slice (the upper half with step 1, or every other element from 0);
* mat_mul by a new weight input ``[last, N]`` (N a symbol) of the same dtype;
* softmax over an axis; layer_norm / rms_norm over the last axis with new gamma and beta;
* casts: a ``T`` array to float32 (to a 16-bit float when T is float32) and back to ``T``.

New inputs draw their value domain from a few of cases/domains' (real, nn_x, conv_x, conv_w,
nn_qk). The outputs are the nodes nothing reads, so every node counts. Each graph is checked by
ops.graphs.check, the validation cases/graphs.toml gets, before it is handed out: a strategy bug
shows as an error, never as a silently different graph. Sizes: each symbol in [1, max_dim].

The graph's name is ``regression_<hash of its structure>``, and its inputs' seed (Graph.seed) that
name: the library case of a saved failure (``--save-regression``) draws the values it failed
on. hypothesis is imported only when
the fuzzer runs (the ``fuzz`` extra).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from rlx_conformance.generate.fuzz import hypothesis_modules
from rlx_conformance.ops.graphs import Graph, GraphInput, Node, check, to_toml

UNARY = ("tanh", "sigmoid", "gelu", "silu", "relu", "neg", "abs", "sin", "exp")
BINARY = ("add", "sub", "mul")
REDUCE = ("reduce_sum", "reduce_mean", "reduce_max")
KINDS = ("unary", "binary", "reduce", "reshape", "transpose", "slice", "matmul", "softmax", "norm", "cast")
DOMAINS = ("real", "nn_x", "conv_x", "conv_w", "nn_qk")
DTYPES = ("float32", "float16", "bfloat16")
SYMBOLS = ("A", "B", "C", "D")
MAX_NODES = 8
MAX_DIM = 6
MAX_RANK = 4


@dataclass
class _Builder:
    dtype: str
    inputs: list[GraphInput] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    arrays: list[tuple[str, tuple[str, ...], str]] = field(default_factory=list)  # name, shape, dtype label

    def new_input(self, shape: tuple[str, ...], label: str, domain: str) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(GraphInput(name, shape, label, domain))
        self.arrays.append((name, shape, label))
        return name

    def add(self, op: str, ins: list[str], shape: tuple[str, ...], label: str, **attrs: Any) -> None:
        name = f"n{len(self.nodes)}"
        self.nodes.append(Node(name, op, tuple(ins), tuple(sorted(attrs.items()))))
        self.arrays.append((name, shape, label))


def _grp(d: str) -> str:
    return d if d.isidentifier() or d.isdigit() else f"({d})"


def graph_strategy(max_nodes: int = MAX_NODES, max_dim: int = MAX_DIM, dtypes: tuple[str, ...] = DTYPES):
    """A hypothesis strategy of valid graphs (ops/graphs.Graph) of 1 to ``max_nodes`` nodes."""
    _, st, _ = hypothesis_modules()

    @st.composite
    def graphs(draw):
        dtype = draw(st.sampled_from(dtypes))
        dims = {s: draw(st.integers(1, max_dim)) for s in SYMBOLS}
        b = _Builder(dtype)
        rank = draw(st.integers(1, 3))
        b.new_input(tuple(draw(st.lists(st.sampled_from(SYMBOLS), min_size=rank, max_size=rank))), "T",
                    draw(st.sampled_from(DOMAINS)))
        for _ in range(draw(st.integers(1, max_nodes))):
            k = draw(st.integers(0, len(b.arrays) - 1))
            name, shape, label = b.arrays[len(b.arrays) - 1 - k]  # 0: the latest array
            _node(draw, st, b, name, shape, label)
        read = {i for n in b.nodes for i in n.inputs}
        outputs = tuple(n.name for n in b.nodes if n.name not in read)
        body = Graph("", "", tuple(b.inputs), tuple(b.nodes), outputs, (dtype,), (("fuzz", tuple(dims.items())),))
        digest = hashlib.sha256(to_toml(body).encode()).hexdigest()[:10]
        name = f"regression_{digest}"
        g = Graph(name, "found by rlx-conformance fuzz-graphs", body.inputs, body.nodes, outputs, (dtype,),
                  body.shapes, seed=name)
        return check(g)

    return graphs()


def _node(draw, st, b: _Builder, name: str, shape: tuple[str, ...], label: str) -> None:
    """One well-typed node reading ``name`` (shape ``shape``, dtype label ``label``)."""
    r = len(shape)
    kinds = [k for k in KINDS if not ((k in ("reshape", "transpose", "matmul") and r < 2)
                                      or (k in ("slice", "softmax", "norm", "reduce") and r < 1))]
    kind = draw(st.sampled_from(kinds))
    if kind == "unary":
        b.add(draw(st.sampled_from(UNARY)), [name], shape, label)
    elif kind == "binary":
        same = [a for a, s, lab in b.arrays if s == shape and lab == label]
        if draw(st.booleans()) and len(same) > 1:
            other = draw(st.sampled_from(same))
        else:
            drop = draw(st.integers(0, r))
            kept = [d if draw(st.booleans()) else "1" for d in shape[drop:]]
            other = b.new_input(tuple(kept), label, draw(st.sampled_from(DOMAINS)))
        ins = [name, other] if draw(st.booleans()) else [other, name]
        b.add(draw(st.sampled_from(BINARY)), ins, shape, label)
    elif kind == "reduce":
        axes = sorted(draw(st.sets(st.integers(0, r - 1), min_size=1, max_size=r)))
        keep = draw(st.booleans())
        out = tuple("1" if k in axes else d for k, d in enumerate(shape)) if keep else \
            tuple(d for k, d in enumerate(shape) if k not in axes)
        b.add(draw(st.sampled_from(REDUCE)), [name], out, label, axes=axes, keep_dim=keep)
    elif kind == "reshape":
        if draw(st.booleans()) or r >= MAX_RANK:  # merge two adjacent axes
            i = draw(st.integers(0, r - 2))
            out = shape[:i] + (f"{_grp(shape[i])}*{_grp(shape[i + 1])}",) + shape[i + 2:]
        else:  # a unit axis
            i = draw(st.integers(0, r))
            out = shape[:i] + ("1",) + shape[i:]
        b.add("reshape", [name], out, label, new_shape=list(out))
    elif kind == "transpose":
        perm = draw(st.permutations(range(r)))
        b.add("transpose", [name], tuple(shape[p] for p in perm), label, perm=list(perm))
    elif kind == "slice":
        axis = draw(st.integers(0, r - 1))
        d = _grp(shape[axis])
        if draw(st.booleans()):
            start, n, step = f"{d}//2", f"{d}-{d}//2", 1
        else:
            start, n, step = 0, f"({d}+1)//2", 2
        out = shape[:axis] + (n,) + shape[axis + 1:]
        b.add("slice", [name], out, label, axis=axis, start=start, len=n, step=step)
    elif kind == "matmul":
        n = draw(st.sampled_from(SYMBOLS))
        w = b.new_input((shape[-1], n), label, draw(st.sampled_from(("conv_w", "real"))))
        b.add("mat_mul", [name, w], shape[:-1] + (n,), label)
    elif kind == "softmax":
        b.add("softmax", [name], shape, label, axis=draw(st.integers(-r, r - 1)))
    elif kind == "norm":
        g = b.new_input((shape[-1],), label, "nn_gamma")
        beta = b.new_input((shape[-1],), label, "nn_beta")
        b.add(draw(st.sampled_from(("layer_norm", "rms_norm"))), [name, g, beta], shape, label)
    else:  # cast
        if label != "T":
            b.add("cast", [name], shape, "T", to="T")
        else:
            to = "float32" if b.dtype != "float32" else draw(st.sampled_from(("float16", "bfloat16")))
            b.add("cast", [name], shape, to, to=to)


__all__ = ["DTYPES", "KINDS", "MAX_DIM", "MAX_NODES", "graph_strategy"]
