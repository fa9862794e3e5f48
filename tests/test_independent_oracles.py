"""The CPU reference against independent oracles, over the generated case matrix.

The CPU reference, its error bounds and (until issue 14) the MLX kernels read the conv attributes
through one shared geometry (judge/bounds/conv.py), so a mistake there would agree with itself.
Here every conv, conv_transpose2d and pool case of the matrix is evaluated again by onnx.reference
(the ONNX project's Python evaluator: Conv, ConvTranspose, MaxPool, AveragePool) in float64, with
our attributes translated to ONNX's by code written in this file from docs/ops.md (nothing of the
harness's geometry is imported). Norms, attention, rope, quantize, dequantize and fake_quantize are checked the same way
against onnx.reference's LayerNormalization, RMSNormalization, GroupNormalization,
BatchNormalization, Attention, RotaryEmbedding and QuantizeLinear/DequantizeLinear.

What "agree" means: the reference evaluates in float64 (long double for float64 operands) and
rounds once to the output dtype (float16/bfloat16: to float32, then to the dtype); the oracle
evaluates in float64. Both are within the float64 dot-product bound gamma_K(u64) * sum|w||x| of the
exact value (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 3.5), so

    |reference - oracle| <= u_out * |oracle| + 3 * gamma_(K+1)(u64) * (sum|w||x| + |bias|) + eta

with u_out the unit roundoff of the output dtype (plus float32's for the two roundings of the
16-bit dtypes), the factor 3 covering both evaluations and the rounding of the oracle's own
sum|w||x|, and eta half the smallest subnormal of the output dtype (rounding in the subnormal range
is absolute). Non-finite results are asserted exactly: NaN where the oracle says NaN and nowhere
else, infinities with their sign, and an overflow to infinity only where the oracle's value is
within the bound of the dtype's largest finite value.

onnx.reference (onnx 1.23) quirks worked around, each where it is handled: MaxPool and
AveragePool pad with NaN and drop NaNs from each window, so real NaNs are dropped too (NaN and
infinity propagation come from pools of 0/1 indicators); MaxPool with unit strides misreads
``pads`` (the padding is applied here); dilated Conv inserts zero taps, so a non-finite input
under a hole would turn into NaN (the value oracle runs on the finite inputs, the non-finite
pattern comes from indicator convolutions, :func:`conv_nonfinite`); grouped ConvTranspose fails
(groups taken apart here); float attributes are float32 (:func:`as_onnx_float`) and Attention
takes the square root of its scale in float32 (the scale is applied here); GroupNormalization's
function body computes a one-pass variance (layer normalization per group instead).

Semantics that differ from ONNX's and are translated here (docs/ops.md has ours): causal
attention aligns queries bottom-right (ONNX: top-left without a cache), sliding windows have no
ONNX attribute in opset 23, a query that sees no key is undefined (ONNX: 0), rms_norm has a
beta, batch_norm_inference has its channels last, fake_quantize is QuantizeLinear then
DequantizeLinear with a scale computed here.

Found with it: the float64 batch_norm_inference reference overflowed in (x - mean) / sqrt(var +
eps) on its way to a finite result (fixed: long double, as conv); see
test_batch_norm_against_onnx.
"""
from __future__ import annotations

import ast
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import rlx_conformance.backends
from rlx_conformance.generate import matrix

from oracle_common import CPU, ETA, TARGET, U64, UNIT, gamma

MAX = {"float64": float(np.finfo(np.float64).max), "float32": float(np.finfo(np.float32).max),
       "float16": float(np.finfo(np.float16).max), "bfloat16": float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)}


