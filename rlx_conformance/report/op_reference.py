"""docs/ops.md, the op reference, generated from the registry (``ops --format markdown``).

The registry is where an op is declared, once; a hand-written reference next to it would drift.
So the page is made from the declarations: per family module its docstring as the intro, per op
its semantics, operands, attributes, dtypes, output inference, judge, derivatives (kinds, inputs,
convention, the derivative bound's tables), memory layouts and the graphs that use it. It holds nothing that
depends on the machine (kernels, installed oracles) or moves with every edit (line numbers), so
the committed page changes only when a declaration or a judging table does, and
tests/test_op_reference.py can require it to be current.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlx_conformance.generate.layouts import LAYOUTS
from rlx_conformance.report.op_explain import value_text
from rlx_conformance.report.op_facts import (
    declaration,
    derivatives,
    family_module,
    graphs,
    judge,
    layouts,
    matrix_cases,
    oracles,
)
from rlx_conformance.spec.registry import OpSpec

DOC = "docs/ops.md"
COMMAND = f"rlx-conformance ops --format markdown > {DOC}"


CONVENTIONS = (
    "- **T** is an op's type variable: the inputs typed T share one dtype, one of the op's dtypes.",
    ("- **low precision** `f32`: float16/bfloat16 inputs are computed in float32 and the result is "
     "rounded once to the output dtype; `native`: pure data movement stays in its dtype."),
    ("- **judge**: how the backend's outputs are compared with the CPU reference. Bit-exact: "
     "NaN positions must match (signed zeros where stated); a tolerance (cases/tolerances.toml: "
     "the first matching override, else the dtype default) passes an element within max_ulp ULP "
     "of the output dtype, or rtol, or atol; an error bound is computed per element from the "
     "inputs by numerical analysis; an own check judges the op as a whole (backward error, "
     "reconstruction, distribution tests). Integer and bool outputs are always bit-exact."),
    "- **undefined by spec**: output positions the spec leaves undefined; any value there passes.",
    ("- **oracles**: the precise oracle (MPFR, the exact result rounded once) judges both sides "
     "against the accuracy budget (cases/accuracy.toml); the ONNX oracles say which side "
     "onnx.reference and onnxruntime agree with."),
    ("- **derivatives**: the kinds the matrix checks (`--grad`: vjp, jvp, and hvp where declared "
     "second order) and the inputs they differentiate; the value classes only gradient cases get "
     "(points at and next to kinks and ties); what the reference returns at kinks, ties and poles "
     "(its convention); and the derivative bound, gamma_(terms + roundings)(u) times the "
     "magnitude of the result's terms with `roundings` from the cases/derivatives.toml table named "
     "(`[[argument]]`: plus the rounding of the formula's own arguments; `[[overflow]]`: +-inf "
     "and NaN legal where the terms overflow), plus (terms + roundings) times the compute dtype's "
     "smallest subnormal where a term is nonzero (gradual underflow), plus the dtype's max_ulp."),
    ("- **layouts**: the memory layouts `--layouts default` hands the op's inputs in (one case "
     "per layout and shape family, in the dtype named); **graphs**: the graphs of "
     "cases/graphs.toml with a node of the op (VJP: the graph has VJP cases too)."),
)


def _md(text: str) -> str:
    """reST inline markup of the docstrings (``code``, :func:`name`) as markdown."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def _anchor(name: str) -> str:
    return "op-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _module_path(mod_name: str) -> str:
    return mod_name.replace(".", "/") + ".py"


def _nums(t: dict[str, Any]) -> str:
    return f"{t['max_ulp']:g} ulp" + "".join(f", {k} {t[k]:g}" for k in ("rtol", "atol") if t[k])


def _grouped(items: dict[str, str]) -> str:
    """dtype -> text as "a, b: text; c: other" (dtypes with the same text together)."""
    by: dict[str, list[str]] = {}
    for d, text in items.items():
        by.setdefault(text, []).append(d)
    return "; ".join(f"{', '.join(ds)}: {text}" for text, ds in by.items())


