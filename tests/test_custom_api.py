"""The custom-op extension API (rlx_conformance.spec.custom_ops): RLX's attribute byte codec, namespaced
names, declaration and kernel-registration errors, host value checks on both backends, and the
MLX host delegate (declared dtypes, forced delegation, native/delegated marking).

Declarations that must succeed go into a private Registry, so the global one other tests see is
unchanged; kernel-registration checks use fresh backend instances.
"""
from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlx_conformance import backends
from rlx_conformance.backends.cpu import CpuBackend
from rlx_conformance.core.errors import RegistrationError, SpecError, UnknownOpError
from rlx_conformance.ops import get_op
from rlx_conformance.spec import infer
from rlx_conformance.spec.custom_ops import (
    CUSTOM,
    FORMATS,
    Codec,
    Field,
    custom,
    custom_op,
    decode_attrs,
    encode_attrs,
)
from rlx_conformance.spec.registry import Attr, Input, Registry

REDUCTIONS = ("none", "add", "mul", "max", "min")
I32 = st.integers(-2**31, 2**31 - 1)
U32 = st.integers(0, 2**32 - 1)


# -- codec: RLX's byte encoding (docs/ops.md) ----------------------------------------------------
def test_rlx_byte_layouts():
    """The exact bytes RLX reads: little-endian, packed, reduction codes 0 none .. 4 min."""
    assert encode_attrs("onnx.ScatterElements", {"axis": -1, "reduction": "max"}) == struct.pack("<ii", -1, 3)
    assert encode_attrs("onnx.ScatterElements") == bytes(8)  # axis 0, none
    assert encode_attrs("onnx.ScatterND", {"reduction": "min"}) == struct.pack("<i", 4)
    assert encode_attrs("onnx.GatherND", {"batch_dims": 2}) == struct.pack("<i", 2)
    assert encode_attrs("onnx.GatherElements", {"axis": -2}) == struct.pack("<i", -2)
    b = encode_attrs("rlx_sparse.cg_solve", {"max_iter": 500, "tol": 1e-10})
    assert len(b) == 12 and b == struct.pack("<Id", 500, 1e-10)
    for op in ("rlx_sparse.mat_vec", "rlx_sparse.lu_solve", "rlx_sparse.values_grad"):
        assert encode_attrs(op) == b"" and decode_attrs(op, b"") == {}


@given(axis=I32, red=st.sampled_from(REDUCTIONS))
def test_scatter_elements_codec_round_trips(axis, red):
    attrs = {"axis": axis, "reduction": red}
    data = encode_attrs("onnx.ScatterElements", attrs)
    assert len(data) == 8
    assert decode_attrs("onnx.ScatterElements", data) == attrs


@given(max_iter=U32, tol=st.floats(allow_nan=False))
def test_cg_codec_round_trips(max_iter, tol):
    attrs = {"max_iter": max_iter, "tol": tol}
    back = decode_attrs("rlx_sparse.cg_solve", encode_attrs("rlx_sparse.cg_solve", attrs))
    assert back["max_iter"] == max_iter
    assert struct.pack("<d", back["tol"]) == struct.pack("<d", tol)  # bit-identical, -0.0 too


@given(b=I32)
def test_gather_nd_codec_round_trips(b):
    assert decode_attrs("onnx.GatherND", encode_attrs("onnx.GatherND", {"batch_dims": b})) == {"batch_dims": b}


_VALUES = {"i32": I32, "u32": U32, "i64": st.integers(-2**63, 2**63 - 1), "u64": st.integers(0, 2**64 - 1),
           "f32": st.floats(width=32, allow_nan=False), "f64": st.floats(allow_nan=False),
           "u8": st.integers(0, 255), "bool": st.booleans()}


@st.composite
def codec_and_attrs(draw):
    fmts = draw(st.lists(st.sampled_from(sorted(_VALUES)), max_size=6))
    fields = tuple(Field(f"a{i}", f) for i, f in enumerate(fmts))
    attrs = {f.attr: draw(_VALUES[f.fmt]) for f in fields}
    return Codec(fields), attrs


@given(codec_and_attrs())
def test_any_codec_round_trips(ca):
    codec, attrs = ca
    data = codec.encode(attrs)
    assert len(data) == codec.size == sum(struct.calcsize(FORMATS[f.fmt][0]) for f in codec.fields)
    assert codec.decode(data) == attrs


@given(codes=st.permutations(range(5)), pick=st.sampled_from(REDUCTIONS))
def test_enum_codes_round_trip(codes, pick):
    codec = Codec((Field("reduction", "i32", tuple(zip(REDUCTIONS, codes))),))
    data = codec.encode({"reduction": pick})
    assert struct.unpack("<i", data)[0] == dict(zip(REDUCTIONS, codes))[pick]
    assert codec.decode(data) == {"reduction": pick}


