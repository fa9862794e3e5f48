"""``rlx-conformance validate OP --kernel MODULE:FUNC``: is a contributed kernel right, where is it
wrong, and how fast is it.

One run, in this order:

1. **Load** FUNC (an importable module, or a .py file by path) and register it for OP on the
   backend *for this run only* (``replace=True``; the built-in kernel is kept aside and restored
   afterwards), with the built-in kernel's dtype claims unless FUNC has an ``rlx_dtypes``
   attribute (a list of dtypes, or a dict device -> dtypes). Registration checks the signature
   against the registry. Any of this failing is a usage error (exit 2).
2. **Matrix**: OP's whole generated case matrix for (backend, device, mode), through the same
   isolated runner as ``run`` (a crash or a hang is that case's ``crash``/``timeout``; the
   kernel call's limit is scaled from the reference's time with a floor, and after
   ``max_failures`` consecutive crashes or timeouts the kernel's remaining cases are ``not-run``:
   rlx_conformance/run/runner.py); every worker registers the kernel at start (``init`` hook
   :func:`install_from_env`). Broken call
   conventions (wrong output count, shape or dtype, non-array outputs, inputs written in place)
   are ``contract`` outcomes. Failures inside a known divergence of the built-in kernel
   (cases/known_divergences.toml) count as ``xfail`` only where the built-in kernel fails the
   same case too, the same way and no worse (re-run to check: :func:`shares_failure`);
   ``--strict`` excuses nothing.
3. **Error-input parity**: each of the op's declared error inputs goes through the harness's
   pre-validation (:func:`rlx_conformance.backends.base.prevalidate`) and, separately, to the kernel alone
   (:meth:`Backend.run_unchecked`, isolated); an error input that neither rejects is a failure.
4. **Speed**: on a sample of passing cases (largest first, spread over dtypes), the median time
   of repeated calls of the contributed kernel, the built-in kernel and the CPU reference, on
   the same inputs in one worker process, after one warm-up call (so compiled mode's tracing
   and JIT compile are not counted). Time is Backend.run's, conversions in and out included
   (the same for both MLX kernels), the input-mutation check excluded.
   With ``--grad`` the matrix holds OP's derivative cases too (vjp and jvp, hvp where the op
   declares second order; generate.matrix), run through run/derivatives.py as the matrix runs
   them: MLX's ``mx.vjp``/``mx.jvp`` through the contributed kernel, which calls the kernel's
   own VJP/JVP when it is an ``mx.custom_function`` and differentiates through it otherwise.
   A wrong derivative is reported by which input's (vjp, hvp) or output's (jvp) derivative is
   wrong (:func:`derivative_label`) and where, with the built-in kernel's derivative beside.
5. **Fuzz** (``--fuzz N``): hypothesis explores N more examples (:mod:`rlx_conformance.generate.fuzz`);
   a failure is shrunk to a minimal example.
6. **Report**: ``results.json`` (every case), ``validate.json`` (the verdict), and a repro
   bundle per failure (rlx_conformance/run/bundle.py: under ``repro/``, the fuzz failure's under
   ``fuzz/``).

Exit status: 0 only if every case passes (xfail shared with the built-in kernel and skip
allowed), every error input is rejected and fuzzing found nothing; 1 otherwise.
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import importlib
import importlib.util
import json
import math
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import prevalidate
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import (
    KernelContractError,
    RlxError,
    SpecError,
    UnsupportedError,
)
from rlx_conformance.generate.fuzz import (
    Verdict,
    ci_derandomize,
    explore,
    hypothesis_modules,
)
from rlx_conformance.generate.matrix import (
    Case,
    Target,
    fmt_value,
    make_inputs,
    make_seeds,
)
from rlx_conformance.judge.divergences import failure_kinds, known_divergence
from rlx_conformance.judge.stability import classify
from rlx_conformance.ops import get_op
from rlx_conformance.run import bundle, derivatives, worker
from rlx_conformance.run.execute import element_text, judge, mismatch
from rlx_conformance.run.runner import DEFAULT_MAX_FAILURES, NOT_RUN, kernel_limit
from rlx_conformance.run.session import (
    backend_targets,
    build_cases,
    default_report_dir,
    execute,
)

ENV = "RLX_CONFORMANCE_VALIDATE"  # JSON handed to worker processes: which kernel, for which op
INIT = "rlx_conformance.run.validate:install_from_env"
SCHEMA = "rlx-conformance/validate/v1"


# -- loading and registering the kernel ----------------------------------------------------------
@dataclass(frozen=True)
class KernelRef:
    """Where a contributed kernel lives: ``spec`` as the user gave it (also its origin), and
    either an importable ``module`` (the current directory goes on sys.path, as with python -m)
    or an absolute ``path`` to a .py file (its directory goes on sys.path, as with python FILE)."""

    spec: str
    func: str
    module: str | None = None
    path: str | None = None
    sys_path: tuple[str, ...] = ()

    @property
    def origin(self) -> str:
        return self.spec


def parse_kernel(spec: str) -> KernelRef:
    """``MODULE:FUNC`` or ``path/to/file.py:FUNC`` → KernelRef; RlxError (exit 2) when malformed."""
    target, sep, func = spec.rpartition(":")
    if not sep or not target or not func:
        raise RlxError(f"--kernel wants MODULE:FUNC or path/to/file.py:FUNC, got {spec!r}")
    if not func.isidentifier():
        raise RlxError(f"--kernel {spec!r}: {func!r} is not a function name")
    if target.endswith(".py") or "/" in target or os.sep in target:
        p = Path(target).expanduser()
        if not p.is_file():
            raise RlxError(f"--kernel {spec!r}: no file {target}")
        # Its directory goes on sys.path, as for ``python file.py``: sibling helper modules import.
        return KernelRef(spec, func, path=str(p.resolve()), sys_path=(str(p.resolve().parent),))
    if not all(part.isidentifier() for part in target.split(".")):
        raise RlxError(f"--kernel {spec!r}: {target!r} is neither a module name nor a .py path")
    return KernelRef(spec, func, module=target, sys_path=(os.getcwd(),))


def load_function(ref: KernelRef) -> Callable[..., Any]:
    """Import the kernel's module (or execute its file) and return FUNC; RlxError on any failure."""
    for p in ref.sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    where = ref.path or ref.module
    try:
        if ref.path is not None:
            # Named inside this package on purpose: rlx_conformance.run.portable inlines project code
            # (not library imports) into a repro bundle's repro.py, so the contributed kernel's
            # source travels with its bundles.
            stem = "".join(c if c.isalnum() else "_" for c in Path(ref.path).stem)
            name = f"rlx_conformance.contributed_{stem}_{hashlib.sha256(ref.path.encode()).hexdigest()[:8]}"
            mod = sys.modules.get(name)
            if mod is None:
                spec = importlib.util.spec_from_file_location(name, ref.path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot import {ref.path}")
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                try:
                    spec.loader.exec_module(mod)
                except BaseException:
                    del sys.modules[name]
                    raise
        else:
            mod = importlib.import_module(ref.module)  # type: ignore[arg-type]
    except (Exception, SystemExit) as e:  # noqa: BLE001 — any import failure is a usage error
        raise RlxError(f"cannot load kernel module {where}: {type(e).__name__}: {e}") from None
    fn = getattr(mod, ref.func, None)
    if fn is None:
        raise RlxError(f"kernel module {where} has no function {ref.func!r}")
    if not callable(fn):
        raise RlxError(f"{where}:{ref.func} is a {type(fn).__name__}, not a function")
    return fn


_SAVED: dict[tuple[str, str], Any] = {}  # (backend, op) -> the built-in KernelEntry (or None)


def install(ref: KernelRef, op: str, backend: str):
    """Register the contributed kernel for ``op`` in this process, replacing (and keeping aside)
    the built-in one. Returns the new KernelEntry. RegistrationError when the signature does not
    fit the spec."""
    b = get_backend(backend)
    fn = load_function(ref)
    old = b.kernels.get(op)
    key = (backend, op)
    if key not in _SAVED:
        _SAVED[key] = old
    builtin = _SAVED[key]
    claims = getattr(fn, "rlx_dtypes", None)
    kw: dict[str, Any] = {}
    if isinstance(claims, Mapping):
        kw["devices"] = {d: tuple(v) for d, v in claims.items()}
        kw["dtypes"] = ()
    elif claims is not None:
        kw["dtypes"] = tuple(claims)
    elif builtin is not None:
        kw["devices"] = dict(builtin.dtypes)
    options = dict(builtin.options) if builtin is not None else {}
    options["check_inputs"] = True
    return b.register(op, fn, native=True, origin=ref.origin, replace=True,
                      note="contributed kernel under validation", **kw, **options)


def uninstall(op: str, backend: str) -> None:
    """Put the built-in kernel back (this process)."""
    key = (backend, op)
    if key not in _SAVED:
        return
    b = get_backend(backend)
    old = _SAVED.pop(key)
    if old is None:
        b.kernels.pop(op, None)
    else:
        b.kernels[op] = old


def _config(ref: KernelRef, op: str, backend: str) -> dict[str, Any]:
    return {"kernel": asdict(ref), "op": op, "backend": backend}


def _install_config(cfg: Mapping[str, Any]) -> None:
    ref = KernelRef(**{k: tuple(v) if k == "sys_path" else v for k, v in cfg["kernel"].items()})
    install(ref, cfg["op"], cfg["backend"])


def install_from_env() -> None:
    """Runner init hook: register the kernel named by $RLX_CONFORMANCE_VALIDATE in this worker."""
    raw = os.environ.get(ENV)
    if not raw:
        raise RuntimeError(f"{INIT} needs ${ENV}")
    _install_config(json.loads(raw))


def builtin_entry(op: str, backend: str):
    return _SAVED.get((backend, op))


# -- an isolated worker for calls that are not matrix cases --------------------------------------
def _serve_request(cfg: dict[str, Any], req: tuple[str, dict[str, Any]], send: Callable[[Any], None]
                   ) -> tuple[str, Any]:
    """The service worker's task function (worker.serve applies it to each request, the kernel
    registered by its setup): the answer is ("ok", value) or ("raised", (exception type,
    message, contract?, spec or unsupported?))."""
    kind, payload = req
    try:
        return "ok", _SERVICES[kind](cfg, **payload)
    except Exception as e:  # noqa: BLE001 — the kernel's exception is the answer
        return "raised", (type(e).__name__, str(e), isinstance(e, KernelContractError),
                          isinstance(e, (SpecError, UnsupportedError)))


@contextmanager
def _kernel(cfg, which: str):
    """The backend with the contributed kernel registered, or (which="builtin") the built-in
    one for the duration."""
    b = get_backend(cfg["backend"])
    op = cfg["op"]
    contributed = b.kernels[op]
    if which == "builtin":
        builtin = builtin_entry(op, cfg["backend"])
        if builtin is None:
            raise UnsupportedError(f"{cfg['backend']} has no built-in kernel for {op!r}")
        b.kernels[op] = builtin
    try:
        yield b
    finally:
        b.kernels[op] = contributed


def _svc_run(cfg, inputs, attrs, device, mode, which="contributed", force=False):
    """Backend.run with the contributed kernel, or (which="builtin") the built-in one."""
    with _kernel(cfg, which) as b:
        return b.run(cfg["op"], inputs, attrs, device, mode, force=force)


def _svc_derivative(cfg, grad, inputs, attrs, cotangents, tangents, device, mode, which="contributed"):
    """Backend.run_derivative (``grad``: vjp, jvp, hvp) through the contributed or the built-in kernel."""
    with _kernel(cfg, which) as b:
        return b.run_derivative(cfg["op"], grad, inputs, attrs, cotangents, tangents, device, mode)


def _svc_unchecked(cfg, inputs, attrs, device, mode):
    """The kernel alone, without the harness's pre-validation: the shapes and dtypes it returns."""
    outs = get_backend(cfg["backend"]).run_unchecked(cfg["op"], inputs, attrs, device, mode)
    return [f"{o.dtype}{list(o.shape)}" for o in outs]


def _svc_time(cfg, inputs, attrs, device, mode, budget_s=0.1, max_reps=25):
    """Median seconds per call of the contributed kernel, the built-in one and the CPU reference
    (after one warm-up call each); None where it raised or does not exist."""
    b = get_backend(cfg["backend"])
    op = cfg["op"]
    contributed = b.kernels[op]
    builtin = builtin_entry(op, cfg["backend"])
    out: dict[str, float | None] = {}
    runs: dict[str, Callable[[list[np.ndarray]], Any]] = {
        "contributed": lambda xs: b.run(op, xs, attrs, device, mode),
        "reference": lambda xs: get_backend("cpu").run(op, xs, attrs),
    }
    if builtin is not None:
        runs["builtin"] = lambda xs: b.run(op, xs, attrs, device, mode)
    saved_opts = dict(contributed.options)
    contributed.options["check_inputs"] = False  # time the kernel, not the harness's check
    try:
        for which, call in runs.items():
            b.kernels[op] = builtin if which == "builtin" else contributed
            try:
                call([x.copy() for x in inputs])
                times: list[float] = []
                stop = time.perf_counter() + budget_s
                while len(times) < 3 or (len(times) < max_reps and time.perf_counter() < stop):
                    xs = [x.copy() for x in inputs]
                    t0 = time.perf_counter()
                    call(xs)
                    times.append(time.perf_counter() - t0)
                out[which] = statistics.median(times)
            except Exception:  # noqa: BLE001 — no time for a kernel that raises
                out[which] = None
    finally:
        b.kernels[op] = contributed
        contributed.options.clear()
        contributed.options.update(saved_opts)
    return out


_SERVICES = {"run": _svc_run, "derivative": _svc_derivative, "unchecked": _svc_unchecked, "time": _svc_time}


class Isolated:
    """One worker process with the contributed kernel registered, for error inputs, fuzz
    examples, bundle outputs and timing. A call that kills the worker answers ("crash", why),
    one that outlives ``timeout`` ("timeout", why), and one that raises a lost CUDA context's
    error (worker.poisoned) its answer; in each case the next call starts a fresh worker."""

    def __init__(self, cfg: dict[str, Any], timeout: float):
        self.cfg, self.timeout = cfg, timeout
        self._worker: worker.Worker | None = None
        self._ctx = worker.context()

    def _start(self) -> worker.Worker:
        return worker.start(self._ctx, functools.partial(_serve_request, self.cfg),
                            setup=functools.partial(_install_config, self.cfg),
                            hint="validate could not register the kernel")

    def call(self, kind: str, timeout: float | None = None, **payload: Any) -> tuple[str, Any]:
        """One request (``kind``: run, derivative, unchecked, time) answered in the worker: ("ok", value),
        ("raised", ...), or ("crash"/"timeout", why) when it killed the worker or outlived the
        limit."""
        if self._worker is None:
            self._worker = self._start()
        w = self._worker
        limit = self.timeout if timeout is None else timeout
        try:
            w.send((kind, payload))
            if w.conn.poll(limit):
                answer = w.conn.recv()[1]  # (DONE, the answer)
                if answer[0] == "raised" and worker.poisoned(answer[1][1]):
                    self.close()  # a lost CUDA context: no later call may inherit it
                return answer
            dead = not w.proc.is_alive()
        except (EOFError, OSError, BrokenPipeError):
            dead = True
        ended = w.end(hung=not dead)
        self._worker = None
        if dead:
            return "crash", f"worker process died ({ended})"
        return "timeout", f"no result within {limit:g} s; worker killed"

    def close(self) -> None:
        """Stop the worker (the next call starts a fresh one)."""
        if self._worker is not None:
            worker.stop([self._worker])
            self._worker = None


# -- repro bundles --------------------------------------------------------------------------------
def write_bundle(root: Path, case: Case, inputs: list[np.ndarray], expected: list[np.ndarray] | None,
                 actual: list[np.ndarray] | None, result: res.CaseResult, *, timeout: float | None = None,
                 judged: str | None = None, seeds: Any = None) -> Path:
    """The one place validate writes a repro bundle itself, through rlx_conformance.run.bundle's
    writer (inputs.npz, expected.npz, actual.npz, case.json, repro.py). The matrix's failures are
    bundled by the runner's workers (``execute(bundles=True)``); this writes the rest: failures
    that stopped being excused by a known divergence, and the shrunk fuzz failure. ``seeds``:
    a derivative case's (matrix.Seeds)."""
    arrays = {"inputs": inputs, "expected": expected, "actual": actual}
    if seeds is not None:
        arrays["seeds"] = seeds
    return bundle.write_bundle(case, result, root, arrays, timeout=timeout, judged=judged)


def rerun_command(r: res.CaseResult) -> str:
    grad = f"--grad {r.grad} " if getattr(r, "grad", "") else ""
    return (f"rlx-conformance validate {r.op} --kernel '{r.origin}' --device {r.device} --mode {r.mode} "
            f"{grad}--case '{r.id}'")


def derivative_label(op: str, grad: str, k: int) -> str:
    """Which derivative result ``k`` of a ``grad`` case is, in words with the registry's input
    names: vjp "d/d input 1 (b)", hvp "d/d input 0 (x) of the VJP (HVP)", jvp "JVP of output 0"."""
    if grad == "jvp":
        return f"JVP of output {k}"
    ins = get_op(op).inputs
    name = ins[min(k, len(ins) - 1)].name if ins else "?"
    if ins and ins[-1].variadic and k >= len(ins) - 1:
        name = f"{name}[{k - len(ins) + 1}]"
    return f"d/d input {k} ({name})" + (" of the VJP (HVP)" if grad == "hvp" else "")


def _label_derivatives(results: Sequence[res.CaseResult]) -> None:
    """A failing derivative case's mismatch names the wrong derivatives: ``derivatives`` (their
    labels, in order) and each listed position's ``of`` (:func:`derivative_label`)."""
    for r in results:
        m = r.mismatch
        if not r.grad or not m or not m.get("first"):
            continue
        key = "output" if r.grad == "jvp" else "input"
        for row in m["first"]:
            if key in row:
                row["of"] = derivative_label(r.op, r.grad, row[key])
        m["derivatives"] = list(dict.fromkeys(row["of"] for row in m["first"] if "of" in row))


# -- the verdict ----------------------------------------------------------------------------------
@dataclass
class ErrorProbe:
    description: str
    harness: str | None  # the pre-validation's message when it rejects, else None
    kernel: str  # "rejects: ...", "accepts: returned ...", "crash: ...", "timeout: ..."
    kernel_rejects: bool

    @property
    def ok(self) -> bool:
        return self.harness is not None or self.kernel_rejects

    @property
    def verdict(self) -> str:
        if self.harness is not None and self.kernel_rejects:
            return "rejected (harness and kernel)"
        if self.harness is not None:
            return "rejected (harness pre-validation)"
        if self.kernel_rejects:
            return "rejected (kernel)"
        return "ACCEPTED: the kernel returns garbage for an error input"

    def to_json(self) -> dict[str, Any]:
        return {"description": self.description, "harness": self.harness, "kernel": self.kernel,
                "kernel_rejects": self.kernel_rejects, "ok": self.ok, "verdict": self.verdict}


@dataclass
class Validation:
    op: str
    origin: str
    target: Target
    results: list[res.CaseResult] = field(default_factory=list)
    error_probes: list[ErrorProbe] = field(default_factory=list)
    speed: dict[str, Any] = field(default_factory=dict)
    fuzz: Any = None  # fuzz.FuzzReport
    fuzz_bundle: str | None = None
    bundles: int = 0
    report_dir: Path | None = None
    wall_s: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # wall seconds per stage
    notes: list[str] = field(default_factory=list)
    grads: tuple[str, ...] = ()  # the derivative kinds run besides the forward (--grad)
    # why the runner stopped the kernel's cases (consecutive crashes or timeouts); then the error
    # inputs, speed and fuzzing were skipped
    stopped: str | None = None

    @property
    def bad_cases(self) -> list[res.CaseResult]:
        return [r for r in self.results if r.outcome in res.RUN_FAILING]

    @property
    def exit_code(self) -> int:
        bad = bool(self.bad_cases) or any(not p.ok for p in self.error_probes)
        bad = bad or (self.fuzz is not None and self.fuzz.failure is not None)
        return 1 if bad else 0

    def counts(self, key: str) -> dict[str, Counter]:
        out: dict[str, Counter] = defaultdict(Counter)
        for r in self.results:
            out[getattr(r, key)][r.outcome] += 1
        return dict(out)

    def attr_counts(self) -> dict[str, dict[str, Counter]]:
        """Outcome counts per value of each attribute (``batch_dims`` -> {"0": ..., "1": ...}):
        a kernel wrong for one attribute value shows as that row failing and the others passing."""
        out: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
        empty = {a.name: a.empty for a in get_op(self.op).attrs}  # as the case ids read
        for r in self.results:
            for k, val in r.attrs.items():
                text = fmt_value(tuple(val) if isinstance(val, list) else val, empty.get(k, "none"))
                out[k][text][r.outcome] += 1
        return {k: dict(v) for k, v in out.items()}

    def worst(self, n: int = 5) -> list[res.CaseResult]:
        """Numeric failures first, then the excused ones (never mixed: an excused case with a huge
        error must not push the kernel's one real failure out of the list); within each, NaN/inf
        mismatches first (their ULP figures say nothing), then the largest error (ULP, relative,
        absolute)."""
        def key(r: res.CaseResult):
            return (r.outcome == "fail", bool(r.nonfinite_mismatches),
                    *(_num(v) for v in (r.max_ulp, r.max_rel_err, r.max_abs_err)))
        fails = [r for r in self.results if r.outcome == "fail" or
                 (r.outcome == "xfail" and (r.divergence or {}).get("was") == "fail")]
        return sorted(fails, key=key, reverse=True)[:n]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA, "op": self.op, "kernel": self.origin, "target": str(self.target),
            "exit_code": self.exit_code, "wall_s": round(self.wall_s, 3), "stage_wall_s": self.timings,
            "summary": res.summarize(self.results),
            "by_dtype": {k: dict(v) for k, v in self.counts("dtype").items()},
            "by_family": {k: dict(v) for k, v in self.counts("family").items()},
            "grads": list(self.grads),
            "by_grad": {k or "forward": dict(v) for k, v in self.counts("grad").items()},
            "by_attr": {k: {val: dict(c) for val, c in vals.items()} for k, vals in self.attr_counts().items()},
            "worst": [{"id": r.id, "grad": r.grad, "outcome": r.outcome, "max_abs_err": r.max_abs_err,
                       "max_rel_err": r.max_rel_err, "max_ulp": r.max_ulp,
                       "nonfinite_mismatches": r.nonfinite_mismatches, "mismatch": r.mismatch,
                       "message": r.message, "rerun": rerun_command(r)} for r in self.worst(10)],
            "bad": [{"id": r.id, "grad": r.grad, "outcome": r.outcome, "message": r.message, "repro": r.repro,
                     "derivatives": (r.mismatch or {}).get("derivatives", []),
                     "rerun": rerun_command(r)} for r in self.bad_cases],
            "error_inputs": [p.to_json() for p in self.error_probes],
            "speed": self.speed,
            "fuzz": None if self.fuzz is None else self.fuzz.to_json() | {"bundle": self.fuzz_bundle},
            "bundles": self.bundles, "notes": self.notes, "stopped": self.stopped,
        }


