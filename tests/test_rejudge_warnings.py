"""`merge --rejudge` judges the known divergences again, so the warnings the original run made
about them (an entry that matched no case, after its scope has been fixed) are not carried into
the rejudged report; the run's other warnings are."""
from __future__ import annotations

import json

from results_fixtures import result, write

from rlx_conformance.run.merge import merge


def test_rejudge_drops_stale_divergence_warnings(tmp_path):
    old = "known divergence no-such-entry (exp) matched no case"
    other = "shards ran with different mlx: 0.32.3, 0.32.4"
    src = write(tmp_path / "run", [result(n=1), result(n=2)],
                run={"start": "2026-01-01T00:00:00+00:00", "targets": [], "warnings": [old, other]})
    merged = merge(tmp_path / "out", [src], rejudge=True)
    kept = json.loads((tmp_path / "out" / "results.json").read_text())["run"]["warnings"]
    assert old not in kept and old not in merged.warnings
    assert other in kept


def test_plain_merge_keeps_them(tmp_path):
    old = "known divergence no-such-entry (exp) matched no case"
    src = write(tmp_path / "run", [result(n=1)],
                run={"start": "2026-01-01T00:00:00+00:00", "targets": [], "warnings": [old]})
    merge(tmp_path / "out", [src])
    assert old in json.loads((tmp_path / "out" / "results.json").read_text())["run"]["warnings"]
