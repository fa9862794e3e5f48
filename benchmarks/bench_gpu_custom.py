"""The custom ops on a GPU: MLX's CUDA kernels vs MLX's composed kernels vs the CuPy/cuSPARSE
anchors a CUDA user would pick instead (issue 19 item 3), with achieved memory bandwidth.

    PYTHONPATH=. python benchmarks/bench_gpu_custom.py [--sizes 1e6,1e7,1e8] [--min-time 0.2]
        [--ops GLOB,...] [--columns cuda,composed,anchor] [--processes N] [--json PATH] [--tag NAME]

Methodology (the same for every column, MLX and CuPy): inputs are made and moved to the device
once, outside the timing; the op's callable (kernel objects, parameter arrays) is built before
the timed region; three warm-up calls (NVRTC compiles, allocator, caches) are discarded; then
``mx.synchronize()`` (CuPy: the stream's synchronize), a batch of ``k`` calls each queued with
``mx.async_eval`` (CuPy: enqueued on the stream), ``mx.synchronize()`` again: one sample is the
batch's wall time over ``k``, i.e. the steady per-call cost of a caller that keeps the GPU busy
(the larger of the host's launch path and the GPU time). ``k`` adapts so that one batch takes
at least --min-time/10 s and 10 samples at least --min-time s; the table gives the median and
the p10-p90 spread of the samples.

Columns: ``cuda``: the MLX kernel on the GPU stream with the CUDA kernels
(backends/mlx/cuda_kernels.py); ``composed``: the same with RLX_MLX_CUDA_KERNELS=0 (MLX ops
only); ``anchor``: what a CUDA user would call instead: ``cupy.take`` (gathers; GatherND as
``take`` of rows), ``cupy.add.at`` (atomic scatter-add, nondeterministic), cuSPARSE CSR SpMV
through ``cupyx.scipy.sparse.csr_matrix @ x`` (mat_vec), and ``u[rows] * v[cols]`` with the row
of each entry precomputed (values_grad; two CuPy gathers and a multiply). CuPy is imported only
when the anchor column is asked for (it is not on the development machines).

Sizes are elements of the index/data arrays for the ONNX ops (float32 data, int64 indices;
scatters with reduction add over random indices, so duplicates accumulate; GatherND/ScatterND
gather or scatter rows of 16 floats) and stored nonzeros for mat_vec / values_grad / cg_solve
(random banded CSR, 8 entries a row, diagonally dominant). ``GB/s`` is the op's minimal traffic
(each input read once, each output written once; the deterministic scatter's linked lists not
counted) over the median time, ``%peak`` that against the HBM peak of the GPU it ran on (:data:`PEAKS_GBS`;
the H200's 4.8 TB/s for a GPU not listed).
``stable`` says whether three runs gave bit-identical results (cuda / composed), checked at the
smallest size. ``--processes N`` runs the whole measurement in N fresh processes, one after
another, and adds a table of each row over them: the median of the processes' medians and their
range. Where a call is bound by the host (10^6 elements), its cost moved by up to 2x between
processes of one machine (benchmarks/README.md, 2026-12-06): one process's p10-p90 does not show
that. cg_solve: the time of one iteration (the difference of max_iter 24 and 8, over
16) against the sum of its parts timed alone the same way: one SpMV and the iteration's vector
operations (two dot products, three axpys, the convergence test).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# HBM peak by device name (vendor figures): %peak is against the GPU the run is on
PEAKS_GBS = {"H200": 4800.0, "H100 80GB HBM3": 3350.0, "H100 NVL": 3900.0}
PEAK_GBS = 4800.0  # an unknown device: the H200's, as issue 19's figures were


def peak_gbs(device_name: str) -> float:
    return next((v for k, v in PEAKS_GBS.items() if k in device_name), PEAK_GBS)


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


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))
    return xs[i]


def sample(batch, min_time: float) -> dict[str, float]:
    """``batch(k)`` runs k calls between two device synchronisations (timed by the caller's
    clock here). Warm-up: three single calls. Then k doubles until a batch takes min_time/10,
    and batches repeat until 10 samples and min_time have passed (at most 200 samples)."""
    for _ in range(3):
        batch(1)
    k = 1
    while True:
        t = time.perf_counter()
        batch(k)
        dt_ = time.perf_counter() - t
        if dt_ >= min_time / 10 or k >= 1 << 14:
            break
        k *= 2
    ts: list[float] = []
    t_all = time.perf_counter()
    while len(ts) < 10 or (time.perf_counter() - t_all < min_time and len(ts) < 200):
        t = time.perf_counter()
        batch(k)
        ts.append((time.perf_counter() - t) / k)
    return {"median": statistics.median(ts), "p10": percentile(ts, 0.1),
            "p90": percentile(ts, 0.9), "calls": k * len(ts)}


def mlx_batch(fn):
    """A batch of k calls of ``fn`` (returns an MLX array, unevaluated), each queued with
    mx.async_eval, between two mx.synchronize()."""
    import mlx.core as mx

    def batch(k: int) -> None:
        mx.synchronize()
        for _ in range(k):
            out = fn()
            mx.async_eval(out)
        mx.synchronize()
    return batch


def cupy_batch(fn):
    import cupy as cp

    def batch(k: int) -> None:
        cp.cuda.get_current_stream().synchronize()
        for _ in range(k):
            fn()
        cp.cuda.get_current_stream().synchronize()
    return batch


def anchor_fn(op: str, ins: list, attrs: dict):
    """The CuPy/cuSPARSE call a CUDA user would make for op, on device copies made here (outside
    the timing); None for ops without one."""
    import cupy as cp
    from cupyx.scipy import sparse as cps

    if op == "onnx.GatherElements":
        data, idx = cp.asarray(ins[0]), cp.asarray(ins[1] % ins[0].shape[0])
        return lambda: cp.take(data, idx)
    if op == "onnx.GatherND":
        data, idx = cp.asarray(ins[0]), cp.asarray(ins[1][:, 0] % ins[0].shape[0])
        return lambda: cp.take(data, idx, axis=0)
    if op in ("onnx.ScatterElements", "onnx.ScatterND"):
        data, upd = cp.asarray(ins[0]), cp.asarray(ins[2])
        idx = cp.asarray(ins[1].reshape(-1) % ins[0].shape[0])

        def scatter():
            out = data.copy()  # the op returns a new array, as the MLX kernels do
            cp.add.at(out, idx, upd)
            return out
        return scatter
    if op in ("rlx_sparse.mat_vec", "rlx_sparse.values_grad"):
        v = ins[0] if op == "rlx_sparse.mat_vec" else np.ones(ins[0].size, np.float32)
        col, rp = (ins[1], ins[2]) if op == "rlx_sparse.mat_vec" else (ins[0], ins[1])
        n = rp.size - 1
        if op == "rlx_sparse.mat_vec":
            a = cps.csr_matrix((cp.asarray(v), cp.asarray(col), cp.asarray(rp)), shape=(n, ins[3].size))
            x = cp.asarray(ins[3])
            return lambda: a @ x
        rows = cp.asarray(np.repeat(np.arange(n, dtype=np.int32), np.diff(rp)))
        cols, u, w = cp.asarray(col), cp.asarray(ins[2]), cp.asarray(ins[3])
        return lambda: u[rows] * w[cols]
    return None


def cg_parts(mx, margs, attrs, entry, min_time: float) -> dict[str, float]:
    """cg_solve's per-iteration time and its parts (SpMV, vector ops), each timed by sample()."""
    from rlx_conformance.backends.mlx import custom

    values, col, rp, b = margs
    t24 = sample(mlx_batch(lambda: entry.fn(*margs, max_iter=24, tol=attrs["tol"])), min_time)
    t8 = sample(mlx_batch(lambda: entry.fn(*margs, max_iter=8, tol=attrs["tol"])), min_time)
    spmv = sample(mlx_batch(lambda: custom.mat_vec(values, col, rp, b)), min_time)
    x, r, p = b * 0.5, b, b * 0.25
    rs = mx.sum(r * r)
    tol = mx.array(attrs["tol"], rs.dtype)
    done = mx.sqrt(rs) < tol
    mx.eval(x, r, p, rs, done)
    step = custom.cg_step_here()

    def vec():  # the vector operations of one iteration, as custom.cg_solve runs them, ap given
        return list(step(x, r, p, p, rs, done, tol))
    vops = sample(mlx_batch(vec), min_time)
    it = (t24["median"] - t8["median"]) / 16
    return {"iter": it, "spmv": spmv["median"], "vec": vops["median"],
            "ratio": it / (spmv["median"] + vops["median"]), "cg24": t24["median"], "cg8": t8["median"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds of samples a column")
    ap.add_argument("--ops", default="onnx.*,rlx_sparse.mat_vec,rlx_sparse.values_grad,rlx_sparse.cg_solve")
    ap.add_argument("--columns", default="cuda,composed,anchor", help="columns to measure")
    ap.add_argument("--json", default=None)
    ap.add_argument("--tag", default="", help="a label stored in the JSON (e.g. before/after)")
    ap.add_argument("--processes", type=int, default=1,
                    help="run it all in N fresh processes and give each row's spread over them")
    args = ap.parse_args()
    if args.processes > 1:
        across_processes(args)
        return

    import mlx.core as mx

    from rlx_conformance import backends
    from rlx_conformance.backends.mlx import cuda_kernels as ck
    from rlx_conformance.backends.mlx import to_mlx, to_numpy
    from rlx_conformance.core import dtypes as dt
    from rlx_conformance.ops import all_ops

    mlx = backends.get_backend("mlx")
    gpu = ck.available()
    dev = mx.gpu if gpu else mx.cpu  # without a GPU: a smoke run of the composed kernels
    cols = args.columns.split(",")
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    ops = [s.name for s in all_ops() if s.family == "custom" and s.name != "rlx_sparse.lu_solve"
           and any(fnmatch.fnmatchcase(s.name, p) for p in args.ops.split(","))]
    device = mx.device_info() if gpu else {}
    info = {"tag": args.tag, "mlx": mx.__version__, "cuda_kernels": gpu,
            "kernel_version": getattr(ck, "VERSION", "?"),
            "device": str(device) if gpu else "no CUDA GPU", "min_time": args.min_time,
            "peak_gbs": peak_gbs(str(device.get("device_name", "")))}
    if "anchor" in cols:
        import cupy as cp
        info["cupy"] = cp.__version__
    print(json.dumps(info), flush=True)
    print(f"{'op':24} {'size':>9} {'col':>8} {'median ms':>10} {'p10':>8} {'p90':>8} "
          f"{'GB/s':>7} {'%peak':>6} stable", flush=True)
    def measure_mlx(r, col, op, entry, margs, attrs, check_stable: bool) -> None:
        os.environ[ck.ENV] = "0" if col == "composed" else "1"
        try:
            with mx.stream(dev):
                if op == "rlx_sparse.cg_solve":
                    r.update(cg_parts(mx, margs, attrs, entry, args.min_time))
                    r["median"] = r["iter"]
                else:
                    r.update(sample(mlx_batch(lambda: entry.fn(*margs, **attrs)), args.min_time))
                if check_stable:
                    outs = [to_numpy(entry.fn(*margs, **attrs)) for _ in range(3)]
                    r["stable"] = all(np.array_equal(outs[0].view(np.uint8), o.view(np.uint8))
                                      for o in outs[1:])
        finally:
            os.environ[ck.ENV] = "1"

    rows = []
    for op in ops:
        entry = mlx.kernels[op]
        for size in sizes:
            ins, attrs, nbytes = inputs(op, size)
            dts = [dt.name_of(x.dtype) for x in ins]
            with mx.stream(dev):
                margs = [to_mlx(x, d) for x, d in zip(ins, dts)]
                mx.eval(margs)
            for col in cols:
                r = {"op": op, "size": size, "col": col, "bytes": nbytes}
                try:
                    if col == "anchor":
                        fn = anchor_fn(op, ins, attrs)
                        if fn is None:
                            continue
                        r.update(sample(cupy_batch(fn), args.min_time))
                        del fn
                        import cupy as cp
                        cp.get_default_memory_pool().free_all_blocks()
                    else:
                        measure_mlx(r, col, op, entry, margs, attrs, size == sizes[0])
                except Exception as e:  # noqa: BLE001 — one failing column must not end the run
                    r["error"] = f"{type(e).__name__}: {e}"[:500]
                    print(f"{op:24} {size:>9} {col:>8} ERROR {r['error']}", flush=True)
                    rows.append(r)
                    continue
                if nbytes:
                    r["gbs"] = nbytes / r["median"] / 1e9
                    r["peak"] = 100 * r["gbs"] / info["peak_gbs"]
                rows.append(r)
                extra = f" cg: iter/(spmv+vec) {r['ratio']:.2f}" if "ratio" in r else ""
                med = r["median"]
                stable = {True: "yes", False: "NO"}.get(r.get("stable"), ".")
                print(f"{op:24} {size:>9} {col:>8} {1e3 * med:>10.4f} {1e3 * r.get('p10', med):>8.4f} "
                      f"{1e3 * r.get('p90', med):>8.4f} {r.get('gbs', 0):>7.0f} {r.get('peak', 0):>6.1f} "
                      f"{stable}{extra}", flush=True)
                if args.json:
                    with open(args.json, "w") as fh:
                        json.dump({"info": info, "rows": rows}, fh, indent=1)
            del margs
            mx.clear_cache()


def across_processes(args: argparse.Namespace) -> None:
    """The measurement in ``args.processes`` fresh processes, one after another (each prints its
    own table), then each (op, size, column) over them: the median of the processes' medians, the
    smallest and largest, and largest/smallest."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            out = Path(tmp) / f"p{i}.json"
            print(f"-- process {i + 1} of {args.processes}", flush=True)
            subprocess.run([sys.executable, __file__, "--sizes", args.sizes, "--min-time", str(args.min_time),
                            "--ops", args.ops, "--columns", args.columns, "--tag", args.tag, "--json", str(out)],
                           check=True)
            runs.append(json.loads(out.read_text()))
    medians: dict[tuple[str, int, str], list[float]] = {}
    for run in runs:
        for r in run["rows"]:
            if "median" in r:
                medians.setdefault((r["op"], r["size"], r["col"]), []).append(r["median"])
    across = [{"op": op, "size": size, "col": col, "medians": ms, "median": statistics.median(ms),
               "min": min(ms), "max": max(ms), "max_over_min": max(ms) / min(ms)}
              for (op, size, col), ms in medians.items()]
    print(f"-- over {args.processes} processes: median of the processes' medians, smallest, largest (ms)")
    print(f"{'op':24} {'size':>9} {'col':>8} {'median':>10} {'min':>8} {'max':>8} {'max/min':>7}")
    for a in across:
        print(f"{a['op']:24} {a['size']:>9} {a['col']:>8} {1e3 * a['median']:>10.4f} {1e3 * a['min']:>8.4f} "
              f"{1e3 * a['max']:>8.4f} {a['max_over_min']:>7.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"info": runs[0]["info"], "processes": [run["rows"] for run in runs], "across": across}, fh,
                      indent=1)


if __name__ == "__main__":
    main()
