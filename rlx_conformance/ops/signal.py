"""Signal, random, quantization and loss (OPS.md "Signal, random, quantization, loss"): fft,
rng_uniform, rng_normal, quantize, dequantize, fake_quantize, softmax_cross_entropy.

Judging: fft by a normwise error bound of the FFT (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., sec. 24.1), the random ops by distribution tests (their streams differ
between libraries by design; judges in rlx_conformance/judge/bounds/stats.py), quantization bit-exactly
except where the quotient x/scale lies within rounding error of a half-integer, the loss by a
log-sum-exp and summation bound.
"""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import stats as _stats
from rlx_conformance.ops.reduce import gamma
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import Attr, Input, Policy, declare
from rlx_conformance.spec.values import make_array, specials

FLOATS = dt.FLOATS


def _u(dtype: str) -> float:
    return dt.finfo(dt.compute_dtype(dtype)).unit_roundoff


# Error inputs (validate's error-input parity; OPS.md "Error inputs"): (description, inputs,
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


def fft_stages(n: int) -> int:
    """Depth of the FFT's error analysis. Lengths whose prime factors are <= 7 run as mixed-radix
    Cooley-Tukey: at most ceil(log2 n) stages. Other lengths go through Bluestein's algorithm: a
    forward and an inverse FFT of a length m >= 2n - 1 plus two chirp products, 3 ceil(log2 m) + 4
    stages of the same kind (a conservative count)."""
    k = n
    for p in (2, 3, 5, 7):
        while k % p == 0:
            k //= p
    if k == 1:
        return max(1, math.ceil(math.log2(n))) if n > 1 else 1
    return 3 * math.ceil(math.log2(2 * n - 1)) + 4


def fft_bound(inputs, attrs, out_dtype):
    """Higham Thm 24.2: a computed FFT satisfies ||y^ - y||_2 <= L eta / (1 - L eta) ||y||_2 with L
    stages and eta = mu + gamma_4 (sqrt2 + mu) ~ 7u (mu: twiddle error ~ u). ||y||_2 =
    s sqrt(n) ||x||_2 (Parseval, s the norm scale), and each element's error is at most the error
    vector's 2-norm; the scaling adds one rounding. Two implementations differ by twice that.
    Rows with a non-finite input, or whose result may overflow, are unasserted (NaN)."""
    (x,) = inputs
    n = x.shape[-2]
    u = _u(out_dtype)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(np.sum(x64 * x64, axis=(-2, -1), keepdims=True))
    s = {"backward": (1.0, 1.0 / n), "ortho": (n**-0.5, n**-0.5), "forward": (1.0 / n, 1.0)}
    scale = s[attrs["norm"]][1 if attrs["inverse"] else 0]
    le = fft_stages(n) * 7 * u
    rel = le / (1 - le) + u if le < 1 else np.inf
    ynorm = scale * math.sqrt(n) * norm
    big = dt.finfo(dt.compute_dtype(out_dtype)).max
    bad = ~np.isfinite(norm) | (math.sqrt(n) * norm > big)
    return np.broadcast_to(np.where(bad, np.nan, 2 * rel * ynorm), x.shape)


