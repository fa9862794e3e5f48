"""The case matrix: op × dtype × shape family × attributes × value class × memory layout × target.

A :class:`Case` is pure metadata (cheap to make and to pickle); its inputs are made on demand from
a seed hashed from the case's input id, so the same id gives bit-identical inputs anywhere, and
cases that differ only in target (backend/device/mode) share inputs and one reference result.
This module reads only the registry and cases/.
"""
from __future__ import annotations

import difflib
import fnmatch
import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, SpecError
from rlx_conformance.generate.layouts import (
    LAYOUT_SETTINGS,
    LAYOUTS,
    broadcast_values,
    changes_values,
    input_layouts,
    layout_dtype,
    layout_exists,
)
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.spec import values
from rlx_conformance.spec.registry import OpSpec

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Target:
    """Where the case runs: backend, device, mode (for example mlx/cpu/compiled), and a backend
    variant where the backend has one that changes numerics (``tf32:on`` / ``tf32:off`` for
    MLX's float32 matmul/conv family on a GPU, see MlxBackend.variants): ``mlx-gpu-lazy-tf32:off``."""

    backend: str
    device: str
    mode: str
    variant: str = ""

    def __str__(self) -> str:
        base = f"{self.backend}-{self.device}-{self.mode}"
        return f"{base}-{self.variant}" if self.variant else base

    @classmethod
    def parse(cls, s: str) -> "Target":
        parts = s.split("-")
        if len(parts) not in (3, 4):
            raise RlxError(f"bad target {s!r}: expected BACKEND-DEVICE-MODE[-VARIANT], e.g. mlx-cpu-compiled")
        return cls(*parts)


def fmt_shape(shape: Shape) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


def fmt_value(v: Any, empty: str = "none") -> str:
    """An attribute value as it reads in a case id; ``empty`` names what an empty tuple means for
    this attribute (``none`` by default, ``all`` for reduction axes)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "+".join(map(str, v)) if v else empty
    if isinstance(v, float):
        return repr(v).replace("inf", "inf")
    return str(v)


@dataclass(frozen=True)
class Case:
    op: str
    dtype: str  # the op's type variable T
    shapes: tuple[Shape, ...]
    family: str  # shape family name in cases/shapes.toml
    attrs: tuple[tuple[str, Any], ...]
    vals: str
    target: Target
    declared: bool = True  # does the target backend claim this dtype on this device?
    repeat: int = 0  # which run of the case under --repeat N (not part of the id, inputs or seed)
    # Which derivative the case checks ("" for the op itself): vjp, jvp or hvp (GRAD_KINDS). Its
    # inputs are the forward case's; cotangents and tangents come from the id (make_seeds).
    grad: str = ""
    # How the backend under test gets the inputs in memory (LAYOUTS; "" contiguous, the default,
    # whose ids carry no layout segment). The reference sees the logical values either way.
    layout: str = ""

    # contiguous_id and id are cached on the instance (functools.cached_property writes the
    # instance's __dict__, which a frozen dataclass allows and its eq/hash ignore): the runner,
    # the scheduler, the journal and the worker each ask for them several times per case, and
    # building them (a registry lookup, an attribute's formatting) was a visible share of the
    # parent's CPU per case. The fields never change, so neither do they.
    @cached_property
    def contiguous_id(self) -> str:
        """The id of the contiguous forward case this case is a layout of (its own forward id
        for a contiguous case): what seeds its inputs."""
        parts = [self.op, self.dtype, "shape:" + "+".join(fmt_shape(s) for s in self.shapes)]
        if self.attrs:  # a graph case (op "graph:NAME", generate/graphs.py) has none, and no spec
            spec = self.spec
            parts += [f"{k}:{fmt_value(v, spec.attr(k).empty)}" for k, v in self.attrs]
        parts.append(f"vals:{self.vals}")
        return "/".join(parts)

    @property
    def forward_id(self) -> str:
        """The id of the forward case whose inputs this case shares: the id without the target
        and without the derivative (``…/vals:random/layout:transposed`` for a layout case)."""
        base = self.contiguous_id
        return f"{base}/layout:{self.layout}" if self.layout else base

    @property
    def input_id(self) -> str:
        """Everything that determines the inputs, seeds and the reference: the id without the
        target (``…/vals:random/grad:vjp`` for a derivative)."""
        return f"{self.forward_id}/grad:{self.grad}" if self.grad else self.forward_id

    @cached_property
    def id(self) -> str:
        return f"{self.input_id}/{self.target}"

    @property
    def values_id(self) -> str:
        """What decides the logical input values and so the reference's result: the input id,
        less the layout segment where the layout leaves the values alone (every layout but
        broadcast: a layout case shares inputs and reference with its contiguous twin)."""
        if self.layout and not changes_values(self.spec, self.shapes, self.layout, self.contiguous_id):
            return self.contiguous_id
        return self.input_id

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def spec(self) -> OpSpec:
        return get_op(self.op)

    @property
    def seed(self) -> int:
        return values.seed_of(self.input_id)

    def size(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def make_inputs(case: Case) -> list[np.ndarray]:
    """The case's inputs, bit-identical for the same input id on any machine (a derivative's are
    its forward case's)."""
    spec = case.spec
    key = case.contiguous_id  # a layout case's values are its contiguous twin's (broadcast aside)
    if spec.generate is not None:
        return spec.generate(lambda k: values.Stream(f"{key}#{k}"), case.shapes,
                             case.dtype, case.attr_dict, case.vals)
    dtypes = spec.case_dtypes(case.dtype, len(case.shapes))
    attrs = case.attr_dict
    out = []
    for k, (shape, dtype) in enumerate(zip(case.shapes, dtypes)):
        inp = spec.inputs[min(k, len(spec.inputs) - 1)]
        stream = values.Stream(f"{key}#{k}")
        out.append(values.make_array(stream, shape, dtype, inp.domain, case.vals, attrs))
    if case.layout:  # broadcast: the logical values become the broadcast of the first slice
        lays = input_layouts(spec, [x.shape for x in out], case.layout, key)
        out = [broadcast_values(x) if lay == "broadcast" else x for x, lay in zip(out, lays)]
    return out


