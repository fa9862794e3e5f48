"""How much of each output the judges assert: per op and value class, over the generated cases.

    python benchmarks/asserted_share.py [--ops GLOB,...] [--dtypes GLOB,...] [--markdown]

The CPU reference is run on every case's inputs (no backend under test), and the op's judge
(run.execute.judge, exactly as the matrix judges) is handed a deliberately wrong answer: every
element of the reference's output replaced by one of the other kind, NaN where the reference is
finite and 0.0 where it is NaN or infinite. An element is *asserted* when that replacement alone
is rejected. Elementwise judges (tolerances and bounds through compare, and own checks built on
compare) count per element: compare's verdict of an element depends on that element only, so
replacing every element at once and counting the mismatches gives the same count as one element
at a time. Own checks that judge a whole output (solvers, factorizations, iterative methods) count
per case: all of the case's elements are asserted when the all-wrong answer is rejected, none
when it passes; the table marks them "case".

Columns: elements and cases measured, the share of elements asserted, the elements the judges
report as order-dependent (Comparison.order_dependent: legal outcomes only, e.g. a sum whose
partial sums may overflow) and those whose finite value no bound covers (Comparison.unbounded:
NaN/inf still asserted), and the cases that assert nothing at all.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import time
from collections import defaultdict

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate.matrix import Target, generate, make_inputs
from rlx_conformance.run.execute import judge

# The accumulating ops of issue 14 (sums, scans, softmax, norms, attention, dot products,
# convolution, losses, sparse ops, solvers) and the other ops judged by a bound or a check.
OPS = ("reduce_sum", "reduce_mean", "reduce_prod", "cumsum", "cum_prod", "softmax",
       "layer_norm", "rms_norm", "group_norm", "batch_norm_inference", "attention", "rope",
       "mat_mul", "dot_general", "conv", "conv_transpose2d", "pool", "softmax_cross_entropy",
       "scatter_add", "fft", "fake_quantize", "det", "log_det",
       "rlx_sparse.mat_vec", "rlx_sparse.values_grad", "rlx_sparse.lu_solve", "rlx_sparse.cg_solve",
       "onnx.ScatterElements", "onnx.ScatterND",
       "dense_solve", "batched_dense_solve", "triangular_solve", "cholesky", "svd", "qr")
# Own checks whose verdict is about a whole output, not element by element.
WHOLE = {"dense_solve", "batched_dense_solve", "triangular_solve", "cholesky", "svd", "qr",
         "rlx_sparse.lu_solve", "rlx_sparse.cg_solve"}


def wrong(e: np.ndarray) -> np.ndarray:
    """Every element replaced by one of the other kind: NaN for finite, 0 for NaN/inf."""
    e64 = e.astype(np.float64)
    return np.where(np.isfinite(e64), np.nan, 0.0).astype(e.dtype)


def measure(ops, dtypes) -> dict[tuple[str, str], dict[str, float]]:
    cpu = get_backend("cpu")
    cases = generate([Target("cpu", "cpu", "eager")], ops=list(ops), dtypes=dtypes)
    rows: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for case in cases:
        inputs = make_inputs(case)
        try:
            expected = cpu.run(case.op, [x.copy() for x in inputs], case.attr_dict)
        except Exception as e:  # noqa: BLE001 — the reference rejects the input: nothing to judge
            print(f"skipped {case.input_id}: the reference raised {type(e).__name__}: {e}")
            continue
        floats = [k for k, e in enumerate(expected) if dt.is_float(dt.name_of(e.dtype))]
        size = sum(expected[k].size for k in floats)
        if not floats or size == 0:
            continue
        actual = [wrong(e) if k in floats else e.copy() for k, e in enumerate(expected)]
        with np.errstate(all="ignore"):
            ok, comps, _ = judge(case, inputs, expected, actual)
        r = rows[(case.op, case.vals)]
        r["cases"] += 1
        r["elements"] += size
        if case.op in WHOLE:
            hit = 0 if ok else size
        else:
            hit = sum(c.mismatches for c in comps)
        r["asserted"] += hit
        r["order_dependent"] += sum(getattr(c, "order_dependent", 0) for c in comps)
        r["unbounded"] += sum(getattr(c, "unbounded", 0) for c in comps)
        r["blind_cases"] += hit == 0
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=None, help="comma-separated globs (default: the accumulating ops)")
    ap.add_argument("--dtypes", default="float*,bfloat16", help="comma-separated globs")
    ap.add_argument("--markdown", action="store_true", help="a markdown table (for the README)")
    args = ap.parse_args()
    pats = args.ops.split(",") if args.ops else None
    ops = [o for o in OPS if not pats or any(fnmatch.fnmatchcase(o, p) for p in pats)]
    t0 = time.perf_counter()
    rows = measure(ops, args.dtypes.split(","))
    head = ("op", "values", "cases", "elements", "asserted", "order-dep.", "unbounded", "blind cases")
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|")
    else:
        print(f"{head[0]:<24} {head[1]:<12} {head[2]:>6} {head[3]:>10} {head[4]:>9} {head[5]:>10} "
              f"{head[6]:>9} {head[7]:>11}")
    for op in ops:
        for (o, vals), r in sorted(rows.items()):
            if o != op:
                continue
            share = r["asserted"] / r["elements"] if r["elements"] else math.nan
            kind = " (case)" if op in WHOLE else ""
            cells = (op, vals, f"{int(r['cases'])}", f"{int(r['elements'])}", f"{share:.1%}{kind}",
                     f"{int(r['order_dependent'])}", f"{int(r['unbounded'])}", f"{int(r['blind_cases'])}")
            if args.markdown:
                print("| " + " | ".join(cells) + " |")
            else:
                print(f"{cells[0]:<24} {cells[1]:<12} {cells[2]:>6} {cells[3]:>10} {cells[4]:>9} "
                      f"{cells[5]:>10} {cells[6]:>9} {cells[7]:>11}")
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
