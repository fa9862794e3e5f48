"""Repro bundles (rlx_conformance/run/bundle.py): the arrays, case.json, and a repro.py that runs in a
clean interpreter without rlx_conformance, reproduces the harness's MLX call bit for bit and its
verdict (exit 1 while failing, 0 when passing).

The repro.py runs use ``python -I`` with an environment that has no PYTHONPATH, from a directory
outside the repository, so nothing of this checkout is importable there.
"""
from __future__ import annotations

import json
import os
import platform
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.generate import matrix
from rlx_conformance.generate.matrix import make_inputs, make_seeds
from rlx_conformance.run.derivatives import handed_seeds
from rlx_conformance.run.bundle import BundleSink, bundle_name, reproduce
from rlx_conformance.run.portable import standalone
from rlx_conformance.run.runner import Runner
from rlx_conformance.run.session import find_case, supports
from standalone import clean_run

WRONG_SIZE = 7  # "odd" [[7]]: the test kernel below returns wrong values
CRASH_SIZE = 15  # "matrix" [[3, 5]]: the test kernel below dies by SIGSEGV


def pick(op: str, dtype: str, mode: str, grad: str = "", **attrs) -> matrix.Case:
    """The smallest case (at least 2 elements, random values) of op/dtype/mode with these attrs;
    ``grad``: of that derivative's cases."""
    cases = [c for c in matrix.generate([matrix.Target("mlx", "cpu", mode)], ops=[op], dtypes=[dtype],
                                        supports=supports, grads=(grad,))
             if c.vals == "random" and c.size() >= 2 and all(c.attr_dict.get(k) == v for k, v in attrs.items())]
    assert cases, f"no {op}/{dtype} case with {attrs}"
    return min(cases, key=lambda c: c.size())


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- extraction ------------------------------------------------------------------------------------
def test_every_mlx_kernel_extracts_to_standalone_source():
    """The mechanism is general: every registered MLX kernel's source closure compiles and imports
    nothing of this repository."""
    for op, entry in get_backend("mlx").kernels.items():
        if not entry.native:
            continue
        src, names = standalone({"kernel": entry.fn}, kernel="kernel")
        compile(src, op, "exec")
        imports = [ln for ln in src.splitlines() if ln.startswith(("import ", "from "))]
        assert not [ln for ln in imports if "rlx_conformance" in ln or "backends" in ln], (op, imports)


def test_bundle_names_are_one_path_component_and_distinct():
    ids = ["exp/float16/shape:1031/vals:special/mlx-cpu-compiled",
           "exp/float16/shape:1031/vals:special/mlx-cpu-eager",
           "dot_general/float32/" + "x" * 300 + "/mlx-cpu-lazy",
           "dot_general/float32/" + "x" * 299 + "y/mlx-cpu-lazy"]
    names = [bundle_name(i) for i in ids]
    assert len(set(names)) == len(ids)
    assert all("/" not in n and len(n) <= 150 for n in names)


# -- repro.py against the harness -------------------------------------------------------------------
CASES = [  # one per family, every mode, bfloat16 included
    ("softmax", "bfloat16", "eager", {}),
    ("reduce_max", "float16", "eager", {"axes": (1,), "keep_dim": True}),
    ("exp", "float32", "compiled", {}),
    ("onnx.ScatterElements", "float32", "lazy", {"reduction": "add"}),
    ("dense_solve", "float64", "lazy", {}),
    ("mat_mul", "float32", "lazy", {}),
]


