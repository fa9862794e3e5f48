"""Error bounds of the backward ops (ops/backward.py): RLX's explicit gradient kernels, each the
VJP of a forward op with respect to one input.

The backward of a linear op is itself a linear op, judged as one: the conv input gradient is a
transposed convolution of dy with w and the weight gradient a correlation of x with dy, each
output a sum of K products (Higham 3.5, any order: judge/bounds/linalg.bilinear_bound); the
cumsum backward is a cumsum of dy in the other direction (reduce.cumsum_bound); the gather
backward adds dy into the gathered rows (shape.scatter_add_bound). The attention backward is
attention's VJP for one input and is judged by the bound of attention's own gradient cases
(derivative.derivative_bound over nn.attention_magnitude). The activation backward
dy * f'(x) is a short formula: gamma_R(u) times the sum of the magnitudes of f''s terms and of
their sensitivity to the rounding of the arguments of exp/erf/tanh (:func:`activation_terms`).
The reference evaluates the verified float64 VJP rules (backends/cpu/backward.py), so its own
share is gamma_K(u of float64).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import special

from rlx_conformance.judge.bounds import linalg as lj
from rlx_conformance.judge.bounds import norm_grad as ng
from rlx_conformance.judge.bounds.conv import (
    conv_params,
    conv_transpose_reference,
    im2col,
    pool_params,
)
from rlx_conformance.judge.bounds.derivative import derivative_bound
from rlx_conformance.judge.bounds.gamma import U64, gamma
from rlx_conformance.judge.bounds.nn import attention_magnitude, rope_bound
from rlx_conformance.judge.bounds.reduce import cumsum_bound, softmax_bound
from rlx_conformance.judge.bounds.shape import scatter_add_bound
from rlx_conformance.judge.compare import Bound

# Roundings in one activation derivative's formula: at most 8 arithmetic roundings (the products
# and sums of f' and the product with dy) plus at most 2 library calls (exp, erf, tanh) of at most
# 4 ulp each (MLX's float32 vector functions are within a few ulp).
ACTIVATION_ROUNDINGS = 16
ACTIVATIONS = ("gelu", "gelu_approx", "silu", "sigmoid", "tanh")
_C = math.sqrt(2 / math.pi)  # gelu_approx's constants
_K = 0.044715


def activation_terms(name: str, x: np.ndarray) -> np.ndarray:
    """Sum of |terms| of f'(x) (as any of its textbook formulas evaluates it) plus the change of f'
    when the argument of its exp/erf/tanh is off by a relative u (that sensitivity, over u)."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if name == "sigmoid":
            s = special.expit(x)
            return s * (1 + s) + s * (1 - s) * np.abs(x)
        if name == "tanh":
            t = np.tanh(x)
            return 1 + t * t + 2 * np.abs(t) * (1 - t * t) * np.abs(x)
        if name == "silu":
            s = special.expit(x)
            return s * (1 + np.abs(x) * (1 + s)) + s * (1 - s) * np.abs(x) * (1 + np.abs(x))
        if name == "gelu":
            phi = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
            return 0.5 * (1 + np.abs(special.erf(x / math.sqrt(2)))) + np.abs(x) * phi * (2 + x * x)
        if name == "gelu_approx":
            a = _C * (x + _K * x ** 3)
            t = np.tanh(a)
            return (0.5 * (1 + np.abs(t)) + 0.5 * np.abs(x) * (1 + t * t) * _C * (1 + 3 * _K * x * x)
                    + (1 - t * t) * np.abs(a) * (1 + np.abs(x) * _C * (1 + 3 * _K * x * x)))
    raise ValueError(f"activation_backward: no bound for activation {name!r}")


def activation_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                              out_dtype: str) -> np.ndarray:
    """gamma_R(u) * |dy| * activation_terms(x), plus the reference's float64 share."""
    x, dy = inputs
    r = ACTIVATION_ROUNDINGS
    with np.errstate(all="ignore"):
        return (gamma(r, lj.uc(out_dtype)) + gamma(r, U64)) * np.abs(dy.astype(np.float64)) * \
            activation_terms(attrs["activation"], x)


def conv_input_grad(dy: np.ndarray, w: np.ndarray, x_shape, attrs: Mapping[str, Any]) -> np.ndarray:
    """dx = conv_transpose2d(dy, w) in float64 (the bounds' formulation: each input position sums
    the window taps that read it): the full transposed convolution (no padding), where x position
    i is full position i + the begin padding; positions past its end are read by no window (0).
    That holds for symmetric and asymmetric (begins, ends) padding alike."""
    _, stride, pb, _, dil, g, _, _ = conv_params("conv2d_backward_input", x_shape, w.shape, attrs)
    t = {"stride": tuple(stride), "padding": (0, 0), "dilation": tuple(dil), "output_padding": (0, 0),
         "groups": g}
    full = conv_transpose_reference(dy, w, np.zeros(0), t)
    short = [max(0, b + n - f) for b, n, f in zip(pb, x_shape[2:], full.shape[2:])]
    full = np.pad(full, [(0, 0), (0, 0)] + [(0, m) for m in short])
    return full[:, :, pb[0]:pb[0] + x_shape[2], pb[1]:pb[1] + x_shape[3]]


