"""``rlx-conformance validate``: the worked examples of docs/porting-a-kernel.md, and each rule
the verdict enforces (tests/validate_kernels.py holds one kernel per broken rule).

Every run here is small: hard_sigmoid (14 cases per dtype), eager mode, one worker, usually one
dtype or a few case ids, no speed sampling unless under test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rlx_conformance.cli import main as cli
from rlx_conformance.ops import get_op

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "kernels"
KERNELS = Path(__file__).resolve().parent / "validate_kernels.py"
FAST = ["--mode", "eager", "--workers", "1", "--speed-cases", "0"]


def validate(tmp_path, op, kernel, *extra, capsys=None):
    """Run the CLI in this process; returns (exit code, validate.json or None, stdout, stderr)."""
    report = tmp_path / "report"
    code = cli.main(["validate", op, "--kernel", kernel, "--report", str(report), *FAST, *extra])
    out, err = capsys.readouterr() if capsys else ("", "")
    doc = json.loads((report / "validate.json").read_text()) if (report / "validate.json").exists() else None
    return code, doc, out, err


def results(tmp_path) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads((tmp_path / "report" / "results.json").read_text())["cases"]}


# -- the worked examples of the guide -------------------------------------------------------------
def test_good_example_passes_the_whole_matrix(tmp_path, capsys):
    code, doc, out, _ = validate(tmp_path, "hard_sigmoid", f"{EXAMPLES / 'good_hard_sigmoid.py'}:hard_sigmoid",
                                 "--speed-cases", "2", capsys=capsys)
    assert code == 0, out
    assert doc["summary"]["pass"] == doc["summary"]["total"] == 56  # 4 dtypes x 14
    assert set(doc["by_dtype"]) == {"float32", "float16", "bfloat16", "float64"}
    assert "PASS" in out and "by dtype" in out and "by shape family" in out
    # speed against the built-in kernel and the CPU reference, on 2 sampled passing cases
    assert doc["speed"]["builtin"]["cases"] == 2 and doc["speed"]["reference"]["cases"] == 2
    assert "built-in kernel" in out and "CPU reference" in out
    # the origin is the module path, in the verdict and in every result record
    assert doc["kernel"].endswith("good_hard_sigmoid.py:hard_sigmoid")
    assert all(r["origin"] == doc["kernel"] for r in results(tmp_path).values())
    # for this run only: the built-in kernel is back afterwards
    from rlx_conformance.backends import get_backend

    assert get_backend("mlx").kernels["hard_sigmoid"].origin == "builtin"


def test_broken_example_fails_with_its_worst_cases_and_bundles(tmp_path, capsys):
    code, doc, out, _ = validate(tmp_path, "hard_sigmoid", f"{EXAMPLES / 'broken_hard_sigmoid.py'}:hard_sigmoid",
                                 "--dtypes", "float32", capsys=capsys)
    assert code == 1
    fails = [w for w in doc["worst"] if w["outcome"] == "fail"]
    assert fails and all("hard_sigmoid/float32/" in w["id"] for w in fails)
    assert max(w["max_ulp"] for w in fails) > 1000  # cancellation near x = -3: not a rounding slip
    assert "worst errors" in out and "FAIL" in out
    # one repro bundle per failed case (rlx_conformance/run/bundle.py), written by the worker that had
    # the arrays: inputs, reference, the kernel's outputs
    bundles = sorted(p for p in (tmp_path / "report" / "repro").iterdir() if not p.name.startswith("."))
    assert len(bundles) == doc["summary"]["fail"] == doc["bundles"]
    b = bundles[0]
    assert {"inputs.npz", "expected.npz", "actual.npz", "case.json"} <= {p.name for p in b.iterdir()}
    case = json.loads((b / "case.json").read_text())
    assert case["outcome"] == "fail" and case["id"].startswith("hard_sigmoid/float32/")
    with np.load(b / "inputs.npz") as z:
        assert z["in0"].dtype == np.float32
    assert all(bad["repro"] and "--case" in bad["rerun"] for bad in doc["bad"])
    assert "rerun one case: rlx-conformance validate hard_sigmoid" in out


# -- isolation: crash and hang --------------------------------------------------------------------
def test_crash_and_hang_are_recorded_and_validation_goes_on(tmp_path):
    code, doc, _, _ = validate(tmp_path, "hard_sigmoid", f"{KERNELS}:crash_or_hang", "--dtypes", "float32",
                               "--timeout", "2")
    assert code == 1
    by_size = {}
    for r in results(tmp_path).values():
        n = int(np.prod(r["shape"][0])) if r["shape"][0] else 1
        by_size.setdefault(n, set()).add(r["outcome"])
    assert by_size[7] == {"crash"}
    assert by_size[24] == {"timeout"}
    assert all(o == {"pass"} for n, o in by_size.items() if n not in (7, 24))
    assert doc["summary"]["total"] == 14
    # the later stages ran after the crash and the hang
    assert [p["verdict"] for p in doc["error_inputs"]] == ["rejected (harness pre-validation)"]
    # the records, rerun hints and repro bundles of the crash and the hang name and run the
    # contributed kernel, not the built-in one
    kernel = f"{KERNELS}:crash_or_hang"
    for r in results(tmp_path).values():
        assert r["origin"] == kernel, (r["id"], r["origin"])
        if r["outcome"] in ("crash", "timeout"):
            repro = (tmp_path / "report" / r["repro"] / "repro.py").read_text()
            assert "def crash_or_hang(" in repro and "os.kill(os.getpid(), signal.SIGSEGV)" in repro, r["id"]


# -- the call convention --------------------------------------------------------------------------
ONE_CASE = ["--case", "hard_sigmoid/float32/shape:3x5/vals:random/mlx-cpu-eager",
            "--case", "hard_sigmoid/float16/shape:2x3x4/vals:special/mlx-cpu-eager"]


@pytest.mark.parametrize("name, words", [
    ("wrong_shape", "has shape (1, "),
    ("wrong_dtype", "has dtype int32"),
    ("not_an_array", "is a numpy.ndarray, not an array of the mlx backend"),
    ("mutates_input", "modified input 0 (x) in place"),
])
def test_contract_violations_are_reported_as_such(tmp_path, name, words):
    code, _, _, _ = validate(tmp_path, "hard_sigmoid", f"{KERNELS}:{name}", *ONE_CASE)
    assert code == 1
    rs = results(tmp_path)
    assert len(rs) == 2
    for r in rs.values():
        assert r["outcome"] == "contract", r
        assert words in r["message"], r["message"]
        assert r["max_ulp"] is None  # never judged as a numeric mismatch


def test_input_mutation_is_caught_in_compiled_mode_too(tmp_path):
    """mx.compile hides a write to an input from the caller; the check sees it anyway."""
    report = tmp_path / "report"
    code = cli.main(["validate", "hard_sigmoid", "--kernel", f"{KERNELS}:mutates_input", "--report", str(report),
                     "--mode", "compiled", "--workers", "1", "--speed-cases", "0",
                     "--case", "hard_sigmoid/float32/shape:3x5/vals:random/mlx-cpu-compiled"])
    assert code == 1
    (r,) = results(tmp_path).values()
    assert r["outcome"] == "contract" and "modified input 0 (x)" in r["message"]


# -- usage errors: one line, exit 2 -------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["hard_sigmoidd", "--kernel", f"{KERNELS}:wrong_shape"], "unknown op 'hard_sigmoidd' (did you mean hard_sigmoid"),
    (["hard_sigmoid", "--kernel", "no_such_module_xyz:f"], "cannot load kernel module no_such_module_xyz"),
    (["hard_sigmoid", "--kernel", "/no/such/file.py:f"], "no file /no/such/file.py"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:no_such_function"], "has no function 'no_such_function'"),
    (["hard_sigmoid", "--kernel", "nocolon"], "MODULE:FUNC"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:two_inputs"], "takes 2 positional input(s), the spec has 1"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:wrong_shape", "--device", "tpu"], "no device 'tpu'"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:wrong_shape", "--mode", "jit"], "no mode 'jit'"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:wrong_shape", "--backend", "cpu"], "the cpu backend is the reference"),
    (["hard_sigmoid", "--kernel", f"{KERNELS}:wrong_shape", "--case", "exp/float32/x"], "no case"),
])
def test_usage_errors_exit_2_with_one_line(tmp_path, capsys, args, words):
    code = cli.main(["validate", *args, "--report", str(tmp_path / "r")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("rlx-conformance: error: "), err
    assert words in err, err
    assert not (tmp_path / "r").exists()


def test_kernel_module_that_raises_at_import_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad_kernel.py"
    bad.write_text("raise RuntimeError('half-written kernel')\n")
    assert cli.main(["validate", "hard_sigmoid", "--kernel", f"{bad}:f"]) == 2
    err = capsys.readouterr().err
    assert "cannot load kernel module" in err and "RuntimeError: half-written kernel" in err


def test_importable_module_kernel(tmp_path, monkeypatch):
    """MODULE:FUNC form: a module importable from the current directory, as with python -m."""
    (tmp_path / "mykernels.py").write_text("import mlx.core as mx\n\n"
                                           "def hs(x):\n    return mx.clip((x + 3) / 6, 0.0, 1.0)\n")
    monkeypatch.chdir(tmp_path)
    code, doc, _, _ = validate(tmp_path, "hard_sigmoid", "mykernels:hs", *ONE_CASE)
    assert code == 0 and doc["kernel"] == "mykernels:hs"


# -- known divergences: excused only where the built-in kernel shares them -----------------------------
def test_known_divergence_shared_with_builtin_is_xfail_and_strict_fails(tmp_path):
    code, _, _, _ = validate(tmp_path, "sign", f"{KERNELS}:sign_like_builtin", "--dtypes", "float32")
    rs = results(tmp_path)
    xf = [r for r in rs.values() if r["outcome"] == "xfail"]
    assert xf and all("built-in kernel fails this case too" in r["message"] for r in xf)
    assert all(r["origin"] == f"{KERNELS}:sign_like_builtin" for r in xf)  # excused, still named
    assert code == 0
    code, _, _, _ = validate(tmp_path, "sign", f"{KERNELS}:sign_like_builtin", "--dtypes", "float32", "--strict")
    rs = results(tmp_path)
    assert code == 1 and not any(r["outcome"] == "xfail" for r in rs.values())
    assert any("--strict" in r["message"] for r in rs.values() if r["outcome"] == "fail")


@pytest.mark.parametrize("op,kernel", [("softmax", "softmax_nan_float64"), ("exp", "exp_constant_float64")])
def test_a_shared_divergence_is_no_blank_cheque(tmp_path, op, kernel):
    """The built-in kernel fails float64 softmax and exp by ~1e-8 relative (known divergences);
    a port returning NaN everywhere, or 42.0, fails those cases too, but differently or far worse:
    every such case is a failure naming the entry and why it does not excuse it (a kind or a cap
    the entry does not cover; the built-in kernel passing, or erring far less: its figures
    beside the port's), none an xfail."""
    code, _, _, _ = validate(tmp_path, op, f"{KERNELS}:{kernel}", "--dtypes", "float64")
    rs = results(tmp_path).values()
    bad = [r for r in rs if r["outcome"] == "fail"]
    assert code == 1 and len(bad) >= 10
    assert not [r["id"] for r in rs if r["outcome"] == "xfail"]
    assert all(" known divergence float64-" in r["message"] for r in bad)
    if op == "softmax":  # NaN where the reference is finite: a kind the precision entry never excuses
        assert all("it excuses value, not nonfinite" in r["message"] for r in bad)
    else:  # within the entry's caps on some cases: there the built-in kernel's figures decide
        assert any("more than 2x the built-in kernel's error: max_ulp" in r["message"] for r in bad)


def test_a_gather_nd_port_wrong_on_embedding_tables_is_caught(tmp_path):
    """GatherND's most common use is a row lookup in a rank-2 table: the matrix generates rank-1
    and rank-2 data, so a port wrong only there fails (before, every family had rank 3 or 4)."""
    code, _, _, _ = validate(tmp_path, "onnx.GatherND", f"{KERNELS}:gather_nd_wrong_on_tables",
                               "--dtypes", "float32")
    bad = {r["id"] for r in results(tmp_path).values() if r["outcome"] == "fail"}
    assert code == 1 and bad and all("/shape:50x8+" in i and "/batch_dims:0/" in i for i in bad)


# -- error-input parity -----------------------------------------------------------------------------
CHOL_CASE = ["--case", "cholesky/float32/shape:3x3/vals:random/mlx-cpu-eager"]


def test_error_input_parity_kernel_that_accepts_garbage_fails(tmp_path, capsys):
    code, doc, out, _ = validate(tmp_path, "cholesky", f"{KERNELS}:cholesky_unchecked", *CHOL_CASE, capsys=capsys)
    assert code == 1 and doc["summary"]["pass"] == 1  # the case passes: only parity fails
    probes = {p["description"]: p for p in doc["error_inputs"]}
    assert probes["non-square"]["verdict"].startswith("rejected (harness")
    pd = probes["not positive definite"]
    assert pd["harness"] is None and not pd["ok"] and pd["kernel"].startswith("accepts")
    assert "error input(s) accepted" in out and "error-input parity" in out


def test_error_input_parity_kernel_that_rejects_passes(tmp_path):
    code, doc, _, _ = validate(tmp_path, "cholesky", f"{KERNELS}:cholesky_checked", *CHOL_CASE)
    assert code == 0
    probes = {p["description"]: p for p in doc["error_inputs"]}
    assert probes["not positive definite"]["verdict"] == "rejected (kernel)"
    assert probes["not positive definite"]["kernel"].startswith("rejects: ValueError")


def test_error_inputs_declared_for_the_representative_families():
    """Elementwise binary (shapes), reductions (axes), gather/scatter and the ONNX custom ops
    (indices), mat_mul (contraction), cast (dtype): each declares error inputs, and each of
    them is rejected by the harness's pre-validation or by the CPU reference."""
    from rlx_conformance.backends import get_backend
    from rlx_conformance.backends.base import prevalidate
    from rlx_conformance.core.errors import SpecError

    ops = ["add", "bit_and", "eq", "where", "fma", "clamp", "cast", "exp", "reduce_sum", "reduce_max",
           "arg_max", "softmax", "cumsum", "gather", "scatter_add", "onnx.GatherND", "onnx.ScatterElements",
           "mat_mul", "dot_general"]
    cpu = get_backend("cpu")
    for op in ops:
        spec = get_op(op)
        assert spec.error_inputs is not None, op
        errs = spec.error_inputs()
        assert errs, op
        for desc, inputs, attrs in errs:
            try:
                prevalidate(spec, inputs, attrs)
            except SpecError:
                continue
            with pytest.raises(Exception):  # noqa: B017 — the reference's own error type, whichever it is
                cpu.run(op, inputs, attrs)
    descs = {op: [d for d, _, _ in get_op(op).error_inputs()] for op in ("add", "reduce_sum", "cast", "mat_mul")}
    assert "shapes do not broadcast" in descs["add"] and "axis out of range" in descs["reduce_sum"]
    assert "unknown dtype" in descs["cast"] and "contraction mismatch" in descs["mat_mul"]


# -- fuzzing ------------------------------------------------------------------------------------------
def test_fuzz_finds_a_planted_bug_the_matrix_misses_and_shrinks_it(tmp_path, capsys):
    code, doc, out, _ = validate(tmp_path, "hard_sigmoid", f"{KERNELS}:planted_bug", "--dtypes", "float32",
                                 "--fuzz", "150", "--derandomize", capsys=capsys)
    assert doc["summary"]["pass"] == doc["summary"]["total"] == 14  # invisible to the matrix
    assert code == 1
    f = doc["fuzz"]
    assert f["derandomized"] and f["failure"] is not None
    fail = f["failure"]
    assert fail["outcome"] == "fail" and fail["dtype"] == "float32"
    assert fail["shapes"] == [[2]]  # shrunk: the smallest failing size
    assert fail["inputs"] == [["0.0", "0.0"]]  # and the simplest values
    bundle = tmp_path / "report" / f["bundle"]
    with np.load(bundle / "inputs.npz") as z:
        assert z["in0"].shape == (2,)
    assert "FAILURE" in out and "a fuzz failure" in out


def test_fuzz_on_a_good_kernel_finds_nothing(tmp_path):
    code, doc, _, _ = validate(tmp_path, "hard_sigmoid", f"{EXAMPLES / 'good_hard_sigmoid.py'}:hard_sigmoid",
                               "--dtypes", "float32", "--fuzz", "40", "--derandomize")
    assert code == 0 and doc["fuzz"]["failure"] is None and doc["fuzz"]["examples"] >= 40


def test_fuzz_strategy_respects_the_spec():
    """Examples keep the family's equalities (broadcast pairs still broadcast) and valid attrs."""
    from hypothesis import given, settings

    from rlx_conformance.generate.fuzz import example_strategy

    spec = get_op("reduce_sum")

    @settings(max_examples=30, derandomize=True, database=None, deadline=None)
    @given(example_strategy(spec, ["float32", "int32"]))
    def check(ex):
        attrs = dict(ex.attrs)
        spec.validate(ex.shapes, spec.case_dtypes(ex.dtype), attrs)
        assert ex.inputs[0].shape == ex.shapes[0] and ex.inputs[0].dtype.name == ex.dtype
    check()


# -- entry points: kernels registered permanently by another package -----------------------------------
PLUGIN = textwrap.dedent('''\
    """A third-party package that registers an MLX kernel for neg through the entry-point group."""
    import mlx.core as mx


    def register(backend):
        backend.register("neg", lambda x: mx.negative(x), replace=True)
''')


def _install_plugin(site: Path) -> None:
    """What pip install leaves in site-packages: the package and its dist-info with the entry point."""
    (site / "rlxplug").mkdir(parents=True)
    (site / "rlxplug" / "__init__.py").write_text(PLUGIN)
    info = site / "rlxplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlxplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rlx_conformance.kernels]\nmlx = rlxplug:register\n")
    (info / "RECORD").write_text("")


