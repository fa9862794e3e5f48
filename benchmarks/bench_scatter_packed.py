"""An experiment for issue 19 item 3, not the shipped kernels: the deterministic scatter with each
update's list link and value packed into one record, against the shipped linked lists
(backends/mlx/cuda_kernels.py, kernels v7) and ``cupy.add.at``.

    PYTHONPATH=. python benchmarks/bench_scatter_packed.py [--sizes 1e6,1e7,1e8] [--min-time 0.2]

Why (benchmarks/README.md, "The scatters as linked lists"): v7's walk reads ``next[e - 1]`` and
``upd[e - 1]`` at random, a 32-byte sector for each 4-byte value. Here ``scatter_link`` also
reads ``upd[m]`` (coalesced) and writes ``{next, value}`` as one record at ``m``, so the walk
makes one random read an update instead of two. The traffic model predicts a gain for
ScatterElements (random targets) and a loss for ScatterND (rows of 16, whose reads are whole
sectors already); this measures both. Every output is checked bit for bit against v7's on the
same inputs (and on a small input whose cells hold hundreds of updates, which takes the walk's
merge sort), so a faster but wrong variant cannot pass. Timing as bench_gpu_custom.py (its
``sample``): warm-up outside, batches between two synchronisations, median and p10-p90.

The two kernels are registered under their own names in the module's SOURCES/SIGNATURES for
this process only; nothing else sees them. Needs MLX's CUDA build and CuPy.
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from bench_gpu_custom import anchor_fn, cupy_batch, inputs, mlx_batch, sample

LINK = r"""
  struct Rec { IDX nx; T v; };
  Rec* R = reinterpret_cast<Rec*>(rec);
  const IDX M = (IDX)p[0];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX m = (IDX)blockIdx.x * blockDim.x + threadIdx.x; m < M; m += step) {
    Rec r;
    r.nx = (IDX)rlx_atomic_exch(&head[rlx_target<KIND, I, IDX>(m, idx, p + 1)], m + 1);
    r.v = upd[m];
    R[m] = r;
  }
"""

WALK = r"""
  struct Rec { IDX nx; T v; };
  const Rec* R = reinterpret_cast<const Rec*>(rec);
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
        const Rec r = R[e - 1];
        IDX j = c;
        while (j > 0 && loc[j - 1] < e) { loc[j] = loc[j - 1]; val[j] = val[j - 1]; --j; }
        loc[j] = e;
        val[j] = r.v;
        e = r.nx;
      }
      if (e == 0) {
        for (IDX j = c; j-- > 0;) acc = rlx_reduce<T, U>(red, acc, val[j]);
      } else {
        for (IDX x = h; x != 0; x = R[x - 1].nx) link[x - 1] = R[x - 1].nx;
        for (IDX x = rlx_list_sort(link, h); x != 0; x = link[x - 1]) {
          acc = rlx_reduce<T, U>(red, acc, R[x - 1].v);
        }
      }
    }
    out[i] = acc;
  }
"""


def register(ck) -> None:
    ck.SOURCES["xp_link_rec"], ck.SIGNATURES["xp_link_rec"] = LINK, (["idx", "upd", "p"], ["head", "rec"])
    ck.SOURCES["xp_walk_rec"], ck.SIGNATURES["xp_walk_rec"] = WALK, (["data", "head", "rec", "p"], ["out", "link"])


def packed(ck, data, indices, updates, ax, reduction: str):
    """The scatter as the two packed kernels (ax None: ScatterND, indices as [P, k])."""
    M = math.prod(updates.shape)
    upd = updates.reshape(-1)
    N = math.prod(data.shape)
    kind, params = ck.scatter_target_params(data, indices, ax, M)
    tpl = ck._scatter_templates(data, indices, M, kind)
    t, i = ck._dtype_name(data.dtype), dict(tpl)["IDX"]
    words = 2 if "64" in i or data.dtype.size == 8 else 1  # the record's 8-byte words
    lk = ck.plan("xp_link_rec", params, [*tpl, ("T", t)], (N,), i, M,
                 extra_outputs=(((M * words,), "uint64"),), init=0)
    head, rec = ck.launch({**lk, "inputs": [indices, upd]})
    wk = ck.plan("xp_walk_rec", [N, M, ck.REDUCTIONS[reduction]],
                 [("T", t), ("U", ck._UNSIGNED.get(t, t)), ("IDX", i), ("RUN", ck.RUN)],
                 data.shape, t, N, extra_outputs=(((M,), i),))
    return ck.launch({**wk, "inputs": [data, head, rec]})[0]


def calls(ck, op: str, margs):
    """(v7, packed) zero-argument callables of op on these MLX inputs."""
    data, idx, upd = margs
    if op == "onnx.ScatterElements":
        return (lambda: ck.scatter_elements(data, idx, upd, 0, "add"),
                lambda: packed(ck, data, idx, upd, 0, "add"))
    flat = idx.reshape(-1, idx.shape[-1])
    return (lambda: ck.scatter_nd(data, idx, upd, "add"),
            lambda: packed(ck, data, flat, upd, None, "add"))


def same_bits(mx, a, b) -> bool:
    mx.eval(a, b)
    return bool(np.array_equal(np.array(a).view(np.uint32), np.array(b).view(np.uint32)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import cupy as cp
    import mlx.core as mx

    from rlx_conformance.backends.mlx import cuda_kernels as ck

    if not ck.available():
        raise SystemExit("bench_scatter_packed: needs MLX's CUDA build and a GPU")
    register(ck)
    rows = []
    with mx.stream(mx.gpu):
        # long lists (hundreds of updates a cell): the merge-sort path of both walks
        rng = np.random.default_rng(7)
        n, m = 64, 40_000
        small = [mx.array(rng.uniform(-1, 1, n).astype(np.float32)), mx.array(rng.integers(0, n, m)),
                 mx.array(rng.uniform(-1, 1, m).astype(np.float32))]
        v7, pk = calls(ck, "onnx.ScatterElements", small)
        print(json.dumps({"check": "long lists", "same_bits": same_bits(mx, v7(), pk())}), flush=True)
        for op in ("onnx.ScatterElements", "onnx.ScatterND"):
            for size in (int(float(s)) for s in args.sizes.split(",")):
                ins, _, _ = inputs(op, size)
                margs = [mx.array(x) for x in ins]
                mx.eval(margs)
                v7, pk = calls(ck, op, margs)
                r = {"op": op, "size": size, "same_bits": same_bits(mx, v7(), pk())}
                r["v7"] = sample(mlx_batch(v7), args.min_time)["median"]
                r["packed"] = sample(mlx_batch(pk), args.min_time)["median"]
                fn = anchor_fn(op, ins, {})
                r["anchor"] = sample(cupy_batch(fn), args.min_time)["median"]
                del fn
                cp.get_default_memory_pool().free_all_blocks()
                r["packed/v7"] = r["packed"] / r["v7"]
                r["packed/anchor"] = r["packed"] / r["anchor"]
                r["v7/anchor"] = r["v7"] / r["anchor"]
                print(json.dumps(r), flush=True)
                rows.append(r)
                del margs, v7, pk
                mx.clear_cache()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
