"""Comparison of a backend's outputs with the reference: measured errors and a verdict.

ULP distance is counted in the output dtype by mapping each float's bits to an integer whose
order is the order of the reals (+0 and -0 map to the same point), so the distance across zero,
across signs and through the subnormals is the number of representable values between the two.

:func:`asserted` and :func:`element_errors` are the one place that masks and measures two float
arrays element by element (NaN, infinities, ULP, signed zeros): :func:`compare` (a backend
against the reference) and ``accuracy.measure`` (either against the precise oracle) both build on
them and differ only in the rule that turns the errors into a verdict.

Non-finite results are asserted whatever the bound: where the reference yields NaN or an
infinity, the output must yield the same (NaN position, sign of the infinity), and a finite value
where the reference has none fails. A :class:`Bound` that is NaN or infinite at a position only
frees the *finite value* there (counted as ``unbounded``), never the NaN/inf pattern. The one
exception is a position the bound marks order-dependent (``Bound.free``): there the spec lets the
order of evaluation decide (a sum whose partial sums may overflow although its exact value is
finite, a product whose partial products may leave the exponent range), and the output is judged
by the set of outcomes legal there (``Bound.allow``), and counted as ``order_dependent``.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from rlx_conformance.core import dtypes as dt


def ordered_bits(x: np.ndarray) -> np.ndarray:
    """Float bits → uint64 whose order is the numeric order; +0 and -0 coincide. NaN is undefined."""
    fi = dt.finfo(dt.name_of(x.dtype))
    return ordered_from_bits(np.ascontiguousarray(x).view(fi.uint).reshape(np.shape(x)), fi.bits)


def ordered_from_bits(bits, width: int, xp=np):
    """:func:`ordered_bits` of floats given as their bits: an unsigned integer array of ``width``
    bits of the array module ``xp``, numpy or CuPy (the float32 sweep works on the device on
    bits, run/exhaustive_f32.py; CuPy's float32 arithmetic flushes subnormals, its bit operations
    do not). Only operations the two share: casts, shifts, bitwise and modular uint64 arithmetic."""
    # offset - magnitude for negatives, offset + magnitude otherwise; in place on the fresh copy
    # astype makes (modular uint64 arithmetic: no result wraps), which at 10^6 elements is worth it
    b = bits.astype(xp.uint64)
    neg = b >> xp.uint64(width - 1)  # 1 for negatives, 0 otherwise
    b &= xp.uint64((1 << (width - 1)) - 1)  # the magnitude
    b ^= neg * xp.uint64((1 << 64) - 1)  # where negative: ~magnitude + 1 = -magnitude (two's
    b += neg  # complement)
    b += xp.uint64(1 << 63)
    return b


def ulp_distance_bits(a, b, width: int, xp=np):
    """:func:`ulp_distance` of floats given as their bits (:func:`ordered_from_bits`'s arrays), as
    float64 (exact below 2^53 ULP, so for every float32 distance); where either side is NaN the
    number means nothing and the caller masks it."""
    oa = ordered_from_bits(a, width, xp)
    ob = ordered_from_bits(b, width, xp)
    return (xp.maximum(oa, ob) - xp.minimum(oa, ob)).astype(xp.float64)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Number of representable values of the dtype between a and b, elementwise, as float64.
    Infinities count as one past max; NaN gives NaN."""
    if a.dtype != b.dtype:
        raise TypeError(f"ulp_distance needs one dtype, got {a.dtype} and {b.dtype}")
    a, b = np.broadcast_arrays(a, b)
    with np.errstate(invalid="ignore"):
        nan = np.isnan(a.astype(np.float64)) | np.isnan(b.astype(np.float64))
    return _ulp_distance(a, b, nan)


def _ulp_distance(a: np.ndarray, b: np.ndarray, nan: np.ndarray | None) -> np.ndarray:
    """:func:`ulp_distance` of two arrays of one dtype and shape whose NaN mask (either side)
    the caller has (None: no NaN): |ordered a - ordered b| in place, as float64, NaN where
    ``nan``."""
    fi = dt.finfo(dt.name_of(a.dtype))
    if fi.bits <= 32:  # the ordered values fit int64 with their difference: signed arithmetic
        d, ob = _ordered_int(a, fi), _ordered_int(b, fi)
        d -= ob
        np.abs(d, out=d)
    else:
        d = ordered_bits(a)
        ob = ordered_bits(b)
        below = d < ob
        d -= ob
        np.negative(d, out=d, where=below)
    out = d.astype(np.float64)
    if nan is not None:
        out[nan] = np.nan
    return out


def _ordered_int(x: np.ndarray, fi) -> np.ndarray:
    """:func:`ordered_bits` of a float array of at most 32 bits less its constant offset, as
    int64: the bits as a signed integer v where v >= 0, -(v's magnitude) = INT_MIN - v where the
    sign bit is set (+0 and -0 both 0); differences are the ordered distances (fewer passes)."""
    sint = {16: np.int16, 32: np.int32}[fi.bits]
    v = np.ascontiguousarray(x).view(sint).reshape(np.shape(x)).astype(np.int64)
    np.subtract(-(1 << (fi.bits - 1)), v, out=v, where=v < 0)
    return v


def ulp_size(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of the dtype at |x| (the gap to the next representable magnitude), as float64."""
    fi = dt.finfo(dtype)
    emin = int(np.log2(fi.tiny))  # exact: tiny is a power of two
    x64 = np.asarray(x, np.float64)
    if x64.ndim and fi.bits < 64:
        return _ulp_size_bits(x64, emin, fi.mant_bits)
    ax = np.abs(x64)
    _, e = np.frexp(ax)  # exact exponent (log2 rounds up just below powers of two); finite for inf/NaN
    e = np.where(ax > 0, e - 1, emin)  # frexp(0) has exponent 0; NaN
    np.maximum(e, emin, out=e)
    e -= fi.mant_bits
    return np.ldexp(1.0, e)  # the power of two itself (exp2 of the same integers, 2.5x faster)


_F64_INF = 0x7FF0000000000000


def _ulp_size_bits(x64: np.ndarray, emin: int, mant: int) -> np.ndarray:
    """:func:`ulp_size` of a float64 array for a dtype narrower than float64, on the bits: the
    biased exponent E of |x| less 1023 is frexp's exponent less one for normal x; a float64
    subnormal or zero lies below every narrower dtype's emin (clamped there, as frexp's path
    clamps); an infinity has frexp exponent 0 (-1 after the step), NaN the emin (``ax > 0`` is
    False); the spacing 2^(e - mant) >= 2^-149 is a normal float64, built from its exponent
    bits. Bit for bit the frexp path's result, without frexp and ldexp (3x faster)."""
    mag = np.ascontiguousarray(x64).view(np.uint64) & np.uint64(0x7FFFFFFFFFFFFFFF)
    e = (mag >> np.uint64(52)).astype(np.int64)
    special = e == 2047
    e -= 1023
    np.maximum(e, emin, out=e)
    if special.any():
        e[special] = np.where(mag[special] == _F64_INF, max(-1, emin), emin)
    e += 1023 - mant
    e <<= 52
    return e.view(np.float64).reshape(x64.shape)


def ulp_size_of(x: np.ndarray) -> np.ndarray:
    """:func:`ulp_size` of a float array in its own dtype, from its own bits where the dtype is
    narrower than float64: the spacing depends on the exponent field alone (and, at the top
    code, on whether the value is NaN), so it is read from a table of the frexp path's answers
    per exponent code (:func:`_spacing_table`) — the same float64 values, from 2- or 4-byte
    passes instead of 8-byte ones."""
    name = dt.name_of(x.dtype)
    fi = dt.finfo(name)
    if fi.bits == 64 or np.ndim(x) == 0:
        return ulp_size(x, name)
    table, nan_spacing = _spacing_table(name)
    bits = np.ascontiguousarray(x).view(fi.uint).reshape(x.shape)
    top = len(table) - 1
    code = bits >> fi.uint(fi.mant_bits)
    code &= fi.uint(top)
    out = table[code]
    at_top = code == top
    if at_top.any():  # infinities keep the table's value, NaN (a nonzero fraction) has its own
        out[at_top & ((bits & fi.uint((1 << fi.mant_bits) - 1)) != 0)] = nan_spacing
    return out


@functools.cache
def _spacing_table(name: str) -> tuple[np.ndarray, float]:
    """:func:`ulp_size` (the frexp path, on scalars) of a value of each exponent code of the
    float dtype ``name`` (0: zero, the subnormals' code; the top code: infinity), and of NaN."""
    fi = dt.finfo(name)
    ebits = fi.bits - 1 - fi.mant_bits
    top = (1 << ebits) - 1
    bias = top // 2
    reps = [0.0] + [math.ldexp(1.0, c - bias) for c in range(1, top)] + [math.inf]
    table = np.array([float(ulp_size(np.float64(v), name)) for v in reps])
    return table, float(ulp_size(np.float64(math.nan), name))


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
    # positions judged only by the outcomes the spec leaves legal there (Bound.free): the order of
    # evaluation decides between them (intermediate overflow of a sum whose exact value is finite)
    order_dependent: int = 0
    # positions whose finite value no bound covers (the bound is NaN/inf there: the analysis says
    # nothing); their NaN/inf pattern is still asserted
    unbounded: int = 0
    # mismatches in the NaN/inf pattern (a NaN, an infinity or an order-dependent outcome where the
    # reference has another): a failure kind of its own, which a known divergence must name to
    # excuse (judge/divergences.py)
    nonfinite: int = 0
    # on failure only: the first few wrong positions (row-major order), and the count of wrong
    # elements per kind (NaN, inf, value, signed zero, order-dependent outcome) — what a bit-exact
    # or integer output reports instead of ULP figures, which mean nothing for a value read from
    # the wrong place
    positions: list[tuple[int, ...]] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)
    exact: bool = False  # judged bit for bit (integers, bools, data movement)
    # on failure only: the largest errors among the wrong finite values (kind "value"; None where
    # no finite value is wrong). The maxima above run over every asserted element, passing ones
    # included (a 1e-9 within an absolute bound where the reference is 0 has relative error inf);
    # a known divergence's caps bound how wrong the values it excuses are, so they are checked
    # against these (judge/divergences.py)
    wrong_max_abs_err: float | None = None
    wrong_max_rel_err: float | None = None
    wrong_max_ulp: float | None = None


