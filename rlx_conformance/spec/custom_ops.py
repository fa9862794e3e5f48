"""The custom-op extension API: how a kernel contributor adds an op (RLX ``Op::Custom``).

RLX extends its op set at three layers: an IR-level declaration (namespaced name, arity, shape
inference, an attribute codec that packs the typed attributes into bytes), CPU kernels, and MLX
kernels. Here the IR layer is :func:`custom_op`, which builds an ordinary :class:`OpSpec` through
``registry.declare`` (one registry, not two; ``family="custom"``); kernels are then registered per
backend exactly as for built-ins (``BACKEND.kernel(name)``, call convention
``kernel(*inputs, **attrs)`` with the decoded typed attributes).

Two things a declaration adds to an OpSpec:

* :class:`Codec`: RLX's byte encoding of the attributes (each custom op's in docs/ops.md), ``encode(attrs) ->
  bytes`` and ``decode(bytes) -> attrs``, which round-trip (kept in this module's side table,
  :data:`CUSTOM`, with the spec);
* ``check_values(inputs, attrs)``: validation of input *values* (index ranges, CSR structure),
  handed to ``OpSpec.check_values``, which Backend.run calls on the host before any backend sees
  the inputs (MLX does no bounds checking: an out-of-range index must never reach it).
"""
from __future__ import annotations

import dataclasses
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_conformance.core.errors import RegistrationError, SpecError
from rlx_conformance.spec.registry import (
    REGISTRY,
    Attr,
    Input,
    OpSpec,
    Policy,
    Registry,
    declaration_site,
)

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

# Byte formats of codec fields: struct code (little-endian), attribute kinds it can carry.
FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "i32": ("<i", ("int", "enum")),
    "u32": ("<I", ("int", "enum")),
    "i64": ("<q", ("int",)),
    "u64": ("<Q", ("int",)),
    "f32": ("<f", ("float",)),
    "f64": ("<d", ("float",)),
    "u8": ("<B", ("int", "enum")),
    "bool": ("<B", ("bool",)),
}


@dataclass(frozen=True)
class Field:
    """One attribute's bytes: ``fmt`` from :data:`FORMATS`; an enum attribute is stored as the
    integer code of its value in ``codes`` (value -> code, e.g. reduction none=0, add=1...)."""

    attr: str
    fmt: str
    codes: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise RegistrationError(f"codec field {self.attr}: format {self.fmt!r} not in "
                                    f"{', '.join(FORMATS)}")


@dataclass(frozen=True)
class Codec:
    """RLX's attribute byte encoding: the fields packed in order, little-endian, no padding."""

    fields: tuple[Field, ...] = ()

    @property
    def size(self) -> int:
        return sum(struct.calcsize(FORMATS[f.fmt][0]) for f in self.fields)

    def encode(self, attrs: Mapping[str, Any]) -> bytes:
        out = bytearray()
        for f in self.fields:
            code, _ = FORMATS[f.fmt]
            v = attrs[f.attr]
            if f.codes is not None:
                table = dict(f.codes)
                if v not in table:
                    raise SpecError(f"codec: {f.attr}={v!r} has no code (one of {', '.join(table)})")
                v = table[v]
            elif isinstance(v, (bool, np.bool_)):
                v = int(v)
            try:
                out += struct.pack(code, v)
            except (struct.error, OverflowError) as e:
                raise SpecError(f"codec: {f.attr}={v!r} does not fit {f.fmt}: {e}") from None
        return bytes(out)

    def decode(self, data: bytes) -> dict[str, Any]:
        if len(data) != self.size:
            raise SpecError(f"codec: expected {self.size} attribute byte(s), got {len(data)}")
        out: dict[str, Any] = {}
        pos = 0
        for f in self.fields:
            code = FORMATS[f.fmt][0]
            (v,) = struct.unpack_from(code, data, pos)
            pos += struct.calcsize(code)
            if f.codes is not None:
                names = {c: n for n, c in f.codes}
                if v not in names:
                    raise SpecError(f"codec: {f.attr} code {v} is not one of {sorted(names)}")
                v = names[v]
            elif f.fmt == "bool":
                if v not in (0, 1):
                    raise SpecError(f"codec: {f.attr} byte {v} is not a bool (0 or 1)")
                v = bool(v)
            out[f.attr] = v
        return out


@dataclass(frozen=True)
class CustomOp:
    """What the extension API knows about a custom op beyond its OpSpec."""

    spec: OpSpec
    codec: Codec
    check_values: Callable[[Sequence[np.ndarray], Mapping[str, Any]], None] | None = None


def _table(registry: Registry) -> dict[str, CustomOp]:
    """The custom ops declared in ``registry`` (kept on the registry object itself)."""
    return registry.__dict__.setdefault("_custom_ops", {})


CUSTOM: dict[str, CustomOp] = _table(REGISTRY)  # the global registry's custom ops


