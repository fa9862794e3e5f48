"""MLX's CPU JIT with a precompiled preamble (backends/mlx/_jit_pch.py): the same kernels, built
faster; never a stale PCH; nothing changes when it cannot be used."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlx_conformance.backends.mlx import _jit_pch

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or shutil.which("strip") is None
                                or _jit_pch.mlx_include() is None,
                                reason="needs g++, strip and MLX's headers")

# a fused graph of three elementwise ops: MLX's compiled mode on the CPU builds it with g++
KERNEL = """
import mlx.core as mx
f = mx.compile(lambda x: mx.sigmoid(x) * x + 0.5)
print(f(mx.array([0.25, -1.5, 3.0])).tolist())
"""


def _compile_in(tmp: Path, env: dict[str, str]) -> tuple[str, list[bytes]]:
    """Run KERNEL with an empty MLX cache under ``tmp``; its output and its kernels, stripped of
    the symbol table (which names MLX's random temporary source file)."""
    tmp.mkdir()
    out = subprocess.run([sys.executable, "-c", KERNEL], capture_output=True, text=True, check=True,
                         env={**os.environ, "TMPDIR": str(tmp), **env}).stdout
    libs = sorted((tmp / "mlx").rglob("*.so"))
    stripped = []
    for lib in libs:
        subprocess.run(["strip", "-o", str(lib) + ".stripped", str(lib)], check=True)
        stripped.append(Path(str(lib) + ".stripped").read_bytes())
    return out, stripped


@pytest.fixture
def own_tmp(tmp_path, monkeypatch):
    """The PCH cache under this test's folder (built afresh: about 1.5 s)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.delenv(_jit_pch.ENV, raising=False)
    return tmp_path


def test_kernels_are_the_same_machine_code_with_the_pch(own_tmp):
    env = _jit_pch.worker_env()
    assert env, "the PCH should be usable with this g++ and MLX"
    wrapper = Path(env["PATH"].split(os.pathsep)[0]) / "g++"
    assert wrapper.is_file() and (wrapper.parent.parent / "ready").is_file()
    with_pch = _compile_in(own_tmp / "with", env)
    without = _compile_in(own_tmp / "without", {_jit_pch.ENV: "0"})
    assert with_pch[1], "MLX compiled no kernel: is its compiled mode fusing on this machine?"
    assert with_pch == without


def test_the_wrapper_finds_the_real_compiler_not_itself(own_tmp, monkeypatch):
    """A worker inherits the wrapper first on PATH; asked again, it must not wrap itself."""
    env = _jit_pch.worker_env()
    monkeypatch.setenv("PATH", env["PATH"])
    again = _jit_pch.worker_env()
    assert again["PATH"] == env["PATH"]
    assert str(own_tmp) not in (_jit_pch._real_compiler() or "")


def test_a_changed_header_changes_the_key(tmp_path):
    """GCC does not notice a header changed after its PCH was built: the key must."""
    inc = tmp_path / "include"
    (inc / "mlx").mkdir(parents=True)
    header = inc / "mlx" / "a.h"
    header.write_text("int a;\n")
    key = _jit_pch.cache_key.__wrapped__
    before = key(shutil.which("g++"), inc)
    header.write_text("int a, b;\n")
    assert key(shutil.which("g++"), inc) != before


def test_switched_off_or_without_a_compiler_nothing_changes(own_tmp, monkeypatch):
    monkeypatch.setenv(_jit_pch.ENV, "0")
    assert _jit_pch.worker_env() == {}
    monkeypatch.delenv(_jit_pch.ENV)
    monkeypatch.setenv("PATH", str(own_tmp / "nothing-here"))
    assert _jit_pch.worker_env() == {}