def _num(v: Any) -> float:
    if v is None:
        return -1.0
    v = float(v)
    return math.inf if math.isnan(v) else v


# -- the run --------------------------------------------------------------------------------------
def validate(op: str, kernel: str, *, backend: str = "mlx", device: str = "cpu", mode: str | None = None,
             dtypes: list[str] | None = None, case_ids: list[str] | None = None,
             report_dir: Path | None = None, workers: int | None = None,
             timeout: float = 60.0, fuzz: int = 0, derandomize: bool = False, strict: bool = False,
             speed_cases: int = 8, on_result: Callable[[res.CaseResult], None] | None = None,
             on_stage: Callable[[str], None] | None = None, grads: Sequence[str] = (),
             timeout_floor: float | None = None, max_failures: int = DEFAULT_MAX_FAILURES) -> Validation:
    """Validate ``kernel`` for ``op``; see the module docstring. ``grads``: the derivative kinds
    (matrix.GRAD_KINDS) whose cases run besides the forward ones (those the op declares).
    ``timeout_floor``, ``max_failures``: the runner's (--timeout-floor, --max-consecutive-failures).
    Raises RlxError for usage errors."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    current: list[Any] = ["setup", t0]  # setup: loading backends and the kernel, building cases

    def stage(name: str) -> None:  # wall time per stage goes into validate.json
        now = time.perf_counter()
        if current[0] is not None:
            timings[current[0]] = round(now - current[1], 3)
        current[:] = [name.split(":")[0], now]
        if on_stage:
            on_stage(name)

    spec = get_op(op)  # UnknownOpError (exit 2) with suggestions
    if backend == "cpu":
        raise RlxError("the cpu backend is the reference every kernel is judged against; "
                       "validate a kernel for another backend (--backend mlx)")
    if fuzz < 0 or speed_cases < 0 or (workers is not None and workers < 0) or max_failures < 0 \
            or timeout <= 0 or (timeout_floor is not None and timeout_floor <= 0):
        raise RlxError("--fuzz, --speed-cases, --workers and --max-consecutive-failures want counts "
                       ">= 0, --timeout and --timeout-floor seconds > 0")
    if fuzz:
        hypothesis_modules()  # a clear one-line error now rather than after the matrix
    if grads and not spec.derivative_kinds():
        raise RlxError(f"--grad: {spec.name} has no derivative ({spec.not_differentiable or 'not differentiable'})")
    (target,) = backend_targets(backend, device, mode)
    b = get_backend(backend)
    if device not in b.devices():
        raise RlxError(f"{backend} has no usable {device} device on this machine")
    ref = parse_kernel(kernel)
    cfg = _config(ref, spec.name, backend)
    entry = install(ref, spec.name, backend)  # RegistrationError (exit 2) for a bad signature
    try:
        cases = build_cases([target], ops=[spec.name], dtypes=dtypes, grads=tuple(grads))
        cases = [c for c in cases if c.op == spec.name]
        if case_ids:
            wanted = {i.strip() for i in case_ids}
            unknown = wanted - {c.id for c in cases}
            if unknown:
                raise RlxError(f"no case {min(unknown)!r} in {spec.name}'s matrix on {target}")
            cases = [c for c in cases if c.id in wanted]
        if not cases:
            raise RlxError(f"no cases for {spec.name} on {target}" + (f" with dtypes {', '.join(dtypes)}" if dtypes else ""))
        if not report_dir:
            report_dir = default_report_dir(f"validate-{bundle.bundle_name(spec.name)}")
        report_dir = Path(report_dir)
        v = Validation(spec.name, entry.origin, target, report_dir=report_dir,
                       grads=tuple(g for g in grads if g in spec.derivative_kinds()))
        stage(f"matrix: {len(cases)} cases of {spec.name} on {target}")
        # Every worker registers the kernel at start (init hook); --workers 0 runs in this
        # process, where it is registered already.
        run = execute(cases, report_dir, workers=workers, timeout=timeout,
                      init=None if workers == 0 else INIT, env={ENV: json.dumps(cfg)},
                      on_result=on_result, strict_divergences=False, bundles=True,
                      meta={"validate": {"op": spec.name, "kernel": entry.origin}},
                      timeout_floor=timeout_floor, max_failures=max_failures)
        v.results = run.results
        for r in v.results:  # a crash or timeout is recorded by the parent, which ran no kernel
            r.origin = entry.origin
        by_id = {c.id: c for c in cases}
        _recheck_divergences(v, by_id, strict, workers, timeout, stage)
        _label_derivatives(v.results)

        svc = Isolated(cfg, timeout)
        try:
            if any(not r.repro for r in v.bad_cases):
                stage("repro bundles")
                _bundles(v, by_id, svc, report_dir, timeout)
            if any(r.mismatch for r in v.bad_cases):
                stage("built-in values")
                _beside_builtin(v, by_id, svc)
            v.bundles = sum(1 for r in v.bad_cases if r.repro)
            res.write_results(run.path, run.meta, v.results, classify(v.results))
            stopped = next((r.message for r in v.results if r.outcome == NOT_RUN), None)
            if stopped:
                # a kernel that crashes or hangs on everything would only do it again, each time
                # at the cost of a limit: the verdict is already FAIL, the fix comes first
                v.stopped = stopped.removeprefix("not run: ")
                speed_cases = fuzz = 0
            else:
                stage("error inputs")
                v.error_probes = _error_probes(spec, svc, target, timeout_floor)
            svc.close()  # a kernel fed an invalid index may have corrupted its heap: a fresh worker
            if speed_cases:
                stage("speed")
                v.speed = _speed(v, by_id, svc, speed_cases, timeout)
            if fuzz:
                if v.grads:
                    v.notes.append("--fuzz explores the forward only; the derivatives are checked on the matrix")
                stage(f"fuzz: {fuzz} examples")
                _fuzz(v, spec, svc, target, fuzz, ci_derandomize(derandomize), strict, report_dir, dtypes)
        finally:
            svc.close()
        stage("done")
        v.wall_s = time.perf_counter() - t0
        v.timings = timings
        res.atomic_write_text(report_dir / "validate.json",
                              json.dumps(res._jsonable(v.to_json()), indent=1, allow_nan=False) + "\n")
        return v
    finally:
        uninstall(spec.name, backend)


# How much worse than the built-in kernel a contributed kernel may be on a case both fail and
# still share its excuse: a port that inherits the built-in's numerical flaw (the same
# float32-grade float64 exp, the same sequential sum) errs by the same order of magnitude, and a
# different evaluation order of the same flaw moves its worst error by a small factor; an error
# larger by more than 2x is a flaw of its own. (Measured: the float64 softmax and exp entries'
# built-in errors vary by less than 1.6x across the ulp, relative and absolute measures between
# cases of one shape family.)
SHARED_FACTOR = 2.0


def shares_failure(mine: res.CaseResult, builtin: res.CaseResult) -> str | None:
    """None if the contributed kernel's failure ``mine`` is the built-in kernel's ``builtin``
    failure of the same case, no worse: the same kinds (an error is not a crash; a non-finite
    mismatch is not a value one), no more non-finite mismatches, and each measured error within
    :data:`SHARED_FACTOR` of the built-in's. Else why not, with both kernels' figures."""
    if builtin.outcome != "xfail":
        return "the built-in kernel passes this case"
    was_b = (builtin.divergence or {}).get("was", builtin.outcome)
    was_m = (mine.divergence or {}).get("was", mine.outcome)
    km = failure_kinds(SimpleNamespace(**{**asdict(mine), "outcome": was_m}))
    kb = failure_kinds(SimpleNamespace(**{**asdict(builtin), "outcome": was_b}))
    if not km <= kb:
        return (f"the built-in kernel fails it differently: {', '.join(sorted(km - kb))} here, "
                f"{', '.join(sorted(kb)) or 'nothing'} there")
    nm, nb = mine.nonfinite_mismatches or 0, builtin.nonfinite_mismatches or 0
    if nm > nb:
        return f"{nm} NaN/inf mismatches here, {nb} in the built-in kernel's output"
    worse = [f"{k} {_num(getattr(mine, k)):.3g} (built-in {_num(getattr(builtin, k)):.3g})"
             for k in ("max_ulp", "max_rel_err", "max_abs_err")
             if getattr(mine, k) is not None and getattr(builtin, k) is not None
             and _num(getattr(mine, k)) > SHARED_FACTOR * _num(getattr(builtin, k))]
    if worse:
        return f"more than {SHARED_FACTOR:g}x the built-in kernel's error: " + ", ".join(worse)
    return None


def _recheck_divergences(v: Validation, by_id: dict[str, Case], strict: bool, workers, timeout, stage) -> None:
    """Known divergences describe the built-in kernel. A contributed kernel's failure inside one
    stays xfail only where the built-in kernel fails that case too, the same way and no worse
    (:func:`shares_failure`); otherwise (and always with --strict) it is reported as what it
    was, with the built-in kernel's figures beside it."""
    xf = [r for r in v.results if r.outcome == "xfail" and r.divergence and "was" in r.divergence]
    if not xf:
        return
    builtin: dict[str, res.CaseResult] = {}
    if not strict and builtin_entry(v.op, v.target.backend) is not None:
        stage(f"known divergences: {len(xf)} case(s) against the built-in kernel")
        b = get_backend(v.target.backend)
        contributed = b.kernels[v.op]
        b.kernels[v.op] = builtin_entry(v.op, v.target.backend)  # for --workers 0 (in-process)
        try:
            again = execute([by_id[r.id] for r in xf], None, workers=workers, timeout=timeout,
                            strict_divergences=False)
        finally:
            b.kernels[v.op] = contributed
        builtin = {r.id: r for r in again.results}
    for r in xf:
        d = r.divergence
        why = "--strict" if strict else (shares_failure(r, builtin[r.id]) if r.id in builtin else
                                         "there is no built-in kernel to share it")
        if why is None:
            r.message += " [the built-in kernel fails this case too, the same way and no worse]"
            continue
        was = d["was"]
        prefix = f"known divergence {d['entry']} ({d['category']}: {d['reason']}) — was {was}: "
        msg = r.message.removeprefix(prefix)
        r.outcome, r.message = was, f"{msg} [inside known divergence {d['entry']}, but {why}]"
        r.divergence = {**d, "excused": False}