# -- onnx.reference, one node at a time -----------------------------------------------------------
def onnx_run(op_type: str, inputs: Sequence[np.ndarray | None], opset: int, n_out: int = 1,
             domain: str = "", **attrs: Any) -> list[np.ndarray]:
    """Evaluate one ONNX node on float64 inputs (None: an omitted optional input)."""
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(inputs)]
    given = [(n, a) for n, a in zip(names, inputs) if a is not None]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
           for n, a in given]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op_type, names, outs, domain=domain, **attrs)
    graph = helper.make_graph([node], op_type, ins,
                              [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    return [np.asarray(y) for y in ReferenceEvaluator(model).run(None, dict(given))]


# -- our attributes (docs/ops.md, "conv"), read again here, into ONNX's ----------------------------
def per_dim(v: Sequence[int], nd: int, default: int) -> list[int]:
    """() = the default in every dim; one value = that value in every dim; else one per dim."""
    if not v:
        return [default] * nd
    return [int(v[0])] * nd if len(v) == 1 else [int(a) for a in v]


def onnx_pads(v: Sequence[int], nd: int) -> list[int]:
    """ONNX pads (all begins, then all ends). Ours: nd values (or one, or none) are symmetric;
    2*nd values are the begins then the ends (for 1-D, two values are begin and end)."""
    if len(v) == 2 * nd:
        return [int(a) for a in v]
    return per_dim(v, nd, 0) * 2


def conv_attrs(attrs: Mapping[str, Any], w_shape: Sequence[int]) -> dict[str, Any]:
    nd = len(w_shape) - 2
    return dict(kernel_shape=list(w_shape[2:]), strides=per_dim(attrs["stride"], nd, 1),
                pads=onnx_pads(attrs["padding"], nd), dilations=per_dim(attrs["dilation"], nd, 1),
                group=int(attrs["groups"]))


def conv_transpose_attrs(attrs: Mapping[str, Any], w_shape: Sequence[int]) -> dict[str, Any]:
    """conv_transpose2d's padding is symmetric per dim (docs/ops.md)."""
    return dict(kernel_shape=list(w_shape[2:]), strides=per_dim(attrs["stride"], 2, 1),
                pads=per_dim(attrs["padding"], 2, 0) * 2, dilations=per_dim(attrs["dilation"], 2, 1),
                output_padding=per_dim(attrs["output_padding"], 2, 0), group=int(attrs["groups"]))


def pool_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """stride () = the window (docs/ops.md)."""
    k = [int(a) for a in attrs["kernel_size"]]
    nd = len(k)
    strides = [s or kk for s, kk in zip(per_dim(attrs["stride"], nd, 0), k)]
    return dict(kernel_shape=k, strides=strides, pads=onnx_pads(attrs["padding"], nd))


# -- comparing -----------------------------------------------------------------------------------
def assert_agrees(ref: np.ndarray, want: np.ndarray, bound: np.ndarray, dtype: str, what: str,
                  unasserted: np.ndarray | None = None) -> None:
    """``ref`` (the CPU reference, in its dtype) against ``want`` (the oracle, float64) within
    ``bound``: NaN exactly where ``want`` is NaN, infinities exactly, an overflow only where
    ``want`` is within the bound of the largest finite value, finite values within the bound.
    ``unasserted``: positions whose value is not checked (their NaN pattern still is)."""
    r = np.asarray(ref).astype(np.float64)
    w = np.asarray(want, np.float64)
    assert r.shape == w.shape, f"{what}: shape {r.shape} != oracle's {w.shape}"
    bad = np.isnan(r) != np.isnan(w)
    winf = np.isinf(w)
    bad |= winf & (r != w)
    fin = np.isfinite(w)
    with np.errstate(invalid="ignore", over="ignore"):
        over = fin & np.isinf(r) & ~((np.abs(w) + bound >= MAX[dtype]) & (np.sign(r) == np.sign(w)))
        off = fin & np.isfinite(r) & ~(np.abs(r - w) <= bound)
    if unasserted is not None:
        over &= ~unasserted
        off &= ~unasserted
    bad |= over | off
    if bad.any():
        i = tuple(int(a) for a in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())}/{bad.size} elements disagree; first at {i}: "
                             f"reference {r[i]!r}, oracle {w[i]!r}, bound {np.broadcast_to(bound, r.shape)[i]!r}")


TINY64 = 2.0 ** -1074  # float64's smallest subnormal: the absolute error bound of an underflow


def value_bound(want: np.ndarray, s: np.ndarray, k: int, dtype: str) -> np.ndarray:
    """The module docstring's bound for a K-term dot product with absolute sum ``s``, plus
    (K + 1) float64 underflows (products of float64 operands may be subnormal in the oracle)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return UNIT[dtype] * np.abs(want) + 3 * gamma(k + 1) * s + ETA[dtype] + (k + 1) * TINY64


SMALL = 2_000  # input elements: below, a case runs in every dtype
HUGE = 1_000_000  # input elements: from here, one case per shape family


def size(c: matrix.Case) -> int:
    return sum(math.prod(s) for s in c.shapes)


def cases(ops: Sequence[str]) -> list[matrix.Case]:
    """The matrix's cases of ``ops``, subsampled to keep this file fast on two cores: cases of
    fewer than SMALL input elements run in every dtype, larger ones (long accumulations, not
    attribute coverage) in float32 and float64, and the families of HUGE elements or more (the
    accumulation-length families, issue 14 item 3: onnx.reference takes seconds per case there)
    once per value class, in float32, their attributes being swept on the smaller families
    (test_every_combination_is_covered)."""
    out: list[matrix.Case] = []
    huge_seen: set[tuple[str, str, str]] = set()
    for c in matrix.generate([TARGET], ops=list(ops)):
        if size(c) >= HUGE:
            if c.dtype == "float32" and (c.op, c.family, c.vals) not in huge_seen:
                huge_seen.add((c.op, c.family, c.vals))
                out.append(c)
        elif c.dtype in ("float32", "float64") or size(c) < SMALL:
            out.append(c)
    return out


def reference(case: matrix.Case, inputs: Sequence[np.ndarray], **attrs: Any) -> list[np.ndarray]:
    """The CPU reference on the case's inputs (``attrs`` override the case's attributes)."""
    return CPU.run(case.op, [x.copy() for x in inputs], case.attr_dict | attrs)


def as_onnx_float(v: float) -> float:
    """ONNX float attributes (epsilon, scale, softcap) are float32, and the matrix's values (eps
    1e-5, score_scale 0.3) are not all float32 numbers: the reference is run here with the value
    ONNX will see, so that both evaluate the same function (a relative change of 2.5e-8 in eps
    would otherwise dominate the float64 comparisons of rows with a small variance)."""
    return float(np.float32(v))


def f64(*xs: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(x, np.float64) for x in xs]


# -- conv -----------------------------------------------------------------------------------------
def conv_nonfinite(x: np.ndarray, w: np.ndarray, b: np.ndarray, oa: dict[str, Any]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(nan, +inf, -inf, any) masks of the outputs, from IEEE's rules for a sum of products taken
    over each window with the padding as zeros: a NaN term (a NaN factor, or 0 * inf, which
    includes an infinite weight over the padding) or infinite terms of both signs make NaN, else
    an infinite term makes that infinity. Each rule is a count, i.e. a convolution of 0/1
    indicators; x is zero-padded here (np.pad) so that "any x, padding included" can be an
    indicator too, and ONNX runs with no padding of its own."""
    pads = oa["pads"]
    nd = len(pads) // 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)])
    oa0 = dict(oa, pads=[0] * (2 * nd))

    def count(xi: np.ndarray, wi: np.ndarray) -> np.ndarray:
        return onnx_run("Conv", f64(xi, wi), 22, **oa0)[0]

    with np.errstate(invalid="ignore"):
        one_x, one_w = np.ones_like(xp), np.ones_like(w)
        nan_terms = (count(np.isnan(xp), one_w) + count(one_x, np.isnan(w))
                     + count(np.isinf(xp), w == 0) + count(xp == 0, np.isinf(w)))
        pos = (count(xp == np.inf, w > 0) + count(xp == -np.inf, w < 0)
               + count(xp > 0, w == np.inf) + count(xp < 0, w == -np.inf))
        neg = (count(xp == np.inf, w < 0) + count(xp == -np.inf, w > 0)
               + count(xp > 0, w == -np.inf) + count(xp < 0, w == np.inf))
    if b.size:
        per = (1, -1) + (1,) * nd
        nan_terms = nan_terms + np.isnan(b).reshape(per)
        pos = pos + (b == np.inf).reshape(per)
        neg = neg + (b == -np.inf).reshape(per)
    nan = (nan_terms > 0) | ((pos > 0) & (neg > 0))
    pinf = ~nan & (pos > 0)
    ninf = ~nan & (neg > 0)
    return nan, pinf, ninf, nan | pinf | ninf


