"""The CUDA kernels of the custom ops (backends/mlx/cuda_kernels.py).

Without a CUDA GPU (CI, the development machines) the kernels' host side is still tested: every
``plan_*`` is executed by a numpy emulation of the kernel body it launches (the same params, the
same loops), on the matrix's own cases of each op, and the result must equal the CPU reference
bit for bit (mat_vec: within the op's own judge). The scatter kernels' CUDA source itself is
compiled as host C++ and run (a C++ compiler is all it needs), and every source by ``nvcc`` where
one is installed (test_sources_compile_with_nvcc). On MLX's CUDA build the real kernels run the
same cases on the GPU, in every mode, against the reference, and twice more to show the results
are bit-identical run to run.
"""
from __future__ import annotations

import inspect

import mlx.core as mx
import numpy as np
import pytest

from rlx_conformance import backends
from rlx_conformance.backends.mlx import cuda_kernels as ck
from rlx_conformance.backends.mlx import cuda_validate, custom, to_mlx, to_numpy
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import UnsupportedError
from rlx_conformance.generate import matrix
from rlx_conformance.ops import get_op

CPU = backends.get_backend("cpu")
OPS = ["onnx.ScatterElements", "onnx.GatherElements", "onnx.GatherND", "onnx.ScatterND",
       "rlx_sparse.mat_vec", "rlx_sparse.values_grad", "rlx_sparse.cg_solve"]
on_cuda = pytest.mark.skipif(not ck.available(), reason="no CUDA GPU in MLX here")


def _cases(op):
    cs = matrix.generate([matrix.Target("mlx", "gpu", "eager")], ops=[op])
    return [c for c in cs if c.dtype != "float64"]  # float64 runs on the CPU stream


# -- numpy emulation of the kernel bodies --------------------------------------------------------
def _fix(i, n):
    """rlx_fix: an ONNX index (negative from the end), clamped (the sparse kernels only clamp)."""
    i = np.where(i < 0, i + n, i)
    return np.clip(i, 0, n - 1)


def _np(a):
    return to_numpy(a)


def _reduce(red, a, u, dtype):
    """rlx_reduce: 0 none, 1 add, 2 mul (integers wrap), 3 max, 4 min (NaN propagates)."""
    if red == 0:
        return u
    if red == 1:
        return np.add(a, u, dtype=dtype)
    if red == 2:
        return np.multiply(a, u, dtype=dtype)
    if red == 3:
        return a if (a >= u or a != a) else u
    return a if (a <= u or a != a) else u


def _target(kind, m, idx, q):
    """rlx_target: the flat data cell of each update m."""
    if kind == 0:
        r, ax, s = q[:3]
        ishape, dstride = q[3:3 + r], q[3 + r:3 + 2 * r]
        rem, t = m.copy(), np.zeros_like(m)
        for d in range(r - 1, -1, -1):
            c = rem % ishape[d]
            rem //= ishape[d]
            t += (_fix(idx[m], s) if d == ax else c) * dstride[d]
        return t
    k, S = q[:2]
    sizes, strides = q[2:2 + k], q[2 + k:2 + 2 * k]
    row, t = m // S, m % S
    for j in range(k):
        t = t + _fix(idx[row * k + j], sizes[j]) * strides[j]
    return t


