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
from grad_fixtures import derivative, dgroup
from results_fixtures import group, result, write

from rlx_conformance.cli import main as cli
from rlx_conformance.report import html as report_html
from rlx_conformance.report import lockfile, records
from rlx_conformance.report.diff import compare
from rlx_conformance.report.lockfile import Entry, Lock

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
            "--lock", str(lock), "--update-lock", "--no-progress", "--grad", "none"]
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
    assert "add/int32/mlx-cpu-eager" in groups and lockfile_covers(lock, groups)
    stats = json.loads((report / "stats.json").read_text())["groups"]
    assert stats["neg/float32/mlx-cpu-eager"]["cases"] == sum(
        1 for c in rep.cases if c["op"] == "neg" and c["dtype"] == "float32")


def lockfile_covers(path: Path, groups: set[str]) -> bool:
    """--update-lock covered the run's one target: every group it ran is locked (at 0 unless a line says otherwise)."""
    lock = lockfile.load(path)
    return lock.targets == {"mlx-cpu-eager"} and all(records.parse_key(g) in lock for g in groups)


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
    div = {"entry": "mlx-cpu-float32-exp-ulp", "category": "precision", "reason": "MLX exp is 14 ulp off",
           "link": None}
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
    assert dom.find("tr", id="divmlx-cpu-float32-exp-ulp") and "MLX exp is 14 ulp off" in html
    # the diff: the float16 case went pass -> fail; the crash is new
    assert "New failures (2)" in html and "regression vs baseline" in html
    assert "TF32" in html and "mlx_enable_tf32: 0" in html
    assert not external_refs(dom)


def test_html_shows_excused_cases_apart(tmp_path):
    """Newly excused cases, the excused cases' error drift and statistics, and the lock's groups
    and lines above their accuracy budget each have their own place in the HTML."""
    div = {"entry": "mlx-cpu-float32-exp-ulp", "category": "precision", "reason": "r", "link": None, "was": "fail"}
    base = write(tmp_path / "base", group("exp", "float32", [1.0, 3.0])
                 + [result("exp", "float32", "xfail", n=40, ulp=9.0, divergence=div),
                    result("add", "int32", "pass", n=3)])
    new = write(tmp_path / "new", group("exp", "float32", [1.0, 3.0])
                + [result("exp", "float32", "xfail", n=40, ulp=900.0, divergence=div),
                   result("add", "int32", "xfail", n=3, ulp=5.0, divergence=div)])
    rep = records.load(new)
    d = compare(records.load(base), rep)
    assert d.newly_excused and d.excused_drift and d.excused_distribution_drift and d.regression
    lock = lockfile.check(Lock({"mlx-cpu-eager"}, {("softmax", "float32", "mlx-cpu-eager"): Entry(5.5e6, 1.0)}),
                          {("softmax", "float32", "mlx-cpu-eager"): Entry(5.5e6, 1.0, over_budget=3)})
    html = report_html.write(rep, tmp_path / "r.html", diff=d, lock=lock, with_plots=False).read_text()
    assert "Newly excused (1" in html and result("add", "int32", n=3).id in html
    assert "Excused error drift (1" in html and "Excused distribution drift (1" in html
    assert "Lock lines above their accuracy budget" in html and "3 passing case(s) over the accuracy budget" in html
    assert "excused max ulp" in html  # the statistics' excused columns
    assert any("drift" in a.get("class", "").split() for _, a, _ in Dom(html).find("tr"))  # exp's excused drift


