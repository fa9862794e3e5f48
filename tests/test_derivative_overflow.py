"""The derivative judge's two evaluation allowances (judge/bounds/derivative.py): the rounding of
a derivative formula's own arguments ([[argument]] in cases/derivatives.toml, the sensitivities
next to the reference rules) and terms that may each overflow ([[overflow]]). Each is checked
both ways: the behaviour of a good implementation, simulated here in float32 as PyTorch, JAX and
MLX evaluate the formula, is accepted; a wrong derivative that the allowance must not hide (a
missing factor, an argument with more roundings than declared, a few ulp off at a benign point, a
NaN where nothing overflows) is rejected."""
from __future__ import annotations

import math

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.cpu._grad import argument_sensitivity, largest_intermediate
from rlx_conformance.judge.bounds.derivative import derivative_judgement
from rlx_conformance.judge.compare import compare
from rlx_conformance.judge.tolerances import default_tolerance

CPU = get_backend("cpu")
F32 = np.float32


def _judge(op: str, kind: str, inputs: list[np.ndarray], seeds: list[np.ndarray], k: int,
           actual: np.ndarray, use_argument: bool = True) -> bool:
    """Whether ``actual`` (float32) passes as result ``k`` of ``op``'s ``kind`` at float64
    ``inputs``, judged as run/derivatives.judge does."""
    exp = CPU.run_derivative(op, kind, inputs, {}, seeds if kind == "vjp" else [],
                             seeds if kind == "jvp" else [])[k].astype(F32)
    mags, terms = CPU.run_magnitude(op, kind, inputs, {}, seeds)
    arg = argument_sensitivity(op, kind, inputs, {}, seeds) if use_argument else None
    inter = largest_intermediate(op, kind, inputs, {})
    bound = derivative_judgement(op, "float32", mags[k], terms, argument=None if arg is None else arg[k],
                                 intermediate=None if inter is None else inter[k])
    return compare(exp, np.asarray(actual, F32), exact=False, signed_zero=False,
                   tol=default_tolerance("float32"), bound=bound).ok


def _erf_d(x: np.ndarray, c: float = 2 / math.sqrt(math.pi), extra_roundings: int = 0) -> np.ndarray:
    """erf' in float32 as implementations form it: fl(x * x), then 2/sqrt(pi) e^(-w) with the
    exponential correctly rounded (its error is in the op's [[rule]] count, not at stake here);
    ``extra_roundings`` perturbs w by that many more relative roundings (a wrong argument)."""
    w = (x.astype(F32) * x.astype(F32)).astype(np.float64) * (1 + extra_roundings * 2.0 ** -24)
    return (F32(c) * np.exp(-w).astype(F32)).astype(F32)


# full float32 significands (x * x rounds), |x| where x^2 is 6 to 80
ERF_X = (np.random.default_rng(16).uniform(2.5, 9.0, 512) * np.resize([1, -1], 512)).astype(F32).astype(np.float64)


def test_erf_argument_rounding_is_accepted_and_needed():
    u = np.ones_like(ERF_X)
    got = _erf_d(ERF_X)
    assert _judge("erf", "vjp", [ERF_X], [u], 0, got)
    assert _judge("erf", "jvp", [ERF_X], [u], 0, got)
    # the allowance is what accepts it: x^2 u relative is beyond gamma_9 for x^2 ~ 36
    assert not _judge("erf", "vjp", [ERF_X], [u], 0, got, use_argument=False)


def test_erf_wrong_derivatives_are_still_rejected():
    u = np.ones_like(ERF_X)
    assert not _judge("erf", "vjp", [ERF_X], [u], 0, _erf_d(ERF_X, c=1 / math.sqrt(math.pi)))  # factor 2 lost
    assert not _judge("erf", "vjp", [ERF_X], [u], 0, _erf_d(ERF_X, extra_roundings=6))  # argument off 6 u