def _error_probes(spec, svc: Isolated, target: Target, floor: float | None = None) -> list[ErrorProbe]:
    """Each declared error input through the harness's pre-validation and, separately, to the
    kernel alone in the isolated worker, under the kernel call's limit of the matrix (runner's
    kernel_limit: an error input is small, so its floor)."""
    if spec.error_inputs is None:
        return []
    out = []
    limit = kernel_limit(target, 0.0, svc.timeout, floor, first_compile=True)
    for desc, inputs, attrs in spec.error_inputs():
        try:
            prevalidate(spec, inputs, attrs)
            harness = None
        except SpecError as e:
            harness = str(e)
        status, value = svc.call("unchecked", timeout=limit, inputs=[np.asarray(x) for x in inputs],
                                 attrs=dict(attrs), device=target.device, mode=target.mode)
        if status == "ok":
            kernel, rejects = f"accepts: returned {', '.join(value)}", False
            # MLX does no bounds checking: a kernel that took an out-of-range index may have
            # written past a buffer. Nothing after it may run in that process.
            svc.close()
        elif status == "raised":
            kernel, rejects = f"rejects: {value[0]}: {value[1].splitlines()[0] if value[1] else ''}", True
        else:  # a crash or hang on an error input rejects nothing
            kernel, rejects = f"{status}: {value}", False
        out.append(ErrorProbe(desc, harness, kernel, rejects))
    return out


