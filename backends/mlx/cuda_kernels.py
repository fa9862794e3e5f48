"""Native CUDA kernels (``mx.fast.cuda_kernel``) for the custom ops on MLX's CUDA build.

The composed MLX kernels of ``custom.py`` are the definition of what the MLX backend computes
and the fallback everywhere else (MLX's CPU backend, Metal, a CUDA build with
``RLX_MLX_CUDA_KERNELS=0``); on a CUDA GPU stream the kernels here replace the slow or
nondeterministic parts:

* ``gather_elements`` / ``gather_nd``: one thread per output element, the source offset computed
  from the index values in the kernel (no coordinate arrays materialised as the composed version
  does with broadcast aranges); ``gather_nd`` moves a 16-byte chunk a thread where its slices are
  whole chunks (:func:`gather_nd_chunk`); ``gather_elements`` reads its indices evict-first
  (``__ldcs``: each is read once), leaving the L2 to the data's random reads (6 % at 10^7 on
  an H100, benchmarks/README.md).
* ``scatter`` (ScatterElements and ScatterND, every reduction): deterministic, the updates of
  each cell applied in update order, as the CPU reference (numpy ``ufunc.at``) does. Two
  kernels: ``scatter_link`` threads each cell's updates into a linked list with atomic
  exchanges (the lists' order depends on the atomics, their contents do not), and
  ``scatter_walk`` gives each cell one thread that walks its list, sorts the positions (in
  registers up to :data:`RUN`, else a merge sort of the list in place) and applies them in order
  onto ``data``. It replaced a counting sort by target (four kernels and a scan, each an MLX
  launch: 1.9-2.3x slower on an H100, benchmarks/README.md), which had replaced ``mx.sort`` of
  the keys ``target << B | m``.
  So float add/mul give the same bits run to run (MLX's composed scatter uses float atomics,
  whose order varies), max/min propagate NaN as numpy ``maximum``/``minimum`` do, integers wrap,
  and int64 works (MLX's GPU scatter rejects int64). With reduction ``none`` the last duplicate
  wins (ONNX leaves duplicates undefined).
* ``spmv`` (rlx_sparse.mat_vec, and the products inside cg_solve): ``L`` lanes per CSR row
  (``L`` the power of two at or above the mean row length over :data:`SPMV_PER_LANE`, at most
  32), each lane loading that many entries before it uses any, float64 accumulation and a fixed
  shuffle tree, rounded once: deterministic, and no atomics (the composed version scatter-adds
  ``values * x[cols]`` with float atomics, which flush subnormals on NVIDIA GPUs).
* ``values_grad``: ``L`` lanes a CSR row as ``spmv`` (each entry's row known without the binary
  search in ``row_ptr`` of the first version; reads of ``col`` and writes coalesced).

rlx_sparse.lu_solve stays on MLX's CPU stream (MLX linalg has no GPU kernels; a GPU sparse LU is
not attempted here).

Index arithmetic is 32-bit (template ``IDX``) while every size stays below 2^30 and 64-bit past
that: 64-bit integer division made the first version's gathers 11x slower on an H200.

Launch costs: at 10^6 elements a gather's GPU work is ~10 us, so the host's path to the launch
is the call's cost. Kernel objects are built once per name (``_kernel``); a plan's static part
(params, templates, grid, output shapes and the kernel call's prepared arguments) once per
distinct input shapes, dtypes and attributes (:func:`planned`); and the small int64 parameter
array of a launch once per distinct parameter vector (:func:`params_array`).

Index values are validated on the host before any kernel runs (OpSpec.check_values); the kernels
still clamp every index into range, so a caller that bypasses Backend.run gets a wrong value at
worst, never an out-of-bounds access. Runtime sizes travel in a small int64 ``p`` array, so one
compiled kernel serves every shape; types are template arguments. MLX caches compiled kernels by
*name and template arguments* (in memory and in ``$TMPDIR/mlx/<version>/ptx``), not by source
or input dtypes: every input and output dtype is therefore a template argument (a typedef the
source may not use), and every name carries :data:`VERSION`, bumped on any source change.

Each op is split into ``plan_*`` (host side: params, grid, template, output shapes; pure Python,
testable without a GPU — tests/test_cuda_kernels.py emulates the plans in numpy) and the launch.

custom.py calls these; this module imports nothing of custom.py. Its kernels with the CUDA path
forced, as a contributor would register them for ``validate``, are in cuda_validate.py. MLX cannot
differentiate an ``mx.fast.cuda_kernel``: custom.py calls each of these inside an
``mx.custom_function`` with a VJP and JVP in MLX primitives (custom.with_derivatives).
"""
from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx

