"""The peer suite's throughput: ONNX's backend node tests run on onnxruntime through pytest.

    python benchmarks/bench_peer_onnx.py [--k EXPR] [--json]

The peer for issue 18's throughput goal: a conformance suite of the same kind (an op on fixed
inputs, checked against expected outputs) that a user runs the usual way. ONNX ships its node
tests as Python definitions (onnx.backend.test.case.node; since onnx 1.16 they are built in memory,
no data folder); ``onnx.backend.test.BackendTest`` turns them into unittest cases for a backend,
and onnxruntime ships that backend (``onnxruntime.backend``: a wrapper around
``onnxruntime.InferenceSession``), as onnxruntime's own CI runs them. Only the node kind is kept
(``OnnxBackendNodeModelTest``): the "real" models need a download this machine cannot make.

The script writes that pytest module into a temporary folder, runs ``python -m pytest`` on it in a
child process (one process, as a user runs it; the whole command timed, collection included) and
reads the JUnit XML: cases that ran (passed or failed; skipped ones did not run) over the wall
time gives cases/s. ``measure()`` is what bench_throughput.py calls for its side-by-side figure.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

MODULE = '''\
import onnx.backend.test
import onnxruntime.backend

backend_test = onnx.backend.test.BackendTest(onnxruntime.backend, __name__)
OnnxBackendNodeModelTest = backend_test.test_cases["OnnxBackendNodeModelTest"]
'''


def child_cpu_s() -> float:
    """CPU seconds (user + system) of this process's reaped children so far."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(k: str | None = None, python: str = sys.executable) -> dict:
    """Run the peer suite once; returns its counts (ran, passed, failed, skipped), the whole
    command's wall seconds, pytest's own session seconds, ran/wall as ``cases_per_s``, and the
    command's CPU seconds (``cpu_s``: on a loaded machine the wall time measures the others too)."""
    with tempfile.TemporaryDirectory() as tmp:
        mod = Path(tmp) / "test_onnx_node_ort.py"
        mod.write_text(MODULE)
        junit = Path(tmp) / "junit.xml"
        cmd = [python, "-m", "pytest", str(mod), "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
               f"--junitxml={junit}", "-W", "ignore"] + (["-k", k] if k else [])
        c0, t0 = child_cpu_s(), time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - t0, child_cpu_s() - c0
        if not junit.exists():
            raise RuntimeError(f"pytest wrote no JUnit XML (exit {proc.returncode}):\n{proc.stdout[-2000:]}"
                               f"{proc.stderr[-2000:]}")
        suites = ET.parse(junit).getroot()
        suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
        n = {a: int(suite.get(a, 0)) for a in ("tests", "failures", "errors", "skipped")}
        session_s = float(suite.get("time", 0.0))
    ran = n["tests"] - n["skipped"]
    return {"suite": "onnx node tests on onnxruntime (pytest)", "ran": ran,
            "passed": ran - n["failures"] - n["errors"], "failed": n["failures"] + n["errors"],
            "skipped": n["skipped"], "wall_s": round(wall, 2), "pytest_session_s": round(session_s, 2), "cpu_s": round(cpu, 2),
            "cases_per_s": round(ran / wall, 1) if wall else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", default=None, help="pytest -k expression (a subset, to try the script)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = ap.parse_args()
    m = measure(args.k)
    if args.json:
        print(json.dumps(m))
        return
    print(f"{m['suite']}: {m['ran']} cases ran ({m['passed']} passed, {m['failed']} failed; "
          f"{m['skipped']} skipped) in {m['wall_s']:.1f} s (pytest session {m['pytest_session_s']:.1f} s; "
          f"{m['cpu_s']:.1f} CPU s)"
          f"  ->  {m['cases_per_s']:.1f} cases/s")


if __name__ == "__main__":
    main()
