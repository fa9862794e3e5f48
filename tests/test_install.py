"""Installed, the harness works anywhere: the wheel built from this tree, installed into a fresh
virtual environment, runs every user-facing command from an unrelated folder.

The wheel is built (``pip wheel``, isolated build) from a copy of the tree, so the build leaves no
``build/`` or ``*.egg-info`` in the checkout and no stale ``build/lib`` file can reach the wheel.
The fresh environment gets the wheel alone (``--no-deps``); its dependencies (numpy, MLX, pytest…)
come from this test's own environment through a ``.pth`` line placed after the fresh
site-packages, so the wheel's ``rlx_conformance`` is the one imported there (checked below), and
nothing is downloaded but the build backend (setuptools, from the package index or pip's cache).
Every command runs with its working directory in a temporary folder and no PYTHONPATH, so nothing
of this checkout is importable there. About 40 s on two cores.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
# What the build must not see: git's and tools' state, run output (.gitignore).
NOT_SOURCE = shutil.ignore_patterns(".git", ".tox", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                                    ".pytest_cache", ".hypothesis", ".benchmarks", ".ruff_cache", "reports",
                                    ".mlxgpu*", ".whl")
WORKERS = "2"


class Installed:
    def __init__(self, root: Path):
        self.root = root
        self.wheel = build_wheel(root)
        self.venv = root / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(self.venv)], check=True)
        self.bin = self.venv / ("Scripts" if os.name == "nt" else "bin")
        self.python = self.bin / ("python.exe" if os.name == "nt" else "python")
        purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        self.site = Path(subprocess.run([str(self.python), "-c", purelib], capture_output=True, text=True,
                                        check=True).stdout.strip())
        pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python), "install", "-q",
                              "--no-deps", "--no-index", str(self.wheel)], check=False,
                             env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"), capture_output=True,
                             text=True)
        assert pip.returncode == 0, pip.stdout + pip.stderr
        # Dependencies: this environment's site-packages, after the fresh one on sys.path. (Added
        # after the install: pip would take this environment's own rlx-conformance for the wheel.)
        deps = [p for p in site.getsitepackages() + [site.getusersitepackages()] if Path(p).is_dir()]
        (self.site / "zz_test_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))
        self.work = root / "work"  # the user's folder: unrelated to this checkout
        self.work.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "RLX_CONFORMANCE_CASES")
                    and not k.startswith("PYTEST_")}
        self.env["PATH"] = os.pathsep.join([str(self.bin), os.environ.get("PATH", "")])
        self.env["VIRTUAL_ENV"] = str(self.venv)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        """``rlx-conformance ARGS`` through the wheel's console script, in the work folder."""
        return self.call(str(self.bin / "rlx-conformance"), *args, timeout=timeout)

    def call(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), check=False, cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout)


def build_wheel(root: Path) -> Path:
    src = root / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    out = root / "dist"
    b = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
                       check=False, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"), capture_output=True,
                       text=True, timeout=300)
    assert b.returncode == 0, b.stdout + b.stderr
    (wheel,) = out.glob("rlx_conformance-*.whl")
    return wheel


def out(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"


@pytest.fixture(scope="module")
def inst(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("install"))


@pytest.fixture(scope="module")
def run_dir(inst) -> Path:
    """A small run, as a user would start it (exit 0 today: exp float32 passes or is a known
    divergence)."""
    report = inst.work / "run"
    p = inst.run("run", "--ops", "exp", "--dtypes", "float32", "--mode", "lazy", "--no-bundles",
                 "--report", str(report), "--no-progress", "--workers", WORKERS)
    assert p.returncode == 0, out(p)
    assert (report / "results.json").is_file(), out(p)
    return report


def test_wheel_holds_one_package_with_its_data_and_licenses(inst):
    names = zipfile.ZipFile(inst.wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"rlx_conformance", f"rlx_conformance-{VERSION}.dist-info"}, top  # no backends/ or cases/
    # every file of the three source folders is in the wheel, where package-dir maps it
    for folder, pkg in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        base = ROOT / pkg
        want = {f"{folder.replace('.', '/')}/{f.relative_to(base).as_posix()}" for f in base.rglob("*")
                if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"}
        assert want <= set(names), sorted(want - set(names))
    meta = zipfile.ZipFile(inst.wheel).read(f"rlx_conformance-{VERSION}.dist-info/METADATA").decode()
    assert "License-Expression: MIT OR Apache-2.0" in meta
    for lic in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert f"rlx_conformance-{VERSION}.dist-info/licenses/{lic}" in names


def test_the_fresh_environment_imports_the_wheel(inst):
    code = """if True:
        import json
        from importlib import metadata
        import rlx_conformance, rlx_conformance.backends, rlx_conformance.pytest_plugin
        from rlx_conformance.core import data
        dist = metadata.distribution("rlx-conformance")
        eps = {f"{e.group}:{e.name}": [e.value, str(e.dist.locate_file(""))]
               for g in ("console_scripts", "pytest11") for e in metadata.entry_points(group=g)
               if e.dist is not None and e.dist.name == "rlx-conformance"}
        print(json.dumps({"package": rlx_conformance.__file__, "backends": rlx_conformance.backends.__file__,
                          "cases": str(data.shipped_dir()), "dist": str(dist.locate_file("")), "eps": eps}))
    """
    p = inst.call(str(inst.python), "-c", code)
    assert p.returncode == 0, out(p)
    got = json.loads(p.stdout)
    site_dir = inst.site.resolve()
    for key in ("package", "backends", "cases", "dist"):
        assert Path(got[key]).resolve().is_relative_to(site_dir), (key, got[key], site_dir)
    assert got["eps"]["console_scripts:rlx-conformance"][0] == "rlx_conformance.cli.main:main"
    assert got["eps"]["pytest11:rlx_conformance"][0] == "rlx_conformance.pytest_plugin"
    for ep, where in got["eps"].items():
        assert Path(where[1]).resolve() == site_dir, ep
    script = (inst.bin / "rlx-conformance").read_text().splitlines()[0]
    assert script.startswith("#!") and Path(script[2:].strip()).parent == inst.bin, script


def test_version_and_ops(inst):
    p = inst.run("--version")
    assert p.returncode == 0, out(p)
    assert p.stdout.strip() == f"rlx-conformance {VERSION}"  # no git commit: not a checkout
    p = inst.run("ops", "--format", "json")
    assert p.returncode == 0, out(p)
    names = {r["name"] for r in json.loads(p.stdout)}
    assert {"exp", "hard_sigmoid", "reduce_sum"} <= names


def test_run_writes_results(run_dir):
    doc = json.loads((run_dir / "results.json").read_text())
    assert doc["run"]["harness"] == {"name": "rlx-conformance", "version": VERSION, "commit": None}
    assert doc["cases"] and {c["op"] for c in doc["cases"]} == {"exp"}


def test_report_of_the_run(inst, run_dir):
    p = inst.run("report", str(run_dir), "--no-plots")  # the template is package data; plots are not
    assert p.returncode == 0, out(p)
    assert (run_dir / "report.html").stat().st_size > 0


def test_repro_a_case_by_id(inst, run_dir):
    cases = json.loads((run_dir / "results.json").read_text())["cases"]
    case = next(c["id"] for c in cases if c["outcome"] == "pass")
    p = inst.run("repro", case, "--report", str(inst.work / "repro"))
    assert p.returncode == 0, out(p)
    assert p.stdout.startswith(f"pass  {case}"), out(p)
    assert list((inst.work / "repro" / "repro").glob("*/repro.py")), out(p)


def test_cases_folder_overrides_a_shipped_file(inst, run_dir):
    """``--cases DIR`` with one file: no known divergences, so a case the shipped file marks as a
    known divergence now fails; every other data file still comes from the wheel."""
    cases = json.loads((run_dir / "results.json").read_text())["cases"]
    known = [c["id"] for c in cases if c["outcome"] == "xfail"]
    assert known, "no known divergence among exp float32 lazy: pick another case for this test"
    over = inst.work / "my-cases"
    over.mkdir()
    (over / "known_divergences.toml").write_text("# this project knows of no divergence\n")
    p = inst.run("repro", known[0], "--cases", "my-cases", "--report", str(inst.work / "repro-over"))
    assert p.returncode == 1, out(p)
    assert p.stdout.startswith(f"fail  {known[0]}"), out(p)


def test_validate_the_example_kernel(inst):
    """docs/porting-a-kernel.md, step 3, on a copy of the example in the user's folder."""
    shutil.copy(ROOT / "examples" / "kernels" / "good_hard_sigmoid.py", inst.work)
    p = inst.run("validate", "hard_sigmoid", "--kernel", "good_hard_sigmoid.py:hard_sigmoid", "--mode", "eager",
                 "--report", str(inst.work / "validate"), "--no-progress", "--workers", WORKERS)
    assert p.returncode == 0, out(p)
    assert "PASS: hard_sigmoid with good_hard_sigmoid.py:hard_sigmoid" in " ".join(p.stdout.split())


def test_pytest_plugin_on_a_project_matrix(inst):
    (inst.work / "conformance.toml").write_text(
        '[matrix]\nbackend = "mlx"\ndevices = "cpu"\nmodes = ["lazy"]\nops = ["exp"]\ndtypes = ["float32"]\n')
    p = inst.call(str(inst.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rlx-workers", WORKERS,
                  "conformance.toml")
    assert p.returncode == 0, out(p)
    assert " passed" in p.stdout and "error" not in p.stdout.splitlines()[-1], out(p)
