"""Something built once per machine and shared by every process: the MLX backend's compile
helpers (_jit_pch.py's precompiled preamble, _nvrtc_pch.py's NVRTC shim) each build theirs in a
folder named after what it depends on, and record there whether it can be used."""
from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path


def built_once(home: Path, build: Callable[[Path], None], artifact: Path) -> bool:
    """Whether ``home`` holds a usable build, making it first if no process has: ``build(home)``
    runs under a lock (workers and concurrent runs wait for the one building), makes ``artifact``
    and writes ``home/ready`` when the result can be used, or ``home/unusable`` (with why) when it
    cannot. A ready build whose artifact has gone (a temp-folder cleaner deletes old files one by
    one) is built again. An OSError or a failed subprocess propagates to the caller."""
    if (home / "ready").is_file() and artifact.is_file():
        return True
    if (home / "unusable").is_file():
        return False
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it: wait for it
        if (home / "ready").is_file() and not artifact.is_file():
            (home / "ready").unlink()
        if not (home / "ready").is_file() and not (home / "unusable").is_file():
            build(home)
    return (home / "ready").is_file() and artifact.is_file()
