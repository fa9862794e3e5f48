"""The nightly CI workflow (.github/workflows/nightly.yml) only runs commands the CLI has: every
``rlx-conformance`` line of every step parses with the real argument parser (an option renamed or
dropped fails here, not at 2 a.m.), and the shard matrix, N and the merge's shard list agree."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from rlx_conformance.cli.main import build_parser  # noqa: E402

WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "nightly.yml"
# what GitHub substitutes for the expressions the commands use (values of the right type)
EXPRESSIONS = {"matrix.shard": "2", "env.N": "4", "github.run_number": "17"}


def _doc() -> dict:
    if not WORKFLOW.is_file():
        pytest.skip("no .github/ in this tree (an installed wheel)")
    return yaml.safe_load(WORKFLOW.read_text())


def _commands(doc: dict) -> list[tuple[str, str]]:
    """(job, command) for every rlx-conformance command line of every step."""
    out = []
    for name, job in doc["jobs"].items():
        for step in job.get("steps", []):
            for line in str(step.get("run", "")).splitlines():
                line = line.strip()
                if line.startswith("rlx-conformance"):
                    out.append((name, line))
    return out


def _substituted(line: str) -> str:
    def sub(m: re.Match) -> str:
        key = m.group(1).strip()
        if key not in EXPRESSIONS:
            raise AssertionError(f"unknown expression ${{{{ {key} }}}} in {line!r}")
        return EXPRESSIONS[key]
    line = re.sub(r"\$\{\{(.*?)\}\}", sub, line)
    return line.split("||")[0].strip()  # `|| echo ...`: the shell's, not ours


def test_every_command_parses():
    cmds = _commands(_doc())
    jobs = {j for j, _ in cmds}
    assert {"shard", "merge", "fuzz-graphs"} <= jobs, jobs
    parser = build_parser()
    for job, line in cmds:
        argv = shlex.split(_substituted(line))[1:]
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # argparse reports the bad option on stderr
            raise AssertionError(f"{job}: `{line}` does not parse (exit {e.code})") from None
        assert callable(args.fn), line


def test_a_wrong_option_is_caught():
    """The check above can fail: a misspelt option does not parse."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(_substituted("rlx-conformance run --shards 1/4"))[1:])


def test_shards_agree_with_n_and_the_merge():
    doc = _doc()
    n = int(doc["env"]["N"])
    assert doc["jobs"]["shard"]["strategy"]["matrix"]["shard"] == list(range(1, n + 1))
    merge = [line for job, line in _commands(doc) if job == "merge" and " merge " in f" {line} "]
    assert len(merge) == 1
    assert shlex.split(_substituted(merge[0]))[3:] == [f"shard-{i}" for i in range(1, n + 1)]
    shard = [line for job, line in _commands(doc) if job == "shard"]
    assert any("--shard" in line and "/" in line for line in shard)


def test_report_writes_the_junit_the_merge_job_uploads(tmp_path):
    """`report RESULTS --junit FILE` (the merge job's step): one testcase per record."""
    import xml.etree.ElementTree as ET

    from results_fixtures import result, write

    from rlx_conformance.cli.main import main

    rs = [result(n=1), result(outcome="fail", n=2, message="2/5 differ")]
    d = write(tmp_path / "merged", rs)
    assert main(["report", str(d), "--no-plots", "--no-lock", "--junit", str(tmp_path / "j.xml")]) == 0
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert root.get("tests") == "2" and root.get("failures") == "1"
