"""Memory layouts (issue 17): how a case can hand the backend under test its inputs, as views of
buffers laid out so that each view holds the logical values (generate/matrix.py makes the cases
and their ids; backends/mlx builds the views from :func:`layout_buffer` and :func:`layout_view`).
Pure geometry over shapes and specs: no case objects, so both the matrix and the backends use it."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.spec import values
from rlx_conformance.spec.registry import OpSpec

Shape = tuple[int, ...]

# -- the layouts ------------------------------------------------------------------
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
