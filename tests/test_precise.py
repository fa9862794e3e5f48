"""The precise oracle (rlx_conformance/judge/precise.py), the accuracy budgets (cases/accuracy.toml,
rlx_conformance/judge/accuracy.py) and the reference-bug verdict of a case."""
from __future__ import annotations

import math

import ml_dtypes
import mpmath
import numpy as np
import pytest

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate import matrix
from rlx_conformance.judge import accuracy, budget_table, precise, rounding
from rlx_conformance.ops import all_ops

BF16 = ml_dtypes.bfloat16


def mp_round(v: mpmath.mpf, dtype: str) -> float:
    """Round an mpmath value once to an IEEE format, independently of gmpy2/MPFR: the exact
    rational of the (200-bit) value, rounded to nearest even on the format's grid."""
    from fractions import Fraction

    if mpmath.isnan(v):
        return math.nan
    if mpmath.isinf(v):
        return float(v)
    p, emin, _ = precise.FORMATS[dtype]
    fi = dt.finfo(dtype)
    sign, man, exp, _ = mpmath.mpf(v)._mpf_
    q = (-1) ** sign * Fraction(int(man)) * (Fraction(2) ** int(exp))
    if q == 0:
        return 0.0
    e = math.floor(math.log2(abs(q)))
    if Fraction(2) ** e > abs(q):
        e -= 1
    if Fraction(2) ** (e + 1) <= abs(q):
        e += 1
    quantum = Fraction(2) ** max(e - p + 1, math.floor(math.log2(fi.smallest_subnormal)))
    n = q / quantum
    r = math.floor(n)
    rem = n - r
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and r % 2 == 1):
        r += 1
    out = r * quantum
    if abs(out) > fi.max:
        return math.copysign(math.inf, q)
    return float(out)


mpmath.mp.prec = 200

SAMPLES = [-20.5, -7.25, -3.0000002, -1.5, -0.3, -1e-30, 1.2e-40, 0.5, 1.0, 2.75, 9.0, 17.3, 88.5, 700.0]
MPMATH = {
    "exp": mpmath.exp,
    "sin": mpmath.sin,
    "tanh": mpmath.tanh,
    "erf": mpmath.erf,
    "atan": mpmath.atan,
    "log": lambda x: mpmath.log(x) if x > 0 else (mpmath.ninf if x == 0 else mpmath.nan),
    "sigmoid": lambda x: 1 / (1 + mpmath.exp(-x)),
    "gelu": lambda x: x * mpmath.ncdf(x),
    "silu": lambda x: x / (1 + mpmath.exp(-x)),
    "softplus": lambda x: mpmath.log1p(mpmath.exp(x)),
    "mish": lambda x: x * mpmath.tanh(mpmath.log1p(mpmath.exp(x))),
    # 0.5 x (1 + tanh z) = x / (1 + e^-2z): the tanh form cancels beyond 200 bits for x << 0
    "gelu_approx": lambda x: x / (1 + mpmath.exp(-2 * mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x**3))),
}


@pytest.mark.parametrize("op", sorted(MPMATH))
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_oracle_matches_mpmath(op, dtype):
    """The oracle (MPFR through gmpy2) against an independent library (mpmath at 200 bits, with
    its own rounding to the format): bit for bit."""
    x = np.array(SAMPLES, np.float64).astype(dt.np_dtype(dtype))
    got = precise.compute(op, [x], {}, [dtype])[0]
    for xi, gi in zip(x.astype(np.float64).tolist(), got.astype(np.float64).tolist()):
        want = mp_round(MPMATH[op](mpmath.mpf(xi)), dtype)
        assert (math.isnan(want) and math.isnan(gi)) or want == gi, (op, dtype, xi, want, gi)


