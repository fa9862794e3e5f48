"""Native CUDA kernels (``mx.fast.cuda_kernel``) for the custom ops on MLX's CUDA build.

The composed MLX kernels of ``custom.py`` are the definition of what the MLX backend computes
and the fallback everywhere else (MLX's CPU backend, Metal, a CUDA build with
``RLX_MLX_CUDA_KERNELS=0``); on a CUDA GPU stream the kernels here replace the slow or
nondeterministic parts:

* ``gather_elements`` / ``gather_nd``: one thread per output element, the source offset computed
  from the index values in the kernel (no coordinate arrays materialised as the composed version
  does with broadcast aranges).
* ``scatter`` (ScatterElements and ScatterND, every reduction): deterministic and atomic-free.
  A first kernel turns each update element ``m`` into the key ``target * M + m`` (``M`` updates);
  ``mx.sort`` orders the keys, i.e. by target and, within a target, by update position; a second
  kernel gives each output cell one thread that binary-searches its run of keys and applies the
  run's updates in update order onto ``data``. So duplicates are applied in the order of the
  updates, as the CPU reference (numpy ``ufunc.at``) does: float add/mul give the same bits run
  to run (MLX's composed scatter uses atomics, whose order varies), max/min propagate NaN as numpy
  ``maximum``/``minimum`` do, integers wrap, and int64 works (MLX's GPU scatter rejects int64).
  With reduction ``none`` the last duplicate wins (ONNX leaves duplicates undefined).
* ``spmv`` (rlx_sparse.mat_vec, and the products inside cg_solve): ``L`` lanes per CSR row
  (``L`` the power of two nearest above the mean row length, at most 32), float64 accumulation
  and a fixed shuffle tree, rounded once: deterministic, and no atomics (the composed version
  scatter-adds ``values * x[cols]`` with float atomics, which flush subnormals on NVIDIA GPUs).
* ``values_grad``: one thread per stored entry, its row found by binary search in ``row_ptr``.

rlx_sparse.lu_solve stays on MLX's CPU stream (MLX linalg has no GPU kernels; a GPU sparse LU is
not attempted here).

Index arithmetic is 32-bit (template ``IDX``) while every size stays below 2^30 and 64-bit past
that: 64-bit integer division made the first version's gathers 11x slower on an H200.

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
from collections.abc import Iterator
from typing import Any

import mlx.core as mx

ENV = "RLX_MLX_CUDA_KERNELS"
VERSION = "v2"
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
"""

