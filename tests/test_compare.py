"""rlx_conformance.judge.compare: ULP distance and the per-output verdict.

ULP distances are checked against oracles that do not share the implementation's bit trick:
IEEE layout facts, np.nextafter, and (for the 16-bit types) the exhaustive sorted list of values.
"""
from __future__ import annotations

import math
import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_conformance.judge.compare import (
    BIT_EXACT_TOLERANCE,
    NAN,
    Bound,
    Tolerance,
    asserted,
    compare,
    element_errors,
    ulp_distance,
    ulp_distance_bits,
    ulp_size,
)

FLOATS = ["float16", "bfloat16", "float32", "float64"]
NP = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
      "float32": np.dtype(np.float32), "float64": np.dtype(np.float64)}
# (exponent bits, fraction bits) from the IEEE / bfloat16 layouts.
LAYOUT = {"float16": (5, 10), "bfloat16": (8, 7), "float32": (8, 23), "float64": (11, 52)}


def info(name):
    return ml_dtypes.finfo(NP[name]) if name == "bfloat16" else np.finfo(NP[name])


def arr(values, name):
    with np.errstate(over="ignore"):
        return np.asarray(values, np.float64).astype(NP[name])


def d(a, b, name):
    return float(ulp_distance(arr([a], name), arr([b], name))[0])


# -- ULP distance: fixed points -------------------------------------------------------------------
@pytest.mark.parametrize("name", FLOATS)
class TestUlpFixedPoints:
    def test_signed_zeros_coincide(self, name):
        assert d(0.0, -0.0, name) == 0
        assert d(-0.0, 0.0, name) == 0

    def test_smallest_subnormal_across_zero_is_two(self, name):
        s = float(info(name).smallest_subnormal)
        assert d(s, -s, name) == 2
        assert d(0.0, s, name) == 1
        assert d(-0.0, s, name) == 1
        assert d(0.0, -s, name) == 1

    def test_subnormal_to_normal_boundary(self, name):
        fi = info(name)
        tiny, s = float(fi.smallest_normal), float(fi.smallest_subnormal)
        assert d(tiny - s, tiny, name) == 1  # largest subnormal → smallest normal
        assert d(0.0, tiny, name) == 2 ** LAYOUT[name][1]  # every subnormal, then tiny

    def test_max_to_inf_is_one(self, name):
        m = float(info(name).max)
        assert d(m, math.inf, name) == 1
        assert d(-m, -math.inf, name) == 1
        assert d(math.inf, m, name) == 1

    def test_across_signs(self, name):
        ebits, mbits = LAYOUT[name]
        one = (2 ** (ebits - 1) - 1) * 2**mbits  # representable values in (0, 1]
        assert d(1.0, -1.0, name) == 2 * one
        assert d(-1.0, 1.0, name) == 2 * one
        inf = (2**ebits - 1) * 2**mbits
        assert d(-math.inf, math.inf, name) == float(2 * inf)

    def test_nan_gives_nan(self, name):
        assert math.isnan(d(math.nan, 1.0, name))
        assert math.isnan(d(1.0, math.nan, name))
        assert math.isnan(d(math.nan, math.nan, name))
        assert math.isnan(d(-math.nan, math.inf, name))

    def test_identical_is_zero(self, name):
        x = arr([1.5, -3.0, math.inf, -math.inf, 0.0], name)
        assert np.array_equal(ulp_distance(x, x), np.zeros(5))


def test_ulp_distance_rejects_mixed_dtypes():
    with pytest.raises(TypeError, match="one dtype"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float64))


def test_ulp_distance_broadcasts():
    a = np.zeros((3, 1), np.float32)
    b = np.array([[0.0, 1e-45, -1e-45, -0.0]], np.float32)
    assert ulp_distance(a, b).shape == (3, 4)
    assert np.array_equal(ulp_distance(a, b)[1], [0, 1, 1, 0])


def test_ulp_distance_keeps_scalar_shape():
    r = ulp_distance(np.array(1.0, np.float32), np.array(2.0, np.float32))
    assert r.shape == ()


