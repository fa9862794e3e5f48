"""JUnit XML from case records: one suite per target, outcomes as failure/error/skipped, errors
as properties, and text XML cannot hold replaced rather than written."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from grad_fixtures import derivative
from results_fixtures import result, write

from rlx_conformance.report import junit, records


def test_junit_document(tmp_path):
    rs = [result(n=1, ulp=2.0), result(outcome="fail", n=2, ulp=40.0, message="3/7 differ\ndetail \x00 byte"),
          result(outcome="crash", n=3, message="SIGSEGV"), result(outcome="xfail", n=4),
          result(outcome="skip", n=5, device="gpu"), result(outcome="xpass", n=6, mode="lazy")]
    rep = records.load(write(tmp_path / "r", rs))
    path = junit.write(tmp_path / "junit.xml", rep.cases)
    root = ET.parse(path).getroot()  # parses: the NUL byte did not make it into the XML
    assert root.tag == "testsuites" and root.get("tests") == "6"
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("2", "1", "2")
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert set(suites) == {"mlx-cpu-eager", "mlx-cpu-lazy", "mlx-gpu-eager"}
    eager = suites["mlx-cpu-eager"]
    assert (eager.get("tests"), eager.get("failures"), eager.get("errors"), eager.get("skipped")) == ("4", "1", "1", "1")
    cases = {tc.get("name"): tc for s in suites.values() for tc in s.findall("testcase")}
    assert set(cases) == {r.id for r in rs} and all(tc.get("classname") == "exp" for tc in cases.values())
    fail = cases[rs[1].id].find("failure")
    assert fail.get("type") == "fail" and fail.get("message") == "3/7 differ" and "\x00" not in fail.text
    assert cases[rs[2].id].find("error").get("type") == "crash"
    assert cases[rs[3].id].find("skipped").get("type") == "xfail"
    assert cases[rs[5].id].find("failure").get("type") == "xpass"
    assert cases[rs[0].id].find("failure") is None and cases[rs[0].id].find("error") is None
    props = {p.get("name"): p.get("value") for p in cases[rs[1].id].find("properties")}
    assert props["outcome"] == "fail" and float(props["max_ulp"]) == 40.0 and props["kernel"] == "native"


def test_derivative_cases_are_testcases_of_their_own_class(tmp_path):
    rs = [result(n=1), derivative("vjp", n=1, ulp=3.0, tolerance={"source": "derivative:default+2terms"}),
          derivative("jvp", n=1, outcome="fail", message="jvp output 0: 2/7 over the bound"),
          derivative("hvp", "softmax", n=2, outcome="xfail")]
    root = ET.parse(junit.write(tmp_path / "junit.xml", records.load(write(tmp_path / "r", rs)).cases)).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("skipped")) == ("4", "1", "1")
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    assert set(cases) == {r.id for r in rs}  # the forward and the VJP of one input set: two testcases
    assert [cases[r.id].get("classname") for r in rs] == ["exp", "exp:vjp", "exp:jvp", "softmax:hvp"]
    props = {p.get("name"): p.get("value") for p in cases[rs[1].id].find("properties")}
    assert props["grad"] == "vjp" and props["tolerance"] == "derivative:default+2terms" and float(props["max_ulp"]) == 3.0
    assert "grad" not in {p.get("name") for p in cases[rs[0].id].find("properties")}
    assert cases[rs[2].id].find("failure").get("message") == "jvp output 0: 2/7 over the bound"
