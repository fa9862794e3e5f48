"""One run of the matrix, shared by every front (CLI, pytest plugin, API): options → targets →
cases → runner → results.json. Fronts only present what this returns."""
from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlx_conformance.backends import get_backend
from rlx_conformance.core import data
from rlx_conformance.core import results as res
from rlx_conformance.core.errors import ResultsWriteError, RlxError
from rlx_conformance.generate.layouts import layout_of_id
from rlx_conformance.generate.matrix import (
    GRAD_KINDS,
    Case,
    Target,
    did_you_mean,
    generate,
    selected_dtypes,
)
from rlx_conformance.judge import stability
from rlx_conformance.judge.stability import classify
from rlx_conformance.ops.graphs import all_graphs
from rlx_conformance.run.bundle import BundleSink
from rlx_conformance.run.outcomes import finalize
from rlx_conformance.run.runner import DEFAULT_MAX_FAILURES, DEFAULT_TIMEOUT, Runner
from rlx_conformance.run.schedule import restore
from rlx_conformance.run.schedule import schedule as schedule_cases

ALL_MODES = ("eager", "lazy", "compiled")


def backend_targets(backend: str, devices: Sequence[str] | str = "cpu",
                    modes: Sequence[str] | str | None = None) -> list[Target]:
    """Targets for a backend. devices/modes may be "all"; modes None = the backend default
    (for MLX: RLX_MLX_MODE, else compiled). A requested device that this machine lacks still
    yields targets: their cases report skip with the reason."""
    b = get_backend(backend)
    if devices == "all":
        devices = b.devices()
    elif isinstance(devices, str):
        devices = [devices]
    for d in devices:
        if d not in b.all_devices():
            raise RlxError(f"{backend} has no device {d!r} (devices: {', '.join(b.all_devices())})")
    if modes == "all":
        modes = b.modes
    elif modes is None:
        modes = [b.default_mode]
    elif isinstance(modes, str):
        modes = [modes]
    for m in modes:
        if m not in b.modes:
            raise RlxError(f"{backend} has no mode {m!r} (modes: {', '.join(b.modes)})")
    return [Target(backend, d, m) for d in devices for m in modes]


def supports(t: Target, op: str, dtype: str) -> bool:
    """Whether ``t``'s backend declares ``op`` for ``dtype`` on its device (generate's filter)."""
    return get_backend(t.backend).supports(op, dtype, t.device)


