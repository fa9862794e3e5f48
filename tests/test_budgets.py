"""The accuracy budgets of the accumulating ops (rlx_conformance/judge/budgets.py,
cases/accuracy.toml) and the verdict they give.

What a budget must do, measured at n = 10^6 on the accumulation value classes
(spec/values.py): reject a sequential float32 accumulator (numpy's ``cumsum`` in float32 is one)
and a kernel 10^-3 off, where the worst-case bound lets both through, and pass numpy's pairwise
sum, whose depth the budget's constant c is derived from. The judge functions are called
directly (no MLX); one test goes through run_case with the CPU backend as the target.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate import matrix
from rlx_conformance.judge import accuracy, budget_table, budgets, precise
from rlx_conformance.judge.compare import Bound, compare
from rlx_conformance.judge.tolerances import tolerance_for
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.spec.values import ACCUMULATION_CLASSES

T = matrix.Target("mlx", "cpu", "lazy")
N = 1000003  # the [reduce] huge family (cases/shapes/core.toml)


# -- the depth constant ----------------------------------------------------------------------------
def test_c_covers_numpy_pairwise_depth_for_every_n():
    """c = 3.5 in cases/accuracy.toml: numpy's pairwise_sum never passes a term through more than
    3.5 ceil(log2 n) roundings (the worst ratio, 24/7 = 3.43, at n = 127), and 3 would not do."""
    c = budget_table.budget_for("reduce_sum", "float32").c
    depth = budget_table.pairwise_depth
    ns = list(range(2, 2**16)) + [2**k + d for k in range(16, 28) for d in (-9, -1, 0, 1, 7, 127)]
    for n in ns:
        assert budgets.numpy_pairwise_depth(n) <= depth(n, c), n
        assert depth(n, c) <= n - 1
    assert budgets.numpy_pairwise_depth(127) == 24 and math.ceil(math.log2(127)) == 7
    assert any(budgets.numpy_pairwise_depth(n) > depth(n, 3.0) for n in range(2, 256))
    assert depth(np.array([0, 1, 2, 127, 10**6]), c).tolist() == [0, 0, 1, 24, 70]


def test_blocked_depth_law():
    """block = 512 for dot products: D(K) = min(K - 1, 511 + ceil(K/512)); up to the matrix's
    largest contraction (K = 65,537) a K-block of any size from 128 to 512, summed sequentially,
    the blocks accumulated one after the other, is never deeper."""
    b = budget_table.budget_for("mat_mul", "float32")
    assert b.block == 512 and b.c is None
    assert b.depth(65537) == 640 and b.depth(100) == 99 and b.depth(1) == 0
    for kc in (128, 256, 300, 384, 512):
        for k in (1000, 4096, 8160, 65537):
            assert min(k - 1, (kc - 1) + -(-k // kc)) <= b.depth(k), (kc, k)
    assert budget_table.blocked_depth(np.array([1, 2, 513, 65537]), 512).tolist() == [0, 1, 512, 640]


def test_kinds_match_and_every_accumulating_op_has_its_budget():
    assert budget_table.KINDS == ("ulp",) + tuple(budgets.KINDS)
    assert accuracy.missing_budgets(all_ops()) == []
    for op, kind in budgets.ACCUMULATING.items():
        get_op(op)  # a real op
        for d in get_op(op).dtypes:
            if dt.is_float(d) and f"{op}/{d}" not in budgets.NO_BUDGET:
                b = accuracy.budget_for(op, d)
                assert b.kind == kind and b.reason, (op, d)


def test_budget_table_validation(monkeypatch):
    from rlx_conformance.core import data
    from rlx_conformance.core.errors import RlxError

    real = data.load
    table = {"budget": [{"op": "reduce_sum", "kind": "summation", "ulp": 1, "reason": "r"}]}
    monkeypatch.setattr(data, "load", lambda name: table if name == "accuracy.toml" else real(name))
    budget_table._entries.cache_clear()
    budget_table.budget_for.cache_clear()
    try:
        with pytest.raises(RlxError, match="needs c >= 1"):
            budget_table.budget_for("reduce_sum", "float32")
        table["budget"][0].update(kind="product", c=2)
        budget_table._entries.cache_clear()
        with pytest.raises(RlxError, match="takes no c"):
            budget_table.budget_for("reduce_sum", "float32")
        table["budget"][0].update(kind="dot")
        del table["budget"][0]["c"]
        budget_table._entries.cache_clear()
        with pytest.raises(RlxError, match="needs an integer block"):
            budget_table.budget_for("reduce_sum", "float32")
        table["budget"][0].update(kind="pairwise")
        budget_table._entries.cache_clear()
        with pytest.raises(RlxError, match="kind must be one of"):
            budget_table.budget_for("reduce_sum", "float32")
    finally:
        monkeypatch.undo()
        budget_table._entries.cache_clear()
        budget_table.budget_for.cache_clear()


# -- wrong kernels rejected, pairwise passed, at n = 10^6 --------------------------------------------
def _case(op: str, dtype: str, vals: str) -> matrix.Case:
    cases = matrix.generate([T], ops=[op], dtypes=[dtype])
    return next(c for c in cases if c.vals == vals and c.size() == N
                and c.attr_dict.get("axes", None) in ((), None) and not c.attr_dict.get("keep_dim", False)
                and not c.attr_dict.get("exclusive", False) and not c.attr_dict.get("reverse", False))


def _measure(case: matrix.Case, actual: np.ndarray) -> accuracy.Measure:
    """``actual`` judged by the case's accuracy budget against the precise oracle."""
    x = matrix.make_inputs(case)
    attrs = case.attr_dict
    b = accuracy.budget_for(case.op, case.dtype)
    want = precise.compute(case.op, x, attrs, [case.dtype])[0]
    allow = budgets.KINDS[b.kind](case.op, x, attrs, case.dtype, b)
    return accuracy.measure(np.asarray(actual, want.dtype).reshape(want.shape), want, b, allow=allow.abs)


