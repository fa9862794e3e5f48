"""Seeding determinism and value classes (rlx_conformance/spec/values.py, matrix.make_inputs).

A case id must name its inputs exactly, on any machine and in any process: a failure reported
by id is reproduced from the id alone.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate import matrix
from rlx_conformance.spec import values

T = matrix.Target("mlx", "cpu", "eager")

NEG_SPECIAL = matrix.Case("neg", "float32", ((1031,),), "prime", (), "special", T)
SUM_INT = matrix.Case("reduce_sum", "int32", ((3, 5),), "matrix",
                      (("axes", (1,)), ("keep_dim", False)), "random", T)
ADD_BF16 = matrix.Case("add", "bfloat16", ((3, 1), (1, 4)), "row_col", (), "random", T)


def digest(arrays: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for x in arrays:
        h.update(f"{x.dtype.name}:{x.shape}:".encode())
        h.update(x.tobytes())
    return h.hexdigest()


# -- golden digests ------------------------------------------------------------------------------
# These digests pin the generator's stream across numpy versions and machines: PCG64's raw
# output, seed_of's hashing, every transformation in values.py, and the "real" domain in
# cases/domains/. If one changes, existing case ids no longer reproduce the inputs they name
# (reports and repro bundles from older runs go stale): change them only on purpose, and say so.
GOLDEN = [
    (matrix.Case("reduce_sum", "float32", ((1000003,),), "huge", (("axes", ()), ("keep_dim", False)),
                 "tiny_tail", T), "reduce_sum/float32/shape:1000003/axes:all/keep_dim:false/vals:tiny_tail",
     "7bbe8550dc4a7d5bb0eef7aaf9b5132b5345c11a3cdbfa7b7ba1a4c1aba6d23b"),
    (NEG_SPECIAL, "neg/float32/shape:1031/vals:special",
     "267b300cef86661893759a27011706ab9e59f4423ba21f51abb8d045709283a0"),
    (SUM_INT, "reduce_sum/int32/shape:3x5/axes:1/keep_dim:false/vals:random",
     "d554fa83499a551f83a7a1570cf9486d8e8780641754a9baa9fb0db89f491617"),
    (ADD_BF16, "add/bfloat16/shape:3x1+1x4/vals:random",
     "916009daf9e89538119d1f535db24dd671e8a3e4efe1bcd4ecb01f6de353a8e9"),
]


@pytest.mark.parametrize("case,input_id,golden", GOLDEN, ids=[g[1] for g in GOLDEN])
def test_golden_digest(case, input_id, golden):
    assert case.input_id == input_id
    assert digest(matrix.make_inputs(case)) == golden


def test_golden_raw_stream():
    """The bottom of the stack: seed_of (sha256) and PCG64.random_raw."""
    assert values.seed_of("golden") == int.from_bytes(hashlib.sha256(b"golden").digest()[:8], "little")
    assert values.Stream("golden").raw(4).tolist() == [
        1135875090724364891, 2737282478298595397, 4865562034836386984, 11690961258206401662]


# -- determinism -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [NEG_SPECIAL, SUM_INT, ADD_BF16], ids=lambda c: c.input_id)
def test_same_id_same_inputs_twice(case):
    a, b = matrix.make_inputs(case), matrix.make_inputs(case)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def test_same_id_same_inputs_in_fresh_process(tmp_path):
    """A fresh interpreter with a different hash seed makes the same bytes."""
    code = (
        "import hashlib; from rlx_conformance.generate import matrix\n"
        "T = matrix.Target('cpu', 'cpu', 'eager')\n"
        "cs = [matrix.Case('neg', 'float32', ((1031,),), 'prime', (), 'special', T),\n"
        "      matrix.Case('add', 'bfloat16', ((3, 1), (1, 4)), 'row_col', (), 'random', T)]\n"
        "for c in cs:\n"
        "    h = hashlib.sha256()\n"
        "    for x in matrix.make_inputs(c):\n"
        "        h.update(f'{x.dtype.name}:{x.shape}:'.encode()); h.update(x.tobytes())\n"
        "    print(h.hexdigest())\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.split()
    # Another target, same input id: the target is not part of the seed.
    assert out == [digest(matrix.make_inputs(NEG_SPECIAL)), digest(matrix.make_inputs(ADD_BF16))]


def test_target_does_not_change_inputs():
    other = dataclasses.replace(NEG_SPECIAL, target=matrix.Target("mlx", "gpu", "compiled"))
    assert other.id != NEG_SPECIAL.id and other.input_id == NEG_SPECIAL.input_id
    assert digest(matrix.make_inputs(other)) == digest(matrix.make_inputs(NEG_SPECIAL))


def _neg(shape, vals):
    return matrix.Case("neg", "float32", (shape,), "x", (), vals, T)


def test_different_ids_different_inputs():
    base = matrix.make_inputs(_neg((1031,), "random"))[0]
    special = matrix.make_inputs(_neg((1031,), "special"))[0]
    shorter = matrix.make_inputs(_neg((7,), "random"))[0]
    as_abs = matrix.make_inputs(matrix.Case("abs", "float32", ((1031,),), "x", (), "random", T))[0]
    assert not np.array_equal(base, special, equal_nan=True)
    assert not np.array_equal(base[:7], shorter)  # not a prefix of a longer draw
    assert not np.array_equal(base, as_abs)
    a, b = matrix.make_inputs(matrix.Case("add", "float32", ((1031,), (1031,)), "same", (), "random", T))
    assert not np.array_equal(a, b)  # each input has its own stream
    s1 = matrix.make_inputs(dataclasses.replace(SUM_INT, attrs=(("axes", (0,)), ("keep_dim", False))))[0]
    assert not np.array_equal(s1, matrix.make_inputs(SUM_INT)[0])  # attributes are in the id


def test_case_seed_is_hash_of_input_id():
    assert NEG_SPECIAL.seed == values.seed_of(NEG_SPECIAL.input_id)
    assert values.seed_of("a") != values.seed_of("b")


# -- Stream transformations --------------------------------------------------------------------------
def test_stream_raw_reproducible_and_keyed():
    assert np.array_equal(values.Stream("k").raw(100), values.Stream("k").raw(100))
    assert not np.array_equal(values.Stream("k").raw(100), values.Stream("k2").raw(100))
    assert values.Stream("k").raw(0).dtype == np.uint64 and values.Stream("k").raw(0).size == 0


@given(key=st.text(max_size=20), lo=st.integers(-2**40, 2**40), span=st.integers(0, 300))
def test_stream_integers_in_closed_range(key, lo, span):
    v = values.Stream(key).integers(500, lo, lo + span)
    assert v.min() >= lo and v.max() <= lo + span
    if span <= 5:  # 500 draws hit every value of a tiny range
        assert set(v.tolist()) == set(range(lo, lo + span + 1))


@given(key=st.text(max_size=20), lo=st.floats(-1e6, 1e6), width=st.floats(1e-3, 1e6))
def test_stream_uniform_in_half_open_range(key, lo, width):
    v = values.Stream(key).uniform(500, lo, lo + width)
    assert v.min() >= lo and v.max() <= lo + width


def test_stream_choice_and_coin():
    c = values.Stream("c").choice(1000, 5)
    assert set(c.tolist()) == set(range(5))
    coins = values.Stream("c").coin(1000)
    assert coins.dtype == bool and 400 < coins.sum() < 600


# -- value classes ---------------------------------------------------------------------------------
def _has_specials(x: np.ndarray, name: str) -> list[str]:
    """Names of the required special values that x lacks."""
    fi = dt.finfo(name)
    v = x.astype(np.float64)
    need = {
        "nan": np.isnan(v).any(),
        "+inf": (v == math.inf).any(),
        "-inf": (v == -math.inf).any(),
        "+0": ((v == 0) & ~np.signbit(v)).any(),
        "-0": ((v == 0) & np.signbit(v)).any(),
        "subnormal": ((np.abs(v) > 0) & (np.abs(v) < fi.tiny)).any(),
        "+max": (v == fi.max).any(),
        "-max": (v == -fi.max).any(),
    }
    return [k for k, ok in need.items() if not ok]


@pytest.mark.parametrize("name", dt.FLOATS)
def test_special_pool_has_ieee_specials(name):
    pool = values.specials(name, "real", {})
    assert pool.dtype == dt.np_dtype(name)
    assert _has_specials(pool, name) == []


def test_special_class_inputs_contain_specials():
    x = matrix.make_inputs(NEG_SPECIAL)[0]
    assert _has_specials(x, "float32") == []


def test_random_class_has_no_specials_and_respects_domain():
    lo, hi = data.load("domains")["real"]["range"]
    x = matrix.make_inputs(_neg((1031,), "random"))[0]
    assert np.isfinite(x).all() and x.min() >= lo and x.max() <= hi
    assert np.unique(x).size > 1000  # actually random, not a constant


def test_int_random_clipped_to_domain_and_dtype():
    lo, hi = data.load("domains")["real"]["range"]
    c = matrix.Case("reduce_sum", "uint8", ((1031,),), "prime", (("axes", ()), ("keep_dim", False)),
                    "random", T)
    x = matrix.make_inputs(c)[0]
    assert x.dtype == np.uint8 and x.min() >= max(lo, 0) and x.max() <= hi


def test_int_special_class_has_extremes():
    c = matrix.Case("reduce_sum", "int8", ((1031,),), "prime", (("axes", ()), ("keep_dim", False)),
                    "special", T)
    x = matrix.make_inputs(c)[0]
    assert {-128, 127, 0}.issubset(set(x.tolist()))


def test_spread_class_is_large_and_narrow():
    c = matrix.Case("reduce_sum", "float32", ((1031,),), "prime", (("axes", ()), ("keep_dim", False)),
                    "spread", T)
    x = matrix.make_inputs(c)[0].astype(np.float64)
    mid = np.median(x)
    assert mid >= 2.0**10 and np.all(np.abs(x / mid - 1) <= 2 * 2.0**-10)
    assert np.unique(x).size > 100


# -- the accumulation classes ------------------------------------------------------------------------
HUGE_SUM = (("axes", ()), ("keep_dim", False))


def _huge(op: str, dtype: str, vals: str, shape=(1000003,)) -> np.ndarray:
    attrs = HUGE_SUM if op.startswith("reduce") else ()
    return matrix.make_inputs(matrix.Case(op, dtype, (shape,), "huge", attrs, vals, T))[0]


def test_classes_for_sizes_and_dtypes():
    """Accumulation classes from 2^17 elements, float dtypes only; from 10^6 only random and
    them, and nothing for an op that declares none; ops whose families are not input shapes
    (CSR [rows, columns]) keep their classes."""
    acc = ("random", "special", "spread") + values.ACCUMULATION_CLASSES
    plain = ("random", "special", "spread")
    assert values.classes_for(acc, "float32", [(1031,)]) == plain
    assert values.classes_for(acc, "float32", [(2, 131072)]) == acc
    assert values.classes_for(acc, "int32", [(2, 131072)]) == plain
    assert values.classes_for(acc, "float16", [(1000003,)]) == ("random",) + values.ACCUMULATION_CLASSES
    assert values.classes_for(acc, "int32", [(1000003,)]) == ()
    assert values.classes_for(plain, "float32", [(1000003,)]) == ()
    assert values.classes_for(("random", "dense_rows"), "float32", [(10000, 10000)], inputs=False) == \
        ("random", "dense_rows")


def test_new_classes_only_add_cases():
    """No existing case changes its classes: below 2^17 elements nothing is new."""
    for spec_values in (("random",), ("random", "special", "spread")):
        for d in dt.FLOATS:
            assert values.classes_for(spec_values, d, [(100003,)]) == spec_values


@pytest.mark.parametrize("name", dt.FLOATS)
def test_tiny_tail_defeats_an_accumulator_in_the_input_precision(name):
    """1, then terms just below half an ulp of 1: each one added to the 1 in the input's own
    precision is lost, while together they are n 2^-(p+1) of it."""
    x = _huge("reduce_sum", name, "tiny_tail")
    npd = dt.np_dtype(name)
    one, t = x[0], x[1:]
    assert (one + t[:100] == one).all() and (t > 0).all()
    tail = float(np.sum(t.astype(np.float64)))
    assert tail / float(one) > 0.5 * t.size * 2.0 ** -(dt.finfo(name).mant_bits + 1)  # n ulp/2 of the 1
    assert npd == x.dtype


@pytest.mark.parametrize("name", dt.FLOATS)
def test_accumulation_classes_keep_sums_finite(name):
    big = float(dt.finfo(name).max)
    for vals in values.ACCUMULATION_CLASSES:
        x = _huge("reduce_sum", name, vals).astype(np.float64)
        assert np.isfinite(x).all() and np.abs(x).sum() <= math.sqrt(big) * 2, (name, vals)
        assert np.abs(x).sum() > 0


def test_accumulation_class_shapes():
    x = _huge("reduce_sum", "float32", "constant").astype(np.float64)
    assert (x == np.float32(0.1)).all()
    x = _huge("reduce_sum", "float64", "offset")
    assert np.abs(x - 1000).max() <= 1 / 16 and np.unique(x).size > 1000
    x = _huge("reduce_sum", "float64", "alternating")
    assert (np.sign(x[::2]) == 1).all() and (np.sign(x[1::2]) == -1).all()
    assert abs(x.sum()) < 1e-3 * np.abs(x).sum()
    x = _huge("reduce_sum", "float64", "increasing")
    assert x[-1000:].min() > 100 * x[:1000].max()
    # laid out per row of the last axis: each row starts the pattern again
    x = _huge("reduce_sum", "float32", "tiny_tail", shape=(4, 250001))
    assert (x[:, 0] == 1).all() and (x[:, 1:] < 2.0**-23).all()


def test_product_domain_factors_stay_in_range():
    """reduce_prod's domain (near_one, accumulate = "product"): factors 2^(8 v / sum|v|), so
    every partial product, in any order, stays within 2^(+-8)."""
    for vals in values.ACCUMULATION_CLASSES:
        x = _huge("reduce_prod", "float64", vals)
        lg = np.log2(x)
        assert np.abs(lg).sum() <= 8 * (1 + 1e-9), vals


def test_structural_domain_draws_random():
    """An input whose domain is structural (integers_only: a mask, ties) gets the random class."""
    s1, s2 = values.Stream("k"), values.Stream("k")
    a = values.make_array(s1, (4, 6), "float32", "nn_mask", "constant", {})
    b = values.make_array(s2, (4, 6), "float32", "nn_mask", "random", {})
    assert np.array_equal(a, b)


# -- gradient-only classes (kink, ties, near_zero) ------------------------------------------------
def _grad_case(op: str, dtype: str, vals: str, family: str | None = None) -> matrix.Case:
    """The first vjp case of ``op`` in class ``vals`` (of shape family ``family`` if given)."""
    cases = [c for c in matrix.generate([T], ops=[op], dtypes=[dtype], grads=("vjp",))
             if c.vals == vals and (family is None or c.family == family)]
    assert cases, (op, dtype, vals, family)
    return cases[0]


GRAD_CASES = [_grad_case("relu", "bfloat16", "kink", "prime"),
              _grad_case("max", "float32", "ties", "same"),
              _grad_case("sqrt", "float16", "near_zero", "prime")]
GRAD_GOLDEN = {  # as GOLDEN above: the new classes' generators pinned (change only on purpose)
    "relu/bfloat16/shape:1031/vals:kink": "022c30db0875ad1b4a7c2ccb4abd93e1236496fc69138af600701fa0842c47dd",
    "max/float32/shape:1031+1031/vals:ties": "4eeb4cb71c87a1428886afabddd8ad9ce91b0c5ee9982cc88f6fbdd9bef65d53",
    "sqrt/float16/shape:1031/vals:near_zero": "d1a869ebbc563f6987c4b39ffbd7926b80d16a3736b67701b9bb1f2120b88d94",
}


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.forward_id)
def test_grad_classes_golden_and_deterministic(case):
    """A derivative case's inputs are its forward id's (the grad segment and target do not
    change them), the same twice, and pinned."""
    a, b = matrix.make_inputs(case), matrix.make_inputs(dataclasses.replace(case, grad="jvp"))
    assert digest(a) == digest(b) == GRAD_GOLDEN[case.forward_id]
    other = dataclasses.replace(case, shapes=tuple((1030,) for _ in case.shapes))
    assert digest(matrix.make_inputs(other)) != digest(a)


def _pool_hits(x: np.ndarray, pool: np.ndarray) -> np.ndarray:
    return np.isin(x.astype(np.float64), pool.astype(np.float64))


@pytest.mark.parametrize("dtype", dt.FLOATS)
@pytest.mark.parametrize("domain,attrs", [("real", {}), ("hard", {}), ("positive", {}),
                                          ("clamp", {"min": -3.0, "max": 5.0})])
def test_kink_class_has_the_points_and_their_neighbours(dtype, domain, attrs):
    """Half the elements (a coin) at a declared kink or one ulp either side, every such point
    present, the rest the random class's draw, on both sides of each kink."""
    kinks = values.kinks(dtype, domain, attrs)
    assert kinks, domain
    pool = values.kink_points(dtype, domain, attrs)
    assert len(pool) == 3 * len(kinks)  # each point and one neighbour on either side
    x = values.make_array(values.Stream("kink-test#0"), (4000,), dtype, domain, "kink", attrs)
    rnd = values.make_array(values.Stream("kink-test#0"), (4000,), dtype, domain, "random", attrs)
    hit = _pool_hits(x, pool)
    assert 0.45 < hit.mean() < 0.55
    assert set(np.unique(x[hit].astype(np.float64))) == set(pool.astype(np.float64))
    assert np.array_equal(x[~hit], rnd[~hit])  # the other half: the random draw, unchanged
    for k in kinks:
        assert (x.astype(np.float64) < k).any() and (x.astype(np.float64) > k).any()
    up = np.nextafter(np.float32(kinks[0]), np.float32(np.inf)) if dtype == "float32" else None
    if up is not None:
        assert (x == up).any()