def test_known_values():
    assert precise.compute("exp", [np.float32([1.0])], {}, ["float32"])[0][0] == np.float32(math.e)
    # correctly rounded where float64-then-float32 double-rounds: sigmoid(0x1a00) in float16
    x = np.array([0x1A00], np.uint16).view(np.float16)
    assert precise.compute("sigmoid", [x], {}, ["float16"])[0][0] == np.float16(0.50048828125)
    # subnormal results, rounded once (gelu of the smallest float16 subnormal is just above half of it)
    tiny = np.array([1], np.uint16).view(np.float16)
    assert precise.compute("gelu", [tiny], {}, ["float16"])[0].view(np.uint16)[0] == 1
    # limits and IEEE special cases
    inf = np.array([-np.inf, np.inf, np.nan, -0.0], np.float32)
    assert precise.compute("gelu", [inf], {}, ["float32"])[0].tolist()[:2] == [0.0, np.inf]
    assert np.signbit(precise.compute("gelu", [inf], {}, ["float32"])[0][0])
    assert precise.compute("softsign", [inf], {}, ["float32"])[0].tolist()[:2] == [-1.0, 1.0]
    r = precise.compute("rsqrt", [np.float32([-0.0, 0.0])], {}, ["float32"])[0]
    assert r.tolist() == [-np.inf, np.inf]
    s = precise.compute("sign", [np.float32([np.nan])], {}, ["float32"])[0]
    assert np.isnan(s[0])


def test_binary_and_fma_exact():
    a = np.float32([1 + 2.0**-23, 3.0, -0.0])
    b = np.float32([1 - 2.0**-23, 7.0, 0.0])
    c = np.float32([-1.0, 0.1, -0.0])
    fma = precise.compute("fma", [a, b, c], {}, ["float32"])[0]
    assert fma[0] == np.float32(-(2.0**-46))  # a*b - 1 = -2^-46 exactly: a single rounding
    assert np.signbit(fma[2])  # -0 * 0 + -0 = -0
    assert precise.compute("add", [np.float32([0.0]), np.float32([-0.0])], {}, ["float32"])[0].tolist() == [0.0]
    assert not np.signbit(precise.compute("add", [np.float32([0.0]), np.float32([-0.0])], {}, ["float32"])[0][0])
    m = precise.compute("mod", [np.float32([-3.0]), np.float32([3.0])], {}, ["float32"])[0]
    assert m[0] == 0 and np.signbit(m[0])


def test_round_dd_single_rounding():
    """hi + lo rounded once, including where plain conversions round twice."""
    hi = np.array([1 + 2.0**-11, 1 + 2.0**-8, 1 + 2.0**-24, 2.0**-25, 3.0e38 * 2, -(2.0**-150)])
    lo = np.array([2.0**-60, 2.0**-70, 2.0**-80, 2.0**-100, 0.0, -(2.0**-200)])
    assert rounding.round_dd(hi, lo, "float16")[0] == np.float16(1 + 2.0**-10)
    assert float(rounding.round_dd(hi, lo, "bfloat16")[1]) == 1 + 2.0**-7
    assert rounding.round_dd(hi, lo, "float32")[2] == np.float32(1 + 2.0**-23)
    assert rounding.round_dd(hi, lo, "float16")[3].view(np.uint16) == 1  # above half of 2^-24
    assert np.isinf(rounding.round_dd(hi, lo, "float32")[4])
    assert rounding.round_dd(hi, lo, "float32")[5] == np.float32(-(2.0**-149))  # just past the midpoint


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_reductions_vs_fraction(dtype):
    from fractions import Fraction

    big = 1e8 if dtype != "float16" else 1e3
    x = (np.array([big, 1.0, -big, 3.25e-3, 7.0, -2.5, 1e-4] * 5, np.float64)).astype(dt.np_dtype(dtype))
    x = x.reshape(5, 7)
    got = precise.compute("reduce_sum", [x], {"axes": (1,), "keep_dim": False}, [dtype])[0]
    for row, g in zip(x.astype(np.float64), got.astype(np.float64)):
        exact = sum(Fraction(v) for v in row.tolist())
        assert g == mp_round(mpmath.mpf(exact.numerator) / exact.denominator, dtype)
    sm = precise.compute("softmax", [x], {"axis": -1}, [dtype])[0].astype(np.float64)
    assert np.allclose(sm.sum(axis=-1), 1, rtol=8 * dt.finfo(dtype).eps)