def _finite(a: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(a), a, 0.0)


def onnx_linear(op_type: str, x: np.ndarray, w: np.ndarray, b: np.ndarray, oa: dict[str, Any]
                ) -> np.ndarray:
    """ONNX Conv or ConvTranspose (bias omitted when empty). onnx.reference's grouped
    ConvTranspose is broken (with Cout/group > 1 it fails to broadcast its per-group results), so
    there the groups are taken apart here, each a ConvTranspose of group 1: input channels and
    weight rows [g Cin/G, (g+1) Cin/G), output channels [g Cout/G, (g+1) Cout/G)."""
    groups = oa.get("group", 1)
    if op_type == "ConvTranspose" and groups > 1:
        cin, cout = x.shape[1] // groups, w.shape[1]
        parts = [onnx_linear(op_type, x[:, g * cin:(g + 1) * cin], w[g * cin:(g + 1) * cin],
                             b[g * cout:(g + 1) * cout] if b.size else b, dict(oa, group=1))
                 for g in range(groups)]
        return np.concatenate(parts, axis=1)
    return onnx_run(op_type, [x, w] + ([b] if b.size else []), 22, **oa)[0]


def check_linear(case: matrix.Case, op_type: str, oa: dict[str, Any], k: int) -> None:
    """Conv / ConvTranspose: the oracle's value on the finite parts of the inputs, its
    sum|w||x| for the bound, and (conv only: conv_transpose2d cases are all finite) the non-finite
    pattern of :func:`conv_nonfinite`."""
    x, w, b = matrix.make_inputs(case)
    (ref,) = reference(case, [x, w, b])
    x64, w64, b64 = f64(x, w, b)
    with np.errstate(over="ignore", invalid="ignore"):
        want = onnx_linear(op_type, _finite(x64), _finite(w64), _finite(b64), oa)
        s = onnx_linear(op_type, np.abs(_finite(x64)), np.abs(_finite(w64)), np.abs(_finite(b64)), oa)
    unasserted = None
    if np.isfinite(x64).all() and np.isfinite(w64).all() and np.isfinite(b64).all():
        nonfin = np.zeros(want.shape, bool)
    else:
        assert op_type == "Conv"
        nan, pinf, ninf, nonfin = conv_nonfinite(x64, w64, b64, oa)
        want = np.where(nan, np.nan, np.where(pinf, np.inf, np.where(ninf, -np.inf, want)))
    # Only with float64 operands can finite products overflow float64 (the reference accumulates
    # in long double there): the float64 oracle has no value to offer at those outputs, and the
    # reference's own error bound there exceeds float64's range, so only their NaN pattern (no
    # NaN: every term is finite) is asserted. This happens in the float64 ``special`` cases only
    # (265 of 147,360 conv outputs when written).
    too_big = ~nonfin & ~np.isfinite(s)
    if too_big.any():
        assert case.dtype == "float64", case.id
        want = np.where(too_big, 0.0, want)
        unasserted = too_big
    assert_agrees(ref, want, value_bound(want, s, k, case.dtype), case.dtype, case.id, unasserted)


CONV_CASES = cases(["conv"])
CONV_T_CASES = cases(["conv_transpose2d"])
POOL_CASES = cases(["pool"])


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.id)
def test_conv_against_onnx_conv(case: matrix.Case) -> None:
    w_shape = case.shapes[1]
    k = w_shape[1] * math.prod(w_shape[2:])  # Cin/groups * prod(kernel) products per output
    check_linear(case, "Conv", conv_attrs(case.attr_dict, w_shape), k)


@pytest.mark.parametrize("case", CONV_T_CASES, ids=lambda c: c.id)
def test_conv_transpose_against_onnx_conv_transpose(case: matrix.Case) -> None:
    x_shape, w_shape, _ = case.shapes
    k = (x_shape[1] // case.attr_dict["groups"]) * math.prod(w_shape[2:])  # at most, per output
    check_linear(case, "ConvTranspose", conv_transpose_attrs(case.attr_dict, w_shape), k)


# -- pool -----------------------------------------------------------------------------------------
def max_pool(x: np.ndarray, oa: dict[str, Any], fill: float) -> np.ndarray:
    """ONNX MaxPool of x padded here with ``fill``. onnx.reference's MaxPool with unit strides
    reads ``pads`` wrongly (four pads as top, bottom, left, right instead of ONNX's begins then
    ends; a 1-D pool's pads are ignored), so the padding is applied here and ONNX pools
    unpadded."""
    pads = oa["pads"]
    nd = len(pads) // 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[nd + i]) for i in range(nd)], constant_values=fill)
    return onnx_run("MaxPool", [xp], 22, **dict(oa, pads=[0] * (2 * nd)))[0]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: c.id)
