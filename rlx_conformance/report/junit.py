"""JUnit XML from case records, for CI systems that show test results: one <testsuite> per target,
one <testcase> per case (classname = op, or "op:KIND" for a derivative case, as
judge.stability.subject names it, e.g. "exp:vjp"; a graph case's op is "graph:NAME"; a layout
case's classname adds its id segment, "exp/layout:transposed", so a CI view groups a layout's cases
apart from the contiguous ones; name = case id), outcomes mapped as pytest's junitxml
maps them (fail/xpass → failure, error/crash/timeout → error, skip and xfail → skipped; not-run, a
case the runner stopped after its kernel's consecutive crashes or timeouts, → skipped too), and the
measured errors as properties (a layout case's layout, a graph case's graph name and node count
too), so a CI test view shows the numbers without opening results.json."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.report.records import Record, subject, target

FAILURE = ("fail", "xpass")
ERROR = ("error", "crash", "timeout")
SKIPPED = ("skip", "xfail", "not-run")
PROPERTIES = ("outcome", "grad", "layout", "kernel", "max_abs_err", "max_rel_err", "max_ulp", "stream",
              "oracle_ulp_ref", "oracle_ulp_target", "over_budget")


# Characters XML 1.0 cannot hold at all (a kernel's message may quote raw bytes).
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(s: str) -> str:
    return _BAD_XML.sub("\ufffd", s)


def _first_line(msg: str) -> str:
    lines = (msg or "").splitlines()
    return lines[0][:500] if lines else ""


def classname(rec: Record) -> str:
    """The testcase's classname: the record's subject ("exp", "exp:vjp", "graph:swiglu"), and a
    layout case's layout as its id spells it ("exp/layout:transposed")."""
    return subject(rec) + (f"/layout:{rec['layout']}" if rec.get("layout") else "")


def _testcase(rec: Record) -> ET.Element:
    tc = ET.Element("testcase", classname=classname(rec), name=rec["id"],
                    time=f"{float(rec.get('duration_s') or 0):.6f}")
    props = ET.SubElement(tc, "properties")
    for k in PROPERTIES:
        if rec.get(k) not in (None, ""):
            ET.SubElement(props, "property", name=k, value=_xml_text(str(rec[k])))
    if str(rec.get("op") or "").startswith(GRAPH_PREFIX):
        ET.SubElement(props, "property", name="graph", value=rec["op"].removeprefix(GRAPH_PREFIX))
        nodes = (rec.get("graph") or {}).get("nodes") if isinstance(rec.get("graph"), dict) else None
        if nodes is not None:
            ET.SubElement(props, "property", name="graph_nodes", value=str(nodes))
    tol = rec.get("tolerance") or {}
    if tol.get("source"):
        ET.SubElement(props, "property", name="tolerance", value=str(tol["source"]))
    o, msg = rec.get("outcome"), _xml_text(rec.get("message") or "")
    if o in FAILURE:
        ET.SubElement(tc, "failure", type=o, message=_first_line(msg)).text = msg
    elif o in ERROR:
        ET.SubElement(tc, "error", type=o, message=_first_line(msg)).text = msg
    elif o == "xfail":
        ET.SubElement(tc, "skipped", type="xfail", message=_first_line(msg))
    elif o in SKIPPED:  # skip, not-run
        ET.SubElement(tc, "skipped", type=o, message=_first_line(msg))
    return tc


def build(cases: list[Record], name: str = "rlx-conformance") -> ET.ElementTree:
    by_target: dict[str, list[Record]] = defaultdict(list)
    for r in cases:
        by_target[target(r)].append(r)
    root = ET.Element("testsuites", name=name)
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    total_time = 0.0
    for tgt in sorted(by_target):
        recs = by_target[tgt]
        outcomes = [r.get("outcome") for r in recs]
        counts = {"tests": len(recs), "failures": sum(o in FAILURE for o in outcomes),
                  "errors": sum(o in ERROR for o in outcomes), "skipped": sum(o in SKIPPED for o in outcomes)}
        t = sum(float(r.get("duration_s") or 0) for r in recs)
        suite = ET.SubElement(root, "testsuite", name=tgt, time=f"{t:.3f}", **{k: str(v) for k, v in counts.items()})
        suite.extend(_testcase(r) for r in recs)
        for k in totals:
            totals[k] += counts[k]
        total_time += t
    root.attrib.update({k: str(v) for k, v in totals.items()}, time=f"{total_time:.3f}")
    return ET.ElementTree(root)


def write(path: Path, cases: list[Record]) -> Path:
    tree = build(cases)
    ET.indent(tree, space=" ")
    atomic_write_text(path, ET.tostring(tree.getroot(), encoding="unicode", xml_declaration=True) + "\n")
    return path
