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
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


@dataclass
class _TermsCache:
    """The last few :func:`sum_terms` / :func:`prod_terms` results whose ``reduce`` names itself
    (a ``terms_key`` attribute: the reductions and scans of bounds/reduce.py and budgets.py,
    which build the same map from the same attributes): an op's worst-case bound and its
    accuracy budget both need the terms of the same input, at 10^5 elements a few ms each.
    Keyed by the map's name and the input's dtype, shape and bytes (kept and compared on a hit:
    never stale). The cached arrays are made read-only: a caller cannot change another's. The
    two uses run back to back (the bound, then the budget), so two entries suffice; inputs over
    ``max_bytes`` are not kept (their copy and terms would hold hundreds of MB). A dataclass, so
    that a repro bundle's repro.py (run/portable.py) can build a fresh one from its fields."""

    size: int = 2
    max_bytes: int = 1 << 25
    _d: OrderedDict[tuple, tuple[bytes, Any]] = field(default_factory=OrderedDict, init=False, repr=False)

    def get(self, kind: str, x: np.ndarray, reduce: Reduce, make: Callable[[], Any]):
        key = getattr(reduce, "terms_key", None)
        if key is None or np.asarray(x).nbytes > self.max_bytes:
            return make()
        data = np.ascontiguousarray(x).tobytes()
        k = (kind, key, np.asarray(x).dtype.str, np.shape(x), hash(data))
        hit = self._d.get(k)
        if hit is not None and hit[0] == data:
            return hit[1]
        v = make()
        for a in vars(v).values():
            if isinstance(a, np.ndarray):
                a.setflags(write=False)
        self._d[k] = (data, v)
        if len(self._d) > self.size:
            self._d.popitem(last=False)
        return v


TERMS_CACHE = _TermsCache()


def _where0(cond: np.ndarray, v: np.ndarray) -> np.ndarray:
    """np.where(cond, v, 0.0) for float64 ``v`` of ``cond``'s shape, bit for bit: +0.0 has no bit
    set, so v's bits and-ed with a mask of all ones where ``cond`` select it exactly (NaN and
    infinities included). np.where's select branches per element, which on a random sign costs
    ten times an arithmetic pass at 10^5 elements; the mask costs three. C-contiguous operands
    only (the layout np.where's result would have, which a later pairwise sum's grouping follows);
    others, and 0-d ones, go to np.where."""
    if not (isinstance(v, np.ndarray) and isinstance(cond, np.ndarray) and v.ndim and v.dtype == np.float64
            and v.shape == cond.shape and v.flags.c_contiguous and cond.flags.c_contiguous):
        return np.where(cond, v, 0.0)
    m = cond.astype(np.uint64)
    np.negative(m, out=m)  # 1 -> all ones
    m &= v.view(np.uint64)
    return m.view(np.float64)


def sum_terms(x: np.ndarray, reduce: Reduce) -> SumTerms:
    """The terms of sums of the elements of ``x``, ``reduce`` summing them into the outputs
    (computed once for a ``reduce`` with a ``terms_key``: :class:`_TermsCache`)."""
    return TERMS_CACHE.get("sum", x, reduce, lambda: _sum_terms(x, reduce))


def _sum_terms(x: np.ndarray, reduce: Reduce) -> SumTerms:
    x64 = np.asarray(x, np.float64)
    fin = np.isfinite(x64)
    every = bool(fin.all())
    with np.errstate(over="ignore", invalid="ignore"):
        pos = reduce(_where0(x64 > 0 if every else fin & (x64 > 0), x64))
        neg = reduce(_where0(x64 < 0 if every else fin & (x64 < 0), -x64))
    if every:  # no NaN or infinite term: each flag sums zeros (exactly 0, never > 0) — skip it
        none = lambda: np.zeros(np.shape(pos), bool)[()]  # [()]: a numpy bool where reduce gives one
        return SumTerms(pos, neg, none(), none(), none())
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
        return _where0(fin & (x > 0), x), _where0(fin & (x < 0), -x)

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
    if np.ndim(t.nan) and not (t.nan.any() or t.pinf.any() or t.ninf.any() or over_p.any() or over_n.any()):
        # finite terms whose partial sums cannot overflow in any order (the common case): the
        # general path's arrays below are the bound everywhere, nothing free or allowed
        shape = np.broadcast_shapes(np.shape(t.nan), np.shape(t.pinf), np.shape(t.ninf))
        fshape = np.broadcast_shapes(shape, np.shape(over_p), np.shape(over_n))
        return Bound(np.where(True, np.broadcast_to(bound, shape), 0.0), np.zeros(fshape, bool),
                     np.zeros(fshape, np.uint8))
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
    """The factors of products of the elements of ``x``, ``reduce`` summing over them
    (computed once for a ``reduce`` with a ``terms_key``: :class:`_TermsCache`)."""
    return TERMS_CACHE.get("prod", x, reduce, lambda: _prod_terms(x, reduce))


def _prod_terms(x: np.ndarray, reduce: Reduce) -> ProdTerms:
    x64 = np.asarray(x, np.float64)
    ok = np.isfinite(x64) & (x64 != 0)
    # finite nonzero factors only (the common case): no flag to sum (each would sum zeros:
    # exactly 0, never > 0), no factor to mask; the same terms in half the passes
    plain = bool(ok.all())
    with np.errstate(divide="ignore", invalid="ignore"):
        lg = np.log2(np.abs(x64)) if plain else np.where(ok, np.log2(np.where(ok, np.abs(x64), 1.0)), 0.0)
    flag = lambda m: reduce(m.astype(np.float64)) > 0
    neg_count = reduce((np.signbit(x64) if plain else np.signbit(x64) & ~np.isnan(x64)).astype(np.float64))
    if plain:
        none = lambda: np.zeros(np.shape(neg_count), bool)[()]  # [()]: a numpy bool where reduce gives one
        nan, inf, zero = none(), none(), none()
    else:
        nan, inf, zero = flag(np.isnan(x64)), flag(np.isinf(x64)), flag(x64 == 0)
    return ProdTerms(nan, inf, zero, neg_count % 2 == 1,
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
    if np.ndim(t.nan) and not (t.nan.any() or t.inf.any() or t.zero.any() or up_risk.any() or down_risk.any()):
        # finite nonzero factors whose partial products stay in range in any order (the common
        # case): the general path's arrays below are the bound everywhere, nothing free
        shape = np.broadcast_shapes(np.shape(t.nan), np.shape(t.inf), np.shape(t.zero))
        fshape = np.broadcast_shapes(shape, np.shape(up_risk), np.shape(down_risk))
        return Bound(np.where(True, np.broadcast_to(bound, shape), 0.0), np.zeros(fshape, bool),
                     np.zeros(fshape, np.uint8))
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
