"""Error statistics per (op, dtype, target): nearest-rank percentiles over the passing cases, and
apart over the excused (xfail) ones; failures in neither."""
from __future__ import annotations

import math

from results_fixtures import group, result, write

from rlx_conformance.report import records, stats


def recs(results):
    return [r.to_json() for r in results]


def test_nearest_rank_is_an_observed_value():
    v = sorted(float(i) for i in range(1, 101))  # 1..100
    assert stats.nearest_rank(v, 50) == 50 and stats.nearest_rank(v, 99) == 99 and stats.nearest_rank(v, 100) == 100
    assert stats.nearest_rank([3.0], 99) == 3.0
    assert stats.nearest_rank([1.0, 2.0, 3.0], 50) == 2.0  # no interpolation
    assert stats.nearest_rank([], 50) is None


def test_distribution_keeps_passing_and_excused_cases_apart():
    rs = group("exp", "float32", [float(i) for i in range(100)])
    rs.append(result("exp", "float32", "fail", n=500, ulp=1e9))
    rs.append(result("exp", "float32", "xfail", n=501, ulp=1e8, rel=0.5))
    rs.append(result("exp", "float32", "xfail", n=503, ulp=300.0, rel=1e-5))
    rs.append(result("exp", "float32", "xfail", n=504, ulp=None, rel=None))  # a crash excused: no error
    rs.append(result("exp", "float32", "pass", n=502, ulp=None))  # not measured: not counted in n
    d = stats.distributions(recs(rs))[("exp", "float32", "mlx-cpu-eager")]
    assert (d.cases, d.passed, d.bad, d.n, d.xfailed) == (105, 101, 1, 100, 3)
    assert (d.p50, d.p99, d.max) == (49.0, 98.0, 99.0)  # the excused 1e8 is not among the passing
    assert d.over_budget is None  # no record carries the field
    assert (d.excused.n, d.excused.p50, d.excused.max, d.excused.max_rel) == (2, 300.0, 1e8, 0.5)
    assert d.to_json()["excused"] == {"n": 2, "p50": 300.0, "p99": 1e8, "max": 1e8, "max_rel": 0.5,
                                      "over_budget": None}


def test_excused_distribution_survives_results_json(tmp_path):
    rs = [result("exp", "float32", "xfail", n=1, ulp=math.inf, over_budget=3), result("exp", "float32", n=2)]
    rep = records.load(write(tmp_path / "r", rs))
    d = stats.distributions(rep.cases)[("exp", "float32", "mlx-cpu-eager")]
    assert d.excused.max == math.inf and d.excused.over_budget == 1 and d.over_budget is None
    assert d.to_json()["excused"]["max"] == "inf"


def test_groups_split_by_dtype_and_target():
    rs = group("exp", "float32", [1, 2]) + group("exp", "float16", [5]) + group("exp", "float32", [9], mode="lazy")
    ds = stats.distributions(recs(rs))
    assert set(ds) == {("exp", "float32", "mlx-cpu-eager"), ("exp", "float16", "mlx-cpu-eager"),
                       ("exp", "float32", "mlx-cpu-lazy")}
    assert ds[("exp", "float32", "mlx-cpu-lazy")].max == 9.0


def test_over_budget_counts_cases_when_the_oracle_field_exists():
    rows = recs(group("exp", "float32", [1, 2, 3]))
    rows[0]["over_budget"], rows[1]["over_budget"], rows[2]["over_budget"] = True, False, 4
    d = stats.distribution(rows)
    assert d.over_budget == 2


def test_infinite_ulp_survives_results_json(tmp_path):
    rs = group("exp", "float32", [1.0, math.inf])
    rep = records.load(write(tmp_path / "r", rs))
    d = stats.distributions(rep.cases)[("exp", "float32", "mlx-cpu-eager")]
    assert d.max == math.inf and d.to_json()["max"] == "inf"


def test_worst_ops_and_families():
    rs = group("exp", "float32", [3, 40]) + group("add", "float32", [0, 0]) + group("neg", "float32", [7])
    rs.append(result("neg", "float32", "fail", n=99, ulp=1e6))  # failures are not "worst passing"
    worst = stats.worst_ops(recs(rs))
    assert [(w.op, w.max_ulp) for w in worst] == [("exp", 40.0), ("neg", 7.0)]  # add: 0 ULP, left out
    assert "exp/float32/shape:2/" in worst[0].id
    fams = stats.ulps_by_family(recs(rs))
    assert stats.op_family("add") == "binary" and fams["binary"] == [0.0, 0.0]
    assert 40.0 in fams[stats.op_family("exp")] and 1e6 not in sum(fams.values(), [])
    assert stats.op_family("no_such_op") == "other" and stats.op_family("vendor.op") == "custom"
