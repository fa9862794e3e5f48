"""Derivatives of the custom ops (issue 16, item 7) beyond what test_reference_derivatives.py
verifies for every op: where a scatter's derivative is undefined (reduction none with duplicate
targets), cg_solve's convention (the derivative of x* = A⁻¹ b, undefined where CG does not
converge), the consistency of rlx_sparse.values_grad with mat_vec's VJP with respect to the
values (on the reference and on MLX), and the custom-function wrappers of backends/mlx/custom.py
that give the CUDA kernels their derivatives (exercised here on the composed kernels, which the
CPU runs; the CUDA path itself needs a GPU).
"""
from __future__ import annotations

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate import matrix
from rlx_conformance.generate.matrix import Case, Target, make_inputs, make_seeds
from rlx_conformance.judge.custom_checks import scatter_targets
from rlx_conformance.ops import get_op
from rlx_conformance.run.execute import run_case
from rlx_conformance.spec import csr

CPU = get_backend("cpu")
MODES = ("eager", "lazy", "compiled")
EAGER = Target("mlx", "cpu", "eager")


# -- undefined derivatives of the scatters ---------------------------------------------------------
def _scatter_elements_dups():
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    idx = np.array([[0, 1, 1, 3], [2, 2, 0, 1]], np.int64)  # axis 1: row 0 writes col 1 twice, row 1 col 2
    upd = -np.arange(1, 9, dtype=np.float64).reshape(2, 4)
    return "onnx.ScatterElements", [data, idx, upd], {"axis": 1}


def _scatter_nd_dups():
    data = np.arange(12, dtype=np.float64).reshape(4, 3)
    idx = np.array([[1], [3], [1], [0]], np.int64)  # row 1 written twice (a slice of 3 cells)
    upd = -np.arange(1, 13, dtype=np.float64).reshape(4, 3)
    return "onnx.ScatterND", [data, idx, upd], {}


@pytest.mark.parametrize("make", [_scatter_elements_dups, _scatter_nd_dups])
def test_scatter_none_duplicates_mask_exactly_the_affected_positions(make):
    op, xs, attrs = make()
    attrs = dict(attrs, reduction="none")
    t = scatter_targets(op, xs[0], xs[1], xs[2], attrs)
    dup_cells = np.bincount(t, minlength=xs[0].size) > 1
    assert dup_cells.any() and not dup_cells.all()
    gd, gi, gw = CPU.undefined_positions(op, "vjp", xs, attrs)
    assert gi is None
    np.testing.assert_array_equal(gd.ravel(), dup_cells)
    np.testing.assert_array_equal(gw.ravel(), dup_cells[t])
    assert 0 < gw.sum() < gw.size
    (jd,) = CPU.undefined_positions(op, "jvp", xs, attrs)
    np.testing.assert_array_equal(jd.ravel(), dup_cells)
    # The forward masks the same output cells (OpSpec.undefined).
    np.testing.assert_array_equal(get_op(op).undefined(xs, attrs), jd)
    # Outside the mask the VJP is the duplicate-free rule's: the data's cotangent 0 where an
    # update overwrote the cell, passed through elsewhere; a lone update gets its cell's.
    u = np.linspace(-1, 1, xs[0].size).reshape(xs[0].shape)
    g = CPU.run_vjp(op, xs, attrs, [u])
    hit = np.bincount(t, minlength=xs[0].size) > 0
    np.testing.assert_array_equal(g[0].ravel()[~gd.ravel()], np.where(hit, 0.0, u.ravel())[~gd.ravel()])
    np.testing.assert_array_equal(g[2].ravel()[~gw.ravel()], u.ravel()[t][~gw.ravel()])


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
@pytest.mark.parametrize("make", [_scatter_elements_dups, _scatter_nd_dups])
def test_scatter_reductions_have_no_undefined_derivative(make, reduction):
    op, xs, attrs = make()
    attrs = dict(attrs, reduction=reduction)
    assert CPU.undefined_positions(op, "vjp", xs, attrs) == [None, None, None]
    assert CPU.undefined_positions(op, "jvp", xs, attrs) == [None]


def test_scatter_none_without_duplicates_masks_nothing():
    op, xs, attrs = _scatter_nd_dups()
    xs[1] = np.array([[1], [3], [2], [0]], np.int64)
    masks = CPU.undefined_positions(op, "vjp", xs, dict(attrs, reduction="none"))
    assert not masks[0].any() and not masks[2].any()


def _grad_cases(op: str, grads=("vjp",), dtypes=("float64",), targets=(EAGER,)) -> list[Case]:
    return matrix.generate(list(targets), ops=[op], dtypes=list(dtypes), grads=grads)


