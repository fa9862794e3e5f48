"""Repro bundles: for each case that fails a run, a folder under ``<report>/repro/`` with what it
takes to reproduce the failure without this harness.

::

    inputs.npz     the exact inputs (bfloat16 as uint16 bits: npz without pickle has no ml_dtypes)
    seeds.npz      a derivative case's cotangents (cot<k>, per output) and tangents (tan<k>, per input)
    expected.npz   the CPU reference's outputs, plus per-output error bounds / undefined masks
    actual.npz     the backend's outputs (absent when it crashed, hung or raised)
    case.json      id, op, attrs, dtypes, shapes, target, seed, policy, outcome, message, versions
    repro.py       standalone: numpy + ml_dtypes + mlx (+ scipy for some judges), not rlx_conformance

A derivative case (Case.grad: vjp, jvp, hvp) stores as its outputs the results the reference
derivative has (case.json ``run.grad.results``: which input's or output's derivative each is), with
the derivative bound (judge/bounds/derivative.py) as their error bounds; its repro.py rebuilds the
derivative call (mx.vjp, mx.jvp, the JVP of the VJP) over the op's MLX kernel.

Bundles are written where the arrays are: in the worker that ran the case (BundleSink.collect,
called by the runner), or, for a crash or timeout, in the parent from regenerated inputs and
reference. ``repro.py`` is assembled from the harness's own code by portable.Extractor (the MLX
kernel, the judge, repro_runtime), so it runs the same call and the same comparison.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import sys
import sysconfig
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import compute_dtypes, differentiable_arrays
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError, error_detail
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.matrix import Case, case_layouts, make_inputs
from rlx_conformance.judge.bounds.derivative import roundings_for
from rlx_conformance.judge.compare import BIT_EXACT_TOLERANCE, Bound
from rlx_conformance.judge.tolerances import default_tolerance, tolerance_for
from rlx_conformance.ops.graphs import to_toml
from rlx_conformance.run import derivatives, graph_bundle, worker
from rlx_conformance.run.execute import run_case
from rlx_conformance.run.graphs import evaluate as evaluate_graph
from rlx_conformance.run.outcomes import apply_divergence
from rlx_conformance.run.portable import Extractor, NotPortable, Source

DIRNAME = "repro"  # under the report directory
# Outcomes that get a bundle: those that fail a run, except xpass (nothing left to reproduce).
BUNDLED = tuple(o for o in res.RUN_FAILING if o != "xpass")


def bundle_name(case_id: str) -> str:
    """A folder name for a case id: readable, one path component, distinct for distinct ids."""
    s = case_id.replace("/", "__").replace(":", "=")
    safe = re.sub(r"[^A-Za-z0-9._+=-]", "_", s)
    if safe != s or len(safe) > 150:
        safe = f"{safe[:130]}-{hashlib.sha256(case_id.encode()).hexdigest()[:12]}"
    return safe


@dataclass(frozen=True)
class BundleSink:
    """Where a run writes bundles (picklable: it travels to the workers). ``always``: every case
    it sees (the repro command), not only those that fail the run."""

    report_dir: Path
    always: bool = False
    timeout: float | None = None  # the run's per-case limit, repro.py's default alarm
    # the workers' environment and init hook (validate's contributed kernel): the child that
    # writes a crashed or hung case's bundle sets them up too, so that its repro.py embeds and
    # calls the kernel that failed, not the built-in one
    init: str | None = None
    env: tuple[tuple[str, str], ...] = ()

    def collect(self, case: Case, r: CaseResult, capture: dict[str, Any] | None) -> None:
        """Write the bundle of ``r`` if wanted and set ``r.repro``. ``capture``: the arrays from
        execute.run_case; None regenerates inputs and reference (a crashed or hung worker's case).
        A bundle that cannot be written is noted in the message; the run goes on."""
        final = apply_divergence(case, dataclasses.replace(r))  # as the run will report it
        if not (self.always or final.outcome in BUNDLED):
            return
        try:
            if capture is None:
                folder = self._regenerated(case, final)
            else:
                folder = write_bundle(case, final, self.report_dir / DIRNAME, capture, timeout=self.timeout,
                                      judged=r.outcome)
            r.repro = str(folder.relative_to(self.report_dir))
        except Exception as e:  # noqa: BLE001 — a bundle must never cost the case its result
            r.message = f"{r.message} [repro bundle not written: {type(e).__name__}: {e}]".strip()

    def _regenerated(self, case: Case, final: CaseResult) -> Path:
        """The bundle of a case whose worker died or hung, from regenerated inputs and reference,
        written by a child process: the reference may be what crashed or took so long."""
        ctx = worker.context()
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_write_regenerated, args=(child, case, final, self.report_dir / DIRNAME,
                                                           self.timeout, self.init, dict(self.env)),
                        daemon=True)
        p.start()
        child.close()
        limit = self.timeout or 60.0
        try:
            got = parent.recv() if parent.poll(limit + 30) else None  # + importing MLX in the child
        except (EOFError, OSError):  # the child died
            got = None
        p.join(1 if got else 0)
        if p.is_alive():
            p.kill()
            p.join()
        if got is None:
            raise RuntimeError(f"regenerating the inputs and reference failed (child exit {p.exitcode})")
        if isinstance(got, str):
            raise RuntimeError(got)
        return got


def _write_regenerated(conn: Any, case: Case, final: CaseResult, root: Path, timeout: float | None,
                       init: str | None = None, env: dict[str, str] | None = None) -> None:
    try:
        os.environ.update(env or {})
        worker.run_init(init)
        conn.send(write_bundle(case, final, root, regenerate(case), timeout=timeout))
    except Exception as e:  # noqa: BLE001 — reported to the parent
        conn.send(f"{type(e).__name__}: {e}")


def regenerate(case: Case) -> dict[str, Any]:
    """Inputs and reference of a case from its id alone (bit-identical to what the worker had);
    for a derivative case, its seeds and the reference derivative's results too. A graph case's
    bundle regenerates (and shrinks) what it needs itself (run/graph_bundle.py)."""
    if case.op.startswith("graph:"):
        return {}
    if case.grad:
        try:
            ref = derivatives.reference(case)
        except Exception as e:  # noqa: BLE001 — no reference: the bundle says so
            return {"inputs": make_inputs(case), "expected": e}
        return {"inputs": ref.inputs, "expected": ref.expected, "seeds": ref.seeds}
    inputs = make_inputs(case)
    try:
        expected: Any = get_backend("cpu").run(case.op, [x.copy() for x in inputs], case.attr_dict)
    except Exception as e:  # noqa: BLE001 — no reference: the bundle says so
        expected = e
    return {"inputs": inputs, "expected": expected}


def reproduce(case: Case, report_dir: Path) -> CaseResult:
    """Run one case in this process and write its bundle whatever the outcome (the bundle of a
    passing case gives a repro.py that exits 0)."""
    capture: dict[str, Any] = {}
    r = run_case(case, capture)
    BundleSink(Path(report_dir), always=True).collect(case, r, capture)
    return apply_divergence(case, r)


# -- writing -------------------------------------------------------------------------------------
def _describe(arrays: list[np.ndarray]) -> list[dict[str, Any]]:
    return [{"dtype": dt.name_of(a.dtype), "shape": list(a.shape),
             **({"stored_as": "uint16 bits"} if a.dtype.name == "bfloat16" else {})} for a in arrays]


def _savez(path: Path, prefix: str, arrays: list[np.ndarray], extra: dict[str, np.ndarray] | None = None) -> None:
    # MLX loads late: repro_runtime imports it, and a run's parent imports this module (worker.context).
    from rlx_conformance.run.repro_runtime import encode

    np.savez(path, **{f"{prefix}{k}": encode(a) for k, a in enumerate(arrays)},
             **(extra or {}))


def judge_plan(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray]
               ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """How execute.judge judges this case, in data: the op's own judge (by name), or per output
    exactness, signed zeros, tolerance, and the error bound and undefined-input mask as arrays
    (they depend on the inputs only)."""
    spec = case.spec
    policy = spec.policy
    if policy.check is not None:
        return {"kind": "check", "function": getattr(policy.check, "__qualname__", "?"),
                "reason": policy.check_reason}, {}
    attrs = case.attr_dict
    undefined = spec.undefined(inputs, attrs)
    outputs, aux = [], {}
    for k, e in enumerate(expected):
        out_dt = dt.name_of(e.dtype)
        exact = policy.exact or not dt.is_float(out_dt)
        tol = BIT_EXACT_TOLERANCE if exact else tolerance_for(case.op, out_dt)
        if policy.bound is not None and not exact:
            b = Bound.of(policy.bound(inputs, attrs, out_dt))
            aux[f"bound{k}"] = np.asarray(b.abs, np.float64)
            if b.free is not None:  # order-dependent positions and the outcomes legal there
                aux[f"free{k}"] = np.asarray(b.free, bool)
                aux[f"allow{k}"] = np.asarray(0 if b.allow is None else b.allow, np.uint8)
        if undefined is not None:
            aux[f"skip{k}"] = np.broadcast_to(undefined, e.shape)
        outputs.append({"exact": exact, "signed_zero": policy.signed_zero, "tolerance": tol.to_json(),
                        "bound": f"bound{k}" in aux, "skip": f"skip{k}" in aux})
    return {"kind": "elementwise", "outputs": outputs, "bound_reason": policy.bound_reason}, aux


def versions() -> dict[str, Any]:
    """The libraries a repro depends on, as they were when the bundle was written."""
    out: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                           "machine": platform.machine()}
    for name in ("numpy", "scipy", "mlx", "ml_dtypes"):
        try:
            mod = __import__(f"{name}.core" if name == "mlx" else name, fromlist=["__version__"])
            out[name] = getattr(mod, "__version__", None)
        except ImportError:
            out[name] = None
    return out


def write_bundle(case: Case, r: CaseResult, root: Path, arrays: dict[str, Any], *,
                 timeout: float | None = None, judged: str | None = None) -> Path:
    """(Re)write the bundle of one case under ``root``; returns its folder. ``arrays``: inputs,
    expected (a list, or the exception the reference raised) and actual (when the backend
    returned). ``judged``: the harness's comparison verdict (pass/fail), which repro.py's judge
    is checked against (case.json's self_check)."""
    if case.op.startswith("graph:"):  # a graph case: its minimal failing subgraph (run/graph_bundle.py)
        shrunk, note = graph_bundle.shrunk_for_bundle(case)
        return write_graph_bundle(Path(root) / bundle_name(case.id), case, r, shrunk, timeout=timeout, note=note)
    inputs: list[np.ndarray] = arrays["inputs"]
    expected, actual = arrays.get("expected"), arrays.get("actual")
    results: list[int] | None = None  # a derivative case: which of its results the outputs are
    if case.grad and isinstance(expected, list):
        results = [k for k, e in enumerate(expected) if e is not None]
        expected = [expected[k] for k in results]
        if actual is not None:
            actual = [actual[k] if k < len(actual) else None for k in results]
    folder = Path(root) / bundle_name(case.id)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")  # repeats may write it concurrently
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    doc = _case_doc(case, r, inputs, timeout)
    _savez(tmp / "inputs.npz", "in", inputs)
    if case.grad and arrays.get("seeds") is not None:  # in the memory order the backend got them
        doc["seeds"] = _save_seeds(tmp / "seeds.npz", derivatives.handed_seeds(case, arrays["seeds"]))
    if actual is not None:
        np.savez(tmp / "actual.npz", **{f"out{k}": _encode(a) for k, a in enumerate(actual) if a is not None})
    why = None
    if expected is None:
        why = "no reference outputs"
    elif not isinstance(expected, list):
        why = f"the CPU reference failed: {type(expected).__name__}: {expected}"
    else:
        plan, aux = judge_plan(case, inputs, expected) if results is None else derivative_plan(case, results)
        doc.update(outputs=_describe(expected), judge=plan)
        _savez(tmp / "expected.npz", "out", expected, aux)
        if getattr(r, "oracle_verdict", None) == "reference-bug":
            why = "the precise oracle found the CPU reference wrong here: repro.py would judge MLX against it"
        else:
            try:
                run, src, entry_points = repro_script(case, inputs, expected, doc)
                if results is not None:
                    run["grad"] = _grad_run(case, inputs, results)
                doc["run"] = run
                (tmp / "repro.py").write_text(src)
                if actual is not None and judged in ("pass", "fail"):
                    doc["self_check"] = _self_check(src, entry_points, doc, inputs, expected, actual, aux, judged)
            except Exception as e:  # noqa: BLE001 — a bundle without repro.py still has the arrays
                # a known limit says enough by itself; anything else also says where it was raised
                why = f"{type(e).__name__}: {e}" if isinstance(e, _known_limits()) else error_detail(e, frames=3)
    doc["repro_py"] = "repro.py" if (tmp / "repro.py").exists() else None
    if why:
        doc["repro_py_missing"] = why
    (tmp / "case.json").write_text(json.dumps(res._jsonable(doc), indent=1, allow_nan=False) + "\n")
    for _ in range(3):  # replace the old bundle; another process may be replacing it too
        shutil.rmtree(folder, ignore_errors=True)
        try:
            tmp.rename(folder)
            break
        except OSError:
            continue
    shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _encode(a: np.ndarray) -> np.ndarray:
    from rlx_conformance.run.repro_runtime import encode  # MLX loads late (see _savez)

    return encode(a)


def _save_seeds(path: Path, seeds: Any) -> dict[str, list[str | None]]:
    """seeds.npz (cot<k>, tan<k>: the seeds that exist; .npy keeps a column-major seed
    column-major, and MLX its strides) and their dtypes per position for case.json."""
    arrays = {f"{kind[:3]}{k}": _encode(a) for kind in ("cotangents", "tangents")
              for k, a in enumerate(getattr(seeds, kind)) if a is not None}
    np.savez(path, **arrays)
    return {kind: [None if a is None else dt.name_of(a.dtype) for a in getattr(seeds, kind)]
            for kind in ("cotangents", "tangents")}


def derivative_plan(case: Case, results: list[int]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """How run/derivatives.judge judges a derivative case, in data: per result, the dtype's final
    roundings as tolerance and the derivative bound (the reference's magnitude and term count,
    judge/bounds/derivative.py) and undefined positions as arrays."""
    ref = derivatives.CACHE.get(case)  # the run's own reference: cached in the worker that ran it
    if isinstance(ref, Exception):
        raise ref
    what = "output" if case.grad == "jvp" else "input"
    outputs, aux = [], {}
    for j, k in enumerate(results):
        d, m, skip = ref.dtypes[k], ref.magnitude[k], ref.undefined[k]
        if m is not None:
            aux[f"bound{j}"] = np.asarray(derivatives.result_bound(case, ref, k), np.float64)
        if skip is not None:
            aux[f"skip{j}"] = np.broadcast_to(np.asarray(skip, bool), ref.expected[k].shape)
        outputs.append({"name": f"{case.grad} {what} {k}", "exact": False, "signed_zero": False,
                        "tolerance": default_tolerance(d).to_json(), "bound": f"bound{j}" in aux,
                        "skip": f"skip{j}" in aux})
    return {"kind": "derivative", "grad": case.grad, "outputs": outputs,
            "bound_reason": f"derivative bound: gamma(terms + roundings) x magnitude "
                            f"({roundings_for(case.op).source}, {ref.terms} terms)"}, aux


def _grad_run(case: Case, inputs: list[np.ndarray], results: list[int]) -> dict[str, Any]:
    """case.json's run.grad: which inputs are differentiated (diff), which outputs are floating
    (floats: the ones seeded and differentiated), and which results the outputs are."""
    _, outs = case.spec.validate([x.shape for x in inputs], [dt.name_of(x.dtype) for x in inputs],
                                 case.attr_dict)
    return {"kind": case.grad,
            "diff": [k for k, ok in enumerate(differentiable_arrays(case.spec, len(inputs))) if ok],
            "floats": [k for k, (_, d) in enumerate(outs) if dt.is_float(d)], "results": results}


def _case_doc(case: Case, r: CaseResult, inputs: list[np.ndarray], timeout: float | None) -> dict[str, Any]:
    return {
        "schema": "rlx-conformance/repro/v1", "id": case.id, "op": case.op, "grad": case.grad,
        "layout": case.layout, "dtype": case.dtype,
        "attrs": res._jsonable(case.attr_dict), "shapes": [list(s) for s in case.shapes],
        "family": case.family, "vals": case.vals, "backend": case.target.backend,
        "device": case.target.device, "mode": case.target.mode, "seed": case.seed,
        "declared": case.declared, "outcome": r.outcome, "message": r.message,
        "max_abs_err": r.max_abs_err, "max_rel_err": r.max_rel_err, "max_ulp": r.max_ulp,
        "divergence": r.divergence, "timeout_s": timeout, "versions": versions(),
        "inputs": _describe(inputs)}


def _known_limits() -> tuple[type[Exception], ...]:
    return (NotPortable, RlxError)


# -- repro.py ------------------------------------------------------------------------------------
_HEADER = '''#!/usr/bin/env python3
"""Standalone repro of one rlx-conformance case:

    {id}

Recorded outcome: {outcome}{reason}
Runs {op} on MLX ({device}, {mode} mode) on inputs.npz and judges the outputs against
expected.npz (the CPU reference) as the harness does: {judge}.
Exit 0: MLX agrees (fixed); 1: it disagrees or raises; killed by a signal: it still crashes.
Options: --save OUT.npz (MLX's outputs), --timeout S.

Needs {needs}; not rlx_conformance. Everything below is the harness's own code (the MLX
kernel, its helpers, the judge), extracted by rlx_conformance.run.portable.
"""
'''


_GRAD_CALLS = {"vjp": "mx.vjp", "jvp": "mx.jvp", "hvp": "mx.jvp of mx.vjp"}


def repro_script(case: Case, inputs: list[np.ndarray], expected: list[np.ndarray],
                 doc: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, str]]:
    """For an MLX case: how the backend call runs (case.json's ``run``), repro.py's source, and
    the names its judge and judge attributes got there (for the self-check)."""
    # MLX loads late: repro_runtime imports it, and a run's parent imports this module (worker.context).
    from rlx_conformance.run.repro_runtime import judge_outputs, main

    if case.target.backend != "mlx":
        raise RlxError(f"repro.py is written for MLX cases only, not {case.target.backend}")
    backend = get_backend("mlx")
    entry = backend.entry(case.op)
    if not entry.native:
        raise RlxError(f"{case.op} runs through the host delegate (the CPU kernel): nothing of MLX to reproduce")
    spec = case.spec
    in_dtypes = [dt.name_of(x.dtype) for x in inputs]
    attrs, outs = spec.validate([x.shape for x in inputs], in_dtypes, case.attr_dict)
    out_dtypes = [d for _, d in outs]
    run = {"in_dtypes": in_dtypes, "compute_dtypes": compute_dtypes(spec, in_dtypes),
           "out_dtypes": out_dtypes, "stream": backend.stream_for(entry, in_dtypes + out_dtypes, case.target.device),
           "layouts": list(case_layouts(case, inputs))}  # how MLX gets each input (to_mlx_view)
    table = {}
    for d in dt.FLOATS:
        try:
            table[(case.op, d)] = tolerance_for(case.op, d)
        except RlxError:
            pass
    frozen = Source("tolerance_for", "def tolerance_for(op, dtype):\n"
                    "    \"\"\"cases/tolerances.toml's entries for this op, as recorded.\"\"\"\n"
                    "    return TOLERANCES[(op, dtype)]\n", {"TOLERANCES": table})
    ex = Extractor(replace={tolerance_for: frozen}, local=_own_module(entry.fn))
    fn, check = entry.fn, spec.policy.check
    kernel = ex.bind("kernel" if fn.__name__ == "<lambda>" else fn.__name__, fn, root=True)
    judge = "None" if check is None else ex.bind(check.__name__, check)
    names = [ex.bind(n, v) for n, v in (("main", main), ("sys", sys), ("pathlib", pathlib))]
    kernel_attrs, judge_attrs = ex.bind("KERNEL_ATTRS", attrs), ex.bind("JUDGE_ATTRS", case.attr_dict)
    tail = (f"KERNEL = {kernel}  # backends/mlx: the kernel registered for {case.op}\n"
            f"CHECK = {judge}  # the op's own judge (None: compare() per output)\n\n"
            "if __name__ == \"__main__\":\n"
            f"    {names[1]}.exit({names[0]}({names[2]}.Path(__file__).resolve().parent, KERNEL, {kernel_attrs}, "
            f"CHECK, {judge_attrs}))\n")
    body = ex.source()
    needs = ["numpy", "ml_dtypes", "mlx"] + (["scipy"] if re.search(r"^(import|from) scipy", body, re.M) else [])
    first = (doc["message"] or "").splitlines()[0][:300] if doc["message"] else ""
    how = (f"the op's own judge ({doc['judge']['reason'] or doc['judge']['function']})"
           if doc["judge"]["kind"] == "check" else "compare() per output with the recorded tolerance"
           + (", error bounds" if any(o["bound"] for o in doc["judge"]["outputs"]) else "")
           + (", undefined inputs masked" if any(o["skip"] for o in doc["judge"]["outputs"]) else ""))
    what = case.op if not case.grad else (f"the {case.grad.upper()} of {case.op} ({_GRAD_CALLS[case.grad]} over "
                                          "its MLX kernel, seeded from seeds.npz)")
    header = _HEADER.format(**{k: _docstring_safe(v) for k, v in {
        "id": case.id, "outcome": doc["outcome"], "reason": f" — {first}" if first else "", "op": what,
        "device": case.target.device, "mode": case.target.mode, "judge": how, "needs": ", ".join(needs)}.items()})
    entry_points = {"judge_outputs": ex.name_of(judge_outputs), "judge_attrs": judge_attrs}
    return run, header + "from __future__ import annotations\n\n" + body + "\n" + tail, entry_points


def _docstring_safe(text: str) -> str:
    """Text that cannot end or break repro.py's docstring (messages hold quotes, backslashes)."""
    return text.replace("\\", "\\\\").replace('"""', "'''")


def _own_module(fn: Any) -> list[str]:
    """A contributed kernel's own module (neither the harness nor an installed library): embedded
    as source too, so that repro.py does not import it."""
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    path = getattr(mod, "__file__", None)
    if not isinstance(fn, types.FunctionType) or not path:
        return []
    p = Path(path).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    if {"site-packages", "dist-packages"} & set(p.parts) or stdlib in p.parents:
        return []
    return [fn.__module__.split(".")[0]]


def _self_check(src: str, entry_points: dict[str, str], doc: dict[str, Any], inputs: list[np.ndarray],
                expected: list[np.ndarray], actual: list[np.ndarray], aux: dict[str, np.ndarray],
                judged: str) -> str:
    """Does repro.py's judge reach the harness's verdict (``judged``: pass or fail) on the
    recorded outputs? Its definitions run here; its MLX call does not."""
    mod = types.ModuleType("_rlx_repro_self_check")  # dataclasses look their module up
    ns = mod.__dict__
    sys.modules[mod.__name__] = mod
    try:
        exec(compile(src, "repro.py", "exec"), ns)  # noqa: S102 — our own generated source
        n = len(expected)
        extra = {k: [aux.get(f"{k}{i}") for i in range(n)] for k in ("bound", "skip", "free", "allow")}
        comps = ns[entry_points["judge_outputs"]](doc, inputs, expected, actual, extra, ns["CHECK"],
                                                  ns[entry_points["judge_attrs"]])
    except Exception as e:  # noqa: BLE001 — recorded, not raised
        return f"repro.py's judge raised {type(e).__name__}: {e}"
    finally:
        del sys.modules[mod.__name__]
    says = "pass" if all(c.ok for c in comps) else "fail"
    if says == judged:
        return "agrees"
    note = "" if doc["declared"] else (" (declared unsupported: the harness fails a dtype that runs "
                                       "and matches; repro.py judges the values only)")
    return f"disagrees: repro.py's judge says {says}, the harness's comparison said {judged}{note}"


# -- graph cases (issue 17) ----------------------------------------------------------------------
def write_graph_bundle(folder: Path, case: Case, r: CaseResult, shrunk: Any, *, timeout: float | None = None,
                       note: str = "") -> Path:
    """(Re)write ``folder``, the bundle of graph case ``case`` (record ``r``): the shrinker's
    minimal graph (``shrunk``, a run/shrink.Shrunk; None: the whole graph), as run/graph_bundle.py
    describes. The graph fuzzer calls this too, with the case of its graph."""
    from rlx_conformance.run.repro_runtime import judge_outputs, main  # MLX loads late (see _savez)

    trial = graph_bundle.minimal_trial(case, shrunk)
    g, ref = trial.resolved, trial.reference
    capture: dict[str, Any] = {}
    ev = evaluate_graph(g, ref, case.target, capture)  # the minimal graph's MLX outputs, once more
    inputs = [ref.inputs[name] for name, _ in g.inputs]
    expected = capture["expected"]
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    doc = _case_doc(case, r, inputs, timeout)
    doc["graph"] = graph_bundle.graph_doc(case, shrunk, ev, note)
    _savez(tmp / "inputs.npz", "in", inputs)
    if capture.get("actual") is not None:
        np.savez(tmp / "actual.npz", **{f"out{k}": _encode(a) for k, a in enumerate(capture["actual"])})
    plan, aux = graph_bundle.graph_plan(g, ref)
    doc.update(outputs=_describe(expected), judge=plan)
    _savez(tmp / "expected.npz", "out", expected, aux)
    (tmp / "graph.toml").write_text(to_toml(g.graph))
    try:
        run, src, entry_points = graph_bundle.graph_script(
            case, g, doc, {"judge_outputs": judge_outputs, "main": main}, _own_module)
        doc["run"] = run
        (tmp / "repro.py").write_text(src)
        if capture.get("actual") is not None and ev.outcome in ("pass", "fail"):
            doc["self_check"] = _self_check(src, entry_points, doc, inputs, expected, capture["actual"], aux,
                                            ev.outcome)
    except Exception as e:  # noqa: BLE001 — a bundle without repro.py still has the arrays
        doc["repro_py_missing"] = f"{type(e).__name__}: {e}"
    doc["repro_py"] = "repro.py" if (tmp / "repro.py").exists() else None
    (tmp / "case.json").write_text(json.dumps(res._jsonable(doc), indent=1, allow_nan=False) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder
