"""MLX kernels of the backward ops (ops/backward.py), written as RLX's MLX backend lowers its
backward op kinds: from MLX primitives, never through mx.vjp of the forward (that is what the
gradient cases of the forward ops check). relu: a select on x > 0; the activations: their
derivative formulas; the conv input gradient: a transposed convolution of dy (mx.conv_transpose2d,
with the output_padding that restores x's size); the conv weight gradient: a convolution of x
with dy as the kernel (batch and channels swapped, the conv's stride as the kernel dilation),
per group; cumsum: a cumsum of dy the other way; gather: dy added into zeros at the indices;
rope: rope's own kernel with sin negated (the inverse rotation); softmax cross-entropy: dy times
softmax(logits) * sum(targets) - targets; max pooling: each window's first argmax (mx.argmax over the
window view) gets the window's dy, added back tap by tap into the padded input.

NCHW is transposed to MLX's channels-last here; the attributes are read with this module's own
code (as backends/mlx/conv.py does), none of the reference's geometry is imported.
"""
from __future__ import annotations

import math

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND
from rlx_conformance.backends.mlx.nn import rope as _rope

kernel = BACKEND.kernel


def _pair(values, default: int) -> list[int]:
    if len(values) == 0:
        return [default, default]
    if len(values) == 1:
        return [int(values[0])] * 2
    return [int(v) for v in values]


@kernel("relu_backward")
def relu_backward(x, dy):
    return mx.where(x > 0, dy, mx.zeros_like(dy))


_SQRT1_2 = 1 / math.sqrt(2)
_INV_SQRT_2PI = 1 / math.sqrt(2 * math.pi)
_C = math.sqrt(2 / math.pi)
_K = 0.044715


def _dact(name: str, x):
    """f'(x) of the activation, as its textbook formula."""
    if name == "sigmoid":
        s = mx.sigmoid(x)
        return s * (1 - s)
    if name == "tanh":
        t = mx.tanh(x)
        return 1 - t * t
    if name == "silu":
        s = mx.sigmoid(x)
        return s * (1 + x * (1 - s))
    if name == "gelu":
        return 0.5 * (1 + mx.erf(x * _SQRT1_2)) + x * mx.exp(-0.5 * x * x) * _INV_SQRT_2PI
    if name == "gelu_approx":
        t = mx.tanh(_C * (x + _K * x * x * x))
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * _K * x * x)
    raise ValueError(f"activation_backward: unknown activation {name!r}")


@kernel("activation_backward")
def activation_backward(x, dy, *, activation):
    return (dy * _dact(activation, x)).astype(dy.dtype)


@kernel("conv2d_backward_input")
def conv2d_backward_input(x, w, bias, dy, *, kernel_size, stride, padding, dilation, groups):
    """dx = conv_transpose2d(dy, w): w [Cout, Cin/g, kh, kw] read as a transposed conv's weight
    [Cin_t = Cout, Cout_t/g = Cin/g], regrouped to MLX's [Cin, kh, kw, Cout/g]."""
    cout, cg, kh, kw = w.shape
    og = cout // groups
    st, pd, dl = _pair(stride, 1), _pair(padding, 0), _pair(dilation, 1)
    outpad = [int(n - ((o - 1) * s - 2 * p + d * (k - 1) + 1))
              for n, o, s, p, d, k in zip(x.shape[2:], dy.shape[2:], st, pd, dl, (kh, kw))]
    wm = w.reshape(groups, og, cg, kh, kw).transpose(0, 2, 3, 4, 1).reshape(groups * cg, kh, kw, og)
    y = mx.conv_transpose2d(mx.moveaxis(dy, 1, -1), wm, stride=tuple(st), padding=tuple(pd),
                            dilation=tuple(dl), output_padding=tuple(outpad), groups=groups)
    return mx.moveaxis(y, -1, 1)


