"""The pytest items of the conformance matrix (loaded by rlx_conformance.pytest_plugin only when a
``conformance*.toml`` file is collected): one item per case, fed by one isolated Runner. The
matrix is ``run``'s: the ops' cases with their memory layouts, and the graph cases (issue 17),
each item named by its case id (``-k layout:transposed``, ``-k graph:`` select those).

The session-wide checks (strict known divergences, bit-stability) need every record of the
session. A plain session has them; under ``-k`` or another deselection they run over the selected
cases, and an entry (or an item of an entry's op/dtype/id list) is judged stale only where the
selection held its every case (run/staleness.py ``fully_covered``, as for the CLI's ``--ops``).
Under pytest-xdist each worker holds a share: a worker hands each record to the controller as a
``user_properties`` entry of its report (``RECORD``), and the controller, which runs no case,
runs the checks over all of them (``gathered_finish``)."""
from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.generate.graphs import generate_graphs, graph_patterns
from rlx_conformance.generate.layouts import LAYOUT_SETTINGS
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge.divergences import divergences, entry_name
from rlx_conformance.judge.stability import classify, enforce
from rlx_conformance.ops.graphs import PREFIX as GRAPH_PREFIX
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.outcomes import finalize
from rlx_conformance.run.runner import Runner
from rlx_conformance.run.session import (
    backend_targets,
    build_cases,
    grad_kinds,
    supports,
    with_variants,
    skip_shapes,
)

# The user property that carries a worker's case record (CaseResult.to_json, as JSON text) to the
# xdist controller; the plugin takes it off each report before any other plugin (junitxml) sees it.
RECORD = "rlx_record"


def in_worker() -> bool:
    """Whether this process is a pytest-xdist worker (which runs its cases in-process)."""
    return bool(os.environ.get("PYTEST_XDIST_WORKER"))


class MatrixFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        with self.path.open("rb") as f:
            spec = tomllib.load(f).get("matrix", {})
        opt = self.config.getoption

        def pick(name, key, default=None):
            v = opt(f"--rlx-{name}")
            return v if v is not None else spec.get(key, default)

        def listify(v):
            if v is None or v == "all":
                return v
            return [p for p in (v.split(",") if isinstance(v, str) else v) if p]

        try:
            modes = listify(pick("mode", "modes"))
            targets = backend_targets(pick("backend", "backend", "mlx"), listify(pick("device", "devices", "cpu")), modes)
            cases = matrix_cases(targets, listify(pick("ops", "ops")), listify(pick("dtypes", "dtypes")),
                                 grads=grad_kinds(pick("grad", "grad", "all")),
                                 layouts=pick("layouts", "layouts", "default"), graphs=pick("graphs", "graphs"))
            cases = skip_shapes(cases, listify(pick("skip-shapes", "skip_shapes")))
            divergences()  # the data is checked now: a bad entry is a usage error, not a traceback at the end
        except RlxError as e:
            raise pytest.UsageError(f"{self.path.name}: {e}") from None
        for c in cases:
            yield CaseItem.from_parent(self, name=c.id, case=c)


def matrix_cases(targets: list[Target], ops: list[str] | None, dtypes: list[str] | None, *,
                 grads: tuple[str, ...], layouts: str, graphs: str | list[str] | None) -> list[Case]:
    """The items' cases, as ``rlx-conformance run`` selects them: the ops' forward and derivative
    cases with their memory layouts (``layouts``: none, default or all, as --layouts), then the
    graph cases (``graphs``: all, none, or globs over graph names, as --graphs; None: all when no
    op glob is given, none otherwise), with their VJP cases where ``grads`` has vjp. Op globs
    that start with ``graph:`` select graphs, as ``run --ops 'graph:*'`` does; given alone, they
    leave the ops out."""
    if layouts not in LAYOUT_SETTINGS:
        raise RlxError(f"layouts must be one of {', '.join(LAYOUT_SETTINGS)}, not {layouts!r}")
    graph_pats = [p for p in ops or [] if p.startswith(GRAPH_PREFIX)]
    op_pats = [p for p in ops or [] if not p.startswith(GRAPH_PREFIX)] if ops is not None else None
    if isinstance(graphs, list):
        graphs = ",".join(graphs) or "none"
    if graph_pats:
        graphs = ",".join(([graphs] if graphs not in (None, "all", "none") else []) + graph_pats)
    cases = [] if graph_pats and not op_pats else build_cases(targets, op_pats or None, dtypes, grads=grads,
                                                               layouts=layouts)
    patterns = graph_patterns(graphs if graphs is not None else ("none" if op_pats else "all"))
    if patterns == []:
        return cases
    base = sorted({Target(t.backend, t.device, t.mode) for t in targets}, key=str)
    return cases + with_variants(generate_graphs(base, patterns, dtypes, supports, grads=("", *grads)))


class CaseFailure(Exception):
    """A case that did not pass: reported with the harness's message, no traceback."""


