"""Experiments for issue 19 item 3: variants of the custom ops' CUDA kernels
(backends/mlx/cuda_kernels.py) side by side with the shipped ones, the CuPy/cuSPARSE anchors,
and the floor of any MLX launch.

    PYTHONPATH=benchmarks:. python benchmarks/bench_cuda_variants.py [--sizes 1e6,1e7,1e8]
        [--min-time 0.2] [--only spmv,gather,scatter,floor] [--json PATH]

What each experiment asks (results: benchmarks/README.md, "More loads in flight" and, for the
gather hints and the scatter walk, "cg_solve's iteration and GatherElements' index loads"):

* ``spmv``: kernels v7 gave a CSR row ``L`` lanes, ``L`` the power of two at or above the mean
  row length (8 for the benchmark's 8 entries a row), so each lane loaded one value and one
  column, then waited for ``x[c]``: one 8-byte load in flight a thread, too few to cover HBM's
  latency at 10^7-10^8 entries (1.4-1.8x cuSPARSE). The shipped kernel (v8) takes ``L`` and the
  entries a lane ``E`` as templates; this runs it with ``(L, E)`` = (8, 1) (v7's loads and
  order), (4, 2), (2, 4) and (1, 8). (The first run, at 546035f, used its own copy of the kernel
  with a switch to read ``x`` through ``__ldg``, which changed nothing.)
* ``gather``: GatherND through the shipped kernel with one element a thread (v7) and with the
  16-byte chunks v8 chooses; GatherElements (a take) with 1, 2 or 4 elements a thread, and with
  the index stream loaded evict-first (``__ldcs``) and also the output so stored (``__stcs``),
  so that at 10^7 the 40 MB of data might stay in the L2.
* ``scatter``: the shipped walk against one that loads each update's value beside its link
  (two independent random loads an element instead of a walk of the links, then the values).
* ``floor``: the cheapest MLX launches (a copy kernel through the same ``mx.fast.cuda_kernel``
  path, and ``x + 1``) against CuPy's: at 10^6 elements a gather's GPU work is ~10 us, so this
  says what "at least as fast as ``cupy.take``" can mean there.

Correctness, so that a faster but wrong variant cannot pass: a gather or scatter variant's
output must be the shipped kernel's bits (the scatter also on cells of hundreds of updates, the
walk's merge sort); an SpMV variant sums a row in another order (float64 accumulation of exact
float32 products, rounded once), so its output is compared with the shipped kernel's (count of
differing elements) and with exact row sums (max ulp). Timing as bench_gpu_custom.py (its
``sample``): warm-up outside, batches between two synchronisations, median and p10-p90.

The variant kernels are registered under their own names in the module's SOURCES/SIGNATURES for
this process only; nothing else sees them. Needs MLX's CUDA build and CuPy.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from bench_gpu_custom import anchor_fn, cupy_batch, inputs, mlx_batch, sample

# GatherElements of rank 1 (a take), E elements a thread at a stride of the thread count.
TAKE = r"""
  const IDX total = (IDX)p[0], s = (IDX)p[1];
  const IDX nt = (IDX)gridDim.x * blockDim.x;
  const IDX e0 = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  I iv[E];
#pragma unroll
  for (int k = 0; k < E; ++k) { const IDX e = e0 + k * nt; iv[k] = e < total ? idx[e] : (I)0; }
#pragma unroll
  for (int k = 0; k < E; ++k) {
    const IDX e = e0 + k * nt;
    if (e < total) out[e] = data[(IDX)rlx_fix((rlx_i64)iv[k], s)];
  }
"""

# GatherElements of rank 1 with cache hints: the index stream loaded evict-first (__ldcs), and with
# H 2 the output stored so too (__stcs), so that at 10^7 the 40 MB of data stays in the L2.
TAKE_HINT = r"""
  const IDX total = (IDX)p[0], s = (IDX)p[1];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX e = (IDX)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const T v = data[(IDX)rlx_fix((rlx_i64)__ldcs(&idx[e]), s)];
    if (H == 2) __stcs(&out[e], v); else out[e] = v;
  }
