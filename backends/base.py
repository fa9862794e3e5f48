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

# Shared libraries (os.pathsep-separated paths) a worker loads RTLD_GLOBAL before it imports a
# backend: what LD_PRELOAD does for a process started fresh, for workers forked from a forkserver
# that began before the run knew its backends' environment (run/worker.py, serve). Their symbols
# then come before those of a library the backend loads later, such as MLX's libnvrtc.
PRELOAD_ENV = "RLX_CONFORMANCE_WORKER_PRELOAD"


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


def record_fields(entry: KernelEntry | None) -> dict[str, Any]:
    """What a case's record says of the kernel that ran it: native or delegated, and its origin
    where it is not built in (forward and derivative cases alike)."""
    kw: dict[str, Any] = {"kernel": "native" if entry is None or entry.native else "delegated"}
    if entry is not None and entry.origin != "builtin":
        kw["origin"] = entry.origin
    return kw


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


# A rule's per-array argument or result: None for an input (output) with no derivative.
Grads = list[np.ndarray | None]


@dataclass
class DerivativeRule:
    """The reference derivative of one op, written by hand next to its forward kernel and
    evaluated in float64 whatever the case dtype (tests/test_reference_derivatives.py verifies
    each against finite differences, the other rule and, elementwise, MPFR).

    ``vjp(inputs, attrs, cotangents) -> one cotangent per input`` (None for a non-differentiable
    input; cotangents hold one array per output, None for a non-floating output) and
    ``jvp(inputs, attrs, tangents) -> one tangent per output`` (tangents: one per input, None for
    a non-differentiable input). ``convention`` says what the rules return where the op is not
    differentiable (kinks, ties, domain edges), as PyTorch documents its own. ``radius(inputs,
    attrs)`` gives, per input, an array of per-element distances (None: unbounded) such that the
    op is smooth on the box of perturbations |dx_i| < r_i around the point: 0 at a kink or a tie,
    the gap to it nearby (the finite-difference test keeps its stencil inside that box).
    ``condition(inputs, attrs)``: how much the rules amplify rounding at this point (the
    condition number of the matrices a solve-based rule inverts; None: 1), a factor of any error
    bound put on their results."""

    op: str
    vjp: Callable[..., Grads] | None = None
    jvp: Callable[..., Grads] | None = None
    convention: str = ""
    radius: Callable[..., Grads] | None = None
    condition: Callable[..., float] | None = None
    # Second order: ``hvp(inputs, attrs, cotangents, tangents) -> one result per input`` (None for
    # a non-differentiable input): d/de VJP(x + e v, u), the JVP of the VJP (ops that have one).
    hvp: Callable[..., Grads] | None = None
    # The scale the derivative judge's bound multiplies (judge/bounds/derivative.py):
    # ``magnitude(inputs, attrs, kind, seeds) -> (per-result arrays, terms)`` with, for kind
    # "vjp" (seeds: the cotangents), arrays >= |J|^T |u| per input; for "jvp" (seeds: the
    # tangents), >= |J| |v| per output; both plus the op's sensitivity to the rounding of the
    # forward values a derivative is computed from. ``terms``: the most rounded products one
    # result element accumulates (the n of gamma_n). Ops without one get the dense Jacobian
    # (Backend.run_magnitude), exact but only for small cases.
    magnitude: Callable[..., tuple[Grads, int]] | None = None
    # The same for the HVP: ``hvp_magnitude(inputs, attrs, cotangents, tangents) -> (per-input
    # arrays, terms)``, at least the sum of the magnitudes of the HVP's terms per input.
    hvp_magnitude: Callable[..., tuple[Grads, int]] | None = None
    # Where a derivative is undefined by the spec (not a convention: e.g. the updates of a
    # scatter with duplicate indices under reduction none): ``undefined(inputs, attrs, kind) ->
    # one bool mask (or None) per result``; masked like undefined forward inputs.
    undefined: Callable[..., list[np.ndarray | None]] | None = None


