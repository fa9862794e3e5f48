"""Smoke test of benchmarks/bench_gpu_custom.py --processes on the CPU (no GPU here: the script
then times MLX's composed kernels): each row measured in every process, and the table over them
consistent with the processes' own medians; cg_solve's row has its parts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu_custom.py"


def test_rows_over_processes(tmp_path):
    out = tmp_path / "b.json"
    subprocess.run([sys.executable, str(SCRIPT), "--sizes", "1e3", "--ops", "onnx.GatherElements,onnx.GatherND,rlx_sparse.cg_solve",
                    "--columns", "composed", "--min-time", "0.01", "--processes", "2", "--json", str(out)],
                   check=True, capture_output=True)
    doc = json.loads(out.read_text())
    assert len(doc["processes"]) == 2
    assert {(a["op"], a["col"]) for a in doc["across"]} == {("onnx.GatherElements", "composed"),
                                                           ("onnx.GatherND", "composed"),
                                                           ("rlx_sparse.cg_solve", "composed")}
    cg = [r for rows in doc["processes"] for r in rows if r["op"] == "rlx_sparse.cg_solve"]
    assert all(r["ratio"] > 0 and r["spmv"] > 0 and r["vec"] > 0 for r in cg)  # cg_parts ran
    for a in doc["across"]:
        own = sorted(r["median"] for rows in doc["processes"] for r in rows if (r["op"], r["col"]) == (a["op"], a["col"]))
        assert sorted(a["medians"]) == own and len(own) == 2
        assert a["min"] == own[0] <= a["median"] <= own[1] == a["max"]


def test_variant_checks_catch_a_wrong_spmv():
    """bench_cuda_variants.py judges an SpMV variant by its max ulp against exact row sums: the
    helpers must find a wrong sum and a one-ulp step, and agree with scipy where exact."""
    import numpy as np
    import scipy.sparse as sp
    from benchmark_scripts import load

    mod = load("bench_cuda_variants")
    banded_csr = load("bench_gpu_custom").banded_csr

    rng = np.random.default_rng(3)
    v, c, rp = banded_csr(rng, 500)
    x = rng.uniform(-1, 1, 500).astype(np.float32)
    ref = mod.exact_spmv(v, c, rp, x)
    a = sp.csr_matrix((v.astype(np.float64), c, rp), shape=(500, 500))
    assert mod.ulps(ref, (a @ x.astype(np.float64)).astype(np.float32)) <= 1
    assert mod.ulps(ref, ref) == 0
    assert mod.ulps(ref, np.nextafter(ref, np.float32(np.inf))) == 1
    assert mod.ulps(np.float32([-0.0]), np.float32([0.0])) == 0
    wrong = ref.copy()
    wrong[7] += 1e-3  # one row summed wrongly
    assert mod.ulps(ref, wrong) > 1000


def test_peak_is_the_run_gpus():
    """%peak divides by the HBM peak of the GPU the run is on: an H100 is not an H200."""
    from benchmark_scripts import load

    b = load("bench_gpu_custom")
    assert b.peak_gbs("NVIDIA H100 80GB HBM3") == 3350.0
    assert b.peak_gbs("NVIDIA H200") == 4800.0
    assert b.peak_gbs("some other GPU") == b.PEAK_GBS


def test_cg_iteration_script_runs_every_variant():
    """benchmarks/bench_cg_iteration.py on the CPU: each variant timed, and each solution within
    rounding of the plain loop's."""
    script = SCRIPT.parent / "bench_cg_iteration.py"
    r = subprocess.run([sys.executable, str(script), "--sizes", "1e4", "--min-time", "0.01", "--passes", "1"],
                       check=True, capture_output=True, text=True,
                       # the test envs set PYTHONSAFEPATH: the script's folder is not on sys.path
                       env={**os.environ, "PYTHONPATH": str(SCRIPT.parent)})
    rows = [json.loads(line) for line in r.stdout.splitlines()[1:]]
    assert {x["variant"] for x in rows if "ratio" in x} == {"plain", "fused", "shipped"}
    diffs = [x for x in rows if "max_abs_diff_from_plain" in x]
    assert len(diffs) == 2 and all(x["max_abs_diff_from_plain"] <= 1e-6 * x["max_abs"] for x in diffs)
