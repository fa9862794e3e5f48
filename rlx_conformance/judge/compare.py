"""Comparison of a backend's outputs with the reference: measured errors and a verdict.

ULP distance is counted in the output dtype by mapping each float's bits to an integer whose
order is the order of the reals (+0 and -0 map to the same point), so the distance across zero,
across signs and through the subnormals is the number of representable values between the two.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlx_conformance.core import dtypes as dt


def ordered_bits(x: np.ndarray) -> np.ndarray:
    """Float bits → uint64 whose order is the numeric order; +0 and -0 coincide. NaN is undefined."""
    name = dt.name_of(x.dtype)
    fi = dt.finfo(name)
    bits = np.ascontiguousarray(x).view(fi.uint).reshape(np.shape(x)).astype(np.uint64)
    sign = np.uint64(1) << np.uint64(fi.bits - 1)
    mag = bits & (sign - np.uint64(1))
    offset = np.uint64(1) << np.uint64(63)
    return np.where(bits & sign, offset - mag, offset + mag)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Number of representable values of the dtype between a and b, elementwise, as float64.
    Infinities count as one past max; NaN gives NaN."""
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance needs one dtype, got {a.dtype} and {b.dtype}")
    a, b = np.broadcast_arrays(a, b)
    oa, ob = ordered_bits(a), ordered_bits(b)
    d = np.where(oa > ob, oa - ob, ob - oa).astype(np.float64)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(a.astype(np.float64)) | np.isnan(b.astype(np.float64))
    return np.where(nan, np.nan, d)


def ulp_size(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of the dtype at |x| (the gap to the next representable magnitude), as float64."""
    fi = dt.finfo(dtype)
    ax = np.abs(np.asarray(x, np.float64))
    _, e = np.frexp(ax)  # exact exponent (log2 rounds up just below powers of two); finite for inf/NaN
    e = np.where(ax > 0, e.astype(np.float64) - 1, np.log2(fi.tiny))  # frexp(0) has exponent 0
    e = np.maximum(e, np.log2(fi.tiny))
    return np.exp2(e - fi.mant_bits)


@dataclass(frozen=True)
class Tolerance:
    """Pass when abs error <= atol OR rel error <= rtol OR ulp <= max_ulp (any one suffices)."""

    max_ulp: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0
    source: str = "default"

    def to_json(self) -> dict:
        return {"max_ulp": self.max_ulp, "rtol": self.rtol, "atol": self.atol, "source": self.source}


EXACT = Tolerance(source="exact")


@dataclass
class Comparison:
    ok: bool
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    max_ulp: float = 0.0
    mismatches: int = 0
    checked: int = 0
    message: str = ""
    worst_index: tuple[int, ...] | None = None
    notes: list[str] = field(default_factory=list)


def _flat_index(shape, i):
    return tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()


def compare(expected: np.ndarray, actual: np.ndarray, *, exact: bool, signed_zero: bool,
            tol: Tolerance, bound: np.ndarray | None = None,
            skip: np.ndarray | None = None, name: str = "output") -> Comparison:
    """Compare one output. ``bound``: per-element absolute error allowed (numerical analysis);
    NaN in the bound or True in ``skip`` leaves that element unasserted."""
    if expected.shape != actual.shape:
        return Comparison(False, message=f"{name}: shape {actual.shape} != expected {expected.shape}")
    if expected.dtype != actual.dtype:
        return Comparison(False, message=f"{name}: dtype {actual.dtype} != expected {expected.dtype}")
    n = expected.size
    mask = np.ones(expected.shape, bool)
    if skip is not None:
        mask &= ~np.broadcast_to(skip, expected.shape)
    if bound is not None:
        bound = np.broadcast_to(np.asarray(bound, np.float64), expected.shape)
        mask &= ~np.isnan(bound)
    name_dt = dt.name_of(expected.dtype)
    if not dt.is_float(name_dt):
        bad = (expected != actual) & mask
        nbad = int(bad.sum())
        res = Comparison(nbad == 0, mismatches=nbad, checked=int(mask.sum()))
        if nbad:
            i = int(np.flatnonzero(bad)[0])
            idx = _flat_index(expected.shape, i)
            res.worst_index = idx
            e64 = expected.astype(np.float64)
            a64 = actual.astype(np.float64)
            res.max_abs_err = float(np.max(np.abs(e64 - a64)[bad]))
            res.message = (f"{name}: {nbad}/{n} elements differ; first at {idx}: "
                           f"expected {expected.flat[i]!r}, got {actual.flat[i]!r}")
        return res

    e = expected.astype(np.float64)
    a = actual.astype(np.float64)
    e_nan, a_nan = np.isnan(e), np.isnan(a)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        abs_err = np.abs(e - a)
        rel_err = abs_err / np.abs(e)
    ulp = ulp_distance(expected, actual)
    finite = np.isfinite(e) & np.isfinite(a)
    abs_err = np.where(finite, abs_err, 0.0)
    rel_err = np.where(finite & (e != 0), rel_err, np.where(finite & (abs_err > 0), np.inf, 0.0))
    ulp = np.where(e_nan | a_nan, 0.0, ulp)

    nan_bad = e_nan != a_nan
    inf_bad = (np.isinf(e) | np.isinf(a)) & ~(e_nan | a_nan) & (e != a)
    if exact:
        val_bad = finite & (e != a)
    else:
        within = (abs_err <= tol.atol) | (rel_err <= tol.rtol) | (ulp <= tol.max_ulp)
        if bound is not None:
            within |= abs_err <= np.where(np.isnan(bound), np.inf, bound) + ulp_size(e, name_dt) * tol.max_ulp
        val_bad = finite & ~within
    sz_bad = np.zeros_like(val_bad)
    if signed_zero:
        sz_bad = (e == 0) & (a == 0) & (np.signbit(e) != np.signbit(a))
    bad = (nan_bad | inf_bad | val_bad | sz_bad) & mask
    checked = int(mask.sum())
    m = mask & finite
    res = Comparison(
        ok=not bad.any(),
        max_abs_err=float(abs_err[m].max()) if m.any() else 0.0,
        max_rel_err=float(rel_err[m].max()) if m.any() else 0.0,
        max_ulp=float(ulp[m].max()) if m.any() else 0.0,
        mismatches=int(bad.sum()),
        checked=checked,
    )
    if not res.ok:
        kinds = [k for k, v in (("NaN", nan_bad), ("inf", inf_bad), ("value", val_bad),
                                ("signed zero", sz_bad)) if (v & mask).any()]
        score = np.where(bad, np.where(finite, ulp, np.inf), -1.0)
        i = int(np.argmax(score))
        idx = _flat_index(expected.shape, i)
        res.worst_index = idx
        res.message = (f"{name}: {res.mismatches}/{n} elements differ ({', '.join(kinds)}); worst at "
                       f"{idx}: expected {expected.flat[i]!r}, got {actual.flat[i]!r} "
                       f"(max ulp {res.max_ulp:g}, max abs {res.max_abs_err:.3g})")
    return res