def test_pool_against_onnx_pool(case: matrix.Case) -> None:
    """MaxPool / AveragePool (count_include_pad=0: the padding is excluded from the average, and
    never wins a max: docs/ops.md). onnx.reference drops NaNs from each window (it marks padding
    with NaN), so the oracle runs on x without its NaNs (as -inf for a max, finite values only for
    an average) and the non-finite results come from which windows hold a NaN or an infinity
    (MaxPool of 0/1 indicators, zero-padded): a max is NaN where its window holds a NaN; an
    average is NaN where its window holds a NaN or infinities of both signs, else the infinity it
    holds."""
    (x,) = matrix.make_inputs(case)
    (ref,) = reference(case, [x])
    (x64,) = f64(x)
    oa = pool_attrs(case.attr_dict)

    def holds(ind: np.ndarray) -> np.ndarray:
        return max_pool(ind.astype(np.float64), oa, 0.0) > 0

    nan = holds(np.isnan(x64))
    if case.attr_dict["kind"] == "max":
        want = np.where(nan, np.nan, max_pool(np.where(np.isnan(x64), -np.inf, x64), oa, -np.inf))
        # a max picks an element: exact (+0 and -0 compare equal: which of them a max returns is
        # unspecified)
        assert_agrees(ref, want, np.zeros(want.shape), case.dtype, case.id)
        return
    pinf, ninf = holds(x64 == np.inf), holds(x64 == -np.inf)
    nan |= pinf & ninf
    with np.errstate(over="ignore", invalid="ignore"):
        want = onnx_run("AveragePool", [_finite(x64)], 22, count_include_pad=0, **oa)[0]
        s = onnx_run("AveragePool", [np.abs(_finite(x64))], 22, count_include_pad=0, **oa)[0]
    nonfin = nan | pinf | ninf
    want = np.where(nan, np.nan, np.where(pinf, np.inf, np.where(ninf, -np.inf, want)))
    # a sum of at most n terms and one division (one more rounding): gamma_(n+1) * mean|x|
    n = math.prod(oa["kernel_shape"])
    unasserted = None
    too_big = ~nonfin & ~np.isfinite(s)
    if too_big.any():  # as for conv: float64 operands whose finite sum overflows float64
        assert case.dtype == "float64", case.id
        unasserted = too_big
        want = np.where(too_big, 0.0, want)
    assert_agrees(ref, want, value_bound(want, s, n, case.dtype), case.dtype, case.id, unasserted)


# -- normalization --------------------------------------------------------------------------------
def norm_bound(x: np.ndarray, g: np.ndarray, b: np.ndarray, axes: tuple[int, ...], eps: float,
               rms: bool) -> tuple[np.ndarray, np.ndarray]:
    """(bound, unasserted) on the difference of two float64 evaluations of y = z * gamma + beta,
    z = (x - mean) / sqrt(var + eps) (two-pass) or x / sqrt(mean(x^2) + eps), each within the
    first-order analysis below of the exact value (Higham 3.5 for the sums):
    mean: e_mu = gamma_(n+1) mean|x|; d = x - mean: e_d = e_mu + u(|d| + e_mu);
    var: e_v = gamma_(n+2) var + (2 mean|d| + max e_d) max e_d (mean square: gamma_(n+1) mean x^2);
    r = 1/sqrt(v + eps): relative rho = e_v / (2 (v + eps)) + 3u; z: e_d r + |z| (rho + 2u);
    y: |gamma| e_z + 2u (|z gamma| + |beta|). Twice that covers both evaluations. Rows where
    rho > 1/4 (first order no longer holds) are returned as unasserted, as are non-finite rows
    (their NaN/inf pattern is still checked exactly)."""
    u = U64
    n = math.prod(x.shape[a] for a in axes)
    with np.errstate(all="ignore"):
        if rms:
            ms = np.mean(x * x, axis=axes, keepdims=True)
            v, z = ms, x / np.sqrt(ms + eps)
            e_v = gamma(n + 1) * ms
            rho = e_v / (2 * (ms + eps)) + 3 * u
            e_z = np.abs(z) * (rho + 2 * u)
        else:
            mu = np.mean(x, axis=axes, keepdims=True)
            d = x - mu
            v = np.mean(d * d, axis=axes, keepdims=True)
            e_mu = gamma(n + 1) * np.mean(np.abs(x), axis=axes, keepdims=True)
            e_d = e_mu + u * (np.abs(d) + e_mu)
            e_dmax = e_mu + u * (np.max(np.abs(d), axis=axes, keepdims=True) + e_mu)
            e_v = gamma(n + 2) * v + (2 * np.mean(np.abs(d), axis=axes, keepdims=True) + e_dmax) * e_dmax
            rho = e_v / (2 * (v + eps)) + 3 * u
            z = d / np.sqrt(v + eps)
            e_z = e_d / np.sqrt(v + eps) + np.abs(z) * (rho + 2 * u)
        bound = 2 * (np.abs(g) * e_z + 2 * u * (np.abs(z * g) + np.abs(b)))
        unasserted = np.broadcast_to((rho > 0.25) | ~np.isfinite(v), bound.shape)
    return bound, unasserted


