"""JUnit XML from case records, for CI systems that show test results: one <testsuite> per target,
one <testcase> per case (classname = op, or "op:KIND" for a derivative case, as
judge.stability.subject names it, e.g. "exp:vjp"; name = case id), outcomes mapped as pytest's junitxml
maps them (fail/xpass → failure, error/crash/timeout → error, skip and xfail → skipped), and the
measured errors as properties, so a CI test view shows the numbers without opening results.json."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.report.records import Record, subject, target

FAILURE = ("fail", "xpass")
ERROR = ("error", "crash", "timeout")
SKIPPED = ("skip", "xfail")
PROPERTIES = ("outcome", "grad", "kernel", "max_abs_err", "max_rel_err", "max_ulp", "stream",
              "oracle_ulp_ref", "oracle_ulp_target", "over_budget")


# Characters XML 1.0 cannot hold at all (a kernel's message may quote raw bytes).
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(s: str) -> str:
    return _BAD_XML.sub("\ufffd", s)


def _first_line(msg: str) -> str:
    lines = (msg or "").splitlines()
    return lines[0][:500] if lines else ""


def _testcase(rec: Record) -> ET.Element:
    tc = ET.Element("testcase", classname=subject(rec), name=rec["id"], time=f"{float(rec.get('duration_s') or 0):.6f}")
    props = ET.SubElement(tc, "properties")
    for k in PROPERTIES:
        if rec.get(k) not in (None, ""):
            ET.SubElement(props, "property", name=k, value=_xml_text(str(rec[k])))
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
    elif o == "skip":
        ET.SubElement(tc, "skipped", type="skip", message=_first_line(msg))
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
