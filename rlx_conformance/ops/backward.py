"""RLX's explicit backward ops (docs/ops.md, family ``backward``): the gradient kernels RLX's IR
emits for training graphs (ReluBackward, ActivationBackward, Conv2dBackwardInput/Weight,
CumsumBackward, GatherBackward, RopeBackward, SoftmaxCrossEntropyBackward, MaxPool2dBackward),
declared as ops so that they get the forward matrix's treatment: every dtype, shape family,
mode and device, validate, and the kink points. Not declared yet, though their forwards are in
the registry: LayerNorm/RmsNorm/GroupNorm/BatchNormInference backward (input, gamma, beta) and
AttentionBackward, which need componentwise error bounds of their own.

Each takes its forward op's inputs, as RLX's backward kinds take them, plus the output cotangent
``dy`` (the forward output's shape), and returns the cotangent of one forward input. The CPU
reference is the forward op's verified reference VJP rule (backends/cpu/backward.py); the MLX
kernels are written as RLX's MLX backend lowers these kinds, from MLX primitives
(backends/mlx/backward.py), never through mx.vjp of the forward. Judging: judge/bounds/backward.py
(a linear op's backward is a linear op and is bounded as one).
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import backward as bounds
from rlx_conformance.spec.registry import REGISTRY, Attr, Input, OpSpec, Policy, declare
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
               Attr("padding", "ints", default=(), sweep=((), (1,)), doc="() = 0; symmetric"),
               Attr("dilation", "ints", default=(), sweep=((), (2,)), doc="() = 1"),
               Attr("groups", "int", default=1, sweep=(1, 2)))
_CONV_INPUTS = (Input("x", domain="conv_x", ranks=(4, 4)), Input("w", domain="conv_w", ranks=(4, 4)),
                Input("bias", domain="conv_w", ranks=(1, 1)), Input("dy", domain="conv_w", ranks=(4, 4)))


def _conv_infer(wrt: int):
    fwd = _forward_infer("conv", wrt, 3)

    def run(spec, shapes, dtypes, attrs):
        if len(attrs["padding"]) > 2:
            raise SpecError(f"{spec.name}: padding is symmetric (one value per dim)")
        return fwd(spec, shapes, dtypes, attrs)
    return run


declare(not_differentiable=NOT_DIFF, name="conv2d_backward_input", family="backward",
        doc="Conv2dBackwardInput: dx of conv (NCHW, 2-D) = conv_transpose2d(dy, w) with the conv's "
            "stride, padding, dilation, groups; x only gives the shape",
        inputs=_CONV_INPUTS, dtypes=FLOATS, attrs=_CONV_ATTRS, infer=_conv_infer(0),
        shapes="conv2d_backward", values=("random",),
        error_inputs=_bad_dy(_f32(1, 1, 5, 5), _f32(1, 1, 3, 3), _f32(0), _f32(1, 1, 2, 2)),
        policy=Policy(bound=bounds.conv_backward_input_bound,
                      bound_reason="a transposed convolution: gamma_K * sum|w||dy|, K = "
                      "Cout/groups * prod(kernel)"))

declare(not_differentiable=NOT_DIFF, name="conv2d_backward_weight", family="backward",
        doc="Conv2dBackwardWeight: dw of conv (NCHW, 2-D) = the correlation of x with dy over the "
            "batch and output positions; w only gives the shape",
        inputs=_CONV_INPUTS, dtypes=FLOATS, attrs=_CONV_ATTRS, infer=_conv_infer(1),
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
