"""RLX's explicit backward ops (docs/ops.md, family ``backward``): the gradient kernels RLX's IR
emits for training graphs (ReluBackward, ActivationBackward, Conv2dBackwardInput/Weight,
CumsumBackward, GatherBackward, RopeBackward, SoftmaxCrossEntropyBackward, MaxPool2dBackward,
AttentionBackward: one op per returned input, attention_backward_q/_k/_v), declared as ops so
that they get the forward matrix's treatment: every dtype, shape family, mode and device,
validate, and the kink points; and LayerNorm/RmsNorm backward (input, gamma), GroupNorm/
BatchNormInference backward (input, gamma, beta), one op per returned input, judged by the bound
of their forward's gradient cases (judge/bounds/norm_grad.py).

Each takes its forward op's inputs, as RLX's backward kinds take them, plus the output cotangent
``dy`` (the forward output's shape), and returns the cotangent of one forward input. The CPU
reference is the forward op's verified reference VJP rule (backends/cpu/backward.py); the MLX
kernels are written as RLX's MLX backend lowers these kinds, from MLX primitives
(backends/mlx/backward.py), never through mx.vjp of the forward. Judging: judge/bounds/backward.py
(a linear op's backward is a linear op and is bounded as one).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import backward as bounds
from rlx_conformance.spec.registry import (
    REGISTRY,
    Attr,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)
from rlx_conformance.spec.values import ACCUMULATION_CLASSES, make_array

FLOATS = dt.FLOATS
_DY = Input("dy", domain="real")
# Backward ops are not differentiated again as ops: their derivatives are the forward ops' second
# order, checked by the forward ops' hvp gradient cases.
NOT_DIFF = "an RLX backward kernel: its derivative is its forward op's second order (the forward's hvp cases)"


def _forward_infer(forward: str, wrt: int, n_forward: int):
    """Shape inference: the forward's own on the forward inputs, dy of its output's shape, and the
    result of input ``wrt``'s shape and dtype."""
    def run(spec: OpSpec, shapes, dtypes, attrs):
        fwd = REGISTRY[forward]
        if len(shapes) != n_forward + 1:
            raise SpecError(f"{spec.name}: expects {n_forward + 1} inputs, got {len(shapes)}")
        (out, _), = fwd.infer(fwd, shapes[:n_forward], dtypes[:n_forward], attrs)
        if tuple(shapes[-1]) != tuple(out):
            raise SpecError(f"{spec.name}: dy has shape {tuple(shapes[-1])}, expected the {forward} "
                            f"output's {tuple(out)}")
        return [(tuple(shapes[wrt]), dtypes[wrt])]
    return run


