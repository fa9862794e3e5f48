"""Registry validation, kernel registration checks and the kernel output contract.

Registration tests use fresh backend instances (never the global ones), so nothing here changes
the kernels other tests see.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from rlx_conformance import backends
from rlx_conformance.backends.cpu import CpuBackend
from rlx_conformance.core.errors import (
    KernelContractError,
    RegistrationError,
    SpecError,
    UnknownOpError,
    UnsupportedError,
)
from rlx_conformance.ops import get_op


def validate(op, shapes, dtypes, attrs=None):
    return get_op(op).validate(shapes, dtypes, attrs)


# -- SpecError -----------------------------------------------------------------------------------
@pytest.mark.parametrize("op,shapes,dtypes,attrs,message", [
    ("add", [(3,)], ["float32"], None, r"^add: expects 2 input\(s\) \(a, b\), got 1$"),
    ("neg", [(3,), (3,)], ["float32", "float32"], None, r"^neg: expects 1 input\(s\) \(x\), got 2$"),
    ("neg", [(3,)], ["int32"], None, r"^neg: dtype int32 not supported \(supported: float32,"),
    ("add", [(3,), (3,)], ["float32", "int32"], None,
     r"^add: input b has dtype int32, expected float32 like the other T inputs$"),
    ("where", [(3,), (3,), (3,)], ["float32", "float32", "float32"], None,
     r"^where: input cond has dtype float32, expected one of bool$"),
    ("neg", [(3,)], ["complex64"], None, r"^neg: input x has dtype complex64, not in the harness"),
    ("neg", [(3,)], ["float32"], {"alpha": 1.0}, r"^neg: unknown attribute\(s\) alpha \(known: none\)$"),
    ("reduce_sum", [(3,)], ["float32"], {"axis": 0},
     r"^reduce_sum: unknown attribute\(s\) axis \(known: axes, keep_dim\)$"),
    ("clamp", [(3,)], ["float32"], {"max": 1.0}, r"^clamp: missing required attribute min$"),
    ("reduce_sum", [(3, 4)], ["float32"], {"axes": (5,)},
     r"^reduce_sum: axes entry 5 out of range for rank 2$"),
    ("reduce_sum", [(3, 4)], ["float32"], {"axes": (-3,)},
     r"^reduce_sum: axes entry -3 out of range for rank 2$"),
    ("reduce_sum", [(3, 4)], ["float32"], {"axes": (1, -1)}, r"^reduce_sum: repeated axis"),
    ("reduce_sum", [(3,)], ["float32"], {"keep_dim": 1}, r"^reduce_sum: attribute keep_dim=1 is not a valid bool"),
    ("reduce_sum", [(3,)], ["float32"], {"axes": (0.5,)}, r"^reduce_sum: attribute axes=\(0.5,\) is not a valid ints"),
    ("clamp", [(3,)], ["float32"], {"min": 2.0, "max": 1.0}, r"^clamp: min=2.0 > max=1.0$"),
    ("add", [(3,), (4,)], ["float32", "float32"], None, r"^add: shapes \(3,\) and \(4,\) do not broadcast$"),
    ("where", [(2, 3), (3,), (2, 1, 4)], ["bool", "int8", "int8"], None,
     r"^where: shapes \(2, 3\) and \(3,\) and \(2, 1, 4\) do not broadcast$"),
])
def test_spec_errors(op, shapes, dtypes, attrs, message):
    with pytest.raises(SpecError, match=message):
        validate(op, shapes, dtypes, attrs)


def test_valid_calls_resolve_defaults_and_shapes():
    attrs, outs = validate("reduce_sum", [(3, 4)], ["float32"], {"axes": [-1]})
    assert attrs == {"axes": (-1,), "keep_dim": False}
    assert outs == [((3,), "float32")]
    _, outs = validate("add", [(3, 1), (1, 4)], ["int8", "int8"])
    assert outs == [((3, 4), "int8")]
    _, outs = validate("eq", [(2,), ()], ["bfloat16", "bfloat16"])
    assert outs == [((2,), "bool")]


@pytest.mark.parametrize("backend", ["cpu", "mlx"])
def test_backends_reject_like_the_registry(backend):
    """Backend.run validates through the same spec, so every backend rejects the same inputs."""
    b = backends.get_backend(backend)
    with pytest.raises(SpecError, match="reduce_sum: axes entry 5 out of range for rank 2"):
        b.run("reduce_sum", [np.zeros((2, 3), np.float32)], {"axes": (5,)}, "cpu", "eager")
    with pytest.raises(SpecError, match="add: shapes"):
        b.run("add", [np.zeros(3, np.float32), np.zeros(4, np.float32)], None, "cpu", "eager")
    with pytest.raises(SpecError, match="input 0 is list"):
        b.run("neg", [[1.0]], None, "cpu", "eager")
    with pytest.raises(SpecError, match="complex64 is not in the harness"):
        b.run("neg", [np.zeros(2, np.complex64)], None, "cpu", "eager")


# -- UnknownOpError --------------------------------------------------------------------------------
def test_unknown_op_suggests():
    with pytest.raises(UnknownOpError) as ei:
        get_op("reduce_summ")
    assert str(ei.value).startswith("unknown op 'reduce_summ' (did you mean reduce_sum")
    assert isinstance(ei.value, KeyError)


def test_unknown_op_without_close_match():
    with pytest.raises(UnknownOpError) as ei:
        get_op("zzzzqqqq")
    assert str(ei.value) == "unknown op 'zzzzqqqq'"  # not KeyError's quoted repr


def test_backend_run_unknown_op():
    with pytest.raises(UnknownOpError, match="did you mean neg"):
        backends.get_backend("cpu").run("negg", [np.zeros(2, np.float32)])


# -- RegistrationError -----------------------------------------------------------------------------
def test_register_unknown_op():
    with pytest.raises(RegistrationError, match=r"^cpu: cannot register a kernel for unknown op 'nope'$"):
        CpuBackend().register("nope", lambda x: x)


@pytest.mark.parametrize("op,fn,message", [
    ("add", lambda a: a, r"^cpu kernel for 'add': takes 1 positional input\(s\), the spec has 2 \(a, b\)$"),
    ("neg", lambda x, y: x, r"^cpu kernel for 'neg': takes 2 positional input\(s\), the spec has 1 \(x\)$"),
    ("neg", lambda: 0, r"^cpu kernel for 'neg': takes 0 positional"),
    ("reduce_sum", lambda x, axes=(): x,
     r"^cpu kernel for 'reduce_sum': keyword parameters \['axes'\] do not match the spec's "
     r"attributes \['axes', 'keep_dim'\]$"),
    ("reduce_sum", lambda x, *, axis, keep_dim: x, r"^cpu kernel for 'reduce_sum': keyword parameters"),
    ("neg", lambda x, alpha=1.0: x, r"^cpu kernel for 'neg': keyword parameters \['alpha'\]"),
    ("neg", lambda x, **kw: x, None),  # **kw covers attributes, but neg has none: accepted
    ("add", np.negative, r"^cpu kernel for 'add': ufunc negative takes 1 input\(s\)"),
    ("clamp", np.negative, r"^cpu kernel for 'clamp': ufunc negative takes 1 input\(s\) and no attributes"),
])
def test_register_bad_signature(op, fn, message):
    b = CpuBackend()
    if message is None:
        b.register(op, fn)
        assert op in b.kernels
        return
    with pytest.raises(RegistrationError, match=message):
        b.register(op, fn)
    assert op not in b.kernels


def test_register_good_signatures():
    b = CpuBackend()
    b.register("reduce_sum", lambda x, *, axes, keep_dim: x)
    b.register("clamp", lambda x, **kw: x)
    b.register("add", np.add)
    b.register("neg", lambda *xs: xs[0])
    assert {"reduce_sum", "clamp", "add", "neg"} <= set(b.kernels)


def test_register_twice_needs_replace():
    b = CpuBackend()
    b.register("neg", np.negative)
    with pytest.raises(RegistrationError, match=r"^cpu: a kernel for 'neg' is already registered$"):
        b.register("neg", np.negative)
    e = b.register("neg", np.positive, replace=True)
    assert b.kernels["neg"] is e and e.fn is np.positive


def test_register_dtype_and_device_claims():
    b = CpuBackend()
    with pytest.raises(RegistrationError, match=r"cpu kernel for 'neg': claims dtypes \['int32'\]"):
        b.register("neg", np.negative, dtypes=["float32", "int32"])
    with pytest.raises(RegistrationError, match=r"cpu kernel for 'neg': unknown device 'tpu'"):
        b.register("neg", np.negative, devices={"tpu": ["float32"]})
    b.register("neg", np.negative, dtypes=["float32"])
    assert b.supports("neg", "float32", "cpu") and not b.supports("neg", "float64", "cpu")
    with pytest.raises(UnsupportedError, match="cpu does not support neg on float64"):
        b.run("neg", [np.zeros(2, np.float64)])
    assert b.run("neg", [np.zeros(2, np.float64)], force=True)[0].dtype == np.float64


def test_fresh_backend_has_no_kernel():
    with pytest.raises(UnsupportedError, match="cpu has no kernel for 'neg'"):
        CpuBackend().run("neg", [np.zeros(2, np.float32)])


# -- KernelContractError ---------------------------------------------------------------------------
@pytest.mark.parametrize("fn,x,message", [
    (lambda x: x[:1], np.zeros(3, np.float32), r"output 0 has shape \(1,\), the spec says \(3,\)"),
    (lambda x: x.reshape(1, 3), np.zeros(3, np.float32), r"output 0 has shape \(1, 3\)"),
    (lambda x: x.astype(np.float64), np.zeros(3, np.float32),
     r"output 0 has dtype float64, the spec says float32"),
    (lambda x: x.astype(np.int32), np.zeros(3, np.float32), r"output 0 has dtype int32"),
    (lambda x: 3.0, np.zeros((), np.float32), r"output 0 is a float, not an array"),
    (lambda x: "x", np.zeros((), np.float32), r"output 0 is a str, not an array"),
    (lambda x: (x, x), np.zeros(3, np.float32), r"returned 2 output\(s\), the spec declares 1"),
    # float16 in: the kernel gets float32 (low_precision "f32"), may return float32, not float64
    (lambda x: x.astype(np.float64), np.zeros(3, np.float16), r"output 0 has dtype float64, the spec says float16"),
])
def test_cpu_kernel_contract(fn, x, message):
    b = CpuBackend()
    b.register("neg", fn)
    with pytest.raises(KernelContractError, match=r"^cpu kernel for 'neg': " + message):
        b.run("neg", [x])


def test_low_precision_kernel_sees_float32_and_output_is_rounded_back():
    seen = []

    def k(x):
        seen.append(x.dtype)
        return -x

    b = CpuBackend()
    b.register("neg", k)
    out = b.run("neg", [np.array([1.5, -2.0], np.float16)])[0]
    assert seen == [np.float32] and out.dtype == np.float16
    assert out.tolist() == [-1.5, 2.0]


@pytest.mark.parametrize("mode", ["eager", "lazy", "compiled"])
def test_mlx_kernel_contract(mode):
    from rlx_conformance.backends.mlx import MlxBackend

    b = MlxBackend()
    b.register("neg", lambda x: x[:1])
    with pytest.raises(KernelContractError, match=r"^mlx kernel for 'neg': output 0 has shape \(1,\)"):
        b.run("neg", [np.zeros(3, np.float32)], None, "cpu", mode)
    b.register("neg", lambda x: 3.0, replace=True)
    with pytest.raises(KernelContractError, match=r"^mlx kernel for 'neg': output 0 is a float"):
        b.run("neg", [np.zeros(3, np.float32)], None, "cpu", mode)


# -- error inputs (validate's error-input parity) ---------------------------------------------------
# Errors that only a factorization reveals (a singular or indefinite matrix): the harness does not
# pre-validate these, and validate expects the kernel itself to reject them (the CPU reference does).
FACTORIZATION_ERRORS = {
    ("dense_solve", "singular A"), ("cholesky", "not positive definite"),
    ("cholesky", "negative diagonal"), ("triangular_solve", "zero on the diagonal"),
    ("rlx_sparse.lu_solve", "singular: two equal rows"),
}


def _all_op_names():
    from rlx_conformance.ops import all_ops

    return [s.name for s in all_ops()]


def test_every_op_declares_error_inputs():
    from rlx_conformance.ops import all_ops

    missing = [s.name for s in all_ops() if s.error_inputs is None or not s.error_inputs()]
    assert not missing, f"ops without error inputs: {missing}"


@pytest.mark.parametrize("op", _all_op_names())
def test_error_inputs_are_rejected_by_the_harness_prevalidation(op):
    """Each declared error input is rejected by the call validate uses for "harness rejects"
    (rlx_conformance.backends.base.prevalidate), with a SpecError naming the op; the few errors only a
    factorization finds pass it, and the CPU reference rejects them instead."""
    from rlx_conformance.backends.base import prevalidate

    spec = get_op(op)
    descs = [d for d, _, _ in spec.error_inputs()]
    assert len(descs) == len(set(descs)), f"{op}: repeated error-input descriptions"
    for desc, inputs, attrs in spec.error_inputs():
        assert all(isinstance(x, np.ndarray) for x in inputs), (op, desc)
        if (op, desc) in FACTORIZATION_ERRORS:
            prevalidate(spec, inputs, attrs)
            with pytest.raises(ValueError):
                backends.get_backend("cpu").run(op, inputs, attrs)
            continue
        with pytest.raises(SpecError, match=rf"^{re.escape(op)}: ") as e:
            prevalidate(spec, inputs, attrs)
        assert "\n" not in str(e.value), (op, desc)


def test_error_inputs_fail_for_the_reason_they_name():
    """Spot checks that an error input is rejected for its own reason, not an incidental one
    (a missing attribute, a dtype slip in the test data)."""
    from rlx_conformance.backends.base import prevalidate

    expect = {
        ("reshape", "two -1s"): "at most one -1",
        ("transpose", "repeated axis in perm"): "not a permutation",
        ("narrow", "negative len"): "len -1 is negative",
        ("slice", "zero step"): "step must be nonzero",
        ("concat", "mixed dtypes"): "dtype float64, expected float32",
        ("expand", "not broadcastable"): "do not broadcast",
        ("tile", "negative reps"): "count >= 0",
        ("pad", "unknown mode"): "mode='symmetric'",
        ("one_hot", "depth 0"): "depth 0 must be >= 1",
        ("fft", "transform length 0"): "transform length must be >= 1",
        ("rng_uniform", "negative shape"): "negative size",
        ("rng_uniform", "low >= high"): "needs low < high",
        ("rng_normal", "int32 key"): "key has dtype int32",
        ("quantize", "zero_point dtype is not `to`"): "zero_point is uint8, output dtype to=int8",
        ("dequantize", "per-axis axis out of range"): "axis -3 out of range",
        ("fake_quantize", "bits above 16"): "bits=17 outside",
        ("softmax_cross_entropy", "targets shape differs"): "differ in shape",
        ("sort", "axis below -rank"): "axis -3 out of range",
        ("arg_sort", "scalar input"): "rank >= 1",
        ("top_k", "k past the last axis"): "k=4 outside",
    }
    for (op, desc), fragment in expect.items():
        spec = get_op(op)
        (inputs, attrs), = [(i, a) for d, i, a in spec.error_inputs() if d == desc]
        with pytest.raises(SpecError, match=re.escape(fragment)):
            prevalidate(spec, inputs, attrs)


# -- batches and channels (issue 17 item 7) --------------------------------------------------------
# Ops with a batch or channel dimension: (input, batch axis, channel axis or None, the attribute
# that splits the channels into groups or heads, or None). RLX's CPU backend had three batch-stride
# bugs (GroupNorm, ResizeNearest2x, AxialRope2d at batch > 1) because only n = 1 was ever tested.
BATCHED = {
    "conv": (0, 0, 1, "groups"), "conv_transpose2d": (0, 0, 1, "groups"), "pool": (0, 0, 1, None),
    "conv2d_backward_input": (0, 0, 1, "groups"), "conv2d_backward_weight": (0, 0, 1, "groups"),
    "max_pool2d_backward": (0, 0, 1, None),
    "layer_norm": (0, 0, None, None), "rms_norm": (0, 0, None, None),
    "group_norm": (0, 0, 1, "num_groups"), "batch_norm_inference": (0, 0, -1, None),
    "attention": (0, 0, None, "num_heads"), "rope": (0, 0, None, None), "rope_backward": (0, 0, None, None),
    "mat_mul": (0, 0, None, None), "dot_general": (0, 0, None, None), "batched_dense_solve": (0, 0, None, None),
    "softmax_cross_entropy": (0, 0, None, None),
}
# Families whose every op has such dimensions: a new op there must join BATCHED.
BATCHED_FAMILIES = ("conv", "norm", "attention")


def test_every_op_of_the_batched_families_is_listed():
    from rlx_conformance.ops import all_ops

    missing = [s.name for s in all_ops() if s.family in BATCHED_FAMILIES and s.name not in BATCHED]
    assert not missing, f"add to BATCHED (batch and channel axes): {missing}"


@pytest.mark.parametrize("op", sorted(BATCHED))
def test_batched_ops_have_cases_with_batch_channels_and_groups_above_one(op):
    """Some forward case of the op has batch > 1 together with channels > 1 and, where the op
    groups its channels (or heads), more than one group: the strides between batch items and
    between groups are exercised, not only n = 1."""
    from rlx_conformance.generate.matrix import Target, generate

    k, b_axis, c_axis, group_attr = BATCHED[op]
    cases = generate([Target("cpu", "cpu", "eager")], ops=[op], dtypes=["float32"])
    assert cases, op

    def ok(c, grouped):
        shape = c.shapes[k]
        if len(shape) < 2 or shape[b_axis] < 2 or (c_axis is not None and shape[c_axis] < 2):
            return False
        return not grouped or c.attr_dict.get(group_attr, 1) > 1
    assert any(ok(c, False) for c in cases), f"{op}: no shape family with batch (and channels) > 1"
    if group_attr:
        assert any(ok(c, True) for c in cases), f"{op}: no case with batch > 1 and {group_attr} > 1"
