"""What a sum or a product of many terms may return besides a value within its error bound: the
non-finite and overflow semantics that every accumulating op's bound shares.

A bound such as gamma_(n-1) * sum|x| says how far a *finite* result may be from the exact one; it
is NaN or inf as soon as a term is, so it cannot say what a NaN or an infinity among the terms
must give. IEEE arithmetic does, for every order of evaluation (the spec allows any):

Sums (terms: elements, products a_k b_k, updates). Let P and N be the sums of the finite
positive terms and of the magnitudes of the finite negative ones. A partial sum of some order
can overflow to +inf only if P (1 + gamma_n) exceeds the largest finite value of the compute
dtype (each partial sum of positive terms is at most P (1 + gamma_n): Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., Lemma 3.1), and to -inf likewise with N.
* a NaN term, or infinite terms of both signs: NaN in every order (inf - inf = NaN);
* +inf terms and no -inf: +inf, unless N can overflow: then a -inf partial sum may meet the
  +inf (NaN): order-dependent, {+inf, NaN};
* finite terms only: within the bound, unless P or N can overflow: then order-dependent, a
  finite value within the bound (no partial sum overflowed), +inf if P can overflow, -inf if N
  can, NaN if both. This is the case of [3e38, 3e38, -3e38] in float32: exact 3e38, some orders
  overflow (inf), none gives anything else: 12345 is wrong in every order.

Products (factors). With up (down) the sum of the positive (negative) log2|x| over the finite
nonzero factors, a partial product of some order can overflow only if up >= log2(max), and
enter the subnormal range (losing its relative accuracy, or underflowing to 0) only if
down <= log2(smallest normal):
* a NaN factor, or an infinite and a zero factor: NaN in every order (inf * 0);
* an infinite factor (no zero): +-inf with the sign of the product, unless a partial product
  may underflow to 0 (0 * inf): then {+-inf, NaN};
* a zero factor (no infinity): 0, unless a partial product may overflow (inf * 0): then {0, NaN};
* finite nonzero factors: within the relative bound, unless the range may be left: overflow
  adds +-inf (the product's sign), underflow any finite value (gradual underflow amplified by
  the later factors has no useful bound), both NaN.

The reference computes float16/bfloat16/float32 in float64, where none of these partial sums or
products leave the range, so its result is the exactly rounded one; in float64 it computes in
the dtype it judges, and may itself have taken an overflowing order (REF_MAY_OVERFLOW).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.gamma import gamma
from rlx_conformance.judge.compare import (
    ANY_FINITE,
    FINITE,
    NAN,
    NEG_INF,
    POS_INF,
    REF_MAY_OVERFLOW,
    Bound,
)

Reduce = Callable[[np.ndarray], np.ndarray]  # a linear map summing terms into outputs (float64)


@dataclass(frozen=True)
class SumTerms:
    """Per output of a sum: what its terms hold (float64 sums and bool flags)."""

    pos: np.ndarray  # sum of the finite positive terms
    neg: np.ndarray  # sum of the magnitudes of the finite negative terms
    nan: np.ndarray  # some term is NaN
    pinf: np.ndarray  # some term is +inf
    ninf: np.ndarray  # some term is -inf

    @property
    def abs_sum(self) -> np.ndarray:
        """sum |x| over the finite terms (what the error bound scales with)."""
        return self.pos + self.neg

    def plus(self, other: SumTerms) -> SumTerms:
        """The terms of two sums added together (e.g. a convolution and its bias)."""
        return SumTerms(self.pos + other.pos, self.neg + other.neg, self.nan | other.nan,
                        self.pinf | other.pinf, self.ninf | other.ninf)


def sum_terms(x: np.ndarray, reduce: Reduce) -> SumTerms:
    """The terms of sums of the elements of ``x``, ``reduce`` summing them into the outputs."""
    x64 = np.asarray(x, np.float64)
    fin = np.isfinite(x64)
    with np.errstate(over="ignore", invalid="ignore"):
        pos = reduce(np.where(fin & (x64 > 0), x64, 0.0))
        neg = reduce(np.where(fin & (x64 < 0), -x64, 0.0))
    flag = lambda m: reduce(m.astype(np.float64)) > 0
    return SumTerms(pos, neg, flag(np.isnan(x64)), flag(x64 == np.inf), flag(x64 == -np.inf))


def bilinear_terms(f: Callable[[np.ndarray, np.ndarray], np.ndarray], a: np.ndarray,
                   b: np.ndarray) -> SumTerms:
    """The terms a_k b_k of a bilinear op f(a, b) that sums products (matmul, convolution),
    evaluated through f itself on split operands: the positive products are a+ b+ and a- b-,
    the negative ones a+ b- and a- b+ (finite parts); a product is NaN when a factor is NaN or an
    infinity meets a zero, +-inf when an infinity meets a nonzero of known sign."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fa, fb = np.isfinite(a64), np.isfinite(b64)

    def parts(x, fin):
        return np.where(fin & (x > 0), x, 0.0), np.where(fin & (x < 0), -x, 0.0)

    ap, an = parts(a64, fa)
    bp, bn = parts(b64, fb)
    with np.errstate(over="ignore", invalid="ignore"):
        pos = f(ap, bp) + f(an, bn)
        neg = f(ap, bn) + f(an, bp)
    zero = np.zeros(pos.shape, bool)
    if fa.all() and fb.all():
        return SumTerms(pos, neg, zero, zero, zero)
    ind = lambda m: m.astype(np.float64)
    one_a, one_b = np.ones_like(a64), np.ones_like(b64)
    with np.errstate(over="ignore", invalid="ignore"):
        nan = f(ind(np.isnan(a64)), one_b) + f(one_a, ind(np.isnan(b64))) + \
            f(ind(np.isinf(a64)), ind(b64 == 0)) + f(ind(a64 == 0), ind(np.isinf(b64)))
        a_pos, a_neg = ind(a64 > 0), ind(a64 < 0)  # infinities included, NaN not
        b_pos, b_neg = ind(b64 > 0), ind(b64 < 0)
        pinf = f(ind(a64 == np.inf), b_pos) + f(ind(a64 == -np.inf), b_neg) + \
            f(a_pos, ind(b64 == np.inf)) + f(a_neg, ind(b64 == -np.inf))
        ninf = f(ind(a64 == np.inf), b_neg) + f(ind(a64 == -np.inf), b_pos) + \
            f(a_pos, ind(b64 == -np.inf)) + f(a_neg, ind(b64 == np.inf))
    return SumTerms(pos, neg, nan > 0, pinf > 0, ninf > 0)


