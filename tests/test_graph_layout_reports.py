"""Graph and layout cases in every report (issue 17 item 9): the HTML report's graphs panel (and the
scoreboard and layouts panel leaving graphs to it), JUnit classnames and properties, the baseline
diff naming a regressed case's layout or graph and judging a subset's layout and graph cases by
its recorded selection, the tolerance lock's graph groups, and the pytest plugin's --rlx-layouts
and --rlx-graphs against ``rlx-conformance list``.

The records are made from matrix.Case and CaseResult (results_fixtures.write), so a schema change
shows up here; the plugin tests collect in a fresh pytest process, as a user's session would."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from results_fixtures import result, write
from test_report_html import Dom, external_refs

from rlx_conformance.cli import main as cli
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate import matrix
from rlx_conformance.report import html as report_html
from rlx_conformance.report import junit, lockfile, records
from rlx_conformance.report.diff import Selection, compare
from rlx_conformance.report.stats import op_family

TARGETS = [f"mlx-cpu-{m}" for m in ("eager", "lazy", "compiled")]


def graph_rec(name: str, mode: str, outcome: str = "pass", *, n: int = 4, digest: str = "d0", ulp: float = 1.0,
              dtype: str = "float32", nodes: int = 3, **kw) -> CaseResult:
    """A graph case's record (op ``graph:NAME``, one input of shape (n,)) in ``mode``, with an
    output digest (what the modes' agreement is read from)."""
    case = matrix.Case(f"graph:{name}", dtype, ((n,),), "small", (), "random", matrix.Target("mlx", "cpu", mode))
    return CaseResult.for_case(case, outcome, max_ulp=ulp, max_rel_err=ulp * 2.0 ** -23, max_abs_err=0.0,
                               output_digest=digest, graph={"nodes": nodes}, **kw)


def layout_rec(op: str, layout: str, outcome: str = "pass", *, n: int = 7, mode: str = "eager", ulp: float = 0.0,
               **kw) -> CaseResult:
    case = matrix.Case(op, "float32", ((n,),), "odd", (), "random", matrix.Target("mlx", "cpu", mode), layout=layout)
    return CaseResult.for_case(case, outcome, max_ulp=ulp, max_rel_err=ulp * 2.0 ** -23, max_abs_err=0.0, **kw)


# -- HTML --------------------------------------------------------------------------------------------
@pytest.fixture
def graph_run(tmp_path):
    """Two graphs in three modes: "mlp"'s first input bit-identical across modes, its second
    different bits that all pass; "attn"'s input fails compiled (a repro bundle beside it), and an
    op's contiguous and transposed cases."""
    rs = ([graph_rec("mlp", m, n=4, digest="same") for m in ("eager", "lazy", "compiled")]
          + [graph_rec("mlp", m, n=5, digest=f"bits-{m}") for m in ("eager", "lazy", "compiled")]
          + [graph_rec("attn", "eager", n=6, digest="a"), graph_rec("attn", "lazy", n=6, digest="a"),
             graph_rec("attn", "compiled", "fail", n=6, digest="b", ulp=9e5, message="output 0: 3/24 over the bound")]
          + [graph_rec("attn", "eager", n=6, dtype="float16", digest="h", nodes=3)]
          + [result("exp", n=7), layout_rec("exp", "transposed", n=7), layout_rec("exp", "reversed", "fail", n=7)])
    report = write(tmp_path / "rep", rs, run={"start": "2026-03-01T00:00:00+00:00", "targets": TARGETS})
    fail = rs[8]
    (report / "repro" / "attn-bundle").mkdir(parents=True)
    (report / "repro" / "attn-bundle" / "repro.py").write_text("print('minimal graph')\n")
    doc = json.loads((report / "results.json").read_text())
    for c in doc["cases"]:
        if c["id"] == fail.id:
            c["repro"] = "repro/attn-bundle"
    (report / "results.json").write_text(json.dumps(doc))
    return report, rs


def test_mode_agreement_from_digests_and_outcomes(graph_run):
    _, rs = graph_run
    recs = [r.to_json() for r in rs]
    mlp = report_html.mode_agreement([r for r in recs if r["op"] == "graph:mlp"])
    assert mlp == {"mlx-cpu": {"bit-identical": 1, "within-bound": 1, "divergent": 0}}
    attn = report_html.mode_agreement([r for r in recs if r["op"] == "graph:attn"])
    assert attn == {"mlx-cpu": {"bit-identical": 0, "within-bound": 0, "divergent": 1}}  # float16: one mode only
    # the same digests on two devices are two comparisons, never one
    gpu = [dict(r, device="gpu") for r in recs if r["op"] == "graph:mlp"]
    assert set(report_html.mode_agreement([r for r in recs if r["op"] == "graph:mlp"] + gpu)) == {"mlx-cpu", "mlx-gpu"}


def test_html_graphs_panel(graph_run):
    report, rs = graph_run
    rep = records.load(report)
    html = report_html.write(rep, report / "report.html", with_plots=False).read_text()
    dom = Dom(html)
    assert any(a.get("href") == "#graphs" for _, a, _ in dom.find("a"))
    rows = {a["data-graph"]: a for _, a, anc in dom.find("tr") if "data-graph" in a and "section#graphs" in anc}
    assert set(rows) == {"mlp", "attn"}
    assert rows["mlp"]["data-worst"] == "pass" and rows["attn"]["data-worst"] == "fail"
    cells = {a["title"] for _, a, anc in dom.find("td") if "c" in a.get("class", "").split() and "section#graphs" in anc}
    assert "graph:attn · mlx-cpu-compiled: 1 fail" in cells and "graph:attn · mlx-cpu-eager: 2 pass" in cells
    assert "graph:mlp · mlx-cpu-lazy: 2 pass" in cells
    # the compiled cell links to the failure's row, and the row to its repro bundle
    _, anchors, _ = report_html.failures(rep.cases, report, report)
    fail = next(r for r in rs if r.outcome == "fail" and r.op == "graph:attn")
    href = anchors[("graph:attn", "float32", "mlx-cpu-compiled")]
    assert dom.find("tr", id=href[1:]) and fail.id in html
    assert [a.get("href") for _, a, anc in dom.find("a") if "section#graphs" in anc and a.get("href", "").startswith("#")] \
        == [href]
    assert any(a.get("href") == "repro/attn-bundle/repro.py" for _, a, anc in dom.find("a") if "section#graphs" in anc)
    # each row its worst agreement of modes, and its groups' worst bit-stability class
    assert sorted(a["data-agreement"] for _, a, anc in dom.find("div") if "data-agreement" in a) == [
        "divergent", "within-bound"]
    assert [a["data-stability"] for _, a, anc in dom.find("span") if "data-stability" in a] == [
        "mode-dependent", "mode-dependent"]  # the run's classify: some digests differ between modes
    view = {r.graph: r for r in report_html.graph_board(rep.cases, TARGETS, {}, rep.stability)}
    assert [m["class"] for m in view["mlp"].modes] == ["within-bound"]
    assert view["mlp"].modes[0]["counts"] == [("bit-identical", 1), ("within-bound", 1)]
    assert [m["class"] for m in view["attn"].modes] == ["divergent"]
    assert view["attn"].stability["class"] == "mode-dependent" and "compiled" in view["attn"].stability["title"]
    assert view["attn"].dtypes == ["float32", "float16"] and view["attn"].nodes == 3 and view["attn"].bad == 1
    assert view["attn"].counts == [("fail", 1), ("pass", 3)]
    assert view["mlp"].repros == [] and view["attn"].repros == []  # no report dir given: no links
    # graphs stay out of the forward scoreboard and the layouts panel; the op's layouts are there
    board = [a["title"] for _, a, anc in dom.find("td") if "c" in a.get("class", "").split()
             and "section#scoreboard" in anc]
    assert board and not any("graph" in t for t in board)
    layouts = report_html.layout_board(rep.cases)
    assert layouts["layouts"] == ["contiguous", "reversed", "transposed"]
    assert [r["family"] for r in layouts["rows"]] == [op_family("exp")]
    assert op_family("graph:attn") == "graph" and op_family("graph:attn:vjp") == "graph"
    assert not external_refs(dom)


def test_graphs_panel_absent_without_graph_cases(tmp_path):
    rep = records.load(write(tmp_path / "r", [result("exp", n=3), layout_rec("exp", "strided", n=3)]))
    html = report_html.write(rep, tmp_path / "r.html", with_plots=False).read_text()
    assert 'id="graphs"' not in html and 'id="layouts"' in html


# -- JUnit -------------------------------------------------------------------------------------------
def test_junit_names_layouts_and_graphs(tmp_path):
    rs = [result("exp", n=3), layout_rec("exp", "transposed", n=3),
          layout_rec("exp", "reversed", "fail", n=3, message="output 0: 1/3 differ"),
          graph_rec("mlp", "compiled", nodes=1600), graph_rec("mlp", "lazy", "xfail")]
    root = ET.parse(junit.write(tmp_path / "j.xml", records.load(write(tmp_path / "r", rs)).cases)).getroot()
    cases = {tc.get("name"): tc for tc in root.iter("testcase")}
    assert set(cases) == {r.id for r in rs}
    assert [cases[r.id].get("classname") for r in rs] == [
        "exp", "exp/layout:transposed", "exp/layout:reversed", "graph:mlp", "graph:mlp"]
    props = {r.id: {p.get("name"): p.get("value") for p in cases[r.id].find("properties")} for r in rs}
    assert props[rs[1].id]["layout"] == "transposed" and "layout" not in props[rs[0].id]
    assert props[rs[3].id]["graph"] == "mlp" and props[rs[3].id]["graph_nodes"] == "1600"
    assert "graph" not in props[rs[1].id]
    assert cases[rs[2].id].find("failure").get("message") == "output 0: 1/3 differ"
    assert cases[rs[4].id].find("skipped").get("type") == "xfail"


# -- diff --------------------------------------------------------------------------------------------
def test_diff_names_the_layout_and_graph_of_a_regression(tmp_path):
    base = write(tmp_path / "base", [result("exp", n=3), layout_rec("exp", "transposed", n=3),
                                     layout_rec("exp", "strided", n=3, ulp=1.0), graph_rec("mlp", "compiled"),
                                     graph_rec("attn", "lazy", ulp=1.0)])
    new = write(tmp_path / "new", [result("exp", n=3), layout_rec("exp", "transposed", "fail", n=3, ulp=50.0),
                                   layout_rec("exp", "strided", n=3, ulp=40.0), graph_rec("mlp", "compiled", "fail"),
                                   graph_rec("attn", "lazy", ulp=30.0)])
    d = compare(records.load(base), records.load(new))
    assert d.regression
    fails = {x["id"]: x for x in d.new_failures}
    lay = fails[layout_rec("exp", "transposed", n=3).id]
    assert lay["layout"] == "transposed" and "graph" not in lay
    g = fails[graph_rec("mlp", "compiled").id]
    assert g["graph"] == "mlp" and "layout" not in g
    drift = {(x["id"], x["metric"]): x for x in d.error_drift}
    assert drift[(layout_rec("exp", "strided", n=3).id, "max_ulp")]["layout"] == "strided"
    assert drift[(graph_rec("attn", "lazy").id, "max_ulp")]["graph"] == "attn"
    c = d.counts()
    assert c["layout_regressions"] == 1 + 2 and c["graph_regressions"] == 1 + 2  # drift: ulp and rel each
    # the group's drift names the case that drove it: the strided view
    grp = {x["group"]: x for x in d.distribution_drift}
    assert grp["exp/float32/mlx-cpu-eager"]["worst"]["layout"] == "strided"
    assert grp["graph:attn/float32/mlx-cpu-lazy"]["op"] == "graph:attn" and grp["graph:attn/float32/mlx-cpu-lazy"]["grad"] == ""
    # and the HTML diff marks them
    html = report_html.write(records.load(new), tmp_path / "r.html", diff=d, with_plots=False).read_text()
    dom = Dom(html)
    assert {a["data-layout"] for _, a, anc in dom.find("span") if "data-layout" in a and "section#diff" in anc} \
        == {"transposed", "strided"}
    assert {a["data-graph"] for _, a, anc in dom.find("span") if "data-graph" in a and "section#diff" in anc} \
        == {"mlp", "attn"}


def test_a_subset_without_layouts_or_graphs_removes_none(tmp_path):
    """A run recorded with --layouts none (or --graphs none) holds no layout (graph) case: the
    baseline's are not in its subset, never "removed"; with the layouts it ran, a missing layout
    case is removed."""
    base_recs = [result("exp", n=3), layout_rec("exp", "transposed", n=3), graph_rec("mlp", "eager")]
    base = write(tmp_path / "base", base_recs)
    sel = {"ops": None, "dtypes": None, "grad": [], "forward": True, "layouts": "none", "graphs": "none"}
    new = write(tmp_path / "new", [result("exp", n=3)], run={"targets": ["mlx-cpu-eager"], "selection": sel})
    d = compare(records.load(base), records.load(new))
    assert d.removed == [] and d.not_in_subset == 2 and not d.regression
    assert "no layout cases" in d.subset.describe() and "no graphs" in d.subset.describe()
    new2 = write(tmp_path / "new2", [result("exp", n=3)],
                 run={"targets": ["mlx-cpu-eager"], "selection": {**sel, "layouts": "default", "graphs": "m*"}})
    d2 = compare(records.load(base), records.load(new2))
    assert sorted(d2.removed) == sorted([base_recs[1].id, base_recs[2].id])
    s = Selection(layouts="default", contiguous=False, graphs="graph:a*")
    assert s.holds(layout_rec("exp", "strided").to_json()) and not s.holds(result("exp").to_json())
    assert s.holds(graph_rec("attn", "eager").to_json()) and not s.holds(graph_rec("mlp", "eager").to_json())
    # an older run without graphs in its selection: graph cases are held where the op globs are
    assert Selection(ops=None).holds(graph_rec("mlp", "eager").to_json())
    assert not Selection(ops=("exp",)).holds(graph_rec("mlp", "eager").to_json())


# -- tolerance lock ----------------------------------------------------------------------------------
def test_lock_keys_and_judges_graph_groups(tmp_path):
    """A graph group is "graph:NAME/dtype/target", no derivative of an op named "graph"; it has no
    accuracy budget (its bound is the graph's propagated one), so no ULP cap; its lines round-trip."""
    rs = [graph_rec("mlp", m, ulp=u) for m, u in (("eager", 3.0), ("lazy", 3.0), ("compiled", 5.0))]
    seen = lockfile.observe(records.load(write(tmp_path / "r", rs)).cases)
    assert set(seen) == {("graph:mlp", "float32", t) for t in TARGETS}
    assert records.split_subject("graph:mlp") == ("graph:mlp", "") and records.split_subject("graph:mlp:vjp") == (
        "graph:mlp", "vjp")
    assert lockfile.ulp_cap("graph:mlp", "float32") is None
    lock = lockfile.Lock(set(TARGETS))
    chk = lockfile.check(lock, seen)
    assert {v["group"] for v in chk.violations} == {f"graph:mlp/float32/{t}" for t in TARGETS}
    new, refused = lockfile.updated(lock, chk, "graph: first-order bound")
    assert refused == 0
    path = lockfile.write(new, tmp_path / "lock.toml")
    text = path.read_text()
    assert '"graph:mlp/float32/mlx-cpu-compiled"' in text and '"graph:mlp/float32/mlx-cpu-eager"' in text
    again = lockfile.load(path)
    assert again.get(("graph:mlp", "float32", "mlx-cpu-lazy")).max_ulp == 3.0
    assert not lockfile.check(again, seen).violations


def test_shipped_lock_graph_lines_are_of_library_graphs():
    """The lock's graph lines (written from a run of every graph in every CPU mode: a graph group
    without a line is locked at 0 ULP) are of graphs the library has, and say what judged them."""
    from rlx_conformance.ops.graphs import select
    lock = lockfile.load()
    graph_keys = [k for k in lock.entries if k[0].startswith("graph:")]
    assert graph_keys
    assert {records.split_subject(k[0])[0] for k in graph_keys} <= {g.op for g in select(None)}
    for k in graph_keys:  # the forward's bound, or the VJP's (a graph:NAME:vjp subject)
        source = ("graph-vjp:first-order-backward-propagation" if records.split_subject(k[0])[1]
                  else "graph:first-order-propagation")
        assert source in (lock.entries[k].reason or ""), k


# -- the pytest plugin -------------------------------------------------------------------------------
MATRIX = """\
[matrix]
backend = "mlx"
devices = "cpu"
modes = ["eager"]
ops = ["relu"]
dtypes = ["float32"]
grad = "none"
"""


def collect(where: Path, *args: str) -> list[str]:
    """The item names a fresh pytest collects from ``where``'s conformance.toml."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    p = subprocess.run([sys.executable, "-m", "pytest", "conformance.toml", "--collect-only", "-q",
                        "-p", "no:cacheprovider", *args], cwd=where, env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert p.returncode in (0, 5), p.stdout + p.stderr  # 5: nothing selected
    return sorted(line.split("::", 1)[1] for line in p.stdout.splitlines() if "::" in line)


def listed(*args: str) -> list[str]:
    """The case ids ``rlx-conformance list`` prints (in-process: the plugin's side is the one that
    needs a fresh pytest)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["list", "--device", "cpu", "--mode", "eager", "--dtypes", "float32", "--grad", "none",
                         *args]) == 0
    return sorted(out.getvalue().split())


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    pytest.importorskip("mlx.core")
    d = tmp_path_factory.mktemp("plugin")
    (d / "conformance.toml").write_text(MATRIX)
    return d