class CaseItem(pytest.Item):
    def __init__(self, *, case, **kw):
        super().__init__(**kw)
        self.case = case

    def runtest(self) -> None:
        r = _feed(self.session).result(self)
        self.user_properties += [("outcome", r.outcome), ("kernel", r.kernel),
                                 ("max_abs_err", r.max_abs_err), ("max_rel_err", r.max_rel_err),
                                 ("max_ulp", r.max_ulp), ("duration_s", round(r.duration_s, 6))]
        if in_worker():  # the controller runs the session-wide checks over every worker's records
            self.user_properties.append((RECORD, json.dumps(r.to_json())))
        if r.outcome == "pass":
            return
        if r.outcome == "skip":
            pytest.skip(r.message)
        if r.outcome == "xfail":
            pytest.xfail(r.message)
        raise CaseFailure(f"{r.outcome}: {r.message}")

    def repr_failure(self, excinfo, style=None):
        """The harness's message, no traceback: a traceback says nothing about a case's outcome,
        and pytest builds one for an xfail too (pytest.xfail raises), parsing this module's source
        each time: 0.35 s an xfail item, most of the matrix's time where hundreds are xfail."""
        if isinstance(excinfo.value, CaseFailure):
            return f"{self.name}\n{excinfo.value}"
        if isinstance(excinfo.value, pytest.xfail.Exception):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.name


class _Feed:
    """Streams the selected items through one Runner; results are handed out as they arrive."""

    def __init__(self, session: pytest.Session):
        self.session = session
        items = [i for i in session.items if isinstance(i, CaseItem)]
        self.results: dict[str, res.CaseResult] = {}
        self.all: list[res.CaseResult] = []
        opt = session.config.getoption
        inproc = in_worker()
        report = opt("--rlx-report")
        sink = None
        if report:  # with a report dir, failing cases leave repro bundles in it, as for `run`
            sink = BundleSink(Path(report), timeout=opt("--rlx-timeout"))
        self.runner = Runner(workers=0 if inproc else opt("--rlx-workers"), timeout=opt("--rlx-timeout"),
                             bundles=sink)
        self._pending = {i.case.id for i in items}
        self._gen = None if inproc else self.runner.run([i.case for i in items])

    def result(self, item: CaseItem) -> res.CaseResult:
        if self._gen is None:  # in-process (xdist): one case at a time
            r = next(iter(self.runner.run([item.case])))
            self.all.append(r)
            return r
        while item.case.id not in self.results:
            try:
                r = next(self._gen)
            except StopIteration:
                raise RuntimeError(f"runner finished without a result for {item.case.id}") from None
            self.results[r.id] = r
            self.all.append(r)
        return self.results.pop(item.case.id)


_KEY = pytest.StashKey[_Feed]()


def _feed(session: pytest.Session) -> _Feed:
    if _KEY not in session.stash:
        session.stash[_KEY] = _Feed(session)
    return session.stash[_KEY]


def select_exact(config: pytest.Config, items: list) -> None:
    """`-k <case id>` with an exact id selects exactly that case (ids contain ':' and may be
    substrings of others, e.g. sigmoid/... inside hard_sigmoid/...)."""
    kw = (config.option.keyword or "").strip()
    if not kw:
        return
    exact = [i for i in items if isinstance(i, CaseItem) and i.name == kw]
    if exact:
        config.hook.pytest_deselected(items=[i for i in items if i not in exact])
        items[:] = exact
        config.option.keyword = ""


def session_finish(session: pytest.Session) -> None:
    """The session-wide checks over this process's records; none in an xdist worker, whose
    records went to the controller (:func:`gathered_finish`)."""
    feed = session.stash.get(_KEY, None)
    if feed is None or in_worker():
        return
    check_session(session, feed.all)


def gathered_finish(session: pytest.Session, records: list[str]) -> None:
    """On the xdist controller: the session-wide checks over the records the workers sent."""
    check_session(session, [res.CaseResult.from_json(json.loads(r)) for r in records])


def check_session(session: pytest.Session, results: list[res.CaseResult]) -> None:
    """Strict known divergences: an entry none of whose cases failed makes the session fail
    (its items already passed; the stale entry is reported here), judged only where the session
    held the entry's every case, so that a ``-k`` selection that holds part of an entry cannot
    call it stale. Likewise the cases of a group recorded bit-stable (cases/bit_stable.toml)
    whose modes disagree bit-wise. With --rlx-report, results.json of the whole session."""
    warnings = finalize(results)
    if narrowed(session.config):  # parts the selection left out matched no case: not a finding
        warnings = []
    enforce(results)  # cases/bit_stable.toml: the modes of a recorded group must agree bit-wise
    unstable = [r for r in results if r.outcome == "fail" and r.message.startswith("bit-stability:")]
    xpass = sorted({entry_name(r) for r in results if r.outcome == "xpass"})
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        for name in xpass:
            tr.write_line(f"rlx-conformance: known divergence {name} no longer reproduces (xpass, strict): "
                          "remove it from cases/known_divergences.toml", red=True)
        for r in unstable:
            tr.write_line(f"rlx-conformance: {r.id}: {r.message.splitlines()[0]}", red=True)
        for w in warnings:
            tr.write_line(f"rlx-conformance: warning: {w}", yellow=True)
    if (xpass or unstable) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = session.config.getoption("--rlx-report")
    if out:
        res.write_results(Path(out) / "results.json", res.run_metadata(front="pytest", warnings=warnings), results,
                          classify(results))


_NARROWED = pytest.StashKey[bool]()


def note_deselected(config: pytest.Config) -> None:
    """Items were deselected (-k, -m, --deselect, an exact id): the session holds part of the matrix."""
    config.stash[_NARROWED] = True


def narrowed(config: pytest.Config) -> bool:
    """Whether the session ran part of the matrix. The xdist controller collects nothing, so it
    sees no deselection and goes by the selecting options."""
    opt = config.option
    return config.stash.get(_NARROWED, False) or bool(getattr(opt, "keyword", "") or getattr(opt, "markexpr", "")
                                                       or getattr(opt, "deselect", None))
