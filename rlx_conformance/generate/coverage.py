"""Coverage of each op's declared domain: which input ranks, attribute value classes and dtype
combinations the op declares, which of them the case matrix and the fuzz strategy exercise, and
the gaps.

Why: a kernel wrong only on 2-D data (an embedding lookup through GatherND) passed every case
because the shape families held rank-3/4 data only. Declarations are derived from the registry
(:class:`~rlx_conformance.spec.registry.Input` ``ranks``, the attributes' kind / choices / sweep,
the dtypes and per-input dtype alternatives), so a gap is something the op accepts and nothing
tests. An op states what the matrix genuinely cannot reach in ``OpSpec.uncovered``, with a reason.

Classes, each a key ``DIMENSION=CLASS``:
  ``rank:INPUT=0|1|2|3+``: rank classes inside the input's declared (min, max) range;
  ``attr:NAME=CLASS``: each choice (enum, dtype, choices), true/false (bool), the sign of ints
  and floats (negative, zero, positive; nan, inf, -inf), for an ``axis`` sweep negative and
  non-negative, for tuples empty / non-negative / negative (any element negative);
  ``dtype=T`` for each declared T, and ``dtype/INPUT=T:D`` for each T and each alternative D of
  an input with several explicit dtypes (int32 and int64 indices).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.fuzz import Example, example_strategy, hypothesis_modules
from rlx_conformance.generate.matrix import (
    Case,
    Target,
    fmt_value,
    generate,
    make_inputs,
    shape_families,
)
from rlx_conformance.ops import all_ops
from rlx_conformance.spec.registry import REQUIRED, Attr, Input, OpSpec

RANK_CLASSES = ("0", "1", "2", "3+")
_TARGET = Target("coverage", "none", "none")  # the matrix's cases are the same for every target


def rank_class(rank: int) -> str:
    return str(rank) if rank < 3 else "3+"


def declared_rank_classes(inp: Input) -> list[str]:
    """The rank classes inside ``inp.ranks`` = (min, max or None)."""
    lo, hi = inp.ranks
    out = [str(r) for r in (0, 1, 2) if lo <= r and (hi is None or r <= hi)]
    return out + (["3+"] if hi is None or hi >= 3 else [])


def value_class(attr: Attr, value: Any) -> str:
    """The class of one attribute value (see the module doc)."""
    if attr.kind in ("enum", "dtype") or attr.kind == "bool" or attr.choices is not None:
        return fmt_value(value, attr.empty)
    if attr.kind == "ints":
        v = tuple(value)
        return "empty" if not v else ("negative" if min(v) < 0 else "non-negative")
    if attr.kind == "int" and attr.sweep == "axis":
        return "negative" if value < 0 else "non-negative"
    x = float(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return "negative" if x < 0 else "zero" if x == 0 else "positive"


def declared_attr_values(spec: OpSpec, attr: Attr) -> list[Any]:
    """Representative values of every class the attribute declares: its choices, both bools,
    both signs of an axis, the empty/positive/negative forms of an axes tuple, else what its
    sweep lists (a callable sweep over every shape family of the op) or its default."""
    if attr.choices is not None:
        return list(attr.choices)
    if attr.kind == "bool":
        return [False, True]
    if attr.sweep == "axis":
        return [0, -1]
    if attr.sweep == "axes":
        return [(), (0,), (-1,)]
    if callable(attr.sweep):
        return [v for shapes in shape_families(spec.shapes).values() for v in attr.sweep(shapes)]
    if attr.sweep is not None:
        return list(attr.sweep)
    return [] if attr.default is REQUIRED else [attr.default]


def declared_classes(spec: OpSpec) -> list[str]:
    """Every class key the op declares, in a stable order."""
    out: list[str] = []
    for inp in spec.inputs:
        out += [f"rank:{inp.name}={c}" for c in declared_rank_classes(inp)]
    for a in spec.attrs:
        out += _unique(f"attr:{a.name}={value_class(a, v)}" for v in declared_attr_values(spec, a))
    for t in spec.dtypes:
        out.append(f"dtype={t}")
        for inp in spec.inputs:
            if inp.dtypes != "T" and len(inp.dtypes) > 1:
                out += [f"dtype/{inp.name}={t}:{d}" for d in inp.dtypes]
    return out


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def exercised_classes(spec: OpSpec, t: str, attrs: Sequence[tuple[str, Any]],
                      shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]) -> set[str]:
    """The classes one input set exercises: its actual input shapes and dtypes (those an
    ``OpSpec.generate`` hook made, for structured inputs) and attribute values."""
    out = {f"dtype={t}"}
    n = len(spec.inputs)
    for k, (shape, d) in enumerate(zip(shapes, dtypes)):
        inp = spec.inputs[min(k, n - 1)]
        out.add(f"rank:{inp.name}={rank_class(len(shape))}")
        if inp.dtypes != "T" and len(inp.dtypes) > 1:
            out.add(f"dtype/{inp.name}={t}:{d}")
    out |= {f"attr:{k}={value_class(spec.attr(k), v)}" for k, v in attrs}
    return out


def _actual(case: Case) -> tuple[list[tuple[int, ...]], list[str]]:
    """The shapes and dtypes of a case's inputs (made by the generator for structured ops)."""
    spec = case.spec
    if spec.generate is None:
        return [tuple(s) for s in case.shapes], spec.case_dtypes(case.dtype, len(case.shapes))
    arrays = make_inputs(case)
    return [a.shape for a in arrays], [dt.name_of(a.dtype) for a in arrays]


