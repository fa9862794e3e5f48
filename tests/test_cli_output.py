"""The commands' console output in logs and narrow terminals (cli/_output.py): case ids and the
rerun command are never wrapped or cut at any width, messages are not cut mid-token, every
command that prints a table or summary has ``--format json``; and asking for a device this
machine lacks is a usage error (exit 2) unless ``--device all``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from results_fixtures import result, write

from rlx_conformance.backends import get_backend
from rlx_conformance.cli import _output as out
from rlx_conformance.cli import main as cli
from rlx_conformance.cli import options
from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate import matrix
from rlx_conformance.run.session import Run

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--ops", "exp", "--dtypes", "f16", "--mode", "lazy", "--grad", "none"]  # 14 cases
LONG_TOKEN = "reduce_sum/float32/shape:317x331/axes:0/keep_dim:true/vals:spread"


def _long_case(outcome: str, message: str) -> CaseResult:
    """A bad case whose id is longer than 80 columns."""
    case = matrix.Case("reduce_sum", "float32", ((317, 331),), "odd",
                       (("axes", (0,)), ("keep_dim", True)), "spread",
                       matrix.Target("mlx", "cpu", "compiled"))
    return CaseResult.for_case(case, outcome, max_ulp=1048576.0, max_rel_err=0.5, max_abs_err=2.0, message=message)


def _bad_run(tmp_path: Path) -> Run:
    long_msg = ("value mismatch: " + " ".join(f"element[{i}]={i * 1.5:g}" for i in range(200))
                + " " + LONG_TOKEN)
    results = [result("exp", "float16", "fail", n=1031, ulp=7.0, message=f"max_ulp 7 > 2 at {LONG_TOKEN}"),
               _long_case("fail", long_msg),
               result("tanh", "bfloat16", "crash", n=5, ulp=None, rel=None,
                      message="worker died: SIGSEGV\nin mlx::core::something_with_a_very_long_symbol_name_here"),
               result("exp", "float32", "xfail", n=3, message="known"),
               result("exp", "float32", "pass", n=4)]
    return Run(results=results, meta={"wall_s": 1.25, "warnings": ["a warning that is long " * 6]},
               path=tmp_path / "results.json")


def _lines(text: str) -> list[str]:
    return text.splitlines()


def _whole(needle: str, text: str) -> bool:
    return any(needle in ln for ln in _lines(text))


@pytest.mark.parametrize("columns", ["40", "80"])
def test_summary_keeps_ids_commands_and_tokens_whole(tmp_path, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    run = _bad_run(tmp_path)
    options.print_summary(run, show=25)
    text = capsys.readouterr().out
    bad = [r for r in run.results if r.outcome in ("fail", "crash")]
    for r in bad:
        assert _whole(r.id, text), (r.id, text)
        assert _whole(f"{r.outcome}  {r.id}", text)
    assert _whole(f"rlx-conformance run --case '{bad[0].id}'", text), text
    assert _whole("max_ulp 7 > 2 at " + LONG_TOKEN, text)  # a short message whole, on its own line
    assert _whole("in mlx::core::something_with_a_very_long_symbol_name_here", text)  # every line of it
    # the very long message is shortened at a word boundary and says where the rest is
    shown = next(ln for ln in _lines(text) if "value mismatch:" in ln)
    assert shown.endswith(" …") and LONG_TOKEN not in shown
    tokens = set(bad[1].message.split())
    assert all(t in tokens for t in shown.split()[:-1]), shown
    assert _whole("the whole of it is in results.json", text)
    assert _whole(f"results: {run.path}", text)
    # the by-op table carries op names and counts, never a case id
    lines = _lines(text)
    start = next(k for k, ln in enumerate(lines) if ln.strip() == "by op")
    table = "\n".join(lines[start:next(k for k, ln in enumerate(lines) if " cases in " in ln)])
    assert "reduce_sum" in table
    assert "/" not in table.replace("│", "").replace("┃", "")


def test_a_green_run_puts_its_excused_cases_on_one_line(tmp_path, capsys):
    """No by-op table when nothing fails the run: the xfail cases are one line, by category;
    an op with a failure keeps its row, its xfail count beside it."""
    xf = [result(op, "float32", "xfail", n=n, divergence={"entry": e, "category": c})
          for op, n, e, c in (("exp", 1, "a", "precision"), ("exp", 2, "a", "precision"),
                              ("tanh", 3, "b", "backend-bug"), ("sin", 4, "c", "precision"))]
    green = Run(results=xf + [result("exp", "float32", "pass", n=9)], meta={"wall_s": 1.0}, path=None)
    options.print_summary(green, show=25)
    text = capsys.readouterr().out
    assert not _whole("by op", text) and not _whole("tanh", text), text
    assert _whole("4 xfail: excused by 3 known divergence(s) (precision 3, backend-bug 1)", text), text
    red = Run(results=xf + [result("tanh", "float32", "fail", n=8)], meta={"wall_s": 1.0}, path=None)
    options.print_summary(red, show=25)
    text = capsys.readouterr().out
    lines = _lines(text)
    start = next(k for k, ln in enumerate(lines) if ln.strip() == "by op")
    table = "\n".join(lines[start:next(k for k, ln in enumerate(lines) if " cases in " in ln)])
    assert "tanh" in table and "exp" not in table and "sin" not in table, table
    assert options.summary_doc(red)["by_op"]["exp"] == {"xfail": 2}  # the JSON keeps every op


def test_run_summary_as_json(tmp_path):
    run = _bad_run(tmp_path)
    doc = options.summary_doc(run)
    assert doc["summary"]["fail"] == 2 and doc["summary"]["total"] == 5 and doc["bad_total"] == 3
    assert [b["id"] for b in doc["bad"]] == [r.id for r in run.results if r.outcome in ("fail", "crash")]
    assert doc["bad"][1]["message"] == run.results[1].message  # JSON holds the whole message
    assert doc["bad"][0]["rerun"] == f"rlx-conformance run --case '{run.results[0].id}'"
    assert doc["by_op"] == {"exp": {"fail": 1, "xfail": 1}, "reduce_sum": {"fail": 1}, "tanh": {"crash": 1}}
    assert doc["results"] == str(run.path)
    json.dumps(doc, allow_nan=False)


def _cli(args: list[str], columns: str = "80", **env: str) -> subprocess.CompletedProcess:
    """The command in a fresh interpreter with its output piped, as in CI."""
    e = {**os.environ, "COLUMNS": columns, **env}
    return subprocess.run([sys.executable, "-m", "rlx_conformance", *args], capture_output=True, text=True,
                          env=e, cwd=ROOT, timeout=300, check=False)


def test_run_prints_failing_ids_and_rerun_command_whole_at_40_columns(tmp_path):
    """A real failing run, piped at 40 columns: the known divergences of exp float32 lazy are
    failures without the known-divergence file (the same device as tests/test_install.py uses)."""
    nokd = tmp_path / "cases"
    nokd.mkdir()
    (nokd / "known_divergences.toml").write_text("# no known divergence\n")
    p = _cli(["run", "--ops", "exp", "--dtypes", "float32", "--mode", "lazy", "--cases", str(nokd),
              "--report", str(tmp_path / "r"), "--workers", "1", "--show", "1000", "--no-bundles"], columns="40")
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    bad = [c for c in doc["cases"] if c["outcome"] in ("fail", "xpass", "error", "contract", "crash", "timeout")]
    assert p.returncode == 1 and bad, p.stdout + p.stderr
    for c in bad:
        assert _whole(f"{c['outcome']}  {c['id']}", p.stdout), p.stdout
    assert _whole(f"rlx-conformance run --case '{bad[0]['id']}'", p.stdout), p.stdout


def test_run_format_json_on_a_real_run(tmp_path):
    p = _cli(["run", *SMALL, "--report", str(tmp_path / "r"), "--workers", "1", "--format", "json"])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "rlx-conformance/run/v1" and doc["exit"] == 0
    assert doc["summary"]["total"] == 14 and doc["bad"] == [] and doc["bad_total"] == 0
    assert doc["results"] == str(tmp_path / "r" / "results.json")


def test_list_text_and_json_agree(capsys):
    assert cli.main(["list", *SMALL]) == 0
    ids = capsys.readouterr().out.splitlines()
    assert cli.main(["list", *SMALL, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/list/v1" and doc["count"] == len(ids) == 14
    assert [c["id"] for c in doc["cases"]] == ids
    assert {c["dtype"] for c in doc["cases"]} == {"float16"} and {c["target"] for c in doc["cases"]} == {"mlx-cpu-lazy"}


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as one without an MLX GPU, whatever it has."""
    monkeypatch.setattr(type(get_backend("mlx")), "devices", lambda self: ["cpu"])