declare(name="fft", family="signal", doc="1-D DFT along the axis before the trailing (real, imag) "
        "axis; inverse uses e^{+i...}; norm scales the forward/inverse by backward (1, 1/n), "
        "ortho (1/sqrt n both) or forward (1/n, 1)",
        inputs=(Input("x"),), dtypes=FLOATS, infer=infer_fft, shapes="fft",
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
_RNG = dict(family="random", dtypes=FLOATS, infer=infer_rng, shapes="rng", values=("random",))
_KEY = Input("key", dtypes=("uint32",), role="key", domain="rng_key")


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


declare(name="rng_uniform", doc="uniform on [low, high) (low < high), elementwise parameters "
        "broadcast to shape; the stream is the backend's, fixed by the key",
        inputs=(Input("low", domain="rng_low"), Input("high", domain="rng_high"), _KEY),
        attrs=(_SHAPE,), policy=Policy(check=_stats.uniform_check,
                                        check_reason=_stats.REASON),
        check_values=check_uniform, error_inputs=_uniform_errors, **_RNG)

declare(name="rng_normal", doc="mean + scale * N(0, 1), elementwise parameters broadcast to "
        "shape; the stream is the backend's, fixed by the key",
        inputs=(Input("mean"), Input("scale", domain="rng_scale"), _KEY),
        attrs=(_SHAPE,), policy=Policy(check=_stats.normal_check,
                                        check_reason=_stats.REASON),
        error_inputs=_rng_errors, **_RNG)


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


def param_view(p, ndim: int, axis: int):
    """A per-tensor or per-axis parameter shaped to broadcast against an array of rank ndim (a
    numpy or an mlx array: both backends' quantize kernels use it)."""
    if p.ndim == 0:
        return p
    shape = [1] * ndim
    shape[axis % ndim] = p.shape[0]
    return p.reshape(shape)


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


def quotient_ties(x: np.ndarray, scale: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(exact, near): where x/scale is exactly a half-integer (the rounding rule decides, strictly
    judged), and where it is within 4 units of rounding of one without being one (x/scale computed
    as a division or as x * (1/scale) may round to either neighbour)."""
    x64 = x.astype(np.float64)
    s64 = np.asarray(scale, np.float64)
    with np.errstate(all="ignore"):
        r = x64 / s64
        k = np.floor(r)
        exact = np.isfinite(r) & ((k + 0.5) * s64 == x64)  # float products are exact in float64
        near = np.isfinite(r) & (np.abs(r - (k + 0.5)) <= 4 * _u(dtype) * np.abs(r)) & ~exact
    return exact, near


def quantize_check(inputs, attrs, expected, actual):
    """Bit-exact, except: NaN inputs are undefined (a NaN has no integer), and at a near tie of
    x/scale the result may be either neighbour (one quantum apart)."""
    from rlx_conformance.judge.compare import Comparison

    x, scale, _ = inputs
    (e,), (a,) = expected, actual
    if e.shape != a.shape or e.dtype != a.dtype:
        return [Comparison(False, message=f"output: {a.dtype}{a.shape} != expected {e.dtype}{e.shape}")]
    s = param_view(scale, x.ndim, attrs["axis"])
    _, near = quotient_ties(x, s, dt.name_of(x.dtype))
    diff = np.abs(e.astype(np.int64) - a.astype(np.int64))
    skip = np.isnan(x.astype(np.float64))
    bad = ~skip & ((diff > 1) | ((diff == 1) & ~near))
    res = Comparison(not bad.any(), max_abs_err=float(diff[~skip].max(initial=0)),
                     mismatches=int(bad.sum()), checked=int((~skip).sum()))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        res.message = (f"output: {res.mismatches}/{e.size} elements differ; first at flat {i}: "
                       f"x={x.flat[i]!r}, expected {e.flat[i]}, got {a.flat[i]}")
    return [res]


_AXIS_Q = Attr("axis", "int", default=-1, sweep=(0, -1), doc="axis of per-axis parameters")

declare(name="quantize", family="quantize", doc="ONNX QuantizeLinear: saturate(round_half_even("
        "x / scale) + zero_point) to `to` (int8/uint8); per-tensor or per-axis parameters",
        inputs=(Input("x"), Input("scale"), Input("zero_point", dtypes=QDTYPES)),
        dtypes=FLOATS, infer=infer_quantize, shapes="quantize",
        attrs=(_AXIS_Q, Attr("to", "dtype", default="int8", choices=QDTYPES, sweep=QDTYPES)),
        generate=gen_quantize, values=("random", "special"),
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
        inputs=(Input("x", dtypes=QDTYPES), Input("scale"), Input("zero_point", dtypes=QDTYPES)),
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


def fake_quantize_scale(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Per-slice scale amax / qmax (in x's dtype), amax = max |x| over every axis but ``axis``."""
    others = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    amax = np.max(np.abs(x), axis=others, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    return (amax / x.dtype.type(2 ** (bits - 1) - 1)).astype(x.dtype)


def fake_quantize_bound(inputs, attrs, out_dtype):
    """Where x/scale is within rounding error of a half-integer, the result may be either of two
    grid points one scale apart; elsewhere the tolerance covers scale's and the product's
    roundings."""
    (x,) = inputs
    c = dt.compute_dtype(out_dtype)
    xc = x.astype(dt.np_dtype(c))
    with np.errstate(all="ignore"):
        s = fake_quantize_scale(xc, attrs["bits"], attrs["axis"]).astype(np.float64)
        exact, near = quotient_ties(xc, s, out_dtype)
        return np.where(near, np.broadcast_to(s, x.shape), 0.0)


declare(name="fake_quantize", family="quantize", doc="symmetric per-axis quantize-dequantize: "
        "scale = max|x| over the other axes / (2^(bits-1) - 1), y = clamp(round_half_even(x / "
        "scale), -qmax, qmax) * scale, y = x where scale is 0; IEEE steps in the compute dtype",
        inputs=(Input("x"),), dtypes=FLOATS, infer=infer_fake_quantize, shapes="fake_quantize",
        attrs=(Attr("bits", "int", default=8, sweep=(8, 4)), Attr("axis", "int", default=0,
                                                                   sweep=(0, -1))),
        values=("random", "special"),
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


def xent_bound(inputs, attrs, out_dtype):
    """loss = sum_c t_c (lse - l_c), lse = m + log sum exp(l - m). The exps (a few u each), their
    sum (gamma_C) and the log put (C + 3)u + 2u|lse| + u|m| on lse; the products and the final sum
    add gamma_(C+2) times sum |t| |lse - l|, and the algebraically equal form lse sum t - sum t l
    gamma_(C+2) (|lse| sum|t| + sum |t l|). Twice the sum bounds two implementations. Rows with a
    non-finite input, or logits near the overflow threshold, are unasserted (NaN)."""
    logits, t = (a.astype(np.float64) for a in inputs)
    c = logits.shape[-1]
    u = _u(out_dtype)
    big = dt.finfo(dt.compute_dtype(out_dtype)).max
    with np.errstate(all="ignore"):
        m = np.max(logits, axis=-1, keepdims=True)
        lse = m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True))
        at = np.abs(t)
        st = at.sum(-1)
        g = gamma(c + 2, u)
        b = (st * ((c + 3) * u + 2 * u * np.abs(lse[..., 0]) + u * np.abs(m[..., 0]))
             + g * (np.sum(at * np.abs(lse - logits), -1) + np.abs(lse[..., 0]) * st
                    + np.sum(at * np.abs(logits), -1)))
        bad = ~np.all(np.isfinite(logits) & np.isfinite(t), axis=-1) | \
            (np.max(np.abs(logits), axis=-1, initial=0.0) > big / 4)
    return np.where(bad, np.nan, 2 * b)


declare(name="softmax_cross_entropy", family="loss", doc="per row (last axis = classes): "
        "-sum_c targets_c * log_softmax(logits)_c, with targets probabilities of the same shape",
        inputs=(Input("logits"), Input("targets")), dtypes=FLOATS,
        infer=infer_xent, shapes="xent", generate=gen_xent,
        values=("random", "special", "spread"),
        # targets are probabilities of logits' shape (no integer labels to be out of range)
        error_inputs=lambda: [("targets shape differs", [_f32(2, 3), _f32(2, 4)], {}),
                              ("empty class axis", [_f32(2, 0), _f32(2, 0)], {}),
                              ("scalar logits", [_f32(), _f32()], {}),
                              ("integer targets", [_f32(2, 3), np.ones((2, 3), np.int32)], {})],
        policy=Policy(bound=xent_bound, bound_reason="log-sum-exp and summation error: see "
                      "xent_bound"))
