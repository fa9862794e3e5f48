"""Running a repro bundle's repro.py as a user would: a plain, isolated interpreter (-I: no
PYTHONPATH, no user site, not the checkout on sys.path), outside the checkout, with nothing of
the environment but PATH and TMPDIR (MLX's JIT cache for compiled mode). Shared by the bundle,
graph-shrink and graph-fuzz tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def clean_run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return subprocess.run([sys.executable, "-I", str(script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