def test_budgets_cover_every_oracle_op():
    assert accuracy.missing_budgets(all_ops()) == []


def test_budget_lookup_and_reasons():
    assert accuracy.budget_for("add", "float32").ulp == 0
    assert accuracy.budget_for("fma", "float16").ulp == 1
    assert accuracy.budget_for("fma", "float32").ulp == 0
    assert accuracy.budget_for("exp", "bfloat16").ulp == 1
    b = accuracy.budget_for("reduce_sum", "float32")
    assert (b.kind, b.c, b.ulp) == ("summation", 3.5, 1.0)
    for e in data.load("accuracy.toml")["budget"]:
        assert e["reason"].strip()


def test_budget_validation(monkeypatch):
    budget_table._entries.cache_clear()
    accuracy.budget_for.cache_clear()
    real = data.load

    def fake(name):
        if name == "accuracy.toml":
            return {"budget": [{"op": "exp", "ulp": 1}]}  # no reason
        return real(name)

    monkeypatch.setattr(data, "load", fake)
    try:
        with pytest.raises(RlxError, match="needs a reason"):
            accuracy.budget_for("exp", "float32")
    finally:
        monkeypatch.undo()
        budget_table._entries.cache_clear()
        accuracy.budget_for.cache_clear()


def test_low_precision_rule_validation(monkeypatch):
    real = data.load
    table = {"budget": [{"op": "exp", "ulp": 2, "reason": "libm"},
                        {"op": "fma", "dtype": ["float16", "bfloat16"], "ulp": 1, "reason": "double rounding"}]}

    def fake(name):
        return table if name == "accuracy.toml" else real(name)

    def clear():
        for f in (budget_table._entries, accuracy.low_precision, accuracy.budget_for):
            f.cache_clear()

    monkeypatch.setattr(data, "load", fake)
    clear()
    try:
        with pytest.raises(RlxError, match=r"\[low_precision\]: needs dtypes, max_ulp and reason"):
            accuracy.budget_for("exp", "float16")
        table["low_precision"] = {"dtypes": ["float16", "bfloat16"], "max_ulp": 1, "reason": "via float32"}
        clear()
        b = accuracy.budget_for("exp", "float16")  # the float32 entry, capped at 1 ULP
        assert (b.ulp, b.reason) == (1.0, "via float32") and b.source.startswith("accuracy.toml[low_precision]")
        assert accuracy.budget_for("fma", "bfloat16").ulp == 1.0  # an entry naming the dtype wins
        with pytest.raises(RlxError, match="no budget for fma on float32"):
            accuracy.budget_for("fma", "float32")
        table["budget"][0]["dtype"] = ["float32", "int8"]
        clear()
        with pytest.raises(RlxError, match="dtype must be a float dtype"):
            accuracy.budget_for("exp", "float32")
    finally:
        monkeypatch.undo()
        clear()


def test_measure_ftz_only_when_declared():
    want = np.float32([1e-40, 1.0])
    got = np.float32([0.0, 1.0])
    b = accuracy.Budget(ulp=1)
    assert accuracy.measure(got, want, b).over == 1
    m = accuracy.measure(got, want, b, ftz=True)
    assert m.over == 0 and m.ftz == 1


# -- the verdict on a case ---------------------------------------------------------------------------
def _case(op="exp", dtype="float32"):
    cases = matrix.generate([matrix.Target("mlx", "cpu", "lazy")], ops=[op], dtypes=[dtype])
    return next(c for c in cases if c.vals == "random" and c.size() == 1031)


def test_healthy_case_records_oracle_fields():
    from rlx_conformance.run.execute import run_case

    r = run_case(_case("sqrt"))
    assert r.outcome == "pass"
    assert r.oracle_verdict == "ok" and r.oracle_ulp_ref == 0 and r.over_budget == 0
    assert r.budget["ulp"] == 0 and r.ftz_used is False