def test_plugin_layouts_and_graphs_mirror_the_cli(plugin_dir):
    default = collect(plugin_dir)
    assert default == listed("--ops", "relu")  # layouts default, no graphs with ops
    assert any("/layout:" in i for i in default) and not any(i.startswith("graph:") for i in default)
    assert collect(plugin_dir, "--rlx-layouts", "none") == listed("--ops", "relu", "--layouts", "none")
    assert collect(plugin_dir, "--rlx-layouts", "all") == listed("--ops", "relu", "--layouts", "all")
    with_graphs = collect(plugin_dir, "--rlx-graphs", "residual*")
    assert with_graphs == listed("--ops", "relu", "--graphs", "residual*")
    assert any(i.startswith("graph:residual_") for i in with_graphs)
    graphs_only = collect(plugin_dir, "--rlx-ops", "graph:residual*")
    assert graphs_only == listed("--ops", "graph:residual*") and all(i.startswith("graph:") for i in graphs_only)
    # -k selects a layout's cases, or the graphs
    transposed = collect(plugin_dir, "-k", "layout:transposed")
    assert transposed and transposed == [i for i in default if "/layout:transposed/" in i]
    assert collect(plugin_dir, "--rlx-graphs", "residual*", "-k", "graph:") == [
        i for i in with_graphs if i.startswith("graph:")]