def test_html_derivative_panel(tmp_path):
    """Derivative records get their own panel (op × derivative × dtype: a cell per target,
    counts, worst errors); the forward scoreboard, the failures and the statistics keep them apart."""
    div = {"entry": "mlx-relu-vjp-kink", "category": "convention", "reason": "MLX's relu'(0) = 1",
           "link": None, "was": "fail"}
    rs = (group("exp", "float32", [1.0, 2.0])
          + dgroup("vjp", "exp", "float32", [3.0, 5.0]) + dgroup("vjp", "exp", "float32", [4.0], mode="lazy")
          + [derivative("vjp", "exp", "float32", "fail", n=9, ulp=900.0, rel=0.5, message="vjp input 0: 1/9 over")]
          + dgroup("jvp", "exp", "float16", [1.0])
          + [derivative("vjp", "relu", "float32", "xfail", n=3, ulp=7.0, divergence=div),
             derivative("hvp", "softmax", "float32", "pass", n=4, ulp=2.0, rel=1e-6)])
    rep = records.load(write(tmp_path / "rep", rs))
    html = report_html.write(rep, tmp_path / "r.html", with_plots=False).read_text()
    dom = Dom(html)
    # the forward scoreboard: exp alone, its float32 cell from the two forward passes only
    board = [a for t, a, anc in dom.find("td") if "c" in a.get("class", "").split() and "section#scoreboard" in anc]
    assert [a["title"] for a in board] == ["exp · float32 · mlx-cpu-eager: 2 pass"]
    rows = {(a["data-op"], a["data-grad"], a["data-dtype"]): a for t, a, anc in dom.find("tr")
            if "data-grad" in a and "section#derivatives" in anc}
    assert set(rows) == {("exp", "vjp", "float32"), ("exp", "jvp", "float16"), ("relu", "vjp", "float32"),
                         ("softmax", "hvp", "float32")}
    assert rows[("exp", "vjp", "float32")]["data-worst"] == "fail"
    assert rows[("relu", "vjp", "float32")]["data-worst"] == "xfail"
    cells = {a["title"] for t, a, anc in dom.find("td") if "c" in a.get("class", "").split()
             and "section#derivatives" in anc}
    assert cells == {"exp:vjp · float32 · mlx-cpu-eager: 1 fail, 2 pass", "exp:vjp · float32 · mlx-cpu-lazy: 1 pass",
                     "exp:jvp · float16 · mlx-cpu-eager: 1 pass", "relu:vjp · float32 · mlx-cpu-eager: 1 xfail",
                     "softmax:hvp · float32 · mlx-cpu-eager: 1 pass"}
    view = {(r.op, r.grad, r.dtype): r for r in report_html.derivative_board(rep.cases, ["mlx-cpu-eager",
                                                                                          "mlx-cpu-lazy"], {})}
    exp_vjp = view[("exp", "vjp", "float32")]
    assert exp_vjp.counts == [("fail", 1), ("pass", 3)] and exp_vjp.max_ulp == 5.0  # the failure's 900 is its outcome
    assert view[("relu", "vjp", "float32")].max_ulp == 7.0 and view[("relu", "vjp", "float32")].family == "activation"
    # the failure is listed under its derivative, linked from its derivative cell
    fails = [a for t, a, anc in dom.find("tr") if a.get("id", "").startswith("f") and "section#failures" in anc]
    assert len(fails) == 1 and "exp:vjp" in _section_text(html, "failures")
    assert any(a.get("href") == "#f0" for t, a, anc in dom.find("a") if "section#derivatives" in anc)
    # statistics and histograms: the derivative groups are their own rows and families
    stats_text = _section_text(html, "stats")
    assert "exp:vjp" in stats_text and "softmax:hvp" in stats_text
    assert report_html.stats.ulps_by_family(rep.cases) == {
        "activation": [1.0, 2.0], "activation · jvp": [1.0], "activation · vjp": [3.0, 5.0, 4.0], "reduce · hvp": [2.0]}
    assert "relu:vjp" in _section_text(html, "divergences")
    # no derivative records: no panel
    fwd = report_html.write(records.load(write(tmp_path / "fwd", group("exp", "float32", [1.0]))),
                            tmp_path / "f.html", with_plots=False).read_text()
    assert 'id="derivatives"' not in fwd and 'id="scoreboard"' in fwd
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


# -- bit-stability, oracle verdicts, the exhaustive sweep -------------------------------------------
B4 = {"ulp": 4.0, "atol": 0.0, "bound": None, "source": "accuracy.toml#1:exp"}