# The derivatives a gradient case can check (Case.grad), in id order.
GRAD_KINDS = ("vjp", "jvp", "hvp")


@dataclass(frozen=True)
class Seeds:
    """A derivative case's seeds, made from its id like inputs: ``cotangents``, one per output
    (None for a non-floating output), for vjp and hvp; ``tangents``, one per input (None for a
    non-differentiable one), for jvp and hvp. Each is uniform in [-1, 1] rounded to its array's
    dtype, so the backend under test and the reference see the same values."""

    cotangents: tuple[np.ndarray | None, ...] = ()
    tangents: tuple[np.ndarray | None, ...] = ()


def make_seeds(case: Case, inputs: Sequence[np.ndarray]) -> Seeds:
    """The cotangents and tangents of derivative case ``case`` (bit-identical for the same id)."""
    spec = case.spec
    in_dtypes = [dt.name_of(x.dtype) for x in inputs]
    _, outs = spec.validate([x.shape for x in inputs], in_dtypes, case.attr_dict)

    def draw(tag: str, shape: Shape, dtype: str) -> np.ndarray:
        n = math.prod(shape)
        u = values.Stream(f"{case.input_id}#{tag}").uniform(n, -1.0, 1.0)
        return dt.narrow(u, dtype).reshape(shape)  # one rounding on every machine (spec/values._to)

    cots: tuple[np.ndarray | None, ...] = ()
    tans: tuple[np.ndarray | None, ...] = ()
    if case.grad in ("vjp", "hvp"):
        cots = tuple(draw(f"cot{k}", tuple(s), d) if dt.is_float(d) else None
                     for k, (s, d) in enumerate(outs))
    if case.grad in ("jvp", "hvp"):
        diff = [spec.input_differentiable(spec.inputs[min(k, len(spec.inputs) - 1)])
                for k in range(len(inputs))]
        tans = tuple(draw(f"tan{k}", x.shape, d) if ok else None
                     for k, (x, d, ok) in enumerate(zip(inputs, in_dtypes, diff)))
    return Seeds(cots, tans)