ENV = "RLX_MLX_CUDA_KERNELS"
VERSION = "v9"
BLOCK = 256
MAX_THREADS = 1 << 30  # grid-stride kernels launch at most this many threads

# dtype name -> (MLX dtype, the unsigned type used for wrapping integer arithmetic)
_UNSIGNED = {"int8": "uint8", "int16": "uint16", "int32": "uint32", "int64": "uint64"}

HEADER = r"""
typedef long long rlx_i64;
__device__ __forceinline__ rlx_i64 rlx_fix(rlx_i64 i, rlx_i64 n) {
  // ONNX negative index, then clamped into [0, n-1] (a no-op for validated input)
  if (i < 0) i += n;
  if (i < 0) i = 0;
  if (i >= n) i = n - 1;
  return i;
}
template <typename T, typename U>
__device__ __forceinline__ T rlx_reduce(int red, T acc, T u) {
  // 0 none (last wins), 1 add, 2 mul (integers wrap through U), 3 max, 4 min: numpy's
  // maximum/minimum, NaN from either side propagates
  switch (red) {
    case 0: return u;
    case 1: return (T)((U)acc + (U)u);
    case 2: return (T)((U)acc * (U)u);
    case 3: return (acc >= u || acc != acc) ? acc : u;
    default: return (acc <= u || acc != acc) ? acc : u;
  }
}
// The scatter target (flat cell of data) of update m; q = p + 1 (after M). KIND 0:
// ScatterElements, q: r, ax, axis size, ishape[r], dstride[r]; KIND 1: ScatterND over
// idx [P, k], q: k, S, sizes[k], strides[k].
template <int KIND, typename I, typename IDX>
__device__ __forceinline__ IDX rlx_target(IDX m, const I* idx, const int64_t* q) {
  if (KIND == 0) {
    const int r = (int)q[0], ax = (int)q[1];
    const IDX s = (IDX)q[2];
    const int64_t* ishape = q + 3;
    const int64_t* dstride = q + 3 + r;
    IDX rem = m, t = 0;
    for (int d = r - 1; d >= 0; --d) {
      const IDX n = (IDX)ishape[d];
      const IDX c = rem % n;
      rem /= n;
      t += (d == ax ? (IDX)rlx_fix((rlx_i64)idx[m], s) : c) * (IDX)dstride[d];
    }
    return t;
  } else {
    const int k = (int)q[0];
    const IDX S = (IDX)q[1];
    const int64_t* sizes = q + 2;
    const int64_t* strides = q + 2 + k;
    const IDX row = m / S;
    IDX t = m % S;
    for (int j = 0; j < k; ++j) {
      t += (IDX)rlx_fix((rlx_i64)idx[row * k + j], sizes[j]) * (IDX)strides[j];
    }
    return t;
  }
}
__device__ __forceinline__ int rlx_atomic_exch(int* a, int v) { return atomicExch(a, v); }
__device__ __forceinline__ long long rlx_atomic_exch(long* a, long v) {
  return (long long)atomicExch((unsigned long long*)a, (unsigned long long)v);
}
__device__ __forceinline__ long long rlx_atomic_exch(long long* a, long long v) {
  return (long long)atomicExch((unsigned long long*)a, (unsigned long long)v);
}
// Sorts the singly linked list that starts at node ``list`` ascending, in place: a node is an
// update position + 1, L[node - 1] the next node, 0 the end. Bottom-up merge sort of a list
// (Tatham's): O(n log n) and no memory beyond the links. Returns the new first node.
template <typename IDX>
__device__ IDX rlx_list_sort(IDX* L, IDX list) {
  for (IDX k = 1;; k *= 2) {
    IDX p = list, tail = 0, merges = 0;
    list = 0;
    while (p != 0) {
      ++merges;
      IDX q = p, ps = 0, qs = k;
      for (IDX i = 0; i < k && q != 0; ++i) { ++ps; q = L[q - 1]; }
      while (ps > 0 || (qs > 0 && q != 0)) {
        IDX e;
        if (ps == 0) { e = q; q = L[q - 1]; --qs; }
        else if (qs == 0 || q == 0 || p < q) { e = p; p = L[p - 1]; --ps; }
        else { e = q; q = L[q - 1]; --qs; }
        if (tail != 0) L[tail - 1] = e; else list = e;
        tail = e;
      }
      p = q;
    }
    L[tail - 1] = 0;
    if (merges <= 1) return list;
  }
}
"""