def _naive_sum(x: np.ndarray) -> np.float32:
    """One float32 accumulator, element after element."""
    return np.cumsum(x.astype(np.float32), dtype=np.float32)[-1]


KERNELS = {
    "reduce_sum": {
        "naive float32": _naive_sum,
        "1e-3 relative": lambda x: np.float32(np.sum(x.astype(np.float64)) * (1 + 1e-3)),
        "numpy pairwise float32": lambda x: np.sum(x, dtype=np.float32),
    },
    "reduce_mean": {
        "naive float32": lambda x: _naive_sum(x) / np.float32(x.size),
        "1e-3 relative": lambda x: np.float32(np.mean(x.astype(np.float64)) * (1 + 1e-3)),
        "numpy pairwise float32": lambda x: np.mean(x, dtype=np.float32),
    },
}
# Where the sum does not cancel (|sum| ~ sum|x|), a 10^-3 relative error is 10^-3 sum|x|, far
# over c ceil(log2 n) u sum|x| = 4e-6 sum|x|; in a cancelling sum (random signs, alternating) it
# is a tiny part of sum|x| and legitimately within the budget.
WELL_CONDITIONED = ("constant", "offset", "increasing", "tiny_tail")
NAIVE_REJECTED = ("constant", "offset", "tiny_tail")  # a sequential sum of increasing terms is good


@pytest.mark.parametrize("op", sorted(KERNELS))
@pytest.mark.parametrize("vals", ("random",) + ACCUMULATION_CLASSES)
def test_budget_rejects_naive_and_inaccurate_kernels_and_passes_pairwise(op, vals):
    case = _case(op, "float32", vals)
    (x,) = matrix.make_inputs(case)
    kernels = KERNELS[op]
    got = {name: _measure(case, k(x)) for name, k in kernels.items()}
    assert got["numpy pairwise float32"].over == 0, got["numpy pairwise float32"]
    if vals in WELL_CONDITIONED:
        assert got["1e-3 relative"].over == 1 and got["1e-3 relative"].max_ratio > 10
    if vals in NAIVE_REJECTED:
        assert got["naive float32"].over == 1 and got["naive float32"].max_ratio > 100, got["naive float32"]


def test_worst_case_bound_lets_the_naive_sum_through():
    """Why the budget is needed: the registry's worst-case bound (2 gamma_(n-1) sum|x|) passes
    the sequential float32 sum of 10^6 constants, 1 % off; the budget does not."""
    case = _case("reduce_sum", "float32", "constant")
    x = matrix.make_inputs(case)
    ref = np.asarray(np.sum(x[0].astype(np.float64)), np.float32)
    naive = np.asarray(_naive_sum(x[0]))
    bound = get_op("reduce_sum").policy.bound(x, case.attr_dict, "float32")
    c = compare(ref, naive, exact=False, signed_zero=False, tol=tolerance_for("reduce_sum", "float32"), bound=bound)
    assert c.ok and abs(float(naive) / float(ref) - 1) > 5e-3
    assert _measure(case, naive).over == 1


def test_cumsum_budget_rejects_a_sequential_scan():
    case = _case("cumsum", "float32", "constant")
    (x,) = matrix.make_inputs(case)
    m = _measure(case, np.cumsum(x, dtype=np.float32))
    assert m.over > N // 2 and m.max_ratio > 100


