"""The CPU reference of the exact reductions and scans against Python loops, over the generated case
matrix: reduce_max, reduce_min, arg_max, arg_min and cum_max in every dtype, and the integer
reduce_sum, reduce_prod, cumsum and cum_prod (exact: unbounded Python ints, wrapped once to the
dtype's width, which equals any order of wrapping sums and products: arithmetic modulo 2^bits is
a ring).

The oracle reads docs/ops.md (reduce): ``axes`` empty = every axis, negative axes count from the
end, ``keep_dim`` keeps them as size 1; max/min and cum_max propagate NaN; arg_max/arg_min return
the first index of the extreme value, NaN counting as the extreme; scans run along ``axis``,
``exclusive`` shifts by one with the identity first (max: -inf, or the integer dtype's smallest
value; sum 0; product 1), ``reverse`` runs from the end. Each output element is computed by a
Python loop over its own input elements (numpy only moves the reduced axes last and reshapes: no
numpy reduction is used). Judged bit-exactly; -0 and +0 are equal (the judge is "bit-exact",
not "signed zeros included", for these ops).

Subsample (to run in seconds on two cores): every case below SMALL input elements, in every dtype;
larger cases (the 10^5-element families, whose length is the point, not their attributes: those
are swept on the smaller families, test_subsample_keeps_every_attribute_family_and_value_class)
once per op, family and value class, in float32 (int32 for the integer sums and products).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, TARGET, assert_each_case
SMALL = 5000
INT = {"int8": (8, True), "int16": (16, True), "int32": (32, True), "int64": (64, True),
       "uint8": (8, False), "uint32": (32, False)}


def wrap(v: int, dtype: str) -> int:
    bits, signed = INT[dtype]
    v %= 1 << bits
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def smallest(dtype: str) -> Any:
    if dtype in INT:
        bits, signed = INT[dtype]
        return -(1 << (bits - 1)) if signed else 0
    return -math.inf


def py(x: np.ndarray) -> list:
    """Flat Python values (floats widen exactly to float64)."""
    if x.dtype.kind in "iub":
        return [int(v) for v in x.ravel()]
    return [float(v) for v in x.astype(np.float64).ravel()]


def is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def extreme(row: Sequence[Any], pick_max: bool) -> tuple[Any, int]:
    """(value, first index) of the max/min, NaN the extreme (first NaN wins)."""
    best, at = None, -1
    for i, v in enumerate(row):
        if is_nan(v):
            return math.nan, i
        if best is None or (v > best if pick_max else v < best):
            best, at = v, i
    return best, at


def rows(x: np.ndarray, axes: Sequence[int]) -> tuple[list[list[Any]], tuple[int, ...]]:
    """The reduced axes moved last: one row per output element, and the kept axes' shape."""
    keep = [a for a in range(x.ndim) if a not in axes]
    moved = np.transpose(x, keep + list(axes))
    kept = tuple(x.shape[a] for a in keep)
    n = math.prod(x.shape[a] for a in axes)
    flat = py(moved)
    return [flat[i * n:(i + 1) * n] for i in range(math.prod(kept))], kept


def modular_prod(row: Sequence[int], dtype: str) -> int:
    """The product modulo 2^bits, reduced after each factor (the unbounded product of 10^5
    factors would be a huge int; the residue is the same)."""
    m, acc = 1 << INT[dtype][0], 1
    for v in row:
        acc = acc * v % m
    return acc


def out_shape(shape: tuple[int, ...], axes: Sequence[int], keep_dim: bool) -> tuple[int, ...]:
    return tuple(1 if a in axes else d for a, d in enumerate(shape) if keep_dim or a not in axes)


def norm_axes(axes: Sequence[int], rank: int) -> list[int]:
    return sorted(a % rank for a in axes) if axes else list(range(rank))


def reduce_oracle(op: str, x: np.ndarray, attrs: dict[str, Any], dtype: str) -> tuple[list, tuple]:
    """(flat expected values, expected shape) of a reduction."""
    if op in ("arg_max", "arg_min"):
        axes = [attrs.get("axis", -1) % x.ndim]
        keep_dim = attrs.get("keep_dim", False)
    else:
        axes = norm_axes(attrs.get("axes", ()), x.ndim)
        keep_dim = attrs.get("keep_dim", False)
    rs, _ = rows(x, axes)
    fn: Callable[[list], Any] = {
        "reduce_max": lambda r: extreme(r, True)[0],
        "reduce_min": lambda r: extreme(r, False)[0],
        "arg_max": lambda r: extreme(r, True)[1],
        "arg_min": lambda r: extreme(r, False)[1],
        "reduce_sum": lambda r: wrap(sum(r), dtype),
        "reduce_prod": lambda r: wrap(modular_prod(r, dtype), dtype),
    }[op]
    return [fn(r) for r in rs], out_shape(x.shape, axes, keep_dim)


def scan_oracle(op: str, x: np.ndarray, attrs: dict[str, Any], dtype: str) -> tuple[list, tuple]:
    axis = attrs.get("axis", -1) % x.ndim
    exclusive, reverse = attrs.get("exclusive", False), attrs.get("reverse", False)
    step, identity = {
        "cum_max": (lambda acc, v: math.nan if is_nan(acc) or is_nan(v) else max(acc, v), smallest(dtype)),
        "cumsum": (lambda acc, v: wrap(acc + v, dtype), 0),
        "cum_prod": (lambda acc, v: wrap(acc * v, dtype), 1),
    }[op]
    rs, kept = rows(x, [axis])
    out_rows = []
    for r in rs:
        seq = r[::-1] if reverse else r
        acc, res = identity, []
        for v in seq:
            nxt = step(acc, v)
            res.append(acc if exclusive else nxt)
            acc = nxt
        out_rows.append(res[::-1] if reverse else res)
    # back to x's layout: rows are (kept..., axis); move the axis home
    arr = np.array(out_rows, dtype=object).reshape(kept + (x.shape[axis],))
    arr = np.moveaxis(arr, -1, axis)
    return list(arr.ravel()), x.shape


def same(got: Any, want: Any) -> bool:
    if is_nan(want):
        return is_nan(got)
    return got == want


def size(c: matrix.Case) -> int:
    return sum(math.prod(s) for s in c.shapes)


def cases(ops: Sequence[str], dtypes: Sequence[str] | None = None) -> list[matrix.Case]:
    out, seen = [], set()
    for c in matrix.generate([TARGET], ops=list(ops), dtypes=list(dtypes) if dtypes else None):
        if size(c) < SMALL:
            out.append(c)
        elif c.dtype in ("float32", "int32") and (c.op, c.family, c.vals) not in seen:
            seen.add((c.op, c.family, c.vals))
            out.append(c)
    return out


EXACT = ["reduce_max", "reduce_min", "arg_max", "arg_min", "cum_max"]
INTEGER = ["reduce_sum", "reduce_prod", "cumsum", "cum_prod"]
CASES = cases(EXACT) + cases(INTEGER, dtypes=list(INT))


def check(case: matrix.Case, out: np.ndarray | None = None) -> list[str]:
    (x,) = matrix.make_inputs(case)
    if out is None:
        (out,) = CPU.run(case.op, [x.copy()], case.attr_dict)
    oracle = scan_oracle if case.op.startswith("cum") else reduce_oracle
    want, shape = oracle(case.op, x, case.attr_dict, case.dtype)
    out = np.asarray(out)
    if out.shape != shape:
        return [f"shape {out.shape}, want {shape}"]
    if case.op.startswith("arg") and out.dtype != np.int64:
        return [f"dtype {out.dtype}, want int64"]
    if not case.op.startswith("arg") and out.dtype != x.dtype:
        return [f"dtype {out.dtype}, want {x.dtype}"]
    got = py(out)
    return [f"{np.unravel_index(i, shape)}: {g!r}, want {w!r}" for i, (g, w) in enumerate(zip(got, want))
            if not same(g, w)][:5]


@pytest.mark.parametrize("op", EXACT + INTEGER)
def test_reference_against_python_loops(op: str) -> None:
    assert_each_case((c for c in CASES if c.op == op), check)


def test_subsample_keeps_every_attribute_family_and_value_class() -> None:
    full = list(matrix.generate([TARGET], ops=EXACT + INTEGER))
    full = [c for c in full if c.op in EXACT or c.dtype in INT]
    for key in (lambda c: (c.op, c.attrs), lambda c: (c.op, c.family), lambda c: (c.op, c.vals),
                lambda c: (c.op, c.dtype)):
        assert {key(c) for c in full} == {key(c) for c in CASES}


@pytest.mark.parametrize("op,wrong", [
    ("arg_max", lambda x, a: np.argmax(np.where(np.isnan(x), -np.inf, x) if x.dtype.kind == "f" else x,
                                       axis=a["axis"], keepdims=a["keep_dim"])),
    ("reduce_max", lambda x, a: np.fmax.reduce(x, axis=tuple(a["axes"]) or None, keepdims=a["keep_dim"])),
    ("cum_max", lambda x, a: np.maximum.accumulate(x, axis=a["axis"])),
    ("reduce_prod", lambda x, a: np.prod(x.astype(np.float64), axis=tuple(a["axes"]) or None,
                                         keepdims=a["keep_dim"]).astype(x.dtype)),
])
def test_the_oracle_rejects_a_wrong_kernel(op: str, wrong: Callable) -> None:
    """Plausible wrong kernels (NaN ignored by arg_max and reduce_max, exclusive/reverse ignored by
    cum_max, an integer product through float64) fail on the matrix's cases."""
    caught = 0
    for case in (c for c in CASES if c.op == op and size(c) < SMALL):
        (x,) = matrix.make_inputs(case)
        with np.errstate(all="ignore"):
            try:
                out = wrong(x, case.attr_dict)
            except ValueError:  # numpy's own empty-axis errors
                continue
        caught += bool(check(case, out))
    assert caught > 0