@pytest.mark.parametrize("name", FLOATS)
def test_ulp_distance_of_bits_is_ulp_distance(name):
    """The bits form the float32 sweep uses on the device (ulp_distance_bits: the same ordered
    bits through operations CuPy shares) gives ulp_distance wherever neither side is NaN: random
    patterns of every class, their neighbours and the signed zeros."""
    fi = NP[name]
    u = np.dtype(f"uint{fi.itemsize * 8}").type
    rng = np.random.default_rng(11)
    a = rng.integers(0, np.iinfo(u).max, 20000, dtype=np.uint64, endpoint=True).astype(u)
    b = a.copy()
    b[::3] += u(1)
    b[1::3] = rng.integers(0, np.iinfo(u).max, b[1::3].size, dtype=np.uint64, endpoint=True).astype(u)
    sign = u(1 << (fi.itemsize * 8 - 1))
    a[:4], b[:4] = [0, 0, sign, sign], [0, sign, 0, sign]
    with np.errstate(invalid="ignore"):
        want = ulp_distance(a.view(fi), b.view(fi))
    got = ulp_distance_bits(a, b, fi.itemsize * 8)
    live = ~np.isnan(want)
    assert live.sum() > 15000 and got.dtype == np.float64
    assert np.array_equal(got[live], want[live]) and not got[:4].any()


# -- ULP distance: exhaustive over the 16-bit types ------------------------------------------------
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_exhaustive_16bit_rank(name):
    """Distance from -inf to x equals x's rank among the distinct values (±0 one value), for every
    non-NaN bit pattern; and neighbours in value order are exactly 1 apart."""
    x = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(NP[name])
    with np.errstate(invalid="ignore"):
        v = x.astype(np.float64)
    x, v = x[~np.isnan(v)], v[~np.isnan(v)]
    distinct = np.unique(v)  # -0.0 == 0.0: one entry
    rank = np.searchsorted(distinct, v)
    lowest = np.full_like(x, -np.inf)
    assert np.array_equal(ulp_distance(lowest, x), rank.astype(np.float64))
    order = np.argsort(v, kind="stable")
    sx, sv = x[order], v[order]
    step = ulp_distance(sx[:-1], sx[1:])
    assert np.array_equal(step, np.where(sv[:-1] == sv[1:], 0.0, 1.0))  # 0 only at -0/+0


# -- ULP distance: properties ------------------------------------------------------------------------
def finite(width):
    return st.floats(width=width, allow_nan=False, allow_infinity=False)


WIDTH = {"float16": 16, "float32": 32, "float64": 64}


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@given(data=st.data())
def test_nextafter_is_one_ulp(name, data):
    a = arr([data.draw(finite(WIDTH[name]))], name)
    with np.errstate(over="ignore"):  # max → inf
        up = np.nextafter(a, arr([math.inf], name))
        down = np.nextafter(a, arr([-math.inf], name))
    assert ulp_distance(a, up)[0] == 1
    assert ulp_distance(down, a)[0] == 1


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@given(data=st.data())
def test_symmetry(name, data):
    f = st.floats(width=WIDTH[name])
    a, b = arr([data.draw(f)], name), arr([data.draw(f)], name)
    ab, ba = ulp_distance(a, b)[0], ulp_distance(b, a)[0]
    assert (math.isnan(ab) and math.isnan(ba)) or ab == ba
    assert math.isnan(ab) or ab >= 0


@pytest.mark.parametrize("name", ["float16", "float32", "float64"])
@given(data=st.data())
def test_triangle_equality_same_sign(name, data):
    sign = data.draw(st.sampled_from([1.0, -1.0]))
    xs = sorted(abs(data.draw(st.floats(width=WIDTH[name], allow_nan=False))) for _ in range(3))
    a, b, c = (arr([sign * x], name) for x in xs)
    lhs = ulp_distance(a, c)[0]
    rhs = ulp_distance(a, b)[0] + ulp_distance(b, c)[0]
    if name == "float64":  # distances above 2^53 are rounded to float64
        assert lhs == pytest.approx(rhs, rel=2**-50, abs=0)
    else:
        assert lhs == rhs