def _emulate(pl):
    """Run a plan's kernel body in numpy (vectorised where the kernel's threads are independent)."""
    p = pl["params"]
    ins = [_np(a) if isinstance(a, mx.array) else a for a in pl["inputs"]]
    name = pl["name"]
    if name == "gather_elements":
        r, ax, total, s = p[:4]
        ishape, dstride = p[4:4 + r], p[4 + r:4 + 2 * r]
        idx = ins[1].reshape(-1).astype(np.int64)
        e = np.arange(total, dtype=np.int64)
        rem, off = e.copy(), np.zeros_like(e)
        for d in range(r - 1, -1, -1):
            q = rem % ishape[d]
            rem //= ishape[d]
            off += (_fix(idx, s) if d == ax else q) * dstride[d]
        return ins[0].reshape(-1)[off].reshape(pl["out_shape"])
    if name == "gather_nd":
        total, J, k, S, bstride = p[:5]
        sizes, strides = p[5:5 + k], p[5 + k:5 + 2 * k]
        V = dict(pl["templates"])["V"]
        # the chunked path: every offset a whole number of 16-byte chunks, a thread a chunk
        assert V == 1 or (V * ins[0].dtype.itemsize == 16 and S % V == 0 and bstride % V == 0
                          and all(s_ % V == 0 for s_ in strides))
        assert pl["grid"][0] >= min(total // V, ck.MAX_THREADS)
        idx = ins[1].reshape(-1).astype(np.int64)
        e = np.arange(total, dtype=np.int64)
        t = e // S
        off = (t // J) * bstride + e % S
        for j in range(k):
            off += _fix(idx[t * k + j], sizes[j]) * strides[j]
        return ins[0].reshape(-1)[off].reshape(pl["out_shape"])
    if name == "scatter_link":  # the exchanges run in any order: a shuffled one here
        M = p[0]
        m = np.arange(M, dtype=np.int64)
        t = _target(dict(pl["templates"])["KIND"], m, ins[0].reshape(-1).astype(np.int64), p[1:])
        N = pl["outputs"][0][0][0]
        assert pl["init"] == 0 and (t >= 0).all() and (t < N).all()
        assert pl["outputs"][1] == ((M,), pl["out_dtype"])
        head, nxt = np.zeros(N, np.int64), np.zeros(M, np.int64)
        for j in np.random.default_rng(M).permutation(M):
            nxt[j], head[t[j]] = head[t[j]], j + 1
        return head.astype(pl["out_dtype"]), nxt.astype(pl["out_dtype"])
    if name == "scatter_walk":
        N, M, red = p
        data, upd, head, nxt = (x.reshape(-1) for x in ins)
        out = data.copy()
        with np.errstate(all="ignore"):
            for i in np.flatnonzero(head):
                run, e = [], int(head[i])
                while e:  # the list: positions + 1, 0 ends it
                    run.append(e - 1)
                    e = int(nxt[e - 1])
                for j in sorted(run):  # the kernel's sort (registers or the list's merge sort)
                    out[i] = _reduce(red, out[i], upd[j], out.dtype)
        return out.reshape(pl["out_shape"]), np.zeros(M, pl["outputs"][1][1])
    if name == "spmv":
        n, ncols, nnz = p
        values, col, rp, x = ins
        L = dict(pl["templates"])["L"]
        y = np.zeros(n, np.float64)
        for row in range(n):
            a, b = int(np.clip(rp[row], 0, nnz)), int(rp[row + 1])
            b = min(max(b, a), nnz)
            lanes = [sum(float(values[j]) * float(x[min(max(int(col[j]), 0), ncols - 1)])
                         for j in range(a + lane, b, L)) for lane in range(L)]
            while len(lanes) > 1:  # the shuffle tree: lane l += lane l + off
                half = len(lanes) // 2
                lanes = [lanes[i] + lanes[i + half] for i in range(half)]
            y[row] = lanes[0]
        return y.astype(pl["out_dtype"])
    if name == "values_grad":
        nnz, n, m = p
        col, rp, u, v = ins
        assert pl["grid"][0] >= n * dict(pl["templates"])["L"]
        out = np.full(nnz, np.nan, u.dtype)  # an entry no row covers would stay unwritten
        for row in range(n):
            a = int(np.clip(rp[row], 0, nnz))
            b = min(max(int(rp[row + 1]), a), nnz)
            out[a:b] = u[row] * v[np.clip(col[a:b].astype(np.int64), 0, m - 1)]
        return out
    raise KeyError(name)


def _emulated_op(op, inputs, attrs):
    """The CUDA path of the op, each launch emulated; inputs are numpy (compute dtypes)."""
    a = [to_mlx(x, dt.name_of(x.dtype)) for x in inputs]
    if op == "onnx.GatherElements":
        return _emulate(ck.plan_gather_elements(a[0], a[1], attrs["axis"] % a[0].ndim))
    if op == "onnx.GatherND":
        return _emulate(ck.plan_gather_nd(a[0], a[1], attrs["batch_dims"]))
    if op in ("onnx.ScatterElements", "onnx.ScatterND"):
        data, upd = a[0], a[2].reshape(-1)
        idx, ax = (a[1], attrs["axis"] % a[0].ndim) if op == "onnx.ScatterElements" else \
            (a[1].reshape(-1, a[1].shape[-1]), None)
        M = a[2].size
        head, nxt = _emulate(ck.plan_scatter_link(data, idx, ax, M))
        return _emulate(ck.plan_scatter_walk(data, upd, mx.array(head), mx.array(nxt),
                                             attrs["reduction"]))[0]
    if op == "rlx_sparse.mat_vec":
        return _emulate(ck.plan_spmv(*a))
    if op == "rlx_sparse.values_grad":
        return _emulate(ck.plan_values_grad(*a))
    raise KeyError(op)


def _judge(case, inputs, expected, actual):
    from rlx_conformance.run.execute import judge

    ok, comps, _ = judge(case, inputs, expected, actual)
    return ok, "; ".join(c.message for c in comps if c.message)


@pytest.mark.parametrize("op", OPS[:-1])
def test_emulated_kernels_match_the_reference(op):
    """The plans' params, grids and target encodings, executed in numpy, reproduce the reference
    (the scatters' atomics emulated in a shuffled order)."""
    spec = get_op(op)
    n = 0
    for case in _cases(op):
        if case.dtype in ("float16", "bfloat16") and spec.low_precision == "f32":
            continue  # widened to float32 before the kernel: the float32 cases cover the body
        inputs = matrix.make_inputs(case)
        try:
            (expected,) = CPU.run(op, [x.copy() for x in inputs], case.attr_dict)
        except Exception:  # noqa: BLE001 — error inputs are not this test's business
            continue
        if expected.size == 0 or any(x.size == 0 for x in inputs):
            continue  # the kernels are not launched on empty inputs (custom.py returns early)
        if op == "rlx_sparse.mat_vec" and (inputs[0].size == 0 or expected.size > 400):
            continue  # the emulated shuffle tree runs in Python: keep it small
        actual = _emulated_op(op, inputs, case.attr_dict).astype(expected.dtype)
        ok, msg = _judge(case, inputs, [expected], [actual])
        assert ok, f"{case.id}: {msg}"
        n += 1
    assert n > 0


def _dup_inputs(rng, op, red, dtype, m, cells=40):
    """Scatter inputs with m index rows of 3 updates into cells x 3 data (as the emulation's test)."""
    def draw(shape):
        x = rng.standard_normal(shape) * (1 if red == "mul" else 1000)
        return (x if dtype is np.float32 else np.rint(x)).astype(dtype)
    if op == "onnx.ScatterElements":
        return [draw((cells, 3)), rng.integers(-cells, cells, (m, 3)), draw((m, 3))], {"axis": 0, "reduction": red}
    return [draw((cells, 3)), rng.integers(-cells, cells, (m, 1)), draw((m, 3))], {"reduction": red}


@pytest.mark.parametrize("op", ["onnx.ScatterElements", "onnx.ScatterND"])
def test_emulated_scatters_apply_duplicates_in_update_order(op):
    """Many duplicates a cell (runs past RUN, so the long-run branch), every reduction, float32
    and int64: the emulated kernels give the reference's bits exactly, i.e. the updates of a
    cell are applied in update order whatever order the atomics hand out the slots."""
    rng = np.random.default_rng(7)
    for red in ("none", "add", "mul", "max", "min"):
        for dtype in (np.float32, np.int64):
            ins, attrs = _dup_inputs(rng, op, red, dtype, 3000)
            (expected,) = CPU.run(op, [x.copy() for x in ins], attrs)
            actual = np.asarray(_emulated_op(op, ins, attrs))
            assert np.array_equal(expected.view(np.uint8), actual.astype(expected.dtype).view(np.uint8)), \
                (red, dtype)


def test_lanes():
    assert [ck.lanes(10, k) for k in (0, 10, 11, 80, 10**6)] == [1, 1, 2, 8, 32]
    assert [ck.lanes(10, k, 4) for k in (0, 40, 41, 80, 10**6)] == [1, 1, 2, 2, 32]


def test_gather_nd_chunks():
    """16-byte chunks only where a slice is whole chunks: rows of 16 float32 take 4 a thread,
    rows of 6 float32 or of 3 int16 one element a thread."""
    assert [ck.gather_nd_chunk(4, S) for S in (16, 4, 6, 1)] == [4, 4, 1, 1]
    assert [ck.gather_nd_chunk(1, 32), ck.gather_nd_chunk(2, 3), ck.gather_nd_chunk(8, 2)] == [16, 1, 2]
    pl = ck.plan_gather_nd(mx.zeros((5, 16)), mx.zeros((7, 1), mx.int64), 0)
    assert dict(pl["templates"])["V"] == 4 and pl["grid"][0] >= 7 * 16 // 4
    assert not ck.available() or mx.default_device().type == mx.gpu


def test_params_arrays_are_made_once_per_parameter_vector(monkeypatch):
    monkeypatch.setattr(ck, "_params", {})
    a = ck.params_array([3, 1, 4])
    assert ck.params_array([3, 1, 4]) is a and a.dtype == mx.int64 and a.tolist() == [3, 1, 4]
    assert ck.params_array([3, 1, 5]) is not a
    monkeypatch.setattr(ck, "PARAMS_CACHE", 2)
    ck.params_array([9])  # the cache is full: cleared, then this one kept
    assert list(ck._params) == [(9,)]


def test_inactive_without_cuda_or_when_disabled(monkeypatch):
    with mx.stream(mx.cpu):
        assert not ck.active()
    monkeypatch.setenv(ck.ENV, "0")
    assert not ck.active()


def test_forced_overrides_the_switch_and_nests(monkeypatch):
    monkeypatch.setenv(ck.ENV, "0")
    monkeypatch.setattr(ck, "available", lambda: True)
    with mx.stream(mx.gpu if mx.is_available(mx.gpu) else mx.cpu):
        on_gpu = mx.default_device().type == mx.gpu
        assert not ck.active()
        with ck.forced():
            with ck.forced():
                assert ck.active() == on_gpu and ck._forced
            assert ck.active() == on_gpu and ck._forced
        assert not ck.active() and not ck._forced


def test_validate_entry_points_wrap_the_custom_kernels():
    """cuda_validate's ``*_kernel`` functions: one per op of VALIDATE, with the signature of the
    custom.py kernel they force onto CUDA; without a CUDA GPU they say so."""
    for op, name in cuda_validate.VALIDATE.items():
        fn = getattr(cuda_validate, name)
        builtin = getattr(custom, name.removesuffix("_kernel"))
        assert list(inspect.signature(fn).parameters) == list(inspect.signature(builtin).parameters), op
        assert backends.get_backend("mlx").kernels[op].fn is builtin
    if not ck.available():
        with pytest.raises(UnsupportedError, match="needs MLX's CUDA build"):
            cuda_validate.mat_vec_kernel(*[to_mlx(x, d) for x, d in (
                (np.ones(1, np.float32), "float32"), (np.zeros(1, np.int32), "int32"),
                (np.array([0, 1], np.int32), "int32"), (np.ones(1, np.float32), "float32"))])


# CUDA types of the dtypes used below, as MLX's dtype_to_cuda_type spells them
_CUDA_TYPES = {"float32": "float", "int64": "int64_t", "int32": "int32_t", "uint8": "uint8_t",
               "uint64": "uint64_t", "int8": "int8_t", "int16": "int16_t"}
# kernel -> (inputs' dtypes, outputs' dtypes, templates): each kernel once, the index widths and
# KINDs varied across them
_NVCC = {
    "gather_elements": (["float32", "int64"], ["float32"],
                        [("T", "float32"), ("I", "int64"), ("IDX", "int32")]),
    "gather_nd": (["float32", "int64"], ["float32"],
                  [("T", "float32"), ("I", "int64"), ("V", 4), ("IDX", "int64")]),
    "scatter_link": (["int64"], ["int64", "int64"], [("I", "int64"), ("IDX", "int64"), ("KIND", 1)]),
    "scatter_walk": (["float32", "float32", "int32", "int32"], ["float32", "int32"],
                     [("T", "float32"), ("U", "float32"), ("IDX", "int32"), ("RUN", 16)]),
    "spmv": (["float32", "int32", "int32", "float32"], ["float32"],
             [("T", "float32"), ("C", "int32"), ("R", "int32"), ("X", "float32"), ("L", 8),
              ("E", 4), ("IDX", "int32")]),
    "values_grad": (["int32", "int32", "float32", "float32"], ["float32"],
                    [("T", "float32"), ("V", "float32"), ("C", "int32"), ("R", "int32"), ("L", 4),
                     ("IDX", "int64")]),
}


def test_sources_compile_with_nvcc(tmp_path):
    """Every kernel source, wrapped as MLX's build_kernel wraps it (the header, a __global__
    signature of const inputs then outputs, the template arguments as constants), compiles with
    nvcc for sm_90: the GPU is not needed to catch a typo or a type error in a kernel body."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc here")
    assert set(_NVCC) == set(ck.SOURCES) == set(ck.SIGNATURES)
    src = ["#include <cstdint>", "#include <cuda_fp16.h>", ck.HEADER,
           "namespace mlx { namespace core { namespace cu {"]
    for name, (ins, outs, tpl) in _NVCC.items():
        in_names, out_names = ck.SIGNATURES[name]
        assert len(in_names) == len(ins) + 1 and len(out_names) == len(outs), name  # + p
        args = [f"const {_CUDA_TYPES[d]}* {n}" for n, d in zip(in_names, ins)] + ["const int64_t* p"]
        args += [f"{_CUDA_TYPES[d]}* {n}" for n, d in zip(out_names, outs)]
        consts = [f"constexpr int {k} = {v};" if isinstance(v, int) else f"using {k} = {_CUDA_TYPES[v]};"
                  for k, v in tpl]
        src += [f"__global__ void k_{name}({', '.join(args)}) {{", *consts, ck.SOURCES[name], "}"]
    src.append("}}}")
    (tmp_path / "k.cu").write_text("\n".join(src))
    r = subprocess.run([nvcc, "-arch=sm_90", "-c", "-o", str(tmp_path / "k.o"), str(tmp_path / "k.cu")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


# -- the scatter kernels' CUDA source, run on the host --------------------------------------------
# The numpy emulation above checks the plans; this checks the kernel bodies themselves. Both
# scatter kernels are compiled as host C++ (``__device__`` dropped, ``atomicExch`` a plain
# exchange, the thread indices globals), ``scatter_link``'s threads called one at a time in a
# shuffled order (the order the atomics may run in) and ``scatter_walk``'s cells in one
# grid-stride loop: the result must be the reference's bits. A C++ compiler is all it needs.
_HOST_BASE = r"""
#include <cstdint>
#define __device__
#define __forceinline__ inline
struct rlx_dim3 { unsigned x; };
template <class U> static U __ldcs(const U* p) { return *p; }  // a cache hint: a plain load here
"""
_HOST_PRELUDE = _HOST_BASE + r"""
static rlx_dim3 gridDim{1}, blockDim{1}, blockIdx{0}, threadIdx{0};
static int atomicExch(int* a, int v) { int o = *a; *a = v; return o; }
static unsigned long long atomicExch(unsigned long long* a, unsigned long long v) {
  unsigned long long o = *a; *a = v; return o;
}
"""


def _host_body(name: str, templates, source: str | None = None) -> str:
    """The kernel ``name`` as a host function ``k_<name>`` (its signature as SIGNATURES says,
    every array a pointer to its template type or IDX; ``p`` int64)."""
    tpl = dict(templates)
    ins, outs = ck.SIGNATURES[name]
    elem = {"idx": "I", "data": "T", "upd": "T"}  # every other array is of IDX
    args = [f"const {elem.get(n, 'IDX')}* {n}" for n in ins if n != "p"] + ["const int64_t* p"]
    args += [f"{'T' if n == 'out' else 'IDX'}* {n}" for n in outs]
    consts = [f"constexpr int {k} = {v};" if isinstance(v, int) else
              f"using {k} = {_CUDA_TYPES[v]};" for k, v in tpl.items()]
    return "\n".join([f"static void k_{name}({', '.join(args)}) {{", *consts,
                      source if source is not None else ck.SOURCES[name], "}"])


def _host_library(tmp_path, src: str, flags: tuple[str, ...] = ()):
    """``src`` (C++) built with ``flags`` as a shared library under tmp_path, once per distinct
    source, and loaded; skips the test where no C++ compiler is installed."""
    import ctypes
    import hashlib
    import shutil
    import subprocess

    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler here")
    name = f"host_{hashlib.sha256(' '.join([src, *flags]).encode()).hexdigest()[:12]}"
    lib = tmp_path / f"{name}.so"
    if not lib.exists():
        (tmp_path / f"{name}.cpp").write_text(src)
        r = subprocess.run([cxx, "-std=c++17", "-O1", "-shared", "-fPIC", *flags, "-o", str(lib),
                            str(tmp_path / f"{name}.cpp")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    return ctypes.CDLL(str(lib))


def _host_scatter(tmp_path, link_tpl, walk_tpl, walk_source=None):
    """Build the two kernels for these templates; returns run(data, idx, upd, link_params,
    walk_params, order) -> out."""
    import ctypes

    lt, wt = dict(link_tpl), dict(walk_tpl)
    src = "\n".join([
        _HOST_PRELUDE, ck.HEADER,
        "namespace link_ns {", *[f"using {k} = {_CUDA_TYPES[v]};" for k, v in lt.items() if k in ("I", "IDX")],
        _host_body("scatter_link", [(k, v) for k, v in lt.items() if k == "KIND"]), "}",
        "namespace walk_ns {", *[f"using {k} = {_CUDA_TYPES[v]};" for k, v in wt.items() if k in ("T", "IDX")],
        _host_body("scatter_walk", [(k, v) for k, v in wt.items() if k in ("U", "RUN")], walk_source), "}",
        'extern "C" void run_link(const void* idx, const int64_t* p, void* head, void* next,',
        "                         const int64_t* order, int64_t M) {",
        "  using namespace link_ns;",
        "  gridDim.x = (unsigned)M; blockDim.x = 1; threadIdx.x = 0;",
        "  for (int64_t j = 0; j < M; ++j) {  // one thread at a time, in the given order",
        "    blockIdx.x = (unsigned)order[j];",
        "    k_scatter_link((const I*)idx, p, (IDX*)head, (IDX*)next);",
        "  }",
        "}",
        'extern "C" void run_walk(const void* data, const void* upd, const void* head, const void* next,',
        "                         const int64_t* p, void* out, void* link) {",
        "  using namespace walk_ns;",
        "  gridDim.x = 1; blockDim.x = 1; blockIdx.x = 0; threadIdx.x = 0;",
        "  k_scatter_walk((const T*)data, (const T*)upd, (const IDX*)head, (const IDX*)next, p,",
        "                 (T*)out, (IDX*)link);",
        "}"])
    so = _host_library(tmp_path, src)
    ptr = ctypes.c_void_p

    def run(data, idx, upd, link_params, walk_params, order):
        N, M = data.size, upd.size
        i = np.dtype(lt["IDX"])
        head, nxt = np.zeros(N, i), np.zeros(M, i)
        lp, wp = np.asarray(link_params, np.int64), np.asarray(walk_params, np.int64)
        order = np.ascontiguousarray(order, np.int64)
        data, idx, upd = (np.ascontiguousarray(a) for a in (data, idx, upd))
        so.run_link(ptr(idx.ctypes.data), ptr(lp.ctypes.data), ptr(head.ctypes.data),
                    ptr(nxt.ctypes.data), ptr(order.ctypes.data), ctypes.c_int64(M))
        out, link = np.empty_like(data), np.zeros(M, i)
        so.run_walk(ptr(data.ctypes.data), ptr(upd.ctypes.data), ptr(head.ctypes.data),
                    ptr(nxt.ctypes.data), ptr(wp.ctypes.data), ptr(out.ctypes.data), ptr(link.ctypes.data))
        return out
    return run


def _host_scatter_case(tmp_path, op, ins, attrs, walk_source=None, seed=0, idx_type=None):
    """The op through the host-compiled kernels, the link kernel's threads in a shuffled order;
    ``idx_type`` replaces the plans' IDX (int64: the path of sizes past 2^30)."""
    a = [to_mlx(x, dt.name_of(x.dtype)) for x in ins]
    data, upd = a[0], a[2].reshape(-1)
    idx, ax = (a[1], attrs["axis"] % a[0].ndim) if op == "onnx.ScatterElements" else \
        (a[1].reshape(-1, a[1].shape[-1]), None)
    lk = ck.plan_scatter_link(data, idx, ax, upd.size)
    i = mx.zeros((1,), getattr(mx, lk["out_dtype"]))
    wk = ck.plan_scatter_walk(data, upd, i, i, attrs["reduction"])
    lt, wt = ([(k, idx_type if k == "IDX" and idx_type else v) for k, v in pl["templates"]] for pl in (lk, wk))
    run = _host_scatter(tmp_path, lt, wt, walk_source)
    order = np.random.default_rng(seed).permutation(upd.size)
    out = run(ins[0].reshape(-1), _np(idx).reshape(-1), ins[2].reshape(-1), lk["params"], wk["params"], order)
    return out.reshape(ins[0].shape)


@pytest.mark.parametrize("op", ["onnx.ScatterElements", "onnx.ScatterND"])
def test_scatter_sources_run_on_the_host(op, tmp_path):
    """The CUDA source of both scatter kernels, run on the host with the exchanges in shuffled
    orders: every reduction, float32 and int64, cells of 0 to thousands of updates (the register
    sort and the list's merge sort), 32- and 64-bit index arithmetic (the
    atomics' two overloads): the reference's bits exactly."""
    rng = np.random.default_rng(11)
    for m in (1, 7, 60, 3000):  # 3m updates into 120 cells: 0.025 to 75 a cell
        for red in ("none", "add", "mul", "max", "min"):
            for dtype in (np.float32, np.int64):
                ins, attrs = _dup_inputs(rng, op, red, dtype, m)
                (expected,) = CPU.run(op, [x.copy() for x in ins], attrs)
                for seed, idx_type in ((0, None), (1, None), (2, "int64")):
                    got = _host_scatter_case(tmp_path, op, ins, attrs, seed=seed, idx_type=idx_type)
                    assert np.array_equal(expected.view(np.uint8), got.view(np.uint8)), \
                        (m, red, dtype, seed, idx_type)


@pytest.mark.parametrize("mutation", ["short lists unsorted", "short lists ascending", "long lists unsorted"])
def test_a_wrong_walk_is_caught_on_the_host(mutation, tmp_path):
    """Deliberately wrong walks (the order of a cell's updates lost, in registers or in the
    list's merge sort): the host run of the previous test must reject each."""
    src = ck.SOURCES["scatter_walk"]
    wrong = {
        "short lists unsorted": ("loc[j - 1] < e", "false && loc[j - 1] < e"),
        "long lists unsorted": ("rlx_list_sort(link, h)", "h"),
        "short lists ascending": ("loc[j - 1] < e", "loc[j - 1] > e"),
    }[mutation]
    for old, new in zip(wrong[::2], wrong[1::2]):
        assert old in src
        src = src.replace(old, new)
    if mutation == "long lists unsorted":  # the unsorted walk must follow next, not link
        src = src.replace("x != 0; x = link[x - 1]) {", "x != 0; x = next[x - 1]) {")
    rng = np.random.default_rng(5)
    m = 3000 if mutation == "long lists unsorted" else 200
    ins, attrs = _dup_inputs(rng, "onnx.ScatterElements", "add", np.float32, m, cells=40 if m > 200 else 300)
    (expected,) = CPU.run("onnx.ScatterElements", [x.copy() for x in ins], attrs)
    assert np.array_equal(expected, _host_scatter_case(tmp_path, "onnx.ScatterElements", ins, attrs))
    got = _host_scatter_case(tmp_path, "onnx.ScatterElements", ins, attrs, walk_source=src)
    assert not np.array_equal(expected.view(np.uint8), got.view(np.uint8))


def _host_gather_nd(tmp_path, templates, source=None):
    """gather_nd's source built for these templates; returns run(data, idx, params, threads,
    shift) -> out, every thread run in turn (blockDim 1), data and out ``shift`` elements into
    their buffers (1: not 16-byte aligned, the element path)."""
    import ctypes

    tpl = dict(templates)
    src = "\n".join([
        _HOST_PRELUDE, "struct uint4 { unsigned x, y, z, w; };", ck.HEADER,
        *[f"using {k} = {_CUDA_TYPES[v]};" for k, v in tpl.items() if k in ("T", "I", "IDX")],
        _host_body("gather_nd", [(k, v) for k, v in tpl.items() if k == "V"], source),
        'extern "C" void run(const void* data, const void* idx, const int64_t* p, void* out, int64_t threads) {',
        "  gridDim.x = (unsigned)threads; blockDim.x = 1; threadIdx.x = 0;",
        "  for (int64_t t = 0; t < threads; ++t) {",
        "    blockIdx.x = (unsigned)t;",
        "    k_gather_nd((const T*)data, (const I*)idx, p, (T*)out);",
        "  }",
        "}"])
    so = _host_library(tmp_path, src)
    ptr = ctypes.c_void_p

    def run(data, idx, params, threads, out_size, shift):
        # 64-byte aligned buffers (numpy's are 16), the arrays at element ``shift``
        def placed(a, n):
            raw = np.zeros(n * a.itemsize + 128, np.uint8)
            at = (-raw.ctypes.data) % 64 + shift * a.itemsize
            v = raw[at:at + n * a.itemsize].view(a.dtype)
            v[:a.size] = a.reshape(-1)
            return v
        d, o = placed(data, data.size), placed(np.zeros(out_size, data.dtype), out_size)
        i, pp = np.ascontiguousarray(idx.reshape(-1)), np.asarray(params, np.int64)
        so.run(ptr(d.ctypes.data), ptr(i.ctypes.data), ptr(pp.ctypes.data), ptr(o.ctypes.data),
               ctypes.c_int64(threads))
        return o.copy()
    return run


def _gather_nd_host_cases():
    """GatherND inputs: rows of 16 float32 (4 a chunk), 6 float32 (no chunks), 32 int8, 24 int16
    and 4 int64 (16, 8 and 2 a chunk), batch_dims 0 and 1."""
    rng = np.random.default_rng(17)
    for shape, dtype, b in (((9, 16), np.float32, 0), ((9, 6), np.float32, 0), ((5, 3, 32), np.int8, 0),
                            ((4, 3, 8), np.int16, 0), ((2, 7, 4), np.int64, 1), ((3, 4, 8), np.float32, 1)):
        data = (rng.standard_normal(shape) * 100).astype(dtype)
        idx = rng.integers(-shape[b], shape[b], (*shape[:b], 5, 1))
        yield data, idx, b


def _gather_nd_host(tmp_path, data, idx, b, shift, source=None):
    pl = ck.plan_gather_nd(to_mlx(data, dt.name_of(data.dtype)), mx.array(idx), b)
    run = _host_gather_nd(tmp_path, pl["templates"], source)
    out = run(data, idx, pl["params"], pl["grid"][0], int(np.prod(pl["out_shape"])), shift)
    return out.reshape(pl["out_shape"]), dict(pl["templates"])["V"]


def test_gather_nd_source_runs_on_the_host(tmp_path):
    """gather_nd's CUDA source on the host: the 16-byte chunk path where the buffers are aligned
    and the slices whole chunks, the element path where they are not (the same plan: fewer
    threads, a grid-stride loop), both the reference's bits."""
    chunked = 0
    for data, idx, b in _gather_nd_host_cases():
        (expected,) = CPU.run("onnx.GatherND", [data, idx], {"batch_dims": b})
        for shift in (0, 1):
            got, V = _gather_nd_host(tmp_path, data, idx, b, shift)
            assert np.array_equal(expected.view(np.uint8), got.view(np.uint8)), (data.shape, b, shift)
        chunked += V > 1
    assert chunked == 5


def test_a_wrong_chunk_offset_is_caught_on_the_host(tmp_path):
    """A chunk path that forgets the chunk's place in its slice must fail the test above."""
    src = ck.SOURCES["gather_nd"]
    assert "(e % Sv) * V" in src
    wrong = src.replace("(e % Sv) * V", "(e % Sv)")
    data, idx, b = next(_gather_nd_host_cases())
    (expected,) = CPU.run("onnx.GatherND", [data, idx], {"batch_dims": b})
    assert np.array_equal(expected, _gather_nd_host(tmp_path, data, idx, b, 0)[0])
    assert not np.array_equal(expected, _gather_nd_host(tmp_path, data, idx, b, 0, wrong)[0])
    assert np.array_equal(expected, _gather_nd_host(tmp_path, data, idx, b, 1, wrong)[0])  # element path


def _gather_elements_host(tmp_path, data, idx, ax, source=None):
    """GatherElements through its CUDA source compiled as host C++ (one thread, the grid-stride
    loop covering every element)."""
    import ctypes

    pl = ck.plan_gather_elements(to_mlx(data, dt.name_of(data.dtype)), mx.array(idx), ax)
    tpl = dict(pl["templates"])
    src = "\n".join([
        _HOST_PRELUDE, ck.HEADER, *[f"using {k} = {_CUDA_TYPES[v]};" for k, v in tpl.items()],
        _host_body("gather_elements", [], source),
        'extern "C" void run(const void* data, const void* idx, const int64_t* p, void* out) {',
        "  k_gather_elements((const T*)data, (const I*)idx, p, (T*)out);",
        "}"])
    so = _host_library(tmp_path, src)
    out = np.zeros(pl["out_shape"], data.dtype)
    d, i, pp = (np.ascontiguousarray(a) for a in (data, idx, np.asarray(pl["params"], np.int64)))
    so.run(*(ctypes.c_void_p(a.ctypes.data) for a in (d, i, pp, out)))
    return out


def _gather_elements_host_cases():
    rng = np.random.default_rng(23)
    for shape, ishape, dtype in (((50,), (80,), np.float32), ((4, 5, 6), (3, 5, 2), np.float32),
                                 ((4, 5, 6), (4, 2, 6), np.int64), ((7, 3), (9, 3), np.int32)):
        data = (rng.standard_normal(shape) * 100).astype(dtype)
        for ax in range(len(shape)):
            if any(ishape[d] > shape[d] for d in range(len(shape)) if d != ax):
                continue
            yield data, rng.integers(-shape[ax], shape[ax], ishape), ax


def test_gather_elements_source_runs_on_the_host(tmp_path):
    """gather_elements' CUDA source (the take of rank 1 and the coordinate path, the index
    loads behind ``__ldcs``) on the host, negative indices included: the reference's bits."""
    n = 0
    for data, idx, ax in _gather_elements_host_cases():
        (expected,) = CPU.run("onnx.GatherElements", [data, idx], {"axis": ax})
        got = _gather_elements_host(tmp_path, data, idx, ax)
        assert np.array_equal(expected.view(np.uint8), got.view(np.uint8)), (data.shape, idx.shape, ax)
        n += 1
    assert n >= 6


@pytest.mark.parametrize("mutation", [("(rlx_i64)__ldcs(&idx[e]), s)]", "(rlx_i64)__ldcs(&idx[e]) + 1, s)]"),
                                      ("(d == ax ?", "(d != ax ?")])
def test_a_wrong_gather_elements_is_caught_on_the_host(mutation, tmp_path):
    """The take (rank 1) off by one (still clamped into range), or the coordinate path using the
    index on every axis but the gathered one."""
    src = ck.SOURCES["gather_elements"]
    assert mutation[0] in src
    wrong = src.replace(mutation[0], mutation[1])
    bad = 0
    for data, idx, ax in _gather_elements_host_cases():
        (expected,) = CPU.run("onnx.GatherElements", [data, idx], {"axis": ax})
        bad += not np.array_equal(expected, _gather_elements_host(tmp_path, data, idx, ax, wrong))
    assert bad


# spmv's lanes talk through __shfl_down_sync, so its host run gives each lane of a row a thread
# (the thread indices thread_local) and the shuffle a slot array and a barrier per row.
_HOST_WARP_PRELUDE = _HOST_BASE + r"""
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
static thread_local rlx_dim3 blockIdx{0}, threadIdx{0};
static rlx_dim3 gridDim{1}, blockDim{1};
struct rlx_warp {
  std::mutex m; std::condition_variable cv; int width, arrived = 0; long gen = 0;
  std::vector<double> slot;
  explicit rlx_warp(int w) : width(w), slot(w) {}
  void wait() {
    std::unique_lock<std::mutex> lk(m);
    long g = gen;
    if (++arrived == width) { arrived = 0; ++gen; cv.notify_all(); }
    else cv.wait(lk, [&] { return gen != g; });
  }
};
static thread_local rlx_warp* rlx_my_warp = nullptr;
static double __shfl_down_sync(unsigned, double v, int delta, int width) {
  rlx_warp& w = *rlx_my_warp;
  const int lane = (int)threadIdx.x % width;
  w.slot[lane] = v;
  w.wait();
  const double r = lane + delta < width ? w.slot[lane + delta] : v;
  w.wait();
  return r;
}
"""


def _host_spmv(tmp_path, templates, source=None):
    """spmv's source built for these templates; run(values, col, rp, x, params, L) -> y, a row's
    L lanes as threads (blockDim L, a block a row)."""
    import ctypes

    tpl = dict(templates)
    types = {k: _CUDA_TYPES[v] for k, v in tpl.items() if isinstance(v, str)}
    consts = [f"constexpr int {k} = {v};" for k, v in tpl.items() if isinstance(v, int)]
    src = "\n".join([
        _HOST_WARP_PRELUDE, *[f"using {k} = {t};" for k, t in types.items()],
        "static void k_spmv(const T* values, const C* col, const R* rp, const X* x, const int64_t* p, T* y) {",
        *consts, source if source is not None else ck.SOURCES["spmv"], "}",
        'extern "C" void run(const void* values, const void* col, const void* rp, const void* x,',
        "                    const int64_t* p, void* y, int64_t n) {",
        f"  const int L = {tpl['L']};",
        "  blockDim.x = (unsigned)L; gridDim.x = (unsigned)n;",
        "  for (int64_t row = 0; row < n; ++row) {",
        "    rlx_warp w(L);",
        "    std::vector<std::thread> lanes;",
        "    for (int lane = 0; lane < L; ++lane) lanes.emplace_back([&, lane] {",
        "      blockIdx.x = (unsigned)row; threadIdx.x = (unsigned)lane; rlx_my_warp = &w;",
        "      k_spmv((const T*)values, (const C*)col, (const R*)rp, (const X*)x, p, (T*)y);",
        "    });",
        "    for (auto& t : lanes) t.join();",
        "  }",
        "}"])
    so = _host_library(tmp_path, src, ("-pthread",))
    ptr = ctypes.c_void_p

    def run(values, col, rp, x, params):
        n = rp.size - 1
        y = np.zeros(n, values.dtype)
        arrs = [np.ascontiguousarray(a) for a in (values, col, rp, x)]
        pp = np.asarray(params, np.int64)
        so.run(*[ptr(a.ctypes.data) for a in arrs], ptr(pp.ctypes.data), ptr(y.ctypes.data), ctypes.c_int64(n))
        return y
    return run


def _spmv_host_cases():
    """CSR matrices whose rows cover 0, 1, fewer than, exactly and more than L * E entries, at
    mean row lengths that choose L = 1, 2, 8, 16 and 32 (E = 4); plus out-of-range columns."""
    rng = np.random.default_rng(23)
    for lengths in ([0, 1, 3, 4, 5, 9, 2], [7, 8, 9, 0, 16, 1, 12], [20, 17, 31, 0, 33, 9],
                    [40, 33, 31, 64, 0, 29], [300, 129, 128, 0, 257]):
        rp = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        nnz, ncols = int(rp[-1]), 50
        col = rng.integers(-2, ncols + 2, nnz).astype(np.int32)  # a few out of range: clamped
        yield (rng.standard_normal(nnz).astype(np.float32), col, rp,
               rng.standard_normal(ncols).astype(np.float32))


def test_spmv_source_runs_on_the_host(tmp_path):
    """spmv's CUDA source on the host, each lane a thread and the shuffles through a barrier: the
    numpy emulation's sums (each lane's entries in order, then the shuffle tree) bit for bit, for
    rows that end inside, at and past a step of E entries, and L from 1 to 32."""
    seen = set()
    for values, col, rp, x in _spmv_host_cases():
        pl = ck.plan_spmv(*(mx.array(a) for a in (values, col, rp, x)))
        seen.add(dict(pl["templates"])["L"])
        expected = _emulate({**pl, "inputs": [values, col, rp, x]})
        got = _host_spmv(tmp_path, pl["templates"])(values, col, rp, x, pl["params"])
        assert np.array_equal(expected.view(np.uint32), got.view(np.uint32)), dict(pl["templates"])
    assert seen == {1, 2, 8, 16, 32}


@pytest.mark.parametrize("mutation", ["batch skips an entry", "no tail", "tail from the row's start"])
def test_a_wrong_spmv_is_caught_on_the_host(mutation, tmp_path):
    """Deliberately wrong spmv bodies (the step of E entries or the remainder after it lost):
    the host run of the previous test must reject each."""
    src = ck.SOURCES["spmv"]
    old, new = {
        "batch skips an entry": ("j += E * L)", "j += (E + 1) * L)"),
        "no tail": ("for (; j < b; j += L)", "for (; j < b && false; j += L)"),
        "tail from the row's start": ("for (; j < b; j += L)", "for (j = a + lane; j < b; j += L)"),
    }[mutation]
    assert old in src
    wrong = src.replace(old, new)
    caught = False
    for values, col, rp, x in _spmv_host_cases():
        pl = ck.plan_spmv(*(mx.array(a) for a in (values, col, rp, x)))
        expected = _emulate({**pl, "inputs": [values, col, rp, x]})
        got = _host_spmv(tmp_path, pl["templates"], wrong)(values, col, rp, x, pl["params"])
        caught |= not np.array_equal(expected.view(np.uint32), got.view(np.uint32))
    assert caught


@pytest.mark.parametrize("op", ["onnx.ScatterElements", "onnx.ScatterND"])
def test_the_packed_scatter_experiment_runs_on_the_host(op, tmp_path):
    """benchmarks/bench_scatter_packed.py's kernels (link and value in one record; an experiment
    the benchmark README reports, not shipped) compiled and run on the host as the shipped ones
    above: the reference's bits for short and long lists, float32 add, so that the benchmark
    measures a right variant."""
    import ctypes

    from benchmark_scripts import load

    xp = load("bench_scatter_packed")
    kind = 0 if op == "onnx.ScatterElements" else 1
    src = "\n".join([
        _HOST_PRELUDE, ck.HEADER,
        f"using I = int64_t; using IDX = int32_t; using T = float; using U = float; "
        f"constexpr int KIND = {kind}; constexpr int RUN = {ck.RUN};",
        "static void k_link(const I* idx, const T* upd, const int64_t* p, IDX* head, uint64_t* rec) {",
        xp.LINK, "}",
        "static void k_walk(const T* data, const IDX* head, const uint64_t* rec, const int64_t* p, T* out,",
        "                   IDX* link) {", xp.WALK, "}",
        'extern "C" void run(const I* idx, const T* upd, const int64_t* lp, IDX* head, uint64_t* rec,',
        "                    const int64_t* order, int64_t M, const T* data, const int64_t* wp, T* out,",
        "                    IDX* link) {",
        "  gridDim.x = (unsigned)M; blockDim.x = 1; threadIdx.x = 0;",
        "  for (int64_t j = 0; j < M; ++j) { blockIdx.x = (unsigned)order[j]; k_link(idx, upd, lp, head, rec); }",
        "  gridDim.x = 1; blockIdx.x = 0;",
        "  k_walk(data, head, rec, wp, out, link);",
        "}"])
    so = _host_library(tmp_path, src)
    rng = np.random.default_rng(13)
    for m in (7, 60, 3000):  # 3m updates into 120 cells: the register sort and the merge sort
        ins, attrs = _dup_inputs(rng, op, "add", np.float32, m)
        (expected,) = CPU.run(op, [x.copy() for x in ins], attrs)
        data, idx, upd = (np.ascontiguousarray(x) for x in ins)
        flat = idx.reshape(-1, idx.shape[-1]) if kind else idx
        M, N = upd.size, data.size
        _, lp = ck.scatter_target_params(mx.array(data), mx.array(flat), 0 if kind == 0 else None, M)
        lp, wp = np.asarray(lp, np.int64), np.array([N, M, ck.REDUCTIONS["add"]], np.int64)
        head, rec = np.zeros(N, np.int32), np.zeros(M, np.uint64)
        out, link = np.empty(N, np.float32), np.zeros(M, np.int32)
        order = rng.permutation(M).astype(np.int64)
        idx64 = np.ascontiguousarray(flat, np.int64)
        so.run(*[ctypes.c_void_p(a.ctypes.data) for a in (idx64, upd, lp, head, rec, order)], ctypes.c_int64(M),
               *[ctypes.c_void_p(a.ctypes.data) for a in (data, wp, out, link)])
        assert np.array_equal(expected.reshape(-1).view(np.uint32), out.view(np.uint32)), m


# -- on MLX's CUDA build -------------------------------------------------------------------------
@on_cuda
@pytest.mark.parametrize("mode", ["eager", "lazy", "compiled"])
@pytest.mark.parametrize("op", OPS)
def test_cuda_kernels_match_the_reference_on_the_gpu(op, mode):
    mlx = backends.get_backend("mlx")
    bad = []
    for case in _cases(op):
        inputs = matrix.make_inputs(case)
        try:
            expected = CPU.run(op, [x.copy() for x in inputs], case.attr_dict)
        except Exception:  # noqa: BLE001
            continue
        actual = mlx.run(op, [x.copy() for x in inputs], case.attr_dict, "gpu", mode)
        ok, msg = _judge(case, inputs, expected, actual)
        if not ok and "NaN" not in msg:
            bad.append(f"{case.id}: {msg}")
    assert not bad, "\n".join(bad[:10])


@on_cuda
@pytest.mark.parametrize("op", ["onnx.ScatterElements", "onnx.ScatterND", "rlx_sparse.mat_vec"])
def test_cuda_kernels_are_bit_stable(op):
    """Scatter-add with many duplicates (~3,000 a cell: the walk's merge sort) and a long-row
    SpMV: three runs, identical bits."""
    mlx = backends.get_backend("mlx")
    rng = np.random.default_rng(0)
    if op == "rlx_sparse.mat_vec":
        n, per = 2000, 300
        rp = np.arange(0, n * per + 1, per, dtype=np.int32)
        ins = [rng.standard_normal(n * per).astype(np.float32),
               rng.integers(0, n, n * per).astype(np.int32), rp,
               rng.standard_normal(n).astype(np.float32)]
        attrs = {}
    elif op == "onnx.ScatterElements":
        m = 200_000
        ins = [rng.standard_normal(64).astype(np.float32), rng.integers(0, 64, m),
               rng.standard_normal(m).astype(np.float32)]
        attrs = {"axis": 0, "reduction": "add"}
    else:
        m = 200_000
        ins = [rng.standard_normal((64, 3)).astype(np.float32), rng.integers(0, 64, (m, 1)),
               rng.standard_normal((m, 3)).astype(np.float32)]
        attrs = {"reduction": "add"}
    runs = [mlx.run(op, [x.copy() for x in ins], attrs, "gpu", "lazy")[0] for _ in range(3)]
    assert all(np.array_equal(runs[0].view(np.uint32), r.view(np.uint32)) for r in runs[1:])
    if op != "rlx_sparse.mat_vec":  # and applied in update order: the reference's bits exactly
        (expected,) = CPU.run(op, [x.copy() for x in ins], attrs)
        assert np.array_equal(expected.view(np.uint32), runs[0].view(np.uint32))


# -- GPU placement and TF32 variants (harness side of issue 8) -------------------------------------
def test_only_cpu_stream_kernels_name_the_cpu_stream():
    """On device gpu every MLX kernel runs on the GPU stream Backend.run enters, except float64
    and kernels registered cpu_stream=True (the result records stream "cpu"): a kernel that
    names mx.cpu itself must be registered so."""
    mlx = backends.get_backend("mlx")
    for op, e in mlx.kernels.items():
        if e.native and "mx.cpu" in inspect.getsource(e.fn):
            assert e.options.get("cpu_stream"), f"{op} uses mx.cpu but is not registered cpu_stream=True"


def test_tf32_variants_and_ids():
    from rlx_conformance.generate.matrix import Target
    from rlx_conformance.run.runner import _variant_groups
    from rlx_conformance.run.session import build_cases, find_case

    mlx = backends.get_backend("mlx")
    assert mlx.variants("mat_mul", "float32", "gpu", "both") == ["tf32:on", "tf32:off"]
    assert mlx.variants("mat_mul", "bfloat16", "gpu", "off") == ["tf32:off"]
    assert mlx.variants("mat_mul", "float64", "gpu", "both") == [""]
    assert mlx.variants("mat_mul", "float32", "cpu", "both") == [""]
    assert mlx.variants("exp", "float32", "gpu", "both") == [""]
    t = Target.parse("mlx-gpu-lazy-tf32:off")
    assert (t.variant, str(t)) == ("tf32:off", "mlx-gpu-lazy-tf32:off")
    cases = build_cases([Target("mlx", "gpu", "lazy")], ops=["mat_mul"], dtypes=["float*"], tf32="both")
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))  # unambiguous
    f32 = [c for c in cases if c.dtype == "float32"]
    assert {c.target.variant for c in f32} == {"tf32:on", "tf32:off"}
    assert all(c.target.variant == "" for c in cases if c.dtype == "float64")
    assert find_case(f32[1].id).id == f32[1].id
    groups = dict((tuple(sorted(env.items())), len(g)) for env, g in _variant_groups(cases))
    assert set(groups) == {(), (("MLX_ENABLE_TF32", "1"),), (("MLX_ENABLE_TF32", "0"),)}


