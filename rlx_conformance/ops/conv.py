"""Convolution and pooling (docs/ops.md): conv (1-D and 2-D), conv_transpose2d, pool (max and
avg).

Layouts (NCHW, as RLX): x [N, C, *spatial], conv weight [Cout, Cin/groups, *kernel],
conv_transpose2d weight [Cin, Cout/groups, kH, kW] (the transpose of a conv's), bias [Cout] or an
empty array for none. Spatial attributes are int tuples: () means the default (stride 1,
padding 0, dilation 1), one value applies to every spatial dim, otherwise one per dim; conv and
pool padding may also give 2*nd values (all begins, then all ends) for asymmetric padding. A conv
output position is y[o] = sum over the window of w * x + bias, with window starts o*stride -
pad_begin and taps dilation apart (cross-correlation, as every framework); output sizes are
floor((L + pads - dilation*(k-1) - 1) / stride) + 1 and must be >= 1.

Judging (judge/bounds/conv.py, with the attribute normalisation and the im2col formulation that
the bounds and the CPU reference share): each output is a sum of K = Cin/groups * prod(kernel)
products (+ bias), so any summation order is within gamma_K * sum|w||x| (+ u|bias|) of the exact
value (Higham 3.5). Max pooling is exact; average pooling is a sum of at most prod(kernel) terms
and one division.
"""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError
from rlx_conformance.judge.bounds.conv import (
    conv_bound,
    conv_params,
    conv_transpose_bound,
    pool_check,
    pool_params,
)
from rlx_conformance.spec.registry import Attr, Input, Policy, declare

FLOATS = dt.FLOATS


# -- shape inference ----------------------------------------------------------------------------
def _bias_ok(name, bias, cout):
    if tuple(bias) not in ((0,), (cout,)):
        raise SpecError(f"{name}: bias must be [{cout}] or empty (none), got {bias}")


def _conv_infer(spec, shapes, dtypes, attrs):
    x, w, b = shapes
    *_, cout, out = conv_params(spec.name, x, w, attrs)
    _bias_ok(spec.name, b, cout)
    return [((x[0], cout) + out, dtypes[0])]


def _conv_t_infer(spec, shapes, dtypes, attrs):
    x, w, b = shapes
    *_, cout, out = conv_params(spec.name, x, w, attrs, transposed=True)
    _bias_ok(spec.name, b, cout)
    return [((x[0], cout) + out, dtypes[0])]


def _pool_infer(spec, shapes, dtypes, attrs):
    (x,) = shapes
    *_, out = pool_params(spec.name, x, attrs)
    return [(tuple(x[:2]) + out, dtypes[0])]


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
        inputs=(Input("x", domain="conv_x", ranks=(3, 4)), Input("w", domain="conv_w", ranks=(3, 4)),
                Input("bias", domain="conv_w", ranks=(1, 1))),
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
        inputs=(Input("x", domain="conv_x", ranks=(4, 4)), Input("w", domain="conv_w", ranks=(4, 4)),
                Input("bias", domain="conv_w", ranks=(1, 1))),
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
        inputs=(Input("x", domain="conv_x", ranks=(3, 4)),), dtypes=FLOATS, grad_values=("ties",),
        attrs=(Attr("kind", "enum", default="max", choices=("max", "avg"), sweep=("max", "avg")),
               Attr("kernel_size", "ints", sweep=((3,), (16, 12))),
               Attr("stride", "ints", default=(), sweep=((), (1,)), doc="() = kernel_size"),
               Attr("padding", "ints", default=(), sweep=((), (1,)), doc="() = 0; at most half the window")),
        infer=_pool_infer, shapes="pool", values=("random", "special"),
        policy=Policy(check=pool_check, check_reason="max exact; avg gamma_(n+1) mean|x|"),
        error_inputs=lambda: [("padding over half the window", [np.ones((1, 1, 5), np.float32)],
                               {"kernel_size": (2,), "padding": (2,)})])
