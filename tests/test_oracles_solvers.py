"""The CPU reference of det, log_det, dense_solve, batched_dense_solve, cholesky, triangular_solve,
svd and qr against exact rational arithmetic and mpmath, over every case of the generated matrix:
every dtype, shape family, attribute and value class of these ops (ill-conditioned, singular,
SPD, badly scaled, extreme-magnitude, rank-deficient, NaN/inf in the unread triangle).

Semantics from docs/ops.md (linalg). The reference computes in float64 (the inputs of every
dtype are exact there) and rounds once to the output dtype; every bound below is what a
backward-stable LAPACK-style float64 algorithm guarantees (Higham, Accuracy and Stability of
Numerical Algorithms, 2nd ed.), u = 2^-53, gamma_k = k u / (1 - k u), plus the output's
rounding: u_out |y| + eta_out (u_out as tests/test_oracles_linalg.py: 16-bit dtypes may round
through float32; eta_out half the smallest subnormal). Where a scalar is judged, the enclosure
[lo, hi] of the float64 value is rounded outward to float64 and then to the output dtype with
the reference's own cast: rounding is monotone, so the output must lie between the two.

The oracles (nothing of the harness's bounds, geometry or kernels is imported):

* det, dense_solve, triangular_solve: exact. Each row is scaled by a power of two into
  integers (exact), det by fraction-free Bareiss elimination, solutions by Bareiss on [A | B]
  and back substitution in fractions.Fraction; residuals b - A x_ref exactly in integers.
* cholesky: mpmath (DPS digits) on the lower triangle; reconstruction A - L L^T exactly.
* svd: eigenpairs of the exact Gram matrix (A^T A or A A^T, k x k) by mpmath.eigsy at DPS
  digits; qr: mpmath.qr at DPS digits. Factors are judged by their properties (orthonormal
  columns, triangular R, reconstruction: these hold whatever the non-unique signs and
  subspaces) and by values only where perturbation theory makes them unique: singular values
  always, singular subspaces per their gap, R and Q up to column signs where A's leading k
  columns are well conditioned.

Bounds and their sources:

* dense_solve (GEPP; LAPACK gesv with conventional BLAS-3 is GE in another order, Higham
  §13.2): Thm 9.4, (A + dA) x = b with |dA| <= gamma_3n |L||U|. So the exact residual obeys
  |b - A x| <= gamma_3n P^T|L||U| |x| (the Oettli-Prager componentwise backward error with
  respect to E = |L||U|, f = 0 is at most gamma_3n, Thm 7.3) and the forward error
  |x_exact - x| = |A^-1 dA x| <= gamma_3n |A^-1| P^T|L||U| |x|. |L||U| and
  A^-1 are bound factors: a partial-pivoting LU written here in float64 (the pivot rule is
  LAPACK's: first largest |entry|; its |L||U| is the reference's up to rounding) and the
  inverse from it, doubled: its componentwise relative error is about cond(A) n u <= 1e-2 for
  the matrix's classes (cond <= 1e12 by design, row scaling by powers of two excluded).
* triangular_solve: Thm 8.5 per column, (T + dT) x = b, |dT| <= gamma_n |T| (op(T) = T^T when
  transpose): |b - op(T) x| <= gamma_n |op(T)||x| and |x_exact - x| <= gamma_n
  |op(T)^-1||op(T)||x|, op(T)^-1 exact. The other triangle of A (garbage, NaN, inf) is never
  read by the oracle, so a result that read it is not finite or fails the bound.
* det: Thm 9.3, L U = P(A + dA), |dA| <= gamma_n |L||U|; det(A + dA) is the pivots' product
  exactly, formed with n - 1 roundings (gamma_n |det|). With rows scaled to B = D^-1 A (D
  powers of two, exact) and E = D^-1 dA, Ipsen & Rehman (Perturbation bounds for
  determinants and characteristic polynomials, SIAM J. Matrix Anal. Appl. 30, 2008):
  |det(B + E) - det B| <= sum_k s_(n-k)(sigma(B)) ||E||_2^k, s_j the elementary symmetric
  functions of the singular values (an upper bound also for singular B, where the
  relative error has no meaning): the "gamma_n times a growth/condition factor" of LU. The
  singular values are a bound factor (LAPACK, each raised by 4 n u sigma_1: Weyl with its
  backward error), ||E||_2 <= gamma_n ||D^-1 |L||U| ||_F. Enclosures are mpmath numbers
  (unbounded exponents), so over- and underflowing determinants (the extreme class) are
  asserted by the same rule: inf only where the whole enclosure rounds to inf.
* log_det: log|det| from the exact det; log|det(A + dA)| within -log(1 - rho) of it, rho the
  det bound relative to |det A| (when rho >= 1, and at an exactly singular A, only the upper
  end log(|det| + bound) holds); plus the reference's sum of the pivots' logs: 1 ulp per log
  (measured practice of glibc, as tests/test_oracles_loss.py), the pivots' |log| taken from the LU here plus 1 each (a
  pivot differing by a factor e from the reference's is covered; 745 >= |log| of any float64
  where the LU here has an exact zero pivot), and fsum's rounding.
  At an exactly singular A (the singular class: a repeated row) the exact log|det| is -inf,
  as docs/ops.md says, but a float LU meets a zero pivot only if the repeated row is
  eliminated bit-identically (LAPACK's blocked, FMA-using getrf often does not): the
  reference's -inf or any value up to the upper end log(bound) is accepted there.
* cholesky: structure exactly (zero above the diagonal, positive diagonal); Thm 10.3 (potrf's
  blocked form is the same algorithm in another order): A = L L^T - dA, |dA| <= gamma_(n+1)
  |L||L|^T, asserted on the exact A - L_out L_out^T with L's output rounding folded in
  (M = |L_out|(1 + u_out) + eta_out bounds the float64 factor). Values: Sun's perturbation
  theorem (BIT 31, 1991): ||dL||_F <= 2^-1/2 kappa_2(H) eps / (1 - kappa_2(H) eps)
  ||L||_2, eps = ||dH||_F / ||H||_2, on H = D^-1 A D^-1 with D powers of two near sqrt(diag)
  (Cholesky commutes exactly with that scaling), kappa_2(H) a bound factor (LAPACK eigvalsh,
  lambda_min lowered by n u lambda_max, Weyl).
* qr (Householder, geqrf + orgqr): Thm 19.4 and its Q: A + dA = Q_hat R, ||da_j||_2 <=
  g ||a_j||_2 and ||q_hat_j - q_j||_2 <= g for an exactly orthonormal Q, g = gamma~_mn =
  4 m n u (Higham leaves the constant of gamma~ unspecified; 4 measured safe: every case,
  every dtype, passes with a twentieth of it). So ||Q^T Q - I||_F <= 2 sqrt(k) g + g^2 k, and each column of A -
  Q R within g ||a_j|| + sqrt(k) g ||r_j||; R exactly zero below the diagonal. Values: the
  QR perturbation theorem of Sun (BIT 31, 1991): for full-rank leading columns
  X = A[:, :k], ||dR||_F <= sqrt2 kappa_2(X) eps / (1 - kappa_2(X) eps) ||R||_2 and the same
  for ||dQ||_F (plus g sqrt(k), Q_hat's distance from orthonormal), eps = ||dX||_F / ||X||_2,
  after fixing R's row signs to the positive diagonal (docs/ops.md: signs are free).
* svd (gesdd): backward stable, the computed factors are those of A + dA, ||dA||_F <=
  g ||A||_F, the same g (bidiagonalization by 2k Householder reflectors). Singular values
  (Weyl): |s_i - sigma_i| <= g ||A||_F, descending (docs/ops.md). U and V: orthonormal as Q,
  U diag(s) V^T = A within g ||A||_F plus the factors' own departure from orthonormality.
  Subspaces (Wedin's sin-theta theorem): for a cluster C of singular values separated by
  delta from the rest (and from 0 when the other side has more rows), ||sin Theta|| <=
  sqrt2 ||dA||_2 / (delta - ||dA||_2) plus the orthonormality slack; clusters with no
  separation (repeated values, the null space of a rank-deficient A) are not asserted.

Subsampling: none; every case of the 8 ops is run (624 cases, well under a minute).
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import mpmath
import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, TARGET, U64 as U, assert_each_case, gamma
OPS = ["det", "log_det", "dense_solve", "batched_dense_solve", "cholesky", "triangular_solve", "svd", "qr"]
UNIT = {"float64": 0.0, "float32": 2.0 ** -24, "float16": 2.0 ** -11 + 2.0 ** -24,
        "bfloat16": 2.0 ** -8 + 2.0 ** -24}  # float64 outputs are the float64 result itself
ETA = {"float64": 0.0, "float32": 2.0 ** -150, "float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}
DPS = 50  # 166 bits: far beyond float64 for the matrix's condition numbers (<= 1e12)
GT_C = 4  # the constant of gamma~ (see the docstring)
CASES = list(matrix.generate([TARGET], ops=OPS))


def gtilde(m: int, n: int) -> float:
    return GT_C * m * n * U / (1 - GT_C * m * n * U)


def mats(x: np.ndarray) -> np.ndarray:
    return x.reshape((math.prod(x.shape[:-2]),) + x.shape[-2:])


def run(case: matrix.Case, inputs: list[np.ndarray], **attrs) -> np.ndarray:
    (out,) = CPU.run(case.op, [x.copy() for x in inputs], {**case.attr_dict, **attrs})
    return np.asarray(out)


# -- exact arithmetic ------------------------------------------------------------------------------
def int_row(row: np.ndarray) -> tuple[list[int], int]:
    """A row of finite floats as integers times 2^e (exact)."""
    ratios = [float(v).as_integer_ratio() for v in row]
    e = min(-(d.bit_length() - 1) for _, d in ratios) if ratios else 0
    return [p << (-e - (d.bit_length() - 1)) for p, d in ratios], e


def int_rows(a: np.ndarray) -> tuple[np.ndarray, list[int]]:
    rows, exps = zip(*(int_row(r) for r in a)) if len(a) else ((), ())
    return np.array(rows, dtype=object).reshape(a.shape), list(exps)


def bareiss(m: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """Fraction-free elimination on the first n columns of an integer matrix [n, n + k]: the
    echelon form (its last pivot is det of the n x n part) and the row swaps' sign; a column
    with no nonzero pivot left means det = 0 (the echelon is then returned as it stands)."""
    m = m.copy()
    prev, sign = 1, 1
    for k in range(n):
        if m[k, k] == 0:
            nz = [i for i in range(k + 1, n) if m[i, k] != 0]
            if not nz:
                return m, 0
            m[[k, nz[0]]] = m[[nz[0], k]]
            sign = -sign
        if k + 1 < n:
            below, right = m[k + 1:, k:k + 1], m[k:k + 1, k + 1:]
            m[k + 1:, k + 1:] = (m[k + 1:, k + 1:] * m[k, k] - below * right) // prev
            m[k + 1:, k] = 0
            prev = m[k, k]
    return m, sign


@lru_cache(maxsize=None)
def _exact_det(key: bytes, n: int) -> tuple[int, int]:
    a = np.frombuffer(key).reshape(n, n)
    ints, exps = int_rows(a)
    ech, sign = bareiss(ints, n)
    return (sign * int(ech[n - 1, n - 1]) if sign and n else (1 if n == 0 else 0)), sum(exps)


def exact_det(a: np.ndarray) -> mpmath.mpf:
    """det of a float64 matrix, exactly (as an mpf of enough bits: det is an integer times 2^e)."""
    num, e = _exact_det(np.ascontiguousarray(a, np.float64).tobytes(), a.shape[-1])
    with mpmath.workprec(max(64, abs(num).bit_length() + 8)):
        return mpmath.ldexp(mpmath.mpf(num), e)


def exact_solve(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    """x with A x = b exactly (A nonsingular; b [n, k])."""
    n, k = b.shape
    ints, _ = int_rows(np.concatenate([a, b], 1))
    ech, sign = bareiss(ints, n)
    assert sign, "exactly singular A"
    x = [[Fraction(0)] * k for _ in range(n)]
    for i in range(n - 1, -1, -1):
        for j in range(k):
            s = int(ech[i, n + j]) - sum((int(ech[i, c]) * x[c][j] for c in range(i + 1, n)), Fraction(0))
            x[i][j] = s / int(ech[i, i])
    return x


def exact_residual(a: np.ndarray, x: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b - A x, each entry exact then rounded once to float64 (a [n, n], x and b [n, k])."""
    ai, ea = int_rows(a)
    n, k = b.shape
    out = np.zeros((n, k))
    for j in range(k):
        xi, ex = int_row(x[:, j])
        col = np.array(xi, dtype=object)
        for i in range(n):
            ax = Fraction(int(np.dot(ai[i], col)) if n else 0) * Fraction(2) ** (ea[i] + ex)
            out[i, j] = float(Fraction(float(b[i, j])) - ax)
    return out


