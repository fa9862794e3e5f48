"""``rlx-conformance ops OP --explain``: an op's facts (report/op_facts.py) on one screen.

One row per fact: a label, the fact in a line, and the ``file:line`` it comes from, so that the
answer to "why is this case judged like that?" and "where do I change it?" is one command. On a
terminal the rows are a rich grid cut to the width; piped, they are plain lines, uncut.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rlx_conformance.core import dtypes as dt

Row = tuple[int, str, str, str]  # (indent, label, text, file:line)


def _list(values: Iterable[Any]) -> str:
    return ", ".join(value_text(v) for v in values)


def value_text(v: Any) -> str:
    """An attribute value or shape as written in a spec: lists in brackets, strings bare,
    booleans as in TOML."""
    if isinstance(v, list):
        return "[" + ", ".join(value_text(x) for x in v) + "]"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _one_line(text: str) -> str:
    """A reason written over several TOML lines, as one line (a terminal cuts it to the width)."""
    return " ".join(text.split())


def _dtypes(ds: list[str], all_: list[str]) -> str:
    return f"all {len(all_)}" if ds == all_ else (_list(ds) or "none") + f" ({len(ds)}/{len(all_)})"


def _callable(f: dict[str, Any]) -> str:
    wraps = ", ".join(w["function"] for w in f.get("wraps", []))
    return f["function"] + (f" → {wraps}" if wraps else "")


def _short(f: dict[str, Any]) -> str:
    """A function by its qualified name within its module (``_solve_infer.<locals>.run``)."""
    return f.get("qualname") or f["function"]


def _declaration_rows(f: dict[str, Any]) -> list[Row]:
    rows: list[Row] = [(0, "declared", f"family {f['family']}" + (f" ({f['module']})" if f["module"] else ""),
                        f["at"])]
    rows.append((0, "dtypes", _list(f["dtypes"]) + f"; low precision {f['low_precision']['rule']}: "
                 + f["low_precision"]["meaning"], ""))
    shown: set[str] = set()  # each domain once, under the first input drawn from it
    for i in f["inputs"]:
        ds = "T" if i["dtypes"] == "T" else _list(i["dtypes"])
        dom = {} if i["domain"] in shown else f["domains"].get(i["domain"], {})
        shown.add(i["domain"])
        variadic = "..." if i["variadic"] else ""
        rows.append((0, "input", f"{i['name']}{variadic}: {i['role']}, {ds}, domain {i['domain']}", ""))
        if dom:
            text = f"{i['domain']}: range {value_text(dom['range'])}, boundaries {value_text(dom['boundaries'])}"
            rows.append((1, "domain", text, dom["at"] or "(not in cases/domains)"))
    for a in f["attrs"]:
        parts = [a["kind"], "required" if a["required"] else f"default {value_text(a['default'])}"]
        if a["choices"]:
            parts.append(f"choices {value_text(a['choices'])}")
        sw = a["sweep"]
        if isinstance(sw, dict):
            parts.append(f"sweep derived: {sw['qualname']}"
                         + (f" ({sw['doc']})" if sw["doc"] else ""))
        elif sw is not None:
            parts.append(f"sweep {value_text(sw)}")
        rows.append((0, "attr", f"{a['name']}: " + ", ".join(parts) + (f" — {a['doc']}" if a["doc"] else ""), ""))
    if not f["attrs"]:
        rows.append((0, "attr", "none", ""))
    o = f["output"]
    rows.append((0, "output", _short(o) + (f": {o['doc']}" if o["doc"] else ""), o["at"] or ""))
    if f["undefined"]:
        u = f["undefined"]
        rows.append((0, "undefined", u["doc"] or u["function"], u["at"] or ""))
    if f["codec"]:
        rows.append((0, "codec", " | ".join(
            f"{c['attr']} {c['format']}" + (f" {c['codes']}" if c["codes"] else "") for c in f["codec"]), ""))
    s = f["shapes"]
    fams = "; ".join(f"{k} {value_text(v)}" for k, v in s["families"].items())
    rows.append((0, "shapes", f"{s['kind']} ({len(s['families'])}): {fams or 'no families'}",
                 s["at"] or "(not in cases/shapes)"))
    gen = f["generate"]
    rows.append((0, "values", _list(f["values"]) + (f"; inputs made by {gen['function']}" if gen else ""),
                 (gen or {}).get("at") or ""))
    return rows


def _kernel_rows(f: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for name, k in f["kernels"].items():
        if not k["available"]:
            rows.append((0, name, f"backend not available: {k['error']}", ""))
            continue
        if k["kernel"] is None:
            rows.append((0, name, "no kernel", ""))
            continue
        origin = "" if k["origin"] == "builtin" else f" [from {k['origin']}]"
        rows.append((0, name, f"{k['kernel']}{origin}: {_callable(k)}", k["at"] or ""))
        devs = "; ".join(f"{d} {_dtypes(ds, f['dtypes'])}" for d, ds in k["devices"].items())
        rows.append((1, "dtypes", devs, ""))
        if k["note"]:
            rows.append((1, "note", k["note"], ""))
    return rows


def _judge_rows(f: dict[str, Any]) -> list[Row]:
    j = f["judge"]
    sz = ", signed zeros included" if j["signed_zero"] else ""
    head = {"exact": f"bit-exact{sz}",
            "tolerance": "within the tolerance of the output dtype (cases/tolerances.toml)",
            "bound": "within a per-element error bound from the inputs, plus max_ulp for the final rounding",
            "check": "an own check (not elementwise)" + (f"; bit-exact{sz}" if j["exact"] else "")}[j["kind"]]
    ints = j["kind"] in ("tolerance", "bound") and any(not dt.is_float(d) for d in f["dtypes"])
    ints_note = "; integer and bool outputs bit-exact" if ints else ""
    rows: list[Row] = [(0, "judge", f"{j['kind']}: {head}{ints_note}", "")]
    for k in ("bound", "check"):
        if j[k]:
            rows.append((1, k, f"{_short(j[k])}: {j[k]['reason'] or '(no reason given)'}",
                         j[k]["at"] or ""))
    for d, t in j["tolerances"].items():
        if "error" in t:
            rows.append((1, d, t["error"], ""))
            continue
        nums = ", ".join(f"{k} {t[k]:g}" for k in ("max_ulp", "rtol", "atol") if t[k] or k == "max_ulp")
        rows.append((1, d, f"{nums} ({t['source']}): {_one_line(t['reason'])}",
                     t["at"] or ""))
    return rows


def _oracle_rows(f: dict[str, Any]) -> list[Row]:
    p, onnx = f["oracles"]["precise"], f["oracles"]["onnx"]
    rows: list[Row] = []
    if p["available"]:
        rows.append((0, "precise", "MPFR oracle (exact result rounded once): accuracy budgets", p["at"] or ""))
        for d, b in p["budgets"].items():
            if "error" in b:
                rows.append((1, d, b["error"], ""))
                continue
            nums = f"{b['ulp']:g} ulp" + (f" + atol {b['atol']:g}" if b["atol"] else "") + (
                f" + {b['bound']:g} x bound" if b["bound"] is not None else "")
            reason = _one_line(b["reason"])
            if b["source"].startswith("accuracy.toml[low_precision]"):  # one long reason for all
                reason = "the float32 budget, capped by [low_precision] (computed in float32, rounded once)"
            rows.append((1, d, f"{nums}: {reason}", b["at"] or ""))
    else:
        rows.append((0, "precise", "no MPFR oracle" + (f": {p['why_not']}" if p["why_not"] else ""), ""))
    if onnx:
        inst = ", ".join(f"{m} {'installed' if ok else 'not installed'}" for m, ok in onnx["installed"].items())
        rows.append((0, "onnx", f"{onnx['op_type']} (opset {onnx['opset']}): {inst}", onnx["at"] or ""))
    else:
        rows.append((0, "onnx", "no ONNX oracle", ""))
    return rows


def _rule(fn: dict[str, Any]) -> str:
    """A reference rule by its name in its module, with the op's own functions it closes over."""
    wraps = ", ".join(w["function"].removeprefix("rlx_conformance.") for w in fn.get("wraps", []))
    return _short(fn) + (f" → {wraps}" if wraps else "")


