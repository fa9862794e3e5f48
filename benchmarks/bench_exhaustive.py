"""Benchmark of the exhaustive sweep (rlx_conformance/run/exhaustive.py): every unary float op over
all float16 and bfloat16 bit patterns on one target, plus the CPU reference.

    python benchmarks/bench_exhaustive.py [--target mlx-cpu-lazy] [--workers 2] [--ops GLOB]
                                          [--cache DIR] [--cold] [--no-reference]

Reports the wall time, the time inside the oracle (cold cache: MPFR element by element; warm:
loading the .npy files), inside the backends, and the rows per outcome. ``--cold`` starts from
an empty oracle cache (a fresh temporary directory unless --cache is given, which is emptied).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="mlx-cpu-lazy")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ops", default=None)
    ap.add_argument("--cache", default=None)
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()

    from rlx_conformance.generate.matrix import Target
    from rlx_conformance.run.exhaustive import run_exhaustive

    cache = Path(args.cache) if args.cache else Path(tempfile.gettempdir()) / "rlx-bench-oracle"
    if args.cold and cache.exists():
        shutil.rmtree(cache)
    t0 = time.perf_counter()
    doc = run_exhaustive([Target.parse(args.target)], args.ops.split(",") if args.ops else None,
                         ["float16", "bfloat16"], None, workers=args.workers, cache_dir=cache,
                         reference=not args.no_reference)
    wall = time.perf_counter() - t0
    rows = doc["rows"]
    jobs = {(r["op"], str(r["attrs"]), r["dtype"]): r.get("oracle_s", 0.0) for r in rows}
    oracle = sum(jobs.values())
    backend = sum(r.get("seconds", 0.0) for r in rows if r["target"] == args.target)
    ref = sum(r.get("seconds", 0.0) for r in rows if r["target"] == "cpu-cpu-eager")
    print(f"{len(jobs)} (op, dtype) sweeps of 65,536 inputs, {len(rows)} rows, {args.workers} worker(s), "
          f"{'cold' if args.cold else 'warm'} oracle cache ({cache})")
    print(f"wall: {wall:.1f} s")
    print(f"  oracle (sum over workers): {oracle:.1f} s; {args.target}: {backend:.1f} s; "
          f"CPU reference: {ref:.1f} s (each including the comparison)")
    print("outcomes:", dict(Counter(r["outcome"] for r in rows)))


if __name__ == "__main__":
    main()
