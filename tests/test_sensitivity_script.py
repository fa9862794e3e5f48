"""Smoke test of benchmarks/sensitivity.py: one tiny op x dtype, end to end (MLX on the CPU, the
reference, the matrix's verdict on perturbed outputs). The script is not part of the package, so
it is loaded from its path; runpy keeps it out of sys.modules."""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

pytest.importorskip("mlx.core")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "sensitivity.py"


def _table(out: str) -> list[list[str]]:
    """The markdown table's rows (header first, separator dropped) as lists of cells."""
    lines = [ln for ln in out.splitlines() if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def test_reduce_sum_float32_table(capsys: pytest.CaptureFixture[str]) -> None:
    ns = runpy.run_path(str(SCRIPT))
    rows = ns["main"](["--ops", "reduce_sum", "--dtypes", "float32", "--max-cases", "4", "--markdown"])
    table = _table(capsys.readouterr().out)
    assert tuple(table[0]) == ns["COLUMNS"]
    for col in ("op", "dtype", "cases", "pass @1e-5", "pass @1e-3", "one elem. @1e-3",
                "cond<100 pass @1e-3", "well-cond. f32 pass @1e-5"):
        assert col in table[0]
    body = table[1:]
    assert [r[:2] for r in body] == [["reduce_sum", "float32"]]
    assert int(body[0][2]) == len(rows[0].outcomes) > 0
    # the judges catch a 1e-3 relative error in at least one reduce_sum float32 case
    assert not body[0][table[0].index("pass @1e-3")].startswith("100%")
    assert not all(o.still["b"] for o in rows[0].outcomes)
