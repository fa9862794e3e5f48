"""Benchmark of the exhaustive sweep (rlx_conformance/run/exhaustive.py): every unary float op over
all float16 and bfloat16 bit patterns on one target, plus the CPU reference; or, with
``--float32``, the float32 sweep (run/exhaustive_f32.py) over all 2^32 patterns (CuPy's float64
oracle on the GPU) or a sample (numpy).

    python benchmarks/bench_exhaustive.py [--target mlx-cpu-lazy] [--workers 2] [--ops GLOB]
                                          [--cache DIR] [--cold] [--no-reference]
    python benchmarks/bench_exhaustive.py --float32 full --target mlx-gpu-eager --workers 8 \\
        --rows OUT/rows.jsonl --write OUT/exhaustive-float32.json

Reports the wall time, the time inside the oracle (cold cache: MPFR element by element; warm:
loading the .npy files), inside the backends, and the rows per outcome. ``--cold`` starts from
an empty oracle cache (a fresh temporary directory unless --cache is given, which is emptied).
With --float32: a table per op (max ULP, elements over budget, MPFR-resolved elements, seconds),
each row also appended to --rows as it arrives (a sweep cut short keeps what it measured), and
the sweep's document written to --write (the GPU baseline's exhaustive-float32.json).
"""
from __future__ import annotations

import argparse
import json
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
    ap.add_argument("--float32", choices=("full", "sample"), default=None)
    ap.add_argument("--float32-sample", type=int, default=1 << 20)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--rows", default=None, help="append each float32 row to this JSON-lines file")
    ap.add_argument("--write", default=None, help="write the float32 sweep's document here")
    args = ap.parse_args()
    if args.float32:
        return float32(args)

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


def float32(args) -> None:
    from rlx_conformance.core.results import _jsonable, atomic_write_text
    from rlx_conformance.generate.matrix import Target
    from rlx_conformance.run.exhaustive import run_exhaustive

    rows_file = Path(args.rows) if args.rows else None

    def on_row(r):
        line = (f"{r['op']}{r['attrs'] or ''} {r['target']} {r['outcome']} max_ulp={r.get('max_ulp')} "
                f"over={r.get('over_budget')} mpfr={r.get('mpfr_resolved')} s={r.get('seconds')} "
                f"first_over={r.get('first_over', [])[:3]} {r.get('message', '')[:200]}")
        print(line, flush=True)
        if rows_file:
            with rows_file.open("a") as f:
                f.write(json.dumps(_jsonable(r), allow_nan=False) + "\n")

    t0 = time.perf_counter()
    doc = run_exhaustive([Target.parse(args.target)], args.ops.split(",") if args.ops else None, ["float32"],
                         None, f32_range=args.float32,
                         f32_sample=args.float32_sample if args.float32 == "sample" else 0,
                         workers=args.workers, timeout=args.timeout, cache_dir=None,
                         reference=not args.no_reference, on_row=on_row)
    wall = time.perf_counter() - t0
    print(f"\n{len(doc['rows'])} float32 rows ({args.float32}, oracle {doc['run'].get('float32_oracle')}), "
          f"{args.workers} worker(s), wall {wall:.1f} s")
    print("| op | max ULP | budget | over budget | MPFR-resolved | s |\n|---|---|---|---|---|---|")
    for r in doc["rows"]:
        attrs = ",".join(f"{k}={v}" for k, v in sorted(r["attrs"].items()))
        budget = (r.get("budget") or {}).get("ulp")
        print(f"| {r['op']}{f' [{attrs}]' if attrs else ''} | {r.get('max_ulp')} | {budget} "
              f"| {r.get('over_budget')} | {r.get('mpfr_resolved')} | {r.get('seconds')} | {r['outcome']}")
    print("outcomes:", dict(Counter(r["outcome"] for r in doc["rows"])))
    if args.write:
        atomic_write_text(Path(args.write), json.dumps(_jsonable(doc), indent=1, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