@pytest.fixture
def with_gpu(monkeypatch):
    monkeypatch.setattr(type(get_backend("mlx")), "devices", lambda self: ["cpu", "gpu"])


def test_a_device_the_machine_lacks_is_a_usage_error(cpu_only, capsys):
    for argv in (["list", "--device", "gpu", *SMALL], ["run", "--device", "gpu", *SMALL],
                 ["run", "--case", "exp/float16/shape:scalar/vals:random/mlx-gpu-lazy"],
                 ["repro", "exp/float16/shape:scalar/vals:random/mlx-gpu-lazy"],
                 ["nightly", "--device", "gpu", "--ops", "exp"]):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error: mlx: this machine has no gpu" in err, (argv, err)
        assert "--device all" in err
    with pytest.raises(options.RlxError, match="no gpu"):
        options.check_devices("mlx", "gpu")  # what validate --device gpu calls


def test_device_all_runs_what_the_machine_has_and_says_what_it_skips(cpu_only, capsys):
    assert cli.main(["list", "--device", "all", *SMALL]) == 0
    o = capsys.readouterr()
    assert o.out and all(i.endswith("/mlx-cpu-lazy") for i in o.out.splitlines())
    assert "skipped" in o.err and "gpu" in o.err


def test_a_device_the_machine_has_is_taken(with_gpu, capsys):
    assert options.check_devices("mlx", "gpu") == ["gpu"]
    assert cli.main(["list", "--device", "gpu", *SMALL]) == 0
    ids = capsys.readouterr().out.splitlines()
    assert ids and all(i.endswith("/mlx-gpu-lazy") for i in ids)
    assert options.check_devices("mlx", "all") == "all" and capsys.readouterr().err == ""