"""

# scatter_walk with each update's value loaded beside its link (two independent random loads
# an element, not a walk of the links and then a pass of the values); the values kept sorted with
# their positions. The same order of application as the shipped walk, so the same bits.
WALK_PAR = r"""
  const IDX N = (IDX)p[0];
  const int red = (int)p[2];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += step) {
    T acc = data[i];
    const IDX h = head[i];
    if (h != 0) {
      IDX loc[RUN];
      T val[RUN];
      IDX c = 0, e = h;
      for (; e != 0 && c < RUN; ++c) {
        const IDX nx = next[e - 1];
        const T u = upd[e - 1];
        IDX j = c;
        while (j > 0 && loc[j - 1] < e) { loc[j] = loc[j - 1]; val[j] = val[j - 1]; --j; }
        loc[j] = e;
        val[j] = u;
        e = nx;
      }
      if (e == 0) {
        for (IDX j = c; j-- > 0;) acc = rlx_reduce<T, U>(red, acc, val[j]);
      } else {
        for (IDX x = h; x != 0; x = next[x - 1]) link[x - 1] = next[x - 1];
        for (IDX x = rlx_list_sort(link, h); x != 0; x = link[x - 1]) {
          acc = rlx_reduce<T, U>(red, acc, upd[x - 1]);
        }
      }
    }
    out[i] = acc;
  }
"""

COPY = r"""
  const IDX n = (IDX)p[0];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) out[i] = inp[i];
"""


def register(ck) -> None:
    ck.SOURCES["xp_take"], ck.SIGNATURES["xp_take"] = TAKE, (["data", "idx", "p"], ["out"])
    ck.SOURCES["xp_copy"], ck.SIGNATURES["xp_copy"] = COPY, (["inp", "p"], ["out"])
    ck.SOURCES["xp_take_hint"], ck.SIGNATURES["xp_take_hint"] = TAKE_HINT, (["data", "idx", "p"], ["out"])
    ck.SOURCES["xp_walk_par"], ck.SIGNATURES["xp_walk_par"] = WALK_PAR, ck.SIGNATURES["scatter_walk"]


def spmv_variant(ck, values, col, rp, x, L: int, E: int):
    """The shipped spmv kernel with L lanes a row and E entries a lane (L 8, E 1: kernels v7)."""
    n, nnz = rp.shape[0] - 1, col.shape[0]
    threads = -(-(n * L) // ck.BLOCK) * ck.BLOCK
    pl = ck.plan("spmv", [n, x.shape[0], nnz],
                 [("T", "float32"), ("C", "int32"), ("R", "int32"), ("X", "float32"), ("L", L),
                  ("E", E), ("IDX", ck.idx_dtype(threads, nnz + 1, x.shape[0]))],
                 (n,), "float32", threads, whole_blocks=True)
    return lambda: ck.launch({**pl, "inputs": [values, col, rp, x]})


def take_variant(ck, data, idx, E: int):
    total = idx.shape[0]
    pl = ck.plan("xp_take", [total, data.shape[0]],
                 [("T", "float32"), ("I", "int64"), ("E", E), ("IDX", ck.idx_dtype(total, data.shape[0]))],
                 (total,), "float32", -(-total // E), whole_blocks=False)
    return lambda: ck.launch({**pl, "inputs": [data, idx]})


def take_hint(ck, data, idx, H: int):
    total = idx.shape[0]
    pl = ck.plan("xp_take_hint", [total, data.shape[0]],
                 [("T", "float32"), ("I", "int64"), ("H", H), ("IDX", ck.idx_dtype(total, data.shape[0]))],
                 (total,), "float32", total)
    return lambda: ck.launch({**pl, "inputs": [data, idx]})


def scatter_par(ck, data, indices, updates, ax):
    """The shipped link kernel, then WALK_PAR (ax None: ScatterND, indices as [P, k])."""
    M = updates.size
    upd = updates.reshape(-1)
    head, nxt = ck.launch(ck.plan_scatter_link(data, indices, ax, M))
    wk = ck.plan_scatter_walk(data, upd, head, nxt, "add")
    return ck.launch({**wk, "name": "xp_walk_par"})[0]


def gather_nd_variant(ck, data, idx, V: int):
    """The shipped gather_nd (batch_dims 0) with V elements a thread: 1 is kernels v7's one
    element a thread, 16 // itemsize the 16-byte chunks v8 chooses where it can."""
    pl = ck.plan_gather_nd(data, idx, 0)
    total = pl["params"][0]
    tpl = [(k, V if k == "V" else v) for k, v in pl["templates"]]
    pl = ck.plan("gather_nd", list(pl["params"]), tpl, pl["out_shape"], pl["out_dtype"], total // V)
    return lambda: ck.launch({**pl, "inputs": [data, idx]})


def copy_kernel(ck, a):
    n = a.size
    pl = ck.plan("xp_copy", [n], [("T", "float32"), ("IDX", ck.idx_dtype(n))], (n,), "float32", n)
    return lambda: ck.launch({**pl, "inputs": [a]})


def exact_spmv(v, c, rp, x) -> np.ndarray:
    """Row sums of the exact float64 products, rounded once to float32 (the products of float32
    values are exact in float64; at 8 terms a row of |v|, |x| <= 9 the float64 sum is exact or
    within an ulp of float64, far below float32's rounding)."""
    prod = v.astype(np.float64) * x.astype(np.float64)[c]
    return np.add.reduceat(prod, rp[:-1]).astype(np.float32)


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(1 << 31) - ia, ia)
    ib = np.where(ib < 0, -(1 << 31) - ib, ib)
    return int(np.abs(ia - ib).max()) if a.size else 0


