"""The map of what verifies each op's forward reference (tests/reference_checks.toml) is complete and
points at real things: every built-in op is covered by a [[check]] or a [[by_definition]] entry,
every name or glob matches a registered op, and every test it cites exists (the module imports
and the function is defined; nothing is run here)."""
from __future__ import annotations

import fnmatch
import importlib
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rlx_conformance.ops import all_ops
from rlx_conformance.report.op_facts import builtin_ops

TESTS = Path(__file__).parent
MAP = TESTS / "reference_checks.toml"
CHECK_KEYS = {"ops", "oracle", "tests", "scope", "how"}
BY_DEFINITION_KEYS = {"ops", "reason", "checked_by", "tests"}


def load() -> dict[str, list[dict[str, Any]]]:
    return tomllib.loads(MAP.read_text())


def entries() -> list[tuple[str, dict[str, Any]]]:
    data = load()
    return [("check", e) for e in data.get("check", [])] + \
        [("by_definition", e) for e in data.get("by_definition", [])]


def builtin_names() -> set[str]:
    return {spec.name for spec in builtin_ops(all_ops())}


def matches(pattern: str, names: set[str]) -> set[str]:
    return {n for n in names if fnmatch.fnmatchcase(n, pattern)}


def test_map_has_only_known_tables_and_keys() -> None:
    data = load()
    assert set(data) <= {"check", "by_definition"}, set(data)
    for kind, e in entries():
        want = CHECK_KEYS if kind == "check" else BY_DEFINITION_KEYS
        assert set(e) == want, (kind, e.get("ops"), set(e) ^ want)
        assert e["ops"] and e["tests"], (kind, e)
        for key in want - {"ops", "tests"}:
            assert isinstance(e[key], str) and e[key].strip(), (kind, e["ops"], key)


def test_every_builtin_op_is_covered() -> None:
    names = builtin_names()
    covered = set().union(*(matches(p, names) for _, e in entries() for p in e["ops"]))
    missing = sorted(names - covered)
    assert not missing, f"ops with no entry in {MAP.name}: {missing}"


def test_no_entry_names_an_op_that_does_not_exist() -> None:
    names = builtin_names()
    unknown = [(kind, p) for kind, e in entries() for p in e["ops"] if not matches(p, names)]
    assert not unknown, unknown


def test_by_definition_ops_have_no_check_and_checks_are_not_by_definition() -> None:
    """An op is either defined by its reference or checked against an oracle, not both: the map
    says which."""
    names = builtin_names()
    kinds: dict[str, set[str]] = {}
    for kind, e in entries():
        for p in e["ops"]:
            for n in matches(p, names):
                kinds.setdefault(n, set()).add(kind)
    both = sorted(n for n, k in kinds.items() if len(k) > 1)
    assert not both, both


def _nodes() -> list[str]:
    return sorted({t for _, e in entries() for t in e["tests"]})


@pytest.mark.parametrize("node", _nodes())
def test_every_listed_test_exists(node: str) -> None:
    """``path::function`` (no parametrization): the module imports and defines the function as a
    test; a bare path must be a file pytest collects (a test module or the matrix's toml)."""
    path, _, func = node.partition("::")
    file = TESTS.parent / path
    assert file.is_file(), f"{node}: no file {path}"
    assert "[" not in node, f"{node}: name the test without its parametrization"
    if not func:
        assert file.suffix in (".py", ".toml") and file.name.startswith(("test_", "conformance")), node
        return
    assert file.suffix == ".py" and file.name.startswith("test_"), node
    assert "::" not in func, f"{node}: test classes are not used in this suite"
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    module = importlib.import_module(file.stem)
    fn = getattr(module, func, None)
    assert callable(fn) and func.startswith("test_"), f"{node}: {file.stem} has no test {func}"
