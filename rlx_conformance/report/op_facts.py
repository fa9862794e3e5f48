"""Every fact the harness holds about one op, gathered from wherever it is declared.

An op's facts are spread over the registry (its OpSpec), both backends' kernel tables, the data
files (shape families, value domains, tolerances, accuracy budgets, known divergences) and the
judges (bounds, own checks, the precise and ONNX oracles, the derivative judge), and what the
case matrix and the graph library make of it (derivative cases, memory layouts, graphs).
``rlx-conformance ops OP --explain``
shows them together; this module collects them as one JSON-able dict, each item with the
``file:line`` it comes from, so that a reader can go and change it there. Line numbers of data
entries are found by scanning the TOML text: tomllib does not keep them.
"""
from __future__ import annotations

import fnmatch
import functools
import glob
import inspect
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import rlx_conformance
from rlx_conformance.backends import BACKENDS, get_backend
from rlx_conformance.backends.cpu._grad import ARGUMENT_TERMS
from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RegistrationError, RlxError
from rlx_conformance.generate.layouts import LAYOUTS, layout_dtype
from rlx_conformance.generate.matrix import GRAD_KINDS, Target, generate
from rlx_conformance.judge import accuracy, onnx_oracles, precise, tolerances
from rlx_conformance.judge import divergences as known
from rlx_conformance.judge.bounds import derivative as dbound
from rlx_conformance.ops.graphs import all_graphs, primals, resolve
from rlx_conformance.spec.custom_ops import CUSTOM
from rlx_conformance.spec.registry import REQUIRED, OpSpec

OPS_PACKAGE = "rlx_conformance.ops"

LOW_PRECISION = {
    "f32": "float16/bfloat16 inputs are computed in float32 and rounded once to the output",
    "native": "float16/bfloat16 stay in their dtype (pure data movement)",
}


# -- where things are ---------------------------------------------------------------------------
def _roots() -> list[Path]:
    """Folders a location is shown relative to: the one holding the package (the repository in
    an editable install, site-packages in a wheel), then the working directory."""
    return [Path(rlx_conformance.__file__).resolve().parent.parent, Path.cwd().resolve()]


def rel(path: str | Path) -> str:
    """``path`` relative to the package's folder when inside it (``rlx_conformance/ops/shape.py``,
    ``backends/cpu/shape.py``, ``cases/tolerances.toml`` in a checkout), else as given: a
    plugin's file or a ``--cases`` override keeps its full path."""
    p = Path(path).resolve()
    for root in _roots():
        if p.is_relative_to(root):
            return p.relative_to(root).as_posix()
    return str(path)


def at(path: str | Path | None, line: int | None = None) -> str | None:
    """``file:line`` (or just the file when the line is unknown; None without a file)."""
    if path is None:
        return None
    return rel(path) + (f":{line}" if line else "")


def rel_location(location: str) -> str:
    """An absolute ``/path/module.py:LINE`` (OpSpec.declared_at) made relative like :func:`rel`."""
    path, sep, line = location.rpartition(":")
    if not sep or not line.isdigit():
        return rel(location) if location else ""
    return f"{rel(path)}:{line}"


@functools.lru_cache(maxsize=64)
def _text_lines(path: str, mtime: float) -> tuple[str, ...]:
    return tuple(Path(path).read_text(encoding="utf-8").splitlines())


def _lines(path: Path) -> tuple[str, ...]:
    try:
        return _text_lines(str(path), path.stat().st_mtime)
    except OSError:
        return ()


def _header(line: str) -> str:
    """A TOML table header without spaces and comment (``[ a . b ] # x`` -> ``[a.b]``)."""
    return re.sub(r"\s+", "", line.split("#", 1)[0])


def table_line(path: Path, table: str) -> int | None:
    """The line of the table header ``[table]`` (a dotted name: ``defaults.float32``)."""
    want = f"[{table}]"
    return next((n for n, s in enumerate(_lines(path), 1) if _header(s) == want), None)


def entry_line(path: Path, array: str, index: int) -> int | None:
    """The line of the ``index``-th (1-based) ``[[array]]`` header: entries of an array of tables
    are numbered in file order, as the harness's messages number them."""
    want, k = f"[[{array}]]", 0
    for n, s in enumerate(_lines(path), 1):
        if _header(s) == want:
            k += 1
            if k == index:
                return n
    return None


