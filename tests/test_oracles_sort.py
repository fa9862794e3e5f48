"""The CPU reference of sort, arg_sort and top_k against Python's sorted() over the generated case
matrix: every case, every dtype.

The oracle reads docs/ops.md (sort): sort and arg_sort are stable along ``axis``, NaN last
ascending and first descending; top_k takes the k largest along the last axis, descending, ties to
the smaller index, NaN above +inf. Python's sorted() is stable; the key is written here: (is NaN,
value) ascending, (is not NaN, -value) descending, so -0 and +0 tie (they compare equal) and keep
their order. top_k is the first k of the stable descending order (a stable sort keeps tied
elements in index order, so the smaller index comes first). Judged bit-exactly: indices exactly,
values as bit patterns (signed zeros included, as docs/ops.md's judge).

Subsample: every case below SMALL input elements in every dtype; the 10^5-element families in
float32 (test_subsample_keeps_every_dtype_attribute_and_value_class).
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, TARGET, assert_each_case
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def order(row: list, descending: bool) -> list[int]:
    def key(i: int) -> tuple:
        v = row[i]
        nan = isinstance(v, float) and math.isnan(v)
        if descending:
            return (not nan, 0 if nan else -v)
        return (nan, 0 if nan else v)
    return sorted(range(len(row)), key=key)


def values(x: np.ndarray) -> list:
    if x.dtype.kind == "f" or x.dtype == ml_dtypes.bfloat16:
        return [float(v) for v in x.astype(np.float64)]
    return [int(v) for v in x]


def bits(x: np.ndarray) -> np.ndarray:
    return np.array(x, copy=True).view(BITS[x.dtype.itemsize]) if x.dtype != np.bool_ else x


def expected(case: matrix.Case, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values) along the op's axis, in x's layout."""
    a = case.attr_dict
    axis = -1 if case.op == "top_k" else a.get("axis", -1)
    descending = True if case.op == "top_k" else a.get("descending", False)
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(math.prod(moved.shape[:-1]), moved.shape[-1]) if moved.ndim else moved.reshape(1, 1)
    idx = np.array([order(values(r), descending) for r in rows], np.int64).reshape(rows.shape)
    if case.op == "top_k":
        idx = idx[:, :a["k"]]
    vals = np.take_along_axis(rows, idx, axis=-1)
    shape = moved.shape[:-1] + (idx.shape[-1],) if moved.ndim else ()
    idx, vals = idx.reshape(shape), vals.reshape(shape)
    if moved.ndim:
        idx, vals = np.moveaxis(idx, -1, axis), np.moveaxis(vals, -1, axis)
    return idx, vals


def check(case: matrix.Case, outs: list[np.ndarray] | None = None) -> str | None:
    (x,) = matrix.make_inputs(case)
    if outs is None:
        outs = CPU.run(case.op, [x.copy()], case.attr_dict)
    idx, vals = expected(case, x)
    got = {"sort": {"values": outs[0]}, "arg_sort": {"indices": outs[0]},
           "top_k": {"values": outs[0], "indices": outs[1] if len(outs) > 1 else None}}[case.op]
    for name, want in (("indices", idx), ("values", vals)):
        if name not in got:
            continue
        g = np.asarray(got[name])
        if g.shape != want.shape:
            return f"{name}: shape {g.shape}, want {want.shape}"
        if name == "indices":
            if g.dtype != np.int64 or not np.array_equal(g, want):
                return f"indices differ ({g.dtype})"
        elif g.dtype != x.dtype or not np.array_equal(bits(g), bits(want)):
            return "values differ"
    return None


OPS = ["sort", "arg_sort", "top_k"]
SMALL = 5000


def cases() -> list[matrix.Case]:
    """Every case below SMALL input elements; the 10^5-element families (sorting length, not
    attributes or dtypes: those are swept on the smaller ones) in float32 only."""
    return [c for c in matrix.generate([TARGET], ops=OPS)
            if sum(math.prod(s) for s in c.shapes) < SMALL or c.dtype == "float32"]


CASES = cases()


@pytest.mark.parametrize("op", OPS)
def test_reference_against_stable_sorted(op: str) -> None:
    assert_each_case((c for c in CASES if c.op == op), check)


def test_subsample_keeps_every_dtype_attribute_and_value_class() -> None:
    full = list(matrix.generate([TARGET], ops=OPS))
    for key in (lambda c: (c.op, c.dtype), lambda c: (c.op, c.attrs), lambda c: (c.op, c.family),
                lambda c: (c.op, c.vals), lambda c: (c.op, c.dtype, c.attrs, c.vals)):
        assert {key(c) for c in full} == {key(c) for c in CASES}


@pytest.mark.parametrize("op", OPS)
def test_the_oracle_rejects_an_unstable_sort(op: str) -> None:
    """The comparison can fail: numpy's default (unstable, NaN-last-always) sort, negated for
    descending, in place of the reference is caught on the matrix's cases."""
    caught = 0
    for case in (c for c in CASES if c.op == op and c.dtype == "float32"):
        (x,) = matrix.make_inputs(case)
        a = case.attr_dict
        axis = -1 if op == "top_k" else a["axis"]
        desc = op == "top_k" or a["descending"]
        if x.ndim == 0:
            continue
        i = np.argsort(-x if desc else x, axis=axis)
        if op == "top_k":
            i = np.take(i, np.arange(min(a["k"], x.shape[-1])), axis=-1)
        v = np.take_along_axis(x, i, axis=axis)
        outs = {"sort": [v], "arg_sort": [i], "top_k": [v, i]}[op]
        caught += check(case, outs) is not None
    assert caught > 0
