"""cg_solve's fused iteration step (backends/mlx/custom.py, ``cg_step_fused``: mx.compile of
``cg_step``), which cg_solve takes on a GPU stream. The GPU runs it in the matrix; here the CPU
runs it too, by taking the GPU's choice of step: every cg_solve case up to 200 elements, forward and derivative, in
every mode, must give the outcome the step as written gives, and the compiled step must follow
its ``tol`` argument rather than keep the first trace's."""
from __future__ import annotations

import numpy as np
import pytest

from rlx_conformance.generate import matrix
from rlx_conformance.generate.matrix import Target
from rlx_conformance.run.execute import run_case

mx = pytest.importorskip("mlx.core")
from rlx_conformance.backends.mlx import custom  # noqa: E402  (after the importorskip)

OP = "rlx_sparse.cg_solve"
TARGETS = [Target("mlx", "cpu", m) for m in ("eager", "lazy", "compiled")]


def _outcomes(cases) -> dict[str, tuple[str, str]]:
    return {c.id: (run_case(c).outcome, c.grad) for c in cases}


def test_fused_step_gives_every_case_the_outcome_of_the_plain_step(monkeypatch):
    cases = [c for c in matrix.generate(TARGETS, ops=[OP], grads=("", "vjp", "jvp")) if c.size() <= 200]
    assert {c.grad for c in cases} == {"", "vjp", "jvp"}
    plain = _outcomes(cases)
    calls = []

    def fused(*args):
        calls.append(1)
        return custom.cg_step_fused(*args)
    monkeypatch.setattr(custom, "cg_step_here", lambda: fused)
    assert _outcomes(cases) == plain
    assert calls
    assert sum(o == "pass" for o, _ in plain.values()) > len(plain) // 2


def test_fused_step_follows_its_tolerance():
    """A step compiled with ``tol`` closed over as a constant would answer the second call with
    the first call's tolerance."""
    rng = np.random.default_rng(4)
    x, r, ap = (mx.array(rng.standard_normal(16).astype(np.float32)) for _ in range(3))
    rs = mx.sum(r * r)
    done = mx.array(False)
    step = custom.cg_step_fused
    loose = step(x, r, r, ap, rs, done, mx.array(1e9, mx.float32))[-1]
    tight = step(x, r, r, ap, rs, done, mx.array(1e-9, mx.float32))[-1]
    assert loose.item() and not tight.item()


def test_fused_step_keeps_a_converged_system():
    rng = np.random.default_rng(5)
    x, r, p, ap = (mx.array(rng.standard_normal(16).astype(np.float32)) for _ in range(4))
    rs = mx.sum(r * r)
    out = custom.cg_step_fused(x, r, p, ap, rs, mx.array(True), mx.array(1e-6, mx.float32))
    for got, want in zip(out, (x, r, p, rs, mx.array(True))):
        np.testing.assert_array_equal(np.array(got), np.array(want))
