"""The NVRTC PCH shim (backends/mlx/_nvrtc_pch.py, nvrtc_pch_shim.c) against a fake NVRTC: the
options it adds and only where NVRTC can take them, the program names it shortens, the PCH
folders it removes, and the check that decides whether workers get it at all.

The fake stands where MLX's CUDA build has libnvrtc: a ``libnvrtc.so.13`` that a ``libmlx``
stand-in links, loaded RTLD_LOCAL as Python loads MLX's extension, after the shim is loaded as a
worker loads it (run/worker.load_preloads). The measured effect on a real NVRTC is in
benchmarks/README.md."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from rlx_conformance.backends.base import PRELOAD_ENV
from rlx_conformance.backends.mlx import _nvrtc_pch
from rlx_conformance.run import worker

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

FAKE_NVRTC = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct _nvrtcProgram *nvrtcProgram;
static FILE *record(void) { return fopen(getenv("FAKE_NVRTC_RECORD"), "a"); }
int nvrtcVersion(int *major, int *minor) {
  const char *v = getenv("FAKE_NVRTC_VERSION");
  *major = v ? atoi(v) : 13; *minor = v && strchr(v, '.') ? atoi(strchr(v, '.') + 1) : 0;
  return 0;
}
int nvrtcCreateProgram(nvrtcProgram *p, const char *src, const char *name, int n, const char *const *h,
                       const char *const *i) {
  FILE *f = record(); fprintf(f, "name %s\n", name); fclose(f); *p = (nvrtcProgram)1; return 0;
}
int nvrtcCompileProgram(nvrtcProgram p, int n, const char *const *o) {
  FILE *f = record(); fprintf(f, "options"); for (int i = 0; i < n; i++) fprintf(f, " %s", o[i]);
  fprintf(f, "\n"); fclose(f); return 0;
}
int nvrtcDestroyProgram(nvrtcProgram *p) { *p = 0; return 0; }
"""

# MLX's side: compiles a short-named kernel and two fused ones with names far past 255 bytes
FAKE_MLX = r"""
#include <string.h>
typedef struct _nvrtcProgram *nvrtcProgram;
int nvrtcCreateProgram(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
int nvrtcCompileProgram(nvrtcProgram, int, const char *const *);
int compile_two(void) {
  nvrtcProgram p; const char *o[] = {"--gpu-architecture=sm_90a", "--include-path=/x"};
  char name[400]; memset(name, 'G', 399); name[399] = 0;
  int r = nvrtcCreateProgram(&p, "k", "short.cu", 0, 0, 0) | nvrtcCompileProgram(p, 2, o);
  r |= nvrtcCreateProgram(&p, "k", name, 0, 0, 0) | nvrtcCompileProgram(p, 2, o);
  name[398] = 'H';  /* a second fused kernel: the same 64-byte prefix, another name */
  return r | nvrtcCreateProgram(&p, "k", name, 0, 0, 0) | nvrtcCompileProgram(p, 2, o);
}
"""


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fake_nvrtc")
    (d / "nvrtc.c").write_text(FAKE_NVRTC)
    (d / "mlx.c").write_text(FAKE_MLX)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libnvrtc.so.13", "-o", str(d / "libnvrtc.so.13"),
                    str(d / "nvrtc.c")], check=True)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(d / "libfakemlx.so"), str(d / "mlx.c"), "-L", str(d),
                    "-l:libnvrtc.so.13", f"-Wl,-rpath,{d}"], check=True)
    return d


def _with_fake_nvrtc(monkeypatch, tmp_path: Path, fake: Path) -> None:
    """prepare() as on a machine with MLX's CUDA build whose NVRTC is the fake, its cache under
    ``tmp_path/cache``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    monkeypatch.setattr(_nvrtc_pch, "mlx_cuda_build", lambda: True)
    monkeypatch.setattr(_nvrtc_pch, "_PROBE", _nvrtc_pch._PROBE.replace("import mlx.core", "ctypes.CDLL('libnvrtc.so.13')"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(fake))
    monkeypatch.setenv("FAKE_NVRTC_RECORD", str(tmp_path / "probe.record"))
    monkeypatch.delenv(_nvrtc_pch.ENV, raising=False)


@pytest.fixture
def shim(tmp_path, monkeypatch, fake) -> Path:
    """The shim as prepare() builds it, in this test's own cache, with the fake NVRTC found."""
    _with_fake_nvrtc(monkeypatch, tmp_path, fake)
    lib = _nvrtc_pch.prepare()
    assert lib is not None, (tmp_path / "cache").rglob("unusable").__next__().read_text()
    return lib


