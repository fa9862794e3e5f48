"""Loads the data files under cases/ (TOML), once per process."""
from __future__ import annotations

import os
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

from .errors import RlxError


def cases_dir() -> Path:
    """cases/ beside the package (a source checkout or editable install), or $RLX_CONFORMANCE_CASES."""
    env = os.environ.get("RLX_CONFORMANCE_CASES")
    p = Path(env) if env else Path(__file__).resolve().parent.parent / "cases"
    if not p.is_dir():
        raise RlxError(f"cases directory not found at {p} (set RLX_CONFORMANCE_CASES)")
    return p


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise RlxError(f"missing data file {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"{path}: {e}") from None


@cache
def load(name: str) -> dict[str, Any]:
    """A TOML file under cases/, or a directory of them (one per op family) merged by top-level
    key; a key defined in two files is an error."""
    path = cases_dir() / name
    if not path.is_dir():
        return _read(path)
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for f in sorted(path.glob("*.toml")):
        for k, v in _read(f).items():
            if k in merged:
                raise RlxError(f"{f}: [{k}] is already defined in {origin[k]}")
            merged[k], origin[k] = v, f.name
    return merged