SOURCES = {
    # inputs data [T], idx [I], p [int64]: r, ax, total, axis size, ishape[r], dstride[r]
    "gather_elements": r"""
  const int r = (int)p[0], ax = (int)p[1];
  const IDX total = (IDX)p[2], s = (IDX)p[3];
  const int64_t* ishape = p + 4;
  const int64_t* dstride = p + 4 + r;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX e = (IDX)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    IDX rem = e, off = 0;
    for (int d = r - 1; d >= 0; --d) {
      const IDX n = (IDX)ishape[d];
      const IDX q = rem % n;
      rem /= n;
      off += (d == ax ? (IDX)rlx_fix((rlx_i64)idx[e], s) : q) * (IDX)dstride[d];
    }
    out[e] = data[off];
  }
""",
    # inputs data [T], idx [int64, (nb*J, k)], p: total, J, k, S, bstride, sizes[k], strides[k]
    "gather_nd": r"""
  const IDX total = (IDX)p[0], J = (IDX)p[1], S = (IDX)p[3], bstride = (IDX)p[4];
  const int k = (int)p[2];
  const int64_t* sizes = p + 5;
  const int64_t* strides = p + 5 + k;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX e = (IDX)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
    const IDX t = e / S;
    IDX off = (t / J) * bstride + e % S;
    for (int j = 0; j < k; ++j) {
      off += (IDX)rlx_fix((rlx_i64)idx[t * k + j], sizes[j]) * (IDX)strides[j];
    }
    out[e] = data[off];
  }
""",
    # ScatterElements keys: idx [I], p: r, ax, M, axis size, ishape[r], dstride[r] -> keys [K]
    "scatter_elements_keys": r"""
  const int r = (int)p[0], ax = (int)p[1];
  const IDX M = (IDX)p[2], s = (IDX)p[3];
  const int64_t* ishape = p + 4;
  const int64_t* dstride = p + 4 + r;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX m = (IDX)blockIdx.x * blockDim.x + threadIdx.x; m < M; m += step) {
    IDX rem = m, t = 0;
    for (int d = r - 1; d >= 0; --d) {
      const IDX n = (IDX)ishape[d];
      const IDX q = rem % n;
      rem /= n;
      t += (d == ax ? (IDX)rlx_fix((rlx_i64)idx[m], s) : q) * (IDX)dstride[d];
    }
    keys[m] = (K)((rlx_i64)t * M + m);
  }
""",
    # ScatterND keys: idx [int64, (P, k)], p: M (= P*S), k, S, sizes[k], strides[k] -> keys [K]
    "scatter_nd_keys": r"""
  const IDX M = (IDX)p[0], S = (IDX)p[2];
  const int k = (int)p[1];
  const int64_t* sizes = p + 3;
  const int64_t* strides = p + 3 + k;
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX m = (IDX)blockIdx.x * blockDim.x + threadIdx.x; m < M; m += step) {
    const IDX q = m / S;
    IDX t = m % S;
    for (int j = 0; j < k; ++j) {
      t += (IDX)rlx_fix((rlx_i64)idx[q * k + j], sizes[j]) * (IDX)strides[j];
    }
    keys[m] = (K)((rlx_i64)t * M + m);
  }
""",
    # data [T] (N), upd [T] (M), keys [K] sorted, p: N, M, reduction -> out [T] (N)
    "scatter_apply": r"""
  const IDX N = (IDX)p[0], M = (IDX)p[1];
  const int red = (int)p[2];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX i = (IDX)blockIdx.x * blockDim.x + threadIdx.x; i < N; i += step) {
    const rlx_i64 lo_key = (rlx_i64)i * M, hi_key = lo_key + M;
    IDX lo = 0, hi = M;
    while (lo < hi) {  // first key >= i * M
      const IDX mid = lo + ((hi - lo) >> 1);
      if ((rlx_i64)keys[mid] < lo_key) lo = mid + 1; else hi = mid;
    }
    T acc = data[i];
    for (IDX j = lo; j < M; ++j) {
      const rlx_i64 key = (rlx_i64)keys[j];
      if (key >= hi_key) break;
      acc = rlx_reduce<T, U>(red, acc, upd[key - lo_key]);
    }
    out[i] = acc;
  }
""",
    # values [T], col [int32], rp [int32], x [T], p: n, ncols, nnz -> y [T] (n); L lanes a row
    "spmv": r"""
  const rlx_i64 n = p[0], ncols = p[1], nnz = p[2];
  const rlx_i64 tid = (rlx_i64)blockIdx.x * blockDim.x + threadIdx.x;
  const rlx_i64 row = tid / L;
  const int lane = (int)(tid % L);
  double acc = 0.0;
  if (row < n) {
    rlx_i64 a = rp[row], b = rp[row + 1];
    a = a < 0 ? 0 : (a > nnz ? nnz : a);
    b = b < a ? a : (b > nnz ? nnz : b);
    for (rlx_i64 j = a + lane; j < b; j += L) {
      acc += (double)values[j] * (double)x[rlx_fix((rlx_i64)col[j], ncols)];
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
    # col [int32], rp [int32] (n+1), u [T] (n), v [T] (m), p: nnz, n, m -> out [T] (nnz)
    "values_grad": r"""
  const IDX nnz = (IDX)p[0], n = (IDX)p[1], m = (IDX)p[2];
  const IDX step = (IDX)gridDim.x * blockDim.x;
  for (IDX k = (IDX)blockIdx.x * blockDim.x + threadIdx.x; k < nnz; k += step) {
    IDX lo = 0, hi = n + 1;
    while (lo < hi) {  // first row_ptr entry > k; the row is the one before it
      const IDX mid = lo + ((hi - lo) >> 1);
      if ((IDX)rp[mid] <= k) lo = mid + 1; else hi = mid;
    }
    const rlx_i64 row = rlx_fix(lo - 1, n);
    out[k] = u[row] * v[rlx_fix((rlx_i64)col[k], m)];
  }
""",
}

# name -> (input names, output names)
SIGNATURES = {
    "gather_elements": (["data", "idx", "p"], ["out"]),
    "gather_nd": (["data", "idx", "p"], ["out"]),
    "scatter_elements_keys": (["idx", "p"], ["keys"]),
    "scatter_nd_keys": (["idx", "p"], ["keys"]),
    "scatter_apply": (["data", "upd", "keys", "p"], ["out"]),
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


def _dtype_name(d) -> str:
    return str(d).split(".")[-1]


def _mx(name: str):
    return getattr(mx, "bool_" if name == "bool" else name)


def plan(name: str, inputs: list, params: list[int], templates: list[tuple[str, Any]],
         out_shape, out_dtype: str, threads: int) -> dict[str, Any]:
    """Everything a launch needs, as plain data (templates carry dtype *names*)."""
    return {"name": name, "inputs": inputs, "params": [int(v) for v in params],
            "templates": templates, "out_shape": tuple(int(s) for s in out_shape),
            "out_dtype": out_dtype,
            "grid": (max(1, int(threads)) if name == "spmv" else _grid(threads)[0], 1, 1)}


def launch(pl: dict[str, Any]) -> mx.array:
    tpl = [(k, _mx(v) if isinstance(v, str) else v) for k, v in pl["templates"]]
    p = mx.array(pl["params"], dtype=mx.int64)
    (out,) = _kernel(pl["name"])(
        inputs=[*pl["inputs"], p], template=tpl, grid=pl["grid"], threadgroup=(BLOCK, 1, 1),
        output_shapes=[pl["out_shape"]], output_dtypes=[_mx(pl["out_dtype"])])
    return out


# -- plans ---------------------------------------------------------------------------------------
def plan_gather_elements(data, indices, ax: int) -> dict[str, Any]:
    r = data.ndim
    total = math.prod(indices.shape)
    params = [r, ax, total, data.shape[ax], *indices.shape, *_strides(data.shape)]
    return plan("gather_elements", [data, indices], params,
                [("T", _dtype_name(data.dtype)), ("I", _dtype_name(indices.dtype)),
                 ("IDX", idx_dtype(total, math.prod(data.shape)))],
                indices.shape, _dtype_name(data.dtype), total)


def plan_gather_nd(data, indices, b: int) -> dict[str, Any]:
    k = indices.shape[-1]
    out_shape = tuple(indices.shape[:-1]) + tuple(data.shape[b + k:])
    nb = math.prod(data.shape[:b])
    tuples = math.prod(indices.shape[:-1])
    J = tuples // nb if nb else 0
    S = math.prod(data.shape[b + k:])
    inner = _strides(data.shape[b:])[:k]
    params = [math.prod(out_shape), J, k, S, math.prod(data.shape[b:]), *data.shape[b:b + k], *inner]
    return plan("gather_nd", [data, indices], params,
                [("T", _dtype_name(data.dtype)), ("I", _dtype_name(indices.dtype)),
                 ("IDX", idx_dtype(math.prod(out_shape), math.prod(data.shape), indices.size))],
                out_shape,
                _dtype_name(data.dtype),
                math.prod(out_shape))


def idx_dtype(*sizes: int) -> str:
    """The kernels' index arithmetic: 32-bit while every size (and a grid-stride step past it)
    stays below 2^31, else 64-bit (64-bit integer division is several times slower)."""
    return "int32" if max(sizes, default=0) < 2**30 else "int64"


def key_dtype(n_out: int, n_upd: int) -> str:
    """int32 keys while target * M + m stays below 2^31, else int64."""
    return "int32" if n_out * n_upd < 2**31 else "int64"


def plan_scatter_elements_keys(data, indices, ax: int) -> dict[str, Any]:
    r = data.ndim
    M = math.prod(indices.shape)
    params = [r, ax, M, data.shape[ax], *indices.shape, *_strides(data.shape)]
    return plan("scatter_elements_keys", [indices], params,
                [("I", _dtype_name(indices.dtype)), ("K", key_dtype(math.prod(data.shape), M)),
                 ("IDX", idx_dtype(M, math.prod(data.shape)))],
                (M,), key_dtype(math.prod(data.shape), M), M)


def plan_scatter_nd_keys(data, indices, M: int) -> dict[str, Any]:
    k = indices.shape[-1]
    S = math.prod(data.shape[k:])
    params = [M, k, S, *data.shape[:k], *_strides(data.shape)[:k]]
    return plan("scatter_nd_keys", [indices], params,
                [("I", _dtype_name(indices.dtype)), ("K", key_dtype(math.prod(data.shape), M)),
                 ("IDX", idx_dtype(M, math.prod(data.shape), indices.size))], (M,),
                key_dtype(math.prod(data.shape), M), M)


REDUCTIONS = {"none": 0, "add": 1, "mul": 2, "max": 3, "min": 4}


def plan_scatter_apply(data, updates, keys, reduction: str) -> dict[str, Any]:
    N, M = math.prod(data.shape), math.prod(updates.shape)
    t = _dtype_name(data.dtype)
    return plan("scatter_apply", [data, updates, keys], [N, M, REDUCTIONS[reduction]],
                [("T", t), ("U", _UNSIGNED.get(t, t)), ("K", _dtype_name(keys.dtype)),
                 ("IDX", idx_dtype(N, M))],
                data.shape, t, N)


def lanes(n: int, nnz: int) -> int:
    """Lanes per row: the power of two at or above the mean row length, in [1, 32]."""
    mean = nnz / max(n, 1)
    L = 1
    while L < mean and L < 32:
        L *= 2
    return L


def plan_spmv(values, col, rp, x) -> dict[str, Any]:
    n = rp.shape[0] - 1
    nnz = col.shape[0]
    L = lanes(n, nnz)
    threads = -(-(n * L) // BLOCK) * BLOCK  # whole blocks: every lane of a warp shuffles
    if threads >= 2**31:
        raise ValueError(f"spmv: {n} rows x {L} lanes exceed one launch")
    return plan("spmv", [values, col, rp, x], [n, x.shape[0], nnz],
                [("T", _dtype_name(values.dtype)), ("C", _dtype_name(col.dtype)),
                 ("R", _dtype_name(rp.dtype)), ("X", _dtype_name(x.dtype)), ("L", L)], (n,),
                _dtype_name(values.dtype), threads)


def plan_values_grad(col, rp, u, v) -> dict[str, Any]:
    nnz = col.shape[0]
    return plan("values_grad", [col, rp, u, v], [nnz, rp.shape[0] - 1, v.shape[0]],
                [("T", _dtype_name(u.dtype)), ("V", _dtype_name(v.dtype)),
                 ("C", _dtype_name(col.dtype)), ("R", _dtype_name(rp.dtype)),
                 ("IDX", idx_dtype(nnz + 1, rp.shape[0], v.shape[0]))], (nnz,),
                _dtype_name(u.dtype), nnz)


# -- ops (callers check active() and handle empty inputs first) ---------------------------------
def gather_elements(data, indices, ax: int):
    return launch(plan_gather_elements(data, indices, ax))


def gather_nd(data, indices, b: int):
    return launch(plan_gather_nd(data, indices, b))


def _scatter(data, updates, keys, reduction: str):
    skeys = mx.sort(keys)
    return launch(plan_scatter_apply(data, updates.reshape(-1), skeys, reduction))


def scatter_elements(data, indices, updates, ax: int, reduction: str):
    keys = launch(plan_scatter_elements_keys(data, indices, ax))
    return _scatter(data, updates, keys, reduction)


def scatter_nd(data, indices, updates, reduction: str):
    k = indices.shape[-1]
    M = math.prod(updates.shape)
    keys = launch(plan_scatter_nd_keys(data, indices.reshape(-1, k), M))
    return _scatter(data, updates, keys, reduction)


def spmv(values, col, rp, x):
    return launch(plan_spmv(values, col, rp, x))


def values_grad(col, rp, u, v):
    return launch(plan_values_grad(col, rp, u, v))