def test_matrix_scatter_none_cases_are_not_masked():
    """The matrix draws distinct targets under reduction none (ops/custom.py's generators), so
    none of its derivative cases loses a position to the mask; the mask is for inputs that do
    repeat a target (validate, a user's case)."""
    n = 0
    for op in ("onnx.ScatterElements", "onnx.ScatterND"):
        for c in _grad_cases(op, grads=("vjp", "jvp")):
            if c.attr_dict["reduction"] != "none":
                continue
            n += 1
            masks = CPU.undefined_positions(op, c.grad, make_inputs(c), c.attr_dict)
            assert masks is not None and not any(m is not None and m.any() for m in masks), c.id
    assert n


# -- cg_solve: the implicit derivative, defined where CG converges ----------------------------------
def test_cg_solve_rules_are_lu_solves_and_undefined_where_cg_does_not_converge():
    conv = unconv = 0
    for c in _grad_cases("rlx_sparse.cg_solve", grads=("vjp", "jvp")):
        if c.size() > 400:
            continue
        xs, attrs = make_inputs(c), c.attr_dict
        values, col, rp, b = xs
        a = csr.to_scipy(values, col, rp, b.size)
        _, _, converged = csr.cg(a, b, attrs["max_iter"], attrs["tol"])
        seeds = make_seeds(c, xs)
        lu_attrs = {}
        if c.grad == "vjp":
            got = CPU.run_vjp(c.op, xs, attrs, list(seeds.cotangents))
            want = CPU.run_vjp("rlx_sparse.lu_solve", xs, lu_attrs, list(seeds.cotangents))
        else:
            got = CPU.run_jvp(c.op, xs, attrs, list(seeds.tangents))
            want = CPU.run_jvp("rlx_sparse.lu_solve", xs, lu_attrs, list(seeds.tangents))
        for g, w in zip(got, want):
            assert (g is None) == (w is None)
            if g is not None:
                np.testing.assert_array_equal(g, w)
        masks = CPU.undefined_positions(c.op, c.grad, xs, attrs)
        if converged:
            conv += 1
            assert all(m is None for m in masks), c.id
        else:
            unconv += 1
            assert all(m is None or m.all() for m in masks) and any(m is not None for m in masks), c.id
    assert conv and unconv


# -- values_grad is mat_vec's VJP with respect to the values ---------------------------------------
def _values_grad_pairs(dtypes=("float64", "float32")):
    """(col_idx, row_ptr, u, v) of every mat_vec VJP case (u its cotangent, v its x) and every
    values_grad case (values irrelevant: the derivative with respect to them does not depend on
    them)."""
    out = []
    for c in _grad_cases("rlx_sparse.mat_vec", dtypes=dtypes):
        values, col, rp, x = make_inputs(c)
        (u,) = make_seeds(c, [values, col, rp, x]).cotangents
        out.append((c.id, values, col, rp, u, x))
    for c in matrix.generate([Target("cpu", "cpu", "eager")], ops=["rlx_sparse.values_grad"],
                             dtypes=list(dtypes)):
        col, rp, u, v = make_inputs(c)
        if c.vals == "special":
            continue  # derivative cases leave out special (grad_classes); so does the check
        out.append((c.id, np.zeros(col.shape, u.dtype), col, rp, u, v))
    return out


def test_values_grad_is_mat_vecs_vjp_on_the_reference():
    """Each entry is one product u[row] x[col], exact in float64: values_grad in the case's
    dtype is the VJP (float64) correctly rounded to that dtype, bit for bit."""
    pairs = _values_grad_pairs()
    assert len(pairs) > 20
    for cid, values, col, rp, u, x in pairs:
        (want,) = CPU.run("rlx_sparse.values_grad", [col, rp, u, x], {})
        g = CPU.run_vjp("rlx_sparse.mat_vec", [values, col, rp, x], {}, [u])
        assert g[1] is None and g[2] is None
        np.testing.assert_array_equal(g[0].astype(want.dtype), want, err_msg=cid)


