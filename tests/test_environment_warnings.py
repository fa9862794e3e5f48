"""A run warns where the machine cannot test what its targets are meant to: MLX's compiled mode on
the CPU without the C++ compiler that JIT-compiles its fused kernels (MLX then runs every graph
unfused, silently, and every case still passes; found in issue 18)."""
from __future__ import annotations

import pytest

from rlx_conformance.backends.mlx import CPU_JIT_COMPILER
from rlx_conformance.cli import main as cli

RUN = ["run", "--ops", "neg", "--dtypes", "float32", "--grad", "none", "--layouts", "none",
       "--no-progress", "--no-bundles"]


@pytest.mark.parametrize(("mode", "compiler", "warned"), [
    ("compiled", False, True), ("compiled", True, False), ("eager", False, False)])
def test_a_compiled_cpu_run_without_the_jit_compiler_says_so(tmp_path, capsys, monkeypatch, mode, compiler, warned):
    import rlx_conformance.backends.mlx as mlx_backend

    real = mlx_backend.shutil.which  # the compiler present or not, whatever this machine has

    def which(name, *a, **k):
        if name == CPU_JIT_COMPILER:
            return f"/usr/bin/{name}" if compiler else None
        return real(name, *a, **k)

    monkeypatch.setattr(mlx_backend.shutil, "which", which)
    assert cli.main([*RUN, "--mode", mode, "--report", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert (f"warning: no {CPU_JIT_COMPILER} on PATH" in err) == warned