def test_plugin_conformance_file_sets_layouts_and_graphs(plugin_dir, tmp_path):
    (tmp_path / "conformance.toml").write_text(MATRIX + 'layouts = "none"\ngraphs = ["residual*"]\n')
    assert collect(tmp_path) == listed("--ops", "relu", "--layouts", "none", "--graphs", "residual*")
    (tmp_path / "conformance.toml").write_text(MATRIX + 'layouts = "sideways"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    p = subprocess.run([sys.executable, "-m", "pytest", "conformance.toml", "--collect-only", "-q",
                        "-p", "no:cacheprovider"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert p.returncode != 0 and "layouts must be one of none, default, all" in p.stdout + p.stderr


def test_plugin_runs_graph_and_layout_items(plugin_dir):
    """A session of one graph and one layout's items: each item's outcome is its record's in the
    session's results.json, which holds the graph's and the layout's records."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    report = plugin_dir / "report"
    p = subprocess.run([sys.executable, "-m", "pytest", "conformance.toml", "-q", "-p", "no:cacheprovider",
                        "--rlx-workers", "1", "--rlx-graphs", "residual_layer_norm", "--rlx-report", str(report),
                        "-k", "graph: or layout:transposed", "-rA"], cwd=plugin_dir, env=env,
                       capture_output=True, text=True, timeout=600, check=False)
    assert p.returncode in (0, 1), p.stdout + p.stderr
    cases = json.loads((report / "results.json").read_text())["cases"]
    assert cases and all(c["op"].startswith("graph:") or c["layout"] == "transposed" for c in cases)
    assert {c["op"] for c in cases} == {"graph:residual_layer_norm", "relu"}
    assert all(c["graph"] for c in cases if c["op"].startswith("graph:"))
    for c in cases:  # each item reported as its record says
        word = {"pass": "PASSED", "fail": "FAILED", "xfail": "XFAIL", "skip": "SKIPPED"}.get(c["outcome"], "FAILED")
        assert f"{word} conformance.toml::{c['id']}" in p.stdout, c["id"]


# -- rlx-conformance list ----------------------------------------------------------------------------
def test_list_json_names_layouts_and_graphs(capsys):
    from rlx_conformance.cli import main as cli
    argv = ["list", "--ops", "relu,graph:residual*", "--grad", "none", "--mode", "eager", "--dtypes", "float32"]
    assert cli.main(argv) == 0
    ids = capsys.readouterr().out.split()
    assert cli.main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in doc["cases"]] == ids
    for c in doc["cases"]:
        assert c["graph"] == (c["op"].removeprefix("graph:") if c["op"].startswith("graph:") else "")
        assert (f"/layout:{c['layout']}/" in c["id"]) == bool(c["layout"])
    assert {c["graph"] for c in doc["cases"]} == {"", "residual_layer_norm"}
    assert {c["op"] for c in doc["cases"] if c["layout"]} == {"relu"}  # graphs have no layout cases


# -- a real run, end to end --------------------------------------------------------------------------
def test_real_run_reports_graphs_and_layouts(tmp_path):
    """A real run of an op with its layouts and a graph in every mode, then ``report --junit``:
    the HTML (rendered in headless Chromium where installed) has the graphs panel with the graph's
    modes compared, and the layouts panel; JUnit names both kinds."""
    pytest.importorskip("mlx.core")
    from test_report_html import _chromium

    from rlx_conformance.cli import main as cli
    rep_dir = tmp_path / "run"
    code = cli.main(["run", "--ops", "relu,graph:residual*", "--dtypes", "float32", "--mode", "all", "--grad",
                     "none", "--workers", "1", "--no-progress", "--no-bundles", "--report", str(rep_dir)])
    assert code in (0, 1)
    assert cli.main(["report", str(rep_dir), "--junit", str(tmp_path / "j.xml"), "--no-plots"]) == 0
    page = rep_dir / "report.html"
    html = page.read_text()
    exe = _chromium()
    if exe is not None:  # the page as a browser builds it
        p = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                            f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.resolve().as_uri()],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        html = p.stdout
    dom = Dom(html)
    rows = [a for _, a, anc in dom.find("tr") if "data-graph" in a and "section#graphs" in anc]
    assert [a["data-graph"] for a in rows] == ["residual_layer_norm"]
    cells = [a for _, a, anc in dom.find("td") if "c" in a.get("class", "").split() and "section#graphs" in anc]
    assert len(cells) == 3  # eager, lazy, compiled
    assert [a["data-device"] for _, a, anc in dom.find("div") if "data-agreement" in a] == ["mlx-cpu"]
    assert [a["data-family"] for _, a, anc in dom.find("tr") if "section#layouts" in anc and "data-family" in a] \
        == [op_family("relu")]
    assert not external_refs(dom)
    names = {tc.get("classname") for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    assert "graph:residual_layer_norm" in names and "relu" in names
    assert any(n.startswith("relu/layout:") for n in names)