@pytest.mark.parametrize("op,data,message", [
    ("onnx.ScatterElements", b"\0" * 7, r"expected 8 attribute byte\(s\), got 7"),
    ("onnx.ScatterElements", struct.pack("<ii", 0, 5), r"reduction code 5 is not one of \[0, 1, 2, 3, 4\]"),
    ("onnx.ScatterND", struct.pack("<i", -1), r"reduction code -1"),
    ("rlx_sparse.cg_solve", struct.pack("<I", 3), r"expected 12 attribute byte\(s\), got 4"),
    ("rlx_sparse.mat_vec", b"\1", r"expected 0 attribute byte\(s\), got 1"),
])
def test_decode_rejects_malformed_bytes(op, data, message):
    with pytest.raises(SpecError, match=message):
        decode_attrs(op, data)


def test_decode_checks_against_the_spec():
    """Bytes that decode fine but name an invalid value for the spec still fail (bool byte 2)."""
    with pytest.raises(SpecError, match="not a bool"):
        Codec((Field("flag", "bool"),)).decode(b"\2")


@pytest.mark.parametrize("op,attrs,message", [
    ("onnx.ScatterElements", {"axis": 2**31}, r"axis=2147483648 does not fit i32"),
    ("rlx_sparse.cg_solve", {"max_iter": -1}, r"max_iter=-1 does not fit u32"),
    ("onnx.ScatterElements", {"reduction": "mean"}, r"reduction='mean' is not a valid enum"),
    ("onnx.GatherND", {"batch_dims": 1.5}, r"batch_dims=1.5 is not a valid int"),
])
def test_encode_rejects_values_the_bytes_cannot_hold(op, attrs, message):
    with pytest.raises(SpecError, match=message):
        encode_attrs(op, attrs)


def test_custom_lookup_errors():
    with pytest.raises(UnknownOpError, match="did you mean onnx.GatherND"):
        custom("onnx.GatherNd")
    with pytest.raises(SpecError, match="'exp' is not a custom op"):
        custom("exp")


# -- declaration ---------------------------------------------------------------------------------
def _decl(name="test.Op", registry=None, **kw):
    base = dict(inputs=(Input("x"),), infer=infer.same, dtypes=("float32",))
    base.update(kw)
    return custom_op(name, registry=Registry() if registry is None else registry, **base)


@pytest.mark.parametrize("name", ["Scatter", "ns.", ".Name", "ns..Name", "1ns.Name", "ns.Na-me",
                                  "ns Name", "", "ns.Name.", None])
def test_names_must_be_namespaced(name):
    with pytest.raises(RegistrationError, match="must be namespaced, 'ns.Name'"):
        _decl(name)


def test_declares_an_ordinary_opspec():
    reg = Registry()
    spec = _decl("my_ns.Scale", reg, attrs=(Attr("k", "float", default=2.0),),
                 codec=Codec((Field("k", "f32"),)), doc="x * k")
    assert reg["my_ns.Scale"] is spec and spec.family == "custom"
    assert spec.validate([(3,)], ["float32"], {"k": 0.5}) == ({"k": 0.5}, [((3,), "float32")])
    assert encode_attrs("my_ns.Scale", {"k": 0.5}, registry=reg) == struct.pack("<f", 0.5)
    assert "my_ns.Scale" not in CUSTOM  # a private registry keeps its own table
    _decl("a.b.Deep", reg)  # nested namespaces are namespaced too


def test_the_eight_ops_live_in_the_one_registry():
    names = ["onnx.ScatterElements", "onnx.GatherND", "onnx.ScatterND", "onnx.GatherElements",
             "rlx_sparse.mat_vec", "rlx_sparse.lu_solve", "rlx_sparse.cg_solve",
             "rlx_sparse.values_grad"]
    for n in names:
        spec = get_op(n)
        assert spec.family == "custom" and CUSTOM[n].spec is spec
        assert spec.check_values is not None and spec.generate is not None and spec.error_inputs
    cpu, mlx = backends.get_backend("cpu"), backends.get_backend("mlx")
    for n in names:
        assert n in cpu.kernels and mlx.kernels[n].native
    assert mlx.kernels["rlx_sparse.lu_solve"].options.get("cpu_stream")


