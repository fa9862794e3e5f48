"""cg_solve's iteration on a GPU: the loop before kernels v9 (eight iterations built, then the
convergence check evaluates them) with the step as written and with the fused step, against the
shipped kernel (fused, each iteration queued with mx.async_eval). Issue 19 item 3's goal:
an iteration within 1.5x of its SpMV plus its vector operations.

    PYTHONPATH=benchmarks:. python benchmarks/bench_cg_iteration.py [--sizes 1e6,1e7,1e8]
        [--min-time 0.2] [--passes 2]

Timing as bench_gpu_custom.py's cg_parts (one iteration = the time of max_iter 24 minus 8, over
16; the parts timed alone the same way, the vector operations with the variant's step). Each
variant's solution is compared with the plain loop's (max absolute difference). Results:
benchmarks/README.md, "cg_solve's iteration and GatherElements' index loads". Without a CUDA GPU
it runs on the CPU (a smoke run: the composed SpMV, and the numbers mean little).
"""
from __future__ import annotations

import argparse
import json
import types

import numpy as np

from bench_gpu_custom import cg_parts, inputs


def unqueued(custom, step):
    """cg_solve's loop as before v9 (nothing evaluated until the check every 8 iterations)."""
    import mlx.core as mx

    def cg(values, col_idx, row_ptr, b, *, max_iter, tol):
        product = custom.cg_product(values, col_idx, row_ptr, b.shape[0])
        x, r, p = mx.zeros_like(b), b, b
        rs = mx.sum(r * r)
        limit = mx.array(tol, rs.dtype)
        done = mx.sqrt(rs) < limit
        for it in range(max_iter):
            x, r, p, rs, done = step(x, r, p, product(p), rs, done, limit)
            if it % 8 == 7 and done.item():
                break
        return x
    return types.SimpleNamespace(fn=cg)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--passes", type=int, default=2)
    args = ap.parse_args()

    import mlx.core as mx

    from rlx_conformance import backends
    from rlx_conformance.backends.mlx import custom

    shipped = backends.get_backend("mlx").kernels["rlx_sparse.cg_solve"]
    dev = mx.gpu if mx.cuda.is_available() else mx.cpu
    print(json.dumps({"mlx": mx.__version__, "device": str(mx.device_info()) if dev == mx.gpu else "cpu"}),
          flush=True)
    here = custom.cg_step_here
    variants = {"plain": (unqueued(custom, custom.cg_step), custom.cg_step),
                "fused": (unqueued(custom, custom.cg_step_fused), custom.cg_step_fused),
                "shipped": (shipped, None)}
    try:
        for size in (int(float(s)) for s in args.sizes.split(",")):
            ins, attrs, _ = inputs("rlx_sparse.cg_solve", size)
            with mx.stream(dev):
                margs = [mx.array(a) for a in ins]
                mx.eval(margs)
                sols = {}
                for _ in range(args.passes):
                    for name, (entry, step) in variants.items():
                        # cg_parts times the vector operations with the step cg_step_here() gives
                        custom.cg_step_here = (lambda s=step: s) if step is not None else here
                        r = cg_parts(mx, margs, attrs, entry, args.min_time)
                        print(json.dumps({"size": size, "variant": name, **r}), flush=True)
                        sols.setdefault(name, np.array(entry.fn(*margs, **attrs)))
                for name in ("fused", "shipped"):
                    d = float(np.abs(sols["plain"].astype(np.float64) - sols[name]).max())
                    print(json.dumps({"size": size, "variant": name, "max_abs_diff_from_plain": d,
                                      "max_abs": float(np.abs(sols["plain"]).max())}), flush=True)
    finally:
        custom.cg_step_here = here


if __name__ == "__main__":
    main()
