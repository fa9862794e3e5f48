"""``run --sample-grad K`` (session.thin_variants, issue 18 item 1): 1 in K input sets of the
derivative and layout cases, by a hash of the input id; every forward case, every op x dtype x
derivative kind x layout and every target of a kept input set stay."""
from __future__ import annotations

import configparser
import json
from collections import defaultdict
from pathlib import Path

import pytest
from grad_fixtures import derivative
from results_fixtures import result, write

from rlx_conformance.cli.main import main
from rlx_conformance.cli.options import SAMPLE_GRAD_TOX
from rlx_conformance.core.errors import RlxError
from rlx_conformance.report import records
from rlx_conformance.report.diff import compare
from rlx_conformance.generate.matrix import GRAD_KINDS, Target
from rlx_conformance.run import session
from rlx_conformance.run.merge import Shard, check_selections

TARGETS = [Target("mlx", "cpu", m) for m in ("lazy", "compiled")]


@pytest.fixture(scope="module")
def cases():
    return session.build_cases(TARGETS, ops=["exp", "add", "reduce_sum", "softmax", "gather", "relu_backward"],
                               grads=GRAD_KINDS, layouts="default")


def group(c):
    return c.op, c.dtype, c.grad, c.layout


@pytest.mark.parametrize("k", [2, 8])
def test_thinning_keeps_every_forward_case_and_every_group(cases, k):
    thin = session.thin_variants(cases, k)
    ids = {c.id for c in thin}
    assert [c for c in cases if c.id in ids] == thin  # a subsequence, in matrix order
    assert all(c.id in ids for c in cases if not c.grad and not c.layout)
    assert {group(c) for c in thin} == {group(c) for c in cases}
    # an input set is kept whole: all its targets (the modes are compared bit-wise)
    kept_inputs = {c.input_id for c in thin}
    assert all(c.id in ids for c in cases if c.input_id in kept_inputs)
    # and it thins: fewer derivative/layout input sets than before, more than one per group
    variant_inputs = {c.input_id for c in cases if c.grad or c.layout}
    kept_variant = {c.input_id for c in thin if c.grad or c.layout}
    groups = {group(c) for c in cases if c.grad or c.layout}
    assert len(groups) < len(kept_variant) < len(variant_inputs)


def test_thinning_is_deterministic_and_independent_of_the_rest(cases):
    """The same input set is kept whatever else the selection holds (its hash decides, and the
    first input set of its group)."""
    a = session.thin_variants(cases, 4)
    assert session.thin_variants(list(cases), 4) == a
    only_exp = [c for c in cases if c.op == "exp"]
    assert session.thin_variants(only_exp, 4) == [c for c in a if c.op == "exp"]
    assert session.thin_variants(cases, 1) == list(cases)


def test_thinning_follows_k(cases):
    """A larger K keeps fewer (never more) of each group's hashed input sets."""
    counts = [len(session.thin_variants(cases, k)) for k in (1, 2, 4, 8, 16)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_run_records_the_option(tmp_path, capsys):
    """The run's results hold exactly the thinned cases, and run.selection records K (so
    --resume and merge compare like with like)."""
    report = tmp_path / "r"
    code = main(["run", "--ops", "neg", "--dtypes", "float32", "--mode", "lazy", "--grad", "vjp",
                 "--layouts", "none", "--sample-grad", "3", "--workers", "0", "--no-bundles",
                 "--no-progress", "--report", str(report)])
    capsys.readouterr()
    doc = json.loads((report / "results.json").read_text())
    assert code in (0, 1)
    expected = session.thin_variants(session.build_cases([Target("mlx", "cpu", "lazy")], ops=["neg"],
                                                         dtypes=["float32"], grads=("vjp",)), 3)
    assert [r["id"] for r in doc["cases"]] == [c.id for c in expected]
    assert doc["run"]["selection"]["sample_grad"] == 3
    by_kind = defaultdict(int)
    for r in doc["cases"]:
        by_kind[r.get("grad") or ""] += 1
    assert by_kind[""] and by_kind["vjp"]


def test_bad_count_is_a_usage_error(capsys):
    assert main(["run", "--ops", "neg", "--sample-grad", "0", "--grad", "none"]) == 2
    assert "--sample-grad" in capsys.readouterr().err


def test_diff_counts_the_thinned_out_derivatives_as_outside_the_run(tmp_path):
    """A --sample-grad run against a whole baseline: the baseline's derivative cases it thinned
    out are outside the selection (counted, not listed as removed); a forward case it lacks is
    still removed."""
    base = [result(n=k) for k in (1, 2, 3)] + [derivative("vjp", n=k) for k in (1, 2, 3)]
    new = [result(n=1), result(n=2), derivative("vjp", n=1)]
    sel = {"ops": None, "dtypes": None, "grad": ["vjp"], "backend": ["mlx"], "devices": ["cpu"],
           "modes": ["eager"], "tf32": "env", "sample": 1, "case": None, "cases_dir": None}
    meta = {"start": "2026-01-01T00:00:00+00:00", "targets": ["mlx-cpu-eager"]}
    b = records.load(write(tmp_path / "base", base))
    thinned = compare(b, records.load(write(tmp_path / "new", new, {**meta, "selection": {**sel, "sample_grad": 4}})))
    assert thinned.removed == [result(n=3).id] and thinned.not_in_subset == 2
    whole = compare(b, records.load(write(tmp_path / "all", new, {**meta, "selection": sel})))
    assert sorted(whole.removed) == sorted([result(n=3).id, derivative("vjp", n=2).id, derivative("vjp", n=3).id])


def test_merge_refuses_shards_of_different_sample_grad():
    def shard(k):
        sel = {"ops": None, "sample": 1, **({"sample_grad": k} if k > 1 else {})}
        return Shard(path=Path(f"/s{k}/results.json"), run={"selection": sel}, cases=[])

    check_selections([shard(8), shard(8)])
    with pytest.raises(RlxError, match="--sample-grad"):
        check_selections([shard(8), shard(1)])


def test_tox_mlx_runs_the_documented_subset_and_the_nightly_all():
    """tox -e mlx passes --sample-grad with the count the option's help names; the nightly's
    command thins nothing."""
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(Path(__file__).parent.parent / "tox.ini")
    assert f"--sample-grad {SAMPLE_GRAD_TOX} " in ini["testenv:mlx"]["commands"]
    assert "--sample-grad" not in ini["testenv:nightly"]["commands"]