def key_line(path: Path, key: str, value: str) -> int | None:
    """The line that sets ``key = "value"`` (an entry's stable key)."""
    pat = re.compile(rf"^\s*{re.escape(key)}\s*=\s*{re.escape(json.dumps(value))}\s*(#.*)?$")
    return next((n for n, s in enumerate(_lines(path), 1) if pat.match(s)), None)


def _folder_files(folder: str) -> list[Path]:
    """The TOML files of a data folder (shapes/, domains/) as the harness reads them: each
    shipped file, or the ``--cases`` override's file of the same name, plus the override's own."""
    names = {p.name for p in (data.shipped_dir() / folder).glob("*.toml")}
    over = data.override_dir()
    if over is not None and (over / folder).is_dir():
        names |= {p.name for p in (over / folder).glob("*.toml")}
    return [data.data_path(f"{folder}/{n}") for n in sorted(names)]


def folder_table_at(folder: str, table: str) -> str | None:
    """``file:line`` of ``[table]`` in whichever file of a data folder defines it."""
    for f in _folder_files(folder):
        line = table_line(f, table)
        if line:
            return at(f, line)
    return None


def quoted_at(module: ModuleType, name: str) -> str | None:
    """``file:line`` where ``module`` names ``name`` in quotes as a key or leading argument
    (``"exp": ...`` in a table keyed by op name, ``custom_op(\n    "onnx.GatherND",``, or
    ``name="..."``), else its first quoted mention."""
    path = inspect.getsourcefile(module)
    if path is None:
        return None
    q = re.escape(name)
    lead = re.compile(rf"""^\s*(custom_op\(\s*|declare\(\s*name\s*=\s*|name\s*=\s*)?["']{q}["']\s*[,:)]""")
    mention = re.compile(rf"""["']{q}["']""")
    lines = _lines(Path(path))
    line = next((n for n, s in enumerate(lines, 1) if lead.match(s)), None) or next(
        (n for n, s in enumerate(lines, 1) if mention.search(s)), None)
    return at(path, line)


def _first_line(text: str | None) -> str:
    return (text or "").strip().split("\n", 1)[0].strip()


