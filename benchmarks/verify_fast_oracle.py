"""The full check of the oracle's fast path (rlx_conformance/judge/precise_fast.py): for every unary op
and attribute combination the exhaustive sweep covers, fast path + MPFR fallback against pure
MPFR on ALL 65,536 float16 and ALL 65,536 bfloat16 inputs, bit for bit (NaN payloads and the
sign of zero included; NaN against NaN is also reported apart).

    python benchmarks/verify_fast_oracle.py [--ops GLOB,...] [--workers 2] [--json FILE]

Takes the cold oracle's time (pure MPFR: about 3 minutes of CPU). Prints, per sweep, how many
elements the fast path left to MPFR (special inputs: NaN, inf, zero; and the rest: intervals on
a rounding boundary, inputs outside an op's float64 domain) and the mismatches; exits 1 if any
output differs. Run it after any change to precise.py or precise_fast.py (tests/
test_precise_fast.py checks a subset on every test run).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from typing import Any


def check(job: tuple[str, dict[str, Any], str]) -> dict[str, Any]:
    """One sweep: fast + fallback and pure MPFR on every input pattern of ``dtype``."""
    import numpy as np

    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.judge import precise, precise_fast
    from rlx_conformance.run import exhaustive as ex

    op, attrs, dtype = job
    out = attrs.get("to", dtype) if op == "cast" else dtype
    x = ex.inputs_for(dtype)
    with np.errstate(all="ignore"):
        t0 = time.perf_counter()
        fast = precise.elementwise(op, [x], attrs, out)
        t1 = time.perf_counter()
        pure = precise.elementwise(op, [x], attrs, out, fast=False)
        t2 = time.perf_counter()
        xf = x.astype(np.float64)
    uint = dt.finfo(out).uint
    differ = fast.view(uint) != pure.view(uint)
    both_nan = np.isnan(fast.astype(np.float64)) & np.isnan(pure.astype(np.float64))
    special = ~np.isfinite(xf) | (xf == 0)
    if precise_fast.applies(op, [x.dtype], attrs, out):
        decided = precise_fast.decide(op, x, attrs, out)[1]
    else:
        decided = np.zeros(x.shape, bool)
    other = ~decided & ~special
    return {"op": op, "attrs": attrs, "dtype": dtype, "out": out, "n": int(x.size),
            "fast_path": bool(decided.any()), "fallback_special": int((~decided & special).sum()),
            "fallback_other": int(other.sum()),
            "fallback_other_inputs": [f"0x{int(b):04x}" for b in x.view(np.uint16)[other][:8]],
            "mismatch_bits": int(differ.sum()), "mismatch_values": int((differ & ~both_nan).sum()),
            "fast_s": round(t1 - t0, 3), "mpfr_s": round(t2 - t1, 3)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default=None, help="comma-separated op name globs (default: all)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()

    from rlx_conformance.ops import get_op
    from rlx_conformance.run import exhaustive as ex

    jobs = [(op, attrs, d) for op, attrs in ex.unary_ops(args.ops.split(",") if args.ops else None)
            for d in ("float16", "bfloat16") if d in get_op(op).dtypes]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(max(args.workers, 1)) as pool:
        rows = pool.map(check, jobs, chunksize=1)
    wall = time.perf_counter() - t0
    n = sum(r["n"] for r in rows)
    fb_special = sum(r["fallback_special"] for r in rows)
    fb_other = sum(r["fallback_other"] for r in rows)
    bad = sum(r["mismatch_bits"] for r in rows)
    for r in rows:
        attrs = ",".join(f"{k}={v}" for k, v in sorted(r["attrs"].items()))
        print(f"{r['op']:13s} {attrs:18s} {r['dtype']:9s} fallback: {r['fallback_special']:5d} special "
              f"+ {r['fallback_other']:5d} other   mismatches: {r['mismatch_bits']} "
              f"(values {r['mismatch_values']})   fast {r['fast_s']:.2f} s, MPFR {r['mpfr_s']:.2f} s")
    print(f"{len(rows)} sweeps, {n:,} elements in {wall:.1f} s: fallback {fb_special + fb_other:,} "
          f"({100 * (fb_special + fb_other) / n:.2f} %: {fb_special:,} special inputs, {fb_other:,} other); "
          f"mismatches {bad}")
    print(f"time: fast path + fallback {sum(r['fast_s'] for r in rows):.1f} s, pure MPFR "
          f"{sum(r['mpfr_s'] for r in rows):.1f} s (summed over workers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
