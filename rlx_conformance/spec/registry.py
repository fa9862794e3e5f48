"""The one op registry: what each op is, declared once.

An :class:`OpSpec` holds an op's inputs (with roles, allowed dtypes and value domains), typed
attributes (defaults, valid values, what the case matrix sweeps), shape/dtype inference, and its
comparison policy. Backends register kernels against these names; the case generator reads them;
nothing about an op is declared anywhere else. Op declarations live in ``rlx_conformance.ops``,
one module per family.
"""
from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any, TypeVar

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError, UnknownOpError

Shape = tuple[int, ...]
OutSpec = tuple[Shape, str]  # (shape, dtype name); a None dim is data-dependent (non_zero)
F = TypeVar("F", bound=Callable[..., Any])
# The hooks' types, for the family modules' declaration helpers (see OpSpec for each contract):
Infer = Callable[..., list[OutSpec]]
Generate = Callable[..., list[np.ndarray]]
CheckValues = Callable[..., None]
ErrorInputs = Callable[[], list[tuple[str, list[np.ndarray], dict[str, Any]]]]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

ATTR_KINDS = ("int", "float", "bool", "ints", "dtype", "enum")


@dataclass(frozen=True)
class Input:
    """One operand. ``dtypes`` is ``"T"`` (the op's type variable) or an explicit tuple."""

    name: str
    dtypes: str | tuple[str, ...] = "T"
    role: str = "data"  # data | condition | index | ...
    domain: str = "real"  # a value domain in cases/domains/*.toml
    variadic: bool = False
    # The ranks this input accepts, (min, max), max None for unbounded: generate/coverage.py checks
    # that the case matrix exercises every rank class (0, 1, 2, 3+) inside the range.
    ranks: tuple[int, int | None] = (0, None)
    # Whether the op's result has a derivative with respect to this input (the reference's VJP and
    # JVP rules, backends/cpu/*.py). None derives it: floating data inputs yes; index, condition
    # and key roles, integer and bool inputs no (OpSpec.input_differentiable). Declared only where
    # that default is wrong.
    differentiable: bool | None = None


@dataclass(frozen=True)
class Attr:
    """A typed attribute. ``sweep`` is what the case matrix tries: explicit values, or a symbolic
    sweep resolved per input shape ("axis": every axis, negative too; "axes": axis subsets)."""

    name: str
    kind: str
    default: Any = REQUIRED
    choices: tuple | None = None
    sweep: tuple | str | Callable[..., Sequence[Any]] | None = None  # callable: sweep(shapes)
    doc: str = ""
    empty: str = "none"  # how an empty tuple value reads in a case id (reduction axes: "all")

    def __post_init__(self) -> None:
        if self.kind not in ATTR_KINDS:
            raise ValueError(f"attribute {self.name}: kind {self.kind!r} not in {ATTR_KINDS}")

    def check(self, op: str, value: Any) -> Any:
        """Validate and normalise one attribute value (type and choices), or raise SpecError."""
        bad = SpecError(f"{op}: attribute {self.name}={value!r} is not a valid {self.kind}"
                        + (f" (one of {', '.join(map(str, self.choices))})" if self.choices else ""))
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise bad
            value = int(value)
        elif self.kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise bad
            value = float(value)
        elif self.kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise bad
            value = bool(value)
        elif self.kind == "ints":
            if not isinstance(value, (tuple, list)) or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in value
            ):
                raise bad
            value = tuple(int(v) for v in value)
        elif self.kind == "dtype":
            if value not in dt.ALL:
                raise SpecError(f"{op}: attribute {self.name}={value!r} is not a dtype ({', '.join(dt.ALL)})")
        elif self.kind == "enum":
            if value not in (self.choices or ()):
                raise bad
        if self.choices is not None and self.kind != "enum" and value not in self.choices:
            raise bad
        return value


