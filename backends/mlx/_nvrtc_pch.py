"""NVRTC's precompiled headers for MLX's CUDA JIT: the same kernels, a quarter less NVRTC time.

A cold GPU run is NVRTC-bound: MLX's compiled mode builds each new fused kernel with NVRTC, and
every compile parses the same CUDA and CCCL headers again (the default GPU run spent 14,131 of
its workers' 15,425 s in such compiles; README, MLX on a GPU). NVRTC 12.8 and newer can keep a
precompiled header of that prefix and reuse it in a process's later compiles (``--pch``), but
MLX passes no such option. ``nvrtc_pch_shim.c`` (package data) adds it: built once per machine
with the C compiler and loaded into each worker's global symbol scope before MLX, it appends
``--pch`` and a per-process ``--pch-dir`` to MLX's NVRTC options, shortens the fused kernels'
program names (NVRTC names the PCH file after the program, and MLX's names pass the 255-byte
limit) and removes the PCH folders of processes that have ended (157 MB each). The shim's
comments say why each part is there.

Measured on three H100 hosts (15 workers, ``benchmarks/README.md``): NVRTC time per compile
3.73 → 2.63 s, 3.42 → 2.55 s and 4.58 → 3.37 s, with every case's outcome and output digest the
same (572, 572 and 504 cases compared).

It is used only where it can work, checked once per machine: MLX's CUDA build installed, a C
compiler, and a probe that compiles a kernel through the shim with the real NVRTC (>= 12.8) in a
child process. Anywhere else nothing changes. ``RLX_CONFORMANCE_NVRTC_PCH=0`` switches it off.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rlx_conformance.backends.base import PRELOAD_ENV
from rlx_conformance.backends.mlx._built_once import built_once

ENV = "RLX_CONFORMANCE_NVRTC_PCH"
DIR_ENV = "RLX_CONFORMANCE_NVRTC_PCH_DIR"  # read by the shim: where each process's PCH folder goes
SOURCE = Path(__file__).with_name("nvrtc_pch_shim.c")
COMPILER = "cc"
# MLX first: it loads libnvrtc (from wherever its build finds it), which the shim then finds by soname
_PROBE = "import ctypes, sys; import mlx.core; sys.exit(ctypes.CDLL(sys.argv[1]).rlx_nvrtc_pch_probe())"


@functools.cache
def mlx_cuda_dists() -> tuple[str, ...]:
    """MLX's CUDA build as installed: the ``mlx_cuda_*-VERSION.dist-info`` folders (``mlx[cuda12]``
    and ``mlx[cuda13]`` bring one) beside the ``mlx`` package, found without importing MLX; empty
    without. A listing of that folder (~0.5 ms), not importlib.metadata's scan of every
    distribution (~34 ms, paid by every run on every machine)."""
    spec = importlib.util.find_spec("mlx")
    found = set()
    for pkg in (spec.submodule_search_locations or []) if spec else []:
        try:
            names = os.listdir(os.path.dirname(pkg))
        except OSError:
            continue
        found |= {n for n in names if re.fullmatch(r"mlx_cuda\w*-[^-]+\.dist-info", n)}
    return tuple(sorted(found))


def mlx_cuda_build() -> bool:
    """Whether MLX's CUDA build is installed."""
    return bool(mlx_cuda_dists())


def _root() -> Path:
    return Path(tempfile.gettempdir()) / "rlx-conformance" / "nvrtc-pch"


@functools.cache
def _key(compiler: str) -> str:
    """What the built shim and its probe's verdict depend on (once a process): the shim's source,
    the compiler, and MLX's CUDA build (with the NVRTC its wheels bring, a newer one may take the
    PCH where an older did not). A system CUDA upgraded in place is not seen: remove
    ``$TMPDIR/rlx-conformance/nvrtc-pch`` to check again."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    parts = (SOURCE.read_text(), compiler, version, *mlx_cuda_dists())
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def prepare() -> Path | None:
    """The shim, built and checked on first use (under a lock: workers and concurrent runs share
    it); None when switched off, without MLX's CUDA build or a C compiler, or when the probe fails
    (then MLX compiles as it always does)."""
    if os.environ.get(ENV, "1").lower() in ("0", "off", "no", "false") or not mlx_cuda_build():
        return None
    compiler = shutil.which(COMPILER)
    if compiler is None:
        return None
    try:
        home = _root() / _key(compiler)
        lib = home / "nvrtc_pch_shim.so"
        return lib if built_once(home, lambda h: _build(h, compiler), lib) else None
    except (OSError, subprocess.SubprocessError):
        return None


def _build(home: Path, compiler: str) -> None:
    home.mkdir(parents=True, exist_ok=True)
    lib = home / "nvrtc_pch_shim.so"
    tmp = home / f"nvrtc_pch_shim.tmp{os.getpid()}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-pthread", "-o", str(tmp), str(SOURCE), "-ldl"],
                   capture_output=True, timeout=120, check=True)
    os.replace(tmp, lib)
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(lib)], capture_output=True, text=True,
                           timeout=120, env={**os.environ, DIR_ENV: str(home / "probe")})
    shutil.rmtree(home / "probe", ignore_errors=True)
    if probe.returncode != 0:
        why = {1: "no NVRTC found", 2: "NVRTC older than 12.8 (no automatic PCH)",
               3: "a probe kernel failed to compile"}.get(probe.returncode, f"probe exit {probe.returncode}")
        (home / "unusable").write_text(f"{why}\n{probe.stderr[-2000:]}")
        return
    (home / "ready").write_text(f"{compiler}\n")


def worker_env() -> dict[str, str]:
    """The environment that gives a worker's NVRTC compiles the PCH: the shim, which the worker
    loads into its global symbol scope before it imports MLX (``PRELOAD_ENV``: LD_PRELOAD would
    not reach workers forked from a forkserver started before the run knew it), and the PCH
    folder; empty when there is none."""
    lib = prepare()
    if lib is None:
        return {}
    return {PRELOAD_ENV: str(lib), DIR_ENV: str(_root() / "pch")}
