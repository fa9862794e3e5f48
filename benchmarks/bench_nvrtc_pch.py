"""NVRTC's precompiled headers for MLX's CUDA JIT, off against on (issue 19 item 2).

    python benchmarks/bench_nvrtc_pch.py [--seconds S] [--workers N] [--json PATH] [-- RUN OPTIONS]

A cold GPU run is NVRTC-bound (README, MLX on a GPU). backends/mlx/_nvrtc_pch.py gives the
workers NVRTC's automatic PCH; this script runs one selection twice on the same machine, each
time with NVRTC's and MLX's caches empty (a fresh TMPDIR and MLX_PTX_CACHE_DIR) and for at most
``--seconds``: first with the PCH off (``RLX_CONFORMANCE_NVRTC_PCH=0``, the shim loaded in the
workers all the same but without its folder, so both passes log each compile alike), then on
(as a run gives it). It reports per pass the cases run,
the compiles, NVRTC seconds each and in all (the shim's log), how many compiles were of a kernel
already compiled in the pass (two workers building one kernel at once, before MLX's PTX cache has
it), the PCH folder's largest size,
and whether each case run by both passes has the same outcome and output digest.

The default selection (after ``--``, any ``rlx-conformance run`` options) is a compile-heavy
slice of the default GPU run: fused activations and norms with their derivatives. Needs MLX's
CUDA build, a C compiler and NVRTC >= 12.8 (else the shim is not used, and this says so).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from rlx_conformance.backends.base import PRELOAD_ENV
from rlx_conformance.backends.mlx import _nvrtc_pch

SELECTION = ["--device", "gpu", "--mode", "compiled", "--ops", "gelu*,silu,softmax,layer_norm,rms_norm,mul,add",
             "--dtypes", "float32,bfloat16", "--sample-grad", "8", "--skip-shapes", "huge"]


def _folder_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6 if path.is_dir() else 0.0


def one_pass(name: str, shim: Path, selection: list[str], seconds: float, workers: int) -> dict:
    """The selection run once with caches empty, the PCH ``name`` ("off" or "on")."""
    tmp = Path(tempfile.mkdtemp(prefix=f"bench_nvrtc_pch_{name}_"))
    log, report = tmp / "nvrtc.log", tmp / "r"
    env = {**os.environ, "TMPDIR": str(tmp), "MLX_PTX_CACHE_DIR": str(tmp / "ptx"),
           "RLX_CONFORMANCE_NVRTC_LOG": str(log), _nvrtc_pch.ENV: "0" if name == "off" else "1"}
    env.pop(_nvrtc_pch.DIR_ENV, None)
    if name == "off":  # the shim without its folder: it logs and adds nothing ("on": the run loads it)
        env[PRELOAD_ENV] = str(shim)
    largest = [0.0]
    done = threading.Event()

    def sample() -> None:  # the PCH folder (under the run's TMPDIR) every 3 s
        while not done.wait(3):
            largest[0] = max(largest[0], _folder_mb(tmp / "rlx-conformance" / "nvrtc-pch" / "pch"))

    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "rlx_conformance", "run", *selection, "--workers", str(workers),
                             "--no-progress", "--no-bundles", "--report", str(report)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # the run writes what it has and exits 130
        _, err = proc.communicate(timeout=60)
    wall = time.perf_counter() - t0
    done.set()
    rows = [line.split() for line in log.read_text().splitlines()] if log.is_file() else []
    nvrtc = [float(r[1]) for r in rows]
    try:
        cases = json.loads((report / "results.json").read_text())["cases"]
    except (OSError, ValueError, KeyError):
        cases = []
    return {"pass": name, "exit": proc.returncode, "wall_s": round(wall, 1), "cases": len(cases),
            "outcomes": dict(Counter(c["outcome"] for c in cases)), "compiles": len(nvrtc),
            "failed_compiles": sum(1 for r in rows if r[2] != "0"), "nvrtc_s": round(sum(nvrtc), 1),
            "repeated_compiles": len(rows) - len({r[5] for r in rows}),
            "nvrtc_s_each": round(sum(nvrtc) / len(nvrtc), 3) if nvrtc else None,
            "pch_folder_max_mb": round(largest[0]), "stderr_tail": err[-300:] if proc.returncode not in (0, 1, 130) else "",
            "records": {c["id"]: [c["outcome"], c.get("output_digest")] for c in cases}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=70.0, help="each pass's limit (default 70)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    p.add_argument("--json", metavar="PATH")
    p.add_argument("run_options", nargs="*", help="after --: the selection (default: a compile-heavy GPU slice)")
    args = p.parse_args()
    shim = _nvrtc_pch.prepare()
    if shim is None:
        print("bench_nvrtc_pch: the NVRTC PCH is not usable here (needs MLX's CUDA build, a C compiler and NVRTC "
              f">= 12.8; see {tempfile.gettempdir()}/rlx-conformance/nvrtc-pch/*/unusable)", file=sys.stderr)
        return 2
    passes = [one_pass(n, shim, args.run_options or SELECTION, args.seconds, args.workers) for n in ("off", "on")]
    off, on = (q.pop("records") for q in passes)
    both = [k for k in off if k in on]
    changed = sum(1 for k in both if off[k] != on[k])
    for q in passes:
        print(f"{q['pass']:>3}: {q['cases']} cases in {q['wall_s']} s (exit {q['exit']}), {q['compiles']} compiles, "
              f"{q['nvrtc_s_each']} s NVRTC each ({q['nvrtc_s']} s), {q['failed_compiles']} failed, "
              f"{q['repeated_compiles']} of a kernel compiled before in the pass, "
              f"PCH folder at most {q['pch_folder_max_mb']} MB {q['stderr_tail']}")
    print(f"outcome or output digest changed in {changed} of the {len(both)} cases both passes ran")
    if args.json:
        Path(args.json).write_text(json.dumps({"passes": passes, "compared": len(both), "changed": changed}, indent=1))
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