def conv_weight_grad(x: np.ndarray, dy: np.ndarray, w_shape, attrs: Mapping[str, Any]) -> np.ndarray:
    """dw[o, c, *k] = sum over batch and output positions of dy[n, o, p] * window(x)[n, c, p, k]."""
    _, stride, pb, pe, dil, g, cout, out = conv_params("conv2d_backward_weight", x.shape, w_shape, attrs)
    cols = im2col(x, w_shape[2:], stride, pb, pe, dil)  # [N, C, *out, *k]
    n, c = x.shape[:2]
    cg, og = c // g, cout // g
    cols = cols.reshape((n, g, cg, math.prod(out)) + tuple(w_shape[2:]))
    d = dy.reshape(n, g, og, math.prod(out))
    return np.einsum("ngop,ngcp...->goc...", d, cols).reshape(tuple(w_shape))


def conv_backward_input_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                              out_dtype: str) -> Bound:
    """A transposed convolution of dy with w: gamma_K * sum|w||dy| per input position, K = the
    most taps reading one position (Cout/groups * prod(kernel))."""
    x, w, _, dy = inputs
    k = (w.shape[0] // attrs["groups"]) * math.prod(w.shape[2:])
    return lj.bilinear_bound(lambda a, b: conv_input_grad(a, b, x.shape, attrs), dy, w, k, out_dtype, U64)


def conv_backward_weight_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                               out_dtype: str) -> Bound:
    """A correlation of x with dy: gamma_K * sum|x||dy| per weight, K = N * prod(output size)."""
    x, w, _, dy = inputs
    k = dy.shape[0] * math.prod(dy.shape[2:])
    return lj.bilinear_bound(lambda a, b: conv_weight_grad(a, b, w.shape, attrs), x, dy, k, out_dtype, U64)


def cumsum_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                          out_dtype: str) -> Bound:
    """The cumsum of dy in the other direction: cumsum's bound on it."""
    _, dy = inputs
    return cumsum_bound([dy], {**attrs, "reverse": not attrs["reverse"]}, out_dtype)


def gather_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                          out_dtype: str) -> Bound:
    """dy's rows added into the rows of x they were gathered from: scatter_add's bound with the
    gather axis moved first and the index dims flattened."""
    x, idx, dy = inputs
    a = attrs["axis"] % x.ndim
    lead = tuple(range(a, a + idx.ndim))
    rest = tuple(d for d in range(dy.ndim) if d not in lead)
    upd = dy.transpose(lead + rest).reshape((idx.size,) + tuple(dy.shape[d] for d in rest))
    b = scatter_add_bound([upd, idx.reshape(-1)], {"out_dim": x.shape[a]}, out_dtype)
    return b.map(lambda v: np.moveaxis(np.asarray(v), 0, a))


def rope_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """The transpose of a rotation is the rotation by the opposite angle: rope's bound on dy with
    sin negated."""
    _, c, s, dy = inputs
    return rope_bound([dy, c, -s], attrs, out_dtype)


def xent_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """dy (p S - t), p = softmax(logits), S = sum t: softmax's bound on p (times |S|), the sum S
    (gamma_n sum|t|, times |p|), the product, the difference and the product with dy (3u)."""
    logits, t, dy = inputs
    if logits.size == 0:
        return np.zeros(logits.shape)
    n = logits.shape[-1]
    u = lj.uc(out_dtype)
    t64 = t.astype(np.float64)
    with np.errstate(all="ignore"):
        m = np.max(logits.astype(np.float64), axis=-1, keepdims=True)
        e = np.exp(logits.astype(np.float64) - m)
        p = e / np.sum(e, axis=-1, keepdims=True)
        s = np.sum(t64, axis=-1, keepdims=True)
        bp = softmax_bound([logits], {"axis": -1}, out_dtype)
        inner = bp * np.abs(s) + np.abs(p) * gamma(n, u) * np.sum(np.abs(t64), axis=-1, keepdims=True) \
            + 3 * u * (np.abs(p * s) + np.abs(t64))
        b = np.abs(dy.astype(np.float64))[..., None] * inner * (1 + 2 * u) + gamma(n + 4, U64) * \
            np.abs(dy.astype(np.float64))[..., None] * (np.abs(p * s) + np.abs(t64))
    return np.where(np.isfinite(b), b, 0.0)