def test_entry_point_kernels_show_in_ops_and_run_everywhere(tmp_path):
    site = tmp_path / "site"
    _install_plugin(site)
    env = dict(os.environ, PYTHONPATH=str(site))
    ops = subprocess.run([sys.executable, "-m", "rlx_conformance", "ops", "--format", "json"], env=env,
                         capture_output=True, text=True, check=True, cwd=tmp_path)
    rows = {r["name"]: r for r in json.loads(ops.stdout)}
    origin = rows["neg"]["backends"]["mlx"]["origin"]
    assert origin == "rlxplug:register (entry point mlx, rlxplug 0.1)"
    assert rows["exp"]["backends"]["mlx"]["origin"] == "builtin"
    report = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "rlx_conformance", "run", "--ops", "neg", "--dtypes", "float32",
                          "--mode", "eager", "--workers", "1", "--report", str(report), "--no-progress"],
                         env=env, capture_output=True, text=True, cwd=tmp_path, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = json.loads((report / "results.json").read_text())["cases"]
    assert cases and all(c["origin"] == origin for c in cases)  # loaded in every worker
    assert f"neg on mlx from {origin}" in " ".join(run.stdout.split())  # rich wraps at 80 columns


def test_broken_entry_point_is_named(tmp_path):
    site = tmp_path / "site"
    _install_plugin(site)
    (site / "rlxplug" / "__init__.py").write_text(
        "def register(backend):\n    backend.register('neg', lambda x, y: x, replace=True)\n")
    env = dict(os.environ, PYTHONPATH=str(site))
    ops = subprocess.run([sys.executable, "-m", "rlx_conformance", "ops"], env=env, capture_output=True,
                         text=True, cwd=tmp_path, check=False)
    assert ops.returncode == 2
    assert "entry point mlx = rlxplug:register (rlxplug 0.1)" in ops.stderr
    assert "takes 2 positional input(s)" in ops.stderr