def _tolerances(tols: dict[str, dict[str, Any]]) -> str:
    """The tolerance of each float dtype, with the override's reason where one applies."""
    items = {}
    for d, t in tols.items():
        if "error" in t:
            items[d] = t["error"]
        elif t["source"].startswith("default:"):
            items[d] = f"{_nums(t)} (dtype default)"
        else:
            kind, _, glob = t["source"].partition(":")
            what = "its accuracy budget" if kind == "budget" else f"`{glob}`"
            items[d] = f"{_nums(t)} ({what}: {_md(' '.join(t['reason'].split()))})"
    return _grouped(items)


def _judge_line(spec: OpSpec) -> str:
    j = judge(spec)
    sz = ", signed zeros included" if j["signed_zero"] else ""
    if j["kind"] == "check":
        return f"own check: {_md(j['check']['reason'] or j['check']['function'])}"
    if j["kind"] == "exact":
        return f"bit-exact{sz}"
    if j["kind"] == "bound":
        return (f"error bound: {_md(j['bound']['reason'] or j['bound']['function'])}; plus the "
                f"tolerance's max_ulp for the final rounding — {_tolerances(j['tolerances'])}")
    return f"tolerance — {_tolerances(j['tolerances'])}"


def _op_section(spec: OpSpec) -> list[str]:
    f = declaration(spec)
    out = [f'<a id="{_anchor(spec.name)}"></a>', "", f"### `{spec.name}`", "", _md(spec.doc), ""]
    ins = []
    for i in f["inputs"]:
        ds = "T" if i["dtypes"] == "T" else ", ".join(i["dtypes"])
        ins.append(f"`{i['name']}`{'…' if i['variadic'] else ''} ({i['role']}, {ds})")
    out.append(f"- **family**: {spec.family}")
    out.append(f"- **inputs**: {'; '.join(ins) or 'none'}")
    if f["attrs"]:
        out.append("- **attributes**:")
        for a in f["attrs"]:
            parts = [a["kind"], "required" if a["required"] else f"default `{value_text(a['default'])}`"]
            if a["choices"]:
                parts.append("one of " + ", ".join(f"`{value_text(c)}`" for c in a["choices"]))
            out.append(f"  - `{a['name']}`: {', '.join(parts)}" + (f" — {_md(a['doc'])}" if a["doc"] else ""))
    else:
        out.append("- **attributes**: none")
    out.append(f"- **dtypes** (T): {', '.join(spec.dtypes)}; low precision `{spec.low_precision}`")
    if f["output"]["doc"]:
        out.append(f"- **output**: {_md(f['output']['doc'])}")
    if f["undefined"] and f["undefined"]["doc"]:
        out.append(f"- **undefined by spec**: {_md(f['undefined']['doc'])}")
    if f["codec"]:
        fields = []
        for c in f["codec"]:
            codes = (" (" + ", ".join(f"{k}={v}" for k, v in c["codes"].items()) + ")") if c["codes"] else ""
            fields.append(f"`{c['attr']}` {c['format']}{codes}")
        out.append(f"- **attribute bytes** (RLX codec, little-endian, in this order): {'; '.join(fields)}")
    out.append(f"- **judge**: {_judge_line(spec)}")
    o = oracles(spec)
    extra = []
    if o["precise"]["available"]:
        budgets = _grouped({d: f"{b['ulp']:g} ulp" + (f" + {b['atol']:g} abs" if b["atol"] else "")
                            + (f" + {b['bound']:g} x the bound" if b["bound"] is not None else "")
                            for d, b in o["precise"]["budgets"].items() if "error" not in b})
        extra.append(f"precise (MPFR), accuracy budget {budgets}")
    if o["onnx"]:
        extra.append(f"ONNX oracles: {o['onnx']['op_type']} opset {o['onnx']['opset']}")
    if extra:
        out.append(f"- **oracles**: {'; '.join(extra)}")
    cases = matrix_cases(spec)
    out.append(f"- **derivatives**: {_derivative_line(derivatives(spec, cases))}")
    out.append(f"- **layouts**: {_layout_line(layouts(spec, cases))}; **graphs**: {_graph_line(graphs(spec))}")
    out.append("")
    return out