@dataclass(frozen=True)
class Policy:
    """How outputs are judged.

    ``exact``: bit-exact (NaN positions must match). Otherwise floats pass within the case's
    tolerance (cases/tolerances.toml: per-dtype defaults, per-op overrides with reasons), or within
    ``bound``: a per-element absolute error bound from numerical analysis, computed from the inputs
    (for example gamma_n * sum|x| for a sum), with ``bound_reason`` saying why. A bound returns an
    array or a ``judge.compare.Bound``, which also marks the positions whose outcome the spec
    leaves to the order of evaluation (e.g. intermediate overflow of a sum whose exact value is
    finite) and the outcomes legal there; NaN and infinities are asserted exactly everywhere else.
    """

    exact: bool = False
    signed_zero: bool = False
    bound: Callable[..., np.ndarray] | None = None
    bound_reason: str = ""
    # A judge of its own for ops not compared elementwise (solvers by backward error, factorizations
    # by reconstruction, random ops by distribution tests):
    # check(inputs, attrs, expected, actual) -> list[rlx_conformance.judge.compare.Comparison].
    check: Callable[..., list[Any]] | None = None
    check_reason: str = ""


# The bit-exact policies the op families share, named once so that a name means one policy in
# every declaration module: results exactly defined, and with the sign of a zero asserted too.
EXACT = Policy(exact=True)
EXACT_SZ = Policy(exact=True, signed_zero=True)