def test_case_ids_accept_dtype_abbreviations_and_suggest_close_ids(capsys):
    (c,) = options.find_cases(["exp/f16/shape:scalar/vals:random/mlx-cpu-lazy"])
    assert c.id == "exp/float16/shape:scalar/vals:random/mlx-cpu-lazy"
    assert cli.main(["run", "--case", "exp/float16/shape:scalarr/vals:random/mlx-cpu-lazy"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'exp/float16/shape:scalar/vals:random/mlx-cpu-lazy'" in err and err.count("\n") == 1
    assert cli.main(["repro", "epx/float16/shape:scalar/vals:random/mlx-cpu-lazy"]) == 2
    assert "did you mean exp" in capsys.readouterr().err


def test_repro_text_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    case = "exp/float16/shape:scalar/vals:random/mlx-cpu-lazy"
    assert cli.main(["repro", case, "--report", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"pass  {case}\n")
    assert cli.main(["repro", case, "--report", str(tmp_path), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/repro/v1" and doc["id"] == case
    assert doc["outcome"] == "pass" and doc["exit"] == 0 and doc["bundle"]
    assert _whole(f"bundle: {doc['bundle']}/", text)


def _digest_rec(mode: str, digest: str, n: int) -> CaseResult:
    r = result("exp", "float32", "pass", n=n, mode=mode)
    r.output_digest = digest
    return r


def test_stability_prints_example_ids_on_their_own_line_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    cases = [_digest_rec("lazy", "a", 1), _digest_rec("eager", "b", 1),
             _digest_rec("lazy", "c", 2), _digest_rec("eager", "c", 2)]
    write(tmp_path, cases)
    assert cli.main(["stability", str(tmp_path / "results.json")]) == 0
    text = capsys.readouterr().out
    assert _whole("mode-dependent", text)
    assert any(ln.strip() == f"e.g. {cases[0].id}" or ln.strip() == f"e.g. {cases[1].id}" for ln in _lines(text)), text
    assert cli.main(["stability", str(tmp_path / "results.json"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/stability/v1" and doc["updated"] is None
    assert doc["counts"]["mode-dependent"] == 2
    assert {g["class"] for g in doc["groups"]} == {"mode-dependent"}


def test_pair_json(tmp_path, capsys):
    write(tmp_path / "gpu", [result("exp", "float32", "fail", device="gpu", mode="lazy")])
    write(tmp_path / "cpu", [result("exp", "float32", "pass", device="cpu", mode="lazy")])
    assert cli.main(["pair", str(tmp_path / "gpu"), str(tmp_path / "cpu"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "rlx-conformance/pair/v1" and (doc["a"], doc["b"]) == ("mlx-gpu", "mlx-cpu")
    assert doc["totals"]["a_only"] == 1 and doc["pairing"] == str(tmp_path / "gpu" / "pair.json")
    assert cli.main(["pair", str(tmp_path / "gpu"), str(tmp_path / "cpu")]) == 0
    assert _whole(f"pairing: {tmp_path / 'gpu' / 'pair.json'}", capsys.readouterr().out)


def test_shorten_cuts_at_a_word_boundary():
    text = "alpha beta gamma delta"
    assert out.shorten(text, 100) == (text, False)
    assert out.shorten(text, 14) == ("alpha beta …", True)
    assert out.message_lines("") == []
    assert out.message_lines("a\nb") == ["a", "b"]
    assert out.message_lines("word " * 200, limit=50)[-1] == "(message shortened; the whole of it is in results.json)"