def _compile(fake: Path, tmp: Path, env: dict[str, str]) -> tuple[list[str], list[str], int]:
    """compile_two() in a fresh process started with ``env``: the names and option lists NVRTC
    got, and that process's pid."""
    record = tmp / "record"
    record.unlink(missing_ok=True)
    code = ("import ctypes, os; from rlx_conformance.run.worker import load_preloads; load_preloads(); "
            f"l = ctypes.CDLL({str(fake / 'libfakemlx.so')!r}, mode=ctypes.RTLD_LOCAL); "
            "assert l.compile_two() == 0; print(os.getpid())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "FAKE_NVRTC_RECORD": str(record), **env})
    lines = record.read_text().splitlines()
    return ([ln[5:] for ln in lines if ln.startswith("name ")],
            [ln[8:] for ln in lines if ln.startswith("options")], int(out.stdout))


def test_the_options_are_added_after_mlxs_and_long_names_shortened(shim, fake, tmp_path):
    env = _nvrtc_pch.worker_env()
    assert env[PRELOAD_ENV] == str(shim)
    names, options, pid = _compile(fake, tmp_path, env)
    pch_dir = Path(env[_nvrtc_pch.DIR_ENV]) / str(pid)
    assert options == [f"--gpu-architecture=sm_90a --include-path=/x --pch --pch-dir={pch_dir}"] * 3
    assert pch_dir.is_dir()
    assert names[0] == "short.cu"
    for name in names[1:]:
        assert name.startswith("G" * 64 + "_") and len(name) == 64 + 1 + 16
    assert names[1] != names[2], "two fused kernels with one 64-byte prefix got one name"


def test_without_the_pch_folder_or_before_nvrtc_12_8_mlxs_options_are_unchanged(shim, fake, tmp_path):
    env = _nvrtc_pch.worker_env()
    for extra in ({"FAKE_NVRTC_VERSION": "12.6"}, {_nvrtc_pch.DIR_ENV: ""}):
        _, options, _ = _compile(fake, tmp_path, {**env, **extra})
        assert options == ["--gpu-architecture=sm_90a --include-path=/x"] * 3, extra


def test_the_folders_of_ended_processes_are_removed_and_live_ones_kept(shim, fake, tmp_path):
    env = _nvrtc_pch.worker_env()
    root = Path(env[_nvrtc_pch.DIR_ENV])
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    for pid in (ended.pid, os.getpid()):
        (root / str(pid)).mkdir(parents=True, exist_ok=True)
        (root / str(pid) / "kernel_0.pch").write_bytes(b"pch")
    (root / "not-a-pid").mkdir(exist_ok=True)
    _compile(fake, tmp_path, env)
    assert not (root / str(ended.pid)).exists()
    assert (root / str(os.getpid()) / "kernel_0.pch").is_file() and (root / "not-a-pid").is_dir()


def test_an_nvrtc_without_automatic_pch_leaves_workers_as_they_were(tmp_path, monkeypatch, fake):
    _with_fake_nvrtc(monkeypatch, tmp_path, fake)
    monkeypatch.setenv("FAKE_NVRTC_VERSION", "12.6")
    assert _nvrtc_pch.worker_env() == {}
    assert "older than 12.8" in next(tmp_path.rglob("unusable")).read_text()


def test_no_cuda_build_or_switched_off_means_nothing_changes(shim, monkeypatch):
    monkeypatch.setenv(_nvrtc_pch.ENV, "0")
    assert _nvrtc_pch.worker_env() == {}
    monkeypatch.delenv(_nvrtc_pch.ENV)
    monkeypatch.setattr(_nvrtc_pch, "mlx_cuda_build", lambda: False)
    assert _nvrtc_pch.worker_env() == {}


def test_the_log_has_a_line_a_compile_with_the_pch_or_without(shim, fake, tmp_path):
    env = _nvrtc_pch.worker_env()
    for extra, n_options in (({}, 4), ({_nvrtc_pch.DIR_ENV: ""}, 2)):
        log = tmp_path / f"log{n_options}"
        _, _, pid = _compile(fake, tmp_path, {**env, **extra, "RLX_CONFORMANCE_NVRTC_LOG": str(log)})
        rows = [line.split() for line in log.read_text().splitlines()]
        assert len(rows) == 3 and all(r[2] == "0" and int(r[3]) == n_options and float(r[1]) >= 0 for r in rows)
        assert all(int(r[4]) == pid for r in rows)
        assert len({r[5] for r in rows}) == 3, "three programs, one name hash each"
    again = tmp_path / "again"
    _compile(fake, tmp_path, {**env, "RLX_CONFORMANCE_NVRTC_LOG": str(again)})
    assert [r.split()[5] for r in again.read_text().splitlines()] == [r[5] for r in rows], \
        "the hash is of the program's name: the same kernel in another process has the same hash"


def test_a_runner_worker_has_the_shim_in_its_global_scope(shim, monkeypatch):
    """Through the forkserver, as a run starts its workers: LD_PRELOAD would not reach them."""
    import kernels_for_tests as kt

    with_shim = _nvrtc_pch.worker_env()
    monkeypatch.setattr(tempfile, "tempdir", None)  # a forkserver started here puts its socket there
    monkeypatch.delenv("LD_LIBRARY_PATH")  # and later tests' workers fork from it
    for env, expected in (({}, False), (with_shim, True)):
        w = worker.start(worker.context(), kt.global_symbol, env=env, hint="")
        try:
            w.conn.send("rlx_nvrtc_pch_probe")
            assert w.conn.recv()[1] is expected, env
        finally:
            worker.stop([w])


def test_a_shim_a_temp_cleaner_deleted_is_built_again(shim):
    shim.unlink()
    assert (shim.parent / "ready").is_file()
    assert _nvrtc_pch.prepare() == shim and shim.is_file()


def test_mlxs_cuda_build_is_the_dist_info_beside_the_mlx_package(tmp_path, monkeypatch):
    import importlib.util
    import types

    (tmp_path / "mlx").mkdir()
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path / "mlx")])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "mlx" else None)
    _nvrtc_pch.mlx_cuda_dists.cache_clear()
    try:
        assert not _nvrtc_pch.mlx_cuda_build()
        (tmp_path / "mlx-0.32.4.dist-info").mkdir()
        (tmp_path / "mlx_cuda_13-0.32.4.dist-info").mkdir()
        _nvrtc_pch.mlx_cuda_dists.cache_clear()
        assert _nvrtc_pch.mlx_cuda_dists() == ("mlx_cuda_13-0.32.4.dist-info",)
    finally:
        _nvrtc_pch.mlx_cuda_dists.cache_clear()
