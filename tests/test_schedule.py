"""The run's case order for a cold MLX JIT cache (rlx_conformance/run/schedule.py, issue 18 item 1):
a deterministic permutation that keeps input sets together, puts each op's new compile signatures
first and the ops with the most of them first; records come back in the matrix's order."""
from __future__ import annotations

import pytest

from rlx_conformance.core.results import CaseResult
from rlx_conformance.generate.graphs import generate_graphs
from rlx_conformance.generate.matrix import GRAD_KINDS, Target
from rlx_conformance.run import schedule, session
from rlx_conformance.run.runner import Runner

TARGETS = [Target("mlx", "cpu", m) for m in ("lazy", "compiled")]
OPS = ["exp", "add", "reduce_sum", "softmax", "gather"]


@pytest.fixture(scope="module")
def cases():
    cs = session.build_cases(TARGETS, ops=OPS, dtypes=["float32", "float16"], grads=GRAD_KINDS,
                             layouts="default")
    cs += session.with_variants(generate_graphs(TARGETS[1:], ["swiglu"], None, session.supports,
                                                grads=("", "vjp")))
    assert {c.grad for c in cs} >= {"", *GRAD_KINDS} and any(c.layout for c in cs)
    return cs


def test_order_is_a_deterministic_permutation(cases):
    o = schedule.order(cases)
    assert sorted(o) == list(range(len(cases)))
    assert schedule.order(list(cases)) == o
    assert [c.id for c in schedule.schedule(cases)] == [cases[i].id for i in o]


@pytest.mark.parametrize("key", ["input_id", "contiguous_id"])
def test_input_sets_stay_together(cases, key):
    """The cases of one input id (its targets) stay adjacent: one reference per input set; so do
    the forward, derivative and layout cases made from the same inputs (one contiguous id)."""
    def runs(cs):
        out: list[str] = []
        for c in cs:
            if not out or out[-1] != getattr(c, key):
                out.append(getattr(c, key))
        return len(out)

    # never split more than the matrix's order does (it puts a forward case's derivatives right
    # after it, its layouts later); an input id's cases are always adjacent
    assert runs(schedule.schedule(cases)) <= runs(cases)
    if key == "input_id":
        assert runs(schedule.schedule(cases)) == len({c.input_id for c in cases})


def test_each_ops_new_signatures_come_first(cases):
    """Each op's cases are contiguous, and within them every group of input sets made from the
    same inputs that brings a signature not seen before precedes every one whose signatures all
    came earlier."""
    ordered = schedule.schedule(cases)
    ops_in_order = [c.op for i, c in enumerate(ordered) if i == 0 or ordered[i - 1].op != c.op]
    assert len(ops_in_order) == len(set(ops_in_order))
    for op in ops_in_order:
        mine = [c for c in ordered if c.op == op]
        seen: set = set()
        novelty = []
        for k, c in enumerate(mine):
            if k == 0 or mine[k - 1].contiguous_id != c.contiguous_id:
                novelty.append(False)
            if schedule.signature(c) not in seen:
                novelty[-1] = True
                seen.add(schedule.signature(c))
        assert novelty == sorted(novelty, reverse=True), op
        assert novelty[0]


def test_heavier_ops_first(cases):
    """Ops come in decreasing weight (signatures; a graph: nodes x signatures)."""
    ordered = schedule.schedule(cases)
    firsts: dict[str, int] = {}
    for i, c in enumerate(ordered):
        firsts.setdefault(c.op, i)
    weights = {op: schedule.weight(ordered[i], len({schedule.signature(c) for c in cases if c.op == op}))
               for op, i in firsts.items()}
    in_order = [weights[op] for op in sorted(firsts, key=firsts.get)]
    assert in_order == sorted(in_order, reverse=True)
    assert len(set(in_order)) > 1  # the selection does rank something


def test_runner_deals_the_schedule_complete(cases):
    """The runner's tasks over the scheduled cases hold every case exactly once."""
    tasks = Runner(workers=2, task_size=24)._tasks(schedule.schedule(cases))
    assert sorted(c.id for t in tasks for c in t) == sorted(c.id for c in cases)


def test_restore_puts_records_in_case_order(cases):
    sub = cases[:40]
    records = [CaseResult.for_case(c, "pass") for c in reversed(sub)]
    prior = CaseResult.for_case(cases[-1], "pass")  # a resumed run's kept record: not in sub
    back = schedule.restore([records[5], prior, *records], sub)
    assert back[0] is prior
    assert [r.id for r in back[1:]] == sorted([records[5].id] + [c.id for c in sub],
                                              key=[c.id for c in sub].index)


def test_execute_records_in_case_order(tmp_path):
    """A run through session.execute (in-process) writes its records in the order of the cases
    it was given, whatever order the schedule ran them in."""
    cs = session.build_cases([Target("mlx", "cpu", "lazy")], ops=["neg", "sign"], dtypes=["float32"])[:30]
    assert schedule.order(cs) != list(range(len(cs)))  # the schedule does move something here
    run = session.execute(cs, tmp_path, workers=0)
    assert [r.id for r in run.results] == [c.id for c in cs]
    off = session.execute(cs, None, workers=0, schedule=False)
    assert [r.id for r in off.results] == [c.id for c in cs]