def _pow_da(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b a^(b-1) in float32 with b - 1 rounded (PyTorch pow_backward_self), pow correctly rounded."""
    bm1 = (b.astype(F32) - F32(1)).astype(np.float64)
    return (b.astype(F32) * np.power(a, bm1).astype(F32)).astype(F32)


def test_pow_exponent_rounding_is_accepted():
    # b - 1 rounds where b's last bit is lost (|b - 1| in a higher binade); |ln a| up to 9
    rng = np.random.default_rng(11)
    a = np.exp(rng.uniform(-9, -4, 256)).astype(F32).astype(np.float64)
    b = rng.uniform(-8, -3.5, 256).astype(F32).astype(np.float64)
    u = np.ones_like(a)
    got = _pow_da(a, b)
    assert _judge("pow", "vjp", [a, b], [u], 0, got)
    assert not _judge("pow", "vjp", [a, b], [u], 0, got, use_argument=False)


def test_pow_derivative_off_by_8_ulp_at_a_benign_point_is_rejected():
    # a = 1.0625, b = 2: d/da = 2.125 (just above a power of two), ln a (b - 1) = 0.06
    a, b, u = np.array([1.0625]), np.array([2.0]), np.array([1.0])
    right = _pow_da(a, b)
    assert _judge("pow", "vjp", [a, b], [u], 0, right)
    off = right.view(np.uint32) + np.uint32(8)
    assert not _judge("pow", "vjp", [a, b], [u], 0, off.view(F32))


def test_products_overflow_outcomes_are_legal_only_where_the_terms_overflow():
    # reduce_prod's JVP sum_i t_i prod_{j != i} x_j over rows of 48 factors: 8^47 ~ 2.8e42 is
    # past float32's range, so row 0's terms overflow with either sign (NaN = inf - inf is
    # legal there); row 1's (1.5^47 ~ 1.9e8) do not
    x = np.stack([np.full(48, 8.0), np.full(48, 1.5)])
    t = np.stack([np.resize([1.0, -1.0], 48)] * 2) * (1 + np.arange(48) / 100)
    attrs = {"axes": [1], "keep_dim": False}
    exp = CPU.run_derivative("reduce_prod", "jvp", [x], attrs, [], [t])[0].astype(F32)
    mags, terms = CPU.run_magnitude("reduce_prod", "jvp", [x], attrs, [t])
    bound = derivative_judgement("reduce_prod", "float32", mags[0], terms)
    assert np.asarray(bound.free).tolist() == [True, False]
    tol = default_tolerance("float32")

    def ok(actual):
        return compare(exp, np.asarray(actual, F32), exact=False, signed_zero=False, tol=tol, bound=bound).ok
    assert ok([np.nan, exp[1]]) and ok([np.inf, exp[1]]) and ok([-np.inf, exp[1]])
    # ... but not where the terms stay in range, nor a wrong finite value there
    assert not ok([np.nan, np.nan])
    assert not ok([np.nan, exp[1] * F32(1.001)])


def test_no_overflow_allowance_for_a_single_product():
    # mul declares no [[overflow]]: its derivative is one product, which overflows to the
    # reference's own infinity; NaN there is wrong
    a, b, u = np.array([3e38]), np.array([2.0]), np.array([4.0])
    exp = CPU.run_derivative("mul", "vjp", [a, b], {}, [u], [])[1].astype(F32)
    mags, terms = CPU.run_magnitude("mul", "vjp", [a, b], {}, [u])
    bound = derivative_judgement("mul", "float32", mags[1], terms)
    assert np.isinf(exp[0])
    assert not compare(exp, np.array([np.nan], F32), exact=False, signed_zero=False,
                       tol=default_tolerance("float32"), bound=bound).ok


def test_pow_intermediate_overflow_is_legal_only_where_a_pow_b_minus_1_overflows():
    # d/da a^b = b a^(b-1) at a = 4.6e-44 (a float32 subnormal), b = 0.1: a^(b-1) ~ 1e39 is past
    # float32's range while b a^(b-1) ~ 1e38 is not; every implementation forms a^(b-1) first
    a = np.array([4.6e-44, 2.0], F32).astype(np.float64)
    b = np.array([0.1, 0.1], F32).astype(np.float64)
    u = np.array([1.0, 1.0])
    right = _pow_da(a, b)
    assert np.isinf(right[0]) and np.isfinite(right[1])
    assert _judge("pow", "vjp", [a, b], [u], 0, right)
    assert not _judge("pow", "vjp", [a, b], [u], 0, np.array([right[0], np.inf], F32))


def _softsign_d(x: np.ndarray, sign: float = -1.0, square: bool = True) -> np.ndarray:
    """softsign' by the quotient rule in float32, as autodiff of x / (1 + |x|) forms it:
    1/(1 + |x|) - |x|/(1 + |x|)^2, whose terms cancel for large |x|."""
    x32 = x.astype(F32)
    a = F32(1) + np.abs(x32)
    t1 = F32(1) / a
    t2 = np.abs(x32) / (a * a if square else a)
    return (t1 + F32(sign) * t2).astype(F32)


def test_quotient_rule_cancellation_is_accepted_and_wrong_rules_are_not():
    x = (np.random.default_rng(7).uniform(2.0, 40.0, 512) * np.resize([1, -1], 512)).astype(F32).astype(np.float64)
    u = np.ones_like(x)
    got = _softsign_d(x)
    assert _judge("softsign", "vjp", [x], [u], 0, got)
    assert not _judge("softsign", "vjp", [x], [u], 0, got, use_argument=False)
    assert not _judge("softsign", "vjp", [x], [u], 0, _softsign_d(x, sign=1.0))  # a term's sign flipped
    assert not _judge("softsign", "vjp", [x], [u], 0, (F32(1) / (F32(1) + np.abs(x.astype(F32)))).astype(F32))


def _softplus_d(x: np.ndarray, y_ulps: int = 0) -> np.ndarray:
    """softplus' = exp(x - y) from the saved float32 forward value y (logaddexp's derivative from
    its output, as JAX and MLX form it), exp correctly rounded; ``y_ulps``: y that many ulp off."""
    y = np.logaddexp(0.0, x).astype(F32)
    y = (y.view(np.uint32) + np.uint32(y_ulps)).view(F32)
    return np.exp((x.astype(F32) - y).astype(np.float64)).astype(F32)


def test_softplus_saved_output_argument_is_accepted_and_a_worse_one_is_not():
    # x >> 0: y = softplus(x) ~ x, so the forward's own error (its 2 ulp budget) in the saved y
    # is an absolute error of 2 ulp(x) in x - y, that much relative in f' = e^(x - y) ~ 1
    x = np.random.default_rng(5).uniform(8.0, 16.0, 512).astype(F32).astype(np.float64)
    u = np.ones_like(x)
    assert _judge("softplus", "jvp", [x], [u], 0, _softplus_d(x))
    assert _judge("softplus", "jvp", [x], [u], 0, _softplus_d(x, y_ulps=2))
    assert not _judge("softplus", "jvp", [x], [u], 0, _softplus_d(x, y_ulps=2), use_argument=False)
    assert not _judge("softplus", "jvp", [x], [u], 0, _softplus_d(x, y_ulps=16))  # y beyond its budget
    # log_sigmoid = -softplus(-x) mirrors it
    assert _judge("log_sigmoid", "jvp", [-x], [u], 0, _softplus_d(x, y_ulps=2))