def run_spmv(ck, mx, cp, sizes, min_time, emit) -> None:
    variants = [(8, 1), (4, 2), (2, 4), (1, 8)]
    for size in sizes:
        ins, _, traffic = inputs("rlx_sparse.mat_vec", size)
        v, c, rp, x = ins
        m = [mx.array(a) for a in ins]
        mx.eval(m)
        ref = exact_spmv(v, c, rp, x)
        shipped = np.array(ck.spmv(*m))
        r = {"exp": "spmv", "size": size, "shipped_ulp": ulps(shipped, ref)}
        r["shipped"] = sample(mlx_batch(lambda: ck.spmv(*m)), min_time)["median"]
        for L, E in variants:
            fn = spmv_variant(ck, *m, L, E)
            out = np.array(fn())
            name = f"L{L}E{E}"
            r[name] = sample(mlx_batch(fn), min_time)["median"]
            r[name + "_diff"] = int(np.count_nonzero(out.view(np.uint32) != shipped.view(np.uint32)))
            r[name + "_ulp"] = ulps(out, ref)
        fn = anchor_fn("rlx_sparse.mat_vec", ins, {})
        r["anchor"] = sample(cupy_batch(fn), min_time)["median"]
        del fn
        cp.get_default_memory_pool().free_all_blocks()
        r["gbs_shipped"] = traffic / r["shipped"] / 1e9
        best = min((k for k in r if k.startswith("L") and "_" not in k), key=lambda k: r[k])
        r["best"], r["best/anchor"], r["shipped/anchor"] = best, r[best] / r["anchor"], r["shipped"] / r["anchor"]
        emit(r)
        del m
        mx.clear_cache()


def run_gather(ck, mx, cp, sizes, min_time, emit) -> None:
    for size in sizes:
        ins, _, _ = inputs("onnx.GatherElements", size)
        m = [mx.array(a) for a in ins]
        mx.eval(m)
        shipped = np.array(ck.gather_elements(*m, 0))
        r = {"exp": "gather_elements", "size": size,
             "shipped": sample(mlx_batch(lambda: ck.gather_elements(*m, 0)), min_time)["median"]}
        for H in (1, 2):
            fn = take_hint(ck, *m, H)
            r[f"H{H}_same"] = bool(np.array_equal(np.array(fn()).view(np.uint32), shipped.view(np.uint32)))
            r[f"H{H}"] = sample(mlx_batch(fn), min_time)["median"]
        for E in (1, 2, 4):
            fn = take_variant(ck, *m, E)
            r[f"E{E}_same"] = bool(np.array_equal(np.array(fn()).view(np.uint32), shipped.view(np.uint32)))
            r[f"E{E}"] = sample(mlx_batch(fn), min_time)["median"]
        fn = anchor_fn("onnx.GatherElements", ins, {})
        r["anchor"] = sample(cupy_batch(fn), min_time)["median"]
        emit(r)
        ins, _, _ = inputs("onnx.GatherND", size)
        m = [mx.array(a) for a in ins]
        mx.eval(m)
        one, chunk = gather_nd_variant(ck, *m, 1), gather_nd_variant(ck, *m, 4)
        r = {"exp": "gather_nd", "size": size, "same": same_bits(one(), chunk()),
             "one": sample(mlx_batch(one), min_time)["median"],
             "chunk16": sample(mlx_batch(chunk), min_time)["median"]}
        fn = anchor_fn("onnx.GatherND", ins, {})
        r["anchor"] = sample(cupy_batch(fn), min_time)["median"]
        emit(r)
        del m, fn
        cp.get_default_memory_pool().free_all_blocks()
        mx.clear_cache()