SOURCES = {
    # inputs data [T], idx [I], p [int64]: r, ax, total, axis size, ishape[r], dstride[r]
    "gather_elements": r"""
  const int r = (int)p[0], ax = (int)p[1];
  const IDX total = (IDX)p[2], s = (IDX)p[3];
  const int64_t* ishape = p + 4;
  const int64_t* dstride = p + 4 + r;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  if (r == 1) {  // a plain take: no coordinate arithmetic
    for (IDX e = (IDX)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
      out[e] = data[(IDX)rlx_fix((rlx_i64)__ldcs(&idx[e]), s)];
    }
    return;
  }
  for (IDX e = (IDX)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    IDX rem = e, off = 0;
    for (int d = r - 1; d >= 0; --d) {
      const IDX n = (IDX)ishape[d];
      const IDX q = rem % n;
      rem /= n;
      off += (d == ax ? (IDX)rlx_fix((rlx_i64)__ldcs(&idx[e]), s) : q) * (IDX)dstride[d];
    }
    out[e] = data[off];
  }
""",
    # inputs data [T], idx [int64, (nb*J, k)], p: total, J, k, S, bstride, sizes[k], strides[k].
    # V > 1: a thread moves a 16-byte chunk of V elements of a slice (the plan chooses V only
    # where S, and so bstride and every stride, is a multiple of V), when both buffers are
    # 16-byte aligned (a view into a buffer may not be); else one element a thread.
    "gather_nd": r"""
  const IDX total = (IDX)p[0], J = (IDX)p[1], S = (IDX)p[3], bstride = (IDX)p[4];
  const int k = (int)p[2];
  const int64_t* sizes = p + 5;
  const int64_t* strides = p + 5 + k;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  const IDX first = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  if (V > 1 && ((reinterpret_cast<unsigned long long>(data) |
                 reinterpret_cast<unsigned long long>(out)) & 15) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(data);
    uint4* dst = reinterpret_cast<uint4*>(out);
    const IDX Sv = S / V;
    for (IDX e = first; e < total / V; e += step) {
      const IDX t = e / Sv;
      IDX off = (t / J) * bstride + (e % Sv) * V;
      for (int j = 0; j < k; ++j) {
        off += (IDX)rlx_fix((rlx_i64)idx[t * k + j], sizes[j]) * (IDX)strides[j];
      }
      dst[e] = src[off / V];
    }
    return;
  }
  for (IDX e = first; e < total; e += step) {
    const IDX t = e / S;
    IDX off = (t / J) * bstride + e % S;
    for (int j = 0; j < k; ++j) {
      off += (IDX)rlx_fix((rlx_i64)idx[t * k + j], sizes[j]) * (IDX)strides[j];
    }
    out[e] = data[off];
  }
""",
    # The scatters, 1 of 2. idx [I], p: M, then rlx_target's q -> head [IDX] (N),
    # next [IDX] (M), zero-initialised: each cell's updates as a linked list of positions + 1
    # (head[t] the first, next[m] the one after m, 0 the end), in whatever order the atomics run
    "scatter_link": r"""
  const IDX M = (IDX)p[0];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX m = (IDX)blockIdx.x * blockDim.x + threadIdx.x; m < M; m += step) {
    next[m] = (IDX)rlx_atomic_exch(&head[rlx_target<KIND, I, IDX>(m, idx, p + 1)], m + 1);
  }
""",
    # 2 of 2. data [T] (N), upd [T] (M), head, next [IDX], p: N, M, reduction -> out [T] (N),
    # link [IDX] (M). One thread a cell walks its list: up to RUN positions sorted in registers
    # as they come (kept descending: the atomics mostly hand out ascending positions, which the
    # exchange reverses), a longer list copied into link and merge-sorted there; then applied in
    # ascending position onto data: update order, whatever order the atomics ran in.
    "scatter_walk": r"""
  const IDX N = (IDX)p[0];
  const int red = (int)p[2];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += step) {
    T acc = data[i];
    const IDX h = head[i];
    if (h != 0) {
      IDX loc[RUN];
      IDX c = 0, e = h;
      for (; e != 0 && c < RUN; e = next[e - 1], ++c) {
        IDX j = c;
        while (j > 0 && loc[j - 1] < e) { loc[j] = loc[j - 1]; --j; }
        loc[j] = e;
      }
      if (e == 0) {
        for (IDX j = c; j-- > 0;) acc = rlx_reduce<T, U>(red, acc, upd[loc[j] - 1]);
      } else {
        for (IDX x = h; x != 0; x = next[x - 1]) link[x - 1] = next[x - 1];
        for (IDX x = rlx_list_sort(link, h); x != 0; x = link[x - 1]) {
          acc = rlx_reduce<T, U>(red, acc, upd[x - 1]);
        }
      }
    }
    out[i] = acc;
  }
""",
    # values [T], col [int32], rp [int32], x [T], p: n, ncols, nnz -> y [T] (n); L lanes a row,
    # each lane taking its entries j = a + lane, a + lane + L, ... E at a time: the E loads of
    # values and col issued before any product (loads in flight, not one a thread), the sum in
    # the same order as one at a time
    "spmv": r"""
  const IDX n = (IDX)p[0], ncols = (IDX)p[1], nnz = (IDX)p[2];
  const IDX tid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  const IDX row = tid / L;
  const int lane = (int)(tid % L);
  double acc = 0.0;
  if (row < n) {
    IDX a = (IDX)rp[row], b = (IDX)rp[row + 1];
    a = a < 0 ? 0 : (a > nnz ? nnz : a);
    b = b < a ? a : (b > nnz ? nnz : b);
    IDX j = a + lane;
    for (; j + (E - 1) * L < b; j += E * L) {
      T v[E];
      IDX c[E];
#pragma unroll
      for (int q = 0; q < E; ++q) {
        v[q] = values[j + q * L];
        c[q] = (IDX)col[j + q * L];
      }
#pragma unroll
      for (int q = 0; q < E; ++q) {
        const IDX cq = c[q] < 0 ? 0 : (c[q] >= ncols ? ncols - 1 : c[q]);
        acc += (double)v[q] * (double)x[cq];
      }
    }
    for (; j < b; j += L) {
      IDX c = (IDX)col[j];
      c = c < 0 ? 0 : (c >= ncols ? ncols - 1 : c);
      acc += (double)values[j] * (double)x[c];
    }
  }
  // every thread of the warp takes part in the shuffles (no early return above)
  for (int off = L / 2; off > 0; off >>= 1) {
    acc += __shfl_down_sync(0xffffffffu, acc, off, L);
  }
  if (row < n && lane == 0) {
    y[row] = (T)acc;
  }
""",
    # col [int32], rp [int32] (n+1), u [T] (n), v [T] (m), p: nnz, n, m -> out [T] (nnz); L lanes
    # a row as spmv (coalesced reads of col, writes of out), u[row] read once a lane
    "values_grad": r"""
  const IDX nnz = (IDX)p[0], n = (IDX)p[1], m = (IDX)p[2];
  const IDX tid = (IDX)blockIdx.x * blockDim.x + threadIdx.x;
  const IDX row = tid / L;
  const int lane = (int)(tid % L);
  if (row < n) {
    IDX a = (IDX)rp[row], b = (IDX)rp[row + 1];
    a = a < 0 ? 0 : (a > nnz ? nnz : a);
    b = b < a ? a : (b > nnz ? nnz : b);
    const T ur = u[row];
    for (IDX j = a + lane; j < b; j += L) {
      IDX c = (IDX)col[j];
      c = c < 0 ? 0 : (c >= m ? m - 1 : c);
      out[j] = ur * v[c];
    }
  }
""",
}

