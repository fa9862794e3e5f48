"""The custom ops on a GPU: MLX's CUDA kernels vs MLX's composed kernels vs MLX on the CPU vs
the CPU reference, with the achieved memory bandwidth of the memory-bound ops.

    PYTHONPATH=. python benchmarks/bench_gpu_custom.py [--sizes 1e5,1e6,1e7] [--repeat 5]
                                                       [--ops GLOB,...] [--json PATH] [--budget S]

Columns (median wall seconds of the kernel on arrays already in place, one ``mx.eval``; the
first call of each configuration is a warm-up: NVRTC compiles, allocator):

* ``cuda``: the MLX kernel on the GPU stream with the CUDA kernels (backends/mlx/cuda_kernels.py);
* ``composed``: the same kernel on the GPU with RLX_MLX_CUDA_KERNELS=0 (MLX ops only: scatter
  through atomics, gathers through take / fancy indexing);
* ``mlx_cpu``: the composed kernel on MLX's CPU stream;
* ``ref``: the CPU reference kernel (numpy/scipy) on numpy arrays.

Sizes are elements of the index/data arrays for the ONNX ops (float32 data, int64 indices;
scatters with reduction add over random indices, so duplicates accumulate; GatherND/ScatterND
gather or scatter rows of 16 floats), stored nonzeros for mat_vec / values_grad / cg_solve
(random banded CSR, 8 entries a row, diagonally dominant; CG runs a fixed 20 iterations), and
n for lu_solve (dense LU on MLX's CPU stream: MLX linalg has no GPU kernels).

``GB/s`` is the minimal traffic of the op (each input read once, each output written once; the
sort and the key array of the deterministic scatter are not counted) over the ``cuda`` time,
and ``% peak`` that against the H200's HBM3e peak of 4.8 TB/s. ``stable`` says whether three
runs of the GPU kernel gave bit-identical results (cuda / composed). CPU columns that would take
longer than --budget seconds a call (extrapolated from the previous size) are skipped ("-").
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import time

import numpy as np

PEAK_GBS = 4800.0
ROW = 16  # GatherND / ScatterND slice width


def banded_csr(rng, n: int, per_row: int = 8, band: int = 64):
    """n x n CSR, per_row entries a row (the diagonal and per_row-1 others within +-band), made
    strictly diagonally dominant (so also usable by CG after symmetrisation-free use: it is only
    timed, never judged)."""
    off = rng.integers(1, band, (n, per_row - 1)) * np.where(rng.random((n, per_row - 1)) < 0.5, -1, 1)
    cols = np.concatenate([np.arange(n)[:, None], np.clip(np.arange(n)[:, None] + off, 0, n - 1)], 1)
    cols.sort(axis=1)
    vals = rng.uniform(-1, 1, (n, per_row)).astype(np.float32)
    diag = cols == np.arange(n)[:, None]
    vals = np.where(diag, per_row + 1.0, vals).astype(np.float32)
    rp = np.arange(0, n * per_row + 1, per_row, dtype=np.int32)
    return vals.ravel(), cols.ravel().astype(np.int32), rp


def inputs(op: str, size: int):
    """(inputs, attrs, minimal bytes moved) for an op at a size."""
    rng = np.random.default_rng(size)
    f32 = np.float32
    if op == "onnx.ScatterElements":
        n = size
        return ([rng.uniform(-1, 1, n).astype(f32), rng.integers(-n, n, n), rng.uniform(-1, 1, n).astype(f32)],
                {"axis": 0, "reduction": "add"}, 4 * n + 8 * n + 4 * n + 4 * n)
    if op == "onnx.GatherElements":
        n = size
        return ([rng.uniform(-1, 1, n).astype(f32), rng.integers(-n, n, n)], {"axis": 0},
                4 * n + 8 * n + 4 * n)
    if op in ("onnx.GatherND", "onnx.ScatterND"):
        rows = max(size // ROW, 1)
        data = rng.uniform(-1, 1, (rows, ROW)).astype(f32)
        idx = rng.integers(-rows, rows, (rows, 1))
        if op == "onnx.GatherND":
            return [data, idx], {"batch_dims": 0}, 8 * rows + 2 * 4 * rows * ROW
        upd = rng.uniform(-1, 1, (rows, ROW)).astype(f32)
        return [data, idx, upd], {"reduction": "add"}, 8 * rows + 3 * 4 * rows * ROW
    if op == "rlx_sparse.lu_solve":
        n = size
        v, c, rp = banded_csr(rng, n)
        return [v, c, rp, rng.uniform(-1, 1, n).astype(f32)], {}, None
    n = max(size // 8, 1)
    v, c, rp = banded_csr(rng, n)
    x = rng.uniform(-1, 1, n).astype(f32)
    nnz = v.size
    if op == "rlx_sparse.mat_vec":
        return [v, c, rp, x], {}, 8 * nnz + 4 * (n + 1) + 4 * n + 4 * n
    if op == "rlx_sparse.values_grad":
        return [c, rp, x, rng.uniform(-1, 1, n).astype(f32)], {}, 8 * nnz + 4 * (n + 1) + 8 * n
    if op == "rlx_sparse.cg_solve":
        return [v, c, rp, (x / np.linalg.norm(x)).astype(f32)], {"max_iter": 20, "tol": 1e-30}, None
    raise KeyError(op)


def timed(fn, repeat: int, budget: float, gpu: bool = False) -> float:
    """Median of ``repeat`` calls after one warm-up. On the CPU, a single call when the first
    takes > budget/4 (no JIT there: the first call is representative); on the GPU the warm-up
    (NVRTC compiles, allocator) is always discarded."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    if first > budget / 4 and not gpu:
        return first
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e5,1e6,1e7")
    ap.add_argument("--lu-sizes", default="100,300,1000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ops", default="onnx.*,rlx_sparse.*")
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget", type=float, default=6.0, help="seconds a CPU column may take a call")
    ap.add_argument("--columns", default="cuda,composed,mlx_cpu,ref", help="columns to measure")
    args = ap.parse_args()

    import mlx.core as mx

    from rlx_conformance import backends
    from rlx_conformance.backends.mlx import cuda_kernels as ck
    from rlx_conformance.backends.mlx import to_mlx, to_numpy
    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.ops import all_ops

    cpu, mlx = backends.get_backend("cpu"), backends.get_backend("mlx")
    gpu = ck.available()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    lu_sizes = [int(s) for s in args.lu_sizes.split(",")]
    stable_size = max([s for s in sizes if s <= 10**6] or sizes[:1])  # where "stable" is checked
    ops = [s.name for s in all_ops() if s.family == "custom"
           and any(fnmatch.fnmatchcase(s.name, p) for p in args.ops.split(","))]
    info = {"mlx": mx.__version__, "cuda_kernels": gpu,
            "device": str(mx.device_info()) if gpu else "no CUDA GPU"}
    print(json.dumps(info), flush=True)
    print(f"{'op':24} {'size':>9} {'cuda':>9} {'composed':>9} {'mlx_cpu':>9} {'ref':>9} "
          f"{'GB/s':>7} {'%peak':>6} stable", flush=True)
    rows = []
    for op in ops:
        entry = mlx.kernels[op]
        prev: dict[str, float] = {}
        for size in (lu_sizes if op == "rlx_sparse.lu_solve" else sizes):
            ins, attrs, nbytes = inputs(op, size)
            r = {"op": op, "size": size, "bytes": nbytes}
            dts = [dt.name_of(x.dtype) for x in ins]

            def run_on(stream, cuda: bool):
                os.environ[ck.ENV] = "1" if cuda else "0"
                with mx.stream(stream):
                    margs = [to_mlx(x, d) for x, d in zip(ins, dts)]
                    mx.eval(margs)
                    return lambda: mx.eval(entry.fn(*margs, **attrs)), \
                        lambda: to_numpy(entry.fn(*margs, **attrs))

            on_gpu = gpu and mlx.stream_for(entry, dts, "gpu") == "gpu"
            for col, stream, cuda in (("cuda", mx.gpu, True), ("composed", mx.gpu, False),
                                      ("mlx_cpu", mx.cpu, False)):
                if (col != "mlx_cpu" and not on_gpu) or col not in args.columns.split(","):
                    continue
                if col == "mlx_cpu" and prev.get(col, 0) * 12 > args.budget:
                    r[col] = None
                    continue
                go, get = run_on(stream, cuda)
                with mx.stream(stream):
                    r[col] = timed(go, args.repeat, args.budget, gpu=col != "mlx_cpu")
                    if col in ("cuda", "composed") and size == stable_size:
                        outs = [get() for _ in range(3)]
                        r[f"stable_{col}"] = all(np.array_equal(outs[0].view(np.uint8), o.view(np.uint8))
                                                 for o in outs[1:])
                prev[col] = r[col]
            os.environ[ck.ENV] = "1"
            if "ref" not in args.columns.split(","):
                pass
            elif prev.get("ref", 0) * 12 > args.budget:
                r["ref"] = None
            else:
                fn = cpu.kernels[op].fn
                r["ref"] = timed(lambda: fn(*[x.copy() for x in ins], **attrs), min(args.repeat, 3), args.budget)
                prev["ref"] = r["ref"]
            if nbytes and r.get("cuda"):
                r["gbs"] = nbytes / r["cuda"] / 1e9
                r["peak"] = 100 * r["gbs"] / PEAK_GBS
            rows.append(r)

            def f(v):
                return "-" if v is None else f"{v:.5f}"
            st = "/".join({True: "yes", False: "NO"}.get(r.get(f"stable_{c}"), ".") for c in ("cuda", "composed"))
            print(f"{op:24} {size:>9} {f(r.get('cuda')):>9} {f(r.get('composed')):>9} "
                  f"{f(r.get('mlx_cpu')):>9} {f(r.get('ref')):>9} "
                  f"{r['gbs'] if 'gbs' in r else 0:>7.0f} {r.get('peak', 0):>6.1f} {st}", flush=True)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"info": info, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