@given(a=finite(32), b=finite(32))
def test_triangle_through_zero(a, b):
    """Across signs the path goes through the one zero point: d(-|a|, |b|) = d(-|a|, 0) + d(0, |b|)."""
    lo, hi = arr([-abs(a)], "float32"), arr([abs(b)], "float32")
    for z in (0.0, -0.0):
        zero = arr([z], "float32")
        assert ulp_distance(lo, hi)[0] == ulp_distance(lo, zero)[0] + ulp_distance(zero, hi)[0]


@pytest.mark.parametrize("name", ["float16", "float32"])
@given(data=st.data())
def test_ulp_size_is_spacing(name, data):
    """ulp_size(x) is the gap to the next larger magnitude (np.spacing), subnormals included."""
    x = arr([data.draw(finite(WIDTH[name]))], name)
    if abs(float(x[0])) == float(info(name).max):  # np.spacing(max) is inf
        return
    assert ulp_size(x, name)[0] == float(np.spacing(np.abs(x))[0])


def test_ulp_size_float64_away_from_powers_of_two():
    x = np.array([1.0, 1.5, -3.0, 1e300, 5e-324, 2.2250738585072014e-308, 0.0])
    assert np.array_equal(ulp_size(x, "float64"), np.spacing(np.abs(x)))


def test_ulp_size_float64_just_below_power_of_two():
    x = np.array([np.nextafter(1.0, 0.0), 2.0**49 - 1])
    assert np.array_equal(ulp_size(x, "float64"), np.spacing(x))


# -- compare(): verdicts -----------------------------------------------------------------------------
NO_SLACK = Tolerance()


def cmp(e, a, name="float32", *, exact=False, signed_zero=False, tol=NO_SLACK, **kw):
    return compare(arr(e, name), arr(a, name), exact=exact, signed_zero=signed_zero, tol=tol, **kw)


LOOSE = Tolerance(max_ulp=1e30, rtol=1e30, atol=1e300)  # any finite difference passes


@pytest.mark.parametrize("name", FLOATS)
def test_nan_positions_must_match(name):
    assert cmp([math.nan, 1.0], [math.nan, 1.0], name).ok
    assert cmp([math.nan], [-math.nan], name, exact=True, tol=BIT_EXACT_TOLERANCE).ok  # sign/payload ignored
    c = cmp([math.nan, 1.0], [1.0, math.nan], name, tol=LOOSE)
    assert not c.ok and c.mismatches == 2 and "NaN" in c.message
    c = cmp([1.0, 2.0], [1.0, math.nan], name, tol=LOOSE)
    assert not c.ok and c.mismatches == 1 and c.worst_index == (1,)


@pytest.mark.parametrize("name", FLOATS)
def test_infinities_exactly(name):
    m = float(info(name).max)
    assert cmp([math.inf, -math.inf], [math.inf, -math.inf], name).ok
    for e, a in [(math.inf, -math.inf), (math.inf, m), (m, math.inf), (-math.inf, -m)]:
        c = cmp([e], [a], name, tol=LOOSE)  # max vs inf is 1 ulp, but no tolerance excuses it
        assert not c.ok and "inf" in c.message, (e, a)
    c = cmp([math.inf], [math.nan], name, tol=LOOSE)
    assert not c.ok and "NaN" in c.message


@pytest.mark.parametrize("exact", [True, False])
def test_signed_zero_only_when_asked(exact):
    tol = BIT_EXACT_TOLERANCE if exact else Tolerance(max_ulp=2)
    assert cmp([0.0, -0.0], [-0.0, 0.0], exact=exact, tol=tol).ok
    c = cmp([0.0, -0.0, 1.0], [-0.0, -0.0, 1.0], exact=exact, signed_zero=True, tol=tol)
    assert not c.ok and c.mismatches == 1 and "signed zero" in c.message
    assert c.worst_index == (0,)
    assert cmp([0.0, -0.0], [0.0, -0.0], exact=exact, signed_zero=True, tol=tol).ok


def test_exact_mode_ignores_tolerance():
    one_up = float(np.nextafter(np.float32(1), np.float32(2)))
    assert not cmp([1.0], [one_up], exact=True, tol=LOOSE).ok
    assert cmp([1.0], [one_up], exact=False, tol=Tolerance(max_ulp=1)).ok
    assert cmp([1.0, 2.5], [1.0, 2.5], exact=True, tol=BIT_EXACT_TOLERANCE).ok


