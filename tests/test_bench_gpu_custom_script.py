"""Smoke test of benchmarks/bench_gpu_custom.py --processes on the CPU (no GPU here: the script
then times MLX's composed kernels): each row measured in every process, and the table over them
consistent with the processes' own medians."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu_custom.py"


def test_rows_over_processes(tmp_path):
    out = tmp_path / "b.json"
    subprocess.run([sys.executable, str(SCRIPT), "--sizes", "1e3", "--ops", "onnx.GatherElements,onnx.GatherND",
                    "--columns", "composed", "--min-time", "0.01", "--processes", "2", "--json", str(out)],
                   check=True, capture_output=True)
    doc = json.loads(out.read_text())
    assert len(doc["processes"]) == 2
    assert {(a["op"], a["col"]) for a in doc["across"]} == {("onnx.GatherElements", "composed"),
                                                           ("onnx.GatherND", "composed")}
    for a in doc["across"]:
        own = sorted(r["median"] for rows in doc["processes"] for r in rows if (r["op"], r["col"]) == (a["op"], a["col"]))
        assert sorted(a["medians"]) == own and len(own) == 2
        assert a["min"] == own[0] <= a["median"] <= own[1] == a["max"]