@kernel("conv2d_backward_weight")
def conv2d_backward_weight(x, w, bias, dy, *, kernel_size, stride, padding, dilation, groups):
    """dw[o, c, i, j] = sum_n,p,q dy[n, o, p, q] x_pad[n, c, p*s + i*d, q*s + j*d]: per group a
    convolution of x (channels as batch, batch as channels) with dy as the kernel, kernel
    dilation = the conv's stride, stride = its dilation, cropped to the kernel size."""
    cout, cg, kh, kw = w.shape
    og = cout // groups
    st, pd, dl = _pair(stride, 1), _pair(padding, 0), _pair(dilation, 1)
    xp = mx.pad(x, [(0, 0), (0, 0), (pd[0], pd[0]), (pd[1], pd[1])])
    parts = []
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg].transpose(1, 2, 3, 0)          # [Cin/g, H, W, N]
        ks = dy[:, g * og:(g + 1) * og].transpose(1, 2, 3, 0)          # [Cout/g, Ho, Wo, N]
        r = mx.conv_general(xs, ks, stride=dl, kernel_dilation=st)     # [Cin/g, kh', kw', Cout/g]
        parts.append(r[:, :kh, :kw, :].transpose(3, 0, 1, 2))          # [Cout/g, Cin/g, kh, kw]
    return parts[0] if groups == 1 else mx.concatenate(parts, axis=0)


@kernel("cumsum_backward")
def cumsum_backward(x, dy, *, axis, exclusive, reverse):
    return mx.cumsum(dy, axis=axis, reverse=not reverse, inclusive=not exclusive).astype(dy.dtype)


@kernel("gather_backward")
def gather_backward(x, indices, dy, *, axis):
    """The gather axis first, dy's index dims flattened, added into zero rows (duplicates
    accumulate), moved back."""
    a = axis % x.ndim
    s = x.shape[a]
    idx = indices.reshape(-1)
    idx = mx.where(idx < 0, idx + s, idx)
    lead = list(range(a, a + indices.ndim))
    rest = [d for d in range(dy.ndim) if d not in lead]
    upd = dy.transpose(lead + rest).reshape([idx.size] + [dy.shape[d] for d in rest])
    acc = mx.zeros([s] + [dy.shape[d] for d in rest], dtype=dy.dtype).at[idx].add(upd)
    return mx.moveaxis(acc, 0, a)


@kernel("rope_backward")
def rope_backward(x, cos, sin, dy, *, head_dim, n_rot, style):
    """The rotation's transpose: the forward rope kernel with sin negated."""
    return _rope(dy, cos, -sin, head_dim=head_dim, n_rot=n_rot, style=style)


@kernel("softmax_cross_entropy_backward")
def softmax_cross_entropy_backward(logits, targets, dy):
    p = mx.softmax(logits, axis=-1)
    total = mx.sum(targets, axis=-1, keepdims=True)
    return (mx.expand_dims(dy, -1) * (p * total - targets)).astype(logits.dtype)


@kernel("max_pool2d_backward")
def max_pool2d_backward(x, dy, *, kernel_size, stride, padding):
    """The window view of the -inf-padded input, each window's first argmax turned into its
    position in the padded input, dy scattered there with accumulation, the padding cut off."""
    kh, kw = (int(v) for v in kernel_size)
    st = [s or k for s, k in zip(_pair(stride, 0), (kh, kw))]
    lo, hi = _pool_padding(padding)
    n, c, h, w = x.shape
    oh, ow = dy.shape[2:]
    xp = mx.pad(x, [(0, 0), (0, 0), (lo[0], hi[0]), (lo[1], hi[1])], constant_values=-mx.inf)
    hp, wp = h + lo[0] + hi[0], w + lo[1] + hi[1]
    win = mx.as_strided(xp, (n, c, oh, ow, kh, kw), (c * hp * wp, hp * wp, st[0] * wp, st[1], wp, 1))
    first = mx.argmax(win.reshape(n, c, oh, ow, kh * kw), axis=-1)
    row = mx.arange(oh).reshape(1, 1, oh, 1) * st[0] + first // kw
    col = mx.arange(ow).reshape(1, 1, 1, ow) * st[1] + first % kw
    plane = (mx.arange(n).reshape(n, 1, 1, 1) * c + mx.arange(c).reshape(1, c, 1, 1)) * (hp * wp)
    grad = mx.zeros((n * c * hp * wp,), dtype=dy.dtype).at[(plane + row * wp + col).reshape(-1)].add(dy.reshape(-1))
    return grad.reshape(n, c, hp, wp)[:, :, lo[0]:lo[0] + h, lo[1]:lo[1] + w]


def _pool_padding(values) -> tuple[list[int], list[int]]:
    """(begins, ends): 4 values are the begins then the ends, anything else symmetric."""
    if len(values) == 4:
        return [int(v) for v in values[:2]], [int(v) for v in values[2:]]
    sym = _pair(values, 0)
    return sym, list(sym)