def test_tolerance_is_any_of():
    """Each criterion alone, set to exactly the measured error, passes (the bounds are inclusive);
    all three just below the measured errors fail."""
    e, a = [1e-3], [1e-3 + 1e-6]
    m = cmp(e, a, tol=BIT_EXACT_TOLERANCE)
    assert not m.ok and m.max_abs_err > 0 and m.max_ulp > 1
    assert cmp(e, a, tol=Tolerance(atol=m.max_abs_err)).ok
    assert cmp(e, a, tol=Tolerance(rtol=m.max_rel_err)).ok
    assert cmp(e, a, tol=Tolerance(max_ulp=m.max_ulp)).ok
    below = Tolerance(atol=m.max_abs_err * 0.99, rtol=m.max_rel_err * 0.99, max_ulp=m.max_ulp - 1)
    c = cmp(e, a, tol=below)
    assert not c.ok and "value" in c.message


def test_relative_error_at_zero_expected():
    c = cmp([0.0], [1e-30], tol=Tolerance(rtol=1e30))  # rel error is inf when expected is 0
    assert not c.ok and c.max_rel_err == math.inf
    assert cmp([0.0], [1e-30], tol=Tolerance(atol=1e-29)).ok


def test_measured_errors():
    e = np.array([1.0, 2.0, 4.0, -8.0], np.float32)
    a = e.copy()
    a[1] = np.nextafter(np.nextafter(a[1], np.float32(3)), np.float32(3))  # 2 ulp
    a[3] = np.float32(-8.5)  # abs 0.5, rel 1/16, 0.5 / spacing(8) = 2^19 ulp
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance())
    spacing8 = float(np.spacing(np.float32(8)))
    assert c.max_abs_err == 0.5
    assert c.max_rel_err == 0.5 / 8
    assert c.max_ulp == 0.5 / spacing8
    assert c.mismatches == 2 and c.checked == 4
    assert c.worst_index == (3,)
    assert "2/4 elements differ" in c.message


def test_measured_errors_ignore_masked_and_nonfinite():
    e = np.array([1.0, 100.0, math.inf, math.nan], np.float32)
    a = np.array([1.5, 0.0, math.inf, math.nan], np.float32)
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance(atol=1),
                skip=np.array([False, True, False, False]))
    assert c.ok and c.checked == 3
    assert c.max_abs_err == 0.5  # the skipped 100-vs-0 is not measured


def test_worst_index_multidim():
    e = np.zeros((2, 3), np.float32)
    a = e.copy()
    a[0, 1] = 1e-40
    a[1, 2] = 1.0  # far more ulps
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance())
    assert c.worst_index == (1, 2) and c.mismatches == 2


def test_bound_allows_per_element_error():
    e = np.array([10.0, 10.0, 10.0], np.float32)
    a = np.array([10.5, 10.5, 10.5], np.float32)
    bound = np.array([0.6, 0.4, np.nan])
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance(), bound=bound)
    assert not c.ok and c.mismatches == 1 and c.worst_index == (1,)
    assert c.checked == 3 and c.unbounded == 1  # NaN bound: the finite value is free, and counted


def test_bound_plus_final_rounding_ulps():
    """The bound is widened by max_ulp ulps of the output for the final rounding."""
    e = np.array([1.0], np.float32)
    a = np.array([1.0 + 0.25 + float(np.spacing(np.float32(1.25)))], np.float32)
    bound = np.array([0.25])
    assert not compare(e, a, exact=False, signed_zero=False, tol=Tolerance(), bound=bound).ok
    assert compare(e, a, exact=False, signed_zero=False, tol=Tolerance(max_ulp=2), bound=bound).ok


def test_nan_bound_frees_finite_values_only():
    """A NaN bound says nothing about a finite value, but NaN positions and infinities are still
    asserted exactly (issue 14: a NaN in must be a NaN out, whatever the bound)."""
    e = np.array([math.nan, 1.0, math.inf, 5.0], np.float32)
    a = np.array([2.0, math.nan, -math.inf, -7.0], np.float32)
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance(), bound=np.full(4, np.nan))
    assert not c.ok and c.checked == 4 and c.mismatches == 3 and c.unbounded == 2
    assert "NaN" in c.message and "inf" in c.message
    ok = compare(e[3:], a[3:], exact=False, signed_zero=False, tol=Tolerance(), bound=np.full(1, np.nan))
    assert ok.ok and ok.unbounded == 1


