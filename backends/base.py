"""What every backend shares: kernel registration (checked against the registry at import) and
the one path an op takes through a backend: validate → compute dtypes → kernel → contract check
→ declared output dtypes."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import (
    KernelContractError,
    RegistrationError,
    SpecError,
    UnsupportedError,
)
from rlx_conformance.ops import get_op
from rlx_conformance.spec.registry import REQUIRED, OpSpec, OutSpec


@dataclass
class KernelEntry:
    """A registered kernel: the function, the dtypes it claims per device, native or delegated."""

    op: str
    fn: Callable[..., Any]
    dtypes: dict[str, frozenset[str]]  # device -> dtypes claimed
    native: bool = True
    origin: str = "builtin"
    note: str = ""  # why delegated / what is special
    options: dict[str, Any] = field(default_factory=dict)


def check_signature(backend: str, spec: OpSpec, fn: Callable[..., Any]) -> None:
    """The call convention: one positional parameter per input in registry order (``*args`` for a
    variadic last input), attributes as keyword parameters named as in the registry (or **kw)."""
    where = f"{backend} kernel for {spec.name!r}"
    if isinstance(fn, np.ufunc):  # a numpy ufunc: nin inputs, no attributes
        if fn.nin != len(spec.inputs) or spec.attrs:
            raise RegistrationError(f"{where}: ufunc {fn.__name__} takes {fn.nin} input(s) and no "
                                    f"attributes; the spec has {len(spec.inputs)} input(s) and "
                                    f"{len(spec.attrs)} attribute(s)")
        return
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return  # builtins / ufuncs without a signature: checked at call time
    pos = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
           and p.default is p.empty]
    var_pos = any(p.kind == p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind == p.VAR_KEYWORD for p in params)
    kw = {p.name for p in params if p.kind == p.KEYWORD_ONLY
          or (p.kind == p.POSITIONAL_OR_KEYWORD and p.default is not p.empty)}
    n_in = len(spec.inputs)
    variadic = bool(spec.inputs) and spec.inputs[-1].variadic
    if variadic:
        if not var_pos or len(pos) > n_in - 1:
            raise RegistrationError(f"{where}: the last input {spec.inputs[-1].name} is variadic; "
                                    "the kernel needs *args for it")
    elif len(pos) != n_in and not (var_pos and len(pos) < n_in):
        names = ", ".join(i.name for i in spec.inputs) or "none"
        raise RegistrationError(f"{where}: takes {len(pos)} positional input(s), the spec has "
                                f"{n_in} ({names})")
    attrs = {a.name for a in spec.attrs}
    missing = attrs - kw
    extra = kw - attrs
    if (missing and not var_kw) or extra:
        raise RegistrationError(f"{where}: keyword parameters {sorted(kw)} do not match the spec's "
                                f"attributes {sorted(attrs)}")


def _as_list(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


class Backend:
    """Base class. Subclasses set ``name``, ``modes`` and implement ``devices`` and ``_execute``."""

    name = "?"
    modes: tuple[str, ...] = ("eager",)
    default_mode = "eager"
    # Devices on which the backend DOCUMENTS flushing subnormal results to zero (FTZ). Only there
    # may the precise oracle (rlx_conformance/judge/accuracy.py) accept a zero where the exact result
    # is subnormal; the case then records ftz_used. A property of the arithmetic, not a tolerance.
    ftz_devices: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.kernels: dict[str, KernelEntry] = {}

    def flushes_subnormals(self, device: str) -> bool:
        """Whether results that would be subnormal may come back as zero on ``device`` (FTZ)."""
        return device in self.ftz_devices

    # -- registration ------------------------------------------------------------------------
    def all_devices(self) -> tuple[str, ...]:
        return ("cpu",)

    def devices(self) -> list[str]:
        """Devices usable on this machine now."""
        return ["cpu"]

    def register(self, op: str, fn: Callable[..., Any], *, dtypes: Iterable[str] | None = None,
                 devices: Mapping[str, Iterable[str]] | None = None, native: bool = True,
                 origin: str = "builtin", note: str = "", replace: bool = False,
                 **options: Any) -> KernelEntry:
        """Register ``fn`` for ``op``. ``dtypes``: what the kernel claims on every device (default:
        all the spec's); ``devices``: per-device overrides. Raises RegistrationError naming the op."""
        try:
            spec = get_op(op)
        except KeyError:
            raise RegistrationError(f"{self.name}: cannot register a kernel for unknown op {op!r}") from None
        check_signature(self.name, spec, fn)
        base = frozenset(spec.dtypes if dtypes is None else dtypes)
        bad = base - set(spec.dtypes)
        if bad:
            raise RegistrationError(f"{self.name} kernel for {op!r}: claims dtypes {sorted(bad)} the "
                                    f"spec does not define ({', '.join(spec.dtypes)})")
        per_dev = {d: base for d in self.all_devices()}
        for d, ds in (devices or {}).items():
            if d not in per_dev:
                raise RegistrationError(f"{self.name} kernel for {op!r}: unknown device {d!r}")
            per_dev[d] = frozenset(ds)
        if op in self.kernels and not replace:
            raise RegistrationError(f"{self.name}: a kernel for {op!r} is already registered")
        entry = KernelEntry(op, fn, per_dev, native, origin, note, dict(options))
        self.kernels[op] = entry
        return entry

    def kernel(self, op: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator form of :meth:`register`."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(op, fn, **kw)
            return fn
        return deco

    def entry(self, op: str) -> KernelEntry:
        try:
            return self.kernels[op]
        except KeyError:
            get_op(op)  # unknown op → UnknownOpError
            raise UnsupportedError(f"{self.name} has no kernel for {op!r}") from None

    def supports(self, op: str, dtype: str, device: str) -> bool:
        e = self.kernels.get(op)
        return bool(e) and dtype in e.dtypes.get(device, ())

    def variants(self, op: str, dtype: str, device: str, option: str | None = None) -> list[str]:
        """The numerics variants a case of ``op`` runs in on ``device`` (matrix.Target.variant;
        ``option`` is the run's choice, e.g. --tf32). [""]: the backend has none for it."""
        return [""]

    def variant_env(self, variant: str) -> dict[str, str]:
        """Environment a worker process needs for ``variant``, set before the backend loads."""
        return {}

    # -- running ---------------------------------------------------------------------------------
    def run(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None = None,
            device: str = "cpu", mode: str | None = None, *, force: bool = False) -> list[np.ndarray]:
        """Run ``op`` once on numpy inputs; numpy outputs in the dtypes the registry declares.
        ``force`` runs even a dtype the kernel does not claim (the declaration check uses it)."""
        spec = get_op(op)
        mode = mode or self.default_mode
        if mode not in self.modes:
            raise SpecError(f"{self.name}: unknown mode {mode!r} (modes: {', '.join(self.modes)})")
        if device not in self.all_devices():
            raise SpecError(f"{self.name}: unknown device {device!r} (devices: {', '.join(self.all_devices())})")
        if device not in self.devices():
            raise UnsupportedError(f"{self.name}: device {device!r} is not available on this machine")
        arrays, in_dtypes, attrs, outs = prevalidate(spec, inputs, attrs)
        entry = self.entry(op)
        t = type_var(spec, in_dtypes) or outs[0][1]
        if not force and not self.supports(op, t, device):
            raise UnsupportedError(f"{self.name} does not support {op} on {t} on device {device}")
        return self._execute(entry, spec, arrays, in_dtypes, attrs, outs, device, mode)

    def run_unchecked(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None = None,
                      device: str = "cpu", mode: str | None = None) -> list[np.ndarray]:
        """The kernel alone, without the harness's pre-validation (:func:`prevalidate`): what the
        kernel itself does with an error input (validate's error-input parity). Attributes get
        their defaults filled but are not checked; no output spec exists, so outputs are not
        checked or narrowed. Inputs must be numpy arrays of harness dtypes."""
        spec = get_op(op)
        entry = self.entry(op)
        attrs = {a.name: a.default for a in spec.attrs if a.default is not REQUIRED} | dict(attrs or {})
        in_dtypes = [dt.name_of(x.dtype) for x in inputs]
        return self._execute(entry, spec, list(inputs), in_dtypes, attrs, None, device, mode or self.default_mode)

    def _execute(self, entry: KernelEntry, spec: OpSpec, inputs: list[np.ndarray],
                 in_dtypes: list[str], attrs: dict[str, Any], outs: list[OutSpec] | None, device: str,
                 mode: str) -> list[np.ndarray]:
        """Run the kernel. ``outs`` None: :meth:`run_unchecked` (no contract check, no narrowing).
        With ``entry.options["check_inputs"]`` (contributed kernels) the inputs the kernel saw are
        compared with pristine copies afterwards (:func:`check_inputs_unchanged`)."""
        raise NotImplementedError


def prevalidate(spec: OpSpec, inputs: Sequence[Any], attrs: Mapping[str, Any] | None
                ) -> tuple[list[np.ndarray], list[str], dict[str, Any], list[OutSpec]]:
    """The harness's checks in front of every kernel: numpy inputs of harness dtypes, the spec's
    dtypes, attributes and shape inference, then the op's host-side value checks (index ranges,
    CSR structure). Returns (arrays, input dtype names, resolved attrs, output specs); raises
    SpecError."""
    arrays = []
    for k, x in enumerate(inputs):
        if not isinstance(x, np.ndarray):
            raise SpecError(f"{spec.name}: input {k} is {type(x).__name__}, expected a numpy array")
        arrays.append(x)
    try:
        in_dtypes = [dt.name_of(x.dtype) for x in arrays]
    except ValueError as e:
        raise SpecError(f"{spec.name}: {e}") from None
    resolved, outs = spec.validate([x.shape for x in arrays], in_dtypes, attrs)
    if spec.check_values is not None:
        spec.check_values(arrays, resolved)
    return arrays, in_dtypes, resolved, outs


def type_var(spec: OpSpec, in_dtypes: Sequence[str]) -> str | None:
    """The concrete T of a call (the dtype of the first T-typed input)."""
    for k, d in enumerate(in_dtypes):
        if spec.inputs[min(k, len(spec.inputs) - 1)].dtypes == "T":
            return d
    return None


def compute_dtypes(spec: OpSpec, in_dtypes: Sequence[str]) -> list[str]:
    """float16/bfloat16 inputs compute in float32 unless the op is pure layout (low precision, docs/ops.md)."""
    if spec.low_precision != "f32":
        return list(in_dtypes)
    return [dt.compute_dtype(d) for d in in_dtypes]


def check_outputs(backend: str, spec: OpSpec, outs: list[Any], declared: list[OutSpec],
                  shape_dtype: Callable[[Any], tuple[tuple[int, ...], str]]) -> None:
    """A kernel's outputs must match the declared count and shapes, and each dtype must be the
    declared one or (for low-precision outputs) its compute dtype."""
    where = f"{backend} kernel for {spec.name!r}"
    if len(outs) != len(declared):
        raise KernelContractError(f"{where}: returned {len(outs)} output(s), the spec declares {len(declared)}")
    for k, (o, (shape, dtype)) in enumerate(zip(outs, declared)):
        try:
            got_shape, got_dtype = shape_dtype(o)
        except (TypeError, ValueError, AttributeError):
            kind = f"{type(o).__module__}.{type(o).__qualname__}".removeprefix("builtins.")
            raise KernelContractError(f"{where}: output {k} is a {kind}, not an array of the {backend} "
                                      "backend") from None
        if len(got_shape) != len(shape) or any(s is not None and g != s for g, s in zip(got_shape, shape)):
            raise KernelContractError(f"{where}: output {k} has shape {tuple(got_shape)}, the spec says {tuple(shape)}")
        allowed = {dtype, dt.compute_dtype(dtype)} if spec.low_precision == "f32" else {dtype}
        if got_dtype not in allowed:
            raise KernelContractError(f"{where}: output {k} has dtype {got_dtype}, the spec says {dtype}")


def check_inputs_unchanged(backend: str, spec: OpSpec, pristine: Sequence[np.ndarray],
                           after: Sequence[np.ndarray]) -> None:
    """A kernel must not modify its inputs: ``after`` (the inputs the kernel was handed, read back
    after the call) must equal ``pristine`` (copies taken before) bit for bit (any NaN equals any
    NaN: payloads may change crossing into a backend). Raises KernelContractError naming the input."""
    where = f"{backend} kernel for {spec.name!r}"
    for k, (b, a) in enumerate(zip(pristine, after)):
        name = spec.inputs[min(k, len(spec.inputs) - 1)].name
        if a.shape != b.shape or a.dtype != b.dtype:
            raise KernelContractError(f"{where}: modified input {k} ({name}) in place: it became "
                                      f"{a.dtype}{list(a.shape)}, was {b.dtype}{list(b.shape)}")
        if a.dtype == np.bool_ or not a.size:
            same = np.array_equal(a, b)
        else:
            bits = f"u{a.dtype.itemsize}"
            eq = np.ascontiguousarray(a).view(bits) == np.ascontiguousarray(b).view(bits)
            if dt.is_float(dt.name_of(a.dtype)):
                with np.errstate(invalid="ignore"):
                    eq |= np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
            same = bool(np.all(eq))
        if not same:
            raise KernelContractError(f"{where}: modified input {k} ({name}) in place; kernels must "
                                      "not write to their inputs")
