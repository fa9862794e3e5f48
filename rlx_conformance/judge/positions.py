"""Where a wrong output element of a gather or scatter came from: the index tuple that produced it.

A gather or scatter that reads or writes the wrong place is wrong per element, and the distance
between the right value and the one read from elsewhere (ULP, relative error) says nothing. What
helps a kernel author is the output position and the index that led there: "output (3, 1) reads
indices[3, :] = (7,)" points at the batch or axis arithmetic at fault. :func:`source` maps an
output position back to that index tuple, for the ops whose semantics it knows (the data-movement
ops of rlx_conformance/ops/shape.py and ops/custom.py); any other op gets None.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.judge.custom_checks import scatter_targets

SHOWN = 3  # updates named per scatter cell (duplicates may make many)


def _tup(v: np.ndarray) -> str:
    return "(" + ", ".join(str(int(x)) for x in np.ravel(v)) + ("," if np.size(v) == 1 else "") + ")"


def _gather(inputs, attrs, pos):
    x, idx = inputs[0], inputs[1]
    ax = attrs["axis"] % max(x.ndim, 1)
    j = tuple(pos[ax:ax + idx.ndim])
    return f"indices[{', '.join(map(str, j))}] = {int(idx[j])}" if idx.ndim else f"indices = {int(idx)}"


def _gather_elements(inputs, attrs, pos):
    return f"indices[{', '.join(map(str, pos))}] = {int(inputs[1][tuple(pos)])}"


def _gather_nd(inputs, attrs, pos):
    idx = inputs[1]
    j = tuple(pos[:idx.ndim - 1])
    where = ", ".join([*map(str, j), ":"])
    b = attrs.get("batch_dims", 0)
    batch = f" (batch {tuple(j[:b])})" if b else ""
    return f"indices[{where}] = {_tup(idx[j])}{batch}"


def _scatter(op: str) -> Callable[..., str | None]:
    def src(inputs, attrs, pos):
        data, idx, upd = inputs
        t = scatter_targets(op, data, idx, upd, attrs)
        cell = int(np.ravel_multi_index(tuple(pos), data.shape))
        hits = np.flatnonzero(t == cell)
        if not hits.size:
            return "no update writes it (it keeps data's value)"
        names = []
        for h in hits[:SHOWN]:
            u = tuple(int(v) for v in np.unravel_index(int(h), upd.shape))
            if op == "onnx.ScatterND":
                j = u[:idx.ndim - 1]
                names.append(f"updates{list(u)} via indices[{', '.join([*map(str, j), ':'])}] = {_tup(idx[j])}")
            else:
                names.append(f"updates{list(u)} via indices{list(u)} = {int(idx[u])}")
        more = f" (+{hits.size - SHOWN} more)" if hits.size > SHOWN else ""
        return "written by " + "; ".join(names) + more
    return src


def _scatter_add(inputs, attrs, pos):
    idx = inputs[1]
    rows = np.flatnonzero(np.where(idx < 0, idx + attrs["out_dim"], idx) == pos[0])
    if not rows.size:
        return "no update row adds to it (it stays 0)"
    names = [f"indices[{int(i)}] = {int(idx[i])}" for i in rows[:SHOWN]]
    more = f" (+{rows.size - SHOWN} more)" if rows.size > SHOWN else ""
    return "rows " + "; ".join(names) + more


SOURCES: dict[str, Callable[..., str | None]] = {
    "gather": _gather,
    "scatter_add": _scatter_add,
    "onnx.GatherElements": _gather_elements,
    "onnx.GatherND": _gather_nd,
    "onnx.ScatterElements": _scatter("onnx.ScatterElements"),
    "onnx.ScatterND": _scatter("onnx.ScatterND"),
}


def source(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], pos: Sequence[int]) -> str | None:
    """The index tuple that produced output position ``pos`` of ``op`` (None for an op that is
    not a gather or scatter, or where the inputs do not allow it: a diagnosis never fails a case)."""
    fn = SOURCES.get(op)
    if fn is None:
        return None
    try:
        return fn(inputs, attrs, tuple(int(p) for p in pos))
    except (IndexError, ValueError, KeyError, TypeError):
        return None
