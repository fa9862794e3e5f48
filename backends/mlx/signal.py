"""MLX kernels for fft, the random ops, quantization and the loss.

fft: mx.fft on complex64 built from the (real, imag) pairs. MLX has no complex128, so a
float64 FFT would run at single precision: float64 is not claimed. Random: mx.random with the key as
given (MLX's own threefry stream); mx.random.uniform rejects float64, so float64 uniforms are
built from 53 bits of two mx.random.randint draws. Quantization and the loss are compositions of MLX elementwise
ops and reductions (MLX's own mx.quantize is a group-wise affine format, not ONNX's).
"""
from __future__ import annotations

import mlx.core as mx

from rlx_conformance.backends.mlx import BACKEND, MX_DTYPES

kernel = BACKEND.kernel


@kernel("fft", dtypes=("float32", "float16", "bfloat16"),
        note="mx.fft.fft/ifft on complex64; MLX has no complex128, so float64 is not claimed")
def fft(x, *, inverse, norm):
    c = x[..., 0] + 1j * x[..., 1]
    y = (mx.fft.ifft if inverse else mx.fft.fft)(c, axis=-1, norm=norm)
    return mx.stack([mx.real(y), mx.imag(y)], axis=-1)


def _uniform01_f64(shape, key):
    """[0, 1) float64 from 53 random bits: 26 + 27 bits of two mx.random.randint draws."""
    k1, k2 = mx.random.split(key)
    hi = mx.random.randint(0, 2**26, tuple(shape), key=k1).astype(mx.float64)
    lo = mx.random.randint(0, 2**27, tuple(shape), key=k2).astype(mx.float64)
    return (hi * 2.0**27 + lo) * 2.0**-53


@kernel("rng_uniform", note="mx.random.uniform (float64: 53 bits from mx.random.randint, "
        "since mx.random.uniform rejects float64)")
def rng_uniform(low, high, key, *, shape):
    if low.dtype == mx.float64:
        return low + (high - low) * _uniform01_f64(shape, key)
    return mx.random.uniform(low, high, tuple(shape), dtype=low.dtype, key=key)


@kernel("rng_normal", note="mean + scale * mx.random.normal")
def rng_normal(mean, scale, key, *, shape):
    return mean + scale * mx.random.normal(tuple(shape), dtype=mean.dtype, key=key)



def _along(p, ndim: int, axis: int):
    """A per-tensor (0-D) or per-axis (1-D) quantization parameter, shaped to broadcast along
    ``axis`` of a rank-``ndim`` array. Read here, not imported: the CPU reference reads it with
    its own helper, so a mistake in one reading cannot agree with itself."""
    return p if p.ndim == 0 else p.reshape([p.shape[0] if d == axis % ndim else 1 for d in range(ndim)])


@kernel("quantize", note="composed: clip(round(x / scale) + zero_point) then cast")
def quantize(x, scale, zero_point, *, axis, to):
    lo, hi = (-128, 127) if to == "int8" else (0, 255)
    s = _along(scale, x.ndim, axis)
    z = _along(zero_point, x.ndim, axis).astype(x.dtype)
    return mx.clip(mx.round(x / s) + z, lo, hi).astype(MX_DTYPES[to])


@kernel("dequantize", note="composed: (x - zero_point) * scale")
def dequantize(x, scale, zero_point, *, axis):
    s = _along(scale, x.ndim, axis)
    z = _along(zero_point, x.ndim, axis)
    return (x.astype(mx.int32) - z.astype(mx.int32)).astype(scale.dtype) * s


@kernel("fake_quantize", note="composed: per-axis max |x|, divide, round, clip, multiply")
def fake_quantize(x, *, bits, axis):
    qmax = 2 ** (bits - 1) - 1
    others = [a for a in range(x.ndim) if a != axis % x.ndim]
    if x.size:
        amax = mx.max(mx.abs(x), axis=others, keepdims=True) if others else mx.abs(x)
    else:
        amax = mx.zeros([1] * x.ndim, dtype=x.dtype)
    s = amax / mx.array(qmax, dtype=x.dtype)
    y = mx.clip(mx.round(x / s), -qmax, qmax) * s
    return mx.where(s == 0, x, y)


@kernel("softmax_cross_entropy", note="composed: sum(targets * (logsumexp(logits) - logits))")
def softmax_cross_entropy(logits, targets):
    lse = mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.sum(targets * (lse - logits), axis=-1)
