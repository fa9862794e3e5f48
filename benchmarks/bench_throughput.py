"""Warm throughput side by side with the peer suite, in one invocation (issue 18, item 2).

    python benchmarks/bench_throughput.py [--workers 2] [--ops GLOB] [--sample K] [--skip-shapes G]
                                          [--no-peer]

First our matrix as a user runs it: ``rlx-conformance run --grad none --layouts none --graphs none
--skip-shapes huge`` (the forward cases of every op in MLX's default mode, compiled, less the shape
families `tox -e mlx` leaves to the nightly: the selection of the README's Speed row, which
predates layouts and graphs; ``--skip-shapes ''`` for every family), no repro bundles or progress bar, in a child process,
the whole command timed; then the peer (bench_peer_onnx.py: ONNX's node tests on onnxruntime
through pytest), the same way, right after it on the same machine. Prints each suite's cases,
wall seconds and cases/s, and the ratio of the rates.

"Warm" means MLX's JIT cache already holds this matrix's kernels (run the matrix once first; the
figure says how many kernels the run compiled). The machine's load average is printed before
each side: other processes on 2 cores show in every figure, so compare runs made back to back.
Our side's ``inside`` figure (the sum over the workers of the time inside cases, ms per case) is
the one least sensitive to that load.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_matrix import jit_cache_files  # noqa: E402
from rlx_conformance.cli.options import SKIP_SHAPES_TOX  # noqa: E402
from bench_peer_onnx import child_cpu_s  # noqa: E402
from bench_peer_onnx import measure as measure_peer  # noqa: E402


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure_ours(workers: int, ops: str | None, sample: int, mode: str | None, skip_shapes: str = "") -> dict:
    """One run of our forward matrix through the CLI; its counts and times from results.json."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "rlx_conformance", "run", "--grad", "none", "--layouts", "none",
               "--graphs", "none", "--workers", str(workers), "--no-bundles", "--no-progress",
               "--report", tmp, "--format", "json", "--sample", str(sample)]
        cmd += ["--ops", ops] if ops else []
        cmd += ["--mode", mode] if mode else []
        cmd += ["--skip-shapes", skip_shapes] if skip_shapes else []
        before = jit_cache_files()
        c0, t0 = child_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, child_cpu_s() - c0
        path = Path(tmp) / "results.json"
        if not path.exists():
            raise RuntimeError(f"the run wrote no results.json (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        doc = json.loads(path.read_text())
    cases = doc["cases"]
    inside = sum(c.get("duration_s") or 0.0 for c in cases)
    backend = sum(c.get("backend_s") or 0.0 for c in cases)
    run_wall = doc["run"]["wall_s"]
    return {"suite": "rlx-conformance forward matrix, MLX " + (mode or "default mode"), "ran": len(cases),
            "exit": proc.returncode, "wall_s": round(wall, 2), "run_wall_s": run_wall,
            "cases_per_s": round(len(cases) / wall, 1), "run_cases_per_s": round(len(cases) / run_wall, 1),
            "inside_ms_per_case": round(inside / max(len(cases), 1) * 1e3, 2),
            "backend_ms_per_case": round(backend / max(len(cases), 1) * 1e3, 2),
            "jit_compiled": jit_cache_files() - before, "cpu_s": round(cpu, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ops", default=None, help="op globs (default: every op)")
    ap.add_argument("--sample", type=int, default=1, help="every K-th input set (default 1: all)")
    ap.add_argument("--mode", default=None, help="MLX mode (default: MLX's default, compiled)")
    ap.add_argument("--skip-shapes", default=SKIP_SHAPES_TOX,
                    help=f"shape families to leave out, as run --skip-shapes (default: {SKIP_SHAPES_TOX}, as "
                         "tox -e mlx; '' none)")
    ap.add_argument("--no-peer", action="store_true", help="our side only")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = ap.parse_args()

    figures = {"load_before_ours": load()}
    ours = measure_ours(args.workers, args.ops, args.sample, args.mode, args.skip_shapes)
    figures["ours"] = ours
    if not args.no_peer:
        figures["load_before_peer"] = load()
        figures["peer"] = peer = measure_peer()
        figures["ratio"] = round(ours["cases_per_s"] / peer["cases_per_s"], 2) if peer["cases_per_s"] else None
    if args.json:
        print(json.dumps(figures))
        return
    print(f"load average before ours: {figures['load_before_ours']}")
    print(f"ours: {ours['ran']} cases in {ours['wall_s']:.1f} s (the run itself {ours['run_wall_s']:.1f} s), "
          f"{args.workers} workers  ->  {ours['cases_per_s']:.1f} cases/s ({ours['run_cases_per_s']:.1f} over the "
          f"run's wall); inside a worker {ours['inside_ms_per_case']:.2f} ms/case, of which MLX "
          f"{ours['backend_ms_per_case']:.2f} ms; {ours['jit_compiled']} JIT kernels compiled "
          f"({'cold' if ours['jit_compiled'] else 'warm'}); {ours['cpu_s']:.1f} CPU s; exit {ours['exit']}")
    if args.no_peer:
        return
    peer = figures["peer"]
    print(f"load average before the peer: {figures['load_before_peer']}")
    print(f"peer: {peer['suite']}: {peer['ran']} cases ran ({peer['passed']} passed, {peer['failed']} failed, "
          f"{peer['skipped']} skipped) in {peer['wall_s']:.1f} s ({peer['cpu_s']:.1f} CPU s)  ->  "
          f"{peer['cases_per_s']:.1f} cases/s")
    print(f"ratio (ours / peer, cases per second of the whole command): {figures['ratio']:.2f}x")


if __name__ == "__main__":
    main()
