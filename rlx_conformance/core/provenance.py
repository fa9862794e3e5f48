"""Which harness made a result: its version (from the installed distribution) and, when it runs
from a git checkout, the commit (with ``+dirty`` when the work tree has changes). results.json
records both under ``run.harness`` so a baseline says what judged it."""
from __future__ import annotations

import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

DIST = "rlx-conformance"


@cache
def version() -> str:
    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


@cache
def commit() -> str | None:
    """The checkout's commit when the package is imported from a git work tree (an editable
    install or the source tree), else None (a wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return None
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    return head + ("+dirty" if dirty else "")


def harness() -> dict[str, Any]:
    """``run.harness`` of results.json."""
    return {"name": DIST, "version": version(), "commit": commit()}


def version_line() -> str:
    c = commit()
    return f"{DIST} {version()}" + (f" (git {c})" if c else "")
