"""A precompiled header for MLX's CPU JIT: the same fused kernels, compiled about 4x faster.

MLX's compiled mode on the CPU writes each new fused graph as a C++ file and builds it with
``g++ -std=c++17 -O3 -Wall -fPIC -shared -I <mlx>/include K.cpp -o K.so``, run through the shell
(so ``g++`` is whatever PATH finds first). Every such file includes
``mlx/backend/cpu/compiled_preamble.h``: about 69,000 preprocessed lines, whose parsing is most of
the 0.5 s a kernel takes. A cold run of ``tox -e mlx`` compiles about 4,000 kernels, 90 % of its
time (README, Speed).

GCC looks for a precompiled ``NAME.gch`` in each include directory just before it looks for the
header there, and uses it only when it was built with options compatible with the compile's (else
it reads the header as usual, slower but the same). So: build the preamble's PCH once per
machine, with MLX's flags, into a directory of our own; and put a ``g++`` first on PATH that adds
``-I <that directory>`` before MLX's arguments and runs the real compiler. The kernels are the
same machine code (the shared objects byte-identical with and without it: 52 of 52 kernels
sampled from a full run's cache; tests/test_jit_pch.py checks one end to end); a kernel compiles
in 0.12 s instead of 0.50 s on this project's 2-core machine.

What the PCH depends on is its cache key: the real compiler (path and ``--version``), MLX's
version and every file under MLX's include directory (path, size, mtime): GCC does not notice a
header that changed after its PCH was built, so a changed MLX must never meet an old PCH.
``RLX_CONFORMANCE_JIT_PCH=0`` switches it off (to measure, or to rule it out).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from rlx_conformance.backends.mlx._built_once import built_once

COMPILER = "g++"  # what MLX's CPU JIT runs (backends/mlx CPU_JIT_COMPILER)
# MLX 0.32's compile flags (mlx/backend/cpu/jit_compiler.cpp); a PCH built with other ones is
# ignored by GCC (no harm, no speed-up: prepare() checks that it is used)
FLAGS = ("-std=c++17", "-O3", "-Wall", "-fPIC")
PREAMBLE = "mlx/backend/cpu/compiled_preamble.h"
ENV = "RLX_CONFORMANCE_JIT_PCH"
_WRAPPER = """#!/bin/sh
# rlx-conformance (backends/mlx/_jit_pch.py): MLX's CPU JIT with a precompiled compiled_preamble.h
exec {real} -I {include} "$@"
"""


def mlx_include() -> Path | None:
    """MLX's include directory (the ``-I`` of its JIT), found without importing MLX."""
    spec = importlib.util.find_spec("mlx")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / "include" / PREAMBLE).is_file():
            return Path(root) / "include"
    return None


def _real_compiler() -> str | None:
    """The g++ PATH finds, our own wrapper directories left out (a worker inherits them)."""
    root = _root().resolve()
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not Path(d).resolve().is_relative_to(root)]
    return shutil.which(COMPILER, path=os.pathsep.join(dirs))


def _root() -> Path:
    return Path(tempfile.gettempdir()) / "rlx-conformance" / "jit-pch"


@functools.cache
def cache_key(compiler: str, include: Path) -> str:
    """What the PCH depends on (module docstring), hashed; once a process (an in-process run asks
    for every case)."""
    h = hashlib.sha256()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    try:
        mlx_version = importlib.metadata.version("mlx")
    except importlib.metadata.PackageNotFoundError:
        mlx_version = "?"
    h.update(f"{compiler}\0{version}\0{mlx_version}\0{' '.join(FLAGS)}\0".encode())
    for dirpath, dirnames, filenames in os.walk(include):
        dirnames.sort()
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"{os.path.relpath(os.path.join(dirpath, name), include)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def prepare() -> Path | None:
    """The directory whose ``g++`` compiles MLX's kernels with the PCH, built on first use (under
    a lock: workers and concurrent runs share it); None when switched off, without g++ or MLX's
    headers, or when GCC would not use the PCH (then nothing changes)."""
    if os.environ.get(ENV, "1").lower() in ("0", "off", "no", "false"):
        return None
    compiler, include = _real_compiler(), mlx_include()
    if compiler is None or include is None:
        return None
    try:
        home = _root() / cache_key(compiler, include)
        ready = built_once(home, lambda h: _build(h, compiler, include), home / "bin" / COMPILER)
        return home / "bin" if ready else None
    except (OSError, subprocess.SubprocessError):
        return None  # no cache to write, a compiler that fails: MLX compiles as it always does


def _build(home: Path, compiler: str, include: Path) -> None:
    gch = home / "include" / (PREAMBLE + ".gch")
    gch.parent.mkdir(parents=True, exist_ok=True)
    tmp = gch.with_suffix(f".tmp{os.getpid()}")
    subprocess.run([compiler, *FLAGS, "-I", str(include), "-x", "c++-header", str(include / PREAMBLE),
                    "-o", str(tmp)], capture_output=True, timeout=600, check=True)
    os.replace(tmp, gch)
    if not _used(compiler, home / "include", include):
        (home / "unusable").write_text("GCC does not use this PCH with MLX's flags\n")
        gch.unlink(missing_ok=True)
        return
    (home / "bin").mkdir(exist_ok=True)
    wrapper = home / "bin" / COMPILER
    wrapper.write_text(_WRAPPER.format(real=shlex.quote(compiler), include=shlex.quote(str(home / "include"))))
    wrapper.chmod(0o755)
    (home / "ready").write_text(f"{compiler}\n{include}\n")


def _used(compiler: str, pch_include: Path, include: Path) -> bool:
    """Whether GCC takes the PCH for a kernel's ``#include`` with MLX's flags: ``-H`` lists a
    header it used precompiled with a leading ``!``."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(f'#include "{PREAMBLE}"\n')
        out = subprocess.run([compiler, *FLAGS, "-shared", "-H", "-fsyntax-only", "-I", str(pch_include),
                              "-I", str(include), str(src)], capture_output=True, text=True, timeout=600)
    return any(line.startswith("! ") and line.endswith(".gch") for line in out.stderr.splitlines())


def worker_env() -> dict[str, str]:
    """The environment that gives MLX's JIT the PCH in a process started with it (PATH with the
    wrapper first); empty when there is none."""
    d = prepare()
    if d is None:
        return {}
    rest = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != str(d)]
    return {"PATH": os.pathsep.join([str(d), *rest])}