def _rule_at(fn: dict[str, Any]) -> str:
    """Where a reference rule is written: a rule made by a factory (``unary_rule.<locals>.vjp``)
    is located by the op's own function it closes over, when that has a location."""
    if "<locals>" in (fn.get("qualname") or ""):
        own = next((w["at"] for w in fn.get("wraps", []) if w["at"]), None)
        if own:
            return own
    return fn["at"] or ""


def derivative_bound_text(bound: dict[str, Any]) -> str:
    """The derivative judge's allowance in one line (judge/bounds/derivative.py)."""
    u = "u of the result's dtype" if bound["native"] else "u of its compute dtype (float32 for 16-bit results)"
    text = f"gamma_(terms + {bound['rule']['roundings']})(u) x magnitude, {u}"
    if not bound["native"]:
        text += " (+ (terms + roundings) x its smallest subnormal where a term is nonzero: gradual underflow)"
    if bound["argument"]:
        text += f"; + gamma_{bound['argument']['roundings']}(u) x the argument sensitivity"
    if bound["overflow"]:
        text += "; order-dependent (+-inf, NaN legal) where the terms overflow"
    return text + "; + the dtype's max_ulp for the final rounding"


def _derivative_rows(f: dict[str, Any]) -> list[Row]:
    d = f["derivatives"]
    if not d["differentiable"]:
        return [(0, "derivative", f"none: {d['not_differentiable']}", "")]
    cases = d["matrix_error"] or ", ".join(f"{k} {n}" for k, n in d["cases"].items()) or "none"
    extra = f"; gradient values also {_list(d['grad_values'])}" if d["grad_values"] else ""
    rows: list[Row] = [(0, "derivative", f"in {', '.join(d['inputs'])}: {_list(d['kinds'])} "
                        f"(cases on one target: {cases}){extra}", "")]
    if d["convention"]:
        rows.append((1, "convention", d["convention"]["text"], d["convention"]["at"] or ""))
    ref = d["reference"]
    if ref is None:
        rows.append((1, "reference", "no reference rule registered (backends/cpu)", ""))
    else:
        for k in ("vjp", "jvp", "hvp"):
            if ref[k]:
                rows.append((1, k, f"reference {_rule(ref[k])}", _rule_at(ref[k])))
        m = ref["magnitude"]
        rows.append((1, "magnitude", _rule(m) if m else
                     "the dense Jacobian (Backend.run_magnitude: small cases only)", _rule_at(m) if m else ""))
    b = d["bound"]
    rows.append((1, "bound", derivative_bound_text(b) + (" (times the condition number)" if ref and ref["conditioned"]
                                                           else ""), ""))
    for key, label in (("rule", "roundings"), ("argument", "argument"), ("overflow", "overflow")):
        e = b[key]
        if e:
            rows.append((2, label, f"{e['table']} {e['roundings']}: {_one_line(e['reason'])}", e["at"] or ""))
    return rows