@dataclass
class OpCoverage:
    """One op: the declared classes, those the matrix and fuzzing exercise, the justified ones."""

    op: str
    declared: list[str]
    matrix: set[str] = field(default_factory=set)
    fuzz: set[str] | None = None  # None: fuzzing not sampled
    uncovered: dict[str, str] = field(default_factory=dict)  # class -> reason (OpSpec.uncovered)
    cases: int = 0

    @property
    def gaps(self) -> list[str]:
        """Declared classes the matrix never exercises and the op does not justify."""
        return [c for c in self.declared if c not in self.matrix and c not in self.uncovered]

    @property
    def fuzz_gaps(self) -> list[str] | None:
        if self.fuzz is None:
            return None
        return [c for c in self.declared if c not in self.fuzz and c not in self.uncovered]

    @property
    def stale_justifications(self) -> list[str]:
        """``uncovered`` entries that name no declared class or a class the matrix exercises."""
        return [c for c in self.uncovered if c not in self.declared or c in self.matrix]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "cases": self.cases, "declared": self.declared,
                "matrix": [c for c in self.declared if c in self.matrix],
                "fuzz": None if self.fuzz is None else [c for c in self.declared if c in self.fuzz],
                "gaps": self.gaps, "fuzz_gaps": self.fuzz_gaps, "uncovered": self.uncovered,
                "undeclared": sorted(self.matrix - set(self.declared))}


def matrix_coverage(specs: Sequence[OpSpec]) -> list[OpCoverage]:
    """Per op, the classes the case matrix exercises (one case per input set: the target does
    not change inputs; the value class does not change shapes, dtypes or attributes)."""
    out = []
    for spec in specs:
        cov = OpCoverage(spec.name, declared_classes(spec), uncovered=dict(spec.uncovered))
        seen: set[tuple] = set()
        for case in generate([_TARGET], ops=[spec.name]):
            if case.op != spec.name:  # a glob character in a custom op's name
                continue
            cov.cases += 1
            key = (case.dtype, case.family, case.attrs)
            if key in seen:
                continue
            seen.add(key)
            shapes, dtypes = _actual(case)
            cov.matrix |= exercised_classes(spec, case.dtype, case.attrs, shapes, dtypes)
        out.append(cov)
    return out


def fuzz_classes(spec: OpSpec, examples: int) -> set[str]:
    """The classes ``examples`` draws of the fuzz strategy (generate/fuzz.py) exercise, drawn
    deterministically (derandomized, no example database), over every dtype the op declares."""
    hypothesis, _, _ = hypothesis_modules()
    drawn: list[Example] = []

    def keep(ex: Example) -> None:
        drawn.append(ex)

    try:
        strategy = example_strategy(spec, list(spec.dtypes))
    except RlxError:
        return set()
    run = hypothesis.settings(
        max_examples=examples, derandomize=True, database=None, deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck), phases=[hypothesis.Phase.generate],
        verbosity=hypothesis.Verbosity.quiet)(hypothesis.seed(0)(hypothesis.given(strategy)(keep)))
    try:
        run()
    except hypothesis.errors.Unsatisfiable:
        pass
    out: set[str] = set()
    for ex in drawn:
        shapes = [np.shape(a) for a in ex.inputs]
        dtypes = [dt.name_of(np.asarray(a).dtype) for a in ex.inputs]
        out |= exercised_classes(spec, ex.dtype, ex.attrs, shapes, dtypes)
    return out


def coverage(specs: Sequence[OpSpec], fuzz_examples: int = 0) -> list[OpCoverage]:
    """Matrix coverage of ``specs``, and with ``fuzz_examples`` > 0 what that many fuzz draws
    per op exercise."""
    out = matrix_coverage(specs)
    if fuzz_examples > 0:
        for spec, cov in zip(specs, out):
            cov.fuzz = fuzz_classes(spec, fuzz_examples)
    return out


def dimension(key: str) -> str:
    """``rank:data=2`` -> ``rank:data``."""
    return key.split("=", 1)[0]


def by_dimension(keys: Iterable[str]) -> dict[str, list[str]]:
    """Class keys grouped by dimension: {"rank:data": ["1", "2"], ...}."""
    out: dict[str, list[str]] = {}
    for k in keys:
        d, _, c = k.partition("=")
        out.setdefault(d, []).append(c)
    return out


def coverage_of_run(op_names: Iterable[str]) -> list[dict[str, Any]]:
    """Matrix coverage (``OpCoverage.to_json``) of the registered ops among ``op_names``: what the
    HTML report of a run shows (the report layer reads results, so its caller computes this)."""
    names = set(op_names)
    return [c.to_json() for c in matrix_coverage([s for s in all_ops() if s.name in names])]
