"""Signal, random, quantization and loss (docs/ops.md): fft, rng_uniform, rng_normal, quantize,
dequantize, fake_quantize, softmax_cross_entropy.

Semantics: complex data is a trailing (real, imag) axis of size 2. The random ops draw a sample
of the ``shape`` attribute from a uint32 key of shape (2,); the stream is the backend's, so only
the distribution is specified. Quantization follows ONNX QuantizeLinear/DequantizeLinear
(round half to even, saturate to int8/uint8) with per-tensor or per-axis parameters; a NaN input
of quantize has no defined result. The loss takes probability targets of the logits' shape.

Judging (judge/bounds/signal.py, judge/bounds/distributions.py): fft by a normwise error bound of the FFT
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., sec. 24.1), the random ops by
distribution tests (their streams differ between libraries by design), quantization bit-exactly
except where the quotient x/scale lies within rounding error of a half-integer, the loss by a
log-sum-exp and summation bound.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import distributions
from rlx_conformance.judge.bounds.signal import (
    fake_quantize_bound,
    fft_bound,
    param_view,
    quantize_check,
    xent_bound,
)
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    Attr,
    CheckValues,
    ErrorInputs,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)
from rlx_conformance.spec.values import ACCUMULATION_CLASSES, make_array, specials

FLOATS = dt.FLOATS


# Error inputs (validate's error-input parity; docs/ops.md): (description, inputs,
# attrs) that every backend must reject.
def _f32(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


# -- fft -----------------------------------------------------------------------------------------
def infer_fft(spec, shapes, dtypes, attrs):
    (shape,) = shapes
    if len(shape) < 2 or shape[-1] != 2:
        raise SpecError(f"{spec.name}: expects [..., n, 2] (real, imag pairs), got {shape}")
    if shape[-2] < 1:
        raise SpecError(f"{spec.name}: transform length must be >= 1, got {shape[-2]}")
    return [(shape, dtypes[0])]


declare(name="fft", family="signal", doc="1-D DFT along the axis before the trailing (real, imag) "
        "axis; inverse uses e^{+i...}; norm scales the forward/inverse by backward (1, 1/n), "
        "ortho (1/sqrt n both) or forward (1/n, 1)",
        inputs=(Input("x", ranks=(2, None)),), dtypes=FLOATS, infer=infer_fft, shapes="fft",
        attrs=(Attr("inverse", "bool", default=False, sweep=(False, True)),
               Attr("norm", "enum", default="backward", choices=("backward", "ortho", "forward"),
                    sweep=("backward", "ortho", "forward"))),
        values=("random", "spread"),
        error_inputs=lambda: [("no trailing (real, imag) axis", [_f32(4, 3)], {}),
                              ("rank 1", [_f32(2)], {}),
                              ("transform length 0", [_f32(0, 2)], {}),
                              ("integer input", [np.ones((4, 2), np.int32)], {}),
                              ("unknown norm", [_f32(4, 2)], {"norm": "unitary"})],
        policy=Policy(bound=fft_bound, bound_reason="Higham Thm 24.2: 2 (L eta/(1 - L eta) + u) "
                      "||y||_2 per element, eta = 7u, L = FFT depth"))


# -- random --------------------------------------------------------------------------------------
def infer_rng(spec, shapes, dtypes, attrs):
    a, b, key = shapes
    shape = tuple(attrs["shape"])
    if tuple(key) != (2,):
        raise SpecError(f"{spec.name}: key must be uint32 of shape (2,), got {key}")
    if any(d < 0 for d in shape):
        raise SpecError(f"{spec.name}: shape {shape} has a negative size")
    if infer.broadcast(spec.name, [a, b, shape]) != shape:
        raise SpecError(f"{spec.name}: parameters {a} and {b} do not broadcast to shape {shape}")
    return [(shape, dtypes[0])]


_SHAPE = Attr("shape", "ints", sweep=((100003,), (257, 389), (5,)), doc="output shape")
_KEY = Input("key", dtypes=("uint32",), role="key", domain="rng_key", ranks=(1, 1))


def check_uniform(inputs, attrs) -> None:
    """[low, high) is empty unless low < high (the op's contract): no value could be right."""
    lo, hi = np.broadcast_arrays(inputs[0], inputs[1])
    bad = lo >= hi  # NaN parameters compare false: not rejected here
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise SpecError(f"rng_uniform: needs low < high, got low={float(lo[i])} >= high={float(hi[i])}")


def _rng_errors():
    k = np.array([1, 2], np.uint32)
    return [("int32 key", [_f32(), _f32(), np.array([1, 2], np.int32)], {"shape": (4,)}),
            ("key of shape (3,)", [_f32(), _f32(), np.array([1, 2, 3], np.uint32)], {"shape": (4,)}),
            ("negative shape", [_f32(), _f32(), k], {"shape": (-4,)}),
            ("parameters do not broadcast to shape", [_f32(3), _f32(3), k], {"shape": (4,)}),
            ("integer parameters", [np.zeros((), np.int32), np.ones((), np.int32), k], {"shape": (4,)})]


def _uniform_errors():
    k = np.array([1, 2], np.uint32)
    return _rng_errors() + [("low >= high", [np.float32([0.0, 2.0]), np.float32([1.0, 2.0]), k],
                             {"shape": (2,)})]


# Why rank-3 parameters have no case (generate/coverage.py reads OpSpec.uncovered)
_RNG_RANK3 = ("the parameters broadcast to the `shape` attribute, whose sweep stops at rank 2, so no "
              "rank-3 parameter fits a swept shape; covering it needs a rank-3 `shape` in the sweep, "
              "which every rng family would then run")


@declaration_helper
def rng(name: str, doc: str, *, params: tuple[Input, Input], check: Callable[..., list[Any]],
        error_inputs: ErrorInputs, check_values: CheckValues | None = None) -> OpSpec:
    """A random op: two float parameters broadcast to the ``shape`` attribute, a uint32 key;
    judged by distribution tests (judge/bounds/distributions.py), since library streams differ."""
    return declare(name=name, family="random", doc=doc, inputs=params + (_KEY,), dtypes=FLOATS,
                   attrs=(_SHAPE,), infer=infer_rng, shapes="rng", values=("random",),
                   policy=Policy(check=check, check_reason=distributions.REASON),
                   check_values=check_values, error_inputs=error_inputs,
                   uncovered=tuple((f"rank:{p.name}=3+", _RNG_RANK3) for p in params),
                   not_differentiable="a random draw: only its distribution is specified, and the "
                                      "stream is the backend's, so no sample has a reference "
                                      "derivative (a reparameterization gradient would need the "
                                      "backend's own noise)")


rng("rng_uniform", "uniform on [low, high) (low < high), elementwise parameters broadcast to "
    "shape; the stream is the backend's, fixed by the key",
    params=(Input("low", domain="rng_low"), Input("high", domain="rng_high")),
    check=distributions.uniform_check, check_values=check_uniform, error_inputs=_uniform_errors)
rng("rng_normal", "mean + scale * N(0, 1), elementwise parameters broadcast to shape; the stream "
    "is the backend's, fixed by the key",
    params=(Input("mean"), Input("scale", domain="rng_scale")),
    check=distributions.normal_check, error_inputs=_rng_errors)


# -- quantization --------------------------------------------------------------------------------
QDTYPES = ("int8", "uint8")
UINT8_MARKER = (8,)  # trailing shape-family entry of dequantize: quantized input is uint8


def _params(op: str, x: tuple, scale: tuple, zp: tuple, axis: int) -> None:
    """Per-tensor (scalar scale and zero point) or per-axis (1-D, one per index of x's axis)."""
    if tuple(scale) != tuple(zp):
        raise SpecError(f"{op}: scale {scale} and zero_point {zp} differ in shape")
    if scale == ():
        return
    if not x:
        raise SpecError(f"{op}: per-axis parameters need rank >= 1")
    a = infer.norm_axis(op, axis, len(x))
    if tuple(scale) != (x[a],):
        raise SpecError(f"{op}: per-axis scale must have shape ({x[a]},) for axis {a}, got {scale}")


def infer_quantize(spec, shapes, dtypes, attrs):
    x, scale, zp = shapes
    _params(spec.name, x, scale, zp, attrs["axis"])
    if dtypes[2] != attrs["to"]:
        raise SpecError(f"{spec.name}: zero_point is {dtypes[2]}, output dtype to={attrs['to']}")
    return [(x, attrs["to"])]


def infer_dequantize(spec, shapes, dtypes, attrs):
    x, scale, zp = shapes
    _params(spec.name, x, scale, zp, attrs["axis"])
    if dtypes[0] != dtypes[2]:
        raise SpecError(f"{spec.name}: zero_point is {dtypes[2]}, x is {dtypes[0]}")
    return [(x, dtypes[1])]


def _scales(stream, n: int, dtype: str) -> np.ndarray:
    """Scales m * 2^e with m in {1, 3, 5, 7} and e in [-8, -1]: x = (k + 1/2) * scale is then
    exact in every float dtype (exact ties), while 1/scale is inexact for m > 1, so an
    implementation that multiplies by a reciprocal instead of dividing shows at the ties."""
    m = np.array([1.0, 3.0, 5.0, 7.0])[stream.choice(n, 4)]
    return (m * np.exp2(stream.integers(n, -8, -1))).astype(dt.np_dtype(dtype))


def _quantizable(stream, shape, dtype, scale, zp, to, vals, attrs):
    """x = (q + f) * scale with q spanning the integer range and beyond (saturation), f a random
    fraction or exactly 1/2 (a tie), so every rounding and clamping path is hit."""
    n = math.prod(shape)
    lo, hi = dt.iinfo(to)
    s = np.broadcast_to(scale.astype(np.float64), shape).ravel()
    z = np.broadcast_to(zp.astype(np.float64), shape).ravel()
    q = stream.integers(n, lo - 8, hi + 8) - z
    f = np.where(stream.coin(n), 0.5, stream.uniform(n, -1, 1))
    x = ((q + f) * s).astype(dt.np_dtype(dtype))
    if vals == "special" and n:
        pool = specials(dtype, "real", attrs)
        x = np.where(stream.coin(n), pool[stream.choice(n, len(pool))], x)
    return x.reshape(shape)


def _q_family(shapes):
    """(x shape, per_axis, marker dtype) from a family entry [x, [] | [1], optional [8]]."""
    shapes = [tuple(s) for s in shapes]
    qdt = "int8"
    if len(shapes) > 2 and shapes[-1] == UINT8_MARKER:
        qdt, shapes = "uint8", shapes[:-1]
    return shapes[0], len(shapes) > 1 and shapes[1] != (), qdt


def _param_shape(x_shape, per_axis, axis):
    return (x_shape[axis % len(x_shape)],) if per_axis else ()


def gen_quantize(stream, shapes, dtype, attrs, vals):
    x_shape, per_axis, _ = _q_family(shapes)
    to = attrs["to"]
    ps = _param_shape(x_shape, per_axis, attrs["axis"])
    scale = _scales(stream(1), math.prod(ps), dtype).reshape(ps)
    lo, hi = dt.iinfo(to)
    zp = stream(2).integers(math.prod(ps), lo // 2, hi // 2).astype(dt.np_dtype(to)).reshape(ps)
    x = _quantizable(stream(0), x_shape, dtype,
                     param_view(scale, len(x_shape), attrs["axis"]),
                     param_view(zp, len(x_shape), attrs["axis"]), to, vals, attrs)
    return [x, scale, zp]


def gen_dequantize(stream, shapes, dtype, attrs, vals):
    x_shape, per_axis, qdt = _q_family(shapes)
    ps = _param_shape(x_shape, per_axis, attrs["axis"])
    lo, hi = dt.iinfo(qdt)
    x = stream(0).integers(math.prod(x_shape), lo, hi).astype(dt.np_dtype(qdt)).reshape(x_shape)
    scale = stream(1).uniform(math.prod(ps), 2.0**-10, 4.0).astype(dt.np_dtype(dtype)).reshape(ps)
    zp = stream(2).integers(math.prod(ps), lo, hi).astype(dt.np_dtype(qdt)).reshape(ps)
    return [x, scale, zp]


_AXIS_Q = Attr("axis", "int", default=-1, sweep=(0, -1), doc="axis of per-axis parameters")

declare(name="quantize", family="quantize", doc="ONNX QuantizeLinear: saturate(round_half_even("
        "x / scale) + zero_point) to `to` (int8/uint8); per-tensor or per-axis parameters",
        inputs=(Input("x"), Input("scale", ranks=(0, 1)), Input("zero_point", dtypes=QDTYPES, ranks=(0, 1))),
        dtypes=FLOATS, infer=infer_quantize, shapes="quantize",
        attrs=(_AXIS_Q, Attr("to", "dtype", default="int8", choices=QDTYPES, sweep=QDTYPES)),
        generate=gen_quantize, values=("random", "special"),
        not_differentiable="integer output (rounding and saturation): piecewise constant",
        error_inputs=lambda: [
            ("zero_point dtype is not `to`", [_f32(2, 3), _f32(), np.zeros((), np.uint8)], {"to": "int8"}),
            ("to outside int8/uint8", [_f32(2, 3), _f32(), np.zeros((), np.int32)], {"to": "int32"}),
            ("per-axis scale of the wrong length", [_f32(2, 3), _f32(2), np.zeros(2, np.int8)], {"axis": -1}),
            ("scale and zero_point shapes differ", [_f32(2, 3), _f32(3), np.zeros((), np.int8)], {"axis": -1}),
            ("integer x", [np.ones((2, 3), np.int32), _f32(), np.zeros((), np.int8)], {})],
        policy=Policy(check=quantize_check, check_reason="exact; a near tie of x/scale may round "
                      "either way (division vs reciprocal), NaN is undefined"))

declare(name="dequantize", family="quantize", doc="ONNX DequantizeLinear: (x - zero_point) * "
        "scale in scale's dtype; per-tensor or per-axis parameters",
        inputs=(Input("x", dtypes=QDTYPES), Input("scale", ranks=(0, 1)), Input("zero_point", dtypes=QDTYPES, ranks=(0, 1))),
        dtypes=FLOATS, infer=infer_dequantize, shapes="dequantize", attrs=(_AXIS_Q,),
        generate=gen_dequantize, values=("random",),
        error_inputs=lambda: [
            ("float x", [_f32(2, 3), _f32(), np.zeros((), np.int8)], {}),
            ("zero_point dtype differs from x", [np.zeros((2, 3), np.int8), _f32(), np.zeros((), np.uint8)], {}),
            ("per-axis scale of the wrong length", [np.zeros((2, 3), np.int8), _f32(2), np.zeros(2, np.int8)],
             {"axis": -1}),
            ("per-axis axis out of range", [np.zeros((2, 3), np.int8), _f32(3), np.zeros(3, np.int8)],
             {"axis": -3})],
        policy=Policy(exact=True, signed_zero=True))


def infer_fake_quantize(spec, shapes, dtypes, attrs):
    (shape,) = shapes
    if not 2 <= attrs["bits"] <= 16:
        raise SpecError(f"{spec.name}: bits={attrs['bits']} outside [2, 16]")
    if not shape:
        raise SpecError(f"{spec.name}: needs rank >= 1 (per-axis scales)")
    infer.norm_axis(spec.name, attrs["axis"], len(shape))
    return [(shape, dtypes[0])]


declare(name="fake_quantize", family="quantize", doc="symmetric per-axis quantize-dequantize: "
        "scale = max|x| over the other axes / (2^(bits-1) - 1), y = clamp(round_half_even(x / "
        "scale), -qmax, qmax) * scale, y = x where scale is 0; IEEE steps in the compute dtype",
        inputs=(Input("x", ranks=(1, None)),), dtypes=FLOATS, infer=infer_fake_quantize, shapes="fake_quantize",
        attrs=(Attr("bits", "int", default=8, sweep=(8, 4)), Attr("axis", "int", default=0,
                                                                   sweep=(0, -1))),
        values=("random", "special"),
        not_differentiable="quantize-dequantize rounds x / scale to an integer (piecewise constant "
                           "in x, with jumps); training uses a straight-through estimator, a "
                           "convention rather than a derivative",
        error_inputs=lambda: [("bits below 2", [_f32(2, 3)], {"bits": 1}),
                              ("bits above 16", [_f32(2, 3)], {"bits": 17}),
                              ("axis out of range", [_f32(2, 3)], {"axis": 2}),
                              ("scalar input", [_f32()], {}),
                              ("integer input", [np.ones((2, 3), np.int32)], {})],
        policy=Policy(bound=fake_quantize_bound, bound_reason="one scale step at a near tie of "
                      "x/scale; elsewhere the default tolerance"))


# -- loss ----------------------------------------------------------------------------------------
def infer_xent(spec, shapes, dtypes, attrs):
    logits, targets = shapes
    if tuple(logits) != tuple(targets):
        raise SpecError(f"{spec.name}: logits {logits} and targets {targets} differ in shape")
    if not logits or logits[-1] < 1:
        raise SpecError(f"{spec.name}: needs a class axis of size >= 1 last, got {logits}")
    return [(tuple(logits[:-1]), dtypes[0])]


def gen_xent(stream, shapes, dtype, attrs, vals):
    """Logits from the value class; targets are probability rows, half one-hot, half soft with
    about a fifth of the classes at zero."""
    (shape,) = [tuple(s) for s in shapes[:1]]
    logits = make_array(stream(0), shape, dtype, "real", vals, attrs)
    c = shape[-1]
    rows = math.prod(shape[:-1])
    st = stream(1)
    w = st.uniform(rows * c, 0, 1).reshape(rows, c)
    w = np.where(st.uniform(rows * c, 0, 1).reshape(rows, c) < 0.2, 0.0, w)
    hot = np.zeros((rows, c))
    hot[np.arange(rows), st.choice(rows, c)] = 1.0
    soft = w / np.where(w.sum(-1, keepdims=True) > 0, w.sum(-1, keepdims=True), 1.0)
    t = np.where(st.coin(rows)[:, None], hot, soft)
    return [logits, t.reshape(shape).astype(dt.np_dtype(dtype))]


declare(name="softmax_cross_entropy", family="loss", doc="per row (last axis = classes): "
        "-sum_c targets_c * log_softmax(logits)_c, with targets probabilities of the same shape; "
        "non-finite inputs follow IEEE arithmetic through sum_c t_c (lse - l_c), lse = m + log sum exp(l - m): "
        "a row with a +inf logit, or with every logit -inf, is NaN (inf - inf); a -inf logit adds "
        "t_c * inf (+inf where t_c > 0, NaN where t_c = 0); a NaN anywhere in the row gives NaN",
        inputs=(Input("logits", ranks=(1, None)), Input("targets", ranks=(1, None))), dtypes=FLOATS,
        infer=infer_xent, shapes="xent", generate=gen_xent,
        values=("random", "special", "spread") + ACCUMULATION_CLASSES,
        # targets are probabilities of logits' shape (no integer labels to be out of range)
        error_inputs=lambda: [("targets shape differs", [_f32(2, 3), _f32(2, 4)], {}),
                              ("empty class axis", [_f32(2, 0), _f32(2, 0)], {}),
                              ("scalar logits", [_f32(), _f32()], {}),
                              ("integer targets", [_f32(2, 3), np.ones((2, 3), np.int32)], {})],
        policy=Policy(bound=xent_bound, bound_reason="log-sum-exp and summation error: see "
                      "xent_bound"), second_order=True)
