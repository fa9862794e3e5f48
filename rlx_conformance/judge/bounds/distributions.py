"""Distribution judges for the random ops (Policy.check). Random streams differ between libraries
by design, so a backend's sample is judged against the distribution, not against the reference's
sample: support, the first two moments (z-tests) and a Kolmogorov-Smirnov test, each at a false
alarm rate of ALPHA per case. Determinism for a fixed key (same key, same bits) is a property of
one backend and is tested by running it twice (tests/test_signal.py)."""
from __future__ import annotations

import math

import numpy as np
from scipy import special

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.compare import Comparison

ALPHA = 1e-6  # per-test false alarm rate: a correct backend fails one case in a million
Z = float(special.ndtri(1 - ALPHA / 2))  # two-sided z threshold (~4.89)
REASON = (f"library streams differ: support, mean and variance z-tests and a Kolmogorov-Smirnov "
          f"test, each at false-alarm rate {ALPHA:g}")


def _shape_ok(expected, actual) -> Comparison | None:
    (e,), (a,) = expected, actual
    if e.shape != a.shape or e.dtype != a.dtype:
        return Comparison(False, message=f"output: {a.dtype}{a.shape} != expected {e.dtype}{e.shape}")
    return None


def _ks(z: np.ndarray, dist: str, slack: float, what: str) -> Comparison:
    """KS statistic of z against scipy.stats' ``dist`` (its standard form); the discretization of
    a low-precision output moves the empirical CDF by up to ``slack``, which is granted before the
    p-value is taken."""
    # imported here, not with the module: the op registry imports this module, and scipy.stats
    # was 1.8 s of every command's start (`rlx-conformance run --help` took 4 s) for two ops
    from scipy import stats

    n = z.size
    d = float(stats.kstest(z.ravel(), getattr(stats, dist).cdf).statistic)
    p = float(stats.kstwo.sf(max(d - slack, 0.0), n))
    ok = p >= ALPHA
    return Comparison(ok, checked=n, mismatches=0 if ok else 1, max_abs_err=d,
                      message="" if ok else f"{what}: Kolmogorov-Smirnov D = {d:.4g} (slack "
                      f"{slack:.2g}), p = {p:.3g} < {ALPHA:g}: not the declared distribution")


def _moment(value: float, mean: float, sd: float, what: str) -> Comparison:
    ok = abs(value - mean) <= Z * sd
    return Comparison(ok, max_abs_err=abs(value - mean), mismatches=0 if ok else 1, checked=1,
                      message="" if ok else f"{what} = {value:.6g}, expected {mean:.6g} +- "
                      f"{Z * sd:.3g} (z-test at {ALPHA:g})")


def _half_spacing(values: np.ndarray, dtype: str) -> np.ndarray:
    """Half the spacing of the output dtype at each value (the rounding of the output), float64."""
    fi = dt.finfo(dtype)
    ax = np.maximum(np.abs(values), fi.tiny)
    return np.exp2(np.floor(np.log2(ax)) - fi.mant_bits) / 2


def uniform_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """Uniform on [low, high): every value in range (high itself only after rounding to a
    low-precision output dtype), (v - low)/(high - low) ~ U(0, 1): mean 1/2, variance 1/12, KS."""
    bad = _shape_ok(expected, actual)
    if bad:
        return [bad]
    low, high, _ = (np.asarray(x, np.float64) for x in inputs)
    (a,) = actual
    name = dt.name_of(a.dtype)
    v = a.astype(np.float64)
    lo, hi = np.broadcast_to(low, v.shape), np.broadcast_to(high, v.shape)
    low_prec = name in ("float16", "bfloat16")
    inside = np.isfinite(v) & (v >= lo) & ((v <= hi) if low_prec else (v < hi))
    out = [Comparison(bool(inside.all()), mismatches=int((~inside).sum()), checked=v.size,
                      message="" if inside.all() else
                      f"support: {int((~inside).sum())} values outside [low, high"
                      f"{']' if low_prec else ')'}, e.g. {v[~inside].flat[0]!r}")]
    if v.size < 2:
        return out
    z = (v - lo) / (hi - lo)
    n = z.size
    out.append(_moment(float(z.mean()), 0.5, math.sqrt(1 / 12 / n), "mean of (v - low)/(high - low)"))
    out.append(_moment(float(z.var()), 1 / 12, math.sqrt((1 / 80 - 1 / 144) / n),
                       "variance of (v - low)/(high - low)"))
    slack = float(np.max(_half_spacing(v, name) / (hi - lo)))
    out.append(_ks(z, "uniform", slack, "uniform"))
    return out


def normal_check(inputs, attrs, expected, actual) -> list[Comparison]:
    """mean + scale * N(0, 1): finite, (v - mean)/scale has mean 0, variance 1, and passes KS."""
    bad = _shape_ok(expected, actual)
    if bad:
        return [bad]
    mean, scale, _ = (np.asarray(x, np.float64) for x in inputs)
    (a,) = actual
    name = dt.name_of(a.dtype)
    v = a.astype(np.float64)
    fin = np.isfinite(v)
    out = [Comparison(bool(fin.all()), mismatches=int((~fin).sum()), checked=v.size,
                      message="" if fin.all() else f"support: {int((~fin).sum())} non-finite values")]
    if v.size < 2 or not fin.all():
        return out
    mu, sc = np.broadcast_to(mean, v.shape), np.broadcast_to(scale, v.shape)
    z = (v - mu) / sc
    n = z.size
    out.append(_moment(float(z.mean()), 0.0, math.sqrt(1 / n), "mean of (v - mean)/scale"))
    out.append(_moment(float(z.var()), 1.0, math.sqrt(2 / n), "variance of (v - mean)/scale"))
    # the standard normal density is at most 1/sqrt(2 pi)
    slack = float(np.max(_half_spacing(v, name) / sc)) / math.sqrt(2 * math.pi)
    out.append(_ks(z, "norm", slack, "normal"))
    return out
