"""The graph fuzzer (issue 17 item 5): random well-typed graphs (generate/graph_fuzz.py) run in
every mode asked for, judged as graph cases are (run/graphs.py), a failure shrunk to its minimal
failing subgraph (run/shrink.py) and written out as a graph TOML snippet plus a repro bundle.

Deterministic under a seed: hypothesis draws the graphs with ``@seed(seed)``, no example
database and no time-based health checks, and every graph's inputs come from the seed streams of
the graph case it would be (run/shrink.case_key), not from hypothesis. hypothesis's own shrinking
is off: the graph shrinker knows what a smaller graph is (cut nodes fed their reference values,
smaller shape sets), hypothesis does not.

A failure that a known divergence already explains (run/shrink.explained_by: an entry scoping a
node of the minimal graph as a single-op case, or the graph, that excuses the minimal failure
within its caps) is counted as known, not reported: the fuzzer goes on. The first unexplained
failure, or the end of the time budget, ends the run (the examples left count as not run).
"""
from __future__ import annotations

import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.fuzz import hypothesis_modules
from rlx_conformance.generate.graph_fuzz import DTYPES, MAX_DIM, MAX_NODES, graph_strategy
from rlx_conformance.generate.graphs import graph_inputs
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.ops.graphs import Graph, check, parse, resolve, to_toml
from rlx_conformance.run import bundle
from rlx_conformance.run.graphs import evaluate, reference_of
from rlx_conformance.run.shrink import Shrunk, case_key, explained_by, failure_of, shrink

SHAPE_SET = "fuzz"  # the shape set of every fuzzed graph (generate/graph_fuzz.py)


class _Stop(Exception):
    """Ends the hypothesis run: the time budget is spent, or a failure was found."""


@dataclass
class Found:
    """An unexplained failure: the fuzzed graph, where it failed, and its shrunk form."""

    graph: Graph
    example: int
    target: Target
    shrunk: Shrunk
    snippet: Path | None = None
    bundle: Path | None = None

    @property
    def regression(self) -> Graph:
        """The graph to commit: the shrinker's last declared graph (its inputs come from its own
        case's seed streams, so a library case of it fails as here), named for its structure."""
        g = self.shrunk.declared.resolved if self.shrunk.declared is not None else self.shrunk.original.resolved
        body = to_toml(g.graph)
        return parse_one(body)


@dataclass
class FuzzGraphsReport:
    requested: int | None  # None: as many as the time budget allows
    seed: int
    examples: int = 0  # graphs run
    not_run: int = 0  # not drawn: the time budget ran out, or a failure was found
    cases: int = 0  # graph × target evaluations
    outcomes: Counter = field(default_factory=Counter)
    known: list[tuple[str, str, str]] = field(default_factory=list)  # graph, target, entry key
    reference_errors: list[tuple[str, str]] = field(default_factory=list)  # graph, error
    failure: Found | None = None
    elapsed_s: float = 0.0
    graphs: list[str] = field(default_factory=list)  # the names of the graphs run, in order

    def summary(self) -> str:
        """The one-line summary."""
        drawn = f"{self.examples}/{self.requested}" if self.requested is not None else str(self.examples)
        parts = [f"fuzz-graphs: {drawn} graphs (seed {self.seed}), {self.cases} runs",
                 ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes.items())) or "none"]
        if self.known:
            parts.append(f"{len(self.known)} explained by known divergences "
                         f"({', '.join(sorted({k for _, _, k in self.known}))})")
        if self.reference_errors:
            parts.append(f"{len(self.reference_errors)} without a reference")
        if self.not_run:
            parts.append(f"{self.not_run} not run")
        if self.failure is not None:
            f = self.failure
            parts.append(f"FAILURE {f.graph.name} on {f.target}: {f.shrunk.original.failure}, shrunk "
                         f"{len(f.shrunk.original.resolved.nodes)} -> {len(f.shrunk.nodes)} node(s) "
                         f"({', '.join(f.shrunk.ops)})")
        else:
            parts.append("no failure")
        return "; ".join(parts) + f" [{self.elapsed_s:.1f}s]"


def parse_one(text: str) -> Graph:
    """The one [[graph]] of a TOML snippet, validated as cases/graphs.toml's graphs are."""
    try:
        tables = tomllib.loads(text).get("graph", [])
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"not a graph snippet: {e}") from None
    if len(tables) != 1:
        raise RlxError(f"a graph snippet holds exactly one [[graph]] table, not {len(tables)}")
    return check(parse(tables[0]))


