"""How fast validate diagnoses a kernel that hangs, segfaults or aborts on every case (issue 18).

    python benchmarks/bench_hang.py [--op relu] [--kernels hangs,segfaults,aborts] [--repeat 1]
                                    [--json PATH] [-- EXTRA VALIDATE OPTIONS]

Runs ``rlx-conformance validate OP --kernel tests/fail_fast_kernels.py:K`` as a user would (a fresh
interpreter, the CLI's defaults: compiled mode, one worker per core, no options but a report
directory under a temporary folder) for each kernel, and reports per kernel the wall time of the
whole command, its exit status, the outcome counts of results.json and the timeouts' limit. The
issue's goals: a verdict naming the hang in <= 60 s, a segfault on every case in <= 30 s (before:
60 s per case and a retry, every case: more than 600 s for relu's 56 cases).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

KERNELS = Path(__file__).resolve().parent.parent / "tests" / "fail_fast_kernels.py"


def measure(op: str, kernel: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report"
        cmd = [sys.executable, "-m", "rlx_conformance.cli.main", "validate", op, "--kernel",
               f"{KERNELS}:{kernel}", "--report", str(report), "--no-progress", *extra]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        cases = json.loads((report / "results.json").read_text())["cases"] if (report / "results.json").exists() else []
    last = (p.stdout.strip().splitlines() or [""])[-1]
    return {"op": op, "kernel": kernel, "wall_s": round(wall, 2), "exit": p.returncode,
            "outcomes": dict(Counter(r["outcome"] for r in cases)), "verdict": last}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="relu")
    ap.add_argument("--kernels", default="hangs,segfaults,aborts")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("extra", nargs="*", help="more validate options (after --)")
    args = ap.parse_args(argv)
    rows = []
    for k in args.kernels.split(","):
        for _ in range(args.repeat):
            row = measure(args.op, k, args.extra)
            rows.append(row)
            print(f"{row['kernel']:10s} {row['wall_s']:7.1f} s  exit {row['exit']}  {row['outcomes']}")
            print(f"           {row['verdict']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