def check_norm(case: matrix.Case, want: np.ndarray, ref: np.ndarray, x: np.ndarray, g: np.ndarray,
               b: np.ndarray, axes: tuple[int, ...], eps: float, rms: bool) -> None:
    bound, unasserted = norm_bound(x, g, b, axes, eps, rms)
    bound = np.where(np.isfinite(bound), bound, np.inf) + UNIT[case.dtype] * np.abs(want) + ETA[case.dtype]
    assert_agrees(ref, want, bound, case.dtype, case.id, unasserted)


NORM_CASES = cases(["layer_norm", "rms_norm"])


@pytest.mark.parametrize("case", NORM_CASES, ids=lambda c: c.id)
def test_layer_and_rms_norm_against_onnx(case: matrix.Case) -> None:
    """LayerNormalization (opset 17) and RMSNormalization (opset 23) over x.shape[axis:]; ONNX's
    RMSNormalization has no bias, so beta is added here (our rms_norm's y = z * gamma + beta)."""
    x, g, b = matrix.make_inputs(case)
    eps = as_onnx_float(case.attr_dict["eps"])
    (ref,) = reference(case, [x, g, b], eps=eps)
    if x.size == 0:
        assert ref.shape == x.shape
        return
    x64, g64, b64 = f64(x, g, b)
    axis = case.attr_dict["axis"] % x.ndim
    with np.errstate(all="ignore"):
        if case.op == "layer_norm":
            want = onnx_run("LayerNormalization", [x64, g64, b64], 17, n_out=1, axis=axis, epsilon=eps)[0]
        else:
            want = onnx_run("RMSNormalization", [x64, g64], 23, axis=axis, epsilon=eps)[0] + b64
    check_norm(case, want, ref, x64, g64, b64, tuple(range(axis, x.ndim)), eps, case.op == "rms_norm")


@pytest.mark.parametrize("case", cases(["group_norm"]), ids=lambda c: c.id)
def test_group_norm_against_onnx(case: matrix.Case) -> None:
    """Group norm is layer norm over each group [C/G channels x spatial], then a per-channel
    gamma, beta: ONNX LayerNormalization (axis 2, scale 1, bias 0) over x reshaped to
    [N, G, C/G * spatial], the affine step applied here. Not ONNX's GroupNormalization: its
    function body computes the variance in one pass, E[x^2] - E[x]^2, which in float64 loses
    up to 10^-5 relative on the ``spread`` class (large mean, small variance) and turns rows whose
    x^2 overflows into NaN; an oracle must not be less accurate than what it checks."""
    x, g, b = matrix.make_inputs(case)
    eps = as_onnx_float(case.attr_dict["eps"])
    (ref,) = reference(case, [x, g, b], eps=eps)
    x64, g64, b64 = f64(x, g, b)
    groups = case.attr_dict["num_groups"]
    n, c = x.shape[:2]
    xg = x64.reshape(n, groups, -1)
    per = (1, c) + (1,) * (x.ndim - 2)
    with np.errstate(all="ignore"):
        ones = np.ones(xg.shape[2:])
        z = onnx_run("LayerNormalization", [xg, ones, np.zeros_like(ones)], 17, axis=2, epsilon=eps)[0]
        want = z.reshape(x.shape) * g64.reshape(per) + b64.reshape(per)
    gb = [np.broadcast_to(p.reshape(per), x.shape).reshape(xg.shape) for p in (g64, b64)]
    bound, unasserted = norm_bound(xg, gb[0], gb[1], (2,), eps, rms=False)
    bound = np.where(np.isfinite(bound), bound, np.inf).reshape(x.shape)
    bound = bound + UNIT[case.dtype] * np.abs(want) + ETA[case.dtype]
    assert_agrees(ref, want, bound, case.dtype, case.id, unasserted.reshape(x.shape))


@pytest.mark.parametrize("case", cases(["batch_norm_inference"]), ids=lambda c: c.id)
def test_batch_norm_against_onnx(case: matrix.Case) -> None:
    """BatchNormalization (opset 15, inference) wants channels at axis 1; ours are last, so x is
    moved here (a 1-D x is one sample of C features). A few roundings per element in each
    evaluation: 8u (|gamma| |x - mean| / sqrt(var + eps) + |beta|) covers both, plus the
    absolute error of intermediate results that underflow (the special class has subnormal
    gammas and differences; ONNX multiplies by gamma before dividing, we after), each at most
    float64's smallest subnormal and then divided by sqrt(var + eps) at most once."""
    x, g, b, m, v = matrix.make_inputs(case)
    eps = as_onnx_float(case.attr_dict["eps"])
    (ref,) = reference(case, [x, g, b, m, v], eps=eps)
    x64, g64, b64, m64, v64 = f64(x, g, b, m, v)
    xn = np.moveaxis(x64.reshape((1,) + x.shape) if x.ndim == 1 else x64, -1, 1)
    with np.errstate(all="ignore"):
        want = onnx_run("BatchNormalization", [xn, g64, b64, m64, v64], 15, epsilon=eps)[0]
        # ONNX's gamma * (x - mean) may overflow on the way to a finite result: there, again
        # with gamma and beta scaled by 2^-64 (exact), and the result by 2^64 (an infinite beta
        # still decides the result there)
        scaled = onnx_run("BatchNormalization", [xn, g64 * 2.0 ** -64, b64 * 2.0 ** -64, m64, v64], 15,
                          epsilon=eps)[0] * 2.0 ** 64
        fin = np.all([np.isfinite(np.broadcast_to(a, x.shape)) for a in (x64, g64, m64, v64)], axis=0)
        want = np.moveaxis(want, 1, -1).reshape(x.shape)
        scaled = np.moveaxis(scaled, 1, -1).reshape(x.shape)
        want = np.where(fin & ~np.isfinite(want), scaled, want)
        # and with an infinite beta (the other inputs finite), the exact result is that
        # infinity, whatever the finite part overflows to (ONNX: inf + -inf = NaN)
        want = np.where(fin & np.isinf(b64), np.broadcast_to(b64, x.shape), want)
        sigma = np.sqrt(v64 + eps)
        bound = 8 * U64 * (np.abs(g64) * np.abs(x64 - m64) / sigma + np.abs(b64)) \
            + 8 * TINY64 * (1 + (1 + np.abs(g64)) / sigma)
        bound = np.where(np.isfinite(bound), bound, np.inf) + UNIT[case.dtype] * np.abs(want) + ETA[case.dtype]
    assert_agrees(ref, want, bound, case.dtype, case.id)


