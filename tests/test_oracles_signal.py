"""The CPU reference of fft against a direct O(n^2) DFT over the generated case matrix: every case
(every dtype, length, batch, direction and norm).

The oracle reads docs/ops.md (fft): a 1-D DFT along the axis before the trailing (real, imag) axis
of size 2; the forward transform uses e^{-2 pi i jk/n}, the inverse e^{+2 pi i jk/n}; ``norm``
scales the forward / inverse by backward (1, 1/n), ortho (1/sqrt n both) or forward (1/n, 1). It
is evaluated here in float64 with twiddles indexed by the exact integer phase jk mod n (a table of
n values of cos and sin, each within 1 ulp), so none of scipy.fft, numpy.fft or the harness's
bounds is used.

The bound, per output element k (n points, s the norm's scale, x the input pairs as complex):

    |ref_k - dft_k| <= u_out |dft_k| + 2 (L eta / (1 - L eta) + u_c) s sqrt(n) ||x||_2
                       + gamma_(n+2)(2^-53) s sum|x|

the first term the reference's final rounding to the output dtype; the second Higham's Theorem
24.2 (Accuracy and Stability of Numerical Algorithms, 2nd ed.) for any radix-2-like FFT in the
compute precision u_c (eta = 7 u_c, L = ceil(log2 n); ||y||_2 = s sqrt(n) ||x||_2 by Parseval),
taken with float32's u_c for the float32, float16 and bfloat16 cases whatever precision the
reference chose; the third the direct DFT's own float64 error (n products each with a twiddle
within 2 ulp, summed). A wrong direction, norm or axis is O(1) of the output's scale, far above it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, ETA, TARGET, assert_each_case
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
CHUNK = 256  # output rows per block of the twiddle matrix (4096 x 4096 at once would be 268 MB)


def scale(n: int, inverse: bool, norm: str) -> float:
    return {"backward": 1.0 if not inverse else 1.0 / n, "ortho": 1.0 / math.sqrt(n),
            "forward": 1.0 / n if not inverse else 1.0}[norm]


def dft(z: np.ndarray, inverse: bool) -> np.ndarray:
    """Direct DFT along the last axis of complex128 ``z``, twiddles from jk mod n."""
    n = z.shape[-1]
    m = np.arange(n)
    sign = 1.0 if inverse else -1.0
    table = np.cos(2 * np.pi * m / n) + 1j * sign * np.sin(2 * np.pi * m / n)
    out = np.empty(z.shape, np.complex128)
    for k0 in range(0, n, CHUNK):
        k = m[k0:k0 + CHUNK]
        w = table[(np.outer(k, m)) % n]  # [chunk, n]
        out[..., k0:k0 + CHUNK] = z @ w.T
    return out


def pairs(v: np.ndarray) -> np.ndarray:
    """(real, imag) pairs as complex, component by component (1j * inf would be nan + inf j)."""
    z = np.empty(v.shape[:-1], np.complex128)
    z.real, z.imag = v[..., 0], v[..., 1]
    return z


def check(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    (x,) = matrix.make_inputs(case)
    a = case.attr_dict
    if out is None:
        (out,) = CPU.run("fft", [x.copy()], a)
    out = np.asarray(out)
    if out.shape != x.shape or out.dtype != x.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {x.shape} {x.dtype}"
    x64 = x.astype(np.float64)
    z = pairs(x64)  # the transform axis is the one before the (real, imag) pair: last here
    n = z.shape[-1]
    s = scale(n, a["inverse"], a["norm"])
    key = (x.tobytes(), x.dtype.str, x.shape, a["inverse"])
    if key not in _DFT:  # the norms share one transform per input and direction
        _DFT.clear()
        _DFT[key] = dft(z, a["inverse"])
    want = _DFT[key] * s
    got64 = out.astype(np.float64)
    got = pairs(got64)
    uc = UNIT["float64"] if case.dtype == "float64" else UNIT["float32"]
    big_l = max(1, math.ceil(math.log2(n))) if n > 1 else 0
    eta = 7 * uc
    norm2 = np.sqrt((np.abs(z) ** 2).sum(axis=-1, keepdims=True))
    sum_abs = np.abs(z).sum(axis=-1, keepdims=True)
    g = (n + 2) * 2.0 ** -53 / (1 - (n + 2) * 2.0 ** -53)
    bound = (UNIT[case.dtype] * np.abs(want) + 2 * (big_l * eta / (1 - big_l * eta) + uc) * s * math.sqrt(n) * norm2
             + g * s * sum_abs + 2 * ETA[case.dtype])
    # the output dtype's overflow, per component: where the exact value less the bound rounds to
    # infinity, the reference must be that infinity; where the value plus the bound does, it may be
    free = np.zeros(want.shape, bool)
    for part in (np.real, np.imag):
        w, gp, b = part(want), part(got), bound
        with np.errstate(over="ignore"):
            must = np.isinf((np.abs(w) - b).clip(0).astype(out.dtype))
            may = np.isinf((np.abs(w) + b).astype(out.dtype))
        if not np.array_equal(gp[must], np.sign(w[must]) * np.inf):
            return "an exact component beyond the dtype's range is finite"
        if np.isinf(gp[~may]).any() or np.isnan(gp).any():
            return "non-finite output where the exact value is within range"
        free |= may
    err = np.where(free, 0.0, np.abs(got - want))
    over = err > bound
    if over.any():
        i = np.unravel_index(np.argmax(err / bound), err.shape)
        return (f"{int(over.sum())} elements over the bound; worst at {i}: got {got[i]}, want {want[i]}, "
                f"bound {bound[i]}")
    return None


_DFT: dict[tuple, np.ndarray] = {}
LONG = 1000


def cases() -> list[matrix.Case]:
    """Every case of the short families in every dtype; the long ones (n = 1031 and 4096) in
    float32 and float16 (the one whose unnormalized sums leave its range): every direction, norm
    and value class either way."""
    return [c for c in matrix.generate([TARGET], ops=["fft"])
            if c.shapes[0][-2] < LONG or c.dtype in ("float32", "float16")]


CASES = cases()


def test_fft_against_direct_dft() -> None:
    assert_each_case(CASES, check)


@pytest.mark.parametrize("wrong", ["direction", "norm", "conjugate"])
def test_the_oracle_rejects_a_wrong_fft(wrong: str) -> None:
    """The comparison can fail: the reference run with the other direction, the wrong norm, or its
    output conjugated is caught (on the cases where that changes the result: n > 1)."""
    caught = 0
    for case in (c for c in CASES if c.dtype == "float32" and 1 < c.shapes[0][-2] < LONG):
        (x,) = matrix.make_inputs(case)
        a = dict(case.attr_dict)
        if wrong == "direction":
            a["inverse"] = not a["inverse"]
        elif wrong == "norm":
            a["norm"] = {"backward": "forward", "forward": "ortho", "ortho": "backward"}[a["norm"]]
        (out,) = CPU.run("fft", [x.copy()], a)
        if wrong == "conjugate":
            out = out * np.array([1, -1], out.dtype)
        caught += check(case, out) is not None
    assert caught > 0
