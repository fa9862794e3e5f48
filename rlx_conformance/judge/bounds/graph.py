"""The error bound of a graph case: first-order error propagation, node by node.

Let x be a node's exact (float64 reference) inputs and x + d the inputs the backend under test
computed, |d| <= e componentwise. The node's output then differs from the reference's by at most

    E_out = own + |J(x)| e            (to first order in e)

``own``: the node's own rounding at its inputs, in the graph's dtype at that node: the op's
declared bound (``Policy.bound``, the same one single-op cases are judged with) plus its final
rounding (the tolerance's ulps at the result), or, for an op judged by ULP tolerance, that
tolerance (the larger of atol, rtol |y| and max_ulp ulp(y), since any one suffices there); plus
half an ulp, since a single-op tolerance compares two rounded results and the graph's reference
keeps the float64 value; 0 for an op judged bit-exactly (data movement, relu). ``|J(x)| e``: the
reference backend's componentwise magnitude of the node's JVP with tangent e
(DerivativeRule.magnitude through ``run_magnitude(op, "jvp")``: >= |J||e|, less the part of it
that is the derivative's sensitivity to the rounding of saved forward values, SAVED_TERMS, which
is no propagation of e: run/graphs.jacobian_product), computed by the run layer (run/graphs.py)
and handed here as arrays; this module does the arithmetic only.

What first order leaves out, and how it is handled:
* Terms of order e^2 (curvature): negligible while e is a few ulps of a smooth node's inputs,
  but not once e is a coarse dtype's spacing at a large input (sin of a float16 product near 934,
  spacing 0.5: found by the graph fuzzer). For an elementwise node the run layer therefore takes
  the larger of |f'(x)| e and the change of f over [x - e, x + e] (run/graphs.py _magnitude);
  other nodes stay first order, so a graph whose errors grow to the scale of their curvature
  (a deep chain near a pole) shows as a failure to examine, never a pass.
* Kinks (relu, max pool, abs): the slope at x can be 0 where x + d is across the kink. Where the
  op's smoothness radius (DerivativeRule.radius) is below e, the run layer takes the larger of
  the magnitudes at x, x + e and x - e (each side's slope): exact for elementwise piecewise-linear
  ops.
* Casts between floats (:func:`cast_error`): both sides round to the target dtype; the results
  differ by at most the input error plus one ulp of the target dtype at the larger magnitude
  (0 where the input error is 0 and the input is representable).
* Discrete nodes (comparisons, casts to integers, arg_max: no derivative): an erroneous input can
  flip the decision. :func:`decision_margin` marks the outputs whose decision lies within the
  propagated error (|a - b| <= e_a + e_b for a comparison; distance to the rounding threshold for
  a cast to an integer); every graph output those positions influence is left unasserted (its
  NaN/inf pattern too), counted, and said so in the record. A discrete node fed exact inputs
  propagates nothing.
* Non-differentiable inputs (indices, conditions) carry no error: they are graph inputs, exact.
"""
from __future__ import annotations

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.compare import ANYTHING, Bound, Tolerance, ulp_size


def rounding_allowance(tol: Tolerance, ref: np.ndarray, dtype: str) -> np.ndarray:
    """What a ULP tolerance allows at the reference value ``ref`` (float64) in ``dtype``: the
    largest of its three criteria (any one suffices in compare())."""
    r = np.abs(np.asarray(ref, np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        return np.maximum(np.maximum(tol.atol, tol.rtol * r), tol.max_ulp * ulp_size(r, dtype))


def own_error(bound: np.ndarray | Bound | None, tol: Tolerance, ref: np.ndarray, dtype: str,
              exact: bool) -> np.ndarray:
    """A node's own rounding error at each output element: 0 for a bit-exact op, else the op's
    bound (NaN or order-dependent positions: unbounded, +inf) plus the tolerance's allowance,
    or the allowance alone for an op without a bound."""
    ref = np.asarray(ref, np.float64)
    if exact or not dt.is_float(dtype):
        return np.zeros(ref.shape)
    # the tolerance compares two results rounded to ``dtype``; the reference here is the float64
    # value, unrounded: the target's own rounding of it adds half an ulp
    allow = rounding_allowance(tol, ref, dtype) + 0.5 * ulp_size(ref, dtype)
    b = Bound.of(bound)
    if b is None:
        return allow
    babs, free, _ = b.arrays(ref.shape)
    babs = np.where(free | np.isnan(babs), np.inf, babs)
    return babs + allow


def cast_error(ref_in: np.ndarray, e_in: np.ndarray, to: str) -> np.ndarray:
    """A float-to-float cast's output error: both sides round their inputs to ``to``; round is
    monotone and moves each value by less than one ulp of ``to``, so the rounded values differ
    by at most e + ulp(|x| + e) (0 where e is 0: the same value rounds the same way)."""
    x = np.abs(np.asarray(ref_in, np.float64))
    e = np.asarray(e_in, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(e > 0, e + ulp_size(x + e, to), 0.0)


def decision_margin(op: str, refs: list[np.ndarray], errs: list[np.ndarray | None],
                    out_shape: tuple[int, ...]) -> np.ndarray:
    """Where a discrete node's output may differ from the reference's because its inputs carry
    error (True: undecided). Comparisons: |a - b| <= e_a + e_b; a cast to an integer or bool:
    the input within e of the threshold where the result changes (an integer for truncation,
    0 for bool); any other discrete op fed an erroneous input: every output (no margin known)."""
    es = [np.zeros(np.shape(r)) if e is None else np.asarray(e, np.float64) for r, e in zip(refs, errs)]
    if not any(np.any(e > 0) for e in es):
        return np.zeros(out_shape, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        if op in ("eq", "ne", "lt", "le", "gt", "ge") and len(refs) == 2:
            a, b = (np.asarray(r, np.float64) for r in refs)
            return np.broadcast_to(np.abs(a - b) <= es[0] + es[1], out_shape).copy()
        if op == "cast":
            x = np.asarray(refs[0], np.float64)
            frac_dist = np.abs(x - np.round(x))  # distance to the nearest integer (truncation flips there)
            return np.broadcast_to((frac_dist <= es[0]) | (np.abs(x) <= es[0]), out_shape).copy()
    return np.ones(out_shape, bool)


def graph_bound(error: np.ndarray, undecided: np.ndarray | None) -> Bound:
    """The judge's Bound for one graph output: the propagated error, with the positions a
    discrete node left undecided free, where any outcome is legal (unasserted)."""
    err = np.asarray(error, np.float64)
    if undecided is None or not np.any(undecided):
        return Bound(err)
    return Bound(err, np.asarray(undecided, bool), np.full(err.shape, ANYTHING, np.uint8))