def _layout_graph_rows(f: dict[str, Any]) -> list[Row]:
    lay = f["layouts"]
    if lay["default"]:
        text = (f"--layouts default: {_list(lay['default'])} in {lay['dtype']} ({lay['cases']} cases on one "
                "target); --layouts all: every forward case in each")
        if lay["structured"]:
            text += "; no broadcast (inputs made by a generate hook)"
    else:
        text = lay["error"] or "none (no input has a layout to speak of)"
    rows: list[Row] = [(0, "layouts", text, "")]
    for g in f["graphs"]:
        vjp = ", VJP too" if g["vjp"] else ""
        rows.append((0, "graph", f"{g['graph']} (node {', '.join(g['nodes'])}{vjp}): {g['doc']}", g["at"] or ""))
    if not f["graphs"]:
        rows.append((0, "graph", "no graph of the graph library uses it", ""))
    return rows


def _divergence_rows(f: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for d in f["divergences"]:
        scope = " ".join(f"{k}={'|'.join(v) if isinstance(v, list) else v}"
                         for k, v in d["scope"].items()) or "every case"
        scope += ("" if d["strict"] else ", not strict") + (f", timeout {d['timeout']:g} s" if d["timeout"] else "")
        # the category as the label: keys are long, and would widen every section's labels
        rows.append((0, d["category"], f"{d['key']} ({scope}): {d['reason'].splitlines()[0]}", d["at"] or ""))
    if not rows:
        rows.append((0, "none", "no known divergence scopes this op", ""))
    return rows


def sections(facts: dict[str, Any]) -> list[tuple[str, list[Row]]]:
    """The screen, as (section title, rows)."""
    f = facts
    n = len(f["divergences"])
    return [("declaration", _declaration_rows(f)), ("kernels", _kernel_rows(f)),
            ("judge", _judge_rows(f)), ("oracles", _oracle_rows(f)),
            ("derivatives", _derivative_rows(f)), ("layouts and graphs", _layout_graph_rows(f)),
            (f"known divergences ({n})", _divergence_rows(f))]


def render(facts: dict[str, Any], console: Console | None = None) -> None:
    """Print ``facts`` (op_facts.op_facts) on ``console``: aligned columns cut to the width on
    a terminal, plain lines otherwise (no colour, nothing cut: for grep and for an issue)."""
    console = console or Console(highlight=False)
    secs = [(title, [("  " * (i + 1) + label, text, where) for i, label, text, where in rows])
            for title, rows in sections(facts)]
    every = [r for _, rows in secs for r in rows]
    lw = max(len(r[0]) for r in every)
    if not console.is_terminal:
        print(f"{facts['op']} — {facts['doc']}")
        for title, rows in secs:
            print(f"{title}:")
            for label, text, where in rows:
                print(f"{label.ljust(lw)}  {text}" + (f"  [{where}]" if where else ""))
        return
    ww = max(len(r[2]) for r in every)
    tw = max(20, min(max(len(r[1]) for r in every), console.width - lw - ww - 2))
    # Text, not markup: facts hold brackets and colons (``[n, n]``, ``id=*-tf32:on``) that
    # markup and emoji codes would eat
    console.print(Text.assemble((facts["op"], "bold"), " — ", facts["doc"]))
    for title, rows in secs:
        grid = Table.grid(padding=(0, 1))  # labels and locations whole; the fact cut to fit
        grid.add_column(no_wrap=True, style="bold", width=lw)
        grid.add_column(no_wrap=True, overflow="ellipsis", width=tw)
        grid.add_column(no_wrap=True, style="dim", width=ww)
        for label, text, where in rows:
            grid.add_row(Text(label), Text(text), Text(where))
        console.print(Text(title, style="cyan"))
        console.print(grid)


def to_json(facts: dict[str, Any]) -> str:
    return json.dumps(facts, indent=1)