# -- attention and rope ---------------------------------------------------------------------------
def attention_allowed(kind: str, window: int, mask: np.ndarray, b: int, h: int, sq: int, sk: int
                      ) -> np.ndarray:
    """[B, H, Sq, Sk]: which keys each query may see (docs/ops.md, attention): query i sits at key
    position Sk - Sq + i; causal sees keys up to it, sliding_window the last ``window`` of those;
    custom: mask != 0; bias: every key whose bias is not -inf."""
    pos = (sk - sq) + np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    if kind == "causal":
        allowed = j <= pos
    elif kind == "sliding_window":
        allowed = (j <= pos) & (j >= pos - window + 1)
    elif kind == "custom":
        allowed = mask != 0
    elif kind == "bias":
        allowed = mask != -np.inf
    else:
        allowed = np.ones((sq, sk), bool)
    return np.broadcast_to(allowed, (b, h, sq, sk))


@pytest.mark.parametrize("case", cases(["attention"]), ids=lambda c: c.id)
def test_attention_against_onnx_attention(case: matrix.Case) -> None:
    """Attention, opset 23, on the [B, S, heads*D] layout with q_num_heads/kv_num_heads (ONNX
    maps query head i to key/value head i // (H/Hkv), as ours). ONNX's is_causal aligns the
    queries top-left when there is no cache, ours bottom-right, and it has no sliding window:
    structural and custom masks go in as a boolean attn_mask built here, a bias as the additive
    attn_mask. Both apply the softcap before the mask. Queries that may see no key are undefined
    in our spec (ONNX returns 0 there): unasserted.

    Bound (two float64 evaluations): the scores carry e_ij <= gamma_(D+4)(u) scale |q_i|.|k_j|
    (q scaled here: one more rounding) + 2u|bias_ij| + 3u c for a softcap c (1-Lipschitz);
    with E_i the largest e_ij over the keys the query sees, the softmax weights move by a factor
    within exp(+-2 E_i) and carry (Sk + 4)u of their own, and the weighted sum of values adds
    gamma_Sk: |o - o'| <= 2 (expm1(2 E_i) + 2 (Sk + 4) u + gamma_Sk) sum_j p_ij |v_jd|, where
    sum_j p_ij |v_jd| is ONNX's attention over |v|."""
    q, k, v, mask = matrix.make_inputs(case)
    a = case.attr_dict
    assert as_onnx_float(a["logit_softcap"]) == a["logit_softcap"], "softcap is not a float32 number"
    (ref,) = reference(case, [q, k, v, mask])
    q64, k64, v64, m64 = f64(q, k, v, mask)
    h, d = a["num_heads"], a["head_dim"]
    bsz, sq, sk, hkv = q.shape[0], q.shape[1], k.shape[1], k.shape[2] // d
    kind = a["mask_kind"]
    allowed = attention_allowed(kind, a["window"], m64, bsz, h, sq, sk)
    attn_mask = np.broadcast_to(m64, allowed.shape).copy() if kind == "bias" else (
        None if kind == "none" else allowed.copy())
    scale = a["score_scale"] or 1 / math.sqrt(d)
    oa: dict[str, Any] = dict(q_num_heads=h, kv_num_heads=hkv, scale=1.0)
    if a["logit_softcap"] > 0:
        oa["softcap"] = float(a["logit_softcap"])
    want = onnx_run("Attention", [q64 * scale, k64, v64, attn_mask], 23, **oa)[0]
    pv = onnx_run("Attention", [q64 * scale, k64, np.abs(v64), attn_mask], 23, **oa)[0]
    # the score error bound, per (b, h, i, j), and its max over the keys each query sees
    qh = np.abs(q64).reshape(bsz, sq, h, d).transpose(0, 2, 1, 3)
    kh = np.repeat(np.abs(k64).reshape(bsz, sk, hkv, d).transpose(0, 2, 1, 3), h // hkv, axis=1)
    e = gamma(d + 4) * scale * (qh @ kh.transpose(0, 1, 3, 2)) + 3 * U64 * a["logit_softcap"]
    if kind == "bias":
        e = e + 2 * U64 * np.where(allowed, np.abs(np.broadcast_to(m64, allowed.shape)), 0.0)
    big_e = np.max(np.where(allowed, e, 0.0), axis=-1)  # [B, H, Sq]
    factor = 2 * (np.expm1(2 * big_e) + 2 * (sk + 4) * U64 + gamma(sk))
    factor = np.repeat(factor.transpose(0, 2, 1), d, axis=-1)  # [B, Sq, H*D]
    bound = factor * pv + UNIT[case.dtype] * np.abs(want) + ETA[case.dtype]
    dead = np.repeat((~allowed.any(-1)).transpose(0, 2, 1), d, axis=-1)
    assert_agrees(ref, np.where(dead, np.nan, want), bound, case.dtype, case.id,
                  unasserted=dead)


def test_attention_mask_translation_is_not_vacuous() -> None:
    """The matrix's causal and sliding_window cases have Sq < Sk, where bottom-right (ours) and
    ONNX's top-left causal alignment differ: the translation above is exercised, not moot."""
    shapes = {(c.shapes[0][1], c.shapes[1][1]) for c in cases(["attention"])
              if c.attr_dict["mask_kind"] in ("causal", "sliding_window")}
    assert any(sq < sk for sq, sk in shapes), shapes


@pytest.mark.parametrize("case", cases(["rope"]), ids=lambda c: c.id)
def test_rope_against_onnx_rotary_embedding(case: matrix.Case) -> None:
    """RotaryEmbedding, opset 23: x [B, S, H*head_dim] with num_heads, tables [S, n_rot/2]
    indexed by position_ids = arange(S) per batch; interleaved=0 pairs (k, k + n_rot/2) (our
    neox), interleaved=1 pairs (2k, 2k+1) (gptj); rotary_embedding_dim = n_rot. Each rotated
    element is c x_a -+ s x_b: three roundings per evaluation, so the two differ by at most
    6u (|c x_a| + |s x_b|); that magnitude is the oracle's own |c||x_a| (run with sin = 0)
    plus |s||x_b| (run with cos = 0), on |x| (pass-through dims are |x|, harmless)."""
    x, c, s = matrix.make_inputs(case)
    (ref,) = reference(case, [x, c, s])
    x64, c64, s64 = f64(x, c, s)
    a = case.attr_dict
    lead = x.shape[:-2]
    xs = x64.reshape((-1,) + x.shape[-2:])  # [B, S, H*head_dim]
    pos = np.broadcast_to(np.arange(x.shape[-2], dtype=np.int64), xs.shape[:2]).copy()
    oa = dict(interleaved=int(a["style"] == "gptj"), rotary_embedding_dim=a["n_rot"],
              num_heads=x.shape[-1] // a["head_dim"])

    def rot(xi: np.ndarray, ci: np.ndarray, si: np.ndarray) -> np.ndarray:
        return onnx_run("RotaryEmbedding", [xi, ci, si, pos], 23, **oa)[0]

    with np.errstate(all="ignore"):
        want = rot(xs, c64, s64).reshape(lead + x.shape[-2:])
        zero = np.zeros_like(c64)
        mag = np.abs(rot(np.abs(xs), np.abs(c64), zero)) + np.abs(rot(np.abs(xs), zero, np.abs(s64)))
        bound = 6 * U64 * mag.reshape(want.shape)
        bound = np.where(np.isfinite(bound), bound, np.inf) + UNIT[case.dtype] * np.abs(want) + ETA[case.dtype]
    assert_agrees(ref, want, bound, case.dtype, case.id)


# -- quantization ---------------------------------------------------------------------------------
def compute_dtype(dtype: str) -> type:
    """float16/bfloat16 compute in float32 (docs/ops.md, low precision)."""
    return np.float64 if dtype == "float64" else np.float32


@pytest.mark.parametrize("case", cases(["fake_quantize"]), ids=lambda c: c.id)
def test_fake_quantize_against_onnx_quantize_dequantize(case: matrix.Case) -> None:
    """QuantizeLinear then DequantizeLinear (opset 21, per-axis, zero point 0) in the compute
    dtype, with scale = max|x| over the other axes / (2^(bits-1) - 1), computed here. int16 holds
    every quantized value, and |x / scale| never passes qmax (scale rounds, x/scale rounds: at
    most qmax (1 + 2u), which rounds to qmax), so ONNX's saturation stands in for our clamp
    (asserted). Same IEEE steps in the same dtype: bit-exact. Our spec's special cases, taken
    here: y = x where scale is 0; a slice whose scale is NaN or inf (it holds a NaN or an inf) is
    all NaN (x/scale is NaN or 0, times scale: NaN)."""
    (x,) = matrix.make_inputs(case)
    (ref,) = reference(case, [x])
    if x.size == 0:
        assert ref.shape == x.shape
        return
    ct = compute_dtype(case.dtype)
    xc = x.astype(ct)
    axis = case.attr_dict["axis"] % x.ndim
    qmax = 2 ** (case.attr_dict["bits"] - 1) - 1
    others = tuple(i for i in range(x.ndim) if i != axis)
    scale = (np.max(np.abs(xc), axis=others) / ct(qmax)).astype(ct)  # [x.shape[axis]]
    shape = [1] * x.ndim
    shape[axis] = -1
    sv = scale.reshape(shape)
    bad = ~np.isfinite(sv)
    zero = sv == 0
    safe_x = np.where(bad | zero, ct(0), xc)
    safe_s = np.where(np.isfinite(scale) & (scale != 0), scale, ct(1))
    zp = np.zeros(scale.shape, np.int16)
    q = onnx_run("QuantizeLinear", [safe_x, safe_s, zp], 21, axis=axis)[0]
    assert np.abs(q.astype(np.int64)).max() <= qmax, case.id
    y = onnx_run("DequantizeLinear", [q, safe_s, zp], 21, axis=axis)[0].astype(ct)
    want = np.where(bad, ct(np.nan), np.where(zero, xc, y)).astype(x.dtype)
    got = np.asarray(ref)
    same = (got == want) | (np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64)))
    assert same.all(), (f"{case.id}: {int((~same).sum())}/{same.size} differ; first at "
                        f"{np.argwhere(~same)[0]}: reference {got[~same][0]!r}, oracle {want[~same][0]!r}")