def grad_kinds(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """The derivative kinds (matrix.GRAD_KINDS) that ``--grad`` (and the pytest plugin's
    ``--rlx-grad`` / a conformance file's ``grad``) selects, in id order: "all" or None, every
    kind; "none", none (the forward alone); else kinds, comma-separated or as a list. The forward
    cases are always run: a derivative case is judged against them (its inputs are theirs), and a
    run of the derivatives alone is a ``-k``/``--case`` selection. A word that names no kind is a
    usage error (one line)."""
    if value is None:
        return GRAD_KINDS
    words = [w.strip().lower() for v in ([value] if isinstance(value, str) else value)
             for w in str(v).split(",") if w.strip()]
    if words in (["all"], ["none"]):
        return GRAD_KINDS if words == ["all"] else ()
    bad = [w for w in words if w not in GRAD_KINDS]
    if bad or not words:
        what = f"{bad[0]!r}" if bad else "nothing"
        raise RlxError(f"--grad wants all, none or derivative kinds ({', '.join(GRAD_KINDS)}), "
                       f"comma-separated; got {what}")
    return tuple(k for k in GRAD_KINDS if k in words)


def build_cases(targets: Sequence[Target], ops: Sequence[str] | None = None,
                dtypes: Sequence[str] | None = None, tf32: str | None = None,
                grads: Sequence[str] = (), layouts: str = "none") -> list[Case]:
    """The matrix's cases for ``targets``: the forward cases and, for ``grads`` (derivative kinds:
    :func:`grad_kinds`), the derivative cases, and the forward cases' memory layouts as
    ``layouts`` says (layouts.LAYOUT_SETTINGS); each case in as many backend variants as its
    backend runs it in (``tf32``: on, off, both, or None for what the environment says; MLX's
    float32 matmul/conv family on a GPU, MlxBackend.variants)."""
    return with_variants(generate(targets, ops=ops, dtypes=dtypes, supports=supports,
                                  grads=("", *grads), layouts=layouts), tf32)


def with_variants(cases: Sequence[Case], option: str | None = None) -> list[Case]:
    """Each case once per backend variant it runs in (``option``: --tf32's on, off, both or None)."""
    out = []
    for c in cases:
        for v in get_backend(c.target.backend).variants(c.op, c.dtype, c.target.device, option):
            out.append(c if v == c.target.variant else replace(c, target=replace(c.target, variant=v)))
    return out


def thin_variants(cases: Sequence[Case], k: int) -> list[Case]:
    """``cases`` with 1 in ``k`` of the input sets of each derivative kind and each memory layout
    (``--sample-grad K``), deterministically: an input set stays when the SHA-256 of its input id
    falls in the first k-th of the range (the same on every machine, whatever else is selected),
    and the first input set (in matrix order) of each op x dtype x derivative kind x layout stays
    anyway, so every one of them keeps cases. The forward cases (contiguous) are all kept, and
    every target of a kept input set (its modes are compared bit-wise). ``k`` 1: all of them."""
    if k <= 1:
        return list(cases)
    first: dict[tuple[str, str, str, str], str] = {}
    out = []
    for c in cases:
        if not c.grad and not c.layout:
            out.append(c)
            continue
        iid = c.input_id
        group = first.setdefault((c.op, c.dtype, c.grad, c.layout), iid)
        if group == iid or int.from_bytes(hashlib.sha256(iid.encode()).digest()[:8], "big") % k == 0:
            out.append(c)
    return out


def skip_shapes(cases: Sequence[Case], patterns: Sequence[str] | None) -> list[Case]:
    """``cases`` less those of the shape families (cases/shapes/*.toml) whose names match
    ``patterns`` (``--skip-shapes huge``; None or empty: all). `tox -e mlx` and the tests' matrix
    leave out ``huge``, the 10^6-element operands of issue 14's accumulation regime: 4 % of a
    mode's forward cases and two thirds of their time, spent in the float64 reference and its
    bounds rather than in MLX; the nightly runs them (README, Speed). Every target of a case is
    cut alike, so the modes of a kept input set stay together."""
    if not patterns:
        return list(cases)
    names = shape_family_names()
    for p in patterns:  # a typo would otherwise skip nothing, silently
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            raise RlxError(f"--skip-shapes: no shape family matches {p!r}{did_you_mean(p, sorted(names))}; "
                           "the families are the tables of cases/shapes/*.toml and the graphs' shape sets")
    return [c for c in cases if not any(fnmatch.fnmatchcase(c.family, p) for p in patterns)]


def shape_family_names() -> set[str]:
    """Every shape family a case can name: the tables of cases/shapes/*.toml and the graphs'
    shape sets."""
    names = {f for fams in data.load("shapes").values() for f in fams}
    return names | {s for g in all_graphs().values() for s, _ in g.shapes}


def find_case(case_id: str) -> Case:
    """The case with this id (ids are stable: regenerated from the registry and cases/)."""
    parts = case_id.strip().split("/")
    if len(parts) < 4:
        raise RlxError(f"not a case id: {case_id!r} (e.g. exp/float16/shape:1031/vals:special/mlx-cpu-compiled)")
    target = Target.parse(parts[-1])
    base = Target(target.backend, target.device, target.mode)
    grads = GRAD_KINDS if parts[-2].startswith("grad:") else ()  # a derivative's id: …/grad:vjp/target
    layouts = "all" if layout_of_id(case_id) else "none"  # a layout case's id: …/layout:NAME/…
    for c in build_cases([base], ops=[parts[0]], tf32="both" if target.variant else None, grads=grads,
                         layouts=layouts):
        if c.id == case_id.strip():
            return c
    raise RlxError(f"no case with id {case_id!r} in the current matrix")


def default_report_dir(kind: str = "run") -> Path:
    """Where a command writes its report when not told: ``reports/<kind>-<local time>`` (run,
    nightly, exhaustive, validate-<op>): one format for every command, sorting by time."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("reports") / f"{kind}-{stamp}"


def selection(cases: Sequence[Case], *, ops: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
              tf32: str | None = None, sample: int = 1, case_ids: Sequence[str] | None = None,
              grads: Sequence[str] = (), forward: bool = True, layouts: str = "none",
              sample_grad: int = 1, skipped_shapes: Sequence[str] | None = None) -> dict:
    """What a run was asked to run, for its metadata (``run.selection``, where :func:`execute`
    adds its shard): the --ops and --dtypes globs (None: all; f32 recorded as float32, the name
    records hold), the derivative kinds of --grad
    (``grad``: a list, [] for the forward alone; ``forward``: false for --no-forward, the
    derivatives alone), --layouts (``layouts``: none, default or all), the backends, devices and modes of ``cases``
    (the selection's, before a shard takes its part), --tf32, --sample, --sample-grad (``sample_grad``,
    recorded only when it thins: K > 1), --skip-shapes (``skip_shapes``, the family globs, recorded
    only when given), --case and the --cases data folder. ``diff`` compares a subset with a baseline over this selection only; ``merge``
    refuses shards whose selections differ."""
    override = data.override_dir()
    dtypes = selected_dtypes(dtypes)
    return {"ops": sorted(ops) if ops else None, "dtypes": sorted(dtypes) if dtypes else None,
            "grad": [k for k in GRAD_KINDS if k in grads], "forward": forward, "layouts": layouts,
            "backend": sorted({c.target.backend for c in cases}),
            "devices": sorted({c.target.device for c in cases}),
            "modes": sorted({c.target.mode for c in cases}), "tf32": tf32 or "env",
            "sample": sample, "case": sorted(case_ids) if case_ids else None,
            "cases_dir": str(override) if override else None,
            **({"sample_grad": sample_grad} if sample_grad > 1 else {}),
            **({"skip_shapes": sorted(skipped_shapes)} if skipped_shapes else {})}


@dataclass
class Run:
    """The result of a run: per-case records, metadata, and where results.json went."""

    results: list[res.CaseResult] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def failed(self) -> bool:
        return any(r.outcome in res.RUN_FAILING for r in self.results)


def execute(cases: Sequence[Case], report_dir: Path | None, *, workers: int | None = None,
            timeout: float = DEFAULT_TIMEOUT, init: str | None = None,
            on_result: Callable[[res.CaseResult], None] | None = None, meta: dict | None = None,
            strict_divergences: bool = True, repeat: int = 1, env: dict[str, str] | None = None,
            bundles: bool = False, shard: str | None = None,
            prior: Sequence[res.CaseResult] = (), prior_wall_s: float = 0.0,
            selection: dict | None = None, timeout_floor: float | None = None,
            max_failures: int = DEFAULT_MAX_FAILURES, schedule: bool = True) -> Run:
    """Run cases in isolated workers, stream them to a journal, write results.json atomically
    (also after Ctrl-C: what was gathered is kept, with run.interrupted = true).
    ``strict_divergences``: turn the passes of stale known-divergence entries into xpass; only
    meaningful when the run holds every case of those entries (not for --case or --shard).
    ``repeat``: run each case that many times (in different workers where possible) and merge
    the records per id, keeping every repeat's output digest (stability.py).
    ``bundles``: write a repro bundle (bundle.py) for every case that fails the run, under
    ``report_dir/repro/``. ``shard``: "I/N", recorded in the metadata; the judgments over the
    whole set (strict known divergences, bit-stability across modes) are left to ``merge``.
    ``prior``: records of an earlier, interrupted run of the same selection (``run --resume``),
    kept as they are; ``cases`` are then the ones it did not reach, and every judgment over the
    whole set is made over both. ``selection``: what the run was asked for (:func:`selection`),
    recorded as ``run.selection``. ``timeout_floor``, ``max_failures``: the runner's kernel-call
    floor and its stop after consecutive crashes or timeouts (runner.Runner). ``schedule``: hand the
    runner the cases in schedule.py's order (a cold MLX JIT cache's compiles first, the heaviest ops
    first); the records are put back in the order of ``cases`` either way, so results.json's order
    does not depend on which worker finished first."""
    run = Run(results=list(prior))
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.perf_counter()
    journal = res.Journal(report_dir / "results.partial.jsonl") if report_dir else None
    for r in prior if journal else ():  # a second kill still keeps them
        journal.add(r)
    interrupted = False
    write_error: ResultsWriteError | None = None
    sink = None
    if bundles and report_dir is not None:
        sink = BundleSink(Path(report_dir), timeout=timeout, init=init, env=tuple(sorted((env or {}).items())))
    runner = Runner(workers=workers, timeout=timeout, init=init, env=env,  # env: set in each worker before init
                    bundles=sink, floor=timeout_floor, max_failures=max_failures)
    try:
        for r in runner.run(stability.repeat_cases(schedule_cases(cases) if schedule else cases, repeat)):
            run.results.append(r)
            if journal:
                journal.add(r)
            if on_result:
                on_result(r)
    except KeyboardInterrupt:
        interrupted = True
    except ResultsWriteError as e:  # a full disk: stop, keep what is written, say so in one line
        write_error, interrupted = e, True
    finally:
        if repeat > 1:
            run.results = stability.merge_repeats(run.results)
        run.results = restore(run.results, cases)  # prior records (not in cases) first, as they were
        whole = shard is None  # a shard leaves the judgments over the whole set to merge
        warnings = finalize(run.results) if strict_divergences and whole and not interrupted else []
        bit_failures = stability.enforce(run.results) if whole else 0  # cases/bit_stable.toml: modes/repeats must agree
        targets = sorted({str(c.target) for c in cases} | {str(Target(r.backend, r.device, r.mode, r.variant)) for r in prior})
        run.meta = res.run_metadata(
            start=started.isoformat(timespec="seconds"),
            wall_s=round(prior_wall_s + time.perf_counter() - t0, 3),
            targets=targets, backend=sorted({c.target.backend for c in cases} | {r.backend for r in prior}),
            device=sorted({c.target.device for c in cases} | {r.device for r in prior}),
            modes=sorted({c.target.mode for c in cases} | {r.mode for r in prior}),
            seed="sha256(case input id)", cases_planned=len(cases) + len(prior), interrupted=interrupted,
            **({"resumed": {"kept": len(prior), "ran": len(run.results) - len(prior)}} if prior else {}),
            warnings=warnings, repeat=repeat, same_worker_repeats=runner.same_worker_repeats,
            **({"workers_recycled": runner.recycled} if runner.recycled else {}),
            bit_stability_failures=bit_failures, **({"shard": shard} if shard else {}),
            **({"selection": {**selection, "shard": shard}} if selection is not None else {}),
            **(meta or {}))
        if report_dir:
            run.path = report_dir / "results.json"
            try:
                res.write_results(run.path, run.meta, run.results, classify(run.results))
                journal.close(remove=True)  # results.json holds every record
            except ResultsWriteError as e:
                write_error = write_error or e
                journal.close(remove=False)
    if write_error is not None:
        raise ResultsWriteError(f"{write_error}; the run stopped after {len(run.results)} records, "
                                f"and `run --resume {report_dir}` goes on from those written") from write_error
    if interrupted:
        raise KeyboardInterrupt
    return run


def resume_cases(cases: Sequence[Case], prior: Sequence[res.CaseResult]) -> list[Case]:
    """The cases of ``cases`` that ``prior`` (an earlier run's records) has not run. Records
    outside the selection mean the options differ from the first run's: an error, not a
    silent mix of two selections."""
    wanted = {c.id for c in cases}
    stray = [r.id for r in prior if r.id not in wanted]
    if stray:
        raise RlxError(f"the run to resume holds {len(stray)} case(s) outside this selection "
                       f"(e.g. {stray[0]}): resume with the first run's options")
    done = {r.id for r in prior}
    return [c for c in cases if c.id not in done]


def iter_ids(cases: Sequence[Case]) -> Iterator[str]:
    for c in cases:
        yield c.id