def same_bits(a, b) -> bool:
    return bool(np.array_equal(np.array(a).view(np.uint32), np.array(b).view(np.uint32)))


def run_scatter(ck, mx, cp, sizes, min_time, emit) -> None:
    rng = np.random.default_rng(7)  # long lists (hundreds of updates a cell): the merge sort
    n, m = 64, 40_000
    small = [mx.array(rng.uniform(-1, 1, n).astype(np.float32)), mx.array(rng.integers(0, n, m)),
             mx.array(rng.uniform(-1, 1, m).astype(np.float32))]
    emit({"exp": "scatter", "check": "long lists",
          "same": same_bits(ck.scatter_elements(*small, 0, "add"), scatter_par(ck, *small, 0))})
    for op in ("onnx.ScatterElements", "onnx.ScatterND"):
        for size in sizes:
            ins, _, _ = inputs(op, size)
            data, idx, upd = [mx.array(a) for a in ins]
            mx.eval(data, idx, upd)
            if op == "onnx.ScatterElements":
                shipped = lambda: ck.scatter_elements(data, idx, upd, 0, "add")  # noqa: E731
                par = lambda: scatter_par(ck, data, idx, upd, 0)  # noqa: E731
            else:
                flat = idx.reshape(-1, idx.shape[-1])
                shipped = lambda: ck.scatter_nd(data, idx, upd, "add")  # noqa: E731
                par = lambda: scatter_par(ck, data, flat, upd, None)  # noqa: E731
            r = {"exp": "scatter", "op": op, "size": size, "same": same_bits(shipped(), par()),
                 "shipped": sample(mlx_batch(shipped), min_time)["median"],
                 "par": sample(mlx_batch(par), min_time)["median"]}
            fn = anchor_fn(op, ins, {})
            r["anchor"] = sample(cupy_batch(fn), min_time)["median"]
            r["par/shipped"], r["par/anchor"] = r["par"] / r["shipped"], r["par"] / r["anchor"]
            r["shipped/anchor"] = r["shipped"] / r["anchor"]
            emit(r)
            del data, idx, upd, fn
            cp.get_default_memory_pool().free_all_blocks()
            mx.clear_cache()


def run_floor(ck, mx, cp, sizes, min_time, emit) -> None:
    for size in sizes:
        a = np.random.default_rng(size).uniform(-1, 1, size).astype(np.float32)
        m = mx.array(a)
        mx.eval(m)
        fn = copy_kernel(ck, m)
        ca = cp.asarray(a)
        r = {"exp": "floor", "size": size, "same": bool(np.array_equal(np.array(fn()), a)),
             "mlx_copy_kernel": sample(mlx_batch(fn), min_time)["median"],
             "mlx_add": sample(mlx_batch(lambda: m + 1), min_time)["median"],
             "cupy_copy": sample(cupy_batch(lambda: ca.copy()), min_time)["median"],
             "cupy_add": sample(cupy_batch(lambda: ca + 1), min_time)["median"]}
        emit(r)
        del m, ca
        cp.get_default_memory_pool().free_all_blocks()
        mx.clear_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--only", default="spmv,gather,scatter,floor")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import mlx.core as mx

    from rlx_conformance.backends.mlx import cuda_kernels as ck

    if not ck.available():
        raise SystemExit("bench_cuda_variants: needs MLX's CUDA build and a GPU")
    register(ck)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    rows: list[dict] = []

    def emit(r: dict) -> None:
        print(json.dumps(r), flush=True)
        rows.append(r)

    runs = {"spmv": run_spmv, "gather": run_gather, "scatter": run_scatter, "floor": run_floor}
    with mx.stream(mx.gpu):
        for name in args.only.split(","):
            runs[name](ck, mx, cp, sizes, args.min_time, emit)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