def exhaustive_doc(failed: bool = True) -> dict:
    def row(outcome, target, **kw):
        return {"op": "exp", "attrs": {}, "dtype": "bfloat16", "target": target, "outcome": outcome,
                "n": 65536, "checked": 65530, "max_ulp": 0.0, "over_budget": 0, "nan_mismatch": 0,
                "inf_mismatch": 0, "signed_zero_mismatch": 0, "signed_zero_asserted": False,
                "budget": {"ulp": 1.0, "atol": 0.0, "bound": None, "source": "accuracy.toml#2"}, "worst": [], **kw}
    rows = [row("pass", "cpu-cpu-eager"),
            row("xfail", "mlx-cpu-eager", max_ulp=66.0, over_budget=9, inf_mismatch=1,
                divergence={"entry": "exhaustive-cpu-bfloat16-exp-subnormal-flush", "category": "precision",
                            "reason": "float32 exp overflows at 88.5"},
                worst=[{"input": "0x42b1", "ulp": 51.0}, {"input": "0xc2b0", "ulp": 66.0}])]
    if failed:
        rows.append(row("fail", "mlx-cpu-lazy", max_ulp=1234.0, over_budget=17, nan_mismatch=2, signed_zero_mismatch=3,
                        signed_zero_asserted=True, worst=[{"input": "0x7bff", "ulp": 1234.0}]))
    summary = {o: sum(r["outcome"] == o for r in rows) for o in ("pass", "fail", "xfail")}
    return {"schema": "rlx-conformance/exhaustive/v1", "run": {"wall_s": 1.5, "dtypes": ["bfloat16"]},
            "summary": summary | {"total": len(rows)}, "failed": failed, "rows": rows}


@pytest.fixture
def extras(tmp_path):
    """Cases with output digests (two modes of exp disagree, add's repeats disagree), a case failed by
    a bit-stability check, oracle verdicts (one reference bug), and exhaustive.json beside them."""
    ref_bug = "reference bug: the CPU reference of exp/float32 is farther from the correctly rounded result"
    rs = [result("exp", "float32", "pass", n=1, output_digest="aa", oracle_verdict="ok", oracle_ulp_ref=0.5,
                 oracle_ulp_target=1.0, over_budget=0, budget=B4),
          result("exp", "float32", "pass", n=1, mode="lazy", output_digest="bb", oracle_verdict="target-over-budget",
                 oracle_ulp_ref=1.0, oracle_ulp_target=40.0, over_budget=5, budget=B4),
          result("exp", "float32", "error", n=2, output_digest="cc", oracle_verdict="reference-bug",
                 oracle_ulp_ref=300.0, oracle_ulp_target=2.0, over_budget=0, over_budget_ref=3, budget=B4, message=ref_bug),
          result("neg", "float32", "fail", n=3, output_digest="dd", message="bit-stability: mode eager disagrees bit-wise"),
          result("neg", "float32", "pass", n=3, mode="lazy", output_digest="dd"),
          result("add", "float32", "pass", n=4, output_digest="x1", repeat_digests=["x1", "x2"])]
    report = write(tmp_path / "rep", rs)
    (report / "exhaustive.json").write_text(json.dumps(exhaustive_doc()))
    return report


def _section_text(html: str, sid: str) -> str:
    i = html.index(f'<section class="card" id="{sid}">')
    return html[i:html.index("</section>", i)]


