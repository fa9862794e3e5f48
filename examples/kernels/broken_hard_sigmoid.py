"""A deliberately broken port of hard_sigmoid: validate must fail it (tests/test_validate.py).

    rlx-conformance validate hard_sigmoid --kernel examples/kernels/broken_hard_sigmoid.py:hard_sigmoid

The formula is the textbook one, ``clamp(x / 6 + 1/2, 0, 1)``, and it is wrong in floating
point: ``x / 6`` is rounded before 0.5 is added, and near x = -3 the sum cancels (-0.5 + 0.5000001),
so the rounding error of ``x / 6``, relative to 0.5, becomes a large relative error of a tiny
result. The special value class puts x = -3 and its neighbours one and two ulp away into the
inputs (value domain "hard" in cases/domains/core.toml), so validate reports those cases as
``fail`` with errors of thousands of ulp, while random inputs pass. Compare good_hard_sigmoid.py.
"""
import mlx.core as mx


def hard_sigmoid(x):
    return mx.clip(x / 6 + 0.5, 0.0, 1.0)
