"""Convolution and pooling (OPS.md "Normalization, attention, convolution"): conv (1-D and 2-D),
conv_transpose2d, pool (max and avg).

Layouts (NCHW, as RLX): x [N, C, *spatial], conv weight [Cout, Cin/groups, *kernel],
conv_transpose2d weight [Cin, Cout/groups, kH, kW] (the transpose of a conv's), bias [Cout] or an
empty array for none. Spatial attributes are int tuples: () means the default (stride 1,
padding 0, dilation 1), one value applies to every spatial dim, otherwise one per dim; conv and
pool padding may also give 2*nd values (all begins, then all ends) for asymmetric padding. A conv
output position is y[o] = sum over the window of w * x + bias, with window starts o*stride -
pad_begin and taps dilation apart (cross-correlation, as every framework); output sizes are
floor((L + pads - dilation*(k-1) - 1) / stride) + 1 and must be >= 1.

Error bounds: each output is a sum of K = Cin/groups * prod(kernel) products (+ bias), so any
summation order is within gamma_K * sum|w||x| (+ u|bias|) of the exact value (Higham 3.5);
non-finite terms propagate as in mat_mul (ops/_linalg_judge.bilinear_bound). Max pooling is
exact; average pooling is a sum of at most prod(kernel) terms and one division.
"""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import linalg as lj
from rlx_conformance.judge.compare import EXACT, compare
from rlx_conformance.judge.tolerances import tolerance_for
from rlx_conformance.spec.registry import Attr, Input, Policy, declare

FLOATS = dt.FLOATS


# -- attribute normalisation (shared by the registry, both backends and the bounds) ---------------
def spatial(name: str, what: str, v: tuple[int, ...], nd: int, default: int, allow_pairs: bool = False):
    """An int tuple attribute as one value per dim, or (begins, ends) for pads."""
    if not v:
        vals = (default,) * nd
        return (vals, vals) if allow_pairs else vals
    if len(v) == 1:
        vals = tuple(v) * nd
    elif len(v) == nd:
        vals = tuple(v)
    elif allow_pairs and len(v) == 2 * nd:
        return tuple(v[:nd]), tuple(v[nd:])
    else:
        raise SpecError(f"{name}: {what}={v} needs 1 or {nd}" + (f" or {2 * nd}" if allow_pairs else "")
                        + f" values for {nd} spatial dim(s)")
    return (vals, vals) if allow_pairs else vals


def conv_params(name: str, x, w, attrs, transposed: bool = False):
    """(nd, stride, pad_begin, pad_end, dilation, groups, out_spatial) after checking shapes."""
    if len(x) not in (3, 4) or len(w) != len(x):
        raise SpecError(f"{name}: x {x} and weight {w} must both be rank 3 (1-D) or rank 4 (2-D)")
    nd = len(x) - 2
    if transposed and nd != 2:
        raise SpecError(f"{name}: is 2-D only: x must be [N, C, H, W], got {x}")
    ksize = tuple(w[2:])
    if attrs.get("kernel_size") and tuple(attrs["kernel_size"]) != ksize:
        raise SpecError(f"{name}: kernel_size={attrs['kernel_size']} does not match the weight's {ksize}")
    stride = spatial(name, "stride", attrs["stride"], nd, 1)
    dil = spatial(name, "dilation", attrs["dilation"], nd, 1)
    if transposed:  # symmetric per dim, as the output size formula assumes
        pb = pe = spatial(name, "padding", attrs["padding"], nd, 0)
    else:
        pb, pe = spatial(name, "padding", attrs["padding"], nd, 0, allow_pairs=True)
    g = attrs["groups"]
    if min(stride + dil) < 1 or min(pb + pe) < 0 or min(ksize) < 1:
        raise SpecError(f"{name}: stride and dilation must be >= 1, padding >= 0, kernel >= 1")
    cin = x[1]
    if g < 1 or cin % g:
        raise SpecError(f"{name}: groups={g} does not divide the {cin} input channels")
    if transposed:
        if w[0] != cin:
            raise SpecError(f"{name}: weight {w} must be [Cin={cin}, Cout/groups, kH, kW]")
        cout = w[1] * g
        op = spatial(name, "output_padding", attrs["output_padding"], nd, 0)
        for o, s, d in zip(op, stride, dil):
            if o < 0 or (o >= s and o >= d):
                raise SpecError(f"{name}: output_padding={attrs['output_padding']} must be smaller "
                                "than the stride or the dilation")
        out = tuple((L - 1) * s - 2 * p + d * (k - 1) + o + 1
                    for L, s, p, d, k, o in zip(x[2:], stride, pb, dil, ksize, op))
    else:
        if w[1] * g != cin or w[0] % g:
            raise SpecError(f"{name}: weight {w} must be [Cout (divisible by {g}), Cin/groups = "
                            f"{cin // g}, *kernel] for groups={g}")
        cout = w[0]
        out = tuple((L + b + e - d * (k - 1) - 1) // s + 1
                    for L, b, e, d, k, s in zip(x[2:], pb, pe, dil, ksize, stride))
    if min(out) < 1:
        raise SpecError(f"{name}: output spatial size {out} < 1 (window larger than padded input)")
    return nd, stride, pb, pe, dil, g, cout, out