def fuzz_graphs(n: int | None, seed: int, targets: list[Target], *, max_nodes: int = MAX_NODES, max_dim: int = MAX_DIM,
                dtypes: tuple[str, ...] = DTYPES, time_budget: float | None = None,
                report_dir: Path | None = None, shrink_evaluations: int = 400) -> FuzzGraphsReport:
    """Run ``n`` fuzzed graphs (None: until ``time_budget`` ends) on ``targets``; shrink and write
    out the first unexplained failure (under ``report_dir``: fuzz-graphs/<name>.toml and
    repro/<bundle>/)."""
    if n is None and time_budget is None:
        raise RlxError("fuzz_graphs: without a number of examples it needs a time budget")
    hypothesis, _, _ = hypothesis_modules()
    report = FuzzGraphsReport(n, seed)
    t0 = time.monotonic()
    deadline = None if time_budget is None else t0 + time_budget

    def prop(g: Graph) -> None:
        if report.failure is not None or (deadline is not None and time.monotonic() > deadline):
            raise _Stop()  # hypothesis stops drawing (and replays this example once: it stops again)
        report.examples += 1
        report.graphs.append(g.name)
        _one(g, report.examples, targets, report, shrink_evaluations, deadline)

    test = hypothesis.settings(max_examples=n or 10**9, derandomize=False, database=None, deadline=None,
                               phases=[hypothesis.Phase.generate],
                               suppress_health_check=list(hypothesis.HealthCheck))(
        hypothesis.seed(seed)(hypothesis.given(graph_strategy(max_nodes, max_dim, dtypes))(prop)))
    try:
        test()
    except _Stop:
        pass
    report.not_run = 0 if n is None else n - report.examples
    report.elapsed_s = time.monotonic() - t0
    if report.failure is not None and report_dir is not None:
        write_found(report.failure, Path(report_dir))
    return report


def _one(g: Graph, k: int, targets: list[Target], report: FuzzGraphsReport, shrink_evaluations: int,
         deadline: float | None) -> None:
    dtype = g.dtypes[0]
    r = resolve(g, dtype, SHAPE_SET)
    try:
        with np.errstate(all="ignore"):
            ref = reference_of(r, graph_inputs(r, case_key(r), "random"))
    except Exception as e:  # noqa: BLE001 — no reference: nothing to judge (counted, said)
        report.reference_errors.append((g.name, f"{type(e).__name__}: {e}"))
        return
    for tg in targets:
        ev = evaluate(r, ref, tg)
        report.cases += 1
        report.outcomes[ev.outcome] += 1
        if failure_of(ev) is None:
            continue
        left = None if deadline is None else max(deadline - time.monotonic(), 30.0)
        sh = shrink(g, dtype, SHAPE_SET, tg, max_evaluations=shrink_evaluations, time_budget=left)
        d = explained_by(sh)
        if d is not None:
            report.known.append((g.name, str(tg), d.key))
            continue
        report.failure = Found(g, k, tg, sh)
        return


def found_case(f: Found) -> Case:
    """The graph case the found failure's regression graph would be (for ids and bundles)."""
    g = f.regression
    r = resolve(g, g.dtypes[0], g.shapes[0][0])
    return Case(g.op, r.dtype, tuple(s for _, (s, _) in r.inputs), r.shape_set, (), "random", f.target)


def write_found(f: Found, report_dir: Path) -> None:
    """fuzz-graphs/<name>.toml (the regression graph, ready for --add-regression) and its repro
    bundle (the minimal graph) under ``report_dir``."""
    g = f.regression
    snippets = report_dir / "fuzz-graphs"
    snippets.mkdir(parents=True, exist_ok=True)
    f.snippet = snippets / f"{g.name}.toml"
    sh = f.shrunk
    f.snippet.write_text(f"# rlx-conformance fuzz-graphs: example {f.example}, failing on {f.target} "
                         f"({sh.original.failure}); minimal subgraph: {', '.join(sh.ops)}\n"
                         f"# add it to the graph library: rlx-conformance fuzz-graphs --add-regression {f.snippet}\n"
                         + to_toml(g))
    case = found_case(f)
    ev = sh.original.evaluation
    rec = CaseResult.for_case(case, ev.outcome, message=ev.message,
                              **{k: v for k, v in ev.fields.items() if not k.startswith("_")})
    f.bundle = bundle.write_graph_bundle(report_dir / bundle.DIRNAME / bundle.bundle_name(case.id), case, rec, sh)


def add_regression(snippet: Path, graphs_file: Path) -> Graph:
    """Append the graph of ``snippet`` (a fuzz-graphs TOML snippet) to ``graphs_file`` (the graph
    library), after checking it: one valid graph named ``regression_*``, a name not taken."""
    g = parse_one(Path(snippet).read_text())
    if not g.name.startswith("regression_"):
        raise RlxError(f"{snippet}: a regression graph's name starts with regression_ (got {g.name!r})")
    library = tomllib.loads(graphs_file.read_text()) if graphs_file.exists() else {}
    if any(t.get("name") == g.name for t in library.get("graph", [])):
        raise RlxError(f"{graphs_file} already has a graph named {g.name}")
    text = graphs_file.read_text() if graphs_file.exists() else ""
    graphs_file.write_text(text.rstrip("\n") + "\n\n" + to_toml(g))
    return g


__all__ = ["Found", "FuzzGraphsReport", "add_regression", "fuzz_graphs", "parse_one", "write_found"]

