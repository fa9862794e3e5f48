"""Shape and dtype inference shared by the op declarations. Every function raises SpecError
with the op's name on bad shapes or attributes, so both backends reject the same inputs."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core.errors import SpecError

Shape = tuple[int, ...]


def norm_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    """Normalise a possibly negative axis against ``rank``; SpecError when out of range."""
    if not -rank <= axis < rank:
        raise SpecError(f"{op}: {what} {axis} out of range for rank {rank}")
    return axis % rank


def norm_axes(op: str, axes: Sequence[int], rank: int) -> tuple[int, ...]:
    out = tuple(norm_axis(op, a, rank, "axes entry") for a in axes)
    if len(set(out)) != len(out):
        raise SpecError(f"{op}: repeated axis in axes={tuple(axes)}")
    return tuple(sorted(out))


def broadcast(op: str, shapes: Sequence[Shape]) -> Shape:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise SpecError(f"{op}: shapes {' and '.join(map(str, shapes))} do not broadcast") from None


def same(spec, shapes: Sequence[Shape], dtypes: Sequence[str], attrs: Mapping[str, Any]):
    """One input, same shape and dtype out (activations)."""
    return [(shapes[0], dtypes[0])]


def elementwise(spec, shapes, dtypes, attrs):
    """Broadcast all inputs; output dtype of the T inputs."""
    t = next(d for d, i in zip(dtypes, spec.inputs) if i.dtypes == "T")
    return [(broadcast(spec.name, shapes), t)]


def predicate(spec, shapes, dtypes, attrs):
    """Broadcast; bool out (comparisons)."""
    return [(broadcast(spec.name, shapes), "bool")]


def cast(spec, shapes, dtypes, attrs):
    return [(shapes[0], attrs["to"])]


def clamp(spec, shapes, dtypes, attrs):
    if attrs["min"] > attrs["max"]:
        raise SpecError(f"{spec.name}: min={attrs['min']} > max={attrs['max']}")
    return [(shapes[0], dtypes[0])]


def reduce(spec, shapes, dtypes, attrs):
    """Reduce over ``axes`` (empty = all axes), keeping them as size 1 with ``keep_dim``."""
    shape = shapes[0]
    axes = norm_axes(spec.name, attrs["axes"], len(shape)) if attrs["axes"] else tuple(range(len(shape)))
    if spec.name in ("reduce_max", "reduce_min"):
        for a in axes:
            if shape[a] == 0:
                raise SpecError(f"{spec.name}: cannot reduce an empty axis {a} (no identity for max/min)")
    out = tuple(1 if i in axes else d for i, d in enumerate(shape)) if attrs["keep_dim"] else \
        tuple(d for i, d in enumerate(shape) if i not in axes)
    return [(out, dtypes[0])]


def arg_reduce(spec, shapes, dtypes, attrs):
    shape = shapes[0]
    if not shape:
        raise SpecError(f"{spec.name}: needs rank >= 1, got a scalar")
    a = norm_axis(spec.name, attrs["axis"], len(shape))
    if shape[a] == 0:
        raise SpecError(f"{spec.name}: axis {a} is empty")
    out = tuple(1 if i == a else d for i, d in enumerate(shape)) if attrs["keep_dim"] else \
        tuple(d for i, d in enumerate(shape) if i != a)
    return [(out, "int64")]


def along_axis(spec, shapes, dtypes, attrs):
    """Same shape out, with an ``axis`` attribute that must be valid (softmax, scans)."""
    shape = shapes[0]
    if not shape:
        raise SpecError(f"{spec.name}: needs rank >= 1, got a scalar")
    norm_axis(spec.name, attrs["axis"], len(shape))
    return [(shape, dtypes[0])]
