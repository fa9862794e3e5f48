"""The backward family (ops/backward.py): RLX's explicit backward op kinds as registry ops.

* The CPU reference (the forward's reference VJP rule, backends/cpu/backward.py) agrees with
  central finite differences of the forward's own reference kernel, with Richardson
  extrapolation (test_reference_derivatives._ridders) so the test's own error is known: for a
  random direction v, <backward(x, dy), v> = d/de <forward(x + e v), dy>.
* The MLX kernels (backends/mlx/backward.py) pass on every mode on a small subset, or their
  failures are recorded in cases/known_divergences.toml.
* A deliberately wrong MLX kernel (a missing factor, a dropped duplicate index) is rejected.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_reference_derivatives import _ridders

from rlx_conformance.backends import get_backend
from rlx_conformance.generate.matrix import Case, Target, generate, make_inputs
from rlx_conformance.judge.divergences import known_divergence
from rlx_conformance.ops import all_ops
from rlx_conformance.run.execute import run_case

CPU = get_backend("cpu")
BACKWARD = sorted(s.name for s in all_ops() if s.family == "backward")
# op -> (forward op, position of the forward input it differentiates, forward input count)
FORWARD = {"relu_backward": (None, 0, 1), "activation_backward": (None, 0, 1),
           "conv2d_backward_input": ("conv", 0, 3), "conv2d_backward_weight": ("conv", 1, 3),
           "cumsum_backward": ("cumsum", 0, 1), "gather_backward": ("gather", 0, 2),
           "rope_backward": ("rope", 0, 3), "softmax_cross_entropy_backward": ("softmax_cross_entropy", 0, 2),
           "max_pool2d_backward": ("pool", 0, 1)}


def _size(c: Case) -> int:
    return sum(math.prod(s) for s in c.shapes)


def _subset(op: str, dtype: str, targets: list[Target], vals: str = "random", per_op: int = 3) -> list[Case]:
    """The ``per_op`` smallest non-empty input sets of ``op`` (one per attribute setting first),
    every target."""
    cases = [c for c in generate(targets, ops=[op], dtypes=[dtype]) if c.vals == vals and _size(c) > 0]
    seen: dict[str, Case] = {}
    for c in sorted(cases, key=lambda c: (_size(c), c.id)):
        seen.setdefault(c.attrs and repr(c.attrs) or c.input_id, c)
    keep = {c.input_id for c in sorted(seen.values(), key=_size)[:per_op]}
    return [c for c in cases if c.input_id in keep]


def test_the_family_is_declared() -> None:
    assert BACKWARD == sorted(FORWARD)
    for op in BACKWARD:
        assert CPU.kernels.get(op) is not None and get_backend("mlx").kernels.get(op) is not None, op


def _directional(fwd: str, xs: list[np.ndarray], attrs: dict, wrt: int, v: np.ndarray, dy: np.ndarray):
    """h -> the central difference of <fwd(xs with input wrt moved by h v), dy> over 2h."""
    def central(h: float) -> float:
        hi, lo = list(xs), list(xs)
        hi[wrt], lo[wrt] = np.asarray(xs[wrt] + h * v), np.asarray(xs[wrt] - h * v)
        (fh,), (fl,) = CPU.run(fwd, hi, attrs), CPU.run(fwd, lo, attrs)
        return math.fsum(((fh - fl) * dy).ravel().tolist()) / (2 * h)
    return central


@pytest.mark.parametrize("op", BACKWARD)
def test_reference_matches_finite_differences(op: str) -> None:
    cases = _subset(op, "float64", [Target("cpu", "cpu", "eager")])
    assert cases, op
    rng = np.random.default_rng(16)
    for c in cases:
        ins = make_inputs(c)
        attrs = c.attr_dict
        fwd, wrt, n = FORWARD[op]
        fwd = fwd or ("relu" if op == "relu_backward" else attrs["activation"])
        fattrs = {} if fwd == "relu" or op == "activation_backward" else \
            {**attrs, "kind": "max"} if op == "max_pool2d_backward" else attrs
        xs, dy = ins[:n], ins[n]
        (dx,) = CPU.run(op, ins, attrs)
        assert dx.shape == xs[wrt].shape and dx.dtype == xs[wrt].dtype
        v = rng.uniform(-1, 1, xs[wrt].shape)
        radius = CPU.smooth_radius(fwd, xs, fattrs)[wrt]  # keep the stencil off kinks and ties
        if radius is not None:
            v = v * np.minimum(1.0, radius)

        fd, err = _ridders(_directional(fwd, xs, fattrs, wrt, v, dy), 0.5, 8)
        got = math.fsum((dx * v).ravel().tolist())
        scale = math.fsum(np.abs(dx * v).ravel().tolist()) + 1e-300
        assert abs(fd - got) <= 10 * err + 1e-9 * scale, (c.id, fd, got, err)


MODES = ("eager", "lazy", "compiled")


@pytest.mark.parametrize("op", BACKWARD)
def test_mlx_passes_or_is_recorded(op: str) -> None:
    targets = [Target("mlx", "cpu", m) for m in MODES]
    cases = _subset(op, "float32", targets, per_op=2) + _subset(op, "float16", targets, per_op=1)
    assert {c.target.mode for c in cases} == set(MODES)
    for c in cases:
        r = run_case(c)
        assert r.outcome == "pass" or (r.outcome == "fail" and known_divergence(c, r) is not None), \
            (c.id, r.outcome, r.message)


def _wrong(op: str):
    """A wrong kernel of ``op``: a missing factor, or duplicate indices dropped."""
    import mlx.core as mx
    if op == "activation_backward":
        return lambda x, dy, *, activation: dy * mx.sigmoid(x)  # sigmoid': the (1 - s) factor missing
    if op == "conv2d_backward_weight":
        right = get_backend("mlx").kernels[op].fn
        return lambda x, w, bias, dy, **kw: right(x, w, bias, dy, **kw) * (1 + 2 ** -10)
    if op == "gather_backward":
        def dropped(x, indices, dy, *, axis):  # a store, not an add: one of each duplicate kept
            a = axis % x.ndim
            idx = indices.reshape(-1)
            idx = mx.where(idx < 0, idx + x.shape[a], idx)
            lead = list(range(a, a + indices.ndim))
            rest = [d for d in range(dy.ndim) if d not in lead]
            upd = dy.transpose(lead + rest).reshape([idx.size] + [dy.shape[d] for d in rest])
            acc = mx.zeros([x.shape[a]] + [dy.shape[d] for d in rest], dtype=dy.dtype)
            acc[idx] = upd
            return mx.moveaxis(acc, 0, a)
        return dropped
    raise KeyError(op)


def _has_duplicates(idx: np.ndarray, size: int) -> bool:
    rows = np.where(idx < 0, idx + size, idx).ravel()
    return len(set(rows.tolist())) < rows.size


@pytest.mark.parametrize("op,filter_id", [("activation_backward", "activation:sigmoid/"),
                                          ("conv2d_backward_weight", "shape:1x8x24x24"),
                                          ("gather_backward", "gather_backward/float32/")])
def test_a_wrong_kernel_is_rejected(op: str, filter_id: str, monkeypatch) -> None:
    mlx = get_backend("mlx")
    entry = mlx.kernels[op]
    monkeypatch.setitem(mlx.kernels, op, dataclasses.replace(entry, fn=_wrong(op)))
    cases = [c for c in generate([Target("mlx", "cpu", "eager")], ops=[op], dtypes=["float32"])
             if c.vals == "random" and filter_id in c.id and _size(c) > 0]
    if op == "gather_backward":  # inputs with a duplicate index
        cases = [c for c in cases if _has_duplicates(make_inputs(c)[1], make_inputs(c)[0].shape[c.attr_dict["axis"]])]
    assert cases
    for c in cases[:2]:
        r = run_case(c)
        assert r.outcome == "fail", (c.id, r.outcome, r.message)
