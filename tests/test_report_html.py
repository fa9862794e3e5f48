"""The nightly end to end on a small real run (results.json, junit.xml, stats.json, diff.json,
report.html), the HTML's content from synthetic results, and the HTML as headless Chromium
renders it: the scoreboard is in the DOM and nothing is loaded from outside the file."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from results_fixtures import group, result, write
from rlx_conformance import cli, records, report_html
from rlx_conformance.diff import compare

OPS = ("add", "neg")


class Dom(HTMLParser):
    """Just enough of a DOM: every element's tag, attributes and ancestors, and style text."""

    def __init__(self, html: str):
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.stack: list[str] = []
        self.styles: list[str] = []
        self._in_style = False
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.elements.append((tag, a, tuple(self.stack)))
        if tag not in ("br", "meta", "input", "img", "link", "path", "use", "rect", "line", "stop"):
            self.stack.append(f"{tag}#{a['id']}" if "id" in a else tag)
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        while self.stack:
            if self.stack.pop().split("#")[0] == tag:
                break
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)

    def find(self, tag=None, **attrs):
        return [(t, a, anc) for t, a, anc in self.elements
                if (tag is None or t == tag) and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


EXTERNAL = re.compile(r"^\s*(https?:|//|ftp:|data:text/html)", re.I)


def external_refs(dom: Dom) -> list[str]:
    """Everything that would make the browser load something from outside the file."""
    bad = []
    for tag, a, _ in dom.elements:
        if tag in ("script", "link", "iframe", "img", "object", "embed", "video", "audio", "source"):
            if tag != "script" or a.get("src"):
                bad.append(f"<{tag} {a}>")
        for k in ("src", "srcset", "action", "poster", "data", "xlink:href"):
            if k in a and EXTERNAL.match(a[k]):
                bad.append(f"{tag} {k}={a[k]}")
        if tag != "a" and "href" in a and EXTERNAL.match(a["href"]):
            bad.append(f"{tag} href={a['href']}")
        if re.search(r"url\(\s*['\"]?(?!#)", a.get("style", "")):
            bad.append(f"{tag} style={a['style']}")
    css = "\n".join(dom.styles)
    bad += re.findall(r"@import[^;]*|url\(\s*['\"]?(?!#)[^)]*\)", css)
    return bad


# -- the nightly on a small real run -----------------------------------------------------------------
@pytest.fixture(scope="module")
def nightly(tmp_path_factory):
    root = tmp_path_factory.mktemp("nightly")
    report, lock = root / "report", root / "lock.toml"
    argv = ["nightly", "--op", ",".join(OPS), "--dtypes", "float32,int32", "--mode", "eager", "--device", "cpu",
            "--workers", "0", "--report", str(report), "--baseline", str(root / "no-baseline"),
            "--lock", str(lock), "--update-lock", "--no-progress"]
    rc = cli.main(argv)
    return rc, report, lock


def test_nightly_writes_the_report_dir(nightly):
    rc, report, lock = nightly
    assert {p.name for p in report.iterdir()} >= {"results.json", "junit.xml", "stats.json", "diff.json", "report.html"}
    rep = records.load(report)
    assert {c["op"] for c in rep.cases} == set(OPS) and {c["dtype"] for c in rep.cases} == {"float32", "int32"}
    diff = json.loads((report / "diff.json").read_text())
    assert diff["base"] is None and diff["counts"]["added"] == len(rep.cases)
    bad = [c for c in rep.cases if records.is_bad(c["outcome"])]
    assert rc == (1 if bad else 0) and diff["regression"] == bool(bad)
    groups = {records.key_str(records.group_key(c)) for c in rep.cases if c["outcome"] == "pass"}
    assert "add/int32/mlx-cpu-eager" in groups and set(lockfile_groups(lock)) == groups
    stats = json.loads((report / "stats.json").read_text())["groups"]
    assert stats["neg/float32/mlx-cpu-eager"]["cases"] == sum(
        1 for c in rep.cases if c["op"] == "neg" and c["dtype"] == "float32")


def lockfile_groups(path: Path) -> list[str]:
    from rlx_conformance import lockfile

    return [records.key_str(k) for k in lockfile.load(path)]


def test_real_run_html(nightly):
    _, report, _ = nightly
    html = (report / "report.html").read_text()
    dom = Dom(html)
    rows = dom.find("tr")
    ops = {a["data-op"] for t, a, anc in rows if "data-op" in a and "section#scoreboard" in anc}
    assert ops == set(OPS)
    rep = records.load(report)
    assert f"{len(rep.cases)} cases" in html
    cells = [a for t, a, anc in dom.find("td") if "c" in a.get("class", "").split()]
    assert len(cells) == len({records.group_key(c) for c in rep.cases})  # one cell per op × dtype × target
    assert all(re.search(r"\d+ (pass|fail|xfail|skip|error|crash|timeout|xpass|contract)", a["title"]) for a in cells)
    assert dom.find("section", id="diff") and dom.find("section", id="lock")
    assert dom.find("svg") and not external_refs(dom)


# -- content, from synthetic results -----------------------------------------------------------------
@pytest.fixture
def synthetic(tmp_path):
    div = {"entry": 7, "category": "precision", "reason": "MLX exp is 14 ulp off", "link": None}
    rs = (group("exp", "float32", [1.0, 3.0])
          + [result("exp", "float32", "xfail", n=40, ulp=900.0, divergence=div),
             result("exp", "float16", "fail", n=41, ulp=1e4, message="output 0: 3/7 elements differ\nmore"),
             result("exp", "float16", "crash", n=42, ulp=None, message="worker process died (SIGSEGV)"),
             result("add", "int32", "pass", n=3, kernel="delegated"),
             result("add", "float32", "pass", n=3, mode="lazy"),
             result("neg", "float32", "skip", n=3, device="gpu", message="no gpu")])
    report = write(tmp_path / "rep", rs, run={"start": "2026-02-03T04:05:06+00:00", "mlx": "0.32.4",
                                              "python": "3.11.7", "targets": [], "mlx_enable_tf32": "0"})
    fail_id = result("exp", "float16", "fail", n=41).id
    repro = report / "repro" / "bundle-of-the-fail"
    repro.mkdir(parents=True)
    (repro / "repro.py").write_text("print('repro')\n")
    doc = json.loads((report / "results.json").read_text())
    for c in doc["cases"]:
        if c["id"] == fail_id:
            c["repro"] = "repro/bundle-of-the-fail"
    (report / "results.json").write_text(json.dumps(doc))
    return report, rs


def test_html_content(synthetic, tmp_path):
    report, rs = synthetic
    base = write(tmp_path / "base", [result("exp", "float16", "pass", n=41, ulp=0.0)] + group("exp", "float32", [1.0, 3.0]))
    rep = records.load(report)
    d = compare(records.load(base), rep)
    out = report_html.write(rep, report / "report.html", diff=d)
    html = out.read_text()
    dom = Dom(html)
    tables = {a["data-family"] for t, a, anc in dom.find("table") if "data-family" in a}
    assert {"activation", "binary"} <= tables
    # exp: float32 cell is the worst of pass+xfail; float16 is crash (worse than fail)
    titles = {a["title"].split(":")[0]: a for t, a, _ in dom.find("td") if "c" in a.get("class", "").split()}
    assert "o-xfail" in titles["exp · float32 · mlx-cpu-eager"]["class"]
    assert "o-crash" in titles["exp · float16 · mlx-cpu-eager"]["class"]
    assert "dlg" in titles["add · int32 · mlx-cpu-eager"]["class"]  # delegated kernel marked
    assert "dlg" not in titles["add · float32 · mlx-cpu-lazy"]["class"]
    assert "o-skip" in titles["neg · float32 · mlx-gpu-eager"]["class"]
    # blank cells: add has no float32 case on mlx-cpu-eager
    assert "add · float32 · mlx-cpu-eager" not in titles
    # failures table: both bad exp cases, the fail with its repro link; the first line of the message
    fail_rows = [a for t, a, anc in dom.find("tr") if a.get("id", "").startswith("f") and "section#failures" in anc]
    assert len(fail_rows) == 2
    assert 'href="repro/bundle-of-the-fail/repro.py"' in html and "output 0: 3/7 elements differ" in html
    # known divergence with its counts, linked from its xfail cell
    assert dom.find("tr", id="div7") and "MLX exp is 14 ulp off" in html
    # the diff: the float16 case went pass -> fail; the crash is new
    assert "New failures (2)" in html and "regression vs baseline" in html
    assert "TF32" in html and "mlx_enable_tf32: 0" in html
    assert not external_refs(dom)


def test_report_command(synthetic, tmp_path, capsys):
    report, _ = synthetic
    out = tmp_path / "elsewhere" / "r.html"
    assert cli.main(["report", str(report / "results.json"), "--out", str(out), "--no-lock", "--no-plots"]) == 0
    html = out.read_text()
    assert "section" in html and 'id="diff"' not in html and "<svg" not in html
    # the repro link is relative to where the HTML went
    assert 'href="../rep/repro/bundle-of-the-fail/repro.py"' in html
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    capsys.readouterr()


def test_external_ref_check_catches_resources():
    dom = Dom('<link rel="stylesheet" href="https://x/y.css"><img src="//cdn/x.png"><style>a{background:url(http://x)}</style>'
              '<a href="https://tracker/1">bug</a><a href="#f1"></a>')
    bad = external_refs(dom)
    for what in ("y.css", "cdn/x.png", "url(http://x)"):
        assert any(what in b for b in bad), what
    assert not any("tracker" in b or "#f1" in b for b in bad)  # navigation links load nothing


# -- headless Chromium ----------------------------------------------------------------------------------
def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def test_chromium_renders_the_scoreboard(nightly, tmp_path):
    exe = _chromium()
    if exe is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed, and CI is set: .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    _, report, _ = nightly
    page = (report / "report.html").resolve()
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = Dom(p.stdout)
    assert dom.find("section", id="scoreboard"), "no scoreboard in the rendered DOM"
    ops = {a["data-op"] for t, a, anc in dom.find("tr") if "data-op" in a and "section#scoreboard" in anc}
    assert ops == set(OPS)
    assert dom.find("svg"), "plots missing from the rendered DOM"
    assert not external_refs(dom)
