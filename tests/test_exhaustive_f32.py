"""The float32 exhaustive sweep (run/exhaustive_f32.py) and its float64 oracle
(judge/oracle_f64.py), on numpy: what the float64 oracle decides is MPFR's value bit for bit, and
a chunked sweep's row is judge_row's on the same inputs."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_conformance.judge import oracle_f64, precise
from rlx_conformance.judge.compare import ulp_distance
from rlx_conformance.ops import get_op
from rlx_conformance.run import exhaustive as ex
from rlx_conformance.run import exhaustive_f32 as f32


def _inputs(n: int = 3000) -> np.ndarray:
    rng = np.random.default_rng(7)
    bits = np.concatenate([ex.inputs_for("float32", 1024).view(np.uint32),
                           rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32),
                           # small magnitudes, where the composites' results sit near zero and one
                           (rng.integers(0x3e000000, 0x41a00000, n, dtype=np.uint64).astype(np.uint32)
                            | (rng.integers(0, 2, n, dtype=np.uint64).astype(np.uint32) << 31))])
    return bits.view(np.float32)


@pytest.mark.parametrize("op,attrs", ex.unary_ops())
def test_decided_elements_are_mpfr_bit_for_bit(op, attrs):
    x = _inputs()
    out = attrs.get("to", "float32") if op == "cast" else "float32"
    bits, decided = oracle_f64.decide(np, op, x, attrs, out)
    with np.errstate(all="ignore"):
        want = precise.compute(op, [x], attrs, [out])[0]
    wb = want.view(bits.dtype)
    wnan = np.isnan(want.astype(np.float64))
    gnan = np.isnan(bits.view(want.dtype).astype(np.float64))
    same = (bits == wb) | (wnan & gnan)
    assert not np.any(decided & ~same), [hex(int(v)) for v in x.view(np.uint32)[decided & ~same][:5]]
    # on random inputs MPFR takes only the few near a rounding boundary (the sample's endpoint
    # significands 0x000001 / 0x7fffff are such cases for sqrt and rsqrt: not counted)
    rand = x[-6000:]
    live = np.isfinite(rand) & (rand != 0)
    assert decided[-6000:].sum() >= 0.999 * live.sum()


def _perturbed(op, attrs):
    """The CPU reference, pushed off by a few ULP on some inputs and NaN on others."""
    from rlx_conformance.backends import get_backend
    b = get_backend("cpu")

    def compute(x):
        y = b.run(op, [x], attrs, "cpu", "eager")[0]
        u = y.view(np.uint32).copy()
        u[::97] += 3
        u[::1001] = 0x7fc00000
        return u.view(np.float32)
    return compute


@pytest.mark.parametrize("op", ["exp", "gelu", "hard_swish", "sign", "sqrt"])
def test_sweep_row_matches_judge_row(op):
    attrs = {}
    compute = _perturbed(op, attrs)
    row = f32.sweep(op, attrs, "float32", compute, False, range_="sample", sample=4096, chunk=None, oracle="numpy")
    x = ex.inputs_for("float32", 4096)
    with np.errstate(all="ignore"):
        want = precise.compute(op, [x], attrs, ["float32"])[0]
    ref = ex.judge_row(op, attrs, x, compute(x), want, False)
    for k in ("n", "checked", "max_ulp", "over_budget", "nan_mismatch", "inf_mismatch", "signed_zero_mismatch"):
        assert row[k] == ref[k], k
    assert row["over_budget"] > 0
    from rlx_conformance.judge.accuracy import budget_for, measure
    m = measure(compute(x), want, budget_for(op, "float32"), signed_zero=get_op(op).policy.signed_zero)
    over = x.view(np.uint32)[m.over_mask]
    assert row["first_over"] == [f"0x{int(v):08x}" for v in over[:f32.FIRST_OVER]]
    assert [w["input"] for w in row["worst"]] == [w["input"] for w in ref["worst"]]
    assert [w["ulp"] for w in row["worst"]] == [w["ulp"] for w in ref["worst"]]


def test_certainly_over_positions_fail_measure_whatever_its_options():
    """accuracy.certainly_over (the sweep's on-device count of positions over budget) marks only
    positions that measure() fails under every option the sweep may give it."""
    from rlx_conformance.judge.accuracy import Budget, certainly_over, measure, settle
    rng = np.random.default_rng(11)
    want = rng.integers(0, 1 << 32, 40000, dtype=np.uint64).astype(np.uint32)
    got = (want.astype(np.int64) + rng.integers(-9, 10, want.size)).astype(np.uint32)
    sign, inf = np.uint32(1 << 31), np.uint32(0x7F800000)
    specials = np.array([0, sign, inf, inf | sign, inf + 1, 1, 1 | sign, 0x00800000, 5], np.uint32)
    pairs = np.array([(g, w) for g in specials for w in specials], np.uint32)
    got, want = np.concatenate([got, pairs[:, 0]]), np.concatenate([want, pairs[:, 1]])
    g, w = got.view(np.float32), want.view(np.float32)
    for budget in (Budget(ulp=0.0), Budget(ulp=2.0), Budget(ulp=2.0, atol=1e-30)):
        for ftz in (False, True):
            over = certainly_over(settle(got, want, "float32", budget), got, want, "float32", budget, ftz=ftz)
            for signed_zero in (False, True):
                m = measure(g, w, budget, signed_zero=signed_zero, ftz=ftz)
                assert np.all(m.over_mask[over])
            if not budget.atol:
                assert over.sum() > 1000
                # a zero result for a normal expected value is over budget with or without ftz;
                # for a subnormal one only without it (a declared flush passes)
                zero_for = lambda w_bits: over[(got == 0) & (want == w_bits)]  # noqa: E731
                assert zero_for(0x00800000).all() and zero_for(5).all() != ftz


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("ulp", [0.0, 1.0, 4.0])
def test_settled_positions_pass_measure_whatever_its_options(dtype, ulp):
    """accuracy.settle (the sweep's on-device filter) settles only positions that measure()
    passes under every option the sweep may give it, with measure()'s ULP there; the rest hold
    both passes and failures (the filter defers, it does not judge them)."""
    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.judge.accuracy import Budget, measure, settle
    fi = dt.finfo(dtype)
    rng = np.random.default_rng(5)
    want = rng.integers(0, 1 << fi.bits, 30000, dtype=np.uint64).astype(fi.uint)
    step = rng.integers(-6, 7, want.size).astype(np.int64)  # neighbours within and beyond the budget
    got = (want.astype(np.int64) + step).astype(fi.uint)
    got[::5] = rng.integers(0, 1 << fi.bits, got[::5].size, dtype=np.uint64).astype(fi.uint)
    sign, inf = 1 << (fi.bits - 1), int(np.array(np.inf, dt.np_dtype(dtype)).view(fi.uint))
    specials = np.array([0, sign, inf, inf | sign, inf + 1, (inf + 1) | sign, 1, 1 | sign], fi.uint)
    pairs = np.array([(g, w) for g in specials for w in specials], fi.uint)
    got, want = np.concatenate([got, pairs[:, 0]]), np.concatenate([want, pairs[:, 1]])
    budget = Budget(ulp=ulp)
    s = settle(got, want, dtype, budget)
    g, w = got.view(dt.np_dtype(dtype)), want.view(dt.np_dtype(dtype))
    for signed_zero in (False, True):
        for ftz in (False, True):
            m = measure(g, w, budget, signed_zero=signed_zero, ftz=ftz)
            assert not np.any(s.mask & m.over_mask)
    with np.errstate(invalid="ignore"):
        element_ulp = ulp_distance(g, w)
    fin = s.mask & s.finite
    assert np.array_equal(s.ulp[fin], element_ulp[fin]) and np.all(element_ulp[fin] <= ulp)
    over = measure(g, w, budget).over_mask  # zeros of opposite sign, deferred, pass here
    assert s.mask.sum() > 1000 and over.sum() > 1000 and np.any(~s.mask & ~over)


def test_full_range_chunks_cover_every_pattern_once():
    parts = f32.chunks("full", 0, 1 << 26)
    assert parts[0] == (0, 1 << 26) and sum(c for _, c in parts) == 1 << 32
    assert all(a[0] + a[1] == b[0] for a, b in zip(parts, parts[1:]))


def test_numpy_oracle_without_cupy():
    xp, name = f32.array_module("numpy")
    assert xp is np and name == "numpy-float64"


def test_full_range_sweep_in_chunks_is_judge_row_over_the_range(monkeypatch):
    """The "full" path on a shortened range (the first 2^18 patterns, 2^16 a chunk: positive
    subnormals and tiny normals) gives judge_row's figures over the same inputs."""
    monkeypatch.setattr(f32, "FULL", 1 << 18)
    compute = _perturbed("gelu", {})
    row = f32.sweep("gelu", {}, "float32", compute, False, range_="full", chunk=1 << 16, oracle="numpy")
    x = np.arange(1 << 18, dtype=np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        want = precise.compute("gelu", [x], {}, ["float32"])[0]
    ref = ex.judge_row("gelu", {}, x, np.concatenate([compute(x[i:i + (1 << 16)]) for i in range(0, 1 << 18, 1 << 16)]),
                       want, False)
    assert row["chunks"] == 4 and row["n"] == 1 << 18
    for k in ("checked", "max_ulp", "over_budget", "nan_mismatch", "inf_mismatch", "signed_zero_mismatch"):
        assert row[k] == ref[k], k


def test_bit_conversions_keep_subnormals():
    """f32_to_f64 and round32_bits (what the oracle uses instead of float32 arithmetic, which
    CuPy flushes) agree with numpy's IEEE casts, subnormals, ties and overflow included."""
    rng = np.random.default_rng(3)
    bits = np.concatenate([np.arange(0, 1 << 16, dtype=np.uint32), np.arange(0x7F7F0000, 0x7F800000, dtype=np.uint32),
                           rng.integers(0, 0x7F800000, 1 << 16, dtype=np.uint64).astype(np.uint32)])
    bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
    assert np.array_equal(oracle_f64.f32_to_f64(np, bits).view(np.uint64),
                          bits.view(np.float32).astype(np.float64).view(np.uint64))
    x = bits.view(np.float32).astype(np.float64)
    ulp = np.abs(np.nextafter(bits.view(np.float32), np.float32(np.inf)).astype(np.float64) - x)
    for v in (x, x + ulp / 2, x + ulp / 2 * (1 + 2.0 ** -40), x * (1 + 2.0 ** -30),
              rng.standard_normal(4096) * 2.0 ** -140):
        with np.errstate(all="ignore"):
            assert np.array_equal(oracle_f64.round32_bits(np, v), v.astype(np.float32).view(np.uint32))


def test_cli_float32_choice(monkeypatch):
    """float32 is swept when --dtypes names it or a float32 option is given; auto is the whole
    range only where CuPy sees a GPU."""
    from types import SimpleNamespace

    from rlx_conformance.cli import exhaustive as cli

    def args(**kw):
        return SimpleNamespace(**({"dtypes": None, "float32_range": None, "float32_sample": 0} | kw))
    monkeypatch.setattr(f32, "cupy_module", lambda: None)
    assert cli.float32_choice(args()) == ("sample", 0)  # the 16-bit sweep only, as before
    assert cli.float32_choice(args(dtypes=["float32"])) == ("sample", cli.F32_SAMPLE)
    assert cli.float32_choice(args(float32_sample=64)) == ("sample", 64)
    assert cli.float32_choice(args(float32_range="full")) == ("full", 0)
    monkeypatch.setattr(f32, "cupy_module", lambda: np)
    assert cli.float32_choice(args(dtypes=["f32"])) == ("full", 0)
    assert ex.selected_dtypes(["float32"], 0, f32_full=True) == ["float32"]


def test_cli_sample_sweep_writes_float32_rows(tmp_path):
    from rlx_conformance.cli.main import main
    code = main(["exhaustive", "--dtypes", "float32", "--float32-sample", "600", "--ops", "neg,sqrt",
                 "--device", "cpu", "--mode", "eager", "--no-progress", "--workers", "1",
                 "--report", str(tmp_path), "--format", "json"])
    import json
    doc = json.loads((tmp_path / "exhaustive.json").read_text())
    rows = [r for r in doc["rows"] if r["target"] != "cpu-cpu-eager"]
    assert code == 0 and {r["op"] for r in rows} == {"neg", "sqrt"}
    assert all(r["dtype"] == "float32" and r["float32_range"] == "sample" and r["outcome"] == "pass" for r in rows)
    assert doc["run"]["float32_range"] == "sample" and doc["run"]["float32_oracle"] == "numpy-float64"
