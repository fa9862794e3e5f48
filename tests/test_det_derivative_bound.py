"""det's and log_det's derivative bound counts the rounding of the partial itself (backends/cpu/
linalg.py _partial_rounding): a cofactor or an entry of A⁻¹ is computed with an absolute error
of order eps times products of column norms, not eps times its own size. Exact or correctly
computed derivatives must pass where the partial is small by cancellation (a singular A's
cofactors) or A⁻¹ is computed by an honest float32 cofactor formula (what MLX does for n <= 3)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.generate.matrix import Target, generate
from rlx_conformance.run import derivatives

TARGET = [Target("mlx", "cpu", "eager")]


def _case(op: str, dtype: str, vals: str, grad: str):
    return next(c for c in generate(TARGET, ops=[op], dtypes=[dtype], grads=(grad,))
                if c.vals == vals and c.shapes[0] == (3, 3))


def _exact_adjugate_t(a: np.ndarray) -> np.ndarray:
    """adj(A)ᵀ (the cofactors C_ij) in exact rational arithmetic."""
    m = [[Fraction(float(x)) for x in row] for row in a]
    out = np.empty((3, 3))
    for i in range(3):
        for j in range(3):
            r = [k for k in range(3) if k != i]
            c = [k for k in range(3) if k != j]
            minor = m[r[0]][c[0]] * m[r[1]][c[1]] - m[r[0]][c[1]] * m[r[1]][c[0]]
            out[i, j] = float((-1) ** (i + j) * minor)
    return out


def test_det_vjp_at_a_singular_matrix_accepts_the_exact_cofactors():
    """The singular class repeats a row: the cofactors of the other rows' minors are exactly 0,
    which the float64 LU reference gets as ~1e-17. The exact answer must pass in every dtype."""
    for dtype in ("float64", "float32", "bfloat16"):
        c = _case("det", dtype, "singular", "vjp")
        ref = derivatives.reference(c)
        a = ref.inputs[0].astype(np.float64)
        assert np.linalg.matrix_rank(a) < 3
        u = ref.seeds.cotangents[0].astype(np.float64)
        exact = (u * _exact_adjugate_t(a)).astype(ref.expected[0].dtype)
        assert (exact == 0).any()
        comps = derivatives.judge(c, ref, [exact])
        assert all(x.ok for x in comps), (dtype, [x.message for x in comps])


def _cofactor_inverse_t_float32(a: np.ndarray) -> np.ndarray:
    """A⁻ᵀ by the 3x3 cofactor formula, every operation rounded to float32."""
    a = a.astype(np.float32)
    cof = np.empty((3, 3), np.float32)
    for i in range(3):
        for j in range(3):
            r = [k for k in range(3) if k != i]
            c = [k for k in range(3) if k != j]
            minor = np.float32(a[r[0], c[0]] * a[r[1], c[1]]) - np.float32(a[r[0], c[1]] * a[r[1], c[0]])
            cof[i, j] = np.float32((-1) ** (i + j)) * np.float32(minor)
    det = np.float32(np.sum(a[0] * cof[0], dtype=np.float32))
    return cof / det


def test_log_det_vjp_accepts_a_float32_cofactor_formula():
    """log_det's VJP u A⁻ᵀ from the float32 cofactor formula: each entry a 2x2 determinant that
    may cancel, over a determinant that may cancel. It is a correct float32 implementation, so
    it passes, on every random 3x3 case of the matrix and on an ill-conditioned one."""
    c = _case("log_det", "float32", "random", "vjp")
    ref = derivatives.reference(c)
    u = np.float32(ref.seeds.cotangents[0])
    comps = derivatives.judge(c, ref, [u * _cofactor_inverse_t_float32(ref.inputs[0])])
    assert all(x.ok for x in comps), [x.message for x in comps]
    ill = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.5]], np.float32)
    ref.inputs[0] = ill
    ref.expected[0] = (np.float64(u) * np.linalg.inv(ill.astype(np.float64)).T).astype(np.float32)
    mags, ref.terms = get_backend("cpu").run_magnitude("log_det", "vjp", [ill], {}, [np.array(u)])
    ref.magnitude = list(mags)
    got = u * _cofactor_inverse_t_float32(ill)
    assert all(x.ok for x in derivatives.judge(c, ref, [got]))