def test_bound_with_nonfinite_expected_is_warning_free():
    e = np.array([math.inf, math.nan, 1.0], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        c = compare(e, e.copy(), exact=False, signed_zero=False, tol=Tolerance(), bound=np.zeros(3))
    assert c.ok


def test_skip_mask_broadcasts():
    e = np.zeros((2, 3), np.float32)
    a = np.ones((2, 3), np.float32)
    c = compare(e, a, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE,
                skip=np.array([True, True, False]))
    assert not c.ok and c.mismatches == 2 and c.checked == 2
    assert compare(e, a, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE, skip=np.array(True)).ok


def test_shape_and_dtype_mismatch_messages():
    c = compare(np.zeros(2, np.float32), np.zeros(3, np.float32), exact=True, signed_zero=False,
                tol=BIT_EXACT_TOLERANCE, name="output 1")
    assert not c.ok and c.message == "output 1: shape (3,) != expected (2,)"
    c = compare(np.zeros(2, np.float32), np.zeros(2, np.float16), exact=True, signed_zero=False,
                tol=BIT_EXACT_TOLERANCE)
    assert not c.ok and c.message == "output: dtype float16 != expected float32"


def test_integers_and_bools_are_exact():
    e = np.array([1, 2, -3], np.int32)
    a = np.array([1, 7, -3], np.int32)
    c = compare(e, a, exact=False, signed_zero=False, tol=LOOSE)  # ints ignore the tolerance
    assert not c.ok and c.mismatches == 1 and c.worst_index == (1,) and c.max_abs_err == 5
    assert "1/3 elements differ; first at (1,)" in c.message
    assert compare(e, e.copy(), exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE).ok
    b = np.array([True, False])
    assert not compare(b, ~b, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE).ok
    assert compare(b, ~b, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE, skip=np.array(True)).ok


def test_uint_difference_measured_without_wraparound():
    e = np.array([0], np.uint8)
    a = np.array([255], np.uint8)
    c = compare(e, a, exact=True, signed_zero=False, tol=BIT_EXACT_TOLERANCE)
    assert c.max_abs_err == 255


def test_scalar_outputs():
    assert cmp(1.0, 1.0).ok
    c = cmp(1.0, 2.0, tol=Tolerance())
    assert not c.ok and c.worst_index == () and c.mismatches == 1


def test_empty_outputs_pass():
    c = compare(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), exact=False,
                signed_zero=True, tol=Tolerance())
    assert c.ok and c.checked == 0 and c.max_ulp == 0


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_low_precision_ulps_counted_in_output_dtype(name):
    e = arr([1.0], name)
    a = arr([1.0 + float(info(name).eps)], name)  # one ulp of the 16-bit type
    c = compare(e, a, exact=False, signed_zero=False, tol=Tolerance(max_ulp=1))
    assert c.ok and c.max_ulp == 1
    assert not compare(e, a, exact=False, signed_zero=False, tol=Tolerance(max_ulp=0.5)).ok


@pytest.mark.parametrize("name", FLOATS)
def test_element_errors_do_not_depend_on_the_order(name):
    """compare() passes (reference, target), accuracy.measure() (precise oracle, implementation):
    the per-element errors they share must be the same either way round, bit for bit."""
    vals = arr([0.0, -0.0, 1.0, -1.5, math.inf, -math.inf, math.nan, 3.0, 2.0**-20], name)
    x, y = np.meshgrid(vals, vals)
    xy, yx = element_errors(x, y), element_errors(y, x)
    assert np.array_equal(xy.expected, yx.actual, equal_nan=True)
    for f in ("nan", "finite", "nan_bad", "inf_bad", "signed_zero"):
        assert np.array_equal(getattr(xy, f), getattr(yx, f)), f
    for f in ("abs_diff", "ulp"):
        assert np.array_equal(getattr(xy, f).view(np.uint64), getattr(yx, f).view(np.uint64)), f
    assert xy.signed_zero.sum() == 2 and xy.nan_bad.sum() == 2 * (len(vals) - 1)


