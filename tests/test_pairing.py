"""pairing.py: two devices of one backend, case by case (rlx-conformance pair, report --pair)."""
from __future__ import annotations

import json
from pathlib import Path

from rlx_conformance.cli import main as cli
from rlx_conformance.report import html as report_html
from rlx_conformance.report import records
from rlx_conformance.report.pairing import classify, pair, pair_key

P = "exp/float32/shape:7/vals:random"


def rec(target: str, outcome: str = "pass", digest: str | None = "d", ulp: float = 0.0, prefix: str = P):
    backend, device, mode = target.split("-")[:3]
    return {"id": f"{prefix}/{target}", "op": prefix.split("/")[0], "dtype": prefix.split("/")[1],
            "backend": backend, "device": device, "mode": mode, "outcome": outcome,
            "output_digest": digest, "max_ulp": ulp, "message": ""}


def report(path: Path, *cases) -> records.Report:
    return records.Report(path=path / "results.json", cases=list(cases))


def test_classes():
    g, c = rec("mlx-gpu-lazy"), rec("mlx-cpu-lazy")
    assert classify(g, c) == "identical"
    assert classify(g, rec("mlx-cpu-lazy", digest="e")) == "differ"
    assert classify(rec("mlx-gpu-lazy", "xfail"), c) == "a_only"  # a known divergence still differs
    assert classify(g, rec("mlx-cpu-lazy", "crash", None)) == "b_only"
    assert classify(rec("mlx-gpu-lazy", "fail"), rec("mlx-cpu-lazy", "fail")) == "both"
    assert classify(g, None) == classify(rec("mlx-gpu-lazy", "skip"), c) == "unpaired"
    assert classify(rec("mlx-gpu-lazy", digest=None), rec("mlx-cpu-lazy", digest=None)) == "differ"


def test_pairs_by_input_and_mode_and_variant_pairs_with_the_plain_case(tmp_path):
    assert pair_key(rec("mlx-gpu-lazy-tf32:on")) == pair_key(rec("mlx-cpu-lazy")) != pair_key(rec("mlx-cpu-eager"))
    a = report(tmp_path, rec("mlx-gpu-lazy-tf32:on", digest="x", ulp=900.0), rec("mlx-gpu-lazy-tf32:off"),
               rec("mlx-gpu-eager", "fail", ulp=5.0), rec("mlx-gpu-compiled", prefix="neg/float32/shape:7/vals:random"))
    b = report(tmp_path, rec("mlx-cpu-lazy", ulp=1.0), rec("mlx-cpu-eager"), rec("mlx-cpu-compiled"))
    p = pair(a, b)
    assert (p.a, p.b) == ("mlx-gpu", "mlx-cpu")
    assert p.totals() == {"identical": 1, "differ": 1, "a_only": 1, "b_only": 0, "both": 0, "unpaired": 2}
    lazy = next(g for g in p.groups if g.op == "exp" and g.mode == "lazy")
    assert (lazy.max_ulp_a, lazy.max_ulp_b) == (900.0, 1.0)
    assert p.groups[0].counts["a_only"] == 1  # differences first
    assert {r["class"] for r in p.records} == {"differ", "a_only"}


def test_cli_writes_pair_json_and_the_report_shows_the_pair(tmp_path):
    from rlx_conformance.core import results as res

    for name, cases in (("gpu", [rec("mlx-gpu-lazy", "xfail")]), ("cpu", [rec("mlx-cpu-lazy")])):
        res.atomic_write_text(tmp_path / name / "results.json", json.dumps(
            {"schema": res.SCHEMA, "run": {}, "cases": cases}))
    assert cli.main(["pair", str(tmp_path / "gpu"), str(tmp_path / "cpu")]) == 0
    doc = json.loads((tmp_path / "gpu" / "pair.json").read_text())
    assert doc["totals"]["a_only"] == 1 and doc["cases"][0]["a"]["outcome"] == "xfail"
    html = report_html.render(records.load(tmp_path / "gpu"), with_plots=False,
                              pairing=pair(records.load(tmp_path / "gpu"), records.load(tmp_path / "cpu")))
    assert 'id="pairing"' in html and "only mlx-gpu bad" in html
    assert cli.main(["pair", str(tmp_path / "gpu"), str(tmp_path / "nowhere")]) == 2