def test_clamp_kinks_follow_the_attributes():
    for lo, hi in [(-3.0, 5.0), (0.0, 6.0)]:
        assert values.kinks("float32", "clamp", {"min": lo, "max": hi}) == [lo, hi]


def test_grad_classes_draw_random_without_kinks_or_floats():
    """An input with nothing to place (no kinks in its domain, an integer or bool input) keeps
    the random class's draw."""
    for dtype, domain, vals in [("float32", "pow_exp", "kink"), ("float32", "sigmoid", "near_zero"),
                                ("int32", "real", "kink"), ("int32", "real", "ties"),
                                ("bool", "real", "ties")]:
        a = values.make_array(values.Stream("g#0"), (50,), dtype, domain, vals, {})
        b = values.make_array(values.Stream("g#0"), (50,), dtype, domain, "random", {})
        assert np.array_equal(a, b), (dtype, domain, vals)


@pytest.mark.parametrize("dtype", dt.FLOATS)
def test_near_zero_class_approaches_the_points_inside_the_range(dtype):
    """sqrt/log's domain (positive, kink 0): half the elements near 0, at 0 and its neighbour
    and at distances down to 2^-2p; none outside the domain's range."""
    x = values.make_array(values.Stream("nz#0"), (4000,), dtype, "positive", "near_zero", {}).astype(np.float64)
    p = dt.finfo(dtype).mant_bits + 1
    lo, hi = data.load("domains")["positive"]["range"]
    assert (x >= lo).all() and (x <= hi).all()
    near = x < 1.0
    assert 0.45 < near.mean() < 0.6
    assert (x == 0).any() and (x == float(dt.finfo(dtype).smallest_subnormal)).any()
    small = x[(x > 0) & (x < 1)]
    assert small.min() < 2.0 ** (-1.5 * p) and small.max() > 2.0 ** -2