def _derivative_line(d: dict[str, Any]) -> str:
    if not d["differentiable"]:
        return f"none: {_md(d['not_differentiable'])}"
    text = f"{', '.join(d['kinds'])} in " + ", ".join(f"`{i}`" for i in d["inputs"])
    if d["grad_values"]:
        text += "; gradient values also " + ", ".join(f"`{v}`" for v in d["grad_values"])
    if d["convention"]:
        text += f"; convention: {_md(d['convention']['text'])}"
    b = d["bound"]
    bound = f"gamma_(terms + {b['rule']['roundings']})(u) x magnitude ({b['rule']['table']})"
    if b["argument"]:
        bound += f" + gamma_{b['argument']['roundings']}(u) x argument ([[argument]])"
    if b["overflow"]:
        bound += ", +-inf and NaN legal where the terms overflow ([[overflow]])"
    return text + f"; bound: {bound}" + (", u of the result's dtype" if b["native"] else "")


def _layout_line(lay: dict[str, Any]) -> str:
    if not lay["default"]:
        return "none"
    names = f"all {len(LAYOUTS)}" if lay["default"] == list(LAYOUTS) else ", ".join(lay["default"])
    return f"{names} ({lay['dtype']})"


def _graph_line(gs: list[dict[str, Any]]) -> str:
    return ", ".join(f"`{g['graph']}`" + (" (VJP)" if g["vjp"] else "") for g in gs) or "none"


def markdown(specs: Sequence[OpSpec]) -> str:
    """The reference page for ``specs``, grouped by the module that declares them (in the
    registry's order), each module's docstring as its section's intro."""
    groups: dict[str, list[OpSpec]] = {}
    intros: dict[str, str] = {}
    for s in specs:
        mod = family_module(s)
        name = mod.__name__ if mod else "(unknown module)"
        groups.setdefault(name, []).append(s)
        intros.setdefault(name, (inspect.getdoc(mod) or "") if mod else "")
    families = {s.family for s in specs}
    lines = [
        "# Op reference",
        "",
        f"Generated from the op registry by `{COMMAND}`; do not edit by hand: change the",
        "declarations (rlx_conformance/ops/) or the data (cases/) and regenerate",
        "(tests/test_op_reference.py fails while this page is out of date).",
        f"{len(specs)} ops in {len(families)} families. Everything about one op, each fact with the",
        "file and line it comes from (kernels, shape families, value domains, tolerances, accuracy",
        "budgets, reference derivative rules, derivative bounds, graphs, known divergences):",
        "`rlx-conformance ops OP --explain`.",
        "",
        "Conventions:",
        "",
        *CONVENTIONS,
        "",
        "| module | ops |",
        "|---|---|",
    ]
    for name, ops in groups.items():
        title = name.rpartition(".")[2]
        links = ", ".join(f"[{s.name}](#{_anchor(s.name)})" for s in ops)
        lines.append(f"| [{title}](#{_anchor('module-' + title)}) | {links} |")
    lines.append("")
    for name, ops in groups.items():
        title = name.rpartition(".")[2]
        fams = ", ".join(dict.fromkeys(s.family for s in ops))
        lines += [f'<a id="{_anchor("module-" + title)}"></a>', "",
                  f"## {title} (`{_module_path(name)}`: {fams})", ""]
        if intros[name]:  # without the module's pointer to this very page
            lines += [_md(re.sub(rf" \({re.escape(DOC)}\)", "", intros[name])), ""]
        for s in ops:
            lines += _op_section(s)
    return "\n".join(lines).rstrip("\n") + "\n"


def doc_path(root: Path) -> Path:
    """Where the committed page lives under a checkout's ``root``."""
    return root / DOC
