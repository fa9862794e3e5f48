"""Loads the harness's data files (TOML), once per process.

The shipped data is the package ``rlx_conformance.cases`` (``cases/`` in the repository), read
through importlib.resources so that an installed wheel works from any folder. A project can
override any of it with a folder of its own (``--cases DIR`` or ``$RLX_CONFORMANCE_CASES``): each
file found there replaces the shipped file of the same relative path (``known_divergences.toml``,
``shapes/custom.toml``…); files it does not hold come from the shipped data.
"""
from __future__ import annotations

import os
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from rlx_conformance.core.errors import RlxError

ENV = "RLX_CONFORMANCE_CASES"


def shipped_dir() -> Path:
    """The data shipped with the harness (a real folder: wheels install unzipped)."""
    return Path(str(resources.files("rlx_conformance.cases")))


def override_dir() -> Path | None:
    """The project's own data folder ($RLX_CONFORMANCE_CASES, set by ``--cases``), if any."""
    env = os.environ.get(ENV)
    if not env:
        return None
    p = Path(env)
    if not p.is_dir():
        raise RlxError(f"{ENV}={env}: not a directory")
    return p


def set_override(path: str | Path | None) -> None:
    """Use ``path`` as the override folder in this process and its workers (``--cases DIR``)."""
    if path is None:
        return
    p = Path(path).resolve()
    if not p.is_dir():
        raise RlxError(f"--cases {path}: not a directory")
    os.environ[ENV] = str(p)
    load.cache_clear()


def data_path(name: str) -> Path:
    """Where the data file ``name`` (a path relative to the data folder) is read from: the
    override folder when it holds the file, else the shipped data."""
    over = override_dir()
    if over is not None and (over / name).exists():
        return over / name
    return shipped_dir() / name


def cases_dir() -> Path:
    """The folder data is written to by commands that record data (``stability --record``, the
    tolerance lock): the override folder when one is set, else the shipped data."""
    return override_dir() or shipped_dir()


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise RlxError(f"missing data file {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"{path}: {e}") from None


def _dir_files(name: str) -> list[Path]:
    """The TOML files of the data folder ``name``: the shipped ones, each replaced by the
    override's file of the same name, plus the override's own."""
    files = {f.name: f for f in sorted((shipped_dir() / name).glob("*.toml"))}
    over = override_dir()
    if over is not None and (over / name).is_dir():
        files.update({f.name: f for f in sorted((over / name).glob("*.toml"))})
    return [files[k] for k in sorted(files)]


@cache
def load(name: str) -> dict[str, Any]:
    """A TOML file of the data, or a folder of them (one per op family) merged by top-level key;
    a key defined in two files is an error."""
    if not (shipped_dir() / name).is_dir():
        return _read(data_path(name))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for f in _dir_files(name):
        for k, v in _read(f).items():
            if k in merged:
                raise RlxError(f"{f}: [{k}] is already defined in {origin[k]}")
            merged[k], origin[k] = v, f.name
    return merged