def _check_codec(name: str, attrs: Sequence[Attr], codec: Codec) -> None:
    """The codec must encode each attribute exactly once in a format that can carry its kind."""
    names = [f.attr for f in codec.fields]
    declared = [a.name for a in attrs]
    if sorted(names) != sorted(declared) or len(set(names)) != len(names):
        raise RegistrationError(f"{name}: codec fields {names} must be exactly the attributes "
                                f"{declared}, each once")
    by_name = {a.name: a for a in attrs}
    for f in codec.fields:
        a = by_name[f.attr]
        kinds = FORMATS[f.fmt][1]
        if a.kind not in kinds:
            raise RegistrationError(f"{name}: attribute {a.name} is a {a.kind}; codec format "
                                    f"{f.fmt} carries {', '.join(kinds)}")
        if a.kind == "enum":
            if f.codes is None or sorted(n for n, _ in f.codes) != sorted(a.choices or ()):
                raise RegistrationError(f"{name}: enum attribute {a.name} needs a code for each "
                                        f"of {a.choices} in its codec field")
            if len({c for _, c in f.codes}) != len(f.codes):
                raise RegistrationError(f"{name}: enum attribute {a.name} has repeated codes")
        elif f.codes is not None:
            raise RegistrationError(f"{name}: codes given for non-enum attribute {a.name}")


def custom_op(name: str, *, inputs: Sequence[Input], infer: Callable[..., Any],
              dtypes: Sequence[str], attrs: Sequence[Attr] = (), codec: Codec | None = None,
              doc: str = "", check_values: Callable[..., None] | None = None,
              registry: Registry | None = None, **spec_fields: Any) -> OpSpec:
    """Declare a custom op ``ns.Name`` in the one registry and return its OpSpec.

    ``codec`` is RLX's attribute byte encoding (required when the op has attributes; an op
    without attributes encodes to no bytes). ``check_values(inputs, attrs)`` validates input
    values on the host (raise SpecError). ``spec_fields`` are the other OpSpec fields (shapes,
    values, policy, generate, error_inputs, low_precision, undefined). ``registry``: where to
    declare (default: the global one, like ``registry.declare``). Raises RegistrationError for an
    unnamespaced or taken name, a codec that does not match the attributes, or an OpSpec field
    that does not exist."""
    registry = REGISTRY if registry is None else registry
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise RegistrationError(f"custom op name {name!r} must be namespaced, 'ns.Name' "
                                "(identifiers joined by dots), e.g. 'onnx.GatherND'")
    if name in registry:
        raise RegistrationError(f"custom op {name!r} is already declared")
    attrs = tuple(attrs)
    if codec is None:
        if attrs:
            raise RegistrationError(f"{name}: has attributes {[a.name for a in attrs]} but no codec")
        codec = Codec()
    _check_codec(name, attrs, codec)
    known = {f.name for f in dataclasses.fields(OpSpec)}
    extra = sorted(set(spec_fields) - known)
    if extra:
        raise RegistrationError(f"{name}: unknown OpSpec field(s) {extra}")
    if "family" in spec_fields and spec_fields.pop("family") != "custom":
        raise RegistrationError(f"{name}: custom ops are family 'custom'")
    try:  # what registry.declare does, into the chosen registry
        spec = registry.add(OpSpec(name=name, family="custom", doc=doc, inputs=tuple(inputs),
                                   infer=infer, dtypes=tuple(dtypes), attrs=attrs,
                                   check_values=check_values,
                                   declared_at=spec_fields.pop("declared_at", None) or declaration_site(),
                                   **spec_fields))
    except (TypeError, ValueError) as e:
        raise RegistrationError(f"{name}: {e}") from None
    _table(registry)[name] = CustomOp(spec, codec, check_values)
    return spec


def custom(name: str, registry: Registry | None = None) -> CustomOp:
    """The custom op ``name`` (UnknownOpError for an unknown name, SpecError for a built-in)."""
    registry = REGISTRY if registry is None else registry
    try:
        return _table(registry)[name]
    except KeyError:
        registry[name]  # noqa: B018 — UnknownOpError with suggestions
        raise SpecError(f"{name!r} is not a custom op") from None


def encode_attrs(name: str, attrs: Mapping[str, Any] | None = None,
                 registry: Registry | None = None) -> bytes:
    """The op's attributes (defaults filled, checked) in RLX's byte encoding."""
    c = custom(name, registry)
    return c.codec.encode(c.spec.resolve_attrs(attrs))


def decode_attrs(name: str, data: bytes, registry: Registry | None = None) -> dict[str, Any]:
    """RLX attribute bytes back to typed attributes, checked against the spec."""
    c = custom(name, registry)
    return c.spec.resolve_attrs(c.codec.decode(data))


__all__ = ["Attr", "Codec", "CustomOp", "Field", "Input", "Policy", "custom", "custom_op",
           "decode_attrs", "encode_attrs"]
