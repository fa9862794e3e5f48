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
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, SpecError
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

    @property
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

    @property
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
        return u.astype(dt.np_dtype(dtype)).reshape(shape)

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


# -- memory layouts (issue 17) ------------------------------------------------------------------
# How a case can hand the backend under test its inputs: as views of buffers laid out so that the
# view holds the logical values, each a separate code path of a backend's kernels (MLX keeps
# contiguous and general kernels per op and per fused graph). In id order:
#   transposed  the last two axes swapped: a swapaxes view of the buffer holding x's transpose
#   strided     a step-2 slice along the last axis of a buffer twice as long
#   offset      a view starting one row (axis 0) into a larger buffer
#   reversed    negative strides on every axis: the buffer holds x reversed, the view reverses it
#               back (ml-explore/mlx#3716: compiled kernels misread exactly these)
#   broadcast   stride 0 on axis 0 (broadcast_to of the first slice): this one changes the logical
#               values, to the broadcast of the first slice, and the reference sees those
#   mixed       different layouts (contiguous among them) for different inputs, from the id
LAYOUTS = ("transposed", "strided", "offset", "reversed", "broadcast", "mixed")
VIEWS = LAYOUTS[:-1]  # what one input can get
# --layouts: none; default, each layout once for one attribute combination of each (op, shape
# family) in one dtype (layout_dtype), random values (the fast matrix: about 2,700 cases more on
# one target, where one per dtype too would be 18,600); all, every layout of every forward case
# (the nightly)
LAYOUT_SETTINGS = ("none", "default", "all")


def layout_dtype(spec: OpSpec) -> str:
    """The dtype of an op's default layout cases: float32 where the op has it (computed as it
    is: a float16 or bfloat16 view is widened by a copy before the op's kernel sees it), else
    its first dtype."""
    return "float32" if "float32" in spec.dtypes else spec.dtypes[0]


def layout_applies(spec: OpSpec, layout: str, shape: Shape) -> bool:
    """Whether an input of ``shape`` gets a view of ``layout``. Every input counts, index inputs
    too (a kernel reads its indices through views as well), but: an array of fewer than 2
    elements has no layout to speak of; transposed needs two axes longer than 1; broadcast needs
    an axis 0 longer than 1 and an op without a ``generate`` hook, whose structured inputs (SPD
    matrices, distinct scatter indices, CSR structure) a repeated slice could break."""
    if math.prod(shape) < 2:
        return False
    if layout == "transposed":
        return len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1
    if layout == "broadcast":
        return spec.generate is None and len(shape) >= 2 and shape[0] > 1
    return layout in VIEWS


def input_layouts(spec: OpSpec, shapes: Sequence[Shape], layout: str, key: str) -> tuple[str, ...]:
    """Each input's layout in a case of ``layout`` ("" contiguous): the layout wherever it
    applies; for mixed, a choice per input among contiguous and the layouts that apply, drawn
    from ``key`` (the contiguous twin's id), each input's differing from the one before."""
    if layout != "mixed":
        return tuple(layout if layout and layout_applies(spec, layout, s) else "" for s in shapes)
    r = values.seed_of(f"{key}#layout:mixed")
    out: list[str] = []
    for k, s in enumerate(shapes):
        opts = [""] + [v for v in VIEWS if layout_applies(spec, v, s)]
        if out:
            opts = [o for o in opts if o != out[-1]] or opts
        out.append(opts[(r + k) % len(opts)])
    return tuple(out)


def layout_exists(spec: OpSpec, shapes: Sequence[Shape], layout: str) -> bool:
    """Whether a case of ``layout`` differs from its contiguous twin: some input gets the view
    (for mixed, at least two inputs have a layout to choose)."""
    if layout == "mixed":
        return sum(any(layout_applies(spec, v, s) for v in VIEWS) for s in shapes) >= 2
    return any(layout_applies(spec, layout, s) for s in shapes)


def changes_values(spec: OpSpec, shapes: Sequence[Shape], layout: str, key: str) -> bool:
    """Whether ``layout`` changes the logical input values (some input is broadcast)."""
    return spec.generate is None and "broadcast" in input_layouts(spec, shapes, layout, key)


def case_layouts(case: Case, inputs: Sequence[np.ndarray]) -> tuple[str, ...]:
    """Each input's layout for ``case`` with these inputs (what ``Backend.run(layout=)`` takes)."""
    return input_layouts(case.spec, [x.shape for x in inputs], case.layout, case.contiguous_id)


def broadcast_values(x: np.ndarray) -> np.ndarray:
    """The logical values of a broadcast input: its first slice along axis 0, repeated."""
    return np.ascontiguousarray(np.broadcast_to(x[:1], x.shape))


def _poison(x: np.ndarray) -> np.ndarray:
    """Filler for the buffer elements a view skips, unlike any value next to it: NaN for floats,
    the bitwise complement for integers and bools (a kernel that reads it shows it)."""
    if dt.is_float(dt.name_of(x.dtype)):
        return np.full(x.shape, np.nan, x.dtype)
    return ~x


def layout_buffer(x: np.ndarray, layout: str) -> np.ndarray:
    """The contiguous buffer whose ``layout`` view (:func:`layout_view`) holds ``x``'s values."""
    if layout == "transposed":
        return np.ascontiguousarray(np.swapaxes(x, -1, -2))
    if layout == "strided":
        buf = np.empty(x.shape[:-1] + (2 * x.shape[-1],), x.dtype)
        buf[..., 1::2] = _poison(x)
        buf[..., ::2] = x
        return buf
    if layout == "offset":
        return np.concatenate([_poison(x[:1]), x], axis=0)
    if layout == "reversed":
        return np.ascontiguousarray(x[(slice(None, None, -1),) * x.ndim])
    if layout == "broadcast":
        return np.ascontiguousarray(x[:1])
    if layout:
        raise RlxError(f"unknown layout {layout!r} (layouts: {', '.join(VIEWS)})")
    return x


def layout_view(buf: Any, layout: str, shape: Shape, xp: Any) -> Any:
    """The view of ``buf`` (:func:`layout_buffer`) with the logical shape ``shape``, made with
    ``xp``'s ops: numpy, or mlx.core for the backend under test (swapaxes, stepped and
    negative-step slices and broadcast_to make views in both, never copies)."""
    if layout == "transposed":
        return xp.swapaxes(buf, -1, -2)
    if layout == "strided":
        return buf[..., ::2]
    if layout == "offset":
        return buf[1:]
    if layout == "reversed":
        return buf[(slice(None, None, -1),) * len(shape)]
    if layout == "broadcast":
        return xp.broadcast_to(buf, tuple(shape))
    return buf


def layout_of_id(case_id: str) -> str:
    """The layout segment of a case id ("" for a contiguous case)."""
    return next((p[7:] for p in case_id.split("/") if p.startswith("layout:")), "")


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


def _did_you_mean(word: str, names: Sequence[str]) -> str:
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
            raise RlxError(f"no dtype matches {p!r}" + _did_you_mean(p, [*dt.ALL, *DTYPE_ABBREVIATIONS])
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
            raise RlxError(f"no op matches {p!r}" + _did_you_mean(p, names))
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