def test_fuzz_without_hypothesis_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis -> ImportError
    code = cli.main(["validate", "hard_sigmoid", "--kernel", f"{EXAMPLES / 'good_hard_sigmoid.py'}:hard_sigmoid",
                     "--fuzz", "10", "--report", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "--fuzz needs hypothesis" in err and err.count("\n") == 1


def test_worst_lists_failures_before_excused_cases_and_non_finite_first():
    """The kernel's one real failure (small, finite) must head the list above excused cases with
    huge errors; a NaN mismatch with error figures 0 ranks above finite errors."""
    from rlx_conformance.core.results import CaseResult
    from rlx_conformance.generate.matrix import Target
    from rlx_conformance.run.validate import Validation

    def rec(i, outcome, ulp, nonfinite=0):
        return CaseResult(id=f"c{i}", op="exp", dtype="float32", shape=[[3]], family="f", attrs={}, vals="random",
                          backend="mlx", device="cpu", mode="eager", outcome=outcome, max_ulp=ulp,
                          max_rel_err=ulp * 1e-7, max_abs_err=ulp * 1e-7, nonfinite_mismatches=nonfinite,
                          divergence={"entry": "e", "was": "fail"} if outcome == "xfail" else None)

    v = Validation("exp", "k", Target("mlx", "cpu", "eager"))
    v.results = [rec(1, "xfail", 1e9), rec(2, "fail", 3.0), rec(3, "xfail", 1e12), rec(4, "fail", 0.0, nonfinite=5),
                 rec(5, "pass", 0.0)]
    assert [r.id for r in v.worst(5)] == ["c4", "c2", "c3", "c1"]


def test_fuzz_does_not_excuse_a_failure_the_built_in_shares_only_in_name(tmp_path):
    """Fuzzing judges as the matrix does: the all-NaN float64 softmax fails examples the built-in
    kernel also fails (by ~1e-9), but with NaN where the built-in has digits: a fuzz failure,
    not a known divergence."""
    code, doc, _, _ = validate(tmp_path, "softmax", f"{KERNELS}:softmax_nan_float64", "--dtypes", "float64",
                               "--fuzz", "10", "--derandomize")
    assert code == 1
    assert doc["fuzz"]["failure"]["outcome"] == "fail" and doc["fuzz"]["known_divergences"] == 0
    assert doc["fuzz"]["failure"]["nonfinite_mismatches"] >= 1


# -- every outcome kind names and embeds the contributed kernel (issue 15 item 3) -----------------
def test_every_bad_outcome_names_and_embeds_the_contributed_kernel(tmp_path, capsys):
    """fail, error, contract, crash and timeout: each record names the contributed kernel as its
    origin, the printed rerun hint passes that kernel (``--kernel '<spec>'``) with the case id on
    a line of its own, and the case's repro bundle runs that kernel (its repro.py reproduces the
    failure, it does not report FIXED as the built-in kernel would)."""
    kernel = f"{KERNELS}:every_outcome"
    code, doc, out, _ = validate(tmp_path, "hard_sigmoid", kernel, "--dtypes", "float32", "--timeout", "2",
                                 "--show", "20", capsys=capsys)
    assert code == 1
    rs = results(tmp_path)
    by_outcome: dict[str, list[dict]] = {}
    for r in rs.values():
        assert r["origin"] == kernel, (r["id"], r["origin"])
        by_outcome.setdefault(r["outcome"], []).append(r)
    assert {"pass", "fail", "error", "contract", "crash", "timeout"} <= set(by_outcome), sorted(by_outcome)
    lines = out.splitlines()
    for outcome in ("fail", "error", "contract", "crash", "timeout"):
        r = by_outcome[outcome][0]
        hint = f"rerun: rlx-conformance validate hard_sigmoid --kernel '{kernel}' --device cpu --mode eager " \
               f"--case '{r['id']}'"
        assert any(line.strip() == hint for line in lines), (outcome, out)
        bad = next(b for b in doc["bad"] if b["id"] == r["id"])
        assert f"--kernel '{kernel}'" in bad["rerun"]
        bundle = tmp_path / "report" / r["repro"]
        assert "def every_outcome(" in (bundle / "repro.py").read_text(), outcome
        p = subprocess.run([sys.executable, str(bundle / "repro.py"), "--timeout", "3"], check=False, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode != 0 and "FIXED" not in p.stdout, (outcome, p.returncode, p.stdout, p.stderr)
        if outcome in ("fail", "error", "contract"):
            assert "STILL FAILS" in p.stdout, (outcome, p.stdout, p.stderr)


def test_fuzz_shrinks_shapes_and_values_of_an_op_with_a_generate_hook(tmp_path, capsys):
    """GatherND draws its indices through its generate hook; its fuzz failure still shrinks to
    the smallest shapes that show the bug (a batch of 2, one element each) and prints the
    shrunk inputs' values. The port forgets the batch offset, which only a batch > 1 reveals."""
    code, doc, out, _ = validate(tmp_path, "onnx.GatherND", f"{KERNELS}:gather_nd_first_try", "--case",
                                 "onnx.GatherND/float32/shape:10+4x1/batch_dims:0/vals:special/mlx-cpu-eager",
                                 "--fuzz", "60", "--derandomize", capsys=capsys)
    assert code == 1 and doc["summary"]["pass"] == 1  # the one matrix case has batch_dims 0
    fail = doc["fuzz"]["failure"]
    assert fail["attrs"]["batch_dims"] >= 1
    assert sum(int(np.prod(s)) for s in fail["input_shapes"]) <= 6, fail["input_shapes"]
    assert fail["inputs"] is not None and len(fail["inputs"]) == 2
    assert f"inputs {fail['inputs']}" in " ".join(out.split()) or "shrunk inputs:" in out


# -- derivatives: validate --grad (issue 16 item 8) ------------------------------------------------
def _grad_cases(op: str, grad: str, dtype: str = "float32"):
    from rlx_conformance.generate.matrix import Target, generate

    return [c for c in generate([Target("mlx", "cpu", "eager")], ops=[op], dtypes=[dtype], grads=(grad,))
            if c.grad == grad]


def _failing(tmp_path) -> dict[str, dict]:
    return {i: r for i, r in results(tmp_path).items() if r["outcome"] != "pass"}


def _check_named(out: str, doc: dict, rs: dict[str, dict], label: str) -> None:
    """Each failing derivative case names ``label`` as its wrong derivative, in the printed verdict
    (with positions: reference, built-in and contributed values; the rerun line with --grad), in
    validate.json's bad list and in results.json's mismatch rows."""
    assert f"wrong derivative: {label}" in out, out
    rows = [ln.strip() for ln in out.splitlines() if ln.strip().startswith(f"{label} at (")]
    assert rows and all("reference " in r and "built-in " in r and "contributed " in r for r in rows), rows
    assert "rerun: rlx-conformance validate " in out and " --grad vjp --case '" in out
    for bad in doc["bad"]:
        assert bad["outcome"] == "fail" and bad["grad"] == "vjp" and bad["derivatives"] == [label], bad
        assert f"--grad vjp --case '{bad['id']}'" in bad["rerun"]
        first = rs[bad["id"]]["mismatch"]["first"]
        assert first and {row["of"] for row in first} == {label}


def test_grad_a_vjp_missing_its_factor_is_rejected(tmp_path, capsys):
    """tanh's custom VJP without (1 - y^2): every vjp case with elements fails, naming d/d input 0
    (x); the forward and the JVP (MLX's autodiff of the forward) pass."""
    code, doc, out, _ = validate(tmp_path, "tanh", f"{KERNELS}:tanh_vjp_missing_factor", "--grad", "vjp,jvp",
                                 "--dtypes", "float32", capsys=capsys)
    assert code == 1
    rs = results(tmp_path)
    sized = {c.id for c in _grad_cases("tanh", "vjp") if c.size() > 0}
    assert sized and set(_failing(tmp_path)) == sized
    assert doc["grads"] == ["vjp", "jvp"] and doc["by_grad"]["jvp"] == {"pass": len(_grad_cases("tanh", "jvp"))}
    assert doc["by_grad"]["forward"] == {"pass": 14}
    _check_named(out, doc, rs, "d/d input 0 (x)")
    assert "by derivative" in out and "FAIL" in out


def test_grad_a_wrong_custom_jvp_names_the_output(tmp_path, capsys):
    """tanh's custom JVP without its factor: the jvp cases with elements fail, naming "JVP of
    output 0"; the vjp cases (MLX's autodiff) pass."""
    code, doc, out, _ = validate(tmp_path, "tanh", f"{KERNELS}:tanh_jvp_missing_factor", "--grad", "vjp,jvp",
                                 "--dtypes", "float32", capsys=capsys)
    sized = {c.id for c in _grad_cases("tanh", "jvp") if c.size() > 0}
    assert code == 1 and sized and set(_failing(tmp_path)) == sized
    assert all(b["derivatives"] == ["JVP of output 0"] and "--grad jvp --case" in b["rerun"] for b in doc["bad"])
    assert "wrong derivative: JVP of output 0" in out and "JVP of output 0 at (" in out


def test_grad_a_transposed_mat_mul_vjp_is_rejected_on_a_non_square_case(tmp_path, capsys):
    """A's cotangent transposed (B uᵀ reshaped to A's shape) on 3x5 @ 5x4: d/d input 0 (a) is
    named, B's cotangent is right and not named."""
    case = "mat_mul/float32/shape:3x5+5x4/vals:random/grad:vjp/mlx-cpu-eager"
    code, doc, out, _ = validate(tmp_path, "mat_mul", f"{KERNELS}:mat_mul_vjp_transposed", "--grad", "vjp",
                                 "--case", case, capsys=capsys)
    assert code == 1 and list(_failing(tmp_path)) == [case]
    _check_named(out, doc, results(tmp_path), "d/d input 0 (a)")
    assert "(b)" not in out


def test_grad_a_gather_vjp_dropping_duplicate_indices_is_rejected_exactly_where_indices_repeat(tmp_path, capsys):
    """Gather's custom VJP assigning the cotangent instead of accumulating it fails the vjp cases
    whose indices (negative ones wrapped) repeat, and only those; the right (accumulating) VJP
    passes them all."""
    from rlx_conformance.generate.matrix import make_inputs

    def repeats(c) -> bool:
        x, idx = make_inputs(c)[:2]
        axis = dict(c.attrs)["axis"] % x.ndim
        w = np.where(idx < 0, idx + x.shape[axis], idx).ravel()
        return np.unique(w).size < w.size and x.size > 0

    cases = _grad_cases("gather", "vjp")
    with_repeats = {c.id for c in cases if repeats(c)}
    assert with_repeats and len(with_repeats) < len(cases)
    code, doc, out, _ = validate(tmp_path, "gather", f"{KERNELS}:gather_vjp_drops_duplicates", "--grad", "vjp",
                                 "--dtypes", "float32", capsys=capsys)
    assert code == 1 and set(_failing(tmp_path)) == with_repeats
    _check_named(out, doc, results(tmp_path), "d/d input 0 (x)")
    code, doc, _, _ = validate(tmp_path / "right", "gather", f"{KERNELS}:gather_vjp_right", "--grad", "vjp,jvp",
                               "--dtypes", "float32")
    assert code == 0 and doc["summary"]["pass"] == doc["summary"]["total"] == 18 + 2 * len(cases)


def test_grad_a_vjp_right_only_for_contiguous_cotangents_is_rejected(tmp_path, capsys):
    """The harness hands rank >= 2 seeds in column-major memory for every other input id
    (run/derivatives.handed_seeds): a custom VJP that reads its cotangent's buffer as row-major
    fails exactly those cases and passes the ones handed row-major."""
    from rlx_conformance.generate.matrix import make_inputs, make_seeds
    from rlx_conformance.run.derivatives import handed_seeds

    cases = _grad_cases("tanh", "vjp")
    strided = {c.id for c in cases
               if any(u is not None and u.size > 1 and not u.flags.c_contiguous
                      for u in handed_seeds(c, make_seeds(c, make_inputs(c))).cotangents)}
    assert strided and len(strided) < len(cases)
    code, doc, out, _ = validate(tmp_path, "tanh", f"{KERNELS}:tanh_vjp_contiguous_only", "--grad", "vjp",
                                 "--dtypes", "float32", capsys=capsys)
    assert code == 1 and set(_failing(tmp_path)) == strided
    _check_named(out, doc, results(tmp_path), "d/d input 0 (x)")


@pytest.mark.parametrize("kernel, mode", [("tanh_custom_vjp", "eager"), ("tanh_custom_vjp", "compiled"),
                                          ("tanh_plain", "lazy")])
def test_grad_right_kernels_pass(tmp_path, capsys, kernel, mode):
    """A right custom VJP (MLX calls it; its HVP is MLX's JVP of it) and a plain kernel (MLX
    differentiates through it) pass every vjp, jvp and hvp case, in each mode."""
    code, doc, out, _ = validate(tmp_path, "tanh", f"{KERNELS}:{kernel}", "--grad", "--dtypes", "float32",
                                 "--mode", mode, capsys=capsys)
    n = {g: len(_grad_cases("tanh", g)) for g in ("vjp", "jvp", "hvp")}
    assert code == 0, out
    assert doc["grads"] == ["vjp", "jvp", "hvp"]
    assert doc["by_grad"] == {"forward": {"pass": 14}, **{g: {"pass": k} for g, k in n.items()}}
    assert "PASS" in out


def test_grad_json_output_carries_the_wrong_derivative(tmp_path, capsys):
    case = "mat_mul/float32/shape:3x5+5x4/vals:random/grad:vjp/mlx-cpu-eager"
    code = cli.main(["validate", "mat_mul", "--kernel", f"{KERNELS}:mat_mul_vjp_transposed", "--report",
                     str(tmp_path / "report"), *FAST, "--grad", "vjp", "--case", case, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["exit_code"] == 1
    (bad,) = doc["bad"]
    assert bad["id"] == case and bad["derivatives"] == ["d/d input 0 (a)"]
    (worst,) = doc["worst"]
    rows = worst["mismatch"]["first"]
    assert rows and all(r["of"] == "d/d input 0 (a)" and "expected" in r and "actual" in r for r in rows)


@pytest.mark.parametrize("args, words", [
    (["eq", "--grad"], "--grad: eq has no derivative"),
    (["tanh", "--grad", "vjp,hessian"], "--grad wants all, none or derivative kinds"),
])
def test_grad_usage_errors_are_one_line(tmp_path, capsys, args, words):
    code = cli.main(["validate", args[0], "--kernel", f"{KERNELS}:tanh_plain", "--report", str(tmp_path / "r"),
                     *FAST, *args[1:]])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1, err
