"""The judge's fast paths give the general path's results bit for bit (issue 18: the judge's CPU
on large arrays, every record the same). Each test computes one quantity both ways, on random
values and on the special ones a fast path must not get wrong (NaN, infinities, signed zeros,
subnormals, ties, overflow)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from rlx_conformance.judge import compare, precise, rounding
from rlx_conformance.judge.bounds import summation
from rlx_conformance.judge.bounds.reduce import _reducer, _scanner

RNG_SEED = 18
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1e-40, 6e-8, 65504.0, 3.0e38, 1.0, -1.0]
FLOATS = [np.float32, np.float16, ml_dtypes.bfloat16, np.float64]


def _bits(a) -> bytes:
    a = np.asarray(a)
    return a.dtype.str.encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes()


def _values(a) -> bytes:
    """:func:`_bits` with every NaN made the same NaN."""
    a = np.array(a)
    if a.dtype.kind == "f":
        a[np.isnan(a)] = np.nan
    return _bits(a)


def _random(rng, dtype, n: int, specials: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5)).astype(dtype)
        if specials:
            x[rng.integers(0, n, specials)] = np.array(rng.choice(SPECIAL, specials)).astype(dtype)
    return x


@pytest.mark.skipif(not precise.WIDE_LONGDOUBLE, reason="the long double scan needs x87 extended or wider")
@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_exact_running_sum_is_the_doubling_tree(dtype):
    """Where _sums_exact says every partial sum is exact, np.cumsum in long double gives the
    recursive doubling's values, zero signs included (NaN payloads aside)."""
    rng = np.random.default_rng(RNG_SEED)
    said = 0
    for t in range(60):
        n = int(rng.integers(2, 3000))
        x = _random(rng, dtype, n, specials=3 if t % 2 else 0)
        if t % 5 == 0:
            x[:] = -0.0
        if t % 7 == 0:
            x = np.concatenate([x, -x]).astype(dtype)
        if not precise._sums_exact(x):
            continue
        said += 1
        w = x.astype(np.longdouble)
        with np.errstate(all="ignore"):
            tree, run = precise._doubling(w.copy()), np.cumsum(w)
        nan = np.isnan(tree) & np.isnan(run)
        assert np.array_equal(np.isnan(tree), np.isnan(run))
        assert np.array_equal(tree[~nan], run[~nan]) and np.array_equal(np.signbit(tree[~nan]), np.signbit(run[~nan]))
    if dtype is not np.float64:
        assert said > 20  # the shortcut applies to most narrow inputs


@pytest.mark.skipif(not precise.WIDE_LONGDOUBLE, reason="the long double scan needs x87 extended or wider")
def test_sums_exact_refuses_an_inexact_running_sum():
    """Terms spanning more than the 64-bit significand, where the order matters: the sequential
    sum rounds 1 + 2^-64 back to 1 (a tie, to even) twice, the tree adds 2^-64 + 2^-64 first and
    keeps it. The test must refuse the shortcut there."""
    x = np.array([1.0, 2.0**-64, 2.0**-64, 2.0**-64], np.float64)
    assert not precise._sums_exact(x)
    w = x.astype(np.longdouble)
    assert precise._doubling(w.copy())[2] != np.cumsum(w)[2]


def _ld_cases(rng, p: int, emin: int, n: int) -> np.ndarray:
    """Long doubles at, just above and just below the midpoints between neighbours of a binary
    format of p bits, across its normal and subnormal range, of both signs."""
    ld = np.longdouble
    base = rng.integers(1 << (p - 1), 1 << p, n).astype(ld)
    e = rng.integers(emin - p - 3, 20, n)
    half = np.ldexp(base + ld(0.5), e)
    out = [half + d * np.ldexp(ld(1), e - 40) for d in (0, 1, -1)]
    return np.concatenate(out) * np.where(rng.random(3 * n) < 0.5, -1, 1)


@pytest.mark.skipif(not precise.WIDE_LONGDOUBLE, reason="needs a long double wider than float64")
def test_round_ld_float32_is_round_dd():
    """round_ld to float32 (numpy's cast) is round_dd of the hi + lo split (round to odd, then to
    nearest): ties, near-ties, subnormals, overflow and the special values."""
    rng = np.random.default_rng(RNG_SEED)
    ld = np.longdouble
    fmax = ld(np.finfo(np.float32).max)
    v = np.concatenate([
        _ld_cases(rng, 24, -126, 20000),
        np.ldexp(rng.integers(1 << 62, 1 << 63, 20000, dtype=np.uint64).astype(ld) / ld(2) ** 63,
                 rng.integers(-200, 200, 20000)),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan], ld),
        np.array([fmax * (1 + ld(2) ** -25), fmax * (1 + ld(2) ** -24), ld(2) ** -150,
                  ld(2) ** -150 * (1 + ld(2) ** -60), ld(2) ** -20000, ld(2) ** 20000], ld)])
    v = np.concatenate([v, -v])
    with np.errstate(all="ignore"):
        hi = v.astype(np.float64)
        lo = np.where(np.isfinite(hi), (v - hi.astype(ld)).astype(np.float64), 0.0)
        want = rounding.round_dd(hi, lo, "float32")
        got = rounding.round_ld(v, "float32")
    assert got.dtype == want.dtype == np.float32
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got))
    assert np.array_equal(want.view(np.uint32)[~nan], got.view(np.uint32)[~nan])