# -- callables (kernels, bounds, checks, inference) ---------------------------------------------
def _unwrap(fn: Any) -> Any:
    fn = inspect.unwrap(fn)
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def _qualname(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def callable_name(fn: Any) -> str:
    """``module.qualname`` of a function, ufunc or extension function (``numpy.exp``)."""
    fn = _unwrap(fn)
    mod = getattr(fn, "__module__", None) or ""
    name = _qualname(fn)
    return f"{mod}.{name}" if mod and mod != "builtins" else name


def callable_at(fn: Any) -> str | None:
    """``file:line`` of a Python function's definition; None for ufuncs and extension code."""
    fn = _unwrap(fn)
    try:
        return at(inspect.getsourcefile(fn), inspect.getsourcelines(fn)[1])
    except (TypeError, OSError):
        return None


def callable_facts(fn: Any) -> dict[str, Any]:
    """Name and location of ``fn``, and what it wraps: a kernel made by a factory
    (``_unary(mx.exp)``) is a closure whose interesting part is the function it closes over."""
    fn = _unwrap(fn)
    wraps = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(v) and not isinstance(v, type):
            wraps.append({"function": callable_name(v), "at": callable_at(v)})
    return {"function": callable_name(fn), "qualname": _qualname(fn), "at": callable_at(fn),
            "wraps": wraps}


def _doc_of(fn: Any) -> str:
    return _first_line(inspect.getdoc(_unwrap(fn)) if fn is not None else "")


# -- the declaration ------------------------------------------------------------------------------
_MODULE_OF_FILE: dict[str, ModuleType] = {}


def _module_of_file(path: str) -> ModuleType | None:
    """The imported module whose source is ``path`` (an op's declaring module is imported by
    the time it is asked for; found once per file: sys.modules is large)."""
    if path not in _MODULE_OF_FILE:
        want = Path(path).resolve()
        for m in list(sys.modules.values()):
            f = getattr(m, "__file__", None)
            if f and Path(f).resolve() == want:
                _MODULE_OF_FILE[path] = m
                break
    return _MODULE_OF_FILE.get(path)


def family_module(spec: OpSpec) -> ModuleType | None:
    """The module that declares ``spec``: from ``declared_at``, else (ops declared through
    ``custom_op``, which does not record it) the op package module that defines its hooks."""
    if spec.declared_at:
        m = _module_of_file(spec.declared_at.rpartition(":")[0])
        if m is not None:
            return m
    for fn in (spec.generate, spec.check_values, spec.error_inputs, spec.infer, spec.policy.check):
        name = getattr(_unwrap(fn), "__module__", "") or ""
        if name.startswith(OPS_PACKAGE + "."):
            return sys.modules.get(name)
    return None


def declaration_at(spec: OpSpec) -> str:
    """Where ``spec`` is declared: ``declared_at`` made relative, or the first line of its
    family module that names the op in quotes."""
    if spec.declared_at:
        return rel_location(spec.declared_at)
    mod = family_module(spec)
    return (quoted_at(mod, spec.name) or "") if mod is not None else ""


def is_builtin(spec: OpSpec) -> bool:
    """Declared by the harness's own op package (not by a test, plugin or user module)."""
    mod = family_module(spec)
    return mod is not None and mod.__name__.startswith(OPS_PACKAGE + ".")


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and math.isnan(v):  # a pad value: JSON has no NaN
        return "nan"
    return v


def _sweep(a) -> Any:
    if a.sweep is None:
        return None
    if callable(a.sweep):
        return {"derived": callable_name(a.sweep), "qualname": _qualname(_unwrap(a.sweep)),
                "doc": _doc_of(a.sweep)}
    return _jsonable(a.sweep)


def declaration(spec: OpSpec) -> dict[str, Any]:
    """What the registry says: semantics, operands, attributes, dtypes, what the matrix tries."""
    mod = family_module(spec)
    custom = CUSTOM.get(spec.name)
    undefined = spec.undefined if spec.undefined.__name__ != "_no_undefined" else None
    return {
        "op": spec.name, "doc": spec.doc, "family": spec.family, "at": declaration_at(spec),
        "module": mod.__name__ if mod else None,
        "inputs": [{"name": i.name, "role": i.role,
                    "dtypes": "T" if i.dtypes == "T" else list(i.dtypes),
                    "domain": i.domain, "variadic": i.variadic,
                    "differentiable": spec.input_differentiable(i)} for i in spec.inputs],
        "differentiable": spec.differentiable,
        "not_differentiable": spec.not_differentiable_reason() or None,
        "attrs": [{"name": a.name, "kind": a.kind,
                   "required": a.default is REQUIRED,
                   "default": None if a.default is REQUIRED else _jsonable(a.default),
                   "choices": _jsonable(a.choices) if a.choices else None,
                   "sweep": _sweep(a), "doc": a.doc} for a in spec.attrs],
        "dtypes": list(spec.dtypes),
        "output": {"function": callable_name(spec.infer), "qualname": _qualname(_unwrap(spec.infer)),
                   "doc": _doc_of(spec.infer), "at": callable_at(spec.infer)},
        "undefined": None if undefined is None else {
            "function": callable_name(undefined), "doc": _doc_of(undefined),
            "at": callable_at(undefined)},
        "low_precision": {"rule": spec.low_precision,
                          "meaning": LOW_PRECISION.get(spec.low_precision, "")},
        "values": list(spec.values),
        "generate": None if spec.generate is None else callable_facts(spec.generate),
        "codec": None if custom is None else [
            {"attr": f.attr, "format": f.fmt, "codes": None if f.codes is None else dict(f.codes)}
            for f in custom.codec.fields],
    }


def shape_families(spec: OpSpec) -> dict[str, Any]:
    """The concrete shape families of the op's kind (cases/shapes/*.toml)."""
    fams = data.load("shapes").get(spec.shapes, {})
    return {"kind": spec.shapes, "at": folder_table_at("shapes", spec.shapes),
            "families": {k: _jsonable(v) for k, v in fams.items()}}


def value_domains(spec: OpSpec) -> dict[str, Any]:
    """The value domains the op's inputs draw from (cases/domains/*.toml), by name."""
    table = data.load("domains")
    out: dict[str, Any] = {}
    for i in spec.inputs:
        if i.domain in out:
            continue
        d = table.get(i.domain)
        out[i.domain] = {"range": None if d is None else _jsonable(d.get("range")),
                         "boundaries": None if d is None else _jsonable(d.get("boundaries", [])),
                         "at": folder_table_at("domains", i.domain)}
    return out


# -- kernels --------------------------------------------------------------------------------------
def kernels(spec: OpSpec) -> dict[str, Any]:
    """Each backend's kernel: function, location, native or delegated, dtypes per device, and
    its origin when it is not built in (an entry point, validate --kernel)."""
    out: dict[str, Any] = {}
    for name in BACKENDS:
        try:
            backend = get_backend(name)
        except RegistrationError:
            raise  # a contributed kernel that does not fit: not "backend not installed"
        except RlxError as e:
            out[name] = {"available": False, "error": str(e)}
            continue
        e = backend.kernels.get(spec.name)
        if e is None:
            out[name] = {"available": True, "kernel": None}
            continue
        out[name] = {"available": True, "kernel": "native" if e.native else "delegated",
                     **callable_facts(e.fn), "origin": e.origin, "note": e.note,
                     "devices": {d: [t for t in spec.dtypes if t in ds] for d, ds in e.dtypes.items()}}
    return out


# -- judges ---------------------------------------------------------------------------------------
def _tolerance_entry(op: str, dtype: str, source: str) -> tuple[str, str | None]:
    """(reason, file:line) of the tolerances.toml entry that ``source`` names, as tolerance_for
    reports it: ``default:float32``, ``override:GLOB[/dtype]`` or ``budget:...`` (an op of
    ``[from_budget]``, compared within its accuracy budget)."""
    path = data.data_path("tolerances.toml")
    table = data.load("tolerances.toml")
    kind, _, rest = source.partition(":")
    if kind == "budget":
        return (table.get("from_budget", {}).get("reason", ""),
                at(path, table_line(path, "from_budget")))
    if kind == "default":
        return (table.get("defaults", {}).get(rest, {}).get("reason", ""),
                at(path, table_line(path, f"defaults.{rest}")))
    if kind == "override":
        glob, _, only = rest.partition("/")
        for i, o in enumerate(table.get("override", []), 1):
            if (o.get("op") == glob and o.get("dtype", "") == only
                    and fnmatch.fnmatchcase(op, glob) and o.get("dtype", dtype) == dtype):
                return o.get("reason", ""), at(path, entry_line(path, "override", i))
    return "", at(path)


def judge(spec: OpSpec) -> dict[str, Any]:
    """How outputs are judged: an own check, a per-element bound, bit-exact, or the tolerance
    table; and for float outputs not judged exactly, the tolerance of each dtype."""
    p = spec.policy
    kind = "check" if p.check else "bound" if p.bound else "exact" if p.exact else "tolerance"
    out: dict[str, Any] = {"kind": kind, "exact": p.exact, "signed_zero": p.signed_zero,
                           "bound": None, "check": None, "tolerances": {}}
    if p.bound is not None:
        out["bound"] = {**callable_facts(p.bound), "reason": p.bound_reason}
    if p.check is not None:
        out["check"] = {**callable_facts(p.check), "reason": p.check_reason}
    if kind in ("bound", "tolerance"):  # execute.judge: tolerance_for on float outputs
        for d in spec.dtypes:
            if not dt.is_float(d):
                continue
            try:
                tol = tolerances.tolerance_for(spec.name, d)
            except RlxError as e:
                out["tolerances"][d] = {"error": str(e)}
                continue
            reason, where = _tolerance_entry(spec.name, d, tol.source)
            out["tolerances"][d] = {**tol.to_json(), "reason": reason, "at": where}
    return out


def _budget_at(source: str) -> str | None:
    """file:line of the accuracy.toml entry a Budget's source names: ``accuracy.toml#N:...``
    (the N-th [[budget]]) or ``accuracy.toml[low_precision]/...`` (the float32 budget capped)."""
    path = data.data_path("accuracy.toml")
    if source.startswith("accuracy.toml[low_precision]"):
        return at(path, table_line(path, "low_precision"))
    m = re.search(r"#(\d+)", source)
    return at(path, entry_line(path, "budget", int(m.group(1))) if m else None)


def oracles(spec: OpSpec) -> dict[str, Any]:
    """The precise (MPFR) oracle with the op's accuracy budget per float dtype, and the ONNX
    oracles (onnx.reference, onnxruntime) of the ONNX custom ops."""
    has = precise.has_oracle(spec.name)
    p: dict[str, Any] = {"available": has, "at": None, "budgets": {}, "why_not": None}
    if has:
        p["at"] = quoted_at(precise, spec.name)
        outs = dt.FLOATS if spec.name == "cast" else [d for d in spec.dtypes if dt.is_float(d)]
        for d in outs:
            try:
                b = accuracy.budget_for(spec.name, d)
            except RlxError as e:
                p["budgets"][d] = {"error": str(e)}
                continue
            p["budgets"][d] = {**b.to_json(), "reason": b.reason, "at": _budget_at(b.source)}
    else:
        p["why_not"] = getattr(precise, "NO_ORACLE", {}).get(spec.name)
    onnx = onnx_oracles.ONNX_OPS.get(spec.name)
    return {"precise": p, "onnx": None if onnx is None else {
        "op_type": onnx[0], "opset": onnx[1], "installed": onnx_oracles.available(),
        "at": quoted_at(onnx_oracles, spec.name)}}


# -- derivatives, layouts, graphs (issues 16 and 17) -------------------------------------------------
def matrix_cases(spec: OpSpec) -> dict[str, Any]:
    """What the case matrix generates for the op on one target (``--grad all --layouts
    default``): cases per derivative kind, and the memory layouts of its layout cases; with the
    matrix's error instead where it makes none (an op of a plugin whose shape kind the data
    lacks: the other facts still show)."""
    try:
        cases = [c for c in generate([Target("-", "-", "-")], [glob.escape(spec.name)],
                                     grads=("", *GRAD_KINDS), layouts="default") if c.op == spec.name]
    except RlxError as e:
        return {"derivatives": {}, "layouts": [], "layout_cases": 0, "error": str(e)}
    kinds = {k: sum(c.grad == k for c in cases) for k in GRAD_KINDS}
    lays = [c.layout for c in cases if c.layout]
    return {"derivatives": {k: n for k, n in kinds.items() if n},
            "layouts": [lay for lay in LAYOUTS if lay in lays], "layout_cases": len(lays), "error": None}


def _derivative_entry(op: str, section: str, rule: dbound.Roundings | None) -> dict[str, Any] | None:
    """The cases/derivatives.toml table behind ``rule`` (derivative.py's first match for the
    op in ``section``: [default] or the [[rule]], [[argument]], [[overflow]] whose ops match),
    with its reason and file:line."""
    if rule is None:
        return None
    path = data.data_path("derivatives.toml")
    table = data.load("derivatives.toml")
    if rule.source == "default":
        entry, line = table["default"], table_line(path, "default")
    else:
        first = rule.source.partition(":")[2]  # the source names the table by its first op glob
        k = next(i for i, r in enumerate(table.get(section, []), 1) if r["ops"][0] == first)
        entry, line = table[section][k - 1], entry_line(path, section, k)
    return {"table": "[default]" if rule.source == "default" else f"[[{section}]]",
            "ops": list(entry.get("ops", [])), "roundings": rule.count,
            "reason": entry["reason"].strip(), "at": at(path, line)}


def _text_at(modules: Iterable[ModuleType], text: str) -> str | None:
    """``file:line`` of the line of ``modules``' source that holds the longest start of ``text``
    (a string literal such as a derivative convention, wrapped over lines: its first words sit
    on one line; the longest start tells apart two literals that begin alike)."""
    words = text.split()
    best: tuple[int, bool, str] | None = None
    for m in modules:
        path = inspect.getsourcefile(m)
        for n, line in enumerate(_lines(Path(path)) if path else (), 1):
            k = 0
            while k < len(words) and " ".join(words[:k + 1]) in line:
                k += 1
            head = " ".join(words[:k])
            opens = f'"{head}' in line or f"'{head}" in line  # the literal starts there
            if k >= min(3, len(words)) and (best is None or (k, opens) > best[:2]):
                best = (k, opens, at(path, n) or "")
    return best[2] if best else None


def derivatives(spec: OpSpec, cases: dict[str, Any] | None = None) -> dict[str, Any]:
    """Whether and in which inputs the op is differentiable (the registry), the derivative cases
    the matrix makes (``cases``: :func:`matrix_cases`), the reference's rules and their
    convention at kinks and ties (backends/cpu, DerivativeRule), and the derivative judge's
    bound (judge/bounds/derivative.py) with the cases/derivatives.toml tables it uses."""
    out: dict[str, Any] = {"differentiable": spec.differentiable,
                           "not_differentiable": spec.not_differentiable_reason() or None}
    if not spec.differentiable:
        return out
    cases = cases or matrix_cases(spec)
    rule = get_backend("cpu").derivatives.get(spec.name)
    convention = None
    if rule is not None and rule.convention:
        mods = {m for f in (rule.vjp, rule.jvp) if f is not None
                for m in [sys.modules.get(getattr(_unwrap(f), "__module__", ""))] if m is not None}
        cpu_mods = [m for n, m in sorted(sys.modules.items()) if n.startswith("rlx_conformance.backends.cpu")]
        convention = {"text": rule.convention, "at": _text_at([*mods, *cpu_mods], rule.convention)}
    reference = None
    if rule is not None:
        reference = {k: None if getattr(rule, k) is None else callable_facts(getattr(rule, k))
                     for k in ("vjp", "jvp", "hvp", "magnitude", "hvp_magnitude")}
        reference["conditioned"] = rule.condition is not None
    out.update(
        inputs=[i.name for i in spec.inputs if spec.input_differentiable(i)],
        kinds=list(spec.derivative_kinds()), cases=cases["derivatives"], matrix_error=cases["error"],
        grad_values=list(spec.grad_values), convention=convention, reference=reference,
        bound={"native": spec.low_precision == "native",
               "rule": _derivative_entry(spec.name, "rule", dbound.roundings_for(spec.name)),
               # the [[argument]] allowance applies where the reference declares the sensitivity
               "argument": _derivative_entry(spec.name, "argument", dbound.argument_roundings_for(spec.name)
                                             if spec.name in ARGUMENT_TERMS else None),
               "overflow": _derivative_entry(spec.name, "overflow", dbound.overflow_rule_for(spec.name))})
    return out


def layouts(spec: OpSpec, cases: dict[str, Any] | None = None) -> dict[str, Any]:
    """The memory layouts the default matrix (``--layouts default``) runs the op's forward cases
    in: one case per layout and shape family, in :func:`layout_dtype`; ``--layouts all`` runs
    every forward case in every layout that exists for it (generate/layouts.py)."""
    cases = cases or matrix_cases(spec)
    return {"dtype": layout_dtype(spec), "default": cases["layouts"], "cases": cases["layout_cases"],
            "structured": spec.generate is not None, "error": cases["error"]}


def graphs(spec: OpSpec) -> list[dict[str, Any]]:
    """The graphs of the graph library (cases/graphs.toml) with a node of the op: name, the
    nodes, whether the graph has VJP cases (ops/graphs.primals), the ``[[graph]]`` line."""
    path = data.data_path("graphs.toml")
    out = []
    for k, g in enumerate(all_graphs().values(), 1):
        nodes = [n.name for n in g.nodes if n.op == spec.name]
        if not nodes:
            continue
        floats = [d for d in g.dtypes if dt.is_float(d)]
        vjp = bool(floats) and bool(primals(resolve(g, floats[0], g.shapes[0][0])))
        out.append({"graph": g.name, "doc": g.doc, "nodes": nodes, "dtypes": list(g.dtypes), "vjp": vjp,
                    "at": at(path, entry_line(path, "graph", k))})
    return out


# -- known divergences ----------------------------------------------------------------------------
_SCOPE = ("dtype", "backend", "device", "mode", "vals", "shape", "id")


def divergences(spec: OpSpec) -> list[dict[str, Any]]:
    """The known divergences whose op glob (or one glob of its list) matches the op, with the
    line of each entry's ``key``."""
    path = data.data_path("known_divergences.toml")
    out = []
    for d in known.divergences():
        if not any(fnmatch.fnmatchcase(spec.name, g) for g in d.op):
            continue
        out.append({"key": d.key, "category": d.category, "ops": list(d.op),
                    "scope": {k: _jsonable(getattr(d, k)) for k in _SCOPE if getattr(d, k) is not None},
                    "strict": d.strict, "isolate": d.isolate, "timeout": d.timeout,
                    "reason": d.reason.strip(), "link": d.link,
                    "at": at(path, key_line(path, "key", d.key))})
    return out


# -- all of it ------------------------------------------------------------------------------------
def op_facts(spec: OpSpec) -> dict[str, Any]:
    """Everything about ``spec``, JSON-able (``ops OP --explain --format json``)."""
    cases = matrix_cases(spec)
    return {**declaration(spec), "shapes": shape_families(spec), "domains": value_domains(spec),
            "kernels": kernels(spec), "judge": judge(spec), "oracles": oracles(spec),
            "derivatives": derivatives(spec, cases), "layouts": layouts(spec, cases),
            "graphs": graphs(spec), "divergences": divergences(spec)}


def builtin_ops(specs: Iterable[OpSpec]) -> list[OpSpec]:
    return [s for s in specs if is_builtin(s)]