@pytest.mark.parametrize("dtype", dt.FLOATS)
def test_ties_class_ties_inputs_and_rows(dtype):
    """Ties: the same positions and values in every input of the case (max/min see a == b
    there), and repeated range ends in each row (a reduction's maximum is tied)."""
    key = f"max/{dtype}/ties"
    a = values.make_array(values.Stream(f"{key}#0"), (40, 30), dtype, "real", "ties", {})
    b = values.make_array(values.Stream(f"{key}#1"), (40, 30), dtype, "real", "ties", {})
    rnd = values.make_array(values.Stream(f"{key}#1"), (40, 30), dtype, "real", "random", {})
    eq = a == b
    tied = eq & np.isin(a, [-10, 0, 10])
    assert 0.45 < tied.mean() < 0.55
    assert (eq & ~tied).mean() < 0.01  # the random halves rarely coincide (bfloat16's coarse grid)
    assert np.array_equal(b[~tied], rnd[~tied])
    assert set(np.unique(a[tied].astype(np.float64))) == {-10.0, 0.0, 10.0}
    # a row's max is 10 (the range's top, above every random draw), mostly held by several
    # elements (each is 10 with probability 1/6: a row of 30 has two or more 97% of the time)
    assert ((a == a.max(axis=1, keepdims=True)).sum(axis=1) >= 2).mean() > 0.9
    assert (a.max(axis=1) == 10).mean() > 0.9
    # inputs of different sizes (broadcasting) share their common prefix's positions and values
    c = values.make_array(values.Stream(f"{key}#0"), (30,), dtype, "real", "ties", {})
    assert np.array_equal(np.isin(c, [-10, 0, 10]), np.isin(b.reshape(-1)[:30], [-10, 0, 10]))
    assert 0.3 < (c == b.reshape(-1)[:30]).mean() < 0.7


