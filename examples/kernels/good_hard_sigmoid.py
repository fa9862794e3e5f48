"""A port of RLX's hard_sigmoid kernel to MLX that passes ``rlx-conformance validate``.

    rlx-conformance validate hard_sigmoid --kernel examples/kernels/good_hard_sigmoid.py:hard_sigmoid

The spec (``rlx-conformance ops``; declared in rlx_conformance/ops/elementwise.py): one input
``x`` of a float dtype, no attributes, same shape and dtype out, ``clamp(x / 6 + 1/2, 0, 1)``.
float16 and bfloat16 inputs arrive widened to float32 (the harness does what RLX's
``prepare_f32_exec_graph`` does) and the result is rounded back once, so the kernel only ever
sees float32 or float64.

Written as ``(x + 3) / 6`` rather than ``x / 6 + 0.5``: the two are equal in exact arithmetic,
but the second rounds ``x / 6`` first and then cancels against 0.5 near x = -3, where the
result is tiny: see broken_hard_sigmoid.py for what validate says about that.
"""
import mlx.core as mx


def hard_sigmoid(x):
    # One rounding in x + 3 (exact near x = -3, Sterbenz), one in / 6, and clip keeps NaN.
    return mx.clip((x + 3) / 6, 0.0, 1.0)