def _no_undefined(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class OpSpec:
    """Everything about one op. ``infer(spec, shapes, dtypes, attrs)`` returns the output
    (shape, dtype) list and raises SpecError on bad shapes or attributes."""

    name: str
    family: str
    doc: str
    inputs: tuple[Input, ...]
    infer: Callable[..., list[OutSpec]]
    dtypes: tuple[str, ...]
    attrs: tuple[Attr, ...] = ()
    shapes: str = "unary"  # shape-family kind in cases/shapes/*.toml
    values: tuple[str, ...] = ("random", "special")  # value classes (rlx_conformance/spec/values.py)
    policy: Policy = field(default_factory=Policy)
    # Output positions the spec leaves undefined (docs/ops.md): None, or a bool mask broadcast to the output.
    undefined: Callable[..., np.ndarray | None] = _no_undefined
    # "f32": float16/bfloat16 compute in float32 and round once (RLX prepare_f32_exec_graph);
    # "native": pure layout ops stay in their dtype.
    low_precision: str = "f32"
    # Ops whose inputs are structured (indices, CSR matrices, SPD matrices...) make them here
    # instead of drawing each input from its domain: generate(stream, shapes, dtype, attrs, vals)
    # -> list of numpy arrays, where stream(k) is input k's deterministic Stream and ``shapes`` is
    # the shape family's entry.
    generate: Callable[..., list[np.ndarray]] | None = None
    # Validation of input *values* on the host before any backend sees them (index ranges, CSR
    # structure): check_values(inputs, attrs) raises SpecError. MLX does no bounds checking, so an
    # out-of-range index must never reach it. Backend.run calls it after the shape checks.
    check_values: Callable[..., None] | None = None
    # Error inputs (bad shapes, attributes, indices, dtypes) that every backend must reject:
    # a list of (description, inputs, attrs). Used by validate's error-input parity check.
    error_inputs: Callable[[], list[tuple[str, list[np.ndarray], dict[str, Any]]]] | None = None
    # Where the op is declared ("path/to/module.py:LINE"), for ``rlx-conformance ops OP --explain``:
    # filled by ``declare`` from the first caller outside the registry's declaration helpers.
    declared_at: str = ""
    # Declared classes (ranks, attribute value classes, dtypes: generate/coverage.py) that the
    # matrix genuinely cannot exercise, each with the reason: ((class key, reason), ...), e.g.
    # (("attr:axis=positive", "rank-1 data has no positive axis"),).
    uncovered: tuple[tuple[str, str], ...] = ()
    # Why the op has no derivative at all, though it has floating inputs (comparisons, arg_*,
    # integer outputs, random draws, rounding); "" for a differentiable op. Ops without a
    # differentiable input are not differentiable without saying so (OpSpec.not_differentiable_reason).
    not_differentiable: str = ""
    # Value classes only gradient cases get (spec/values.py), besides the forward's own minus
    # ``special``: points at and next to the op's kinks and ties ("kink", "ties", "near_zero"),
    # where the reference's DerivativeRule.convention decides.
    grad_values: tuple[str, ...] = ()
    # Whether gradient cases include Hessian-vector products (the JVP of the VJP; the reference
    # backend has an HVP rule for it): the activations, softmax-style ops, norms and losses.
    second_order: bool = False

    # -- derived facts -------------------------------------------------------------------------
    def input_differentiable(self, inp: Input) -> bool:
        """Whether the result is differentiable with respect to ``inp`` (its floating dtypes): the
        declared ``Input.differentiable``, else data inputs with a floating dtype; never for an op
        declared ``not_differentiable``."""
        if self.not_differentiable:
            return False
        if inp.differentiable is not None:
            return inp.differentiable
        dtypes = self.dtypes if inp.dtypes == "T" else inp.dtypes
        return inp.role == "data" and any(dt.is_float(d) for d in dtypes)

    def differentiable_inputs(self) -> tuple[int, ...]:
        """Positions of the differentiable inputs (a variadic last input counts once)."""
        return tuple(k for k, i in enumerate(self.inputs) if self.input_differentiable(i))

    @property
    def differentiable(self) -> bool:
        return bool(self.differentiable_inputs())

    def derivative_kinds(self) -> tuple[str, ...]:
        """The derivatives gradient cases check: vjp and jvp for a differentiable op, and hvp
        where declared ``second_order``."""
        if not self.differentiable:
            return ()
        return ("vjp", "jvp", "hvp") if self.second_order else ("vjp", "jvp")

    def not_differentiable_reason(self) -> str:
        """Why the op has no derivative ("" when it has one): the declared reason, or derived."""
        if self.not_differentiable or self.differentiable:
            return self.not_differentiable
        return "no floating-point data input"

    def attr(self, name: str) -> Attr:
        for a in self.attrs:
            if a.name == name:
                return a
        raise KeyError(name)

    def input_dtypes(self, inp: Input, t: str) -> tuple[str, ...]:
        return (t,) if inp.dtypes == "T" else inp.dtypes  # type: ignore[return-value]

    def case_dtypes(self, t: str, n_inputs: int | None = None) -> list[str]:
        """Concrete dtype of each input for type variable T = t."""
        out = [self.input_dtypes(i, t)[0] for i in self.inputs]
        if n_inputs is not None and self.inputs and self.inputs[-1].variadic:
            out += [out[-1]] * (n_inputs - len(out))
        return out

    # -- validation -----------------------------------------------------------------------------
    def resolve_attrs(self, attrs: Mapping[str, Any] | None) -> dict[str, Any]:
        """Fill defaults, type-check values, reject unknown or missing attributes."""
        attrs = dict(attrs or {})
        known = {a.name for a in self.attrs}
        unknown = sorted(set(attrs) - known)
        if unknown:
            raise SpecError(f"{self.name}: unknown attribute(s) {', '.join(unknown)}"
                            f" (known: {', '.join(sorted(known)) or 'none'})")
        out = {}
        for a in self.attrs:
            if a.name in attrs:
                out[a.name] = a.check(self.name, attrs[a.name])
            elif a.default is REQUIRED:
                raise SpecError(f"{self.name}: missing required attribute {a.name}")
            else:
                out[a.name] = a.default
        return out

    def validate(self, shapes: Sequence[Shape], dtypes: Sequence[str],
                 attrs: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[OutSpec]]:
        """Check input count, dtypes, attributes and shapes; return (attrs, output specs)."""
        n = len(self.inputs)
        variadic = bool(self.inputs) and self.inputs[-1].variadic
        if (len(shapes) < n if variadic else len(shapes) != n):
            names = ", ".join(i.name for i in self.inputs)
            raise SpecError(f"{self.name}: expects {n}{'+' if variadic else ''} input(s) ({names}), got {len(shapes)}")
        t = None
        for k, (inp_dtype) in enumerate(dtypes):
            inp = self.inputs[min(k, n - 1)]
            if inp_dtype not in dt.ALL:
                raise SpecError(f"{self.name}: input {inp.name} has dtype {inp_dtype}, not in the harness dtype list")
            if inp.dtypes == "T":
                if t is None:
                    t = inp_dtype
                    if t not in self.dtypes:
                        raise SpecError(f"{self.name}: dtype {t} not supported (supported: {', '.join(self.dtypes)})")
                elif inp_dtype != t:
                    raise SpecError(f"{self.name}: input {inp.name} has dtype {inp_dtype}, expected {t} like the other T inputs")
            elif inp_dtype not in inp.dtypes:
                raise SpecError(f"{self.name}: input {inp.name} has dtype {inp_dtype}, expected one of {', '.join(inp.dtypes)}")
        resolved = self.resolve_attrs(attrs)
        outs = self.infer(self, [tuple(int(d) for d in s) for s in shapes], list(dtypes), resolved)
        return resolved, outs


class Registry(Mapping[str, OpSpec]):
    """Name → OpSpec. Filled by ``declare``: the built-in families when ``rlx_conformance.ops`` is
    imported, custom ops when their module is; look ops up through ``rlx_conformance.ops``."""

    def __init__(self) -> None:
        self._ops: dict[str, OpSpec] = {}

    def add(self, spec: OpSpec) -> OpSpec:
        if spec.name in self._ops:
            raise ValueError(f"op {spec.name!r} is declared twice")
        for i in spec.inputs:
            if i.dtypes != "T" and not set(i.dtypes) <= set(dt.ALL):
                raise ValueError(f"{spec.name}: input {i.name} lists unknown dtypes {i.dtypes}")
        if not set(spec.dtypes) <= set(dt.ALL):
            raise ValueError(f"{spec.name}: unknown dtypes in {spec.dtypes}")
        self._ops[spec.name] = spec
        return spec

    def __getitem__(self, name: str) -> OpSpec:
        try:
            return self._ops[name]
        except KeyError:
            close = difflib.get_close_matches(str(name), self._ops, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UnknownOpError(f"unknown op {name!r}{hint}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)


REGISTRY = Registry()


# Code objects of the functions marked with :func:`declaration_helper`.
_HELPER_CODES: set[CodeType] = set()


def declaration_helper(fn: F) -> F:
    """Mark ``fn`` as a declaration helper: a function that calls :func:`declare` on its caller's
    behalf with a family's fixed fields filled in (``unary("exp", "e^x", domain="exp")`` in
    ``ops/elementwise.py``), so that ``declared_at`` names the line of the call, where the op is
    read, rather than the line inside the helper."""
    _HELPER_CODES.add(fn.__code__)
    return fn


def declaration_site() -> str:
    """file:line of the declaration: the first frame outside this package's declaration helpers
    (``rlx_conformance.spec``), outside private helper modules of ``rlx_conformance.ops`` and
    outside functions marked with :func:`declaration_helper`."""
    frame = sys._getframe(1)
    while frame is not None:
        mod = frame.f_globals.get("__name__", "")
        if not (mod.startswith(("rlx_conformance.spec", "rlx_conformance.ops._"))
                or frame.f_code in _HELPER_CODES):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def declare(**kw: Any) -> OpSpec:
    """Declare an op in the global registry (used by the family modules in ``rlx_conformance.ops``)."""
    kw.setdefault("declared_at", declaration_site())
    return REGISTRY.add(OpSpec(**kw))