# name -> (input names, output names)
SIGNATURES = {
    "gather_elements": (["data", "idx", "p"], ["out"]),
    "gather_nd": (["data", "idx", "p"], ["out"]),
    "scatter_link": (["idx", "p"], ["head", "next"]),
    "scatter_walk": (["data", "upd", "head", "next", "p"], ["out", "link"]),
    "spmv": (["values", "col", "rp", "x", "p"], ["y"]),
    "values_grad": (["col", "rp", "u", "v", "p"], ["out"]),
}

_available: bool | None = None
_kernels: dict[str, Any] = {}
_forced = False  # set by forced(): the CUDA path whatever RLX_MLX_CUDA_KERNELS says


def available() -> bool:
    """MLX's CUDA build with a usable GPU."""
    global _available
    if _available is None:
        cuda = getattr(mx, "cuda", None)
        try:
            _available = bool(cuda is not None and cuda.is_available() and mx.is_available(mx.gpu)
                              and hasattr(mx.fast, "cuda_kernel"))
        except Exception:  # noqa: BLE001 — any probe failure means "not here"
            _available = False
    return _available


def enabled() -> bool:
    """On unless RLX_MLX_CUDA_KERNELS is 0/false/no/off (then the composed kernels run)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def active() -> bool:
    """Use the CUDA kernels for the op being built: enabled (or :func:`forced`, by a ``*_kernel``
    entry point of cuda_validate.py), a CUDA GPU, and the default device (the stream Backend.run
    entered) is the GPU."""
    return (_forced or enabled()) and available() and mx.default_device().type == mx.gpu


@contextlib.contextmanager
def forced() -> Iterator[None]:
    """Within the block, :func:`active` ignores RLX_MLX_CUDA_KERNELS (nests)."""
    global _forced
    prev, _forced = _forced, True
    try:
        yield
    finally:
        _forced = prev


def _kernel(name: str):
    k = _kernels.get(name)
    if k is None:
        ins, outs = SIGNATURES[name]
        k = _kernels[name] = mx.fast.cuda_kernel(
            name=f"rlxc_{VERSION}_{name}", input_names=ins, output_names=outs,
            source=SOURCES[name], header=HEADER, ensure_row_contiguous=True)
    return k


def _grid(threads: int) -> tuple[int, int, int]:
    t = max(1, min(int(threads), MAX_THREADS))
    return (-(-t // BLOCK) * BLOCK, 1, 1)


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= int(n)
    return out[::-1]


_NAMES: dict[Any, str] = {}


def _dtype_name(d) -> str:
    n = _NAMES.get(d)
    if n is None:  # str(dtype) costs ~2 us, and a plan names three or four dtypes
        n = _NAMES[d] = str(d).split(".")[-1]
    return n


def _mx(name: str):
    return getattr(mx, "bool_" if name == "bool" else name)


def plan(name: str, params: list[int], templates: list[tuple[str, Any]],
         out_shape, out_dtype: str, threads: int, extra_outputs: tuple = (),
         init: float | None = None, whole_blocks: bool = False) -> dict[str, Any]:
    """A launch's static part, as plain data (templates carry dtype *names*), less its inputs
    (:func:`planned` adds them). ``extra_outputs`` are further (shape, dtype name) outputs;
    ``init`` fills every output before the kernel runs (MLX's ``init_value``); ``whole_blocks``
    launches exactly ``threads`` (a multiple of BLOCK, one thread per lane) instead of the
    grid-stride grid. ``params`` is a tuple (the key of :func:`params_array`); ``call`` holds the
    same as the kernel call's keyword arguments (MLX dtypes), prepared once."""
    outs = [(tuple(int(v) for v in out_shape), out_dtype)]
    outs += [(tuple(int(v) for v in sh), d) for sh, d in extra_outputs]
    grid = (max(1, int(threads)) if whole_blocks else _grid(threads)[0], 1, 1)
    call = {"template": [(k, _mx(v) if isinstance(v, str) else v) for k, v in templates],
            "grid": grid, "threadgroup": (BLOCK, 1, 1), "output_shapes": [sh for sh, _ in outs],
            "output_dtypes": [_mx(d) for _, d in outs]}
    if init is not None:
        call["init_value"] = float(init)
    return {"name": name, "params": tuple(int(v) for v in params),
            "templates": templates, "out_shape": outs[0][0], "out_dtype": out_dtype,
            "outputs": outs, "init": init, "grid": grid, "call": call}


_plans: dict[tuple, dict[str, Any]] = {}
PLANS_CACHE = 4096  # distinct static plans kept (a shape/dtype/attribute combination each)


def planned(name: str, inputs: list, attrs: tuple, build) -> dict[str, Any]:
    """The plan of ``name`` on ``inputs``: ``build()``'s static part (:func:`plan`), made once per
    distinct input shapes, input dtypes and ``attrs``, with this call's inputs. Building it costs
    ~18 us of Python on the project's 2-core machine; the lookup ~2 us."""
    key = (name, attrs, *[(tuple(a.shape), a.dtype) for a in inputs])
    st = _plans.get(key)
    if st is None:
        if len(_plans) >= PLANS_CACHE:
            _plans.clear()
        st = _plans[key] = build()
    return {**st, "inputs": inputs}


_params: dict[tuple[int, ...], mx.array] = {}
PARAMS_CACHE = 4096  # distinct parameter vectors kept (a few hundred bytes each)


def params_array(params: Sequence[int]) -> mx.array:
    """The int64 parameter array of a launch, made once per distinct parameter vector: a fresh
    host array each call cost a host-to-device transfer and a page fault of MLX's unified memory
    on every launch (a benchmark or a CG iteration repeats the same shapes)."""
    key = params if isinstance(params, tuple) else tuple(params)
    a = _params.get(key)
    if a is None:
        if len(_params) >= PARAMS_CACHE:
            _params.clear()
        a = mx.array(list(key), dtype=mx.int64)
        try:
            mx.eval(a)  # materialised now, outside any later graph
        except ValueError:  # an MLX that refuses eval inside a transformation: do not cache
            return a
        _params[key] = a
    return a


def launch(pl: dict[str, Any]):
    """Run a plan: its one output, or the tuple of them when the plan has several."""
    res = _kernel(pl["name"])(inputs=[*pl["inputs"], params_array(pl["params"])], **pl["call"])
    return res[0] if len(pl["outputs"]) == 1 else tuple(res)


# -- plans ---------------------------------------------------------------------------------------
def plan_gather_elements(data, indices, ax: int) -> dict[str, Any]:
    def build():
        r = data.ndim
        total = math.prod(indices.shape)
        params = [r, ax, total, data.shape[ax], *indices.shape, *_strides(data.shape)]
        return plan("gather_elements", params,
                    [("T", _dtype_name(data.dtype)), ("I", _dtype_name(indices.dtype)),
                     ("IDX", idx_dtype(total, math.prod(data.shape)))],
                    indices.shape, _dtype_name(data.dtype), total)
    return planned("gather_elements", [data, indices], (ax,), build)


def gather_nd_chunk(itemsize: int, S: int) -> int:
    """Elements a gather_nd thread moves: a 16-byte chunk where a slice of S elements is whole
    chunks, else 1. At rows of 16 float32 the chunks took 10^7-10^8 gathers from 1.08x
    ``cupy.take`` of rows to 0.56-0.59x on an H100 (benchmarks/bench_cuda_variants.py)."""
    v = 16 // itemsize if itemsize and 16 % itemsize == 0 else 1
    return v if v > 1 and S % v == 0 else 1


def plan_gather_nd(data, indices, b: int) -> dict[str, Any]:
    def build():
        k = indices.shape[-1]
        out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
        nb = math.prod(data.shape[:b])
        tuples = math.prod(indices.shape[:-1])
        J = tuples // nb if nb else 0
        S = math.prod(data.shape[b + k:])
        inner = _strides(data.shape[b:])[:k]
        params = [math.prod(out_shape), J, k, S, math.prod(data.shape[b:]), *data.shape[b:b + k], *inner]
        V = gather_nd_chunk(data.dtype.size, S)
        return plan("gather_nd", params,
                    [("T", _dtype_name(data.dtype)), ("I", _dtype_name(indices.dtype)), ("V", V),
                     ("IDX", idx_dtype(math.prod(out_shape), math.prod(data.shape), indices.size))],
                    out_shape, _dtype_name(data.dtype), math.prod(out_shape) // V)
    return planned("gather_nd", [data, indices], (b,), build)


def idx_dtype(*sizes: int) -> str:
    """The kernels' index arithmetic: 32-bit while every size (and a grid-stride step past it)
    stays below 2^31, else 64-bit (64-bit integer division is several times slower)."""
    return "int32" if max(sizes, default=0) < 2**30 else "int64"


def scatter_target_params(data, indices, ax: int | None, M: int) -> tuple[int, list[int]]:
    """(KIND, the params ``M, q...`` of the scatter kernels): KIND 0 ScatterElements along
    ``ax``, KIND 1 ScatterND (``ax`` None, indices as [P, k])."""
    if ax is not None:
        q = [data.ndim, ax, data.shape[ax], *indices.shape, *_strides(data.shape)]
        return 0, [M, *q]
    k = indices.shape[-1]
    q = [k, math.prod(data.shape[k:]), *data.shape[:k], *_strides(data.shape)[:k]]
    return 1, [M, *q]


def _scatter_templates(data, indices, M: int, kind: int) -> list[tuple[str, Any]]:
    N = math.prod(data.shape)
    return [("I", _dtype_name(indices.dtype)), ("IDX", idx_dtype(M, N, indices.size)), ("KIND", kind)]


def plan_scatter_link(data, indices, ax: int | None, M: int) -> dict[str, Any]:
    def build():
        N = math.prod(data.shape)
        kind, params = scatter_target_params(data, indices, ax, M)
        tpl = _scatter_templates(data, indices, M, kind)
        i = dict(tpl)["IDX"]
        return plan("scatter_link", params, tpl, (N,), i, M, extra_outputs=(((M,), i),), init=0)
    return planned("scatter_link", [indices], (tuple(data.shape), ax, M), build)


def plan_scatter_walk(data, updates, head, nxt, reduction: str) -> dict[str, Any]:
    def build():
        N, M = math.prod(data.shape), math.prod(updates.shape)
        t, i = _dtype_name(data.dtype), _dtype_name(head.dtype)
        return plan("scatter_walk", [N, M, REDUCTIONS[reduction]],
                    [("T", t), ("U", _UNSIGNED.get(t, t)), ("IDX", i), ("RUN", RUN)],
                    data.shape, t, N, extra_outputs=(((M,), i),))
    return planned("scatter_walk", [data, updates, head, nxt], (reduction,), build)


RUN = 16  # scatter_walk sorts a cell's updates in registers up to this many


REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


def lanes(n: int, nnz: int, per_lane: int = 1) -> int:
    """Lanes per row: the power of two at or above the mean row length over ``per_lane``, in
    [1, 32]."""
    mean = nnz / max(n, 1) / per_lane
    L = 1
    while L < mean and L < 32:
        L *= 2
    return L


# Entries a spmv lane loads before using any: at 8 entries a row, one lane an entry (v7) left
# one 8-byte load in flight a thread and ran at 1.4-1.8x cuSPARSE at 10^7-10^8 entries on an
# H100; 2 lanes of 4 ran at 0.82x, 4 lanes of 2 at 0.96x, 1 lane of 8 as 2 of 4
# (benchmarks/bench_cuda_variants.py).
SPMV_PER_LANE = 4


def _row_threads(op: str, n: int, L: int) -> int:
    threads = -(-(n * L) // BLOCK) * BLOCK  # whole blocks: every lane of a warp shuffles
    if threads >= 2**31:
        raise ValueError(f"{op}: {n} rows x {L} lanes exceed one launch")
    return threads


def plan_spmv(values, col, rp, x) -> dict[str, Any]:
    def build():
        n = rp.shape[0] - 1
        nnz = col.shape[0]
        L = lanes(n, nnz, SPMV_PER_LANE)
        threads = _row_threads("spmv", n, L)
        return plan("spmv", [n, x.shape[0], nnz],
                    [("T", _dtype_name(values.dtype)), ("C", _dtype_name(col.dtype)),
                     ("R", _dtype_name(rp.dtype)), ("X", _dtype_name(x.dtype)), ("L", L),
                     ("E", SPMV_PER_LANE), ("IDX", idx_dtype(threads, nnz + 1, x.shape[0]))], (n,),
                    _dtype_name(values.dtype), threads, whole_blocks=True)
    return planned("spmv", [values, col, rp, x], (), build)


def plan_values_grad(col, rp, u, v) -> dict[str, Any]:
    def build():
        nnz, n = col.shape[0], rp.shape[0] - 1
        L = lanes(n, nnz)
        threads = _row_threads("values_grad", n, L)
        return plan("values_grad", [nnz, n, v.shape[0]],
                    [("T", _dtype_name(u.dtype)), ("V", _dtype_name(v.dtype)),
                     ("C", _dtype_name(col.dtype)), ("R", _dtype_name(rp.dtype)), ("L", L),
                     ("IDX", idx_dtype(threads, nnz + 1, rp.shape[0], v.shape[0]))], (nnz,),
                    _dtype_name(u.dtype), threads, whole_blocks=True)
    return planned("values_grad", [col, rp, u, v], (), build)


# -- ops (callers check active() and handle empty inputs first) ---------------------------------
def gather_elements(data, indices, ax: int):
    return launch(plan_gather_elements(data, indices, ax))


def gather_nd(data, indices, b: int):
    return launch(plan_gather_nd(data, indices, b))


def _scatter(data, indices, updates, ax: int | None, reduction: str):
    M = math.prod(updates.shape)
    upd = updates.reshape(-1)
    head, nxt = launch(plan_scatter_link(data, indices, ax, M))
    return launch(plan_scatter_walk(data, upd, head, nxt, reduction))[0]


def scatter_elements(data, indices, updates, ax: int, reduction: str):
    return _scatter(data, indices, updates, ax, reduction)


def scatter_nd(data, indices, updates, reduction: str):
    return _scatter(data, indices.reshape(-1, indices.shape[-1]), updates, None, reduction)


def spmv(values, col, rp, x):
    return launch(plan_spmv(values, col, rp, x))


def values_grad(col, rp, u, v):
    return launch(plan_values_grad(col, rp, u, v))
