"""Benchmark of the default matrix: cases per second and the harness's share of the wall time.

    python benchmarks/bench_matrix.py [--ops GLOB] [--mode all] [--workers N] [--sample K]

Runs the cases through the real runner (worker processes, isolation, journal, results.json) and
reports: cases, wall seconds, cases/s; the sum of per-case time inside the workers split into the
backend call and the rest (input generation, reference, comparison), and the runner's own
overhead (wall × workers − time inside cases). Also times case generation alone. MLX's CPU compiled
mode JIT-compiles C++ on first use and caches it under $TMPDIR/mlx: the first run on a machine
("cold") pays the compiler; later runs ("warm") do not — the script says which it measured by
counting cache files before and after.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def jit_cache_files() -> int:
    d = Path(tempfile.gettempdir()) / "mlx"
    return sum(1 for _ in d.rglob("*.so")) if d.exists() else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=None)
    ap.add_argument("--mode", default="all")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--sample", type=int, default=1, help="run every K-th case")
    args = ap.parse_args()

    from rlx_conformance.run import session

    t0 = time.perf_counter()
    cases = session.build_cases(session.backend_targets("mlx", args.device, args.mode),
                                ops=args.ops.split(",") if args.ops else None)[:: args.sample]
    gen = time.perf_counter() - t0
    before = jit_cache_files()
    with tempfile.TemporaryDirectory() as tmp:
        # A sample holds only part of each known divergence's cases: no strict xpass verdicts.
        run = session.execute(cases, Path(tmp), workers=args.workers, timeout=60,
                              strict_divergences=args.sample == 1)
    wall = run.meta["wall_s"]
    inside = sum(r.duration_s for r in run.results)
    backend = sum(r.backend_s for r in run.results)
    workers = args.workers or os.cpu_count() or 1
    compiled = jit_cache_files() - before
    print(f"cases: {len(cases)}  (generation {gen:.2f} s, {gen / max(len(cases), 1) * 1e6:.0f} us/case)")
    print(f"wall: {wall:.1f} s  ->  {len(cases) / wall:.0f} cases/s with {workers} worker(s)")
    print(f"time inside cases (sum over workers): {inside:.1f} s = {inside / len(cases) * 1e3:.2f} ms/case")
    print(f"  of which the MLX backend: {backend:.1f} s; reference, inputs, comparison: {inside - backend:.1f} s")
    print(f"harness share of the wall time (everything but the MLX call): {1 - backend / (wall * workers):.0%}")
    print(f"MLX JIT kernels compiled during the run: {compiled} ({'cold' if compiled else 'warm'} cache)")
    from collections import Counter

    print("outcomes:", dict(Counter(r.outcome for r in run.results)))


if __name__ == "__main__":
    main()
