"""The error bound of a graph's VJP (issue 17 item 6): first-order error propagation, node by
node, backwards.

The reference (run/graph_grad.py) runs reverse mode over the graph in float64: each node's
cotangent c (the sum of what its consumers hand back) goes through the CPU backend's VJP rule of
the node's op at the node's float64 inputs x, the same rules single-op derivative cases are
judged against; a cast between floats is the identity. The backend under test computes, at each
node, ĝ = VJP(x̂, ĉ) in the node's dtype from its own forward values x̂ (|x̂ - x| <= e, the
forward graph bound of judge/bounds/graph.py) and its own cotangent ĉ (|ĉ - c| <= E). So

    |ĝ - g| <= own + |J(x)|ᵀ E + curvature          (to first order in e and E)

* ``own``: the node's VJP rounding at its point, as a single-op derivative case of the op is
  judged (judge/bounds/derivative.py: gamma_(terms + roundings)(u) times the rule's magnitude,
  which holds the sensitivity to the rounding of saved forward values), taken at the cotangent's
  magnitude |c| + E, plus the final rounding of the result to the input's dtype (the
  derivative judge's max_ulp tolerance) and half an ulp, since the graph's reference keeps the
  float64 value: :func:`node_own_error`, built on graph.own_error as a forward node's own error.
* ``|J(x)|ᵀ E``: the error arriving from later nodes, through the rule's VJP magnitude with the
  cotangent error as the seed (>= |J|ᵀ|E|, computed by the run layer).
* ``curvature``: the VJP evaluated at x̂ instead of x: sum over the input elements j that carry
  forward error of the larger change of the reference VJP when x_j alone moves to x_j +- e_j
  (the run layer's coordinate secants). To first order that is sum_j |dg/dx_j| e_j, the exact
  worst case over |d| <= e; it also holds across a kink of an elementwise op within e_j (relu's
  0/1 slope: one of the two ends sees the other side). A kink of a non-elementwise op within the
  error (a near-tie of a max pool, DerivativeRule.radius < e) may route the cotangent to another
  element: those positions, and what they reach, are undecided (unasserted, counted), as a
  discrete node's near-ties are in the forward.
* Fan-out: an array read by m nodes gets its cotangent as a sum of m contributions, each rounded
  to its dtype, added in that dtype: gamma_(m-1)(u) times the sum of their magnitudes on top of
  their errors (:func:`accumulation_error`).
* Casts between floats: the cotangent crosses back cast to the input's dtype: the error plus one
  ulp of the input's dtype where it is narrower than the output's (:func:`cast_back_error`); the
  reference keeps the float64 value throughout.

Terms of order e·E and e^2 are left out: they are products of errors of a few ulps each, far
below any of the kept terms unless the graph is near a pole, where a failure to examine shows,
never a pass.
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.bounds.derivative import derivative_judgement
from rlx_conformance.judge.bounds.gamma import gamma
from rlx_conformance.judge.bounds.graph import own_error
from rlx_conformance.judge.compare import ulp_size
from rlx_conformance.judge.tolerances import default_tolerance


def node_own_error(op: str, dtype: str, grad_ref: np.ndarray, magnitude: np.ndarray, terms: int,
                   native: bool, argument: np.ndarray | None = None,
                   intermediate: np.ndarray | None = None) -> np.ndarray:
    """One node's own VJP rounding for one input (of ``dtype``): the op's single-op derivative
    judgement at the rule's ``magnitude`` (taken at the cotangent's magnitude) and ``terms``,
    with the allowances a single-op derivative case gets (cases/derivatives.toml): the
    roundings of the arguments its formula forms (``argument``, the reference's sensitivity
    A: [[argument]]) and the order-dependent positions where its terms or its largest
    ``intermediate`` overflow ([[overflow]]); plus the dtype's final rounding of the result
    ``grad_ref`` (float64) and half an ulp (graph.own_error); +inf where the derivative judge
    frees a position."""
    b = derivative_judgement(op, dtype, magnitude, terms, native=native, argument=argument,
                             intermediate=intermediate)
    return own_error(b, default_tolerance(dtype), grad_ref, dtype, exact=False)


def accumulation_error(contributions: list[np.ndarray], errors: list[np.ndarray], dtype: str) -> np.ndarray:
    """The error of a cotangent summed from ``contributions`` (float64 reference values, one per
    consumer) with ``errors`` each, added in ``dtype`` by the backend: the errors plus
    gamma_(m-1)(u) times the sum of the contributions' magnitudes (Higham Lemma 3.1 for a sum of
    m terms, in any order)."""
    e = np.sum(errors, axis=0)
    m = len(contributions)
    if m < 2 or not dt.is_float(dtype):
        return e
    mag = np.sum([np.abs(c) + x for c, x in zip(contributions, errors)], axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        return e + gamma(m - 1, dt.finfo(dtype).unit_roundoff) * mag


def cast_back_error(cot_ref: np.ndarray, err: np.ndarray, from_dtype: str, to_dtype: str) -> np.ndarray:
    """A float-to-float cast's VJP: the cotangent at its output (``from_dtype``) cast to its input's
    dtype ``to_dtype``; exact where ``to_dtype`` holds every value of ``from_dtype`` (a widening),
    else the error plus one ulp of ``to_dtype`` at |c| + E (the reference does not round)."""
    e = np.asarray(err, np.float64)
    if dt.finfo(to_dtype).bits >= dt.finfo(from_dtype).bits and not (
            {to_dtype, from_dtype} == {"float16", "bfloat16"}):
        return e
    with np.errstate(invalid="ignore", over="ignore"):
        return e + ulp_size(np.abs(np.asarray(cot_ref, np.float64)) + e, to_dtype)


def finite_or_inf(err: np.ndarray) -> np.ndarray:
    """An error bound with NaN (inf times 0, an overflowed magnitude) read as unbounded."""
    e = np.asarray(err, np.float64)
    return np.where(np.isnan(e), np.inf, e)