def _bundles(v: Validation, by_id: dict[str, Case], svc: Isolated, report_dir: Path, timeout: float) -> None:
    """Bundles of the failures the runner did not bundle: those it reported xfail (a known
    divergence) that the built-in kernel turned out not to share. Inputs and reference are
    regenerated from the id; the kernel's outputs come from a rerun in the isolated worker."""
    for r in v.bad_cases:
        case = by_id.get(r.id)
        if case is None or r.repro or r.outcome == NOT_RUN:  # a case not run has nothing to repro
            continue
        arrays = bundle.regenerate(case)
        expected = arrays["expected"] if not isinstance(arrays["expected"], Exception) else None
        actual = None
        if r.outcome == "fail":
            status, value = _call_case(svc, case, arrays["inputs"], arrays.get("seeds"))
            actual = value if status == "ok" else None
        path = write_bundle(report_dir / bundle.DIRNAME, case, arrays["inputs"], expected, actual, r,
                            timeout=timeout, judged="fail" if actual is not None else None,
                            seeds=arrays.get("seeds"))
        r.repro = str(path.relative_to(report_dir))


def _call_case(svc: Isolated, case: Case, inputs: list[np.ndarray], seeds: Any = None,
               which: str = "contributed") -> tuple[str, Any]:
    """The case's call in the isolated worker: the forward (Backend.run) or, for a derivative
    case, Backend.run_derivative with the seeds as the matrix hands them (derivatives.handed_seeds)."""
    kw = {"inputs": [x.copy() for x in inputs], "attrs": case.attr_dict, "device": case.target.device,
          "mode": case.target.mode, "which": which}
    if not case.grad:
        return svc.call("run", force=not case.declared, **kw)
    handed = derivatives.handed_seeds(case, seeds if seeds is not None else make_seeds(case, inputs))
    return svc.call("derivative", grad=case.grad, cotangents=list(handed.cotangents),
                    tangents=list(handed.tangents), **kw)