def exact_triangular_inverse(t: np.ndarray, lower: bool) -> list[list[Fraction]]:
    """T^-1 exactly (T triangular with a nonzero diagonal)."""
    n = t.shape[0]
    tf = [[Fraction(float(v)) for v in r] for r in t]
    inv = [[Fraction(0)] * n for _ in range(n)]
    order = range(n) if lower else range(n - 1, -1, -1)
    for j in range(n):
        for i in order:  # column j of T^-1 by substitution
            rng = range(i) if lower else range(i + 1, n)
            s = (1 if i == j else 0) - sum((tf[i][c] * inv[c][j] for c in rng), Fraction(0))
            inv[i][j] = s / tf[i][i]
    return inv


# -- bound factors (float64, written here) ---------------------------------------------------------
def gepp(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Partial-pivoting LU of a float64 matrix (LAPACK's rule: the first largest |entry|):
    (perm, L, U) with L U ~ A[perm]."""
    n = a.shape[0]
    w = a.astype(np.float64).copy()
    perm = np.arange(n)
    with np.errstate(all="ignore"):
        for k in range(n):
            p = k + int(np.argmax(np.abs(w[k:, k])))
            if p != k:
                w[[k, p]] = w[[p, k]]
                perm[[k, p]] = perm[[p, k]]
            if w[k, k] != 0:
                w[k + 1:, k] /= w[k, k]
                w[k + 1:, k + 1:] -= np.outer(w[k + 1:, k], w[k, k + 1:])
    return perm, np.tril(w, -1) + np.eye(n), np.triu(w)


def abs_lu(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P^T |L||U| (rows back in A's order), rounded up by gamma_n (nonnegative float64 sums),
    and U's diagonal (the pivots)."""
    perm, lo, up = gepp(a)
    n = a.shape[0]
    lu = np.empty((n, n))
    lu[perm] = (np.abs(lo) @ np.abs(up)) * (1 + gamma(n + 2))
    return lu, np.diagonal(up).copy()


def inverse_bound(a: np.ndarray) -> np.ndarray:
    """2 |A^-1| from the LU here (see the docstring for the factor 2)."""
    perm, lo, up = gepp(a)
    n = a.shape[0]
    y = np.eye(n)[perm]
    for i in range(n):
        y[i] -= lo[i, :i] @ y[:i]
    for i in range(n - 1, -1, -1):
        y[i] = (y[i] - up[i, i + 1:] @ y[i + 1:]) / up[i, i]
    return 2 * np.abs(y)


def pow2_row_scales(a: np.ndarray) -> np.ndarray:
    """2^e per row with the row's largest |entry| in [1/2, 1) (1 for a zero row)."""
    top = np.max(np.abs(a), axis=1) if a.size else np.zeros(a.shape[0])
    return np.where(top > 0, np.ldexp(1.0, np.frexp(np.where(top > 0, top, 1.0))[1]), 1.0)


def det_perturbation(a: np.ndarray) -> tuple[mpmath.mpf, np.ndarray]:
    """Bound on |det(A + dA) - det A| for GEPP's dA (Ipsen-Rehman on the row-scaled B), as mpf,
    and the pivots of the LU here."""
    n = a.shape[0]
    lu, piv = abs_lu(a)
    d = pow2_row_scales(a)
    b = a / d[:, None]
    eps = gamma(n) * float(np.linalg.norm(lu / d[:, None])) * (1 + gamma(n * n + 2))
    s = np.linalg.svd(b, compute_uv=False)
    s = s + 4 * n * U * s[0]
    coef = np.zeros(n + 1)  # prod (1 + s_i t): coef[j] = e_j(s)
    coef[0] = 1.0
    for v in s:
        coef[1:] = coef[1:] + v * coef[:-1]
    total = sum(coef[n - k] * eps ** k for k in range(1, n + 1)) * (1 + gamma(3 * n + 2))
    scale = int(sum(np.frexp(d)[1] - 1))
    return mpmath.ldexp(mpmath.mpf(total), scale), piv


def enclosed(got: np.ndarray, lo: mpmath.mpf, hi: mpmath.mpf) -> bool:
    """Whether the reference's output (its own dtype) lies between [lo, hi] rounded outward to
    float64 and then to that dtype."""
    lo64 = np.nextafter(float(lo), -np.inf)
    hi64 = np.nextafter(float(hi), np.inf)
    with np.errstate(over="ignore"):
        lo_o, hi_o = (float(np.array([v]).astype(got.dtype)[0]) for v in (lo64, hi64))
    g = float(got)
    return lo_o <= g <= hi_o


# -- det and log_det -------------------------------------------------------------------------------
def det_enclosure(a: np.ndarray) -> tuple[mpmath.mpf, mpmath.mpf, mpmath.mpf, np.ndarray]:
    """(exact det, its perturbation bound, the pivot product's rounding bound, pivots)."""
    with mpmath.workprec(200):
        det = exact_det(a)
        if a.shape[0] == 0:
            return det, mpmath.mpf(0), mpmath.mpf(0), np.zeros(0)
        pert, piv = det_perturbation(a)
        return det, pert, gamma(a.shape[0]) * (abs(det) + pert), piv


def check_det(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    (a,) = matrix.make_inputs(case)
    out = run(case, [a]) if out is None else np.asarray(out)
    if out.shape != a.shape[:-2] or out.dtype != a.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {a.shape[:-2]} {a.dtype}"
    for i, (m, got) in enumerate(zip(mats(a.astype(np.float64)), out.reshape(-1))):
        det, pert, prod_err, _ = det_enclosure(m)
        with mpmath.workprec(200):
            r = pert + prod_err + 2.0 ** -1075  # the float64 result may be a rounded subnormal
            if not enclosed(np.asarray(got), det - r, det + r):
                return f"matrix {i}: got {got}, exact {mpmath.nstr(det, 12)} +- {mpmath.nstr(r, 3)}"
    return None


def check_log_det(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    (a,) = matrix.make_inputs(case)
    out = run(case, [a]) if out is None else np.asarray(out)
    if out.shape != a.shape[:-2] or out.dtype != a.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {a.shape[:-2]} {a.dtype}"
    for i, (m, got) in enumerate(zip(mats(a.astype(np.float64)), out.reshape(-1))):
        g = float(got)
        n = m.shape[0]
        if n == 0:
            if g != 0.0:
                return f"matrix {i}: log_det of a 0 x 0 matrix {g}, want 0"
            continue
        det, pert, _, piv = det_enclosure(m)
        with mpmath.workprec(200):
            with np.errstate(divide="ignore"):  # a zero pivot here may be a tiny one there:
                logs = np.where(piv != 0, np.abs(np.log(np.abs(piv))), 745.0)  # |log| of any float
            sum_err = 2 * U * (float(np.sum(logs + 1)) + n)
            upper = mpmath.log(abs(det) + pert)
            if det != 0 and pert < abs(det):
                rho = pert / abs(det)
                lo = mpmath.log(abs(det)) + mpmath.log(1 - rho)
                lo = lo - sum_err - 2 * U * abs(lo)
            else:
                lo = -mpmath.inf
            hi = upper + sum_err + 2 * U * abs(upper)
            if g == -math.inf and lo != -mpmath.inf:
                return f"matrix {i}: got -inf, exact log|det| {mpmath.nstr(mpmath.log(abs(det)), 12)}"
            if g != -math.inf and not enclosed(np.asarray(got), lo, hi):
                return f"matrix {i}: got {g}, want in [{mpmath.nstr(lo, 12)}, {mpmath.nstr(hi, 12)}]"
    return None


# -- solves ----------------------------------------------------------------------------------------
def as_columns(b: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, bool]:
    vec = b.ndim == a.ndim - 1
    return (b[..., None] if vec else b), vec


def judge_solve(op_mat: np.ndarray, b: np.ndarray, x_out: np.ndarray, dtype: str, weight: np.ndarray,
                g: float, inv_abs: np.ndarray, x_exact: list[list[Fraction]]) -> str | None:
    """Residual and forward error of one system op_mat x = b (b, x_out [n, k]) against
    |dA| <= g * weight (the backward-error theorem of the algorithm)."""
    if not np.all(np.isfinite(x_out)):
        return "non-finite solution"
    uo, eo = UNIT[dtype], ETA[dtype]
    n = op_mat.shape[0]
    x64bound = np.abs(x_out) * (1 + uo) + eo  # bounds the float64 result's |x|
    delta = uo * np.abs(x_out) + eo  # its distance from the output
    res = np.abs(exact_residual(op_mat, x_out, b))
    allowed = (g * weight @ x64bound + np.abs(op_mat) @ delta) * (1 + gamma(n + 2))
    over = ~(res <= allowed)
    if over.any():
        i = np.unravel_index(np.argmax(np.where(over, res / np.where(allowed > 0, allowed, 1), 0)), res.shape)
        return (f"{int(over.sum())} residuals over the bound; worst at {i}: |r| {res[i]:.3e}, "
                f"allowed {allowed[i]:.3e}")
    err = np.array([[abs(float(x_exact[i][j] - Fraction(float(x_out[i, j])))) for j in range(b.shape[1])]
                    for i in range(n)]).reshape(b.shape)
    fwd = (inv_abs @ (g * weight @ x64bound) + delta) * (1 + gamma(n + 2))
    over = ~(err <= fwd)
    if over.any():
        i = np.unravel_index(np.argmax(np.where(over, err, 0)), err.shape)
        return (f"{int(over.sum())} forward errors over the bound; worst at {i}: got {x_out[i]}, "
                f"exact {float(x_exact[i[0]][i[1]])}, allowed {fwd[i]:.3e}")
    return None


def check_solve(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    a, b = matrix.make_inputs(case)
    out = run(case, [a, b]) if out is None else np.asarray(out)
    if out.shape != b.shape or out.dtype != a.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {b.shape} {a.dtype}"
    b2, _ = as_columns(b, a)
    x2, _ = as_columns(out, a)
    n = a.shape[-1]
    for i, (m, bm, xm) in enumerate(zip(mats(a.astype(np.float64)), mats(b2.astype(np.float64)),
                                        mats(x2.astype(np.float64)))):
        if n == 0:
            continue
        lu, _ = abs_lu(m)
        msg = judge_solve(m, bm, xm, case.dtype, lu, gamma(3 * n), inverse_bound(m), exact_solve(m, bm))
        if msg:
            return f"system {i}: {msg}"
    return None


def check_triangular(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    a, b = matrix.make_inputs(case)
    out = run(case, [a, b]) if out is None else np.asarray(out)
    if out.shape != b.shape or out.dtype != a.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {b.shape} {a.dtype}"
    lower, trans = case.attr_dict["lower"], case.attr_dict["transpose"]
    b2, _ = as_columns(b, a)
    x2, _ = as_columns(out, a)
    n = a.shape[-1]
    keep = np.tril(np.ones((n, n), bool)) if lower else np.triu(np.ones((n, n), bool))
    for i, (m, bm, xm) in enumerate(zip(mats(a.astype(np.float64)), mats(b2.astype(np.float64)),
                                        mats(x2.astype(np.float64)))):
        t = np.where(keep, m, 0.0)  # the selected triangle only: the other is never read
        inv = exact_triangular_inverse(t, lower)
        op_t = t.T if trans else t
        op_inv = [list(r) for r in zip(*inv)] if trans else inv
        x_exact = [[sum((op_inv[r][c] * Fraction(float(bm[c, j])) for c in range(n)), Fraction(0))
                    for j in range(bm.shape[1])] for r in range(n)]
        inv_abs = np.array([[abs(float(v)) for v in r] for r in op_inv]).reshape(n, n) * (1 + 2 * U)
        msg = judge_solve(op_t, bm, xm, case.dtype, np.abs(op_t), gamma(n), inv_abs, x_exact)
        if msg:
            return f"system {i}: {msg}"
    return None


# -- cholesky --------------------------------------------------------------------------------------
def check_cholesky(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    (a,) = matrix.make_inputs(case)
    out = run(case, [a]) if out is None else np.asarray(out)
    if out.shape != a.shape or out.dtype != a.dtype:
        return f"shape/dtype {out.shape} {out.dtype}, want {a.shape} {a.dtype}"
    n = a.shape[-1]
    uo, eo = UNIT[case.dtype], ETA[case.dtype]
    for i, (m, lm) in enumerate(zip(mats(a.astype(np.float64)), mats(out.astype(np.float64)))):
        if n == 0:
            continue
        if not np.all(np.isfinite(lm)) or np.any(np.triu(lm, 1) != 0) or not np.all(np.diagonal(lm) > 0):
            return f"matrix {i}: not lower triangular with a positive finite diagonal"
        big = np.abs(lm) * (1 + uo) + eo * np.tril(np.ones((n, n)))
        bb = big @ big.T
        allowed = (gamma(n + 1) * bb + (bb - np.abs(lm) @ np.abs(lm).T)) * (1 + gamma(n + 2))
        res = np.abs(exact_residual(lm, lm.T.copy(), np.tril(m) + np.tril(m, -1).T))
        over = ~(res <= allowed)
        if over.any():
            j = np.unravel_index(np.argmax(np.where(over, res, 0)), res.shape)
            return f"matrix {i}: |A - L L^T| over Thm 10.3's bound at {j}: {res[j]:.3e} > {allowed[j]:.3e}"
        # values: Sun's theorem on H = D^-1 A D^-1
        d = np.ldexp(1.0, np.frexp(np.sqrt(np.diagonal(m)))[1] - 1)
        h = m / d[:, None] / d[None, :]
        hl = lm / d[:, None]
        bigh = big / d[:, None]
        lam = np.linalg.eigvalsh(np.tril(h) + np.tril(h, -1).T)
        lmax = lam[-1] * (1 + n * U)
        lmin = lam[0] - n * U * lam[-1]
        eps = gamma(n + 1) * np.linalg.norm(bigh @ bigh.T) * (1 + gamma(n + 2)) / (lam[-1] * (1 - n * U))
        kappa = lmax / lmin if lmin > 0 else math.inf
        if kappa * eps >= 0.5:
            continue  # no value bound: only the properties above
        with mpmath.workdps(DPS):
            exact = mpmath.cholesky(mpmath.matrix((np.tril(h) + np.tril(h, -1).T).tolist()))
            diff = math.sqrt(float(mpmath.fsum((mpmath.mpf(float(hl[r, c])) - exact[r, c]) ** 2
                                               for r in range(n) for c in range(r + 1))))
        allowed = (2 ** -0.5 * kappa * eps / (1 - kappa * eps) * math.sqrt(lmax)
                   + float(np.linalg.norm(uo * np.abs(hl) + eo / d[:, None] * np.tril(np.ones((n, n))))))
        allowed *= 1 + gamma(n + 2)
        if not diff <= allowed:
            return f"matrix {i}: ||L - L_exact||_F {diff:.3e} over Sun's bound {allowed:.3e} (rows scaled)"
    return None


# -- qr --------------------------------------------------------------------------------------------
def sign_fixed(q: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q D, D R with D = sign(diag R) (+1 where 0): the positive-diagonal factors."""
    s = np.where(np.diagonal(r) < 0, -1.0, 1.0)
    return q * s, r * s[:, None]


def qr_parts(case: matrix.Case, out: np.ndarray | None,
             part: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (a,) = matrix.make_inputs(case)
    q = run(case, [a], part="q") if part != "q" or out is None else np.asarray(out)
    r = run(case, [a], part="r") if part != "r" or out is None else np.asarray(out)
    return a, q, r


def check_qr(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    part = case.attr_dict["part"]
    a, q, r = qr_parts(case, out, part)
    m, n = a.shape[-2:]
    k = min(m, n)
    want = {"q": a.shape[:-2] + (m, k), "r": a.shape[:-2] + (k, n)}
    for name, v in (("q", q), ("r", r)):
        if v.shape != want[name] or v.dtype != a.dtype:
            return f"{name}: shape/dtype {v.shape} {v.dtype}, want {want[name]} {a.dtype}"
    if a.size == 0:
        return None
    uo, eo = UNIT[case.dtype], ETA[case.dtype]
    g = gtilde(m, n)
    for i, (am, qm, rm) in enumerate(zip(mats(a.astype(np.float64)), mats(q.astype(np.float64)),
                                         mats(r.astype(np.float64)))):
        if not (np.all(np.isfinite(qm)) and np.all(np.isfinite(rm))):
            return f"matrix {i}: non-finite factors"
        if np.any(np.tril(rm, -1) != 0):
            return f"matrix {i}: R is not upper triangular"
        # the outputs' rounding moves each column by at most uo ||.|| + eo sqrt(rows)
        dq = uo * 1.0 + eo * math.sqrt(m)
        orth = np.linalg.norm(qm.T @ qm - np.eye(k))
        allowed = (2 * math.sqrt(k) * (g + dq) + k * (g + dq) ** 2) * (1 + gamma(m + 2))
        if part == "q" and not orth <= allowed:
            return f"matrix {i}: ||Q^T Q - I||_F {orth:.3e} > {allowed:.3e}"
        with mpmath.workdps(DPS):
            am_mp = mpmath.matrix(am.tolist())
            prod = mpmath.matrix(qm.tolist()) * mpmath.matrix(rm.tolist())
            col_err = [float(mpmath.norm(am_mp[:, j] - prod[:, j])) for j in range(n)]
        anorm = np.linalg.norm(am, axis=0)
        rnorm = np.linalg.norm(rm, axis=0)
        bound = ((g + dq) * (anorm + math.sqrt(k) * rnorm) + math.sqrt(k) * (g + dq) * rnorm
                 + uo * rnorm + eo * math.sqrt(k)) * (1 + gamma(k + 2))
        bad = [j for j in range(n) if not col_err[j] <= bound[j]]
        if bad:
            j = bad[0]
            return f"matrix {i}: column {j} of A - Q R: {col_err[j]:.3e} > {bound[j]:.3e}"
        # values, where the leading k columns determine the factors
        x = am[:, :k]
        sx = np.linalg.svd(x, compute_uv=False)
        smin = sx[-1] - 4 * k * U * sx[0]
        eps_x = (g * np.linalg.norm(x) + math.sqrt(k) * g * np.linalg.norm(rm[:, :k])) / (sx[0] * (1 - k * U))
        kappa = sx[0] * (1 + k * U) / smin if smin > 0 else math.inf
        if kappa * eps_x >= 0.5:
            continue
        with mpmath.workdps(DPS):
            qe, re = mpmath.qr(mpmath.matrix(x.tolist()), mode="skinny")
            qe = np.array(qe.tolist(), dtype=float)
            re = np.array(re.tolist(), dtype=float)
        qe, re = sign_fixed(qe, re)
        qs, rs = sign_fixed(qm, rm[:, :k])
        factor = math.sqrt(2) * kappa * eps_x / (1 - kappa * eps_x)
        dr = np.linalg.norm(rs - re)
        r_allowed = ((factor * sx[0] + uo * np.linalg.norm(rs) + eo * k) * (1 + gamma(k + 2))
                     + 2 * U * np.linalg.norm(re))
        dqn = np.linalg.norm(qs - qe)
        q_allowed = (factor + math.sqrt(k) * (g + dq)) * (1 + gamma(k + 2)) + 2 * U * math.sqrt(k)
        if part == "r" and not dr <= r_allowed:
            return f"matrix {i}: ||R - R_exact||_F {dr:.3e} > {r_allowed:.3e} (signs fixed)"
        if part == "q" and not dqn <= q_allowed:
            return f"matrix {i}: ||Q - Q_exact||_F {dqn:.3e} > {q_allowed:.3e} (signs fixed)"
    return None


# -- svd -------------------------------------------------------------------------------------------
def exact_svd(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Singular values (descending) and both sets of singular vectors [m, k], [n, k] from the
    eigenpairs of the exact k x k Gram matrix (mpmath at DPS digits); vectors of zero singular
    values are NaN (not determined)."""
    m, n = a.shape
    tall = m >= n
    w = a if tall else a.T  # [., k]
    fr = [[Fraction(float(v)) for v in r] for r in w]
    k = w.shape[1]
    with mpmath.workdps(DPS):
        gram = mpmath.matrix(k, k)
        for p in range(k):
            for c in range(p, k):
                v = sum((fr[t][p] * fr[t][c] for t in range(w.shape[0])), Fraction(0))
                gram[p, c] = gram[c, p] = mpmath.mpf(v.numerator) / v.denominator
        lam, vecs = mpmath.eigsy(gram)
        order = sorted(range(k), key=lambda j: -lam[j])
        s = [mpmath.sqrt(max(lam[j], 0)) for j in order]
        right = np.array([[float(vecs[r, j]) for j in order] for r in range(k)]).reshape(k, k)
        wm = mpmath.matrix(w.tolist())
        left = np.full((w.shape[0], k), np.nan)
        for c, j in enumerate(order):
            if s[c] > mpmath.mpf(2) ** -1000:
                col = wm * vecs[:, j] / s[c]
                left[:, c] = [float(col[t]) for t in range(w.shape[0])]
        sv = np.array([float(v) for v in s])
    return (sv, left, right) if tall else (sv, right, left)


def subspace_gaps(s: np.ndarray, extra_zero: bool, tol: float) -> list[tuple[list[int], float]]:
    """Clusters of singular values (neighbours within tol) and each one's distance delta to the
    other singular values (and to 0 when extra_zero: that side has more dimensions)."""
    clusters: list[list[int]] = []
    for i in range(len(s)):
        if clusters and s[clusters[-1][-1]] - s[i] <= tol:
            clusters[-1].append(i)
        else:
            clusters.append([i])
    out = []
    for c in clusters:
        rest = [abs(s[c[-1]] - s[j]) if s[j] < s[c[-1]] else abs(s[j] - s[c[0]])
                for j in range(len(s)) if j not in c]
        if extra_zero:
            rest.append(s[c[-1]])
        out.append((c, min(rest) if rest else math.inf))
    return out


def check_svd(case: matrix.Case, out: np.ndarray | None = None) -> str | None:
    part = case.attr_dict["part"]
    (a,) = matrix.make_inputs(case)
    parts = {p: (np.asarray(out) if p == part and out is not None else run(case, [a], part=p))
             for p in ("u", "s", "vt")}
    m, n = a.shape[-2:]
    k = min(m, n)
    want = {"u": a.shape[:-2] + (m, k), "s": a.shape[:-2] + (k,), "vt": a.shape[:-2] + (k, n)}
    for p, v in parts.items():
        if v.shape != want[p] or v.dtype != a.dtype:
            return f"{p}: shape/dtype {v.shape} {v.dtype}, want {want[p]} {a.dtype}"
    if a.size == 0:
        return None
    uo, eo = UNIT[case.dtype], ETA[case.dtype]
    g = gtilde(m, n)
    us, ss, vts = (mats(parts["u"].astype(np.float64)), parts["s"].astype(np.float64).reshape(-1, k),
                   mats(parts["vt"].astype(np.float64)))
    for i, am in enumerate(mats(a.astype(np.float64))):
        um, sm, vm = us[i], ss[i], vts[i].T
        if not (np.all(np.isfinite(um)) and np.all(np.isfinite(sm)) and np.all(np.isfinite(vm))):
            return f"matrix {i}: non-finite factors"
        sigma, ue, ve = exact_svd(am)
        fro = float(np.linalg.norm(am))
        e2 = g * fro  # ||dA||_2 <= ||dA||_F
        if part == "s":
            if np.any(np.diff(sm) > 0):
                return f"matrix {i}: singular values not descending: {sm}"
            err = np.abs(sm - sigma)
            allowed = (e2 + uo * np.abs(sm) + eo) * (1 + 4 * U) + 4 * U * sigma
            if np.any(~(err <= allowed)):
                j = int(np.argmax(err - allowed))
                return f"matrix {i}: s[{j}] {sm[j]} vs exact {sigma[j]}: {err[j]:.3e} > {allowed[j]:.3e}"
            continue
        fac = um if part == "u" else vm
        dim = m if part == "u" else n
        dq = uo + eo * math.sqrt(dim)  # each column's output rounding
        orth_allowed = (2 * math.sqrt(k) * (g + dq) + k * (g + dq) ** 2) * (1 + gamma(dim + 2))
        orth = float(np.linalg.norm(fac.T @ fac - np.eye(k)))
        if not orth <= orth_allowed:
            return f"matrix {i}: ||{part}^T {part} - I||_F {orth:.3e} > {orth_allowed:.3e}"
        recon = float(np.linalg.norm(am - (um * sm) @ vm.T))
        slack_u = 2 * math.sqrt(k) * (g + uo + eo * math.sqrt(m))
        slack_v = 2 * math.sqrt(k) * (g + uo + eo * math.sqrt(n))
        smax = float(np.max(sm)) if k else 0.0
        recon_allowed = ((g * fro) + (slack_u + slack_v + uo) * math.sqrt(k) * smax * 2
                         + eo * math.sqrt(k)) * (1 + gamma(k + 4)) + 4 * U * fro
        if not recon <= recon_allowed:
            return f"matrix {i}: ||A - U S V^T||_F {recon:.3e} > {recon_allowed:.3e}"
        exact = ue if part == "u" else ve
        extra = (m if part == "u" else n) > k
        slack = slack_u if part == "u" else slack_v
        for cluster, delta in subspace_gaps(sigma, extra, 4 * e2):
            if delta - e2 <= 0 or np.isnan(exact[:, cluster]).any():
                continue
            got, ex = fac[:, cluster], exact[:, cluster]
            sin = float(np.linalg.norm(got - ex @ (ex.T @ got), 2))
            allowed = (math.sqrt(2) * e2 / (delta - e2) + slack + 2 * U * dim) * (1 + gamma(dim + 2))
            if not sin <= allowed:
                return (f"matrix {i}: singular subspace {cluster} of {part}: sin theta {sin:.3e} > "
                        f"{allowed:.3e} (gap {delta:.3e})")
    return None


CHECKS = {"det": check_det, "log_det": check_log_det, "dense_solve": check_solve,
          "batched_dense_solve": check_solve, "cholesky": check_cholesky,
          "triangular_solve": check_triangular, "svd": check_svd, "qr": check_qr}


@pytest.mark.parametrize("op", OPS)
def test_reference_against_exact_and_mpmath_oracles(op: str) -> None:
    assert_each_case((c for c in CASES if c.op == op), CHECKS[op])


def _transposed_solve(case: matrix.Case, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The reference's solve of A^T x = b (a transposed operand)."""
    return run(case, [np.swapaxes(a, -1, -2).copy(), b])


def _flipped_triangle_solve(case: matrix.Case, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
    """op(T) taken the wrong way round (transpose ignored or inverted)."""
    return run(case, [a, b], transpose=not case.attr_dict["transpose"])


def wrong_result(case: matrix.Case, ins: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """The reference's result made wrong the way a plausible kernel bug would."""
    op, part = case.op, case.attr_dict.get("part")
    f64 = out.astype(np.float64)
    if op == "det":
        return -out  # the permutation's sign dropped
    if op == "log_det":
        return (f64 + math.log(2)).astype(out.dtype)  # a pivot off by a factor 2
    if op in ("dense_solve", "batched_dense_solve"):
        return _transposed_solve(case, *ins, out)
    if op == "triangular_solve":
        return _flipped_triangle_solve(case, *ins, out)
    if op == "cholesky":
        return (f64 * (1 + 2.0 ** -16)).astype(out.dtype)
    if op == "svd" and part == "s":
        return out[..., ::-1].copy()  # ascending
    if op == "svd" and part == "u":
        return (f64 * 1.01).astype(out.dtype)  # unnormalised columns
    if op == "svd":  # V's first two singular vectors swapped
        return out[..., [1, 0] + list(range(2, out.shape[-2])), :].copy()
    if part == "q":
        return (f64 * 1.01).astype(out.dtype)  # unnormalised Q
    if out.shape[-1] == out.shape[-2]:
        return np.swapaxes(out, -1, -2).copy()  # R transposed
    return (f64 * (1 + 2.0 ** -12)).astype(out.dtype)



@pytest.mark.parametrize("op", OPS)
def test_the_oracle_rejects_a_wrong_kernel(op: str) -> None:
    """Each comparison can fail: a deliberately wrong reference result is caught in every
    float32 and float64 'random' case of at least two rows: det with the wrong sign, log_det
    off by log 2 (a pivot off by 2), a transposed solve, triangular_solve with transpose
    flipped, a Cholesky factor 2^-16 too large, singular values ascending, U unnormalised,
    V's first two singular vectors swapped, Q unnormalised, R transposed (square) or
    2^-12 too large."""
    tried = caught = 0
    for case in (c for c in CASES if c.op == op and c.vals == "random" and c.dtype in ("float32", "float64")):
        ins = matrix.make_inputs(case)
        if ins[0].shape[-2] < 2 or ins[0].size == 0:
            continue
        out = run(case, list(ins))
        tried += 1
        caught += CHECKS[op](case, wrong_result(case, ins, out)) is not None
    assert tried > 0 and caught == tried, (caught, tried)
