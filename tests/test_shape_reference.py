"""The CPU reference kernels of the shape and data movement family against independent oracles:
plain Python loops over element indices that follow the definitions in docs/ops.md / ONNX, written
without the numpy routines the kernels use."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.core.errors import SpecError
from rlx_conformance.ops import get_op

CPU = get_backend("cpu")
RNG = np.random.default_rng(7)


def run(op, inputs, **attrs):
    return CPU.run(op, inputs, attrs)


def rand(*shape):
    return RNG.integers(-9, 10, shape).astype(np.float32)


def _pad_source(i: int, d: int, mode: str) -> int | None:
    """Source index of output position i (already shifted by the begin pad), None = constant."""
    if 0 <= i < d:
        return i
    if mode == "constant":
        return None
    if mode == "replicate":
        return 0 if i < 0 else d - 1
    if mode == "circular":
        return i % d
    # reflect: mirror about the edges without repeating them
    period = 2 * (d - 1)
    j = i % period
    return j if j < d else period - j


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pads", [((5,), (2, 3)), ((3, 4), (1, 0, 2, 3)),
                                        ((2, 3, 3), (0, 2, 1, 1, 0, 2))])
def test_pad_matches_index_loop(mode, shape, pads):
    x = rand(*shape)
    r = len(shape)
    if mode == "reflect" and any(max(pads[a], pads[a + r]) >= shape[a] for a in range(r)):
        with pytest.raises(SpecError):
            run("pad", [x], pads=pads, mode=mode)
        return
    value = -2.0 if mode == "constant" else 0.0
    (out,) = run("pad", [x], pads=pads, mode=mode, value=value)
    for idx in itertools.product(*(range(n) for n in out.shape)):
        src = [_pad_source(i - pads[a], shape[a], mode) for a, i in enumerate(idx)]
        want = value if None in src else x[tuple(src)]
        assert out[idx] == want, (idx, src)


def test_slice_and_narrow_match_python_indexing():
    x = rand(7, 5)
    for axis, start, n, step in [(0, 0, 3, 2), (0, -1, 3, -3), (1, 4, 5, -1), (1, 1, 0, 2)]:
        (out,) = run("slice", [x], axis=axis, start=start, len=n, step=step)
        d = x.shape[axis]
        s = start + d if start < 0 else start
        pos = [s + k * step for k in range(n)]
        want = np.stack([np.take(x, p, axis=axis) for p in pos], axis=axis) if n else \
            np.zeros(out.shape, x.dtype)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(SpecError):
        run("slice", [x], axis=0, start=0, len=3, step=-1)  # would read index -1
    (out,) = run("narrow", [x], axis=1, start=-3, len=2)
    np.testing.assert_array_equal(out, [[row[2], row[3]] for row in x])


def test_gather_is_onnx_gather():
    x = rand(5, 4, 3)
    idx = np.array([[0, -1], [4, -5]], np.int32)
    (out,) = run("gather", [x, idx], axis=0)
    for i, j in itertools.product(range(2), range(2)):
        np.testing.assert_array_equal(out[i, j], x[idx[i, j] % 5])
    (out,) = run("gather", [x, np.array([2, -3], np.int64)], axis=1)
    assert out.shape == (5, 2, 3)
    np.testing.assert_array_equal(out[:, 1], x[:, 1])


@pytest.mark.parametrize("desc,inputs,attrs", get_op("gather").error_inputs())
def test_gather_error_inputs_rejected(desc, inputs, attrs):
    with pytest.raises(SpecError):
        run("gather", inputs, **attrs)


@pytest.mark.parametrize("desc,inputs,attrs", get_op("scatter_add").error_inputs())
def test_scatter_add_error_inputs_rejected(desc, inputs, attrs):
    with pytest.raises(SpecError):
        run("scatter_add", inputs, **attrs)


def test_scatter_add_sums_every_duplicate_exactly():
    upd = RNG.uniform(-1, 1, (50, 3)).astype(np.float32)
    idx = RNG.integers(-4, 4, 50).astype(np.int64)
    (out,) = run("scatter_add", [upd, idx], out_dim=4)
    for row in range(4):
        for c in range(3):
            terms = [float(upd[i, c]) for i in range(50) if idx[i] % 4 == row]
            assert out[row, c] == np.float32(math.fsum(terms))
    ints = np.full((3, 1), 100, np.int8)
    (out,) = run("scatter_add", [ints, np.array([0, 0, 0])], out_dim=2)
    assert out[0, 0] == np.int8(300 - 256) and out[1, 0] == 0  # wraps


def test_one_hot_follows_onnx():
    idx = np.array([[0, -1, 5], [-6, 2, 7]], np.int64)
    vals = np.array([-1.5, 3.0], np.float32)
    for axis in (-1, 0, 1):
        (out,) = run("one_hot", [idx, vals], depth=5, axis=axis)
        moved = np.moveaxis(out, axis, -1)
        for i, j in itertools.product(range(2), range(3)):
            k = idx[i, j]
            hot = k + 5 if -5 <= k < 0 else k if 0 <= k < 5 else None
            want = [3.0 if c == hot else -1.5 for c in range(5)]
            np.testing.assert_array_equal(moved[i, j], want)


def test_trilu_tile_reverse_non_zero_by_loops():
    x = rand(2, 4, 5)
    for upper, k in itertools.product((False, True), (-1, 0, 2)):
        (out,) = run("trilu", [x], upper=upper, diagonal=k)
        for b, i, j in itertools.product(range(2), range(4), range(5)):
            keep = (j - i >= k) if upper else (j - i <= k)
            assert out[b, i, j] == (x[b, i, j] if keep else 0)
    (out,) = run("tile", [x[0, :2, :3]], reps=(2, 3))
    for i, j in itertools.product(range(4), range(9)):
        assert out[i, j] == x[0, i % 2, j % 3]
    (out,) = run("reverse", [x], axes=(2, 0))
    assert out[0, 1, 0] == x[1, 1, 4]
    y = np.array([[0.0, -0.0, np.nan], [1.0, 0.0, -2.0]], np.float32)
    # the kernel itself: Backend.run needs data-dependent output dims (count), see ops/shape.py
    nz = CPU.kernels["non_zero"].fn
    want = [idx for idx in itertools.product(range(2), range(3)) if not y[idx] == 0]
    np.testing.assert_array_equal(nz(y), np.array(want).T)
    assert nz(np.array(3.0)).shape == (0, 1)


def test_bit_patterns_survive_layout_ops():
    """NaN payloads and signed zeros move unchanged (the family is bit-exact)."""
    bits = np.array([0x7FC00001, 0x80000000, 0xFF800000, 0x00000001], np.uint32)
    x = bits.view(np.float32)
    for op, attrs in [("reverse", {"axes": (0,)}), ("tile", {"reps": (2,)}),
                      ("pad", {"pads": (1, 2), "mode": "circular", "value": 0.0})]:
        (out,) = run(op, [x], **attrs)
        assert set(out.view(np.uint32).tolist()) == set(bits.tolist())


def test_shape_inference_rejects_bad_attributes():
    x = rand(2, 3)
    for op, attrs in [("reshape", {"new_shape": (4, -1)}), ("reshape", {"new_shape": (-1, -1)}),
                      ("transpose", {"perm": (0, 0)}), ("expand", {"target_shape": (3, 3)}),
                      ("tile", {"reps": (2,)}), ("pad", {"pads": (1, 1), "mode": "constant"}),
                      ("pad", {"pads": (0, 3, 0, 3), "mode": "reflect"}),
                      ("pad", {"pads": (0, 1, 0, 1), "mode": "reflect", "value": 1.0}),
                      ("narrow", {"axis": 0, "start": 1, "len": 2}),
                      ("reverse", {"axes": (0, -2)})]:
        with pytest.raises(SpecError):
            run(op, [x], **attrs)
    with pytest.raises(SpecError):
        run("pad", [np.zeros(3, np.uint8)], pads=(1, 1), mode="constant", value=-2.0)