class Backend:
    """Base class. Subclasses set ``name``, ``modes`` and implement ``devices`` and ``_execute``."""

    name = "?"
    modes: tuple[str, ...] = ("eager",)
    default_mode = "eager"
    # Devices on which the backend DOCUMENTS flushing subnormal results to zero (FTZ). Only there
    # may the precise oracle (rlx_conformance/judge/accuracy.py) accept a zero where the exact result
    # is subnormal; the case then records ftz_used. A property of the arithmetic, not a tolerance.
    ftz_devices: frozenset[str] = frozenset()
    # What the backend does with run's ``layout`` (layouts.LAYOUTS, one per input): "views" hands
    # its kernels views of that memory layout (MlxBackend); "values" sees only the logical values,
    # which a layout leaves alone (the CPU reference); "" rejects every layout but contiguous.
    layouts: str = ""

    def __init__(self) -> None:
        self.kernels: dict[str, KernelEntry] = {}
        self.derivatives: dict[str, DerivativeRule] = {}

    def flushes_subnormals(self, device: str) -> bool:
        """Whether results that would be subnormal may come back as zero on ``device`` (FTZ)."""
        return device in self.ftz_devices

    def environment_warnings(self, targets: Iterable[Any]) -> list[str]:
        """What this machine lacks for ``targets`` (Target: backend, device, mode) to test what
        they are meant to, in words for the run's warnings; none by default."""
        return []

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

    # -- reference derivatives (DerivativeRule) ------------------------------------------------
    def _rule_for(self, op: str, kind: str) -> DerivativeRule:
        spec = get_op(op)
        if not spec.differentiable:
            raise RegistrationError(f"{self.name}: a {kind} rule for {op!r}, which the registry "
                                    f"declares not differentiable ({spec.not_differentiable_reason()})")
        rule = self.derivatives.setdefault(op, DerivativeRule(op))
        if getattr(rule, kind) is not None:
            raise RegistrationError(f"{self.name}: a {kind} rule for {op!r} is already registered")
        return rule

    def vjp(self, op: str, *, convention: str = "", radius: Callable[..., Grads] | None = None,
            condition: Callable[..., float] | None = None
            ) -> Callable[[Callable[..., Grads]], Callable[..., Grads]]:
        """Decorator: register ``op``'s VJP rule, with its convention at non-differentiable
        points, its smoothness radius and its condition (see :class:`DerivativeRule`)."""
        def deco(fn: Callable[..., Grads]) -> Callable[..., Grads]:
            rule = self._rule_for(op, "vjp")
            rule.vjp, rule.convention, rule.radius, rule.condition = fn, convention, radius, condition
            return fn
        return deco

    def jvp(self, op: str) -> Callable[[Callable[..., Grads]], Callable[..., Grads]]:
        """Decorator: register ``op``'s JVP rule (written independently of its VJP rule)."""
        def deco(fn: Callable[..., Grads]) -> Callable[..., Grads]:
            self._rule_for(op, "jvp").jvp = fn
            return fn
        return deco

    def hvp(self, op: str) -> Callable[[Callable[..., Grads]], Callable[..., Grads]]:
        """Decorator: register ``op``'s Hessian-vector product rule (the JVP of its VJP)."""
        def deco(fn: Callable[..., Grads]) -> Callable[..., Grads]:
            self._rule_for(op, "hvp").hvp = fn
            return fn
        return deco

    def magnitude(self, op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the magnitude of ``op``'s derivatives (DerivativeRule.magnitude)."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._rule_for(op, "magnitude").magnitude = fn
            return fn
        return deco

    def hvp_magnitude(self, op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register the magnitude of ``op``'s HVP (DerivativeRule.hvp_magnitude)."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._rule_for(op, "hvp_magnitude").hvp_magnitude = fn
            return fn
        return deco

    def undefined_derivative(self, op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator: register where ``op``'s derivatives are undefined (DerivativeRule.undefined)."""
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._rule_for(op, "undefined").undefined = fn
            return fn
        return deco

    def derivative(self, op: str) -> DerivativeRule:
        """``op``'s complete rule (VJP and JVP); UnsupportedError if it has none."""
        rule = self.derivatives.get(op)
        if rule is None or rule.vjp is None or rule.jvp is None:
            get_op(op)  # unknown op → UnknownOpError
            raise UnsupportedError(f"{self.name} has no reference derivative for {op!r}")
        return rule

    def _derivative_call(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None
                         ) -> tuple[DerivativeRule, list[np.ndarray], dict[str, Any],
                                    list[OutSpec], list[bool]]:
        """The checks of :meth:`run`, then the floating inputs in float64; also which inputs are
        differentiable (per array: a variadic input's arrays share its declaration)."""
        spec = get_op(op)
        rule = self.derivative(op)
        arrays, in_dtypes, resolved, outs = prevalidate(spec, inputs, attrs)
        wide = [x.astype(np.float64) if dt.is_float(d) else x for x, d in zip(arrays, in_dtypes)]
        return rule, wide, resolved, outs, differentiable_arrays(spec, len(arrays))

    def run_vjp(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None,
                cotangents: Sequence[np.ndarray | None]) -> Grads:
        """Jᵀu: one float64 cotangent per input (None for a non-differentiable input, or where
        the case's attributes leave an input without a derivative), from one cotangent per output
        (None for a non-floating output)."""
        rule, xs, attrs, outs, diff = self._derivative_call(op, inputs, attrs)
        where = f"{self.name} vjp rule for {op!r}"
        if len(cotangents) != len(outs):
            raise SpecError(f"{where}: {len(cotangents)} cotangent(s) for {len(outs)} output(s)")
        cots: Grads = []
        for k, (c, (shape, dtype)) in enumerate(zip(cotangents, outs)):
            if (c is None) == dt.is_float(dtype):
                raise SpecError(f"{where}: output {k} ({dtype}) needs "
                                + ("a cotangent" if dt.is_float(dtype) else "None"))
            if c is not None and tuple(np.shape(c)) != tuple(shape):
                raise SpecError(f"{where}: cotangent {k} has shape {np.shape(c)}, output {tuple(shape)}")
            cots.append(None if c is None else np.asarray(c, np.float64))
        with np.errstate(all="ignore"):
            res = list(rule.vjp(xs, attrs, cots))
        return _check_grads(where, "input", res, [x.shape for x in xs], diff)

    def run_jvp(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None,
                tangents: Sequence[np.ndarray | None]) -> Grads:
        """J·v: one float64 tangent per output (None for a non-floating output), from one tangent
        per input (None exactly for the non-differentiable inputs)."""
        rule, xs, attrs, outs, diff = self._derivative_call(op, inputs, attrs)
        where = f"{self.name} jvp rule for {op!r}"
        if len(tangents) != len(xs):
            raise SpecError(f"{where}: {len(tangents)} tangent(s) for {len(xs)} input(s)")
        tans: Grads = []
        for k, (t, x, d) in enumerate(zip(tangents, xs, diff)):
            if (t is None) == d:
                raise SpecError(f"{where}: input {k} needs " + ("a tangent" if d else "None"))
            if t is not None and np.shape(t) != x.shape:
                raise SpecError(f"{where}: tangent {k} has shape {np.shape(t)}, input {x.shape}")
            tans.append(None if t is None else np.asarray(t, np.float64))
        with np.errstate(all="ignore"):
            res = list(rule.jvp(xs, attrs, tans))
        return _check_grads(where, "output", res, [s for s, _ in outs],
                            [dt.is_float(d) for _, d in outs], exact_none=True)

    def smooth_radius(self, op: str, inputs: Sequence[np.ndarray],
                      attrs: Mapping[str, Any] | None) -> Grads:
        """Per input, the per-element radius of the box on which ``op`` is smooth at this point
        (DerivativeRule.radius; None: unbounded, or a non-differentiable input)."""
        rule, xs, attrs, _, diff = self._derivative_call(op, inputs, attrs)
        if rule.radius is None:
            return [None] * len(xs)
        with np.errstate(all="ignore"):
            res = list(rule.radius(xs, attrs))
        return _check_grads(f"{self.name} radius of {op!r}", "input", res, [x.shape for x in xs], diff)

    def rule_condition(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None) -> float:
        """The amplification of rounding in ``op``'s rules at this point (DerivativeRule.condition;
        1 where the rule declares none)."""
        rule, xs, attrs, _, _ = self._derivative_call(op, inputs, attrs)
        if rule.condition is None:
            return 1.0
        with np.errstate(all="ignore"):
            return max(1.0, float(rule.condition(xs, attrs)))

    def run_hvp(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None,
                cotangents: Sequence[np.ndarray | None], tangents: Sequence[np.ndarray | None]) -> Grads:
        """(d/de Jᵀ(x + e v)) u: one float64 result per input (None for a non-differentiable
        one), from the VJP's cotangents and one tangent per input (None exactly for the
        non-differentiable inputs). UnsupportedError where the op has no HVP rule."""
        rule, xs, attrs, outs, diff = self._derivative_call(op, inputs, attrs)
        if rule.hvp is None:
            raise UnsupportedError(f"{self.name} has no reference Hessian-vector product for {op!r}")
        where = f"{self.name} hvp rule for {op!r}"
        cots = [None if c is None else np.asarray(c, np.float64) for c in cotangents]
        tans = [None if t is None else np.asarray(t, np.float64) for t in tangents]
        if len(cots) != len(outs) or len(tans) != len(xs):
            raise SpecError(f"{where}: {len(cots)} cotangent(s) and {len(tans)} tangent(s) for "
                            f"{len(outs)} output(s) and {len(xs)} input(s)")
        with np.errstate(all="ignore"):
            res = list(rule.hvp(xs, attrs, cots, tans))
        return _check_grads(where, "input", res, [x.shape for x in xs], diff)

    def run_derivative(self, op: str, kind: str, inputs: Sequence[np.ndarray],
                       attrs: Mapping[str, Any] | None, cotangents: Sequence[np.ndarray | None],
                       tangents: Sequence[np.ndarray | None], device: str = "cpu",
                       mode: str | None = None) -> Grads:
        """One derivative of ``op`` at ``inputs``: vjp (from ``cotangents``: one result per
        input), jvp (from ``tangents``: one per output) or hvp (both: one per input). The base
        class evaluates the reference rules (DerivativeRule) in float64; a backend under test
        overrides it with its own transforms (MlxBackend)."""
        if kind == "vjp":
            return self.run_vjp(op, inputs, attrs, cotangents)
        if kind == "jvp":
            return self.run_jvp(op, inputs, attrs, tangents)
        if kind == "hvp":
            return self.run_hvp(op, inputs, attrs, cotangents, tangents)
        raise SpecError(f"{self.name}: unknown derivative {kind!r} (vjp, jvp, hvp)")

    def run_magnitude(self, op: str, kind: str, inputs: Sequence[np.ndarray],
                      attrs: Mapping[str, Any] | None, seeds: Sequence[np.ndarray | None]
                      ) -> tuple[Grads, int]:
        """The scale of ``kind``'s (vjp, jvp, hvp) rounding error at this point and the most
        terms one result accumulates (DerivativeRule.magnitude). Without a declared one: the
        dense Jacobian from one JVP per differentiable input element (vjp and jvp only, up to
        :data:`DENSE_MAX` elements), exact; UnsupportedError otherwise. ``seeds``: the
        cotangents (vjp), the tangents (jvp), or the cotangents then the tangents (hvp)."""
        rule, xs, res_attrs, outs, diff = self._derivative_call(op, inputs, attrs)
        seeds = [None if s is None else np.asarray(s, np.float64) for s in seeds]
        declared = rule.hvp_magnitude if kind == "hvp" else rule.magnitude
        if declared is not None:
            with np.errstate(all="ignore"):
                if kind == "hvp":
                    n_out = len(outs)
                    mags, terms = declared(xs, res_attrs, seeds[:n_out], seeds[n_out:])
                else:
                    mags, terms = declared(xs, res_attrs, kind, seeds)
            shapes = [x.shape for x in xs] if kind in ("vjp", "hvp") else [s for s, _ in outs]
            allowed = diff if kind in ("vjp", "hvp") else [dt.is_float(d) for _, d in outs]
            return _check_grads(f"{self.name} magnitude of {op!r}", "result", list(mags), shapes,
                                allowed), max(1, int(terms))
        n = sum(x.size for x, d in zip(xs, diff) if d)
        if kind == "hvp" or n > DENSE_MAX:
            raise UnsupportedError(f"{self.name}: {op!r} declares no derivative magnitude and the "
                                   f"dense Jacobian is not available for {kind} at {n} input elements")
        return dense_magnitude(self, op, list(inputs), attrs, kind, seeds, xs, diff, outs)

    def undefined_positions(self, op: str, kind: str, inputs: Sequence[np.ndarray],
                            attrs: Mapping[str, Any] | None) -> list[np.ndarray | None] | None:
        """Where ``kind``'s results are undefined by the spec (DerivativeRule.undefined), one
        mask or None per result; None where the op declares none."""
        rule, xs, res_attrs, _, _ = self._derivative_call(op, inputs, attrs)
        if rule.undefined is None:
            return None
        return list(rule.undefined(xs, res_attrs, kind))

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

    def worker_env(self) -> dict[str, str]:
        """Environment variables the processes that run this backend's kernels start with (the
        runner's workers; an in-process run sets them for its duration). None by default.
        :data:`PRELOAD_ENV` among them names shared libraries a worker loads into its global
        symbol scope before anything else."""
        return {}

    def warm_up(self, devices: Iterable[str]) -> None:
        """Make this process ready to run cases on ``devices`` (a device's start-up, the first
        use's costs): a runner's worker calls it before it reports ready, so that a spare worker
        takes a crashed one's place at once. Nothing by default."""

    def variant_env(self, variant: str) -> dict[str, str]:
        """Environment a worker process needs for ``variant``, set before the backend loads."""
        return {}

    # -- running ---------------------------------------------------------------------------------
    def run(self, op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None = None,
            device: str = "cpu", mode: str | None = None, *, force: bool = False,
            layout: Sequence[str] = ()) -> list[np.ndarray]:
        """Run ``op`` once on numpy inputs; numpy outputs in the dtypes the registry declares.
        ``force`` runs even a dtype the kernel does not claim (the declaration check uses it).
        ``layout``: how each input lies in memory (layouts.LAYOUTS, "" contiguous; matrix.
        case_layouts), for a backend whose ``layouts`` is "views"; the inputs are the logical
        values either way. A backend that cannot take layouts raises UnsupportedError."""
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
        views = [lay for lay in layout if lay]
        if views and not self.layouts:
            raise UnsupportedError(f"{self.name} takes its inputs contiguous only, not in layout "
                                   f"{'+'.join(sorted(set(views)))}")
        if views and self.layouts == "views":
            if len(layout) != len(arrays):
                raise SpecError(f"{self.name}: {len(layout)} layout(s) for {len(arrays)} input(s)")
            return self._execute(entry, spec, arrays, in_dtypes, attrs, outs, device, mode, layout=list(layout))
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


def _check_grads(where: str, what: str, res: list[Any], shapes: Sequence[tuple[int, ...]],
                 allowed: Sequence[bool], exact_none: bool = False) -> Grads:
    """A rule's results: one per input (output), of its shape, as float64; None where ``allowed``
    is false (and, with ``exact_none``, only there)."""
    if len(res) != len(shapes):
        raise KernelContractError(f"{where}: returned {len(res)} result(s) for {len(shapes)} {what}(s)")
    out: Grads = []
    for k, (r, shape, ok) in enumerate(zip(res, shapes, allowed)):
        if r is None:
            if ok and exact_none:
                raise KernelContractError(f"{where}: returned None for floating {what} {k}")
            out.append(None)
            continue
        if not ok:
            raise KernelContractError(f"{where}: returned a value for {what} {k}, which has no derivative")
        r = np.asarray(r, np.float64)
        if r.shape != tuple(shape):
            raise KernelContractError(f"{where}: {what} {k} has shape {r.shape}, expected {tuple(shape)}")
        out.append(r)
    return out


# The dense Jacobian's limit (Backend.run_magnitude): one JVP per input element.
DENSE_MAX = 2048


def dense_magnitude(backend: Backend, op: str, inputs: list[np.ndarray], attrs: Mapping[str, Any] | None,
                    kind: str, seeds: Grads, xs: list[np.ndarray], diff: list[bool],
                    outs: list[OutSpec]) -> tuple[Grads, int]:
    """|J|ᵀ|u| (vjp: per input) or |J||v| (jvp: per output) from J's columns, one JVP of the
    reference rule per differentiable input element; ``terms``: the most nonzeros of J in one
    column (vjp) or row (jvp)."""
    floats = [dt.is_float(d) for _, d in outs]
    zero = [np.zeros(x.shape) if d else None for x, d in zip(xs, diff)]
    acc: Grads = [np.zeros(x.shape) if d else None for x, d in zip(xs, diff)] if kind == "vjp" else \
        [np.zeros(s) if f else None for (s, _), f in zip(outs, floats)]
    nnz: list[np.ndarray | None] = [None if a is None else np.zeros(a.shape, np.int64) for a in acc]
    for k, (x, d) in enumerate(zip(xs, diff)):
        if not d:
            continue
        for i in range(x.size):
            tans = [None if z is None else z.copy() for z in zero]
            tans[k].flat[i] = 1.0
            col = backend.run_jvp(op, inputs, attrs, tans)  # J[:, (k, i)] per output
            if kind == "vjp":
                s = sum(float(np.sum(np.abs(c) * np.abs(u))) for c, u in zip(col, seeds)
                        if c is not None and u is not None)
                acc[k].flat[i] = s
                nnz[k].flat[i] = sum(int(np.count_nonzero(c)) for c in col if c is not None)
            else:
                v = abs(float(seeds[k].flat[i]))
                for j, c in enumerate(col):
                    if c is not None:
                        acc[j] += np.abs(c) * v
                        nnz[j] += (c != 0)
    terms = max((int(m.max()) for m in nnz if m is not None and m.size), default=1)
    return acc, max(1, terms)


def differentiable_arrays(spec: OpSpec, n: int) -> list[bool]:
    """Whether each of a call's ``n`` input arrays is differentiable (a variadic last input's
    arrays share its declaration)."""
    return [spec.input_differentiable(spec.inputs[min(k, len(spec.inputs) - 1)]) for k in range(n)]
