"""A full disk mid-run: the run stops with one line that says where its records are and how to go
on, keeps every record it managed to write, and `run --resume` finishes it."""
from __future__ import annotations

import errno
import json

from rlx_conformance.cli.main import main
from rlx_conformance.core import results

ARGS = ["run", "--ops", "neg", "--dtypes", "float32", "--device", "cpu", "--mode", "lazy", "--workers", "0",
        "--no-progress", "--no-bundles"]


class _FillsUp:
    """A file that takes ``room`` lines, then fails as a full disk does."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, text: str) -> int:
        if self.room == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= 1
        return self.f.write(text)

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def test_a_full_disk_stops_the_run_with_one_line_and_resume_finishes_it(tmp_path, monkeypatch, capsys):
    report = tmp_path / "r"
    init = results.Journal.__init__

    def journal_init(self, path):
        init(self, path)
        self._f = _FillsUp(self._f, room=7)

    def no_room(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(results.Journal, "__init__", journal_init)
    monkeypatch.setattr(results, "atomic_write_text", no_room)
    assert main([*ARGS, "--report", str(report)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert "No space left on device" in err and f"--resume {report}" in err, err
    journal = report / "results.partial.jsonl"
    kept = [json.loads(line)["id"] for line in journal.read_text().splitlines()]
    assert len(kept) == 7 and not (report / "results.json").exists()

    monkeypatch.undo()
    assert main([*ARGS, "--resume", str(report)]) == 0
    doc = json.loads((report / "results.json").read_text())
    ids = [c["id"] for c in doc["cases"]]
    assert set(kept) <= set(ids) and len(ids) == len(set(ids)) > 7
    assert doc["run"]["resumed"]["kept"] == 7