def test_odd_round64_matches_the_definition():
    """_odd_round to float64 on the bits: truncate hi + lo toward zero (one step where lo points
    back across hi), then set the last bit where inexact; NaN/inf untouched."""
    rng = np.random.default_rng(RNG_SEED)
    sp = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 1.0, -1.0, np.finfo(np.float64).max])
    for k in range(100):
        hi = rng.choice(sp, 500) if k % 2 else rng.standard_normal(500) * 10.0 ** rng.integers(-300, 300)
        lo = rng.choice(sp, 500) if k % 3 == 0 else rng.standard_normal(500) * np.where(rng.random(500) < 0.3, 0, 1e-20)
        with np.errstate(invalid="ignore"):
            inexact = np.isfinite(hi) & (lo != 0)
            over = inexact & (np.sign(lo) != np.sign(hi)) & (hi != 0)
            t = np.where(over, np.nextafter(hi, 0.0), hi)
            want = (t.view(np.uint64) | inexact.astype(np.uint64)).view(np.float64)
            got = rounding._odd_round(hi, lo, np.float64)
        assert _bits(want) == _bits(got)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_ulp_size_bits_match_frexp(dtype):
    """ulp_size of an array (the bit path for narrower dtypes) equals ulp_size of each element as
    a scalar (the frexp path), specials included."""
    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal(3000) * 10.0 ** rng.integers(-320, 308, 3000).astype(float)
    x[::7] = rng.choice(SPECIAL + [2.2250738585072014e-308, 1.7976931348623157e308], len(x[::7]))
    got = compare.ulp_size(x.reshape(60, 50), dtype)
    want = np.array([compare.ulp_size(np.float64(v), dtype) for v in x]).reshape(60, 50)
    assert _bits(got) == _bits(want)


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_element_errors_fast_path_matches_general(dtype):
    """Finite arrays take element_errors' shortcuts (no NaN/inf masks computed; int64 ordered
    bits for <= 32-bit floats): the same fields as the general path, which the same arrays with
    a NaN appended take."""
    rng = np.random.default_rng(RNG_SEED)
    for t in range(40):
        n = int(rng.integers(1, 2000))
        e = _random(rng, dtype, n, 0)
        with np.errstate(over="ignore"):
            a = (e.astype(np.float64) * (1 + rng.standard_normal(n) * 1e-3)).astype(dtype)
        if t % 2:
            e[rng.integers(0, n, 5)] = 0.0
            a[rng.integers(0, n, 5)] = -0.0
        fast = compare.element_errors(e, a)
        general = compare.element_errors(np.append(e, np.array([np.nan]).astype(dtype)),
                                         np.append(a, np.array([1.0]).astype(dtype)))
        assert fast.all_finite and not general.all_finite
        for f in ("expected", "actual", "nan", "finite", "abs_diff", "ulp", "nan_bad", "inf_bad", "signed_zero"):
            assert _bits(getattr(fast, f)) == _bits(getattr(general, f)[:-1]), f
        # the int64 ordering agrees with the uint64 one of ordered_bits
        if np.dtype(dtype).itemsize <= 4:
            oa, ob = compare.ordered_bits(e), compare.ordered_bits(a)
            want = (np.maximum(oa, ob) - np.minimum(oa, ob)).astype(np.float64)
            assert _bits(fast.ulp) == _bits(want)


def test_terms_fast_paths_match_general():
    """sum_terms and prod_terms on finite (nonzero) terms skip the flags: the same fields as the
    general path, which the same rows with a row holding a NaN, an infinity and a zero take."""
    rng = np.random.default_rng(RNG_SEED)
    for t in range(40):
        rows, n = int(rng.integers(1, 6)), int(rng.integers(1, 50))
        x = rng.standard_normal((rows, n)) * 10.0 ** rng.integers(-5, 5)
        extra = np.vstack([x, np.r_[np.nan, np.inf, 0.0, x[0, 3:]][:n]])
        for red in (lambda v: _reducer(v, {"axes": (1,), "keep_dim": bool(t % 2)}),
                    lambda v: _scanner(v, {"axis": 1, "reverse": bool(t % 3 == 0), "exclusive": bool(t % 2)})):
            with np.errstate(all="ignore"):
                for terms, fields in ((summation.sum_terms, ("pos", "neg", "nan", "pinf", "ninf")),
                                      (summation.prod_terms, ("nan", "inf", "zero", "negative", "up", "down"))):
                    fast, general = terms(x, red(x)), terms(extra, red(extra))
                    for f in fields:
                        assert _bits(getattr(fast, f)) == _bits(getattr(general, f)[:rows]), (terms.__name__, f)


