"""Normalization and attention (docs/ops.md): layer_norm, rms_norm, group_norm,
batch_norm_inference, attention, rope.

Each op is judged by a per-element error bound from a first-order rounding analysis of its
textbook algorithm (judge/bounds/nn.py), valid for any summation order, so a backend that
accumulates differently passes and one that loses accuracy (a one-pass variance, a softmax
without max subtraction) fails where the inputs make it matter (the ``spread`` class).

Conventions the spec fixes (the op docs below repeat them):
* layer_norm / rms_norm normalize over the trailing dims x.shape[axis:] (ONNX
  LayerNormalization); gamma and beta have exactly that shape.
* attention takes q [B, Sq, H*D], k and v [B, Sk, Hkv*D] (Hkv divides H: grouped-query
  attention), an optional mask (an empty array means none), and returns [B, Sq, H*D]. Query i
  sits at absolute position Sk - Sq + i: causal lets it see keys j <= Sk - Sq + i, sliding_window
  the last ``window`` of those. custom: a mask broadcastable to [B, H, Sq, Sk], nonzero = attend;
  bias: an additive mask of the same shapes. score_scale 0 means 1/sqrt(head_dim); logit_softcap
  c > 0 maps scores s to c*tanh(s/c) before masking. A query that may attend to no key has an
  undefined output.
* rope rotates the first n_rot dims of each head of x [..., S, H*head_dim] by the angles whose
  cos/sin tables [S, n_rot/2] are given: neox pairs dim k with k + n_rot/2, gptj pairs 2k with
  2k+1; the other head dims pass through.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds import nn as bounds
from rlx_conformance.judge.bounds.nn import attention_dims
from rlx_conformance.spec import infer
from rlx_conformance.spec.registry import (
    Attr,
    ErrorInputs,
    Infer,
    Input,
    OpSpec,
    Policy,
    declaration_helper,
    declare,
)
from rlx_conformance.spec.values import ACCUMULATION_CLASSES

FLOATS = dt.FLOATS


# -- shape inference ------------------------------------------------------------------------------
def _norm_infer(spec, shapes, dtypes, attrs):
    x, g, b = shapes
    if not x:
        raise SpecError(f"{spec.name}: needs rank >= 1, got a scalar")
    axis = infer.norm_axis(spec.name, attrs["axis"], len(x))
    want = tuple(x[axis:])
    for name, s in (("gamma", g), ("beta", b)):
        if tuple(s) != want:
            raise SpecError(f"{spec.name}: {name} has shape {s}, expected x.shape[axis:] = {want}")
    if attrs["eps"] < 0:
        raise SpecError(f"{spec.name}: eps={attrs['eps']} is negative")
    return [(x, dtypes[0])]


def _group_norm_infer(spec, shapes, dtypes, attrs):
    x, g, b = shapes
    if len(x) < 2:
        raise SpecError(f"{spec.name}: x must be [N, C, ...], got {x}")
    c, groups = x[1], attrs["num_groups"]
    if groups < 1 or c % groups:
        raise SpecError(f"{spec.name}: num_groups={groups} does not divide C={c}")
    for name, s in (("gamma", g), ("beta", b)):
        if tuple(s) != (c,):
            raise SpecError(f"{spec.name}: {name} has shape {s}, expected ({c},)")
    if attrs["eps"] < 0:
        raise SpecError(f"{spec.name}: eps={attrs['eps']} is negative")
    return [(x, dtypes[0])]


def _batch_norm_infer(spec, shapes, dtypes, attrs):
    x, *params = shapes
    if not x:
        raise SpecError(f"{spec.name}: x must have a feature dim (last), got a scalar")
    for name, s in zip(("gamma", "beta", "mean", "var"), params):
        if tuple(s) != (x[-1],):
            raise SpecError(f"{spec.name}: {name} has shape {s}, expected ({x[-1]},)")
    if attrs["eps"] < 0:
        raise SpecError(f"{spec.name}: eps={attrs['eps']} is negative")
    return [(x, dtypes[0])]


MASK_KINDS = ("none", "causal", "sliding_window", "custom", "bias")


def _attention_infer(spec, shapes, dtypes, attrs):
    q, k, v, mask = shapes
    attention_dims(spec.name, q, k, v, mask, attrs)
    return [(q, dtypes[0])]


def _attention_undefined(inputs, attrs):
    """Queries that may attend to no key (a custom mask of all zeros, or bias -inf everywhere)."""
    q, k, v, mask = inputs
    kind = attrs["mask_kind"]
    if kind not in ("custom", "bias"):
        return None
    b, sq, sk, h, _, d = attention_dims("attention", q.shape, k.shape, v.shape, mask.shape, attrs)
    m = np.broadcast_to(mask.astype(np.float64), (b, h, sq, sk))
    ok = (m != 0) if kind == "custom" else (m > -np.inf)
    dead = ~ok.any(-1)  # [b, h, sq]
    return np.repeat(np.transpose(dead, (0, 2, 1)), d, axis=-1)  # [b, sq, h*d]


def _rope_infer(spec, shapes, dtypes, attrs):
    x, c, s = shapes
    hd, nr = attrs["head_dim"], attrs["n_rot"]
    if len(x) < 2:
        raise SpecError(f"{spec.name}: x must be [..., S, heads*head_dim], got {x}")
    if hd < 1 or x[-1] % hd:
        raise SpecError(f"{spec.name}: x's last dim {x[-1]} is not a multiple of head_dim={hd}")
    if nr < 2 or nr % 2 or nr > hd:
        raise SpecError(f"{spec.name}: n_rot={nr} must be even and in [2, head_dim={hd}]")
    want = (x[-2], nr // 2)
    for name, t in (("cos", c), ("sin", s)):
        if tuple(t) != want:
            raise SpecError(f"{spec.name}: {name} has shape {t}, expected [S, n_rot/2] = {want}")
    return [(x, dtypes[0])]


# -- declarations ----------------------------------------------------------------------------------
LONG_KEYS = 256  # key lengths this long are for softmax accumulation, not attribute coverage


def _short_keys(values: tuple, long: tuple):
    """A shape-dependent sweep: full for short key sequences, short for long ones."""
    return lambda shapes: values if shapes[1][1] < LONG_KEYS else long


_EPS = Attr("eps", "float", default=1e-5, doc="added to the variance (mean square) before the root")
_AXIS = Attr("axis", "int", default=-1, sweep=(-1, -2, 0),
             doc="first normalized dim; normalizes x.shape[axis:]")
_NORM_INPUTS = (Input("x", domain="nn_x", ranks=(1, None)), Input("gamma", domain="nn_gamma", ranks=(1, None)),
                Input("beta", domain="nn_beta", ranks=(1, None)))
# Per-channel parameters [C] (group_norm, batch_norm_inference)
_CHANNEL_INPUTS = (Input("gamma", domain="nn_gamma", ranks=(1, 1)), Input("beta", domain="nn_beta", ranks=(1, 1)))


@declaration_helper
def norm(name: str, doc: str, *, attrs: tuple[Attr, ...], infer: Infer, shapes: str,
         bound: Callable[..., np.ndarray], bound_reason: str, error_inputs: ErrorInputs,
         inputs: tuple[Input, ...] = _NORM_INPUTS,
         values: tuple[str, ...] = ("random", "special", "spread") + ACCUMULATION_CLASSES) -> OpSpec:
    """A float normalization x, gamma, beta (+ extra inputs), judged by its error bound; the
    ``spread`` class (rows of large mean and small variance) shows a one-pass variance."""
    return declare(name=name, family="norm", doc=doc, inputs=inputs, dtypes=FLOATS, attrs=attrs,
                   infer=infer, shapes=shapes, values=values,
                   policy=Policy(bound=bound, bound_reason=bound_reason), error_inputs=error_inputs,
                   second_order=True)  # every norm has a reference HVP (backends/cpu/nn.py)


norm("layer_norm", "(x - mean) / sqrt(var + eps) * gamma + beta over x.shape[axis:] (ONNX "
     "LayerNormalization); gamma, beta of shape x.shape[axis:]",
     attrs=(_AXIS, _EPS), infer=_norm_infer, shapes="nn_norm",
     bound=bounds.layer_norm_bound, bound_reason="two-pass mean/variance rounding analysis, any "
     "summation order",
     error_inputs=lambda: [("gamma shape", [np.ones((2, 3), np.float32), np.ones(2, np.float32),
                                            np.ones(3, np.float32)], {"axis": -1})])
norm("rms_norm", "x / sqrt(mean(x^2) + eps) * gamma + beta over x.shape[axis:]; gamma, beta of "
     "shape x.shape[axis:]",
     attrs=(_AXIS, _EPS), infer=_norm_infer, shapes="nn_norm",
     bound=bounds.rms_norm_bound, bound_reason="mean-square rounding analysis, any summation order",
     error_inputs=lambda: [("beta shape", [np.ones((2, 3), np.float32), np.ones(3, np.float32),
                                           np.ones(2, np.float32)], {"axis": -1})])
norm("group_norm", "x [N, C, ...] split into num_groups groups of C/num_groups channels; each "
     "group (with its spatial dims) normalized like layer_norm, then per-channel gamma, beta [C]",
     inputs=(Input("x", domain="nn_x", ranks=(2, None)),) + _CHANNEL_INPUTS,
     attrs=(Attr("num_groups", "int", default=1, sweep=(1, 2, 32)), _EPS), infer=_group_norm_infer,
     shapes="nn_group_norm", bound=bounds.group_norm_bound,
     bound_reason="layer_norm's analysis per group",
     error_inputs=lambda: [("groups do not divide C", [np.ones((1, 6, 2), np.float32), np.ones(6, np.float32),
                                                       np.ones(6, np.float32)], {"num_groups": 4})])
norm("batch_norm_inference", "(x - mean) / sqrt(var + eps) * gamma + beta with running "
     "statistics; feature dim last",
     inputs=_NORM_INPUTS[:1] + _CHANNEL_INPUTS + (Input("mean", domain="nn_x", ranks=(1, 1)),
                                                  Input("var", domain="nn_var", ranks=(1, 1))),
     attrs=(_EPS,), infer=_batch_norm_infer, shapes="nn_batch_norm", values=("random", "special"),
     bound=bounds.batch_norm_bound, bound_reason="a few roundings, also for the folded "
     "scale/shift form",
     error_inputs=lambda: [("var shape", [np.ones((2, 3), np.float32)] + [np.ones(3, np.float32)] * 3
                            + [np.ones(2, np.float32)], {})])

declare(name="attention", family="attention",
        doc="softmax(scale * q k^T [softcapped] [masked]) v per head; q [B, Sq, H*D], k, v "
            "[B, Sk, Hkv*D]; mask empty unless mask_kind is custom (nonzero = attend) or bias "
            "(additive); causal/sliding_window put query i at key position Sk - Sq + i",
        inputs=(Input("q", domain="nn_qk", ranks=(3, 3)), Input("k", domain="nn_qk", ranks=(3, 3)),
                Input("v", domain="nn_v", ranks=(3, 3)), Input("mask", domain="nn_mask", ranks=(1, 4))),
        dtypes=FLOATS,
        attrs=(Attr("num_heads", "int", sweep=(1, 2, 4)),
               Attr("head_dim", "int", sweep=(8, 64)),
               Attr("mask_kind", "enum", default="none", choices=MASK_KINDS, sweep=MASK_KINDS),
               Attr("window", "int", default=0, sweep=(0, 3), doc="keys a sliding_window query sees"),
               Attr("score_scale", "float", default=0.0, sweep=_short_keys((0.0, 0.3), (0.0,)),
                    doc="0: 1/sqrt(head_dim)"),
               Attr("logit_softcap", "float", default=0.0, sweep=_short_keys((0.0, 5.0), (0.0, 5.0)),
                    doc="0: none")),
        infer=_attention_infer, shapes="nn_attention", values=("random",) + ACCUMULATION_CLASSES,
        undefined=_attention_undefined,
        policy=Policy(bound=bounds.attention_bound, bound_reason="score dot products (gamma_D), "
                      "softmax sensitivity and the weighted sum (gamma_Sk)"),
        error_inputs=lambda: [("heads do not fit", [np.ones((1, 2, 6), np.float32)] * 3 + [np.zeros(0, np.float32)],
                               {"num_heads": 4, "head_dim": 2}),
                              ("causal with Sq > Sk",
                               [np.ones((1, 3, 4), np.float32)] + [np.ones((1, 2, 4), np.float32)] * 2
                               + [np.zeros(0, np.float32)], {"num_heads": 1, "head_dim": 4, "mask_kind": "causal"})])

declare(name="rope", family="attention",
        doc="rotary embedding of the first n_rot dims of each head of x [..., S, H*head_dim] with "
            "tables cos, sin [S, n_rot/2]: neox pairs (k, k + n_rot/2), gptj pairs (2k, 2k+1)",
        inputs=(Input("x", domain="nn_x", ranks=(2, None)), Input("cos", domain="nn_trig", ranks=(2, 2)),
                Input("sin", domain="nn_trig", ranks=(2, 2))),
        dtypes=FLOATS,
        attrs=(Attr("head_dim", "int", sweep=(8, 64)), Attr("n_rot", "int", sweep=(8, 32, 64)),
               Attr("style", "enum", default="neox", choices=("neox", "gptj"), sweep=("neox", "gptj"))),
        infer=_rope_infer, shapes="nn_rope", values=("random", "special"),
        policy=Policy(bound=bounds.rope_bound, bound_reason="x1 c - x2 s: three roundings"),
        error_inputs=lambda: [("odd n_rot", [np.ones((2, 8), np.float32), np.ones((2, 1), np.float32),
                                             np.ones((2, 1), np.float32)], {"head_dim": 8, "n_rot": 3})])