@pytest.mark.parametrize("mode", MODES)
def test_values_grad_is_mat_vecs_vjp_on_mlx(mode):
    """MLX's mx.vjp of its mat_vec kernel with respect to the values against its values_grad
    kernel: both one product per entry in the dtype, so equal bit for bit."""
    pytest.importorskip("mlx.core")
    mlx = get_backend("mlx")
    pairs = _values_grad_pairs()
    for cid, values, col, rp, u, x in pairs[:: max(1, len(pairs) // 24)]:
        (want,) = mlx.run("rlx_sparse.values_grad", [col, rp, u, x], {}, "cpu", mode)
        got = mlx.run_derivative("rlx_sparse.mat_vec", "vjp", [values, col, rp, x], {}, [u], [],
                                 "cpu", mode)
        assert got[1] is None and got[2] is None and got[0].dtype == want.dtype
        np.testing.assert_array_equal(got[0], want, err_msg=f"{cid} ({mode})")
        assert dt.name_of(got[0].dtype) == dt.name_of(values.dtype)


# -- the CUDA kernels' derivatives, run on the CPU around the composed kernels ----------------------
WRAPPED_OPS = ("onnx.GatherElements", "onnx.GatherND", "onnx.ScatterElements", "onnx.ScatterND",
               "rlx_sparse.mat_vec", "rlx_sparse.values_grad")
MAX_CASE = 3000  # input elements: the small and mid families of every op, a few seconds in all


@pytest.fixture
def cuda_path_on_cpu(monkeypatch):
    """The kernels take their CUDA branch (cuda_kernels.active) with each CUDA kernel replaced
    by the composed kernel of the same signature: the forward is unchanged, and the derivatives
    are those of custom.py's mx.custom_function wrappers instead of MLX's own autodiff."""
    pytest.importorskip("mlx.core")
    from rlx_conformance.backends.mlx import cuda_kernels, custom
    calls = []

    def counted(name, fn):
        def run(*args):
            calls.append(name)
            return fn(*args)
        return run
    monkeypatch.setattr(cuda_kernels, "active", lambda: True)
    for name, fn in (("gather_elements", custom.composed_gather_elements),
                     ("gather_nd", custom.composed_gather_nd),
                     ("scatter_elements", custom.composed_scatter_elements),
                     ("scatter_nd", custom.composed_scatter_nd),
                     ("spmv", custom.composed_spmv),
                     ("values_grad", custom.composed_values_grad)):
        monkeypatch.setattr(cuda_kernels, name, counted(name, fn))
    return calls


def _small(op: str, dtypes, grads=("vjp", "jvp"), targets=(EAGER,)) -> list[Case]:
    return [c for c in _grad_cases(op, grads=grads, dtypes=dtypes, targets=targets) if c.size() <= MAX_CASE]


@pytest.mark.parametrize("op", WRAPPED_OPS)
def test_wrapped_kernels_derivatives_pass_the_matrix(op, cuda_path_on_cpu):
    """Every small derivative case of the op (float32 and float64, vjp and jvp, every
    reduction) passes the derivative judge through the wrapped path, where MLX's own autodiff
    of the composed kernels has no JVP for scatter and no VJP for scatter mul."""
    cases = _small(op, ("float32", "float64"))
    assert cases
    bad = []
    for c in cases:
        r = run_case(c)
        if r.outcome != "pass":
            bad.append(f"{c.id}: {r.outcome} {r.message[:300]}")
    assert cuda_path_on_cpu, "the CUDA branch was not taken"
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mode", ("lazy", "compiled"))
def test_wrapped_kernels_derivatives_in_every_mode(mode, cuda_path_on_cpu):
    """The custom functions under mx.compile and lazily: one small float32 case per op and kind."""
    target = Target("mlx", "cpu", mode)
    for op in WRAPPED_OPS:
        for grad in ("vjp", "jvp"):
            c = _small(op, ("float32",), grads=(grad,), targets=(target,))[0]
            r = run_case(c)
            assert r.outcome == "pass", f"{c.id}: {r.outcome} {r.message[:300]}"


def test_wrapped_spmv_inside_cg_solve_matches_autodiff(cuda_path_on_cpu):
    """cg_solve's CUDA branch multiplies by the wrapped spmv: its derivative through the CG
    iterations then matches MLX's autodiff through the composed spmv bit for bit (the rule's
    operations are those MLX's scatter-add and gather VJPs perform)."""
    mlx = get_backend("mlx")
    from rlx_conformance.backends.mlx import cuda_kernels
    c = next(c for c in _grad_cases("rlx_sparse.cg_solve", dtypes=("float64",)) if 7 <= c.size() <= 400)
    xs = make_inputs(c)
    cots = list(make_seeds(c, xs).cotangents)
    wrapped = mlx.run_derivative(c.op, "vjp", xs, c.attr_dict, cots, [], "cpu", "eager")
    assert "spmv" in cuda_path_on_cpu
    cuda_kernels.active = lambda: False  # restored by the fixture's monkeypatch
    plain = mlx.run_derivative(c.op, "vjp", xs, c.attr_dict, cots, [], "cpu", "eager")
    for w, p in zip(wrapped, plain):
        assert (w is None) == (p is None)
        if w is not None:
            np.testing.assert_array_equal(w, p)