def _f32(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


def _bad_dy(*inputs: np.ndarray, attrs: dict | None = None):
    """Error inputs: the forward's inputs with a dy whose shape is not the forward output's."""
    return lambda: [("dy shape differs from the forward output", list(inputs), attrs or {})]


def _exact_policy() -> Policy:
    return Policy(exact=True)


declare(not_differentiable=NOT_DIFF, name="relu_backward", family="backward",
        doc="ReluBackward: dx = dy * relu'(x), relu'(x) = 1 for x > 0, else 0 (relu'(0) = 0, relu's "
            "reference rule); a NaN or infinite dy where x <= 0 gives NaN, as the product does",
        inputs=(Input("x", domain="real"), _DY), dtypes=FLOATS,
        infer=_forward_infer("relu", 0, 1), shapes="backward_elementwise", values=("random", "special", "kink"),
        error_inputs=_bad_dy(_f32(3), _f32(4)),
        policy=_exact_policy(), low_precision="native")

declare(not_differentiable=NOT_DIFF, name="activation_backward", family="backward",
        doc="ActivationBackward: dx = dy * f'(x) for the activation named by ``activation``",
        inputs=(Input("x", domain="sigmoid"), _DY), dtypes=FLOATS,
        attrs=(Attr("activation", "enum", choices=bounds.ACTIVATIONS, sweep=bounds.ACTIVATIONS),),
        infer=lambda spec, shapes, dtypes, attrs: _forward_infer(attrs["activation"], 0, 1)(
            spec, shapes, dtypes, {}),
        shapes="backward_elementwise", values=("random", "special"),
        error_inputs=_bad_dy(_f32(3), _f32(4), attrs={"activation": "tanh"}),
        policy=Policy(bound=bounds.activation_backward_bound,
                      bound_reason="gamma_16(u) * |dy| * (sum of |terms| of f' and their "
                      "sensitivity to the rounding of exp/erf/tanh arguments)"))

_CONV_ATTRS = (Attr("kernel_size", "ints", default=(), doc="() = the weight's"),
               Attr("stride", "ints", default=(), sweep=((), (2,)), doc="() = 1"),
               Attr("padding", "ints", default=(), sweep=((), (1,), (0, 2, 1, 0)),
                    doc="() = 0; 1 or 2 values: symmetric; 4: begins then ends (conv's)"),
               Attr("dilation", "ints", default=(), sweep=((), (2,)), doc="() = 1"),
               Attr("groups", "int", default=1, sweep=(1, 2)))
_CONV_INPUTS = (Input("x", domain="conv_x", ranks=(4, 4)), Input("w", domain="conv_w", ranks=(4, 4)),
                Input("bias", domain="conv_w", ranks=(1, 1)), Input("dy", domain="conv_w", ranks=(4, 4)))


declare(not_differentiable=NOT_DIFF, name="conv2d_backward_input", family="backward",
        doc="Conv2dBackwardInput: dx of conv (NCHW, 2-D) = conv_transpose2d(dy, w) with the conv's "
            "stride, padding, dilation, groups (asymmetric padding: the full transposed conv cropped "
            "from the begin padding); x only gives the shape",
        inputs=_CONV_INPUTS, dtypes=FLOATS, attrs=_CONV_ATTRS, infer=_forward_infer("conv", 0, 3),
        shapes="conv2d_backward", values=("random",),
        error_inputs=_bad_dy(_f32(1, 1, 5, 5), _f32(1, 1, 3, 3), _f32(0), _f32(1, 1, 2, 2)),
        policy=Policy(bound=bounds.conv_backward_input_bound,
                      bound_reason="a transposed convolution: gamma_K * sum|w||dy|, K = "
                      "Cout/groups * prod(kernel)"))

declare(not_differentiable=NOT_DIFF, name="conv2d_backward_weight", family="backward",
        doc="Conv2dBackwardWeight: dw of conv (NCHW, 2-D) = the correlation of x with dy over the "
            "batch and output positions; w only gives the shape",
        inputs=_CONV_INPUTS, dtypes=FLOATS, attrs=_CONV_ATTRS, infer=_forward_infer("conv", 1, 3),
        shapes="conv2d_backward", values=("random",),
        error_inputs=_bad_dy(_f32(1, 1, 5, 5), _f32(1, 1, 3, 3), _f32(0), _f32(1, 1, 2, 2)),
        policy=Policy(bound=bounds.conv_backward_weight_bound,
                      bound_reason="a correlation: gamma_K * sum|x||dy|, K = N * prod(output size)"))

declare(not_differentiable=NOT_DIFF, name="cumsum_backward", family="backward",
        doc="CumsumBackward: dx = cumsum of dy along axis in the other direction (same exclusive)",
        inputs=(Input("x", domain="real", ranks=(1, None)), Input("dy", domain="real", ranks=(1, None))),
        dtypes=FLOATS,
        attrs=(Attr("axis", "int", default=-1, sweep="axis"),
               Attr("exclusive", "bool", default=False, sweep=(False, True)),
               Attr("reverse", "bool", default=False, sweep=(False, True))),
        infer=_forward_infer("cumsum", 0, 1), shapes="backward_elementwise", values=("random", "special"),
        error_inputs=_bad_dy(_f32(2, 3), _f32(3, 2)),
        policy=Policy(bound=bounds.cumsum_backward_bound,
                      bound_reason="cumsum's bound on dy, scanned the other way"))


def _gen_gather_backward(stream, shapes, dtype, attrs, vals) -> list[np.ndarray]:
    """x and indices as gather's generator makes them from gather's own shape families; dy of
    the gather output's shape (it depends on the swept axis), from the value class. gather is
    looked up in the registry when called, not imported: importing ops.shape here would register
    the shape family before this one and reorder the registry (docs/ops.md, listings)."""
    x, idx = REGISTRY["gather"].generate(stream, shapes, dtype, attrs, vals)
    a = attrs["axis"] % x.ndim
    out = x.shape[:a] + idx.shape + x.shape[a + 1:]
    return [x, idx, make_array(stream(2), out, dtype, "real", vals, attrs)]


def _check_gather(inputs, attrs) -> None:
    REGISTRY["gather"].check_values(inputs[:2], attrs)


declare(not_differentiable=NOT_DIFF, name="gather_backward", family="backward",
        doc="GatherBackward: dx = zeros like x with dy's rows added at the gathered indices "
            "(duplicates accumulate)",
        inputs=(Input("x", ranks=(1, None)), Input("indices", dtypes=("int64", "int32"), role="index"),
                Input("dy", domain="real")),
        dtypes=FLOATS, attrs=(Attr("axis", "int", default=0, sweep="axis"),),
        infer=_forward_infer("gather", 0, 2), shapes="gather", values=("random", "special"),
        generate=_gen_gather_backward, check_values=_check_gather,
        uncovered=(("rank:dy=1", ("gather's own shape families (reused here) pair no rank-1 data "
                                  "with rank-1 indices; dy's rank is theirs")),),
        error_inputs=_bad_dy(_f32(5, 4), np.array([0, 1], np.int64), _f32(3, 4)),
        policy=Policy(bound=bounds.gather_backward_bound,
                      bound_reason="scatter_add's bound: 2*gamma_(m-1)*sum|dy| over the m rows "
                      "added into each"))


declare(not_differentiable=NOT_DIFF, name="rope_backward", family="backward",
        doc="RopeBackward: dx = dy rotated by the opposite angles (rope with sin negated: the "
            "transpose of each rotation)",
        inputs=(Input("x", domain="nn_x", ranks=(2, None)), Input("cos", domain="nn_trig", ranks=(2, 2)),
                Input("sin", domain="nn_trig", ranks=(2, 2)), Input("dy", domain="nn_x", ranks=(2, None))),
        dtypes=FLOATS,
        attrs=(Attr("head_dim", "int", sweep=(8, 64)), Attr("n_rot", "int", sweep=(8, 32, 64)),
               Attr("style", "enum", default="neox", choices=("neox", "gptj"), sweep=("neox", "gptj"))),
        infer=_forward_infer("rope", 0, 3), shapes="rope_backward",
        values=("random", "special"),
        error_inputs=_bad_dy(_f32(2, 8), _f32(2, 4), _f32(2, 4), _f32(2, 4), attrs={"head_dim": 8, "n_rot": 8}),
        policy=Policy(bound=bounds.rope_backward_bound,
                      bound_reason="rope's bound on dy with sin negated: three roundings"))


def _gen_xent_backward(stream, shapes, dtype, attrs, vals) -> list[np.ndarray]:
    """logits and targets as softmax_cross_entropy's generator makes them; dy per row."""
    logits, targets = REGISTRY["softmax_cross_entropy"].generate(stream, shapes, dtype, attrs, vals)
    return [logits, targets, make_array(stream(2), logits.shape[:-1], dtype, "real", vals, attrs)]


declare(not_differentiable=NOT_DIFF, name="softmax_cross_entropy_backward", family="backward",
        doc="SoftmaxCrossEntropyBackward: d logits = dy * (softmax(logits) * sum_c targets_c - "
            "targets), dy one per row (the loss's shape)",
        inputs=(Input("logits", ranks=(1, None)), Input("targets", ranks=(1, None)),
                Input("dy", domain="real", ranks=(0, None))),
        dtypes=FLOATS, infer=_forward_infer("softmax_cross_entropy", 0, 2), shapes="xent",
        generate=_gen_xent_backward,
        uncovered=(("rank:dy=3+", ("softmax_cross_entropy's own shape families (reused here) have "
                                   "logits of rank <= 3, so dy (one per row) of rank <= 2")),),
        values=("random", "special", "spread") + ACCUMULATION_CLASSES,
        error_inputs=_bad_dy(_f32(2, 3), _f32(2, 3), _f32(3)),
        policy=Policy(bound=bounds.xent_backward_bound,
                      bound_reason="|dy| (softmax's bound * |S| + |p| gamma_n sum|t| + 3u (|p S| + "
                      "|t|)), S = sum targets"))


declare(not_differentiable=NOT_DIFF, name="max_pool2d_backward", family="backward",
        doc="MaxPool2dBackward: each window's dy added to its first maximal element of x in "
            "row-major window order (pool's reference convention; padding never wins); "
            "overlapping windows accumulate",
        inputs=(Input("x", domain="conv_x", ranks=(4, 4)), Input("dy", domain="real", ranks=(4, 4))),
        dtypes=FLOATS,
        attrs=(Attr("kernel_size", "ints", sweep=((3, 3), (2, 2), (16, 12))),
               Attr("stride", "ints", default=(), sweep=((), (1,)), doc="() = kernel_size"),
               Attr("padding", "ints", default=(), sweep=((), (1,)), doc="() = 0; at most half the window")),
        infer=lambda spec, shapes, dtypes, attrs: _forward_infer("pool", 0, 1)(
            spec, shapes, dtypes, {**attrs, "kind": "max"}),
        shapes="max_pool2d_backward", values=("random", "special", "ties"),
        error_inputs=_bad_dy(_f32(1, 1, 4, 4), _f32(1, 1, 3, 3), attrs={"kernel_size": (2, 2)}),
        policy=Policy(bound=bounds.max_pool_backward_bound,
                      bound_reason="scatter_add's bound over the windows each element wins: "
                      "2*gamma_(m-1)*sum|dy|"))


# -- AttentionBackward ------------------------------------------------------------------------------
# attention's attributes (ops/nn.py) repeated: the family modules register alphabetically, so
# attention's declaration does not exist yet when this module runs; tests/test_backward_family.py
# checks that the two agree (names, defaults, choices and the sweep on every shape family here).
_ATTN_MASK_KINDS = ("none", "causal", "sliding_window", "custom", "bias")
_ATTN_LONG_KEYS = 256  # ops/nn.py LONG_KEYS: key lengths this long are for accumulation


def _attn_short_keys(values: tuple, long: tuple):
    """ops/nn.py _short_keys: a full sweep for short key sequences, a short one for long ones."""
    return lambda shapes: values if shapes[1][1] < _ATTN_LONG_KEYS else long


_ATTN_ATTRS = (Attr("num_heads", "int", sweep=(1, 2, 4)),
               Attr("head_dim", "int", sweep=(8, 64)),
               Attr("mask_kind", "enum", default="none", choices=_ATTN_MASK_KINDS, sweep=_ATTN_MASK_KINDS),
               Attr("window", "int", default=0, sweep=(0, 3), doc="keys a sliding_window query sees"),
               Attr("score_scale", "float", default=0.0, sweep=_attn_short_keys((0.0, 0.3), (0.0,)),
                    doc="0: 1/sqrt(head_dim)"),
               Attr("logit_softcap", "float", default=0.0, sweep=_attn_short_keys((0.0, 5.0), (0.0, 5.0)),
                    doc="0: none"))
_ATTN_INPUTS = (Input("q", domain="nn_qk", ranks=(3, 3)), Input("k", domain="nn_qk", ranks=(3, 3)),
                Input("v", domain="nn_v", ranks=(3, 3)), Input("mask", domain="nn_mask", ranks=(1, 4)),
                Input("dy", domain="real", ranks=(3, 3)))


def _attention_dq_undefined(inputs, attrs):
    """dq of a query that may attend to no key: attention's output there is undefined, so is its
    derivative (attention's own ``undefined``, looked up when called). Such a query passes no
    cotangent to k and v (the reference rule's convention), so dk and dv stay defined."""
    return REGISTRY["attention"].undefined(inputs[:4], attrs)


@declaration_helper
def _attention_backward(wrt: str, doc: str, bound: Callable[..., np.ndarray]) -> OpSpec:
    """attention_backward_<wrt>: one op per forward input it returns, as RLX's backward kinds
    and the other ops of this family are (conv2d_backward_input / _weight)."""
    extra = {"undefined": _attention_dq_undefined} if wrt == "q" else {}
    return declare(
        not_differentiable=NOT_DIFF, name=f"attention_backward_{wrt}", family="backward",
        doc=f"AttentionBackward, the cotangent of {wrt}: {doc}; P = softmax of attention's scores "
            "(its scale, softcap and mask), dS = P * (dP - rowsum(dP * P)) with dP = dy V^T, "
            "through the softcap's slope; a query with no key passes no cotangent",
        inputs=_ATTN_INPUTS, dtypes=FLOATS, attrs=_ATTN_ATTRS,
        infer=_forward_infer("attention", "qkv".index(wrt), 4), shapes="attention_backward",
        values=("random",), **extra,
        error_inputs=_bad_dy(_f32(1, 2, 8), _f32(1, 3, 8), _f32(1, 3, 8), _f32(0), _f32(1, 3, 8),
                             attrs={"num_heads": 1, "head_dim": 8}),
        policy=Policy(bound=bound, bound_reason=bounds.ATTENTION_BACKWARD_REASON))


_attention_backward("q", "dq = scale dS K (K repeated to the query heads)", bounds.attention_backward_q_bound)
_attention_backward("k", "dk = scale dS^T Q, the query heads of a shared (GQA) kv head summed",
                    bounds.attention_backward_k_bound)
_attention_backward("v", "dv = P^T dy, the query heads of a shared (GQA) kv head summed",
                    bounds.attention_backward_v_bound)


# -- LayerNorm/RmsNorm/GroupNorm/BatchNormInference backward -----------------------------------
_NORM_VALUES = ("random", "special", "spread") + ACCUMULATION_CLASSES
_NORM_EPS = Attr("eps", "float", default=1e-5, doc="added to the variance (mean square) before the root")
_NORM_AXIS = Attr("axis", "int", default=-1, sweep=(-1, -2, 0), doc="first normalized dim")
_NORM_IN = (Input("x", domain="nn_x", ranks=(1, None)), Input("gamma", domain="nn_gamma", ranks=(1, None)),
            Input("beta", domain="nn_beta", ranks=(1, None)), Input("dy", domain="real", ranks=(1, None)))
_GROUP_IN = (Input("x", domain="nn_x", ranks=(2, None)), Input("gamma", domain="nn_gamma", ranks=(1, 1)),
             Input("beta", domain="nn_beta", ranks=(1, 1)), Input("dy", domain="real", ranks=(2, None)))
_BATCH_IN = (Input("x", domain="nn_x", ranks=(1, None)), Input("gamma", domain="nn_gamma", ranks=(1, 1)),
             Input("beta", domain="nn_beta", ranks=(1, 1)), Input("mean", domain="nn_x", ranks=(1, 1)),
             Input("var", domain="nn_var", ranks=(1, 1)), Input("dy", domain="real", ranks=(1, None)))
_XHAT = "xhat = (x - mean) / sigma, sigma = sqrt(var + eps)"


@declaration_helper
def _norm_backward(name: str, forward: str, wrt: str, doc: str) -> OpSpec:
    """<forward>_backward_<wrt>: the cotangent of one of the norm's inputs, judged by
    judge/bounds/backward.norm_backward_bound."""
    n, inputs, attrs, family, values = {  # the forward's inputs, attributes and classes
        # (families: cases/shapes/backward.toml, the forward's with dy)
        "layer_norm": (3, _NORM_IN, (_NORM_AXIS, _NORM_EPS), "norm_backward", _NORM_VALUES),
        "rms_norm": (3, _NORM_IN, (_NORM_AXIS, _NORM_EPS), "norm_backward", _NORM_VALUES),
        "group_norm": (3, _GROUP_IN, (Attr("num_groups", "int", default=1, sweep=(1, 2, 32)), _NORM_EPS),
                       "group_norm_backward", _NORM_VALUES),
        "batch_norm_inference": (5, _BATCH_IN, (_NORM_EPS,), "batch_norm_backward", ("random", "special")),
    }[forward]
    f32 = [_f32(2, 3), _f32(3), _f32(3)] if forward != "group_norm" else [_f32(2, 3, 2), _f32(3), _f32(3)]
    if forward == "batch_norm_inference":
        f32 += [_f32(3), _f32(3)]
    bad = {"layer_norm": {"axis": -1}, "rms_norm": {"axis": -1}, "group_norm": {"num_groups": 1}}.get(forward, {})
    return declare(
        not_differentiable=NOT_DIFF, name=name, family="backward", doc=doc,
        inputs=inputs, dtypes=FLOATS, attrs=attrs,
        infer=_forward_infer(forward, ("x", "gamma", "beta").index(wrt), n),
        shapes=family, values=values,
        error_inputs=_bad_dy(*f32, _f32(3, 2), attrs=bad),
        policy=Policy(bound=bounds.norm_backward(forward, wrt), bound_reason=bounds.NORM_BACKWARD_REASON))


_norm_backward("layer_norm_backward_input", "layer_norm", "x",
               "LayerNormBackwardInput: dx = (g - mean(g) - xhat mean(g xhat)) / sigma over x.shape[axis:], "
               f"g = dy gamma, {_XHAT} (two-pass)")
_norm_backward("layer_norm_backward_gamma", "layer_norm", "gamma",
               f"LayerNormBackwardGamma: dgamma = sum over the leading dims x.shape[:axis] of dy xhat, {_XHAT}")
_norm_backward("rms_norm_backward_input", "rms_norm", "x",
               "RmsNormBackwardInput: dx = (g - xhat mean(g xhat)) / sigma over x.shape[axis:], g = dy gamma, "
               "xhat = x / sigma, sigma = sqrt(mean(x^2) + eps)")
_norm_backward("rms_norm_backward_gamma", "rms_norm", "gamma",
               "RmsNormBackwardGamma: dgamma = sum over the leading dims x.shape[:axis] of dy xhat, xhat = "
               "x / sqrt(mean(x^2) + eps)")
_norm_backward("group_norm_backward_input", "group_norm", "x",
               "GroupNormBackwardInput: per group of C/num_groups channels (with their spatial dims) "
               "dx = (g - mean(g) - xhat mean(g xhat)) / sigma, g = dy gamma[c], " + _XHAT + " per group")
_norm_backward("group_norm_backward_gamma", "group_norm", "gamma",
               "GroupNormBackwardGamma: dgamma[c] = sum over the batch and spatial dims of dy xhat (xhat per group)")
_norm_backward("group_norm_backward_beta", "group_norm", "beta",
               "GroupNormBackwardBeta: dbeta[c] = sum over the batch and spatial dims of dy")
_norm_backward("batch_norm_inference_backward_input", "batch_norm_inference", "x",
               "BatchNormInferenceBackwardInput: dx = dy gamma / sqrt(var + eps) (running statistics: "
               "no dependence through the mean and variance); feature dim last")
_norm_backward("batch_norm_inference_backward_gamma", "batch_norm_inference", "gamma",
               "BatchNormInferenceBackwardGamma: dgamma = sum over the leading dims of dy (x - mean) / "
               "sqrt(var + eps)")
_norm_backward("batch_norm_inference_backward_beta", "batch_norm_inference", "beta",
               "BatchNormInferenceBackwardBeta: dbeta = sum over the leading dims of dy")