def test_terms_shared_by_bound_and_budget_never_stale():
    """The bound's and the budget's maps of one op and attributes share their terms (computed
    once), read-only; the same call on changed values computes them afresh."""
    from rlx_conformance.judge import budgets

    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal((4, 300))
    for attrs in ({"axis": 1, "reverse": True, "exclusive": True}, {"axes": (1,), "keep_dim": False}):
        bound_map = _scanner(x, attrs) if "axis" in attrs else _reducer(x, attrs)
        budget_map, _ = budgets._along("cumsum" if "axis" in attrs else "reduce_sum", x, attrs)
        for terms in (summation.sum_terms, summation.prod_terms):
            a = terms(x, bound_map)
            b = terms(x.copy(), budget_map)
            assert a is b
            fresh = terms(x, lambda v: bound_map(v))  # no terms_key: computed, not cached
            assert all(_bits(getattr(a, f)) == _bits(getattr(fresh, f)) for f in vars(a))
            assert all(not v.flags.writeable for v in vars(a).values() if isinstance(v, np.ndarray))
            y = x.copy()
            y[0, -1] = abs(y[0, -1]) + 1.0  # in every output of row 0 (pos, and up, grow)
            c = terms(y, bound_map)
            assert c is not a and _bits(c.pos if hasattr(c, "pos") else c.up) != _bits(a.pos if hasattr(a, "pos") else a.up)


def _mpfr_rounded(v: np.ndarray, dtype) -> np.ndarray:
    """Each long double of ``v`` rounded once to float32 / float64 by MPFR (gmpy2: the format's
    precision and exponent range, subnormals by ``subnormalize``), from its exact value (its
    64-bit significand as a Python integer times a power of two): an oracle independent of the
    C conversion and of round_dd."""
    import gmpy2

    fi = np.finfo(dtype)
    prec = fi.nmant + 1
    ctx = gmpy2.context(precision=prec, emin=fi.minexp - fi.nmant + 1, emax=fi.maxexp,
                        subnormalize=True, round=gmpy2.RoundToNearest)
    wide = gmpy2.context(precision=64, emin=-30000, emax=30000)  # every long double exactly
    out = []
    for x in v:
        if np.isnan(x) or np.isinf(x) or x == 0:
            out.append(float(x))
            continue
        m, e = np.frexp(x)
        with gmpy2.context(wide):
            exact = gmpy2.mul_2exp(gmpy2.mpfr(int(np.ldexp(m, 64))), int(e) - 64)
        with gmpy2.context(ctx):
            out.append(float(gmpy2.mpfr(exact)))
    return np.array(out, dtype)


@pytest.mark.skipif(not precise.WIDE_LONGDOUBLE, reason="needs a long double wider than float64")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_ld_is_mpfr(dtype):
    """round_ld to float32 / float64 rounds once, as MPFR does: ties and near-ties at the
    format's precision, the whole subnormal range (where a hi + lo split of float64s would round
    lo first), the overflow threshold, signed zeros and the special values."""
    rng = np.random.default_rng(RNG_SEED)
    ld = np.longdouble
    fi = np.finfo(dtype)
    p, emin = fi.nmant + 1, fi.minexp
    fmax = ld(fi.max)
    v = np.concatenate([
        _ld_cases(rng, p, emin, 3000),  # ties and near-ties among the normals
        _ld_cases(rng, p - 20, emin - 20, 3000),  # ... and among the subnormals
        np.ldexp(rng.integers(1 << 62, 1 << 63, 3000, dtype=np.uint64).astype(ld) / ld(2) ** 63,
                 rng.integers(emin - fi.nmant - 3, emin + 12, 3000)),  # across the subnormal range
        np.ldexp(rng.integers(1 << 62, 1 << 63, 3000, dtype=np.uint64).astype(ld) / ld(2) ** 63,
                 rng.integers(-200, 200, 3000)),
        np.array([0.0, np.inf, np.nan, ld(2) ** (emin - p), ld(2) ** (emin - p) * (1 + ld(2) ** -60),
                  ld(2) ** (emin - p + 1) * 3 / 4, fmax * (1 + ld(2) ** -p), fmax * (1 + ld(2) ** -(p - 1)),
                  ld(2) ** -20000, ld(2) ** 20000], ld)])
    v = np.concatenate([v, -v])
    with np.errstate(all="ignore"):
        got = rounding.round_ld(v, np.dtype(dtype).name)
    want = _mpfr_rounded(v, dtype)
    assert got.dtype == want.dtype
    nan = np.isnan(want)
    assert np.array_equal(nan, np.isnan(got))
    u = np.uint32 if dtype == np.float32 else np.uint64
    bad = np.flatnonzero(want.view(u)[~nan] != got.view(u)[~nan])
    assert bad.size == 0, [(repr(v[~nan][i]), got[~nan][i], want[~nan][i]) for i in bad[:5]]