def test_html_stability_oracle_exhaustive(extras):
    out = report_html.write(records.load(extras), extras / "report.html")
    html = out.read_text()
    dom = Dom(html)
    navs = {a.get("href") for t, a, anc in dom.find("a") if "nav" in anc}
    assert {"#stability", "#oracle", "#exhaustive"} <= navs
    # bit-stability: counts per class, the two mode-dependent groups and the nondeterministic one
    st = _section_text(html, "stability")
    tiles = {a["data-class"]: a for t, a, anc in dom.find("div") if "data-class" in a}
    assert set(tiles) == {"bit-stable", "mode-dependent", "nondeterministic", "unknown"}
    for cls, n in (("bit-stable", 2), ("mode-dependent", 2), ("nondeterministic", 1), ("unknown", 0)):
        assert re.search(rf'data-class="{cls}"><div class="n">{n}</div>', st), cls
    groups = [a["data-class"] for t, a, anc in dom.find("tr") if "data-class" in a and "table#stability-groups" in anc]
    assert sorted(groups) == ["mode-dependent", "mode-dependent", "nondeterministic"]
    assert groups[0] == "nondeterministic"  # listed first
    assert "cases that failed a bit-stability check: 1" in st
    assert result("exp", "float32", n=1, mode="lazy").id in st  # an example id
    # oracle: counts per verdict, exp over budget with its worst ULPs and budget, the red block
    orc = _section_text(html, "oracle")
    for v, n in (("ok", 1), ("target-over-budget", 1), ("supports-reference", 0), ("both-within-budget", 0),
                 ("reference-bug", 1)):
        assert re.search(rf'data-verdict="{v}"><div class="n">{n}</div>', orc), v
    over = [a["data-op"] for t, a, anc in dom.find("tr") if "data-op" in a and "table#oracle-over" in anc]
    assert over == ["exp"]
    row = re.search(r'<tr data-op="exp"><td class="mono">exp</td>(.*?)</tr>', orc).group(1)
    assert re.findall(r">([^<>]+)</td>", row)[:4] == ["1 / 3", "40", "300", "4"]
    assert dom.find("div", id="reference-bugs") and "1 reference bug" in html and "exp/float32</code> (1)" in orc
    assert result("exp", "float32", n=2).id in orc
    # exhaustive: failing row first, xfail with its divergence's reason, hex inputs and mismatch counts
    ex = _section_text(html, "exhaustive")
    order = [a["data-outcome"] for t, a, anc in dom.find("tr") if "data-outcome" in a]
    assert order == ["fail", "xfail", "pass"]
    assert "1234 / 1" in ex and "17" in ex and "2 / 0 / 3<" in ex and "0 / 1 / 0*" in ex
    assert "0x7bff (1234 ulp)" in ex and "0x42b1 (51 ulp), 0xc2b0 (66 ulp)" in ex
    assert "exhaustive-cpu-bfloat16-exp-subnormal-flush (precision): float32 exp overflows at 88.5" in ex
    assert "exhaustive sweep failed" in html
    assert not external_refs(dom)


def test_report_command_picks_up_exhaustive_json(extras, tmp_path):
    out = tmp_path / "r.html"
    assert cli.main(["report", str(extras), "--out", str(out), "--no-lock", "--no-plots"]) == 0
    assert 'id="exhaustive"' in out.read_text()
    (extras / "exhaustive.json").write_text(json.dumps(exhaustive_doc(failed=False)))
    assert cli.main(["report", str(extras), "--out", str(out), "--no-lock", "--no-plots"]) == 0
    html = out.read_text()
    assert 'data-outcome="fail"' not in html and "exhaustive sweep failed" not in html


def test_new_sections_absent_without_their_data(synthetic):
    """An older results.json: no stability section, no oracle fields, no exhaustive.json."""
    report, _ = synthetic
    doc = json.loads((report / "results.json").read_text())
    doc.pop("stability", None)
    for c in doc["cases"]:
        for k in ("oracle_verdict", "oracle_ulp_ref", "oracle_ulp_target", "over_budget", "budget", "output_digest"):
            c.pop(k, None)
    (report / "results.json").write_text(json.dumps(doc))
    html = report_html.render(records.load(report), with_plots=False)
    for sid in ("stability", "oracle", "exhaustive"):
        assert f'id="{sid}"' not in html and f'href="#{sid}"' not in html, sid
    assert "reference bug" not in html


def test_nightly_renders_the_sweep_it_ran(tmp_path, monkeypatch):
    """The sweep runs before report.html is written, the HTML shows it, and a failed row fails the nightly."""
    from rlx_conformance.cli import nightly

    def fake(targets, ops=None, dtypes=None, report_dir=None, **kw):
        doc = exhaustive_doc()
        (Path(report_dir) / "exhaustive.json").write_text(json.dumps(doc))
        return doc

    monkeypatch.setattr(nightly, "run_exhaustive", fake)  # the name nightly calls
    report = tmp_path / "report"
    rc = cli.main(["nightly", "--op", "neg", "--dtypes", "float16", "--mode", "eager", "--device", "cpu",
                   "--workers", "0", "--report", str(report), "--baseline", str(tmp_path / "none"),
                   "--no-lock", "--no-progress"])
    bad = any(records.is_bad(c["outcome"]) for c in records.load(report).cases)
    assert rc == 1 and not bad  # the sweep's failed row alone fails the nightly
    html = (report / "report.html").read_text()
    assert 'id="exhaustive"' in html and "0x7bff (1234 ulp)" in html