def grad_classes(spec: OpSpec, forward: Sequence[str]) -> tuple[str, ...]:
    """The value classes a gradient case gets from the forward's (``forward``, already chosen
    for the size): all but ``special`` (its infinities and NaN have no derivative a finite
    difference or a convention pins down), plus the op's ``grad_values``. An op whose only
    class is ``special`` (data movement: the values only flow through, and its derivative does
    not depend on them) gets ``random`` instead."""
    kept = tuple(v for v in forward if v != "special") or (("random",) if forward else ())
    return kept + tuple(v for v in spec.grad_values if v not in kept)


# -- memory layouts (issue 17): generate/layouts.py ---------------------------------------------
def case_layouts(case: Case, inputs: Sequence[np.ndarray]) -> tuple[str, ...]:
    """Each input's layout for ``case`` with these inputs (what ``Backend.run(layout=)`` takes)."""
    return input_layouts(case.spec, [x.shape for x in inputs], case.layout, case.contiguous_id)


# -- generation ----------------------------------------------------------------------------------
def _axis_sweep(rank: int) -> list[int]:
    """Every axis, and the negative spelling of the last one."""
    return list(range(rank)) + ([-1] if rank else [])


def _axes_sweep(rank: int) -> list[tuple[int, ...]]:
    """Each single axis, the last as -1, each adjacent pair, and () meaning all axes."""
    out: list[tuple[int, ...]] = [()]
    out += [(a,) for a in range(rank)]
    if rank:
        out.append((-1,))
    out += [(a, a + 1) for a in range(rank - 1)] if rank > 2 else []
    return out


def attr_combinations(spec: OpSpec, shapes: Sequence[Shape]) -> Iterator[dict[str, Any]]:
    rank = len(shapes[0]) if shapes else 0
    axes: list[list[tuple[str, Any]]] = []
    for a in spec.attrs:
        if a.sweep == "axis":
            vals: Iterable[Any] = _axis_sweep(rank)
        elif a.sweep == "axes":
            vals = _axes_sweep(rank)
        elif callable(a.sweep):  # derived from the family's shapes
            vals = a.sweep(shapes)
        elif a.sweep is None:
            vals = [a.default]
        else:
            vals = a.sweep
        axes.append([(a.name, v) for v in vals])
    for combo in itertools.product(*axes):
        yield dict(combo)


def shape_families(kind: str) -> dict[str, tuple[Shape, ...]]:
    fams = data.load("shapes").get(kind)
    if fams is None:
        raise RlxError(f"cases/shapes/*.toml has no [{kind}] shape families")
    return {name: tuple(tuple(s) for s in shapes) for name, shapes in fams.items()}


# The short dtype names people type and reports print (bf16, f32, i64, ...)
DTYPE_ABBREVIATIONS = {"f16": "float16", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
                       "f32": "float32", "fp32": "float32", "float": "float32", "f64": "float64",
                       "fp64": "float64", "double": "float64", "i8": "int8", "i16": "int16",
                       "i32": "int32", "i64": "int64", "u8": "uint8", "u32": "uint32"}


def did_you_mean(word: str, names: Sequence[str]) -> str:
    """`` (did you mean a, b?)`` with the closest of ``names`` to a mistyped ``word``, or ''."""
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else ""


def selected_dtypes(dtypes: Sequence[str] | None) -> list[str] | None:
    """``dtypes`` (names or globs) with abbreviations expanded (bf16 -> bfloat16); a pattern that
    names no dtype is an error with the closest names."""
    if not dtypes:
        return None
    out = []
    for p in dtypes:
        p = DTYPE_ABBREVIATIONS.get(p.lower(), p)
        if not any(fnmatch.fnmatchcase(d, p) for d in dt.ALL):
            raise RlxError(f"no dtype matches {p!r}" + did_you_mean(p, [*dt.ALL, *DTYPE_ABBREVIATIONS])
                           + f"; dtypes: {', '.join(dt.ALL)}")
        out.append(p)
    return out


def _matches(name: str, patterns: Sequence[str] | None) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _layouts_for(spec: OpSpec, t: str, fam: str, shapes: Sequence[Shape], attrs: tuple[tuple[str, Any], ...],
                 vals: str) -> list[str]:
    """The layouts that exist (:func:`layout_exists`) for one forward case. An op with a
    ``generate`` hook has a family entry that is not its input shapes: its inputs are made to
    see them."""
    if spec.generate is not None:
        probe = Case(spec.name, t, tuple(shapes), fam, attrs, vals, Target("-", "-", "-"))
        shapes = [x.shape for x in make_inputs(probe)]
    return [lay for lay in LAYOUTS if layout_exists(spec, shapes, lay)]


