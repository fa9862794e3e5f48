"""Judges of the signal, quantization and loss ops (ops/signal.py); the random ops' distribution
tests are in judge/bounds/distributions.py.

fft: a normwise error bound of the FFT (Higham, *Accuracy and Stability of Numerical
Algorithms*, 2nd ed., sec. 24.1). Quantization: bit-exact, except where the quotient x/scale lies
within rounding error of a half-integer (a division and a multiplication by the reciprocal may
round to either neighbour). The loss: a log-sum-exp and summation bound.

The quantization parameter geometry (:func:`param_view`, :func:`fake_quantize_scale`) is here
too, below the declarations and both backends that use it: the judges need the same arrays.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma, uc
from rlx_conformance.judge.compare import ANYTHING, Bound, Comparison


# -- fft -----------------------------------------------------------------------------------------
def fft_stages(n: int) -> int:
    """Depth of the FFT's error analysis. Lengths whose prime factors are <= 7 run as mixed-radix
    Cooley-Tukey: at most ceil(log2 n) stages. Other lengths go through Bluestein's algorithm: a
    forward and an inverse FFT of a length m >= 2n - 1 plus two chirp products, 3 ceil(log2 m) + 4
    stages of the same kind (a conservative count)."""
    k = n
    for p in (2, 3, 5, 7):
        while k % p == 0:
            k //= p
    if k == 1:
        return max(1, math.ceil(math.log2(n))) if n > 1 else 1
    return 3 * math.ceil(math.log2(2 * n - 1)) + 4


def fft_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """Higham Thm 24.2: a computed FFT satisfies ||y^ - y||_2 <= L eta / (1 - L eta) ||y||_2 with L
    stages and eta = mu + gamma_4 (sqrt2 + mu) ~ 7u (mu: twiddle error ~ u). ||y||_2 =
    s sqrt(n) ||x||_2 (Parseval, s the norm scale), and each element's error is at most the error
    vector's 2-norm; the scaling adds one rounding. Two implementations differ by twice that.
    A NaN anywhere in a row makes every output of the row NaN (each output sums every input
    times a twiddle, and NaN * 0 is NaN too): exact. Rows with an infinity (inf * a twiddle that
    one algorithm rounds to 0 and another does not) or whose result may overflow are
    order-dependent, any outcome."""
    (x,) = inputs
    n = x.shape[-2]
    u = uc(out_dtype)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = np.sqrt(np.sum(x64 * x64, axis=(-2, -1), keepdims=True))
    s = {"backward": (1.0, 1.0 / n), "ortho": (n**-0.5, n**-0.5), "forward": (1.0 / n, 1.0)}
    scale = s[attrs["norm"]][1 if attrs["inverse"] else 0]
    le = fft_stages(n) * 7 * u
    rel = le / (1 - le) + u if le < 1 else np.inf
    ynorm = scale * math.sqrt(n) * norm
    big = dt.finfo(dt.compute_dtype(out_dtype)).max
    row_nan = np.isnan(x64).any(axis=(-2, -1), keepdims=True)
    bad = (~np.isfinite(norm) | (math.sqrt(n) * norm > big)) & ~row_nan
    bound = np.where(row_nan | bad, 0.0, 2 * rel * ynorm)
    return Bound(np.broadcast_to(bound, x.shape), np.broadcast_to(bad, x.shape), np.uint8(ANYTHING))


# -- quantization --------------------------------------------------------------------------------
def param_view(p, ndim: int, axis: int):
    """A per-tensor or per-axis parameter shaped to broadcast against an array of rank ndim (a
    numpy or an mlx array: both backends' quantize kernels use it)."""
    if p.ndim == 0:
        return p
    shape = [1] * ndim
    shape[axis % ndim] = p.shape[0]
    return p.reshape(shape)


def quotient_ties(x: np.ndarray, scale: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(exact, near): where x/scale is exactly a half-integer (the rounding rule decides, strictly
    judged), and where it is within 4 units of rounding of one without being one (x/scale computed
    as a division or as x * (1/scale) may round to either neighbour)."""
    x64 = x.astype(np.float64)
    s64 = np.asarray(scale, np.float64)
    with np.errstate(all="ignore"):
        r = x64 / s64
        k = np.floor(r)
        exact = np.isfinite(r) & ((k + 0.5) * s64 == x64)  # float products are exact in float64
        near = np.isfinite(r) & (np.abs(r - (k + 0.5)) <= 4 * uc(dtype) * np.abs(r)) & ~exact
    return exact, near


def quantize_check(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
                   expected: Sequence[np.ndarray], actual: Sequence[np.ndarray]) -> list[Comparison]:
    """Bit-exact, except: NaN inputs are undefined (a NaN has no integer), and at a near tie of
    x/scale the result may be either neighbour (one quantum apart)."""
    x, scale, _ = inputs
    (e,), (a,) = expected, actual
    if e.shape != a.shape or e.dtype != a.dtype:
        return [Comparison(False, message=f"output: {a.dtype}{a.shape} != expected {e.dtype}{e.shape}")]
    s = param_view(scale, x.ndim, attrs["axis"])
    _, near = quotient_ties(x, s, dt.name_of(x.dtype))
    diff = np.abs(e.astype(np.int64) - a.astype(np.int64))
    skip = np.isnan(x.astype(np.float64))
    bad = ~skip & ((diff > 1) | ((diff == 1) & ~near))
    res = Comparison(not bad.any(), max_abs_err=float(diff[~skip].max(initial=0)),
                     mismatches=int(bad.sum()), checked=int((~skip).sum()))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        res.message = (f"output: {res.mismatches}/{e.size} elements differ; first at flat {i}: "
                       f"x={x.flat[i]!r}, expected {e.flat[i]}, got {a.flat[i]}")
    return [res]


def fake_quantize_scale(x: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Per-slice scale amax / qmax (in x's dtype), amax = max |x| over every axis but ``axis``."""
    others = tuple(a for a in range(x.ndim) if a != axis % x.ndim)
    amax = np.max(np.abs(x), axis=others, keepdims=True) if x.size else np.zeros((1,) * x.ndim, x.dtype)
    return (amax / x.dtype.type(2 ** (bits - 1) - 1)).astype(x.dtype)


def fake_quantize_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> np.ndarray:
    """Where x/scale is within rounding error of a half-integer, the result may be either of two
    grid points one scale apart; elsewhere the tolerance covers scale's and the product's
    roundings."""
    (x,) = inputs
    c = dt.compute_dtype(out_dtype)
    xc = x.astype(dt.np_dtype(c))
    with np.errstate(all="ignore"):
        s = fake_quantize_scale(xc, attrs["bits"], attrs["axis"]).astype(np.float64)
        _, near = quotient_ties(xc, s, out_dtype)
        return np.where(near, np.broadcast_to(s, x.shape), 0.0)


# -- loss ----------------------------------------------------------------------------------------
def xent_error(inputs: Sequence[np.ndarray], u: float, depth: int) -> np.ndarray:
    """The log-sum-exp analysis of xent_bound with its sums of C terms at ``depth`` (C for the
    worst-case bound; the blocked depth D(C) for the accuracy budget, judge/budgets.py): per row,
    (depth + 3)u + 2u|lse| + u|m| on lse times sum|t|, plus gamma_(depth+2) times
    sum|t||lse - l| + |lse| sum|t| + sum|t l|. One implementation's; not doubled."""
    logits, t = (a.astype(np.float64) for a in inputs)
    with np.errstate(all="ignore"):
        m = np.max(logits, axis=-1, keepdims=True)
        lse = m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True))
        at = np.abs(t)
        st = at.sum(-1)
        return (st * ((depth + 3) * u + 2 * u * np.abs(lse[..., 0]) + u * np.abs(m[..., 0]))
                + gamma(depth + 2, u) * (np.sum(at * np.abs(lse - logits), -1) + np.abs(lse[..., 0]) * st
                                         + np.sum(at * np.abs(logits), -1)))


