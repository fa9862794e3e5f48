"""The error bound of a derivative (vjp, jvp, hvp) computed by the backend under test.

A good implementation computes Jᵀu (or J v, or the HVP) as a sum of rounded products of Jacobian
entries and seeds, each entry itself a short formula evaluated in the compute precision, possibly
from the rounded forward values it saved (as reverse-mode AD does). Its error is then at most

    gamma_(terms + roundings)(u) * M

(Higham Lemma 3.1, gamma in gamma.py) where u is the unit roundoff of the dtype it computes in,
``M`` the reference's magnitude of the result's terms (DerivativeRule.magnitude: at least
|J|ᵀ|u| per input for a VJP, |J||v| per output for a JVP, plus the op's declared sensitivity to
the rounding of the saved forward values), ``terms`` the most products one result element
accumulates, and ``roundings`` the roundings inside one Jacobian entry's formula
(cases/derivatives.toml, one entry per reason). The final rounding to the result's dtype, of the
reference and of the target, is covered by the dtype's max_ulp (cases/tolerances.toml defaults),
added by compare() as for forward outputs.
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


def derivative_bound(op: str, result_dtype: str, magnitude: np.ndarray, terms: int,
                     native: bool = False) -> np.ndarray:
    """The absolute error allowed at each element of one derivative result (before the final
    rounding to ``result_dtype``, which the dtype's max_ulp covers): gamma_(terms + roundings)(u)
    times the magnitude, with u of the dtype the op computes ``result_dtype`` in: float32 for a
    float16/bfloat16 result, except for ops that stay in their dtype (``native``: OpSpec
    low_precision "native", the data movement ops, whose derivatives add cotangents there)."""
    u = dt.finfo(result_dtype if native else dt.compute_dtype(result_dtype)).unit_roundoff
    n = int(terms) + roundings_for(op).count
    with np.errstate(invalid="ignore", over="ignore"):
        return gamma(n, u) * np.asarray(magnitude, np.float64)