BESIDE = 50  # failing cases whose wrong positions get the built-in kernel's values too


def _beside_builtin(v: Validation, by_id: dict[str, Case], svc: Isolated) -> None:
    """The built-in kernel's values at each listed wrong position of a failing case (``builtin``
    beside ``expected`` and ``actual`` in the record's mismatch), so that the reader sees
    whether the built-in kernel agrees with the reference there (the port is wrong) or with the
    port (a shared flaw). One rerun of the built-in kernel per case, in the isolated worker; the
    first :data:`BESIDE` failing cases."""
    if builtin_entry(v.op, v.target.backend) is None:
        return
    for r in [r for r in v.bad_cases if r.mismatch and r.mismatch.get("first")][:BESIDE]:
        case = by_id.get(r.id)
        if case is None:
            continue
        status, value = _call_case(svc, case, make_inputs(case), which="builtin")
        key = "input" if case.grad in ("vjp", "hvp") else "output"  # which result a row is of
        for row in r.mismatch["first"]:
            if status != "ok":
                row["builtin"] = f"({status})"
                continue
            out = value[row[key]] if row.get(key, len(value)) < len(value) else None
            pos = tuple(row["at"])
            try:
                row["builtin"] = element_text(out, pos)
            except (IndexError, TypeError):
                row["builtin"] = "(no such element)"


