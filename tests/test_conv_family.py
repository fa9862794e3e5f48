"""Convolution and pooling: the CPU reference against a direct float64 loop (the definition, one
output and one tap at a time), scipy.signal.correlate, the adjoint identity that defines the
transposed convolution, and loop-based pooling; plus the error bounds.

The loops read the attributes with their own code (:func:`per_dim`, :func:`begins_ends`, from
docs/ops.md), not with the geometry the reference and its bounds share
(judge/bounds/conv.py), so that a mistake there cannot agree with itself here. The whole matrix
is checked against onnx.reference in tests/test_independent_oracles.py."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.signal

from rlx_conformance.backends import get_backend
from rlx_conformance.core.errors import SpecError
from rlx_conformance.generate import matrix
from rlx_conformance.judge.bounds.conv import conv_bound
from rlx_conformance.ops import get_op

CPU = get_backend("cpu")
T = matrix.Target("mlx", "cpu", "eager")


def run(op, inputs, **attrs):
    return CPU.run(op, [np.asarray(x) for x in inputs], attrs)[0]


def rand(seed, shape):
    return np.random.default_rng(seed).uniform(-1, 1, shape)


def per_dim(v, nd: int, default: int) -> list[int]:
    """() = the default; one value = every dim; else one per dim (docs/ops.md)."""
    return [default] * nd if not v else [v[0]] * nd if len(v) == 1 else list(v)


def begins_ends(v, nd: int) -> tuple[list[int], list[int]]:
    """Padding: 2*nd values are the begins then the ends; else symmetric per dim."""
    if len(v) == 2 * nd:
        return list(v[:nd]), list(v[nd:])
    sym = per_dim(v, nd, 0)
    return sym, sym


def loop_conv(x, w, bias, attrs):
    nd = x.ndim - 2
    st, dil = per_dim(attrs["stride"], nd, 1), per_dim(attrs["dilation"], nd, 1)
    pb, pe = begins_ends(attrs["padding"], nd)
    g, cout = attrs["groups"], w.shape[0]
    out = tuple((L + b + e - d * (k - 1) - 1) // s + 1
                for L, b, e, d, k, s in zip(x.shape[2:], pb, pe, dil, w.shape[2:], st))
    n, cin = x.shape[:2]
    cg, og = cin // g, cout // g
    y = np.zeros((n, cout) + out)
    for b, o in itertools.product(range(n), range(cout)):
        grp = o // og
        for pos in itertools.product(*map(range, out)):
            terms = []
            for c in range(cg):
                for tap in itertools.product(*map(range, w.shape[2:])):
                    src = [p * s - lo + t * d for p, s, lo, t, d in zip(pos, st, pb, tap, dil)]
                    if all(0 <= i < L for i, L in zip(src, x.shape[2:])):  # padding is zero
                        terms.append(w[(o, c) + tap] * x[(b, grp * cg + c) + tuple(src)])
            y[(b, o) + pos] = math.fsum(terms) + (bias[o] if bias.size else 0.0)
    return y


CONV_CASES = [
    ((2, 4, 11), (6, 2, 3), 6, dict(stride=(2,), padding=(2, 0), dilation=(2,), groups=2)),
    ((1, 3, 7), (2, 3, 4), 0, dict(stride=(), padding=(1,), dilation=(), groups=1)),
    ((2, 4, 7, 6), (4, 1, 3, 2), 4, dict(stride=(1, 3), padding=(0, 2, 1, 0), dilation=(2,), groups=4)),
    ((1, 2, 6, 6), (4, 2, 2, 3), 0, dict(stride=(2,), padding=(1, 2), dilation=(1, 2), groups=1)),
]


@pytest.mark.parametrize("xs,ws,nb,attrs", CONV_CASES)
def test_conv_against_direct_loop(xs, ws, nb, attrs):
    x, w, b = rand(1, xs), rand(2, ws), rand(3, (nb,))
    attrs = dict(kernel_size=(), **attrs)
    np.testing.assert_allclose(run("conv", [x, w, b], **attrs), loop_conv(x, w, b, attrs), rtol=1e-13, atol=1e-14)


def test_conv_against_scipy_correlate():
    x, w = rand(4, (1, 1, 9, 8)), rand(5, (1, 1, 3, 4))
    want = scipy.signal.correlate(x[0, 0], w[0, 0], mode="valid")
    got = run("conv", [x, w, np.zeros(0)], kernel_size=(), stride=(), padding=(), dilation=(), groups=1)
    np.testing.assert_allclose(got[0, 0], want, rtol=1e-13)


@pytest.mark.parametrize("stride,padding,output_padding,dilation,groups", [
    ((), (), (), (), 1), ((2,), (1,), (1,), (), 2), ((2, 1), (0, 1), (1, 0), (1, 2), 1), ((), (1,), (1,), (2,), 2)])
def test_conv_transpose_is_the_adjoint_of_conv(stride, padding, output_padding, dilation, groups):
    """<conv(y, w), x> = <y, conv_transpose(x, w)> for every y of the transposed conv's output
    shape: the definition of the transposed convolution. (With output_padding >= stride the
    forward conv has extra trailing outputs that no input position maps to: cropped.)"""
    x = rand(6, (2, 4, 4, 5))
    w = rand(7, (4, 6 // groups, 3, 2))  # [Cin_t, Cout_t/groups, kh, kw]
    t_attrs = dict(stride=stride, padding=padding, output_padding=output_padding, dilation=dilation, groups=groups)
    yt = run("conv_transpose2d", [x, w, np.zeros(0)], **t_attrs)
    y = rand(8, yt.shape)
    # the forward conv maps Cout_t -> Cin_t channels with weight w viewed as [Cin_t, Cout_t/g, ...]
    c_attrs = dict(kernel_size=(), stride=stride, padding=padding, dilation=dilation, groups=groups)
    fwd = run("conv", [y, w, np.zeros(0)], **c_attrs)[:, :, :x.shape[2], :x.shape[3]]
    assert fwd.shape == x.shape
    assert np.sum(fwd * x) == pytest.approx(np.sum(y * yt), rel=1e-12)


def test_conv_transpose_bias_and_simple_value():
    x = np.zeros((1, 1, 2, 2))
    x[0, 0, 1, 1] = 1.0
    w = np.arange(4.0).reshape(1, 1, 2, 2)
    y = run("conv_transpose2d", [x, w, np.array([0.5])], stride=(2,), padding=(), output_padding=(),
            dilation=(), groups=1)
    want = np.full((1, 1, 4, 4), 0.5)
    want[0, 0, 2:, 2:] += w[0, 0]
    np.testing.assert_array_equal(y, want)


def loop_pool(x, attrs):
    k = attrs["kernel_size"]
    nd = len(k)
    st = [s or kk for s, kk in zip(per_dim(attrs["stride"], nd, 0), k)]  # () = the window
    pb, pe = begins_ends(attrs["padding"], nd)
    out = tuple((L + b + e - kk) // s + 1 for L, b, e, kk, s in zip(x.shape[2:], pb, pe, k, st))
    y = np.zeros(x.shape[:2] + out)
    for idx in itertools.product(*map(range, x.shape[:2] + out)):
        vals = []
        for tap in itertools.product(*map(range, k)):
            src = [p * s - lo + t for p, s, lo, t in zip(idx[2:], st, pb, tap)]
            if all(0 <= i < L for i, L in zip(src, x.shape[2:])):
                vals.append(x[idx[:2] + tuple(src)])
        if attrs["kind"] == "max":
            y[idx] = np.nan if any(math.isnan(v) for v in vals) else max(vals)
        else:
            y[idx] = math.fsum(vals) / len(vals)
    return y


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("shape,k,stride,padding", [((2, 3, 11), (3,), (), (1,)),
                                                    ((1, 2, 7, 8), (2, 3), (1,), (1, 0, 0, 1)),
                                                    ((1, 1, 9, 9), (4, 4), (2,), ())])
def test_pool_against_loops(kind, shape, k, stride, padding):
    x = rand(9, shape)
    x.flat[5] = np.nan
    attrs = dict(kind=kind, kernel_size=k, stride=stride, padding=padding)
    np.testing.assert_allclose(run("pool", [x], **attrs), loop_pool(x, attrs), rtol=1e-14)


def test_conv_bound_admits_reference_and_rejects_a_flipped_tap():
    c = next(c for c in matrix.generate([T], ops=["conv"], dtypes=["float32"]) if c.family == "img_large")
    x, w, b = matrix.make_inputs(c)
    ref = CPU.run("conv", [x, w, b], c.attr_dict)[0].astype(np.float64)
    bound = conv_bound([x, w, b], c.attr_dict, "float32")
    assert np.all(np.isfinite(bound))
    w2 = w.copy()
    w2[..., 0, 0] = -w2[..., 0, 0]  # a kernel applied with one tap wrong
    bad = CPU.run("conv", [x, w2, b], c.attr_dict)[0].astype(np.float64)
    assert np.any(np.abs(bad - ref) > bound)


def test_every_default_case_has_a_reference():
    for c in matrix.generate([T], ops=["conv", "conv_transpose2d", "pool"]):
        out = CPU.run(c.op, matrix.make_inputs(c), c.attr_dict)
        assert len(out) == 1, c.id


@pytest.mark.parametrize("op,desc,inputs,attrs", [(op, *e) for op in ("conv", "conv_transpose2d", "pool")
                                                  for e in get_op(op).error_inputs()],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_reference_rejects_error_inputs(op, desc, inputs, attrs):
    with pytest.raises(SpecError):
        CPU.run(op, [x.copy() for x in inputs], attrs)
