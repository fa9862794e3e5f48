"""Figures in the README and reports/README.md that a test can recompute, recomputed: the size of
the matrix `tox -e mlx` runs, the compiled-mode skips, and the committed baselines' counts. A
change that moves one fails here until the text says the new number."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from rlx_conformance.generate import matrix
from rlx_conformance.report import records

ROOT = Path(__file__).resolve().parent.parent
# whitespace folded: a figure may wrap across lines
README = re.sub(r"\s+", " ", (ROOT / "README.md").read_text())
REPORTS = re.sub(r"\s+", " ", (ROOT / "reports" / "README.md").read_text())
COMPILED = [matrix.Target("mlx", "cpu", "compiled")]


def n(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.fixture(scope="module")
def one_mode() -> list:
    return matrix.generate(COMPILED)


def test_the_main_jobs_matrix_size(one_mode):
    m = re.search(r"`tox -e mlx` runs the whole matrix \(([\d,]+) cases\)", README)
    assert m and n(m.group(1)) == len(one_mode)


def test_the_main_jobs_layout_and_graph_cases():
    """The layout cases `run` adds by default (--layouts default) and the graph library's cases
    (--graphs all, the default without --ops), one mode."""
    from rlx_conformance.generate import graphs
    m = re.search(r"([\d,]+) memory-layout cases \(`--layouts none` leaves them out.*?\) and "
                  r"([\d,]+) graph cases with their ([\d,]+) VJPs \(`--graphs none`\)", README)
    layouts = [c for c in matrix.generate(COMPILED, layouts="default") if c.layout]
    assert m and [n(g) for g in m.groups()] == [len(layouts), len(graphs.generate_graphs(COMPILED)),
                                                len(graphs.generate_graphs(COMPILED, grads=("vjp",)))]


def test_the_main_jobs_thinned_cases():
    """`tox -e mlx` thins the derivative, layout and graph-VJP input sets (--sample-grad, tox.ini):
    the README's figures are session.thin_variants' over what `run` builds, one mode."""
    from rlx_conformance.generate import graphs
    from rlx_conformance.run.session import build_cases, skip_shapes, thin_variants
    tox = (ROOT / "tox.ini").read_text()
    k = int(re.search(r"rlx-conformance run .*--sample-grad (\d+)", tox).group(1))
    skipped = re.search(r"rlx-conformance run .*--skip-shapes (\S+)", tox).group(1)
    m = re.search(r"`--sample-grad (\d+) --skip-shapes [^`]+`: ([\d,]+) cases a mode in all, ([\d,]+) of them derivatives, "
                  r"([\d,]+) layouts and ([\d,]+) graph VJPs.*? run all ([\d,]+):", README)
    every = (build_cases(COMPILED, grads=matrix.GRAD_KINDS, layouts="default")
             + graphs.generate_graphs(COMPILED, grads=("", "vjp")))
    kept = skip_shapes(thin_variants(every, k), skipped.split(","))
    op_grads = sum(1 for c in kept if c.grad and not c.op.startswith("graph:"))
    graph_grads = sum(1 for c in kept if c.grad and c.op.startswith("graph:"))
    assert m and [n(g) for g in m.groups()] == [
        k, len(kept), op_grads, sum(1 for c in kept if c.layout), graph_grads, len(every)]


def test_the_main_jobs_derivative_cases():
    m = re.search(r"its derivatives \(([\d,]+) derivative cases: ([\d,]+) VJPs, ([\d,]+) JVPs, "
                  r"([\d,]+) Hessian-vector products", README)
    # as `run` builds them: derivative cases only for the dtypes the kernel declares
    from rlx_conformance.run.session import build_cases
    kinds = Counter(c.grad for c in build_cases(COMPILED, grads=matrix.GRAD_KINDS) if c.grad)
    assert m and [n(g) for g in m.groups()] == [sum(kinds.values()), kinds["vjp"], kinds["jvp"], kinds["hvp"]]


def test_non_zero_skips_in_compiled_mode(one_mode):
    m = re.search(r"its ([\d,]+) cases skip in every compiled run", README)
    assert m and n(m.group(1)) == sum(c.op == "non_zero" for c in one_mode)


def _summary(path: str) -> Counter:
    return Counter(r["outcome"] for r in records.load(ROOT / path).cases)


def test_gpu_baseline_counts():
    s = _summary("reports/gpu-baseline/results.json.gz")
    want = (f"{sum(s.values()):,} cases: {s['pass']:,} pass, {s['xfail']:,} xfail, {s['skip']:,} skip, "
            "nothing failing")
    assert want in REPORTS, want
    assert f"**{sum(s.values()):,} cases**" in README
    assert f"{s['pass']:,} pass, {s['xfail']:,} xfail, {s['skip']:,} skip, nothing failing" in README


def test_cpu_baseline_counts():
    s = _summary("reports/baseline/results.json.gz")
    want = f"({sum(s.values()):,} cases: {s['pass']:,} pass, {s['xfail']:,} xfail, {s['skip']:,} skip)"
    assert want in REPORTS, want