def _speed(v: Validation, by_id: dict[str, Case], svc: Isolated, k: int, timeout: float) -> dict[str, Any]:
    # the forward kernel's time (a derivative case's would time MLX's transform as well)
    passing = [r for r in v.results if r.outcome == "pass" and r.declared and not r.grad and by_id.get(r.id)]
    if not passing:
        return {"note": "no passing case to time"}
    # largest first, round-robin over dtypes
    per_dtype: dict[str, list[res.CaseResult]] = defaultdict(list)
    for r in sorted(passing, key=lambda r: -by_id[r.id].size()):
        per_dtype[r.dtype].append(r)
    sample: list[res.CaseResult] = []
    while len(sample) < k and any(per_dtype.values()):
        for d in list(per_dtype):
            if per_dtype[d] and len(sample) < k:
                sample.append(per_dtype[d].pop(0))
    rows = []
    for r in sample:
        case = by_id[r.id]
        status, t = svc.call("time", timeout=max(timeout, 30.0), inputs=make_inputs(case),
                             attrs=case.attr_dict, device=case.target.device, mode=case.target.mode)
        if status == "ok":
            rows.append({"id": r.id, **t})
    out: dict[str, Any] = {
        "method": "median of repeated calls (>= 3, up to 25 or 0.1 s) after one warm-up call, same "
                  "inputs, one worker process; Backend.run time (conversions included)",
        "cases": rows,
        "matrix_backend_s": round(sum(r.backend_s for r in v.results), 4),
    }
    for other in ("builtin", "reference"):
        pairs = [(row["contributed"], row[other]) for row in rows
                 if row.get("contributed") and row.get(other)]
        if pairs:
            ratios = [c / o for c, o in pairs]
            out[other] = {"cases": len(pairs), "total_s": sum(o for _, o in pairs),
                          "contributed_total_s": sum(c for c, _ in pairs),
                          "ratio_geomean": math.exp(statistics.fmean(math.log(x) for x in ratios)),
                          "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return out


def _fuzz(v: Validation, spec, svc: Isolated, target: Target, n: int, derandomize: bool, strict: bool,
          report_dir: Path, dtype_globs: list[str] | None = None) -> None:
    b = get_backend(target.backend)
    claimed = [d for d in spec.dtypes if b.supports(spec.name, d, target.device)
               and (not dtype_globs or any(fnmatch.fnmatchcase(d, g) for g in dtype_globs))]
    cpu = get_backend("cpu")

    def run_and_judge(ex, which: str) -> Verdict:
        case = ex.case(target)
        try:
            expected = cpu.run(ex.op, [x.copy() for x in ex.inputs], dict(ex.attrs))
        except Exception:  # noqa: BLE001 — the reference rejects it (e.g. a singular matrix)
            return Verdict(False, "invalid")
        status, value = svc.call("run", inputs=[x.copy() for x in ex.inputs], attrs=dict(ex.attrs),
                                 device=target.device, mode=target.mode, which=which)
        if status in ("crash", "timeout"):
            return Verdict(True, status, value, expected)
        if status == "raised":
            name, msg, contract, _spec = value
            return Verdict(True, "contract" if contract else "error", f"{name}: {msg}" if not contract else msg,
                           expected)
        with np.errstate(all="ignore"):
            ok, comps, _tol = judge(case, ex.inputs, expected, value)
        measured = {"max_abs_err": max((c.max_abs_err for c in comps), default=0.0),
                    "max_rel_err": max((c.max_rel_err for c in comps), default=0.0),
                    "max_ulp": max((c.max_ulp for c in comps), default=0.0),
                    "nonfinite_mismatches": sum(c.nonfinite for c in comps)}
        if not ok:
            measured["mismatch"] = mismatch(case, ex.inputs, expected, value, comps)
        msg = "; ".join(c.message for c in comps if c.message)
        return Verdict(not ok, "pass" if ok else "fail", msg, expected, value, measured)

    def as_record(case: Case, v: Verdict) -> res.CaseResult:
        return res.CaseResult.for_case(case, v.outcome, message=v.message, **v.measured)

    def evaluate(ex) -> Verdict:
        """As the matrix judges a contributed kernel: a failure inside a known divergence that
        excuses its kind within its caps is xfail only where the built-in kernel fails the
        example the same way and no worse (:func:`shares_failure`)."""
        verdict = run_and_judge(ex, "contributed")
        case = ex.case(target)
        if not verdict.bad or strict or builtin_entry(spec.name, target.backend) is None \
                or known_divergence(case, as_record(case, verdict)) is None:
            return verdict
        theirs = run_and_judge(ex, "builtin")
        if not theirs.bad:
            return verdict
        mine, builtin = as_record(case, verdict), as_record(case, theirs)
        mine.divergence, builtin.divergence = {"was": verdict.outcome}, {"was": theirs.outcome}
        mine.outcome = builtin.outcome = "xfail"
        why = shares_failure(mine, builtin)
        if why is None:
            return Verdict(False, "xfail", verdict.message)
        verdict.message = f"{verdict.message} [inside a known divergence, but {why}]"
        return verdict

    report = explore(spec, claimed, n, evaluate, derandomize=derandomize)
    v.fuzz = report
    if report.failure is not None:
        ex, verdict = report.failure, report.verdict
        case = ex.case(target)
        r = res.CaseResult.for_case(case, verdict.outcome, message=verdict.message, **{
            k: verdict.measured[k] for k in ("max_abs_err", "max_rel_err", "max_ulp") if k in verdict.measured})
        d = write_bundle(report_dir / "fuzz", case, ex.inputs, verdict.expected, verdict.actual, r,
                         judged="fail" if verdict.outcome == "fail" else None)
        v.fuzz_bundle = str(d.relative_to(report_dir))