@pytest.mark.parametrize("vals", ("constant", "offset", "tiny_tail"))
def test_float64_reference_scan_and_sum_within_budget(vals):
    """The CPU reference (backends/cpu/reduce.py) scans float64 by recursive doubling and sums
    over a contiguous axis (pairwise): within the float64 budget, which numpy's sequential
    float64 cumsum is not (the reference bug the budget found)."""
    from rlx_conformance.backends import get_backend

    for op in ("cumsum", "reduce_sum"):
        case = _case(op, "float64", vals)
        x = matrix.make_inputs(case)
        ref = get_backend("cpu").run(op, x, case.attr_dict)[0]
        assert _measure(case, ref).over == 0, (op, vals)
    case = _case("cumsum", "float64", vals)
    assert _measure(case, np.cumsum(matrix.make_inputs(case)[0])).over > 0


def test_allowance_formulas():
    """Spot values: the summation allowance is gamma_D(u) sum|x| with D = 70 at n = 10^6."""
    x = np.ones(N, np.float32)
    sums = accuracy.budget_for("reduce_sum", "float32")
    a = budgets.summation("reduce_sum", [x], {"axes": (), "keep_dim": False}, "float32", sums)
    u = 2.0**-24
    assert a.abs == pytest.approx(70 * u / (1 - 70 * u) * N)
    # mean: the sum's allowance / n plus the division's u |mean|
    m = budgets.mean("reduce_mean", [x], {"axes": (), "keep_dim": False}, "float32",
                     accuracy.budget_for("reduce_mean", "float32"))
    assert m.abs == pytest.approx(70 * u / (1 - 70 * u) + u)
    # dot: gamma_(D+1) sum|a||b| with D = 640 at K = 65,537, the reference's gamma_K(2^-53) beside it
    a2 = np.ones((2, 65537), np.float32)
    d = budgets.dot("mat_mul", [a2, a2.T.copy()], {}, "float32", accuracy.budget_for("mat_mul", "float32"))
    assert d.abs.shape == (2, 2) and d.abs[0, 0] == pytest.approx(641 * u / (1 - 641 * u) * 65537)
    assert d.ref[0, 0] == pytest.approx(65537 * 2.0**-53 * 65537, rel=1e-6)
    # softmax: uniform row, y = 1/n; theta = 2u, rho = 2u, gamma_D, the division u
    s = budgets.softmax("softmax", [np.zeros(1031, np.float32)], {"axis": -1}, "float32",
                        accuracy.budget_for("softmax", "float32"))
    g = 38 * u / (1 - 38 * u)
    assert s.abs[0] == pytest.approx((5 * u + g) / 1031 + 2 * 2.0**-149)


# -- the verdict in a run ------------------------------------------------------------------------------
def test_over_budget_fails_the_case_naming_the_budget(monkeypatch):
    """A target within the worst-case bound but over its budget fails, with a message naming the
    accuracy.toml entry; the record carries the ratio and the vacuity count."""
    from rlx_conformance.backends import get_backend
    from rlx_conformance.run import execute

    cpu = get_backend("cpu")
    case = _case("reduce_sum", "float32", "constant")
    case = matrix.Case(case.op, case.dtype, case.shapes, case.family, case.attrs, case.vals,
                       matrix.Target("cpu", "cpu", "eager"))
    execute.REF_CACHE._d.clear()
    accuracy.PRECISE_CACHE._d.clear()
    execute.REF_CACHE.get(case)  # the true reference, before the kernel is replaced
    entry = cpu.kernels["reduce_sum"]
    monkeypatch.setattr(entry, "fn", lambda x, *, axes, keep_dim: np.asarray(_naive_sum(x)))
    try:
        r = execute.run_case(case)
    finally:
        execute.REF_CACHE._d.clear()
        accuracy.PRECISE_CACHE._d.clear()
    assert r.outcome == "fail", r.message
    assert r.message.startswith("over accuracy budget (accuracy.toml#"), r.message
    assert "reduce_sum float32 <= summation" in r.message
    assert r.over_budget == 1 and r.budget_ratio > 100 and r.budget_against == "oracle"
    assert r.oracle_verdict == "target-over-budget"


def test_vacuous_bound_counted():
    from rlx_conformance.run.execute import vacuous

    e = np.float32([1.0, 0.0, 5.0, np.nan])
    b = Bound(np.array([0.5, 0.1, 10.0, 1.0]))
    assert vacuous([e], [b]) == 2  # 0.1 > |0|, 10 > |5|; NaN results are not counted
    assert vacuous([e], [None]) == 0