@pytest.mark.parametrize("kw,message", [
    (dict(attrs=(Attr("k", "int", default=0),)), r"has attributes \['k'\] but no codec"),
    (dict(attrs=(Attr("k", "int", default=0),), codec=Codec(())), r"codec fields \[\] must be exactly"),
    (dict(codec=Codec((Field("k", "i32"),))), r"codec fields \['k'\] must be exactly the attributes \[\]"),
    (dict(attrs=(Attr("k", "int", default=0),), codec=Codec((Field("k", "i32"), Field("k", "i32")))),
     "each once"),
    (dict(attrs=(Attr("k", "float", default=0.0),), codec=Codec((Field("k", "i32"),))),
     "attribute k is a float; codec format i32 carries int, enum"),
    (dict(attrs=(Attr("k", "bool", default=False),), codec=Codec((Field("k", "u8"),))),
     "attribute k is a bool; codec format u8"),
    (dict(attrs=(Attr("r", "enum", default="a", choices=("a", "b")),), codec=Codec((Field("r", "i32"),))),
     r"enum attribute r needs a code for each of \('a', 'b'\)"),
    (dict(attrs=(Attr("r", "enum", default="a", choices=("a", "b")),),
          codec=Codec((Field("r", "i32", (("a", 0), ("c", 1))),))), "needs a code for each"),
    (dict(attrs=(Attr("r", "enum", default="a", choices=("a", "b")),),
          codec=Codec((Field("r", "i32", (("a", 0), ("b", 0))),))), "repeated codes"),
    (dict(attrs=(Attr("k", "int", default=0),), codec=Codec((Field("k", "i32", (("a", 0),)),))),
     "codes given for non-enum attribute k"),
    (dict(shape="unary"), r"unknown OpSpec field\(s\) \['shape'\]"),
    (dict(family="shape"), "custom ops are family 'custom'"),
    (dict(dtypes=("float128",)), "unknown dtypes"),
])
def test_declaration_errors(kw, message):
    with pytest.raises(RegistrationError, match=message):
        _decl(**kw)


def test_codec_field_format_is_checked():
    with pytest.raises(RegistrationError, match="format 'i16' not in"):
        Field("k", "i16")


def test_a_name_is_declared_once():
    with pytest.raises(RegistrationError, match="'onnx.GatherND' is already declared"):
        custom_op("onnx.GatherND", inputs=(Input("x"),), infer=infer.same, dtypes=("float32",))
    reg = Registry()
    _decl("t.Once", reg)
    with pytest.raises(RegistrationError, match="already declared"):
        _decl("t.Once", reg)


# -- kernel registration against a custom op -----------------------------------------------------
@pytest.mark.parametrize("fn,message", [
    (lambda data, indices, *, axis, reduction: data, r"takes 2 positional input\(s\), the spec has 3"),
    (lambda data, indices, updates, *, axis: data, r"keyword parameters \['axis'\] do not match"),
    (lambda data, indices, updates, *, axis, reduction, mode: data, "do not match"),
])
def test_kernel_signature_is_checked(fn, message):
    with pytest.raises(RegistrationError, match=message):
        CpuBackend().register("onnx.ScatterElements", fn)


def test_kernel_for_an_unknown_custom_op():
    with pytest.raises((RegistrationError, UnknownOpError)):
        CpuBackend().register("onnx.NotAnOp", lambda x: x)


def test_kernel_claims_only_spec_dtypes():
    with pytest.raises(RegistrationError, match=r"claims dtypes \['int32'\]"):
        CpuBackend().register("rlx_sparse.mat_vec", lambda v, c, r, x: v, dtypes=("float32", "int32"))


# -- host value checks: both backends reject every error input, before MLX runs -------------------
def _error_inputs():
    for name in sorted(CUSTOM):
        for desc, ins, attrs in get_op(name).error_inputs():
            yield pytest.param(name, ins, attrs, id=f"{name}:{desc}")


@pytest.mark.parametrize("op,ins,attrs", list(_error_inputs()))
def test_both_backends_reject_error_inputs(op, ins, attrs):
    with pytest.raises(SpecError):
        backends.get_backend("cpu").run(op, [x.copy() for x in ins], attrs)
    mlx = backends.get_backend("mlx")
    for mode in mlx.modes:
        with pytest.raises(Exception) as e:  # noqa: PT011 — MLX's own LAPACK errors count too
            mlx.run(op, [x.copy() for x in ins], attrs, "cpu", mode)
        assert isinstance(e.value, (SpecError, RuntimeError)), e.value


def test_value_check_names_the_bad_index():
    x = np.zeros((3, 4), np.float32)
    with pytest.raises(SpecError, match=r"onnx.GatherElements: index 4 out of range \[-4, 3\] for axis 1"):
        backends.get_backend("mlx").run("onnx.GatherElements", [x, np.array([[0, 4]], np.int64)],
                                        {"axis": 1}, "cpu", "compiled")
    with pytest.raises(SpecError, match=r"row_ptr is not monotone: row_ptr\[1\] = 3 > row_ptr\[2\] = 2"):
        backends.get_backend("mlx").run(
            "rlx_sparse.mat_vec", [np.ones(3), np.zeros(3, np.int32), np.array([0, 3, 2, 3], np.int32),
                                   np.ones(2)], {}, "cpu", "lazy")