def sum_judgement(t: SumTerms, bound: np.ndarray, out_dtype: str, n: int | np.ndarray) -> Bound:
    """The judgement of sums of at most ``n`` terms each: ``bound`` (the finite-value error bound)
    where every order gives a finite value, exact where every order gives the same NaN or
    infinity, order-dependent with the legal outcomes of the module docstring elsewhere."""
    cdt = dt.compute_dtype(out_dtype)
    fi = dt.finfo(cdt)
    growth = 1 + gamma(np.maximum(n, 1), fi.unit_roundoff)
    with np.errstate(over="ignore", invalid="ignore"):
        over_p = t.pos * growth > fi.max
        over_n = t.neg * growth > fi.max
    nan = t.nan | (t.pinf & t.ninf)
    inf_p = ~nan & t.pinf
    inf_n = ~nan & t.ninf
    finite = ~nan & ~t.pinf & ~t.ninf
    free_inf = (inf_p & over_n) | (inf_n & over_p)
    free_fin = finite & (over_p | over_n)
    ref = REF_MAY_OVERFLOW if cdt == "float64" else 0
    allow = np.where(inf_p, POS_INF | NAN, 0) | np.where(inf_n, NEG_INF | NAN, 0)
    allow = np.where(free_fin, FINITE | ref | np.where(over_p, POS_INF, 0) | np.where(over_n, NEG_INF, 0)
                     | np.where(over_p & over_n, NAN, 0), allow)
    abs_ = np.where(finite, np.broadcast_to(bound, np.shape(finite)), 0.0)
    return Bound(abs_, free_inf | free_fin, allow.astype(np.uint8))


@dataclass(frozen=True)
class ProdTerms:
    """Per output of a product: what its factors hold."""

    nan: np.ndarray  # some factor is NaN
    inf: np.ndarray  # some factor is +-inf
    zero: np.ndarray  # some factor is +-0
    negative: np.ndarray  # the product's sign bit (odd count of factors with the sign bit set)
    up: np.ndarray  # sum of the positive log2|x| over the finite nonzero factors
    down: np.ndarray  # sum of the negative log2|x| over the finite nonzero factors


def prod_terms(x: np.ndarray, reduce: Reduce) -> ProdTerms:
    """The factors of products of the elements of ``x``, ``reduce`` summing over them."""
    x64 = np.asarray(x, np.float64)
    ok = np.isfinite(x64) & (x64 != 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.where(ok, np.log2(np.where(ok, np.abs(x64), 1.0)), 0.0)
    flag = lambda m: reduce(m.astype(np.float64)) > 0
    neg_count = reduce((np.signbit(x64) & ~np.isnan(x64)).astype(np.float64))
    return ProdTerms(flag(np.isnan(x64)), flag(np.isinf(x64)), flag(x64 == 0), neg_count % 2 == 1,
                     reduce(np.maximum(lg, 0.0)), reduce(np.minimum(lg, 0.0)))


def prod_judgement(t: ProdTerms, bound: np.ndarray, out_dtype: str, n: int | np.ndarray) -> Bound:
    """The judgement of products of at most ``n`` factors: ``bound`` where every order stays in
    range, exact NaN/inf/0 where every order agrees, order-dependent (module docstring) where
    a partial product may leave the exponent range."""
    cdt = dt.compute_dtype(out_dtype)
    fi = dt.finfo(cdt)
    slack = np.log2(1 + gamma(np.maximum(n, 1), fi.unit_roundoff))
    up_risk = t.up + slack >= math.log2(fi.max)
    down_risk = t.down - slack <= math.log2(fi.tiny)
    nan = t.nan | (t.inf & t.zero)
    inf = ~nan & t.inf
    zero = ~nan & t.zero
    finite = ~nan & ~t.inf & ~t.zero
    signed_inf = np.where(t.negative, NEG_INF, POS_INF)
    ref = REF_MAY_OVERFLOW if cdt == "float64" else 0
    free = (inf & down_risk) | (zero & up_risk) | (finite & (up_risk | down_risk))
    allow = np.where(inf, signed_inf | NAN, 0) | np.where(zero, NAN | ref, 0)
    fin_allow = FINITE | ref | np.where(up_risk, signed_inf, 0) | np.where(down_risk, ANY_FINITE, 0) | \
        np.where(up_risk & down_risk, NAN, 0)
    allow = np.where(finite, fin_allow, allow)
    abs_ = np.where(finite, np.broadcast_to(bound, np.shape(finite)), 0.0)
    return Bound(abs_, free, np.where(free, allow, 0).astype(np.uint8))