def test_asserted_mask_and_bound():
    mask, bound = asserted((2, 2), np.array([True, False]), np.array([[1.0, math.nan], [2.0, 3.0]]))
    assert mask.tolist() == [[False, True], [False, True]] and bound.dtype == np.float64
    b = Bound(np.ones((2, 2)), free=np.array([[True, False], [False, False]]), allow=np.uint8(NAN))
    mask, bound = asserted((2, 2), None, b)
    assert mask.tolist() == [[False, True], [True, True]] and bound.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    mask, bound = asserted((3,), None, None)
    assert mask.all() and bound is None


# -- wrong positions, kinds, and the index tuple behind them (issue 15 item 4) ----------------------
def test_a_failure_lists_its_first_wrong_positions_and_counts_per_kind():
    e = np.array([[1.0, 2.0, np.nan], [np.inf, 0.0, 5.0]], np.float32)
    a = np.array([[1.0, 2.5, 0.0], [np.inf, -0.0, 5.0]], np.float32)
    c = compare(e, a, exact=False, signed_zero=True, tol=Tolerance(max_ulp=1))
    assert c.positions == [(0, 1), (0, 2), (1, 1)]  # row-major order, not worst first
    assert c.kinds == {"NaN": 1, "value": 1, "signed zero": 1}
    assert not c.exact and "max ulp" in c.message
    ints = compare(np.arange(8, dtype=np.int32), np.arange(8, dtype=np.int32)[::-1].copy(), exact=True,
                   signed_zero=False, tol=BIT_EXACT_TOLERANCE)
    assert ints.exact and ints.kinds == {"value": 8} and len(ints.positions) == 5 and ints.positions[0] == (0,)
    assert compare(e, e.copy(), exact=False, signed_zero=True, tol=Tolerance()).positions == []


def test_a_bit_exact_float_failure_reports_positions_not_ulp_figures():
    """A value read from the wrong place is 1e9 ulp away or 1 ulp away by chance: the message of
    a bit-exact comparison names the wrong positions instead."""
    e = np.array([1.0, -2.0, 3.0], np.float64)
    a = np.array([1.0, 2.0, 3.0], np.float64)
    c = compare(e, a, exact=True, signed_zero=True, tol=BIT_EXACT_TOLERANCE)
    assert c.exact and c.positions == [(1,)] and "max ulp" not in c.message
    assert "first wrong at (1,)" in c.message


def test_gather_and_scatter_positions_map_back_to_their_index_tuples():
    from rlx_conformance.judge.positions import source

    data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[[1], [-1]], [[0], [2]]], np.int64)  # batch_dims 1: 2 batches x 2 tuples of depth 1
    assert source("onnx.GatherND", [data, idx], {"batch_dims": 1}, (1, 1, 3)) == "indices[1, 1, :] = (2,) (batch (1,))"
    assert source("onnx.GatherND", [data, idx[0]], {"batch_dims": 0}, (1, 0, 2)) == "indices[1, :] = (-1,)"
    gi = np.array([[0, 2], [1, 1]], np.int32)
    assert source("onnx.GatherElements", [data[0], gi], {"axis": 1}, (0, 1)) == "indices[0, 1] = 2"
    assert source("gather", [data[0], np.array([2, 0], np.int64)], {"axis": 0}, (1, 3)) == "indices[1] = 0"
    # ScatterND: cell (2, 1) is written by update row 0 and 2 (duplicates), cell (0, 0) by none
    d2 = np.zeros((3, 2), np.float32)
    si = np.array([[2], [1], [2]], np.int64)
    up = np.ones((3, 2), np.float32)
    got = source("onnx.ScatterND", [d2, si, up], {"reduction": "add"}, (2, 1))
    assert got == "written by updates[0, 1] via indices[0, :] = (2,); updates[2, 1] via indices[2, :] = (2,)"
    assert "no update writes it" in source("onnx.ScatterND", [d2, si, up], {"reduction": "add"}, (0, 0))
    assert source("scatter_add", [up, np.array([2, -2, 2])], {"out_dim": 3}, (2, 0)) == \
        "rows indices[0] = 2; indices[2] = 2"
    assert source("exp", [data], {}, (0, 0, 0)) is None