def test_wrong_reference_is_a_reference_bug(monkeypatch):
    """A deliberately wrong reference kernel (exp off by 3 ulp in float32, like a float32 libm):
    the case errors as a reference bug, and the oracle sides with the (right) target."""
    from rlx_conformance.backends import get_backend
    from rlx_conformance.run import execute
    from rlx_conformance.run.outcomes import apply_divergence

    cpu = get_backend("cpu")
    entry = cpu.kernels["sqrt"]
    original = entry.fn

    def bad_sqrt(x):
        y = original(x)
        return (y.view(np.uint32) + np.uint32(3)).view(np.float32) if y.dtype == np.float32 else y

    monkeypatch.setattr(entry, "fn", bad_sqrt)
    execute.REF_CACHE._d.clear()
    accuracy.PRECISE_CACHE._d.clear()
    try:
        case = _case("sqrt")
        r = execute.run_case(case)
    finally:
        execute.REF_CACHE._d.clear()
        accuracy.PRECISE_CACHE._d.clear()
    assert r.outcome == "error"
    assert r.message.startswith("reference bug:"), r.message
    assert "supports the target" in r.message
    assert r.oracle_verdict == "reference-bug" and r.over_budget_ref > 0 and r.over_budget == 0
    assert r.oracle_ulp_ref == 3
    assert apply_divergence(case, r).outcome == "error"  # never hidden by a known divergence


def test_failing_case_says_which_side_the_oracle_supports():
    """MLX's float32 exp is over budget: the failing case (a known divergence) says the oracle
    supports the reference."""
    from rlx_conformance.run.execute import run_case

    r = run_case(_case("exp"))
    assert r.outcome == "fail"
    assert r.oracle_verdict == "supports-reference"
    assert "oracle: supports the reference" in r.message
    assert r.over_budget > 0 and r.oracle_ulp_target > accuracy.budget_for("exp", "float32").ulp


def test_oracle_switch(monkeypatch):
    from rlx_conformance.run.execute import run_case

    monkeypatch.setenv("RLX_CONFORMANCE_ORACLE", "off")
    r = run_case(_case("sqrt"))
    assert r.oracle_verdict is None and r.oracle_ulp_ref is None


def test_reference_gelu_float64_within_budget():
    """Regression: the float64 reference gelu/gelu_approx lost up to 277 / 612 ulp (argument
    rounding amplified by erfc / exp) before the oracle found it."""
    from rlx_conformance.backends import get_backend

    x = np.concatenate([np.linspace(-39, 5, 3001), [-17.0, -9.76, -2.547, -37.7, -20.88]])
    for op in ("gelu", "gelu_approx"):
        ref = get_backend("cpu").run(op, [x], {})[0]
        want = precise.compute(op, [x], {}, ["float64"])[0]
        m = accuracy.measure(ref, want, accuracy.budget_for(op, "float64"))
        assert m.over == 0, (op, m)


@pytest.mark.parametrize("op", ["sigmoid", "silu"])
def test_reference_logistic_keeps_float64_subnormals(op):
    """The CPU reference's sigmoid and silu in float64 below x = -709.78, where scipy's expit
    returns 0 instead of the subnormal e^x (a reference bug the derivative checks found): within
    2 ulp of mpmath for sigmoid, 5 for silu's compensated -e^(x + log -x) (log's rounding alone
    is 2 ulp of the result); a subnormal's ulp is the absolute 2^-1074."""
    from rlx_conformance.backends import get_backend
    x = np.array([-700.0, -709.0, -709.79, -710.0, -730.0, -744.0])
    got = get_backend("cpu").run(op, [x], {})[0]
    fn = {"sigmoid": lambda v: 1 / (1 + mpmath.exp(-v)), "silu": lambda v: v / (1 + mpmath.exp(-v))}[op]
    with mpmath.workprec(200):
        want = np.array([float(fn(mpmath.mpf(v))) for v in x])
    assert np.all(want != 0)
    ulps = {"sigmoid": 2, "silu": 5}[op]
    assert np.all(np.abs(got - want) <= ulps * np.spacing(np.abs(want))), (got, want)