def max_pool_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """Each window's dy lands on one of its elements, and an element sums the dy of the windows
    it wins, at most all the windows that cover it: scatter_add's bound with every window's dy
    sent to every element it covers (padding taps to a discarded slot). That is an upper bound
    whichever element a window picks, and the non-finite pattern of the reference's masked
    product (a NaN or infinite dy reaches the whole window); a dy on the wrong element is still
    far outside it."""
    x, dy = inputs
    _, k, stride, pb, _, out = pool_params("max_pool2d_backward", x.shape, {**attrs, "kind": "max"})
    n, c, h, w = x.shape
    ti, tj = np.divmod(np.arange(k[0] * k[1]), k[1])
    rows = np.arange(out[0]).reshape(-1, 1, 1) * stride[0] - pb[0] + ti.reshape(1, 1, -1)
    cols = np.arange(out[1]).reshape(1, -1, 1) * stride[1] - pb[1] + tj.reshape(1, 1, -1)
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)  # [oh, ow, taps]
    plane = np.arange(n * c).reshape(n, c, 1, 1, 1) * (h * w)
    index = np.where(inside, plane + rows * w + cols, x.size)  # [n, c, oh, ow, taps]
    upd = np.broadcast_to(dy[..., None], index.shape)
    b = scatter_add_bound([upd.reshape(-1), index.reshape(-1)], {"out_dim": x.size + 1}, out_dtype)
    return b.map(lambda v: np.asarray(v)[:x.size].reshape(x.shape))


# -- AttentionBackward -----------------------------------------------------------------------------
ATTENTION_BACKWARD_REASON = (
    "attention's VJP bound (its gradient cases' judge): gamma_(terms + 8)(u) * M, M = |J|^T |dy| "
    "through the rule's chain in absolute values plus the rounding of the recomputed scores and "
    "weights, terms = D (Sk + 1) + Sk + 4; plus the float64 reference's share")


def _attention_backward_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str,
                              wrt: int) -> np.ndarray:
    """The cotangent of q, k or v (``wrt``) is attention's VJP for that input, and is judged as the
    attention gradient cases judge it (run/derivatives.py): derivative_bound over attention's
    derivative magnitude (judge/bounds/nn.attention_magnitude, one copy with the reference's
    DerivativeRule.magnitude): the scores, the softmax Jacobian P (dP - rowsum(dP P)), the
    softcap's slope and the products with K, Q or dy, each factor by its magnitude, the weights
    raised by their own rounding (a recomputing backward rounds them as the forward does), and
    terms = the most products one result element accumulates (a dq or dk element: every score
    of its row or column, each a length-D dot product; a dv element: Sq weights). u is the
    compute dtype's (float32 for float16/bfloat16, as for attention itself); the dtype's max_ulp
    covers the final rounding. The reference evaluates the same rule in float64: gamma at u of
    float64 on the same magnitude."""
    q, k, v, mask, dy = (np.asarray(a, np.float64) for a in inputs)
    mags, terms = attention_magnitude([q, k, v, mask], attrs, "vjp", [dy])
    m = mags[wrt]
    return derivative_bound("attention", out_dtype, m, terms) + derivative_bound("attention", "float64", m, terms)


def attention_backward_q_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """dq = scale dS K: :func:`_attention_backward_bound` for q."""
    return _attention_backward_bound(inputs, attrs, out_dtype, 0)


def attention_backward_k_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """dk = scale dS^T Q, GQA heads summed: :func:`_attention_backward_bound` for k."""
    return _attention_backward_bound(inputs, attrs, out_dtype, 1)


def attention_backward_v_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """dv = P^T dy, GQA heads summed: :func:`_attention_backward_bound` for v."""
    return _attention_backward_bound(inputs, attrs, out_dtype, 2)


# -- LayerNorm/RmsNorm/GroupNorm/BatchNormInference backward ---------------------------------------
NORM_BACKWARD_REASON = (
    "the norm's VJP bound (its gradient cases' judge): gamma_(terms + 8)(u) * M, M = |J|^T |dy| "
    "with |xhat| raised by its rounding error (judge/bounds/norm_grad.py), terms = the group size "
    "or the rows summed, + 6; plus the float64 reference's share; dbeta: reduce_sum's bound; NaN "
    "exact, infinities and overflow order-dependent")


def norm_backward(forward: str, wrt: str) -> Callable[..., Bound]:
    """The bound of ``forward``'s VJP with respect to ``wrt`` (x, gamma or beta) as an op of
    (forward inputs..., dy): norm_grad.norm_backward_bound over the forward's VJP magnitude
    (one copy with the reference backend's DerivativeRule.magnitude), batch norm's and the
    channel sums' (dbeta) of their own."""
    def bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
        if forward == "batch_norm_inference":
            return ng.batch_norm_backward_bound(inputs, attrs, wrt, out_dtype)
        x, g, _, dy = inputs
        eps = attrs["eps"]
        if forward == "group_norm":
            groups = attrs["num_groups"]
            if wrt == "beta":
                return ng.channel_sum_bound(np.asarray(dy, np.float64), 1, out_dtype)
            return ng.norm_backward_bound(
                [x, g, dy], ng.group_layout(x, groups) if x.size else None, eps, False, wrt, forward,
                lambda x0, g0, u: ng.group_vjp_magnitude(x0, g0, u, groups, eps), out_dtype)
        rms = forward == "rms_norm"
        axes = tuple(range(attrs["axis"] % x.ndim, x.ndim))
        return ng.norm_backward_bound(
            [x, g, dy], ng.trailing_layout(x, attrs["axis"]) if x.size else None, eps, rms, wrt, forward,
            lambda x0, g0, u: ng.trailing_vjp_magnitude(x0, g0, u, axes, eps, rms), out_dtype)
    return bound
