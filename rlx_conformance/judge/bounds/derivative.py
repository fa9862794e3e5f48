"""The error bound of a derivative (vjp, jvp, hvp) computed by the backend under test.

A good implementation computes Jᵀu (or J v, or the HVP) as a sum of rounded products of Jacobian
entries and seeds, each entry itself a short formula evaluated in the compute precision, possibly
from the rounded forward values it saved (as reverse-mode AD does). Its error is then at most

    gamma_(terms + roundings)(u) * M  +  (terms + roundings) * eta   (the latter where M > 0)

(Higham Lemma 3.1 and sec. 2.1, gamma in gamma.py) where u is the unit roundoff of the dtype it
computes in, eta the smallest subnormal of that dtype (gradual underflow's absolute error; not
for the native data-movement ops, which only add), ``M`` the reference's magnitude of the result's terms (DerivativeRule.magnitude: at least
|J|ᵀ|u| per input for a VJP, |J||v| per output for a JVP, plus the op's declared sensitivity to
the rounding of the saved forward values), ``terms`` the most products one result element
accumulates, and ``roundings`` the roundings inside one Jacobian entry's formula
(cases/derivatives.toml, one entry per reason). The final rounding to the result's dtype, of the
reference and of the target, is covered by the dtype's max_ulp (cases/tolerances.toml defaults),
added by compare() as for forward outputs.

Two allowances follow from how a good implementation must evaluate some derivatives (each
declared per op in cases/derivatives.toml, one table per reason):

* ``[[argument]]``: the formula of a Jacobian entry rounds an argument of its own before an
  elementary function amplifies it (erf' = 2/sqrt(pi) e^(-x^2) after x * x rounds; pow's
  b a^(b-1) after b - 1 rounds; softplus' = exp(x - softplus(x)) from the rounded forward value;
  a sum of product- or quotient-rule terms that cancels to f'). The reference declares, next to
  the op's rule, the sensitivity A of the result to a relative rounding of those arguments (the
  formula's condition number with respect to its argument times the seeds:
  backends/cpu/_grad.ARGUMENT_TERMS); the bound adds gamma_k(u) A, k the argument's roundings.
* ``[[overflow]]``: ops whose derivative sums terms that each may be beyond the compute dtype's
  range (the running products of cum_prod/reduce_prod, pow's two partials): where the terms'
  magnitude M overflows, the outcome depends on the order of evaluation as for a forward sum
  whose partial sums overflow (judge/bounds/summation.py), and +-inf or NaN (inf - inf) is legal.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from functools import cache

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge.bounds.gamma import gamma
from rlx_conformance.judge.compare import NAN, NEG_INF, POS_INF, Bound


@dataclass(frozen=True)
class Roundings:
    """The roundings inside one Jacobian entry of ``op`` and where that figure comes from."""

    count: int
    source: str


@cache
def roundings_for(op: str) -> Roundings:
    """The first [[rule]] of cases/derivatives.toml whose ops match ``op``, else [default]."""
    table = data.load("derivatives.toml")
    for i, r in enumerate(table.get("rule", [])):
        if not r.get("reason") or "roundings" not in r or not r.get("ops"):
            raise RlxError(f"cases/derivatives.toml rule #{i + 1} needs ops, roundings and a reason")
        if any(fnmatch.fnmatchcase(op, g) for g in r["ops"]):
            return Roundings(int(r["roundings"]), f"rule:{r['ops'][0]}")
    d = table.get("default")
    if not d or "roundings" not in d or not d.get("reason"):
        raise RlxError("cases/derivatives.toml needs a [default] with roundings and a reason")
    return Roundings(int(d["roundings"]), "default")


def _table_rule(op: str, section: str) -> Roundings | None:
    """The first ``[[section]]`` table of cases/derivatives.toml whose ops match ``op``."""
    for i, r in enumerate(data.load("derivatives.toml").get(section, [])):
        if not r.get("reason") or "roundings" not in r or not r.get("ops"):
            raise RlxError(f"cases/derivatives.toml {section} #{i + 1} needs ops, roundings and a reason")
        if any(fnmatch.fnmatchcase(op, g) for g in r["ops"]):
            return Roundings(int(r["roundings"]), f"{section}:{r['ops'][0]}")
    return None


@cache
def argument_roundings_for(op: str) -> Roundings | None:
    """The roundings the arguments of ``op``'s derivative formula carry ([[argument]]), or None
    where the op declares no argument sensitivity."""
    return _table_rule(op, "argument")


@cache
def overflow_rule_for(op: str) -> Roundings | None:
    """``op``'s [[overflow]] table (its derivative's terms may each overflow), or None."""
    return _table_rule(op, "overflow")


def _unit_roundoff(result_dtype: str, native: bool) -> float:
    return dt.finfo(result_dtype if native else dt.compute_dtype(result_dtype)).unit_roundoff


@cache
def _smallest_subnormal(result_dtype: str) -> float:
    return float(dt.finfo(dt.compute_dtype(result_dtype)).smallest_subnormal)


def derivative_judgement(op: str, result_dtype: str, magnitude: np.ndarray, terms: int,
                         native: bool = False, argument: np.ndarray | None = None,
                         intermediate: np.ndarray | None = None) -> Bound:
    """derivative_bound as a compare.Bound: for an op with an [[overflow]] table, the positions
    whose terms' magnitude (times the growth of their rounding), or the largest intermediate its
    formula forms before the seeds scale it (``intermediate``, declared by the reference:
    backends/cpu/_grad.INTERMEDIATES), exceeds the compute dtype's largest value are
    order-dependent, with +-inf and NaN legal there besides the reference's outcome and a finite
    value within the bound."""
    b = derivative_bound(op, result_dtype, magnitude, terms, native, argument)
    rule = overflow_rule_for(op)
    if rule is None:
        return Bound(b)
    cdt = result_dtype if native else dt.compute_dtype(result_dtype)
    u = dt.finfo(cdt).unit_roundoff
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.asarray(magnitude, np.float64) * (1 + gamma(int(terms) + rule.count, u))
        fmax = float(dt.finfo(cdt).max)
        over = (m > fmax) | np.isinf(np.asarray(magnitude, np.float64))
        if intermediate is not None:
            over = over | (np.asarray(intermediate, np.float64) > fmax)
    return Bound(b, over, np.where(over, POS_INF | NEG_INF | NAN, 0).astype(np.uint8))


def derivative_bound(op: str, result_dtype: str, magnitude: np.ndarray, terms: int,
                     native: bool = False, argument: np.ndarray | None = None) -> np.ndarray:
    """The absolute error allowed at each element of one derivative result (before the final
    rounding to ``result_dtype``, which the dtype's max_ulp covers): gamma_(terms + roundings)(u)
    times the magnitude, with u of the dtype the op computes ``result_dtype`` in: float32 for a
    float16/bfloat16 result, except for ops that stay in their dtype (``native``: OpSpec
    low_precision "native", the data movement ops, whose derivatives add cotangents there).
    ``argument``: the sensitivity to the rounding of the formula's own arguments (the module
    docstring), allowed gamma_k(u) with k from the op's [[argument]] table."""
    u = _unit_roundoff(result_dtype, native)
    n = int(terms) + roundings_for(op).count
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.asarray(magnitude, np.float64)
        b = gamma(n, u) * m
        if not native:
            # gradual underflow: a product or quotient whose result is subnormal carries an
            # absolute error of up to half the smallest subnormal besides its relative one
            # (Higham sec. 2.1, fl(x op y) = (x op y)(1 + d) + e, |e| <= eta/2); one element's
            # evaluation has at most n such operations, each error carried on by later factors
            # of at most about 2 in magnitude (probabilities, normalised values), hence n eta.
            # Only where a term is nonzero: a sum of zero terms stays exactly zero. Sums of
            # native (data movement) derivatives only add, and addition has no underflow error.
            eta = _smallest_subnormal(result_dtype)
            b = b + np.where(m > 0, n * eta, 0.0)
        if argument is None:
            return b
        rule = argument_roundings_for(op)
        if rule is None:
            raise RlxError(f"{op}: an argument sensitivity without an [[argument]] table in "
                           "cases/derivatives.toml (its roundings and reason)")
        return b + gamma(rule.count, u) * np.asarray(argument, np.float64)