def generate(targets: Sequence[Target], ops: Sequence[str] | None = None,
             dtypes: Sequence[str] | None = None,
             supports=None, grads: Sequence[str] = ("",), layouts: str = "none") -> list[Case]:
    """All cases for the given targets. ``ops``/``dtypes`` filter by glob; ``supports(target, op,
    dtype)`` tells whether the target's backend declares the dtype (undeclared ones are still
    generated: the matrix checks the declaration). ``grads``: which of the forward ("") and the
    derivatives (GRAD_KINDS) to generate; derivative cases exist for the floating dtypes of a
    differentiable op, for the kinds it declares (OpSpec.derivative_kinds) and only where the
    backend declares the forward dtype. ``layouts`` (LAYOUT_SETTINGS): which forward cases also
    run in memory layouts (LAYOUTS), each right after its contiguous twin, where the backend
    declares the dtype: none; default, for each (op, shape family) in the dtype
    :func:`layout_dtype` the first attribute combination that has layouts, in its random values
    (else its first class), every layout once; all, every forward case in every layout that
    exists for it."""
    bad = [g for g in grads if g and g not in GRAD_KINDS]
    if bad:
        raise RlxError(f"unknown derivative {bad[0]!r} (derivatives: {', '.join(GRAD_KINDS)})")
    if layouts not in LAYOUT_SETTINGS:
        raise RlxError(f"--layouts wants {', '.join(LAYOUT_SETTINGS)}, not {layouts!r}")
    names = [s.name for s in all_ops()]
    for p in ops or ():  # each pattern must select something: a typo is an error, not a smaller run
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            raise RlxError(f"no op matches {p!r}" + did_you_mean(p, names))
    dtypes = selected_dtypes(dtypes)
    specs = [s for s in all_ops() if _matches(s.name, ops)]
    cases: list[Case] = []
    laid_out: set[tuple[str, str]] = set()  # (op, family) with layouts, for "default"
    for spec in specs:
        fams = shape_families(spec.shapes)
        for t in spec.dtypes:
            if not _matches(t, dtypes):
                continue
            for fam, shapes in fams.items():
                if spec.generate is None and not spec.inputs[-1].variadic and len(shapes) != len(spec.inputs):
                    continue
                for attrs in attr_combinations(spec, shapes):
                    try:
                        if spec.generate is None:
                            resolved, _ = spec.validate(shapes, spec.case_dtypes(t, len(shapes)), attrs)
                        else:  # structured inputs: the family entry is not one shape per input
                            resolved = spec.resolve_attrs(attrs)
                    except SpecError:
                        continue  # e.g. an axis sweep on a scalar, or min > max
                    attr_items = tuple((a.name, resolved[a.name]) for a in spec.attrs)
                    # An input set with no elements is the same under every value class; which
                    # classes a size and dtype get otherwise: values.classes_for.
                    classes = spec.values[:1] if spec.generate is None and all(
                        math.prod(sh) == 0 for sh in shapes) else values.classes_for(
                        spec.values, t, shapes, inputs=spec.generate is None)
                    kinds = [g for g in grads if not g or (g in spec.derivative_kinds() and dt.is_float(t))]
                    for g in kinds:
                        for vals in (grad_classes(spec, classes) if g else classes):
                            lays = [""]
                            if not g and (layouts == "all" or (
                                    layouts == "default" and t == layout_dtype(spec)
                                    and (spec.name, fam) not in laid_out
                                    and vals == ("random" if "random" in classes else classes[0]))):
                                lays += _layouts_for(spec, t, fam, shapes, attr_items, vals)
                                if len(lays) > 1:
                                    laid_out.add((spec.name, fam))
                            for lay in lays:
                                for tg in targets:
                                    declared = supports(tg, spec.name, t) if supports else True
                                    if (g or lay) and not declared:
                                        continue  # no derivative or layout of a dtype the kernel does not claim
                                    cases.append(Case(spec.name, t, shapes, fam, attr_items, vals, tg,
                                                      declared, grad=g, layout=lay))
    return cases