WRONG_MAXIMA = ("max_abs_err", "max_rel_err", "max_ulp")  # Comparison.wrong_<name>


def wrong_summary(comps: list[Comparison]) -> dict:
    """A failing case's record of its wrong elements, over those of its comparisons (``comps``:
    all of the case's) that failed listing them: how many, of how many asserted, per kind (NaN,
    inf, value, signed zero, order-dependent outcome), the largest errors among the wrong finite
    values where any comparison measured them, and ``unlisted``, how many failed without listing
    elements (a shape or dtype mismatch): where none did, the kinds are the whole failure's. The
    judges of single ops, derivatives and graphs all record it (``mismatch``), each adding its
    first wrong positions."""
    listed = [c for c in comps if not c.ok and c.positions]
    kinds: dict[str, int] = {}
    for c in listed:
        for k, n in c.kinds.items():
            kinds[k] = kinds.get(k, 0) + n
    out: dict = {"count": sum(c.mismatches for c in listed), "checked": sum(c.checked for c in listed),
                 "kinds": kinds, "unlisted": sum(not c.ok and not c.positions for c in comps)}
    for k in WRONG_MAXIMA:
        got = [v for v in (getattr(c, "wrong_" + k) for c in listed) if v is not None]
        if got:
            out[k] = max(got)
    return out


