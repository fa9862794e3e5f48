"""pytest plugin: every case of the matrix is a test item whose name is the case id.

A file named ``conformance*.toml`` in a test directory declares a matrix (``[matrix]`` backend,
device, modes, ops, dtypes); ``--rlx-*`` options override it. Items run through the same isolated
runner as the CLI: the first item to run starts the runner on every selected item, in order, and
each item reports its own result as it arrives (so a kernel that crashes or hangs becomes one
failed item, not a dead session). Under pytest-xdist each worker runs its items in-process and
xdist's worker restart provides the crash isolation. ``pytest -k <exact case id>`` selects that
case alone even where the id is a substring of another.
"""
from __future__ import annotations

import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlx-conformance")
    g.addoption("--rlx-backend", help="backend under test (overrides the conformance file)")
    g.addoption("--rlx-device", help="cpu, gpu or all")
    g.addoption("--rlx-mode", help="eager, lazy, compiled or all")
    g.addoption("--rlx-ops", help="comma-separated op globs")
    g.addoption("--rlx-dtypes", help="comma-separated dtype globs")
    g.addoption("--rlx-report", help="also write results.json, and a repro bundle per failing case, into this directory")
    g.addoption("--rlx-workers", type=int, help="runner worker processes (default: one per core)")
    g.addoption("--rlx-timeout", type=float, default=30.0, help="seconds per case before timeout")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".toml" and file_path.name.startswith("conformance"):
        return MatrixFile.from_parent(parent, path=file_path)
    return None


class MatrixFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        from rlx_conformance.run.session import backend_targets, build_cases

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
            cases = build_cases(targets, listify(pick("ops", "ops")), listify(pick("dtypes", "dtypes")))
        except RlxError as e:
            raise pytest.UsageError(f"{self.path.name}: {e}") from None
        for c in cases:
            yield CaseItem.from_parent(self, name=c.id, case=c)


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
        if r.outcome == "pass":
            return
        if r.outcome == "skip":
            pytest.skip(r.message)
        if r.outcome == "xfail":
            pytest.xfail(r.message)
        raise CaseFailure(f"{r.outcome}: {r.message}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CaseFailure):
            return f"{self.name}\n{excinfo.value}"
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
        inproc = bool(os.environ.get("PYTEST_XDIST_WORKER"))
        from rlx_conformance.run.runner import Runner

        report = opt("--rlx-report")
        sink = None
        if report:  # with a report dir, failing cases leave repro bundles in it, as for `run`
            from rlx_conformance.run.bundle import BundleSink

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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Strict known divergences: an entry none of whose cases failed makes the session fail
    (its items already passed; the stale entry is reported here). Likewise the cases of a group
    recorded bit-stable (cases/bit_stable.toml) whose modes disagree bit-wise."""
    feed = session.stash.get(_KEY, None)
    if feed is None:
        return
    from rlx_conformance.run.runner import finalize

    full = not session.config.option.keyword and not os.environ.get("PYTEST_XDIST_WORKER")
    warnings = finalize(feed.all) if full else []
    from rlx_conformance.judge.stability import enforce

    enforce(feed.all)  # cases/bit_stable.toml: the modes of a recorded group must agree bit-wise
    unstable = [r for r in feed.all if r.outcome == "fail" and r.message.startswith("bit-stability:")]
    xpass = sorted({r.divergence["entry"] for r in feed.all if r.outcome == "xpass"})
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        for i in xpass:
            tr.write_line(f"rlx-conformance: known divergence #{i} no longer reproduces (xpass, strict): "
                          "remove it from cases/known_divergences.toml", red=True)
        for r in unstable:
            tr.write_line(f"rlx-conformance: {r.id}: {r.message.splitlines()[0]}", red=True)
        for w in warnings:
            tr.write_line(f"rlx-conformance: warning: {w}", yellow=True)
    if (xpass or unstable) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    out = session.config.getoption("--rlx-report")
    if out:
        res.write_results(Path(out) / "results.json", res.run_metadata(front="pytest", warnings=warnings), feed.all)