def test_integer_ties_pool_stays_integral():
    x = values.make_array(values.Stream("sort#0"), (500,), "float32", "sort", "ties", {})
    assert np.array_equal(x, np.floor(x)) and {-50.0, 0.0, 50.0} <= set(np.unique(x).tolist())


def test_bfloat16_draws_round_once_whatever_ml_dtypes_does(monkeypatch):
    """The float64 draws reach bfloat16 through dtypes.narrow (one rounding, tests/test_dtypes.py),
    not ml_dtypes' astype, which rounds twice (through float32) before ml_dtypes 0.5 (pyproject
    allows 0.4): the same case id must give the same bfloat16 inputs on every machine. Double
    rounding differs on one draw in ~2^16, so the routing is shown with a narrowing that differs
    everywhere (truncation): the bfloat16 case's inputs follow it."""
    x = np.array([1 + 2.0**-8 + 2.0**-30])  # float64 -> float32 lands on the tie, then goes to even
    assert x.astype(np.float32).astype(dt.np_dtype("bfloat16")).astype(np.float64)[0] == 1.0
    assert dt.narrow(x, "bfloat16").astype(np.float64)[0] == 1 + 2.0**-7
    case = next(c for c in matrix.generate([matrix.Target("cpu", "cpu", "eager")], ops=["exp"], dtypes=["bfloat16"])
                if c.vals == "random" and c.size() >= 1000)
    once = matrix.make_inputs(case)[0].tobytes()
    real = dt.narrow

    def truncating(a, name):
        if name == "bfloat16" and a.dtype == np.float64:
            bits = a.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
            return bits.view(np.float32).astype(dt.np_dtype(name))
        return real(a, name)

    monkeypatch.setattr(dt, "narrow", truncating)
    assert matrix.make_inputs(case)[0].tobytes() != once
