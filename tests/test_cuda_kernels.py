"""The CUDA kernels of the custom ops (backends/mlx/cuda_kernels.py).

Without a CUDA GPU (CI, the development machines) the kernels' host side is still tested: every
``plan_*`` is executed by a numpy emulation of the kernel body it launches (the same params, the
same loops, mx.sort replaced by np.sort), on the matrix's own cases of each op, and the result
must equal the CPU reference bit for bit (mat_vec: within the op's own judge). On MLX's CUDA
build the real kernels run the same cases on the GPU, in every mode, against the reference, and
twice more to show the results are bit-identical run to run.
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
    i = np.where(i < 0, i + n, i)
    return np.clip(i, 0, n - 1)


def _np(a):
    return to_numpy(a)


def _emulate(pl):
    """Run a plan's kernel body in numpy (vectorised where the kernel's threads are independent)."""
    p = pl["params"]
    ins = [_np(a) if isinstance(a, mx.array) else a for a in pl["inputs"]]
    name = pl["name"]
    if name in ("gather_elements", "scatter_elements_keys"):
        r, ax, total, s = p[:4]
        ishape, dstride = p[4:4 + r], p[4 + r:4 + 2 * r]
        idx = ins[-1 if name == "gather_elements" else 0].reshape(-1).astype(np.int64)
        e = np.arange(total, dtype=np.int64)
        rem, off = e.copy(), np.zeros_like(e)
        for d in range(r - 1, -1, -1):
            q = rem % ishape[d]
            rem //= ishape[d]
            off += (_fix(idx, s) if d == ax else q) * dstride[d]
        if name == "gather_elements":
            return ins[0].reshape(-1)[off].reshape(pl["out_shape"])
        return (off * total + e).astype(pl["out_dtype"])
    if name == "gather_nd":
        total, J, k, S, bstride = p[:5]
        sizes, strides = p[5:5 + k], p[5 + k:5 + 2 * k]
        idx = ins[1].reshape(-1).astype(np.int64)
        e = np.arange(total, dtype=np.int64)
        t = e // S
        off = (t // J) * bstride + e % S
        for j in range(k):
            off += _fix(idx[t * k + j], sizes[j]) * strides[j]
        return ins[0].reshape(-1)[off].reshape(pl["out_shape"])
    if name == "scatter_nd_keys":
        M, k, S = p[:3]
        sizes, strides = p[3:3 + k], p[3 + k:3 + 2 * k]
        idx = ins[0].reshape(-1).astype(np.int64)
        m = np.arange(M, dtype=np.int64)
        q, t = m // S, m % S
        for j in range(k):
            t = t + _fix(idx[q * k + j], sizes[j]) * strides[j]
        return (t * M + m).astype(pl["out_dtype"])
    if name == "scatter_apply":
        N, M, red = p
        data, upd, keys = (x.reshape(-1) for x in ins)
        out = data.copy()
        with np.errstate(all="ignore"):
            for key in keys.astype(np.int64):  # sorted: by target, then update position
                i, m = divmod(int(key), M)
                a, u = out[i], upd[m]
                if red == 0:
                    out[i] = u
                elif red == 1:
                    out[i] = np.add(a, u, dtype=out.dtype)
                elif red == 2:
                    out[i] = np.multiply(a, u, dtype=out.dtype)
                elif red == 3:
                    out[i] = a if (a >= u or a != a) else u
                else:
                    out[i] = a if (a <= u or a != a) else u
        return out.reshape(pl["out_shape"])
    if name == "spmv":
        n, ncols, nnz = p
        values, col, rp, x = ins
        L = dict(pl["templates"])["L"]
        y = np.zeros(n, np.float64)
        for row in range(n):
            a, b = int(np.clip(rp[row], 0, nnz)), int(rp[row + 1])
            b = min(max(b, a), nnz)
            lanes = [sum(float(values[j]) * float(x[_fix(int(col[j]), ncols)])
                         for j in range(a + lane, b, L)) for lane in range(L)]
            while len(lanes) > 1:  # the shuffle tree: lane l += lane l + off
                half = len(lanes) // 2
                lanes = [lanes[i] + lanes[i + half] for i in range(half)]
            y[row] = lanes[0]
        return y.astype(pl["out_dtype"])
    if name == "values_grad":
        nnz, n, m = p
        col, rp, u, v = ins
        k = np.arange(nnz)
        row = _fix(np.searchsorted(rp.astype(np.int64), k, side="right") - 1, n)
        return u[row] * v[_fix(col.astype(np.int64), m)]
    raise KeyError(name)


def _emulated_op(op, inputs, attrs):
    """The CUDA path of the op, each launch emulated; inputs are numpy (compute dtypes)."""
    a = [to_mlx(x, dt.name_of(x.dtype)) for x in inputs]
    if op == "onnx.GatherElements":
        return _emulate(ck.plan_gather_elements(a[0], a[1], attrs["axis"] % a[0].ndim))
    if op == "onnx.GatherND":
        return _emulate(ck.plan_gather_nd(a[0], a[1], attrs["batch_dims"]))
    if op in ("onnx.ScatterElements", "onnx.ScatterND"):
        if op == "onnx.ScatterElements":
            keys = _emulate(ck.plan_scatter_elements_keys(a[0], a[1], attrs["axis"] % a[0].ndim))
        else:
            k = a[1].shape[-1]
            keys = _emulate(ck.plan_scatter_nd_keys(a[0], a[1].reshape(-1, k), a[2].size))
        skeys = mx.array(np.sort(keys))
        return _emulate(ck.plan_scatter_apply(a[0], a[2].reshape(-1), skeys, attrs["reduction"]))
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
    """The plans' params, grids and key encodings, executed in numpy, reproduce the reference."""
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


def test_key_dtype_and_lanes():
    assert ck.key_dtype(2**16, 2**14) == "int32" and ck.key_dtype(2**16, 2**15) == "int64"
    assert [ck.lanes(10, k) for k in (0, 10, 11, 80, 10**6)] == [1, 1, 2, 8, 32]
    assert not ck.available() or mx.default_device().type == mx.gpu


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
    """Scatter-add with many duplicates and a long-row SpMV: three runs, identical bits."""
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