def _bias_ok(name, bias, cout):
    if tuple(bias) not in ((0,), (cout,)):
        raise SpecError(f"{name}: bias must be [{cout}] or empty (none), got {bias}")


def _conv_infer(spec, shapes, dtypes, attrs):
    x, w, b = shapes
    nd, *_, cout, out = conv_params(spec.name, x, w, attrs)
    _bias_ok(spec.name, b, cout)
    return [((x[0], cout) + out, dtypes[0])]


def _conv_t_infer(spec, shapes, dtypes, attrs):
    x, w, b = shapes
    nd, *_, cout, out = conv_params(spec.name, x, w, attrs, transposed=True)
    _bias_ok(spec.name, b, cout)
    return [((x[0], cout) + out, dtypes[0])]


def pool_params(name: str, x, attrs):
    """(nd, kernel, stride, pad_begin, pad_end, out_spatial)."""
    k = tuple(attrs["kernel_size"])
    nd = len(k)
    if nd not in (1, 2) or len(x) != nd + 2:
        raise SpecError(f"{name}: kernel_size {k} needs x [N, C] + {nd} spatial dims, got {x}")
    if min(k) < 1:
        raise SpecError(f"{name}: kernel_size must be >= 1")
    stride = spatial(name, "stride", attrs["stride"], nd, 0)
    stride = tuple(s or kk for s, kk in zip(stride, k))  # default stride: the window size
    pb, pe = spatial(name, "padding", attrs["padding"], nd, 0, allow_pairs=True)
    for b, e, kk in zip(pb, pe, k):
        if b < 0 or e < 0 or 2 * max(b, e) > kk:
            raise SpecError(f"{name}: padding {attrs['padding']} must be >= 0 and at most half the window {k}")
    if min(stride) < 1:
        raise SpecError(f"{name}: stride must be >= 1")
    out = tuple((L + b + e - kk) // s + 1 for L, b, e, kk, s in zip(x[2:], pb, pe, k, stride))
    if min(out) < 1:
        raise SpecError(f"{name}: window {k} larger than the padded input {x[2:]}")
    return nd, k, stride, pb, pe, out


def _pool_infer(spec, shapes, dtypes, attrs):
    (x,) = shapes
    *_, out = pool_params(spec.name, x, attrs)
    return [(tuple(x[:2]) + out, dtypes[0])]


# -- the one float64 formulation the reference and the bounds share -------------------------------
def im2col(x: np.ndarray, ksize, stride, pb, pe, dil, fill: float = 0.0) -> np.ndarray:
    """x [N, C, *sp] -> windows [N, C, *out, *kernel] (padding filled with ``fill``)."""
    nd = len(ksize)
    pads = [(0, 0), (0, 0)] + [(b, e) for b, e in zip(pb, pe)]
    xp = np.pad(x, pads, constant_values=fill)
    out = [(xp.shape[2 + i] - dil[i] * (ksize[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    cols = np.empty(x.shape[:2] + tuple(out) + tuple(ksize), x.dtype)
    for taps in np.ndindex(*ksize):
        sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s) for t, d, s, o in zip(taps, dil, stride, out))
        cols[(Ellipsis,) + taps] = xp[(slice(None), slice(None)) + sl]
    return cols


def conv_as_matmul(x: np.ndarray, w: np.ndarray, attrs) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(cols [N, g, P, K], weights [g, K, Cout/g], out shape): conv as a batched matmul."""
    nd, stride, pb, pe, dil, g, cout, out = conv_params("conv", x.shape, w.shape, attrs)
    cols = im2col(x, w.shape[2:], stride, pb, pe, dil)  # [N, C, *out, *k]
    n, c = x.shape[:2]
    cg = c // g
    p = math.prod(out)
    kk = math.prod(w.shape[2:])
    cols = cols.reshape((n, g, cg, p, kk)).transpose(0, 1, 3, 2, 4).reshape(n, g, p, cg * kk)
    wm = w.reshape(g, cout // g, cg * kk).transpose(0, 2, 1)  # [g, K, Cout/g]
    return cols, wm, (n, cout) + out


def conv_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, attrs) -> np.ndarray:
    cols, wm, shape = conv_as_matmul(x, w, attrs)
    y = np.matmul(cols, wm)  # [N, g, P, Cout/g]
    y = y.transpose(0, 1, 3, 2).reshape(shape)
    if bias.size:
        y = y + bias.reshape((1, -1) + (1,) * (len(shape) - 2))
    return y


def conv_transpose_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, attrs) -> np.ndarray:
    """Scatter form: every input position o adds x[o] * w[tap] into output o*stride - pad + tap*dilation."""
    nd, stride, pb, pe, dil, g, cout, out = conv_params("conv_transpose2d", x.shape, w.shape, attrs,
                                                        transposed=True)
    n, cin, h, wd = x.shape
    cg, og = cin // g, cout // g
    kh, kw = w.shape[2:]
    full_h = (h - 1) * stride[0] + dil[0] * (kh - 1) + 1 + out[0]
    full_w = (wd - 1) * stride[1] + dil[1] * (kw - 1) + 1 + out[1]
    acc = np.zeros((n, cout, full_h + pb[0], full_w + pb[1]), np.result_type(x, w))
    xg = x.reshape(n, g, cg, h, wd)
    wg = w.reshape(g, cg, og, kh, kw)
    for i in range(kh):
        for j in range(kw):
            contrib = np.einsum("ngchw,gco->ngohw", xg, wg[:, :, :, i, j]).reshape(n, cout, h, wd)
            r0, c0 = i * dil[0], j * dil[1]
            acc[:, :, r0:r0 + stride[0] * (h - 1) + 1:stride[0], c0:c0 + stride[1] * (wd - 1) + 1:stride[1]] += contrib
    y = acc[:, :, pb[0]:pb[0] + out[0], pb[1]:pb[1] + out[1]]
    if bias.size:
        y = y + bias.reshape(1, -1, 1, 1)
    return y


# -- bounds -------------------------------------------------------------------------------------
def _u_ref(dtype: str) -> float:
    return lj.ULD if dt.compute_dtype(dtype) == "float64" else lj.U64


def _with_bias(bound: np.ndarray, bias: np.ndarray, out_dtype: str, nd: int) -> np.ndarray:
    """Adding the bias: one more term (gamma_(K+1) instead of gamma_K is covered by u|b| + u|y|),
    and a non-finite bias makes its channel exact (bound 0) where the sum was finite."""
    if not bias.size:
        return bound
    b = bias.astype(np.float64).reshape((1, -1) + (1,) * nd)
    with np.errstate(invalid="ignore"):
        extra = 2 * lj.uc(out_dtype) * np.abs(b)
    return np.where(np.isfinite(b), bound + extra, np.where(np.isnan(bound), np.nan, 0.0))


def conv_bound(inputs, attrs, out_dtype):
    """The dot-product bound per output. Where a padding tap meets a non-finite weight the spec
    is ambiguous (zero-filled padding gives 0 * inf = NaN, skipping the tap gives a number), so
    those outputs are unasserted."""
    x, w, bias = inputs
    nd = x.ndim - 2
    cols, wm, shape = conv_as_matmul(x, w, attrs)
    b = lj.bilinear_bound(np.matmul, cols, wm, wm.shape[1] + 1, out_dtype, _u_ref(out_dtype))
    pad_cols, _, _ = conv_as_matmul(np.ones((1,) + x.shape[1:]), w, attrs)
    with np.errstate(invalid="ignore"):
        ambiguous = np.matmul(1 - pad_cols, (~np.isfinite(wm.astype(np.float64))).astype(np.float64)) > 0
    b = np.where(ambiguous, np.nan, b)
    b = b.transpose(0, 1, 3, 2).reshape(shape)
    return _with_bias(b, bias, out_dtype, nd)


def conv_transpose_bound(inputs, attrs, out_dtype):
    x, w, bias = inputs
    k = (x.shape[1] // attrs["groups"]) * math.prod(w.shape[2:]) + 1
    no_bias = np.zeros(0)
    b = lj.bilinear_bound(lambda a, c: conv_transpose_reference(a, c, no_bias, attrs), x, w, k,
                          out_dtype, _u_ref(out_dtype))
    return _with_bias(b, bias, out_dtype, 2)


def pool_reference(x: np.ndarray, attrs) -> np.ndarray:
    """Max: NaN-propagating max over the window (padding never wins); avg: sum over the window's
    non-padding elements divided by their count (ONNX count_include_pad = 0)."""
    nd, k, stride, pb, pe, out = pool_params("pool", x.shape, attrs)
    axes = tuple(range(-nd, 0))
    one = (1,) * nd
    if attrs["kind"] == "max":
        cols = im2col(x, k, stride, pb, pe, one, fill=-np.inf)
        return np.max(cols, axis=axes)
    cols = im2col(x, k, stride, pb, pe, one)
    count = im2col(np.ones((1, 1) + x.shape[2:]), k, stride, pb, pe, one).sum(axis=axes)
    return np.sum(cols, axis=axes) / count


def pool_check(inputs, attrs, expected, actual):
    """Max pooling picks an element: exact (NaN positions included). Average pooling: a sum of at
    most prod(kernel) terms, then one division: gamma_(n+1) * mean|x| per output, unasserted
    where the window's sum can overflow, exact NaN propagation."""
    (x,) = inputs
    (e,), (a,) = expected, actual
    out_dt = dt.name_of(e.dtype)
    if attrs["kind"] == "max":
        return [compare(e, a, exact=True, signed_zero=False, tol=EXACT, name="output 0")]
    nd, k, stride, pb, pe, out = pool_params("pool", x.shape, attrs)
    n = math.prod(k)
    fin = np.isfinite(x.astype(np.float64))
    xa = np.where(fin, np.abs(x.astype(np.float64)), 0.0)
    axes = tuple(range(-nd, 0))
    one = (1,) * nd
    s = im2col(xa, k, stride, pb, pe, one).sum(axis=axes)
    count = im2col(np.ones((1, 1) + x.shape[2:]), k, stride, pb, pe, one).sum(axis=axes)
    nonfin = im2col((~fin).astype(np.float64), k, stride, pb, pe, one).sum(axis=axes)
    u = lj.uc(out_dt) + _u_ref(out_dt)
    bound = lj.gam(n + 1, u) * s / count
    bound = np.where(nonfin > 0, 0.0, bound)
    bound = np.where(s > dt.finfo(dt.compute_dtype(out_dt)).max, np.nan, bound)
    return [compare(e, a, exact=False, signed_zero=False, tol=tolerance_for("pool", out_dt),
                    bound=bound, name="output 0")]


# -- declarations -------------------------------------------------------------------------------
def _f32(*shape):
    return np.ones(shape, np.float32)


def _conv_errors():
    return [("groups do not divide Cin", [_f32(1, 3, 5), _f32(2, 1, 3), _f32(0)], {"groups": 2}),
            ("window larger than input", [_f32(1, 1, 2), _f32(1, 1, 3), _f32(0)], {}),
            ("bias size", [_f32(1, 1, 5), _f32(2, 1, 3), _f32(3)], {})]


LARGE_WINDOW = 64  # taps; windows this large are for accumulation order, not attribute coverage


def _small_window(shapes) -> bool:
    return math.prod(shapes[1][2:]) < LARGE_WINDOW


def _sweep(small: tuple, large: tuple):
    """A shape-dependent sweep: the full one for small windows, a short one for large windows
    (whose cases are about long accumulations and cost the most)."""
    return lambda shapes: small if _small_window(shapes) else large


_STRIDE = Attr("stride", "ints", default=(), doc="() = 1",
               sweep=lambda sh: ((), (2,)) + (((1, 3),) if len(sh[0]) == 4 and _small_window(sh) else ()))
_DIL = Attr("dilation", "ints", default=(), sweep=_sweep(((), (2,)), ((),)), doc="() = 1")
_GROUPS = Attr("groups", "int", default=1, sweep=(1, 2, 4))
_KSIZE = Attr("kernel_size", "ints", default=(), doc="() = the weight's; must match it if given")

declare(name="conv", family="conv",
        doc="1-D/2-D cross-correlation, NCHW: x [N, Cin, *sp], w [Cout, Cin/groups, *k], bias "
            "[Cout] or empty; stride, padding (per dim, or begins+ends), dilation, groups",
        inputs=(Input("x", domain="conv_x"), Input("w", domain="conv_w"), Input("bias", domain="conv_w")),
        dtypes=FLOATS,
        attrs=(_KSIZE, _STRIDE,
               Attr("padding", "ints", default=(), sweep=_sweep(((), (2, 0), (0, 2, 1, 0)), ((), (0, 2, 1, 0))),
                    doc="() = 0; nd values: symmetric; 2*nd: begins then ends"),
               _DIL, _GROUPS),
        infer=_conv_infer, shapes="conv", values=("random", "special"),
        policy=Policy(bound=conv_bound, bound_reason="any summation order: gamma_K * sum|w||x| "
                      "per output, K = Cin/groups * prod(kernel) (+1 with bias)"),
        error_inputs=_conv_errors)


declare(name="conv_transpose2d", family="conv",
        doc="2-D transposed convolution (the gradient of conv w.r.t. its input), NCHW: x [N, Cin, "
            "H, W], w [Cin, Cout/groups, kH, kW]; out = (in-1)*stride - 2*padding + "
            "dilation*(k-1) + output_padding + 1",
        inputs=(Input("x", domain="conv_x"), Input("w", domain="conv_w"), Input("bias", domain="conv_w")),
        dtypes=FLOATS,
        attrs=(Attr("stride", "ints", default=(), sweep=((), (2,)), doc="() = 1"),
               Attr("padding", "ints", default=(), sweep=_sweep(((), (1,)), ((1,),)), doc="() = 0, symmetric"),
               Attr("output_padding", "ints", default=(), sweep=((), (1,)),
                    doc="() = 0; < stride or < dilation"),
               Attr("dilation", "ints", default=(), doc="() = 1"), Attr("groups", "int", default=1, sweep=(1, 2))),
        infer=_conv_t_infer, shapes="conv_transpose", values=("random",),
        policy=Policy(bound=conv_transpose_bound, bound_reason="any summation order: gamma_K * "
                      "sum|w||x| per output"),
        error_inputs=lambda: [("output_padding too large",
                               [_f32(1, 1, 3, 3), _f32(1, 1, 2, 2), _f32(0)], {"output_padding": (1,)})])

declare(name="pool", family="conv",
        doc="max or average pooling, NCHW, 1-D or 2-D (len(kernel_size)); stride () = the window; "
            "padding never wins a max and is excluded from an average (ONNX count_include_pad=0); "
            "max propagates NaN",
        inputs=(Input("x", domain="conv_x"),), dtypes=FLOATS,
        attrs=(Attr("kind", "enum", default="max", choices=("max", "avg"), sweep=("max", "avg")),
               Attr("kernel_size", "ints", sweep=((3,), (16, 12))),
               Attr("stride", "ints", default=(), sweep=((), (1,)), doc="() = kernel_size"),
               Attr("padding", "ints", default=(), sweep=((), (1,)), doc="() = 0; at most half the window")),
        infer=_pool_infer, shapes="pool", values=("random", "special"),
        policy=Policy(check=pool_check, check_reason="max exact; avg gamma_(n+1) mean|x|"),
        error_inputs=lambda: [("padding over half the window", [np.ones((1, 1, 5), np.float32)],
                               {"kernel_size": (2,), "padding": (2,)})])
