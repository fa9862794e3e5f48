"""The order a run hands its cases to the runner, for a cold MLX JIT cache (issue 18 item 1).

MLX's compiled mode on the CPU generates C++ for each new fused graph and compiles it with g++
(0.1-2 s each), once per machine: the library lands in ``$TMPDIR/mlx/<version>/cpu``, keyed by
the graph's primitives, dtypes, constants, scalar inputs and contiguity or rank (not by shape),
and every later process loads it from there. A cold run's time is these compiles. The order
decides only when they happen, never how many there are, so it serves two things:

* **Compiles first.** Within an op, the input sets (the cases of one input id stay together:
  they share inputs and reference; so do the derivative and layout cases of the same inputs)
  whose compile signature (:func:`signature`: what can name a
  new kernel) has not been seen yet come first, in matrix order, then the rest in matrix order.
  An op's compiles then happen in its first tasks, and the cases after them find their kernels
  built (in the worker's own compile cache where the shapes match, on disk otherwise).
* **Heavy ops first.** Ops in decreasing number of signatures (a graph case: its node count),
  ties in matrix order. The runner deals tasks to the workers op by op in turn in this order of
  first appearance (runner.Runner._tasks), so the ops with the most compiling start first and
  both workers stay busy, and the run ends on warm cases instead of one worker compiling a big
  graph alone while the other idles.

The order is a pure function of the case list (no timing, no randomness): the same selection is
handed over in the same order on every run, and :func:`restore` puts records back in case order.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rlx_conformance.generate.graphs import is_graph
from rlx_conformance.generate.matrix import Case
from rlx_conformance.ops import graphs


def signature(case: Case) -> tuple[Any, ...]:
    """What a case's JIT kernels depend on, short of the values: the op, its type variable, the
    derivative kind, the memory layout, the attributes (constants in the fused graph), and per
    input its rank and whether it is a single element (MLX compiles a scalar input and a rank-N
    strided one differently; a contiguous one of any shape shares one kernel). An over-fine
    signature only moves more cases forward; it never drops or adds one."""
    shapes = tuple((len(s), all(d == 1 for d in s)) for s in case.shapes)
    return (case.op, case.dtype, case.grad, case.layout, repr(case.attrs), shapes, str(case.target))


def _units(cases: Sequence[Case]) -> list[list[int]]:
    """Runs of consecutive case indices sharing a contiguous forward id: one input set in its
    targets, with the derivative and layout cases made from the same inputs, which the matrix
    puts right after it (a worker's input and reference caches serve them back to back)."""
    units: list[list[int]] = []
    for i, c in enumerate(cases):
        if units and cases[units[-1][-1]].contiguous_id == c.contiguous_id:
            units[-1].append(i)
        else:
            units.append([i])
    return units


def weight(case: Case, signatures: int) -> int:
    """An op's expected compile work: its number of new signatures; a graph case, its nodes (one
    fused graph of that many ops: compile time grows with them)."""
    if is_graph(case):
        return len(graphs.get_graph(case.op).nodes) * max(signatures, 1)
    return signatures


def order(cases: Sequence[Case]) -> list[int]:
    """The indices of ``cases`` in scheduling order: a permutation (every case exactly once)."""
    by_op: dict[str, list[list[int]]] = {}
    for u in _units(cases):
        by_op.setdefault(cases[u[0]].op, []).append(u)
    ranked = []
    for rank, (op, units) in enumerate(by_op.items()):
        seen: set[tuple[Any, ...]] = set()
        novel, rest = [], []
        for u in units:
            sigs = {signature(cases[i]) for i in u}
            (rest if sigs <= seen else novel).append(u)
            seen |= sigs
        ranked.append((-weight(cases[units[0][0]], len(seen)), rank, novel + rest))
    ranked.sort(key=lambda r: (r[0], r[1]))
    return [i for _, _, units in ranked for u in units for i in u]


def schedule(cases: Sequence[Case]) -> list[Case]:
    """``cases`` in :func:`order`."""
    return [cases[i] for i in order(cases)]


def restore(records: Iterable[Any], cases: Sequence[Case], key=lambda r: r.id) -> list[Any]:
    """``records`` (one or more per case id, in any order) sorted into the order of ``cases``;
    records of ids outside ``cases`` (a resumed run's kept ones) first, as they came. Stable:
    repeats of one id keep their relative order."""
    index: dict[str, int] = {}
    for i, c in enumerate(cases):
        index.setdefault(c.id, i)
    return sorted(records, key=lambda r: index.get(key(r), -1))
