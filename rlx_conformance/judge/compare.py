"""Comparison of a backend's outputs with the reference: measured errors and a verdict.

ULP distance is counted in the output dtype by mapping each float's bits to an integer whose
order is the order of the reals (+0 and -0 map to the same point), so the distance across zero,
across signs and through the subnormals is the number of representable values between the two.

:func:`asserted` and :func:`element_errors` are the one place that masks and measures two float
arrays element by element (NaN, infinities, ULP, signed zeros): :func:`compare` (a backend
against the reference) and ``accuracy.measure`` (either against the precise oracle) both build on
them and differ only in the rule that turns the errors into a verdict.
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


BIT_EXACT_TOLERANCE = Tolerance(source="exact")  # for exact=True comparisons: no slack at all


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


def asserted(shape: tuple[int, ...], skip: np.ndarray | None,
             bound: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The positions an output is judged at, as a bool mask of ``shape``: not in ``skip``
    (undefined by the spec) and, given a per-element ``bound``, where the bound is not NaN
    (unasserted). Returns the mask and the bound broadcast to ``shape`` as float64."""
    mask = np.ones(shape, bool)
    if skip is not None:
        mask &= ~np.broadcast_to(skip, shape)
    if bound is not None:
        bound = np.broadcast_to(np.asarray(bound, np.float64), shape)
        mask &= ~np.isnan(bound)
    return mask, bound


@dataclass(frozen=True)
class ElementErrors:
    """Two float arrays of one dtype and shape compared element by element, in float64.
    Symmetric in the two sides, so either may be the one judged."""

    expected: np.ndarray  # as float64
    actual: np.ndarray  # as float64
    nan: np.ndarray  # either side is NaN
    finite: np.ndarray  # both sides are finite
    abs_diff: np.ndarray  # |expected - actual| (inf or NaN where not both finite)
    ulp: np.ndarray  # ulp_distance in the arrays' dtype (NaN where either side is NaN)
    nan_bad: np.ndarray  # NaN on one side only
    inf_bad: np.ndarray  # neither side NaN, one infinite, and they differ
    signed_zero: np.ndarray  # both zero with different signs


def element_errors(expected: np.ndarray, actual: np.ndarray) -> ElementErrors:
    """The per-element masks and distances of two float arrays (one dtype, one shape)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = expected.astype(np.float64)
        a = actual.astype(np.float64)
        e_nan, a_nan = np.isnan(e), np.isnan(a)
        nan = e_nan | a_nan
        return ElementErrors(
            expected=e, actual=a, nan=nan,
            finite=np.isfinite(e) & np.isfinite(a),
            abs_diff=np.abs(e - a),
            ulp=ulp_distance(expected, actual),
            nan_bad=e_nan != a_nan,
            inf_bad=(np.isinf(e) | np.isinf(a)) & ~nan & (e != a),
            signed_zero=(e == 0) & (a == 0) & (np.signbit(e) != np.signbit(a)),
        )


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
    mask, bound = asserted(expected.shape, skip, bound)
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

    err = element_errors(expected, actual)
    e, a, finite = err.expected, err.actual, err.finite
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rel_err = err.abs_diff / np.abs(e)
    # Here non-finite positions carry no error (NaN and inf mismatches are counted on their own).
    abs_err = np.where(finite, err.abs_diff, 0.0)
    rel_err = np.where(finite & (e != 0), rel_err, np.where(finite & (abs_err > 0), np.inf, 0.0))
    ulp = np.where(err.nan, 0.0, err.ulp)

    nan_bad, inf_bad = err.nan_bad, err.inf_bad
    if exact:
        val_bad = finite & (e != a)
    else:
        within = (abs_err <= tol.atol) | (rel_err <= tol.rtol) | (ulp <= tol.max_ulp)
        if bound is not None:
            within |= abs_err <= np.where(np.isnan(bound), np.inf, bound) + ulp_size(e, name_dt) * tol.max_ulp
        val_bad = finite & ~within
    sz_bad = err.signed_zero if signed_zero else np.zeros_like(val_bad)
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
