"""pytest plugin: every case of the matrix is a test item whose name is the case id.

A file named ``conformance*.toml`` in a test directory declares a matrix (``[matrix]`` backend,
device, modes, ops, dtypes, grad: the derivative cases, as ``run --grad``; layouts and graphs,
as ``run --layouts`` and ``--graphs``); ``--rlx-*`` options override it; ``-k 'grad:vjp'`` selects
the derivative cases of a kind, ``-k layout:transposed`` a memory layout's, ``-k graph:`` the
graph cases (their ids say so, as ``rlx-conformance list`` prints them). Items run through the
same isolated runner as the CLI: the first item to run starts the runner on every selected item, in order, and
each item reports its own result as it arrives (so a kernel that crashes or hangs becomes one
failed item, not a dead session). Under pytest-xdist each worker runs its items in-process and
xdist's worker restart provides the crash isolation (a hang is turned into a crash:
run/watchdog.py), and each worker sends its records to the
controller, which checks strict known divergences and bit-stability over the whole session (a
stale entry fails an xdist session as it fails a plain one). ``pytest -k <exact case id>`` selects
that case alone even where the id is a substring of another; under ``-k`` an entry is judged
stale only where the selection held its every case.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The matrix's items, runner and judges (numpy, scipy, the registry: seconds to import) live in
# rlx_conformance.pytest_matrix. This module is loaded by every pytest process of an environment
# that installs the harness, so it imports that only when a conformance file is collected.
_MATRIX = "rlx_conformance.pytest_matrix"
_RECORD = "rlx_record"  # pytest_matrix.RECORD: a worker's case record, sent to the xdist controller
_GATHER = "rlx-conformance-gather"


class _Gather:
    """On a process that runs no xdist worker (the controller, or a plain session): the case
    records that xdist workers sent in their reports' user_properties, by node id. Taken off the
    reports first (tryfirst), so that junitxml and the like never see them."""

    def __init__(self) -> None:
        self.records: dict[str, str] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = report.user_properties
        if not any(k == _RECORD for k, _ in props):
            return
        for k, v in props:
            if k == _RECORD:
                self.records[report.nodeid] = v
        report.user_properties = [(k, v) for k, v in props if k != _RECORD]


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # xdist sets workerinput on its workers
        config.pluginmanager.register(_Gather(), _GATHER)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("rlx-conformance")
    g.addoption("--rlx-backend", help="backend under test (overrides the conformance file)")
    g.addoption("--rlx-device", help="cpu, gpu or all")
    g.addoption("--rlx-mode", help="eager, lazy, compiled or all")
    g.addoption("--rlx-ops", help="comma-separated op globs")
    g.addoption("--rlx-dtypes", help="comma-separated dtype globs")
    g.addoption("--rlx-grad", help="derivative cases besides the forward ones: all (the default), "
                                   "none, or kinds among vjp, jvp, hvp, comma-separated")
    g.addoption("--rlx-layouts", help="memory layouts besides the contiguous cases, as run --layouts: none, "
                                      "default (the default: each layout once per op and shape family) or all")
    g.addoption("--rlx-graphs", help="graph cases (cases/graphs.toml), as run --graphs: all, none or globs over "
                                     "graph names, comma-separated (default: all without --rlx-ops, none with it)")
    g.addoption("--rlx-skip-shapes", help="shape families to leave out, as run --skip-shapes: comma-separated "
                                          "globs over family names (default: as the conformance file says)")
    g.addoption("--rlx-report", help="also write results.json, and a repro bundle per failing case, into this directory")
    g.addoption("--rlx-workers", type=int, help="runner worker processes (default: one per core)")
    g.addoption("--rlx-timeout", type=float, default=30.0, help="seconds per case before timeout (in-process, under pytest-xdist: a case past twice this ends its xdist worker, which xdist reports against the item and replaces)")


def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    if file_path.suffix == ".toml" and file_path.name.startswith("conformance"):
        from rlx_conformance.pytest_matrix import MatrixFile

        return MatrixFile.from_parent(parent, path=file_path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    """`-k <case id>` with an exact id selects exactly that case (ids contain ':' and may be
    substrings of others, e.g. sigmoid/... inside hard_sigmoid/...)."""
    matrix = sys.modules.get(_MATRIX)  # loaded only if a conformance file was collected
    if matrix is not None:
        matrix.select_exact(config, items)


def pytest_deselected(items: list) -> None:
    """The session holds part of the matrix: the stale-entry check says nothing of what it left out."""
    matrix = sys.modules.get(_MATRIX)
    if matrix is not None and items:
        matrix.note_deselected(items[0].config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Strict known divergences and bit-stability, checked over the whole session's cases: this
    process's, or on the xdist controller those its workers sent."""
    gather = session.config.pluginmanager.get_plugin(_GATHER)
    if gather is not None and gather.records:
        from rlx_conformance.pytest_matrix import gathered_finish

        gathered_finish(session, list(gather.records.values()))
        return
    matrix = sys.modules.get(_MATRIX)
    if matrix is not None:
        matrix.session_finish(session)
