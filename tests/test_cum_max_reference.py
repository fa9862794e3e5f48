"""The reference's cum_max derivatives sum cotangents (VJP) and tangents (JVP) within runs of one
running max. They were once formed as differences of whole-row cumsums, which lose u times the
sum over every earlier run: up to 2.5e-14 off on a 317x331 float64 VJP, and a known-divergence
entry blamed MLX for it until a GPU run returned the CPU's very bits. Here the run sums are checked
against exact sums (math.fsum)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.cpu import reduce as cpu_reduce  # the kernel module under test
from rlx_conformance.generate.matrix import make_inputs, make_seeds
from rlx_conformance.run.session import find_case

U = 2.0**-53


def _exact_run_prefix_sums(v: np.ndarray, run: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per element, the exact sum of its run's prefix and the sum of the magnitudes."""
    out, mag = np.zeros(v.shape), np.zeros(v.shape)
    for r in np.ndindex(v.shape[:-1]):
        start = 0
        for i in range(v.shape[-1]):
            if i and run[r + (i,)] != run[r + (i - 1,)]:
                start = i
            out[r + (i,)] = math.fsum(v[r + (slice(start, i + 1),)])
            mag[r + (i,)] = math.fsum(np.abs(v[r + (slice(start, i + 1),)]))
    return out, mag


def test_a_run_sum_does_not_lose_the_earlier_runs_magnitude():
    v = np.array([[1e16, 1.0, 1.0, 3.0]])
    run = np.array([[0, 1, 1, 2]])
    assert cpu_reduce._within_run_cumsum(v, run).tolist() == [[1e16, 1.0, 2.0, 3.0]]


@pytest.mark.parametrize("seed", range(20))
def test_run_sums_are_within_their_own_terms_rounding(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    v = rng.standard_normal((3, n)) * 10.0 ** rng.uniform(-8, 8, (3, n))
    run = np.cumsum(rng.random((3, n)) < rng.uniform(0.01, 0.5), axis=-1)
    exact, mag = _exact_run_prefix_sums(v, run)
    got = cpu_reduce._within_run_cumsum(v, run)
    depth = max(math.ceil(math.log2(max(n, 2))), 1)
    assert np.all(np.abs(got - exact) <= depth * U / (1 - depth * U) * mag)


def test_the_vjp_the_gpu_run_caught_is_exact_where_one_output_feeds_an_element():
    """cum_max/float64/shape:317x331/axis:0/...: element (1, 8) holds the running max of exactly one
    output, so its gradient is that output's cotangent, bit for bit (MLX's CPU and CUDA builds
    return it; the old reference was 770 ulp off)."""
    case = find_case("cum_max/float64/shape:317x331/axis:0/exclusive:false/reverse:false/vals:random/"
                     "grad:vjp/mlx-cpu-compiled")
    xs = make_inputs(case)
    seeds = make_seeds(case, xs)
    g = get_backend("cpu").run_derivative(case.op, "vjp", [x.copy() for x in xs], case.attr_dict,
                                          list(seeds.cotangents), list(seeds.tangents))[0]
    x, u = xs[0], seeds.cotangents[0]
    m = np.maximum.accumulate(x, axis=0)
    owners = [j for j in range(x.shape[0]) if m[j, 8] == x[1, 8]]  # the outputs whose max is x[1, 8]
    assert owners == [1]
    assert g[1, 8] == u[1, 8]
