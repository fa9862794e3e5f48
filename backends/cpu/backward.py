"""Reference kernels of the backward ops (ops/backward.py): the forward op's verified reference
VJP rule (BACKEND.run_vjp: float64, checked by tests/test_reference_derivatives.py against finite
differences, the JVP rule and MPFR), taken for one forward input and rounded once to the output
dtype, so a backward op and the gradient cases of its forward share one definition."""
from __future__ import annotations

import numpy as np

from rlx_conformance.backends.cpu import BACKEND

kernel = BACKEND.kernel


def _vjp(forward: str, inputs: list[np.ndarray], attrs: dict, dy: np.ndarray, wrt: int) -> np.ndarray:
    """The cotangent of forward input ``wrt`` for the output cotangent ``dy``, in the dtype of
    that input."""
    grads = BACKEND.run_vjp(forward, inputs, attrs, [dy])
    return np.asarray(grads[wrt]).astype(inputs[wrt].dtype)


@kernel("relu_backward")
def relu_backward(x, dy):
    return _vjp("relu", [x], {}, dy, 0)


@kernel("activation_backward")
def activation_backward(x, dy, *, activation):
    return _vjp(activation, [x], {}, dy, 0)


def _conv_attrs(kernel_size, stride, padding, dilation, groups) -> dict:
    return {"kernel_size": kernel_size, "stride": stride, "padding": padding, "dilation": dilation,
            "groups": groups}


@kernel("conv2d_backward_input")
def conv2d_backward_input(x, w, bias, dy, *, kernel_size, stride, padding, dilation, groups):
    return _vjp("conv", [x, w, bias], _conv_attrs(kernel_size, stride, padding, dilation, groups), dy, 0)


@kernel("conv2d_backward_weight")
def conv2d_backward_weight(x, w, bias, dy, *, kernel_size, stride, padding, dilation, groups):
    return _vjp("conv", [x, w, bias], _conv_attrs(kernel_size, stride, padding, dilation, groups), dy, 1)


@kernel("cumsum_backward")
def cumsum_backward(x, dy, *, axis, exclusive, reverse):
    return _vjp("cumsum", [x], {"axis": axis, "exclusive": exclusive, "reverse": reverse}, dy, 0)


@kernel("gather_backward")
def gather_backward(x, indices, dy, *, axis):
    return _vjp("gather", [x, indices], {"axis": axis}, dy, 0)


@kernel("rope_backward")
def rope_backward(x, cos, sin, dy, *, head_dim, n_rot, style):
    return _vjp("rope", [x, cos, sin], {"head_dim": head_dim, "n_rot": n_rot, "style": style}, dy, 0)


@kernel("softmax_cross_entropy_backward")
def softmax_cross_entropy_backward(logits, targets, dy):
    return _vjp("softmax_cross_entropy", [logits, targets], {}, dy, 0)


@kernel("max_pool2d_backward")
def max_pool2d_backward(x, dy, *, kernel_size, stride, padding):
    attrs = {"kind": "max", "kernel_size": kernel_size, "stride": stride, "padding": padding}
    return _vjp("pool", [x], attrs, dy, 0)


@kernel("attention_backward_q")
def attention_backward_q(q, k, v, mask, dy, *, num_heads, head_dim, mask_kind, window, score_scale,
                         logit_softcap):
    attrs = dict(num_heads=num_heads, head_dim=head_dim, mask_kind=mask_kind, window=window,
                 score_scale=score_scale, logit_softcap=logit_softcap)
    return _vjp("attention", [q, k, v, mask], attrs, dy, 0)


@kernel("attention_backward_k")
def attention_backward_k(q, k, v, mask, dy, *, num_heads, head_dim, mask_kind, window, score_scale,
                         logit_softcap):
    attrs = dict(num_heads=num_heads, head_dim=head_dim, mask_kind=mask_kind, window=window,
                 score_scale=score_scale, logit_softcap=logit_softcap)
    return _vjp("attention", [q, k, v, mask], attrs, dy, 1)


@kernel("attention_backward_v")
def attention_backward_v(q, k, v, mask, dy, *, num_heads, head_dim, mask_kind, window, score_scale,
                         logit_softcap):
    attrs = dict(num_heads=num_heads, head_dim=head_dim, mask_kind=mask_kind, window=window,
                 score_scale=score_scale, logit_softcap=logit_softcap)
    return _vjp("attention", [q, k, v, mask], attrs, dy, 2)



# -- LayerNorm/RmsNorm/GroupNorm/BatchNormInference backward: the norms' reference VJP rules -------
@kernel("layer_norm_backward_input")
def layer_norm_backward_input(x, gamma, beta, dy, *, axis, eps):
    return _vjp("layer_norm", [x, gamma, beta], {"axis": axis, "eps": eps}, dy, 0)


@kernel("layer_norm_backward_gamma")
def layer_norm_backward_gamma(x, gamma, beta, dy, *, axis, eps):
    return _vjp("layer_norm", [x, gamma, beta], {"axis": axis, "eps": eps}, dy, 1)


@kernel("rms_norm_backward_input")
def rms_norm_backward_input(x, gamma, beta, dy, *, axis, eps):
    return _vjp("rms_norm", [x, gamma, beta], {"axis": axis, "eps": eps}, dy, 0)


@kernel("rms_norm_backward_gamma")
def rms_norm_backward_gamma(x, gamma, beta, dy, *, axis, eps):
    return _vjp("rms_norm", [x, gamma, beta], {"axis": axis, "eps": eps}, dy, 1)


@kernel("group_norm_backward_input")
def group_norm_backward_input(x, gamma, beta, dy, *, num_groups, eps):
    return _vjp("group_norm", [x, gamma, beta], {"num_groups": num_groups, "eps": eps}, dy, 0)


@kernel("group_norm_backward_gamma")
def group_norm_backward_gamma(x, gamma, beta, dy, *, num_groups, eps):
    return _vjp("group_norm", [x, gamma, beta], {"num_groups": num_groups, "eps": eps}, dy, 1)


@kernel("group_norm_backward_beta")
def group_norm_backward_beta(x, gamma, beta, dy, *, num_groups, eps):
    return _vjp("group_norm", [x, gamma, beta], {"num_groups": num_groups, "eps": eps}, dy, 2)


@kernel("batch_norm_inference_backward_input")
def batch_norm_inference_backward_input(x, gamma, beta, mean, var, dy, *, eps):
    return _vjp("batch_norm_inference", [x, gamma, beta, mean, var], {"eps": eps}, dy, 0)


@kernel("batch_norm_inference_backward_gamma")
def batch_norm_inference_backward_gamma(x, gamma, beta, mean, var, dy, *, eps):
    return _vjp("batch_norm_inference", [x, gamma, beta, mean, var], {"eps": eps}, dy, 1)


@kernel("batch_norm_inference_backward_beta")
def batch_norm_inference_backward_beta(x, gamma, beta, mean, var, dy, *, eps):
    return _vjp("batch_norm_inference", [x, gamma, beta, mean, var], {"eps": eps}, dy, 2)