def xent_bound(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_dtype: str) -> Bound:
    """loss = sum_c t_c (lse - l_c), lse = m + log sum exp(l - m). The exps (a few u each), their
    sum (gamma_C) and the log put (C + 3)u + 2u|lse| + u|m| on lse; the products and the final sum
    add gamma_(C+2) times sum |t| |lse - l|, and the algebraically equal form lse sum t - sum t l
    gamma_(C+2) (|lse| sum|t| + sum |t l|). Twice the sum bounds two implementations. A NaN
    logit or target makes the row's loss NaN in every formulation: exact. Rows with an infinite
    input (whether t * (lse - l) meets 0 * inf depends on the formulation: log-softmax first, or
    lse sum t - sum t l) or logits near the overflow threshold are order-dependent, any outcome."""
    logits, t = (a.astype(np.float64) for a in inputs)
    big = dt.finfo(dt.compute_dtype(out_dtype)).max
    b = xent_error(inputs, uc(out_dtype), logits.shape[-1])
    with np.errstate(all="ignore"):
        nan = np.any(np.isnan(logits) | np.isnan(t), axis=-1)
        bad = ~nan & (~np.all(np.isfinite(logits) & np.isfinite(t), axis=-1) |
                      (np.max(np.abs(logits), axis=-1, initial=0.0) > big / 4))
    return Bound(np.where(nan | bad, 0.0, 2 * b), bad, np.uint8(ANYTHING))