FIRST_POSITIONS = 5  # wrong positions a failing Comparison lists (cheap: only on failure)


def first_positions(bad: np.ndarray, k: int = FIRST_POSITIONS) -> list[tuple[int, ...]]:
    """The first ``k`` True positions of ``bad`` in row-major order, as index tuples."""
    flat = np.flatnonzero(bad)[:k]
    return [_flat_index(bad.shape, int(i)) for i in flat]


# Outcomes legal at an order-dependent position (Bound.allow bits), besides the reference's own
# outcome (its NaN, its infinity, or a finite value within the bound of its finite value).
POS_INF, NEG_INF, NAN = 1, 2, 4
# A finite value within the bound of the exact one: judged against the reference where it is
# finite; where it is +-inf the exact value lies beyond the overflow threshold, so a finite value
# must be within the bound of the largest finite value, with the same sign.
FINITE = 8
ANY_FINITE = 16  # any finite value (e.g. a product whose partial products may underflow)
# The reference's own evaluation may have overflowed (it computes in the output's dtype, float64):
# where its outcome is not finite, a finite value cannot be judged and is accepted.
REF_MAY_OVERFLOW = 32
ANYTHING = POS_INF | NEG_INF | NAN | ANY_FINITE


@dataclass(frozen=True)
class Bound:
    """A per-element judgement from numerical analysis (``Policy.bound``'s richer result; a bare
    array means ``Bound(abs=array)``).

    ``abs``: the absolute error allowed between two correct implementations at each position
    (float64, broadcastable to the output). NaN or +inf: the analysis bounds no finite value there
    (counted as unbounded); NaN and infinities are still asserted exactly.
    ``free``: positions where the spec makes the outcome depend on the order of evaluation;
    ``allow``: there, the outcomes legal besides the reference's (bits POS_INF, NEG_INF, NAN,
    FINITE, ANY_FINITE, REF_MAY_OVERFLOW)."""

    abs: np.ndarray
    free: np.ndarray | None = None
    allow: np.ndarray | None = None

    @staticmethod
    def of(bound: np.ndarray | Bound | None) -> Bound | None:
        if bound is None or isinstance(bound, Bound):
            return bound
        return Bound(np.asarray(bound, np.float64))

    def map(self, fn: Callable[[np.ndarray], np.ndarray]) -> Bound:
        """The same judgement after a change of layout (reshape, transpose, broadcast) of the output."""
        shape = np.broadcast_shapes(*(np.shape(v) for v in (self.abs, self.free, self.allow) if v is not None))
        abs_, free, allow = self.arrays(shape)
        return Bound(fn(abs_), None if self.free is None else fn(free), None if self.allow is None else fn(allow))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """The finite-value bound as a plain array, NaN where the position is order-dependent
        (for code that reads a bound as numbers: np.asarray(bound), bound arithmetic in tests)."""
        shape = np.broadcast_shapes(*(np.shape(v) for v in (self.abs, self.free) if v is not None))
        abs_, free, _ = self.arrays(shape)
        out = np.where(free, np.nan, abs_)
        return out if dtype is None else out.astype(dtype)

    def arrays(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(abs as float64, free as bool, allow as uint8), each broadcast to ``shape``."""
        b = np.broadcast_to(np.asarray(self.abs, np.float64), shape)
        if self.free is None:  # no order-dependent position: allow is masked to 0 everywhere
            if self.allow is not None:
                np.broadcast_to(np.asarray(self.allow, np.uint8), shape)  # a misfit still raises
            return b, np.zeros(shape, bool), np.zeros(shape, np.uint8)
        free = np.broadcast_to(np.asarray(self.free, bool), shape)
        allow = np.zeros(shape, np.uint8) if self.allow is None else \
            np.broadcast_to(np.asarray(self.allow, np.uint8), shape)
        return b, free, np.where(free, allow, np.uint8(0))  # allow masked to 0 where not free


def free_where(bound: np.ndarray | Bound, where: np.ndarray, allow: int | np.ndarray = ANYTHING) -> Bound:
    """``bound`` with the positions ``where`` made order-dependent, ``allow`` legal there."""
    b = Bound.of(bound)
    assert b is not None
    shape = np.broadcast_shapes(np.shape(b.abs), np.shape(where))
    abs_, free, allow0 = b.arrays(shape)
    new = np.broadcast_to(np.asarray(where, bool), shape)
    return Bound(abs_, free | new, np.where(new, np.asarray(allow, np.uint8), allow0).astype(np.uint8))


def asserted(shape: tuple[int, ...], skip: np.ndarray | None,
             bound: np.ndarray | Bound | None) -> tuple[np.ndarray, np.ndarray | None]:
    """The positions whose outcome is determined, as a bool mask of ``shape``: not in ``skip``
    (undefined by the spec) and not order-dependent (``Bound.free``). A NaN or infinite bound
    does not remove a position (its NaN/inf pattern is still determined). Returns the mask and
    the bound's ``abs`` broadcast to ``shape`` as float64 (None without a bound)."""
    mask = np.ones(shape, bool)
    if skip is not None:
        mask &= ~np.broadcast_to(skip, shape)
    b = Bound.of(bound)
    if b is None:
        return mask, None
    abs_, free, _ = b.arrays(shape)
    return mask & ~free, abs_


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
    all_finite: bool = False  # finite is True everywhere (nan, nan_bad, inf_bad all False)


def element_errors(expected: np.ndarray, actual: np.ndarray) -> ElementErrors:
    """The per-element masks and distances of two float arrays (one dtype, one shape). Where
    both are finite everywhere (the common case) the NaN and infinity masks are all False
    without computing them; likewise the signed-zero mask where no position holds two zeros.
    The float64 views are the arrays themselves when they are float64 (read only here and by
    every caller)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        e = np.asarray(expected, np.float64)
        a = np.asarray(actual, np.float64)
        finite = np.isfinite(e)
        finite &= np.isfinite(a)
        every = bool(finite.all())
        if every:
            none = np.zeros(e.shape, bool)[()]  # [()]: a numpy bool for 0-d, as the masks would be
            nan, nan_bad, inf_bad = none, none, none
            ulp = _ulp_distance(expected, actual, None)
        else:
            e_nan, a_nan = np.isnan(e), np.isnan(a)
            nan = e_nan | a_nan
            nan_bad = e_nan != a_nan
            # neither NaN and not both finite: one side is infinite
            inf_bad = ~finite & ~nan & (e != a)
            ulp = _ulp_distance(expected, actual, nan)
        both_zero = (e == 0) & (a == 0)
        if both_zero.any():
            both_zero &= np.signbit(e) != np.signbit(a)
        return ElementErrors(expected=e, actual=a, nan=nan, finite=finite, abs_diff=np.abs(e - a),
                             ulp=ulp, nan_bad=nan_bad, inf_bad=inf_bad, signed_zero=both_zero,
                             all_finite=every)


def _flat_index(shape, i):
    return tuple(int(v) for v in np.unravel_index(i, shape)) if shape else ()


def bit_equal(expected: np.ndarray, actual: np.ndarray) -> bool:
    """Whether two float arrays of one dtype and shape hold the same bits at every position (NaN
    payloads and zero signs included)."""
    fi = dt.finfo(dt.name_of(expected.dtype))
    return bool(np.array_equal(expected.view(fi.uint), actual.view(fi.uint)))


def _identical(expected: np.ndarray, *, exact: bool, bound: np.ndarray | Bound | None,
               judged: np.ndarray, name_dt: str) -> Comparison:
    """:func:`compare`'s verdict on an output bit-identical to the reference (:func:`bit_equal`),
    without the error arithmetic: every rule passes at every position (the same NaN, the same
    infinity, the same sign of zero, a zero error within any tolerance or bound, the reference's
    own outcome at an order-dependent position), every error figure is 0.0, and what is left to
    count is the positions (checked, order-dependent, unbounded) — exactly as the general path
    counts them. Many outputs are (bit-exact ops, MLX agreeing with the float64 reference after
    rounding): for them the general path's ~50 passes over the arrays are the judge's main cost."""
    shape = expected.shape
    b = Bound.of(bound) if not exact else None
    free_judged, unbounded = np.zeros(shape, bool), 0
    if b is not None:
        babs, free, _ = b.arrays(shape)
        free_judged = judged & free
        fmax = float(dt.finfo(name_dt).max)
        with np.errstate(invalid="ignore"):
            unbounded = int((judged & ~free & np.isfinite(expected.astype(np.float64)) & ~(babs < fmax)).sum())
    return Comparison(ok=True, checked=int(judged.sum()), order_dependent=int(free_judged.sum()),
                      unbounded=unbounded, exact=exact)


def compare(expected: np.ndarray, actual: np.ndarray, *, exact: bool, signed_zero: bool,
            tol: Tolerance, bound: np.ndarray | Bound | None = None,
            skip: np.ndarray | None = None, name: str = "output") -> Comparison:
    """Compare one output. ``bound``: per-element absolute error allowed (numerical analysis), an
    array or a :class:`Bound` with order-dependent positions; True in ``skip`` leaves that
    element unasserted (undefined by the spec).

    NaN and infinities are exact everywhere else (see the module docstring), with one allowance
    that follows from the bound itself: where the bound is positive, a finite value within the
    bound (plus the tolerance's ulps) of the dtype's largest finite value may meet an infinity of
    the same sign on the other side, since the exact result lies within the bound of both and may
    round either way at the overflow threshold. A bound as large as that largest value says
    nothing (any finite value is within it; counted as unbounded) and allows no such meeting."""
    if expected.shape != actual.shape:
        return Comparison(False, message=f"{name}: shape {actual.shape} != expected {expected.shape}")
    if expected.dtype != actual.dtype:
        return Comparison(False, message=f"{name}: dtype {actual.dtype} != expected {expected.dtype}")
    n = expected.size
    judged = np.ones(expected.shape, bool) if skip is None else ~np.broadcast_to(skip, expected.shape)
    name_dt = dt.name_of(expected.dtype)
    if not dt.is_float(name_dt):
        bad = (expected != actual) & judged
        nbad = int(bad.sum())
        res = Comparison(nbad == 0, mismatches=nbad, checked=int(judged.sum()), exact=True)
        if nbad:
            i = int(np.flatnonzero(bad)[0])
            idx = _flat_index(expected.shape, i)
            res.worst_index = idx
            res.positions = first_positions(bad)
            res.kinds = {"value": nbad}
            e64 = expected.astype(np.float64)
            a64 = actual.astype(np.float64)
            res.max_abs_err = res.wrong_max_abs_err = float(np.max(np.abs(e64 - a64)[bad]))
            res.message = (f"{name}: {nbad}/{n} elements differ; first at {idx}: "
                           f"expected {expected.flat[i]!r}, got {actual.flat[i]!r}")
        return res

    if bit_equal(expected, actual):
        return _identical(expected, exact=exact, bound=bound, judged=judged, name_dt=name_dt)
    err = element_errors(expected, actual)
    e, a, finite = err.expected, err.actual, err.finite
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        rel_err = err.abs_diff / np.abs(e)
    # Here non-finite positions carry no error (NaN and inf mismatches are counted on their own).
    if err.all_finite and e.ndim:  # the same arrays as below, in fewer passes (nothing to mask but e = 0)
        abs_err, ulp = err.abs_diff, err.ulp
        zero = e == 0
        if zero.any():
            rel_err[zero] = np.where(abs_err[zero] > 0, np.inf, 0.0)
    else:
        abs_err = np.where(finite, err.abs_diff, 0.0)
        rel_err = np.where(finite & (e != 0), rel_err, np.where(finite & (abs_err > 0), np.inf, 0.0))
        ulp = np.where(err.nan, 0.0, err.ulp)

    b = Bound.of(bound) if not exact else None
    shape = expected.shape
    fmax = float(dt.finfo(name_dt).max)
    if b is not None:
        babs, free, allow = b.arrays(shape)
    else:
        babs, free, allow = None, np.zeros(shape, bool), np.zeros(shape, np.uint8)
    nan_bad, inf_bad = err.nan_bad, err.inf_bad
    straddle = np.zeros(shape, bool)
    if exact:
        within = e == a
    else:
        within = (abs_err <= tol.atol) | (rel_err <= tol.rtol) | (ulp <= tol.max_ulp)
        if babs is not None:
            slack = ulp_size_of(expected) * tol.max_ulp  # ulp_size(e, name_dt): e is expected
            with np.errstate(invalid="ignore"):
                within |= abs_err <= np.where(np.isfinite(babs), babs, np.inf) + slack
            if inf_bad.any():  # straddle is a subset of inf_bad: all False where it has none
                with np.errstate(invalid="ignore"):
                    # the overflow threshold: a finite side within the bound of max meets an infinity
                    fin_side = np.where(np.isfinite(e), np.abs(e), np.abs(a))
                    near_max = (babs > 0) & (babs < fmax) & (fin_side + babs + ulp_size(fmax, name_dt) *
                                                             tol.max_ulp >= fmax)
                straddle = inf_bad & near_max & (np.isfinite(e) != np.isfinite(a)) & \
                    (np.signbit(e) == np.signbit(a))
                inf_bad = inf_bad & ~straddle
    val_bad = finite & ~within
    sz_bad = err.signed_zero if signed_zero else np.zeros_like(val_bad)
    fixed = judged & ~free
    bad = (nan_bad | inf_bad | val_bad | sz_bad) & fixed
    # order-dependent positions: the reference's own outcome, or one the bound allows there
    free_judged = judged & free
    if free_judged.any():
        a_nan, e_nan, a_fin = np.isnan(a), np.isnan(e), np.isfinite(a)
        same_nonfinite = (a_nan & e_nan) | (np.isinf(a) & (a == e))
        legal = same_nonfinite | (finite & within) | straddle | \
            (a_nan & (allow & NAN > 0)) | ((a == np.inf) & (allow & POS_INF > 0)) | \
            ((a == -np.inf) & (allow & NEG_INF > 0)) | (a_fin & (allow & ANY_FINITE > 0)) | \
            (a_fin & ~np.isfinite(e) & (allow & REF_MAY_OVERFLOW > 0))
        free_bad = free_judged & ~legal
        bad = bad | free_bad
    else:  # no order-dependent position is judged: none can be wrong
        free_bad = free_judged
    checked = int(judged.sum())
    m = fixed & finite
    every = bool(m.all())  # then the maxima need no masked copies
    res = Comparison(
        ok=not bad.any(),
        max_abs_err=float(abs_err.max() if every else abs_err[m].max()) if m.any() else 0.0,
        max_rel_err=float(rel_err.max() if every else rel_err[m].max()) if m.any() else 0.0,
        max_ulp=float(ulp.max() if every else ulp[m].max()) if m.any() else 0.0,
        mismatches=int(bad.sum()),
        checked=checked,
        order_dependent=int(free_judged.sum()),
        nonfinite=int(((nan_bad | inf_bad) & fixed | free_bad).sum()),
        unbounded=0 if babs is None else int((fixed & np.isfinite(e) & ~(babs < fmax)).sum()),
        exact=exact,
    )
    if not res.ok:
        kinds = [k for k, v in (("NaN", nan_bad & fixed), ("inf", inf_bad & fixed), ("value", val_bad & fixed),
                                ("signed zero", sz_bad & fixed), ("order-dependent outcome", free_bad))
                 if v.any()]
        res.kinds = {k: int(v.sum()) for k, v in (
            ("NaN", nan_bad & fixed), ("inf", inf_bad & fixed), ("value", val_bad & fixed),
            ("signed zero", sz_bad & fixed), ("order-dependent outcome", free_bad)) if v.any()}
        res.positions = first_positions(bad)
        vbad = val_bad & fixed
        if vbad.any():
            res.wrong_max_abs_err = float(abs_err[vbad].max())
            res.wrong_max_rel_err = float(rel_err[vbad].max())
            res.wrong_max_ulp = float(ulp[vbad].max())
        score = np.where(bad, np.where(finite & ~free, ulp, np.inf), -1.0)
        i = int(np.argmax(score))
        idx = _flat_index(expected.shape, i)
        res.worst_index = idx
        # A bit-exact output (data movement: a gather, a copy) is right or wrong per element: a
        # ULP distance between the right value and one read from elsewhere says nothing.
        figures = (f"max ulp {res.max_ulp:g}, max abs {res.max_abs_err:.3g}" if not exact else
                   f"first wrong at {', '.join(map(str, res.positions))}")
        res.message = (f"{name}: {res.mismatches}/{n} elements differ ({', '.join(kinds)}); worst at "
                       f"{idx}: expected {expected.flat[i]!r}, got {actual.flat[i]!r} ({figures})")
        if free_bad.flat[i]:
            legal_names = [nm for bit, nm in ((POS_INF, "+inf"), (NEG_INF, "-inf"), (NAN, "NaN"),
                                              (FINITE, "a finite value within the bound"),
                                              (ANY_FINITE, "any finite value"),
                                              (REF_MAY_OVERFLOW, "a finite value where the reference overflowed"))
                           if allow.flat[i] & bit]
            res.message += ("; order-dependent there, legal: the reference's outcome"
                            + "".join(f", {x}" for x in legal_names))
    return res


def nonfinite_mismatch(expected: np.ndarray, actual: np.ndarray, name: str = "output") -> Comparison | None:
    """For judges of a whole output (solvers, factorizations, iterative methods), which measure
    errors over finite values only: a failing Comparison where the NaN/inf pattern differs from
    the reference's (NaN for NaN, the same infinity, finite for finite), else None. Without it a
    column of NaN would carry no error at all and pass."""
    if expected.shape != actual.shape:
        return None  # the layout check reports it
    with np.errstate(invalid="ignore"):
        e, a = expected.astype(np.float64), actual.astype(np.float64)
        bad = (np.isnan(e) != np.isnan(a)) | ((np.isinf(e) | np.isinf(a)) & ~np.isnan(e) & ~np.isnan(a) & (e != a))
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    return Comparison(False, mismatches=int(bad.sum()), nonfinite=int(bad.sum()), checked=e.size, worst_index=_flat_index(e.shape, i),
                      positions=first_positions(bad), kinds={"NaN/inf": int(bad.sum())},
                      message=f"{name}: {int(bad.sum())}/{e.size} elements differ from the reference in "
                              f"NaN/inf (first at {_flat_index(e.shape, i)}: expected {expected.flat[i]!r}, "
                              f"got {actual.flat[i]!r})")