def per_axis(p: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A 1-D per-axis parameter shaped to broadcast along ``axis`` (a 0-D one as it is): written
    here, not imported (the reference and the MLX kernels share judge/bounds/signal.param_view)."""
    return p if p.ndim == 0 else p.reshape([p.size if i == axis else 1 for i in range(ndim)])


@pytest.mark.parametrize("case", cases(["quantize", "dequantize"]), ids=lambda c: c.id)
def test_quantize_and_dequantize_against_onnx(case: matrix.Case) -> None:
    """QuantizeLinear / DequantizeLinear (opset 21; per-tensor for a 0-D scale, else per-axis
    along ``axis``, with our zero points): bit-exact. float16/bfloat16 quantize in float32, the
    reference's compute dtype (docs/ops.md, low precision; onnx.reference would divide in the
    16-bit dtype, which the judge's near-tie rule allows an implementation as well). onnx.reference
    casts round(x / scale) to int32 before it adds the zero point and saturates, which is undefined
    for |x / scale| >= 2^31 (it gave 127 for -3.4e38 / 1.5): there ONNX's rule (saturate) is
    asserted directly, and a NaN quotient, which has no integer, is our spec's masked 0."""
    x, scale, zp = matrix.make_inputs(case)
    (ref,) = reference(case, [x, scale, zp])
    got = np.asarray(ref)
    if x.size == 0:
        assert got.shape == x.shape
        return
    axis = case.attr_dict["axis"] % max(x.ndim, 1)
    per = {} if scale.ndim == 0 else {"axis": axis}
    if case.op == "dequantize":
        want = onnx_run("DequantizeLinear", [x, scale, zp], 21, **per)[0]
        defined = np.ones(x.shape, bool)
    else:
        ct = compute_dtype(case.dtype)
        xc, sc = x.astype(ct), scale.astype(ct)
        want = onnx_run("QuantizeLinear", [xc, sc, zp], 21, **per)[0]
        with np.errstate(all="ignore"):
            r = xc / per_axis(sc, x.ndim, axis)
        defined = np.abs(r) < 2.0**31
        info = np.iinfo(got.dtype)
        beyond = ~defined & ~np.isnan(r)
        assert (got[beyond] == np.where(r[beyond] < 0, info.min, info.max)).all(), f"{case.id}: not saturated"
        assert (got[np.isnan(r)] == 0).all(), f"{case.id}: NaN quotient not 0"
    assert got.dtype == want.dtype, (case.id, got.dtype, want.dtype)
    same = (got == want) | (np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))) | ~defined
    assert same.all(), (f"{case.id}: {int((~same).sum())}/{same.size} differ; first at "
                        f"{np.argwhere(~same)[0]}: reference {got[~same][0]!r}, oracle {want[~same][0]!r}")


