"""The shortcuts the judge and the parent take for speed (issue 18) give exactly what the general
paths give: compare() and accuracy.measure() on a bit-identical output, CaseResult.to_json
without dataclasses.asdict, the cached case ids and the memoized known-divergence scope."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.results import CaseResult, _jsonable
from rlx_conformance.judge import accuracy, compare as cmp, divergences
from rlx_conformance.judge.budget_table import Budget
from rlx_conformance.judge.compare import ANYTHING, Bound, Tolerance, free_where

DTYPES = ("float32", "float16", "bfloat16", "float64")


def _awkward(rng: np.random.Generator, dtype: str, n: int = 257) -> np.ndarray:
    """Values with every kind the rules treat apart: NaN, both infinities, both zeros,
    subnormals, the largest finite value, ordinary numbers."""
    fi = dt.finfo(dtype)
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, fi.smallest_subnormal, -fi.tiny, fi.max,
                     -fi.max, 1.0, -2.5], np.float64)
    x = np.where(rng.random(n) < 0.3, pool[rng.integers(0, len(pool), n)], rng.normal(0, 100, n))
    with np.errstate(over="ignore"):
        return x.astype(dt.np_dtype(dtype)).reshape(1, n)


def _general(monkeypatch, fn, *args, **kw):
    """``fn`` with the bit-equality shortcut switched off: the general path's answer."""
    with monkeypatch.context() as m:
        m.setattr(cmp, "bit_equal", lambda a, b: False)
        m.setattr(accuracy, "bit_equal", lambda a, b: False)
        return fn(*args, **kw)


def _bounds(rng: np.random.Generator, shape: tuple[int, ...]):
    babs = np.abs(rng.normal(0, 1, shape))
    babs[0, :3] = [np.nan, np.inf, 1e300]  # unbounded positions count apart
    yield None
    yield babs
    yield free_where(babs, rng.random(shape) < 0.2, ANYTHING)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exact", [False, True])
def test_compare_identical_output_matches_general_path(monkeypatch, dtype, exact):
    rng = np.random.default_rng(7)
    e = _awkward(rng, dtype)
    a = e.copy()
    assert cmp.bit_equal(e, a)
    skips = (None, rng.random(e.shape) < 0.1)
    for bound in _bounds(rng, e.shape):
        for skip in skips:
            for sz in (False, True):
                kw = dict(exact=exact, signed_zero=sz, tol=Tolerance(max_ulp=2, source="t"), bound=bound, skip=skip)
                fast = cmp.compare(e, a, **kw)
                slow = _general(monkeypatch, cmp.compare, e, a, **kw)
                assert fast == slow


@pytest.mark.parametrize("dtype", DTYPES)
def test_compare_not_bit_equal_takes_the_general_path(dtype):
    rng = np.random.default_rng(8)
    e = _awkward(rng, dtype)
    a = e.copy()
    a.reshape(-1)[5] = -a.reshape(-1)[5] if a.reshape(-1)[5] == 0 else a.reshape(-1)[5] * 2
    assert not cmp.bit_equal(e, a)
    a.reshape(-1)[6] = np.nan if not np.isnan(e.reshape(-1)[6]) else 1.0  # a NaN pattern that differs
    r = cmp.compare(e, a, exact=False, signed_zero=True, tol=Tolerance(max_ulp=0, source="t"))
    assert not r.ok and r.mismatches >= 1


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ftz", [False, True])
def test_measure_identical_matches_general_path(monkeypatch, dtype, ftz):
    rng = np.random.default_rng(9)
    want = _awkward(rng, dtype)
    got = want.copy()
    budget = Budget(ulp=1.0, atol=0.0, kind="ulp", c=None, block=None, reason="t", source="t")
    allow = np.abs(rng.normal(0, 1, want.shape))
    allow[0, :2] = [np.nan, np.inf]
    for bound in _bounds(rng, want.shape):
        for al in (None, allow):
            for skip in (None, rng.random(want.shape) < 0.1):
                kw = dict(skip=skip, bound=bound, allow=al, signed_zero=True, ftz=ftz)
                fast = accuracy.measure(got, want, budget, **kw)
                slow = _general(monkeypatch, accuracy.measure, got, want, budget, **kw)
                f, s = dataclasses.asdict(fast), dataclasses.asdict(slow)
                fm, sm = f.pop("over_mask"), s.pop("over_mask")
                assert f == s
                assert np.array_equal(fm, sm)


def test_to_json_matches_asdict():
    r = CaseResult(id="x/float32/shape:2/vals:random/mlx-cpu-compiled", op="x", dtype="float32", shape=[[2]],
                   family="f", attrs={"axis": (0, 1), "w": np.float32(0.5)}, vals="random", backend="mlx",
                   device="cpu", mode="compiled", outcome="fail", max_abs_err=float("inf"),
                   max_rel_err=float("nan"), max_ulp=np.float64(3.0), tolerance={"max_ulp": 1.0},
                   budget={"ulp": float("-inf"), "nested": [np.int64(2), (1.5, float("nan"))]},
                   mismatch={"first": [{"at": (0,), "expected": "1"}]}, repeat_digests=["a", None])
    assert r.to_json() == _jsonable(dataclasses.asdict(r))
    assert [f.name for f in dataclasses.fields(CaseResult)] == list(r.to_json())


def test_case_ids_cached_equal_fresh():
    from rlx_conformance.run import session

    cases = session.build_cases(session.backend_targets("mlx", "cpu", "compiled"), ops=["cumsum", "softmax"],
                                grads=("vjp",), layouts="default")
    for c in cases[::7]:
        ids = (c.id, c.contiguous_id, c.input_id, c.values_id)
        fresh = dataclasses.replace(c)
        assert "id" not in vars(fresh) and ids == (fresh.id, fresh.contiguous_id, fresh.input_id, fresh.values_id)
        assert fresh == c and hash(fresh) == hash(c)


def test_scoping_memo_matches_a_fresh_match():
    from rlx_conformance.run import session

    cases = session.build_cases(session.backend_targets("mlx", "cpu", "all"), ops=["dense_solve", "softmax*", "exp"])
    for c in cases:
        fresh = [d for d in divergences.divergences() if d.matches(c)]
        assert divergences.scoping(c) == fresh
        assert divergences.scoping(c) == fresh  # asked again: from the memo
