"""Error bounds of convolution and pooling (ops/conv.py), with the geometry and the float64
formulation they share with the declarations and the CPU reference.

Each conv output is a sum of K = Cin/groups * prod(kernel) products (+ bias), so any summation
order is within gamma_K * sum|w||x| (+ u|bias|) of the exact value (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., sec. 3.5); non-finite terms propagate as in mat_mul
(judge/bounds/linalg.bilinear_bound). Max pooling is exact; average pooling is a sum of at most
prod(kernel) terms and one division.

The attribute normalisation (:func:`spatial`, :func:`conv_params`, :func:`pool_params`) and the
im2col formulation live here, below the declarations and the CPU reference, because the bounds
evaluate the same windows the reference does. The MLX kernels do not use them: they read the
attributes with their own code (backends/mlx/conv.py), and the reference itself is checked
against onnx.reference over the whole matrix (tests/test_independent_oracles.py), so a mistake
here cannot agree with itself.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import linalg as lj
from rlx_conformance.judge.bounds.gamma import gamma
from rlx_conformance.judge.bounds.summation import sum_judgement, sum_terms
from rlx_conformance.judge.compare import (
    BIT_EXACT_TOLERANCE,
    Bound,
    Comparison,
    compare,
    free_where,
)
from rlx_conformance.judge.tolerances import tolerance_for


# -- attribute normalisation (shared by the registry, the CPU reference and the bounds) ----------
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
def conv_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """The dot-product bound per output, the bias one more term (judge/bounds/linalg.py
    bilinear_bound: NaN and infinities exact where every order agrees). Where a padding tap meets
    a non-finite weight the spec is ambiguous (zero-filled padding gives 0 * inf = NaN, skipping
    the tap gives a number), so those outputs are order-dependent with any outcome."""
    x, w, bias = inputs
    cols, wm, shape = conv_as_matmul(x, w, attrs)
    extra = bias.astype(np.float64).reshape(1, attrs["groups"], 1, -1) if bias.size else None
    b = lj.bilinear_bound(np.matmul, cols, wm, wm.shape[1] + 1, out_dtype,
                          lj.reference_roundoff(out_dtype), extra=extra)
    pad_cols, _, _ = conv_as_matmul(np.ones((1,) + x.shape[1:]), w, attrs)
    with np.errstate(invalid="ignore"):
        ambiguous = np.matmul(1 - pad_cols, (~np.isfinite(wm.astype(np.float64))).astype(np.float64)) > 0
    b = free_where(b, ambiguous)
    return b.map(lambda v: v.transpose(0, 1, 3, 2).reshape(shape))


def conv_transpose_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                         out_dtype: str) -> Bound:
    x, w, bias = inputs
    k = (x.shape[1] // attrs["groups"]) * math.prod(w.shape[2:]) + 1
    no_bias = np.zeros(0)
    extra = bias.astype(np.float64).reshape(1, -1, 1, 1) if bias.size else None
    return lj.bilinear_bound(lambda a, c: conv_transpose_reference(a, c, no_bias, attrs), x, w, k,
                             out_dtype, lj.reference_roundoff(out_dtype), extra=extra)


def pool_check(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], expected: Sequence[np.ndarray],
               actual: Sequence[np.ndarray]) -> list[Comparison]:
    """Max pooling picks an element: exact (NaN positions included). Average pooling: a sum of at
    most prod(kernel) terms, then one division: gamma_(n+1) * mean|x| per output; NaN and
    infinities, and window sums that may overflow in some order, follow
    judge/bounds/summation.sum_judgement."""
    (x,) = inputs
    (e,), (a,) = expected, actual
    out_dt = dt.name_of(e.dtype)
    if attrs["kind"] == "max":
        return [compare(e, a, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE, name="output 0")]
    nd, k, stride, pb, pe, out = pool_params("pool", x.shape, attrs)
    n = math.prod(k)
    axes = tuple(range(-nd, 0))
    one = (1,) * nd
    t = sum_terms(x, lambda v: im2col(v, k, stride, pb, pe, one).sum(axis=axes))
    count = im2col(np.ones((1, 1) + x.shape[2:]), k, stride, pb, pe, one).sum(axis=axes)
    u = lj.uc(out_dt) + lj.reference_roundoff(out_dt)
    bound = sum_judgement(t, gamma(n + 1, u) * t.abs_sum / count, out_dt, n)
    return [compare(e, a, exact=False, signed_zero=False, tol=tolerance_for("pool", out_dt),
                    bound=bound, name="output 0")]