ORACLE_OPS = ["conv", "conv_transpose2d", "pool", "layer_norm", "rms_norm", "group_norm",
              "batch_norm_inference", "attention", "rope", "fake_quantize",
              "quantize", "dequantize"]


def test_every_combination_is_covered() -> None:
    """The subsample keeps every shape family, dtype, value class and attribute combination of
    every op (attention's head counts follow its shape family: its huge family sweeps masks,
    scales and softcaps at 1 head of 8, which the smaller families sweep at other head counts),
    and every case below HUGE input elements but for its dtype."""
    def attrs(c: matrix.Case) -> tuple:
        a = dict(c.attrs)
        if c.op == "attention":
            a.pop("num_heads"), a.pop("head_dim")
        return c.op, tuple(sorted(a.items()))

    full = list(matrix.generate([TARGET], ops=ORACLE_OPS))
    kept = cases(ORACLE_OPS)
    assert {(c.op, c.family) for c in full} == {(c.op, c.family) for c in kept}
    assert {(c.op, c.dtype) for c in full} == {(c.op, c.dtype) for c in kept}
    assert {attrs(c) for c in full} == {attrs(c) for c in kept}
    assert {(c.op, c.vals) for c in full} == {(c.op, c.vals) for c in kept}
    assert {(c.op, c.shapes, c.attrs, c.vals) for c in full if size(c) < HUGE} \
        == {(c.op, c.shapes, c.attrs, c.vals) for c in kept if size(c) < HUGE}


MLX_MODULES = sorted(p.name for p in (Path(rlx_conformance.backends.__file__).parent / "mlx").glob("*.py"))


@pytest.mark.parametrize("module", MLX_MODULES)
def test_mlx_kernels_share_no_geometry_with_the_reference(module: str) -> None:
    """Every MLX kernel module reads its attributes with its own code (conv/pool, norm/attention/
    rope since issue 14; dot_general's axes and the quantization parameters' broadcast since):
    importing the geometry of the CPU reference and its bounds (rlx_conformance.judge) would let a
    mistake there agree with itself. Checked on the source, without importing MLX."""
    assert {"conv.py", "nn.py", "linalg.py", "signal.py"} <= set(MLX_MODULES)
    path = Path(rlx_conformance.backends.__file__).parent / "mlx" / module
    tree = ast.parse(path.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    shared = sorted(m for m in imported if m.startswith(("rlx_conformance.judge", "rlx_conformance.backends.cpu")))
    assert not shared, f"backends/mlx/{module} imports {shared}"