# -- the host delegate ---------------------------------------------------------------------------
def _csr64():
    """float64 values that float32 cannot hold, int32 indices: RLX's delegate would read the values
    as int64 and the indices as float32."""
    vals = np.array([0.1, 1 / 3, -2.0**-40, math.pi, 1e300], np.float64)
    col = np.array([0, 2, 1, 0, 2], np.int32)
    rp = np.array([0, 2, 3, 5], np.int32)
    x = np.array([1 + 2.0**-52, -1 / 7, 1e-300], np.float64)
    return [vals, col, rp, x]


def test_delegate_passes_declared_dtypes_exactly():
    from rlx_conformance.backends.mlx import to_mlx
    from rlx_conformance.backends.mlx.delegate import make_delegate

    ins = _csr64()
    mx_args = [to_mlx(a, d) for a, d in zip(ins, ["float64", "int32", "int32", "float64"])]
    out = make_delegate("rlx_sparse.mat_vec")(*mx_args)
    y = np.array(out[0])
    assert y.dtype == np.float64
    ref = backends.get_backend("cpu").run("rlx_sparse.mat_vec", ins, {})[0]
    assert y.tobytes() == ref.tobytes()
    g = make_delegate("rlx_sparse.values_grad")(mx_args[1], mx_args[2], to_mlx(ins[3], "float64"),
                                                 to_mlx(ins[3], "float64"))
    assert np.array(g[0]).dtype == np.float64


def test_forced_delegation_runs_and_is_marked():
    from rlx_conformance.backends.mlx import delegate
    from rlx_conformance.generate import matrix
    from rlx_conformance.run import execute

    mlx = backends.get_backend("mlx")
    case = next(c for c in matrix.generate([matrix.Target("mlx", "cpu", "eager")],
                                           ops=["rlx_sparse.mat_vec"], dtypes=["float64"])
                if c.vals == "random" and c.shapes == ((7, 5),))
    try:
        assert set(delegate.force_delegate("rlx_sparse.*")) == {
            "rlx_sparse.mat_vec", "rlx_sparse.lu_solve", "rlx_sparse.cg_solve", "rlx_sparse.values_grad"}
        assert not mlx.kernels["rlx_sparse.mat_vec"].native
        assert mlx.kernels["rlx_sparse.lu_solve"].options.get("cpu_stream")  # options kept
        r = execute.run_case(case)
        assert (r.outcome, r.kernel) == ("pass", "delegated")
        compiled = matrix.Case(case.op, case.dtype, case.shapes, case.family, case.attrs, case.vals,
                               matrix.Target("mlx", "cpu", "compiled"))
        r = execute.run_case(compiled)
        assert r.outcome == "skip" and "cannot run under mx.compile" in r.message
    finally:
        delegate.restore_native()
    assert mlx.kernels["rlx_sparse.mat_vec"].native
    assert execute.run_case(case).kernel == "native"


def test_force_delegate_environment_variable(monkeypatch):
    from rlx_conformance.backends.mlx import delegate

    for v, want in [("", None), ("0", None), ("1", ["*"]), ("all", ["*"]),
                    ("onnx.*, rlx_sparse.mat_vec", ["onnx.*", "rlx_sparse.mat_vec"])]:
        monkeypatch.setenv(delegate.ENV, v)
        assert delegate.forced_patterns() == want


def test_fallback_delegate_for_a_custom_op_without_mlx_kernel(monkeypatch):
    """A contributed custom op with only a CPU kernel gets a delegated MLX kernel."""
    from rlx_conformance.backends.mlx import delegate
    from rlx_conformance.spec import registry

    name = "test_delegate.Twice"
    spec = custom_op(name, inputs=(Input("x"),), infer=infer.same, dtypes=("float64", "float32"))
    cpu, mlx = backends.get_backend("cpu"), backends.get_backend("mlx")
    try:
        cpu.register(name, lambda x: x * 2)
        assert delegate.register_delegates() == [name]
        e = mlx.kernels[name]
        assert not e.native and e.origin == "delegate"
        x = np.array([0.1, 1e300], np.float64)
        (y,) = mlx.run(name, [x], {}, "cpu", "lazy")
        assert y.dtype == np.float64 and y.tobytes() == (x * 2).tobytes()
    finally:
        for table in (cpu.kernels, mlx.kernels, CUSTOM, registry.REGISTRY._ops):
            table.pop(name, None)
    del spec