@pytest.mark.parametrize("op,dtype,mode,attrs", CASES, ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_repro_reproduces_the_harness(tmp_path, op, dtype, mode, attrs):
    """repro.py gives the harness's outputs bit for bit and its verdict as the exit status."""
    case = pick(op, dtype, mode, **attrs)
    r = reproduce(case, tmp_path)
    folder = tmp_path / r.repro
    doc = json.loads((folder / "case.json").read_text())
    assert doc["id"] == case.id and doc["repro_py"] == "repro.py"
    assert doc["self_check"] == "agrees"
    assert {p.name for p in folder.iterdir()} == {"inputs.npz", "expected.npz", "actual.npz", "case.json", "repro.py"}
    src = (folder / "repro.py").read_text()
    assert "rlx_conformance" not in "\n".join(ln for ln in src.splitlines() if ln.startswith(("import", "from")))
    p = clean_run(folder / "repro.py", "--save", str(tmp_path / "out.npz"), cwd=tmp_path)
    assert p.returncode == (0 if r.outcome == "pass" else 1), p.stdout + p.stderr
    with np.load(folder / "actual.npz") as a, np.load(tmp_path / "out.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert same_bits(a[k], b[k]), k
    if dtype == "bfloat16":
        with np.load(folder / "inputs.npz") as z:
            assert z["in0"].dtype == np.uint16  # bits, with the dtype in case.json
        assert doc["inputs"][0] == {"dtype": "bfloat16", "shape": list(case.shapes[0]), "stored_as": "uint16 bits"}


def test_known_mismatch_exits_1(tmp_path):
    """float64 exp on MLX's CPU is float32-accurate (cases/known_divergences.toml): the bundle's
    repro.py says so and exits 1."""
    case = find_case("exp/float64/shape:1031/vals:random/mlx-cpu-eager")
    r = reproduce(case, tmp_path)
    assert r.outcome == "xfail"
    p = clean_run(tmp_path / r.repro / "repro.py", cwd=tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "STILL FAILS" in p.stdout and "first elements beyond tolerance" in p.stdout


@pytest.mark.skipif(not (sys.platform == "linux" and platform.machine() == "x86_64"),
                    reason="integer division by zero traps (SIGFPE) on x86-64 only")
def test_real_crash_bundle_repro_dies(tmp_path):
    """MLX's int32 division by zero kills the process: the crash bundle (written by the parent,
    from regenerated inputs) has no actual.npz, and its repro.py dies by the signal."""
    case = find_case("div/int32/shape:1031+1031/vals:special/mlx-cpu-eager")
    (r,) = Runner(workers=1, timeout=60, bundles=BundleSink(tmp_path, always=True)).run([case])
    assert r.outcome == "xfail" and "was crash" in r.message
    folder = tmp_path / r.repro
    assert not (folder / "actual.npz").exists()
    assert json.loads((folder / "case.json").read_text())["outcome"] == "xfail"
    p = clean_run(folder / "repro.py", cwd=tmp_path)
    assert p.returncode == -signal.SIGFPE, p.stdout + p.stderr


# -- bundles in a run -------------------------------------------------------------------------------
def broken_neg(x):
    """-x, except: wrong values for WRONG_SIZE elements, SIGSEGV for CRASH_SIZE."""
    import mlx.core as mx

    if x.size == CRASH_SIZE:
        os.kill(os.getpid(), signal.SIGSEGV)
    out = mx.negative(x)
    return out + 1 if x.size == WRONG_SIZE else out


def install_broken_neg() -> None:
    mlx = get_backend("mlx")
    mlx.register("neg", broken_neg, devices=dict(mlx.kernels["neg"].dtypes), replace=True, origin="tests")


def test_run_bundles_only_failing_cases(tmp_path):
    """Through the runner: a wrong result gets a full bundle from the worker, whose repro.py embeds
    the contributed kernel's source and exits 1; a crash gets one from the parent, without
    actual.npz; passing cases get none."""
    cases = [c for c in matrix.generate([matrix.Target("mlx", "cpu", "eager")], ops=["neg"], dtypes=["float32"])
             if c.vals == "random" and c.size() in (1, WRONG_SIZE, CRASH_SIZE, 24)]
    sink = BundleSink(tmp_path, timeout=30)
    results = {r.id: r for r in Runner(workers=1, timeout=30, init="test_bundle:install_broken_neg",
                                       bundles=sink).run(cases)}
    by_size = {c.size(): results[c.id] for c in cases}
    wrong, crash = by_size[WRONG_SIZE], by_size[CRASH_SIZE]
    assert (wrong.outcome, crash.outcome) == ("fail", "crash")
    assert all(r.repro is None for s, r in by_size.items() if s not in (WRONG_SIZE, CRASH_SIZE))
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == sorted(
        bundle_name(r.id) for r in (wrong, crash))
    wf, cf = tmp_path / wrong.repro, tmp_path / crash.repro
    assert (wf / "actual.npz").exists() and not (cf / "actual.npz").exists()
    assert json.loads((cf / "case.json").read_text())["outcome"] == "crash"
    src = (wf / "repro.py").read_text()
    assert "def broken_neg(x):" in src and "test_bundle" not in src
    p = clean_run(wf / "repro.py", cwd=tmp_path)
    assert p.returncode == 1 and "STILL FAILS" in p.stdout, p.stdout + p.stderr


# -- derivative cases -------------------------------------------------------------------------------
GRAD_CASES = [  # every derivative kind and mode; a non-differentiable input (where's condition)
    ("tanh", "bfloat16", "eager", "vjp"),
    ("where", "float32", "compiled", "jvp"),
    ("where", "float32", "eager", "vjp"),
    ("softmax", "float32", "lazy", "hvp"),
    ("softmax", "float32", "compiled", "vjp"),  # its cotangent handed to MLX column-major
    ("mul", "float16", "compiled", "vjp"),
]


@pytest.mark.parametrize("op,dtype,mode,grad", GRAD_CASES, ids=[f"{c[0]}-{c[3]}-{c[2]}" for c in GRAD_CASES])
def test_derivative_repro_reproduces_the_harness(tmp_path, op, dtype, mode, grad):
    """A derivative case's bundle holds its seeds, and its repro.py rebuilds the derivative call
    (mx.vjp / mx.jvp / the JVP of the VJP over the kernel): the harness's results bit for bit,
    its verdict as the exit status."""
    case = pick(op, dtype, mode, grad)
    r = reproduce(case, tmp_path)
    folder = tmp_path / r.repro
    doc = json.loads((folder / "case.json").read_text())
    assert doc["id"] == case.id and doc["grad"] == grad and doc["self_check"] == "agrees"
    assert {p.name for p in folder.iterdir()} == {"inputs.npz", "seeds.npz", "expected.npz", "actual.npz",
                                                   "case.json", "repro.py"}
    seeds = handed_seeds(case, make_seeds(case, make_inputs(case)))  # values and memory order MLX got
    with np.load(folder / "seeds.npz") as z:
        for kind, prefix in (("cotangents", "cot"), ("tangents", "tan")):
            for k, a in enumerate(getattr(seeds, kind)):
                assert (a is None) == (f"{prefix}{k}" not in z.files) and (doc["seeds"][kind][k] is None) == (a is None)
                if a is not None:
                    got = z[f"{prefix}{k}"]
                    assert got.tobytes() == a.view(got.dtype).tobytes()
                    assert got.flags.c_contiguous == a.flags.c_contiguous
    # which results the outputs are: the differentiated inputs (vjp, hvp) or floating outputs (jvp)
    g = doc["run"]["grad"]
    assert g["results"] == (g["floats"] if grad == "jvp" else g["diff"])
    assert doc["judge"]["kind"] == "derivative" and all(o["bound"] for o in doc["judge"]["outputs"])
    src = (folder / "repro.py").read_text()
    assert "rlx_conformance" not in "\n".join(ln for ln in src.splitlines() if ln.startswith(("import", "from")))
    assert {"vjp": "mx.vjp", "jvp": "mx.jvp", "hvp": "mx.jvp of mx.vjp"}[grad] in src
    p = clean_run(folder / "repro.py", "--save", str(tmp_path / "out.npz"), cwd=tmp_path)
    assert p.returncode == (0 if r.outcome == "pass" else 1), p.stdout + p.stderr
    assert f"the {grad} of {op}" in p.stdout
    with np.load(folder / "actual.npz") as a, np.load(tmp_path / "out.npz") as b:
        assert sorted(a.files) == sorted(b.files) == [f"out{j}" for j in range(len(g["results"]))]
        for k in a.files:
            assert same_bits(a[k], b[k]), k


def wrong_vjp_tanh(x):
    """tanh whose own VJP (mx.custom_function) misses the factor 1 - tanh(x)^2."""
    import mlx.core as mx

    @mx.custom_function
    def f(a):
        return mx.tanh(a)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        return (cotangent,)

    return f(x)


def install_wrong_vjp_tanh() -> None:
    mlx = get_backend("mlx")
    mlx.register("tanh", wrong_vjp_tanh, devices=dict(mlx.kernels["tanh"].dtypes), replace=True, origin="tests")


def test_wrong_derivative_bundle_reports_the_failure(tmp_path):
    """Through the runner: a kernel with a wrong VJP fails its VJP case (its JVP, MLX's own
    autodiff through the forward, passes); the failing case's bundle embeds the kernel, and its
    repro.py, in a clean interpreter, rebuilds mx.vjp over it and reports the failure."""
    cases = [c for c in matrix.generate([matrix.Target("mlx", "cpu", "compiled")], ops=["tanh"], dtypes=["float32"],
                                        grads=("vjp", "jvp")) if c.vals == "random" and c.size() == 7]
    results = {r.grad: r for r in Runner(workers=1, timeout=60, init="test_bundle:install_wrong_vjp_tanh",
                                         bundles=BundleSink(tmp_path, timeout=60)).run(cases)}
    assert (results["vjp"].outcome, results["jvp"].outcome) == ("fail", "pass")
    assert results["jvp"].repro is None and results["vjp"].message.startswith("vjp input 0:")
    folder = tmp_path / results["vjp"].repro
    doc = json.loads((folder / "case.json").read_text())
    assert doc["self_check"] == "agrees" and doc["outcome"] == "fail"
    src = (folder / "repro.py").read_text()
    assert "def wrong_vjp_tanh(x):" in src and "test_bundle" not in src
    p = clean_run(folder / "repro.py", cwd=tmp_path)
    assert p.returncode == 1 and "STILL FAILS" in p.stdout, p.stdout + p.stderr
    assert "FAIL vjp input 0" in p.stdout and "first elements beyond tolerance" in p.stdout


def test_derivative_repro_rebuilds_the_call_rather_than_replaying_it(tmp_path, monkeypatch):
    """The harness's MLX derivative scaled by 1.5 (a wrong transform, not a wrong kernel): the case
    fails with the scaled results in actual.npz, while repro.py, which rebuilds mx.jvp over the
    kernel itself, finds MLX right (exit 0): the bundle replays no recorded output as MLX's."""
    mlx = get_backend("mlx")
    right = type(mlx).run_derivative
    monkeypatch.setattr(type(mlx), "run_derivative",
                        lambda self, *a, **k: [None if x is None else x * 1.5 for x in right(self, *a, **k)])
    case = pick("tanh", "float32", "lazy", "jvp")
    r = reproduce(case, tmp_path)
    assert r.outcome == "fail" and r.message.startswith("jvp output 0:")
    folder = tmp_path / r.repro
    assert json.loads((folder / "case.json").read_text())["self_check"] == "agrees"
    p = clean_run(folder / "repro.py", "--save", str(tmp_path / "out.npz"), cwd=tmp_path)
    assert p.returncode == 0 and "FIXED" in p.stdout, p.stdout + p.stderr
    with np.load(folder / "actual.npz") as a, np.load(tmp_path / "out.npz") as b:
        assert np.array_equal(a["out0"], b["out0"] * np.float32(1.5))


def test_a_bundle_without_repro_py_says_why_and_where(tmp_path, monkeypatch):
    """When repro.py cannot be assembled (a harness bug, not one of the known limits), the
    bundle keeps its arrays and case.json's ``repro_py_missing`` names the exception and the
    frames it was raised in, by package-relative path (core.errors.error_detail), not the
    machine's absolute paths."""
    from rlx_conformance.run import bundle

    def broken(*_a, **_k):
        raise ValueError("no source for this kernel")

    monkeypatch.setattr(bundle, "repro_script", broken)
    case = find_case("exp/float32/shape:7/vals:random/mlx-cpu-eager")
    r = reproduce(case, tmp_path)
    folder = tmp_path / r.repro
    doc = json.loads((folder / "case.json").read_text())
    assert doc["repro_py"] is None and not (folder / "repro.py").exists()
    why = doc["repro_py_missing"]
    assert why.startswith("ValueError: no source for this kernel")
    assert 'File "' in why and "broken" in why and str(Path(__file__).parent) not in why
    assert (folder / "inputs.npz").exists() and (folder / "expected.npz").exists()