def test_static_plans_are_made_once_per_shapes_dtypes_and_attributes(monkeypatch):
    """A plan's static part is cached (the host path of a 10^6-element gather was half of its
    call): the same shapes, dtypes and attributes share it, each call keeps its own inputs, and
    anything the static part depends on (here a scatter's data shape, which is not among the
    link kernel's inputs) separates the entries."""
    monkeypatch.setattr(ck, "_plans", {})
    d1, d2 = mx.zeros((4, 5)), mx.ones((4, 5))
    i1, i2 = mx.zeros((3, 5), mx.int64), mx.ones((3, 5), mx.int64)
    a, b = ck.plan_gather_elements(d1, i1, 0), ck.plan_gather_elements(d2, i2, 0)
    assert a["call"] is b["call"] and a["inputs"] == [d1, i1] and b["inputs"] == [d2, i2]
    assert ck.plan_gather_elements(d1, i1, 1)["params"] != a["params"]
    assert ck.plan_gather_elements(d1.astype(mx.float16), i1, 0)["out_dtype"] == "float16"
    c4 = ck.plan_scatter_link(mx.zeros((4, 5)), i1, 0, 15)
    c6 = ck.plan_scatter_link(mx.zeros((6, 5)), i1, 0, 15)
    assert c4["out_shape"] == (20,) and c6["out_shape"] == (30,)
    monkeypatch.setattr(ck, "PLANS_CACHE", 1)
    ck.plan_gather_nd(d1, mx.zeros((2, 1), mx.int64), 0)  # the cache is full: cleared, then kept
    assert len(ck._plans) == 1
