"""Speed of the eight custom ops: native MLX vs the host delegate vs the CPU reference.

    python benchmarks/bench_custom.py [--device cpu|gpu] [--max-size 1000000] [--repeat 5]
                                      [--ops GLOB,...] [--json PATH]

For each op and size (elements, or stored nonzeros for the sparse ops; lu_solve: n with n^2 dense
elements, since the native kernel factors densely) it reports the median wall time of

* ``cpu``: the CPU reference, Backend.run (numpy/scipy);
* ``native``: the MLX kernel through Backend.run in lazy mode (numpy -> MLX -> numpy, host value
  checks included, as the matrix runs it);
* ``kernel``: the native kernel alone on arrays already in MLX, one mx.eval (no transfers, no
  checks): the cost RLX's lowering would see;
* ``delegate``: the host delegate through Backend.run in lazy mode (MLX -> host -> CPU kernel ->
  MLX).

Inputs are the ops' own generators' structures at benchmark sizes: random indices (scatters with
reduction add, so duplicates accumulate), banded random CSR matrices with about 8 entries per row,
an SPD matrix for CG (a fixed 20 iterations: tol below reach).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import time

import numpy as np


def _inputs(op: str, size: int):
    from rlx_conformance.spec import csr
    from rlx_conformance.spec.values import Stream

    s = Stream(f"bench/{op}/{size}")
    f32 = np.float32
    if op == "onnx.ScatterElements":
        n = size
        return [s.uniform(n, -1, 1).astype(f32), s.integers(n, -n, n - 1).reshape(n),
                s.uniform(n, -1, 1).astype(f32)], {"axis": 0, "reduction": "add"}
    if op == "onnx.GatherElements":
        n = size
        return [s.uniform(n, -1, 1).astype(f32), s.integers(n, -n, n - 1)], {"axis": 0}
    if op in ("onnx.GatherND", "onnx.ScatterND"):
        rows = max(size // 16, 1)
        data = s.uniform(rows * 16, -1, 1).astype(f32).reshape(rows, 16)
        idx = s.integers(rows, -rows, rows - 1).reshape(rows, 1)
        if op == "onnx.GatherND":
            return [data, idx], {"batch_dims": 0}
        return [data, idx, s.uniform(rows * 16, -1, 1).astype(f32).reshape(rows, 16)], {"reduction": "add"}
    if op == "rlx_sparse.lu_solve":
        n = size
        v, c, rp = csr.square(s, n, "dominant", "float32")
        return [v, c, rp, s.uniform(n, -1, 1).astype(f32)], {}
    n = max(size // 8, 1)  # ~8 stored entries per row
    v, c, rp = csr.square(s, n, "spd", "float32")
    vec = s.uniform(n, -1, 1).astype(f32)
    if op == "rlx_sparse.mat_vec":
        return [v, c, rp, vec], {}
    if op == "rlx_sparse.values_grad":
        return [c, rp, vec, s.uniform(n, -1, 1).astype(f32)], {}
    if op == "rlx_sparse.cg_solve":
        return [v, c, rp, (vec / np.linalg.norm(vec)).astype(f32)], {"max_iter": 20, "tol": 1e-30}
    raise KeyError(op)


SIZES = {"rlx_sparse.lu_solve": (100, 300, 1000)}  # n: 10^4 .. 10^6 dense elements
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)


def _median(fn, repeat: int) -> float:
    fn()  # warm-up: JIT, allocations, compile caches
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-size", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ops", default="onnx.*,rlx_sparse.*")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import mlx.core as mx

    from rlx_conformance import backends
    from rlx_conformance.backends.mlx import delegate, to_mlx
    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.ops import all_ops

    cpu, mlx = backends.get_backend("cpu"), backends.get_backend("mlx")
    dev = mx.gpu if args.device == "gpu" else mx.cpu
    ops = [s.name for s in all_ops() if s.family == "custom"
           and any(fnmatch.fnmatchcase(s.name, p) for p in args.ops.split(","))]
    rows = []
    print(f"device {args.device}, mlx {mx.__version__}, median of {args.repeat}; seconds")
    print(f"{'op':24} {'size':>9} {'cpu':>9} {'native':>9} {'kernel':>9} {'delegate':>9}")
    for op in ops:
        for size in SIZES.get(op, DEFAULT_SIZES):
            if size > args.max_size:
                continue
            ins, attrs = _inputs(op, size)
            entry = mlx.kernels[op]
            stream = mx.cpu if mlx.stream_for(entry, [dt.name_of(x.dtype) for x in ins], args.device) == "cpu" else dev
            r = {"op": op, "size": size, "device": args.device}
            r["cpu"] = _median(lambda: cpu.run(op, ins, attrs), args.repeat)
            r["native"] = _median(lambda: mlx.run(op, ins, attrs, args.device, "lazy"), args.repeat)
            with mx.stream(stream):
                margs = [to_mlx(x, dt.name_of(x.dtype)) for x in ins]
                mx.eval(margs)
                r["kernel"] = _median(lambda: mx.eval(entry.fn(*margs, **attrs)), args.repeat)
            delegate.force_delegate([op])
            try:
                r["delegate"] = _median(lambda: mlx.run(op, ins, attrs, args.device, "lazy"), args.repeat)
            finally:
                delegate.restore_native()
            rows.append(r)
            print(f"{op:24} {size:>9} {r['cpu']:>9.4f} {r['native']:>9.4f} {r['kernel']:>9.4f} "
                  f"{r['delegate']:>9.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