def test_round_dd_float64_keeps_the_sign_of_zero():
    """round_dd to float64 of hi + 0 is hi: -0 stays -0 (hi + lo would make it +0)."""
    hi = np.array([-0.0, 0.0, -5e-324, 1.0, np.inf, -np.inf])
    got = rounding.round_dd(hi, np.zeros_like(hi), "float64")
    assert _bits(got) == _bits(hi)


@pytest.mark.parametrize("rms", [False, True])
def test_normalize_bound_fast_path_matches_general(rms):
    """layer/rms norm's bound on finite x, gamma, beta (the shortcut) equals the general path's
    rows, which the same rows with one more row holding a NaN and an infinity take; rows of
    small spread (vacuous bound) and of huge values (overflow: order-dependent) included."""
    from rlx_conformance.judge.bounds import nn

    rng = np.random.default_rng(RNG_SEED)
    seen_vacuous = seen_free = 0
    for t in range(30):
        rows, n = int(rng.integers(1, 6)), int(rng.integers(2, 40))
        x = rng.standard_normal((rows, n)) * 10.0 ** rng.integers(-3, 3)
        x[0] = 100 + 1e-13 * rng.standard_normal(n)  # small spread: vacuous (float64)
        if t % 3 == 0:
            x[-1] *= 1e306  # overflow
        g, b = rng.standard_normal(n), rng.standard_normal(n)
        extra = np.vstack([x, np.r_[np.nan, np.inf, x[0, 2:]]])
        fn = nn.rms_norm_bound if rms else nn.layer_norm_bound
        for dtype in (np.float32, np.float64):
            with np.errstate(over="ignore"):
                fast = fn([x.astype(dtype), g.astype(dtype), b.astype(dtype)], {"axis": -1, "eps": 0.0}, np.dtype(dtype).name)
                general = fn([extra.astype(dtype), g.astype(dtype), b.astype(dtype)], {"axis": -1, "eps": 0.0},
                             np.dtype(dtype).name)
            for f in ("abs", "free", "allow"):  # a NaN's sign bit aside: numpy's SIMD and scalar
                # loops (another array length) may give 0 * inf the other one; no judge reads it
                assert _values(getattr(fast, f)) == _values(getattr(general, f)[:rows]), f
            seen_vacuous += int(np.isinf(fast.abs).any())
            seen_free += int(fast.free.any())
    assert seen_free and (rms or seen_vacuous)  # both of the shortcut's outcomes were compared


@pytest.mark.parametrize("dtype", FLOATS, ids=lambda d: np.dtype(d).name)
def test_ulp_size_of_own_bits_matches_ulp_size(dtype):
    """ulp_size_of (a table per exponent code) equals ulp_size of the same values as float64,
    every bit pattern of the 16-bit formats and random float32/float64 with the special values."""
    name = np.dtype(dtype).name
    rng = np.random.default_rng(RNG_SEED)
    if np.dtype(dtype).itemsize == 2:
        x = np.arange(1 << 16, dtype=np.uint16).view(dtype).reshape(256, 256)
    else:
        x = _random(rng, dtype, 20000, 2000)
        x[:5] = np.array([np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal,
                          np.finfo(dtype).tiny, -np.finfo(dtype).tiny, -np.inf]).astype(dtype)
    with np.errstate(over="ignore"):
        assert _bits(compare.ulp_size_of(x)) == _bits(compare.ulp_size(x.astype(np.float64), name))


def test_where0_is_np_where_in_bits_and_layout():
    """summation._where0 gives np.where(cond, v, 0.0) bit for bit and in the same memory layout
    (a later pairwise sum groups by it): contiguous arrays, strided and transposed views, 0-d."""
    rng = np.random.default_rng(RNG_SEED)
    x = rng.standard_normal((6, 8))
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    for v in (x, -x, x.T, x[:, ::2], np.asarray(x[3, 4]), x[3, 4]):
        for cond in (v > 0, np.isfinite(v) & (v < 0)):
            got, want = summation._where0(cond, v), np.where(cond, v, 0.0)
            assert _bits(got) == _bits(want) and np.shape(got) == np.shape(want)
            assert np.asarray(got).strides == np.asarray(want).strides
