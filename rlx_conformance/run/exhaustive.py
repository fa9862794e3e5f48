"""Exhaustive sweeps: every unary float op on all 65,536 float16 and all 65,536 bfloat16 bit
patterns and, when asked, on float32: all 2^32 bit patterns (``f32_range="full"``) or a
deterministic sample covering every exponent, on the CPU reference and on each target, against
the precise oracle (precise.py), judged by the op's accuracy budget (cases/accuracy.toml).
float32 jobs run through exhaustive_f32.py: in chunks, with a float64 oracle on CuPy (the GPU) or
numpy that MPFR completes near float32 rounding boundaries; same rows, same verdicts.

One job per (op, attributes, dtype): a worker process makes the inputs, computes the oracle (or
loads it from the disk cache: deterministic, keyed by op, attributes, dtype and the oracle's
source digest), then runs the reference and each target with ONE call on the whole array and
reports a row per target as it finishes. A worker that dies (a signal from native code) or hangs
is replaced: the target it was running is recorded as ``crash`` / ``timeout`` and the job's
remaining targets go on in a fresh worker.

A row fails when any asserted position is over budget (value, NaN or inf mismatch; the sign of
zero where the op's policy asserts it). Positions the spec leaves undefined (OpSpec.undefined)
get no assertion. Known divergences (cases/known_divergences.toml) match a row through its
pseudo case id ``op/dtype/shape:N/<attrs>/vals:exhaustive/<target>``: a failing row inside an
entry is ``xfail``; a clean row inside an entry scoped to ``vals:exhaustive`` is ``xpass``. The
reference never xfails: over budget there is a reference bug.

API for other fronts (the nightly): :func:`run_exhaustive`.
"""
from __future__ import annotations

import datetime as _dt
import fnmatch
import hashlib
import itertools
import json
import os
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, UnsupportedError
from rlx_conformance.core.results import SWEEP_FAILING, _jsonable, atomic_write_text, run_metadata
from rlx_conformance.generate import matrix
from rlx_conformance.generate.matrix import Case, Target
from rlx_conformance.judge import precise
from rlx_conformance.judge.accuracy import budget_for, measure
from rlx_conformance.judge.compare import ulp_distance
from rlx_conformance.judge.divergences import known_divergence, unexcused
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.run import exhaustive_f32, worker

SCHEMA = "rlx-conformance/exhaustive/v1"
DTYPES = ("float16", "bfloat16", "float32")
REFERENCE = Target("cpu", "cpu", "eager")
WORST = 5  # worst inputs reported per row


def default_cache_dir() -> Path:
    env = os.environ.get("RLX_CONFORMANCE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rlx-conformance"
    return base / "oracle"


# -- what is swept ---------------------------------------------------------------------------------
def selected_dtypes(globs: Sequence[str] | None, f32_sample: int = 0, f32_full: bool = False) -> list[str]:
    """The sweep's dtypes for a selection's --dtypes globs (None: all): float16 and bfloat16, and
    float32 only with a float32 sample (``f32_sample`` > 0) or the full float32 range
    (``f32_full``), those the globs match. Shared by
    ``exhaustive``, ``run --exhaustive`` and the nightly, so that one --dtypes means the same to
    all (abbreviations as the matrix takes them: f16, bf16)."""
    globs = matrix.selected_dtypes(globs)
    every = [d for d in DTYPES if d != "float32" or f32_sample > 0 or f32_full]
    return [d for d in every if not globs or any(fnmatch.fnmatchcase(d, g) for g in globs)]


def unary_ops(globs: Sequence[str] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(op, attrs) of every unary op with a float oracle: one float input, float output; each
    combination of attribute sweeps (clamp's bounds; cast to every float dtype)."""
    out = []
    for spec in all_ops():
        if (len(spec.inputs) != 1 or spec.inputs[0].dtypes != "T" or spec.name not in precise.ELEMENTWISE
                or not {"float16", "bfloat16"} & set(spec.dtypes) or spec.policy.check is not None):
            continue
        if globs and not any(fnmatch.fnmatchcase(spec.name, g) for g in globs):
            continue
        sweeps = []
        for a in spec.attrs:
            vals = a.sweep if isinstance(a.sweep, tuple) else (a.default,)
            if spec.name == "cast" and a.name == "to":
                vals = dt.FLOATS
            sweeps.append([(a.name, v) for v in vals])
        for combo in itertools.product(*sweeps):
            out.append((spec.name, spec.resolve_attrs(dict(combo))))
    return out


def inputs_for(dtype: str, f32_sample: int = 0) -> np.ndarray:
    """Every bit pattern of float16 / bfloat16; for float32 a deterministic sample of about
    ``f32_sample`` patterns covering every exponent (both signs): per biased exponent the
    smallest, largest and evenly spaced significands."""
    if dtype in ("float16", "bfloat16"):
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dt.np_dtype(dtype))
    if dtype != "float32":
        raise RlxError(f"exhaustive: no sweep for {dtype} (float16, bfloat16, float32 sample)")
    return exhaustive_f32.sample_bits(f32_sample).view(np.float32)


def _attr_label(attrs: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(attrs.items()))


def pseudo_case(op: str, attrs: dict[str, Any], dtype: str, n: int, target: Target) -> Case:
    """The case a row stands for (known divergences match rows through it)."""
    spec = get_op(op)
    order = [a.name for a in spec.attrs]
    return Case(op=op, dtype=dtype, shapes=((n,),), family="exhaustive",
                attrs=tuple((k, attrs[k]) for k in order), vals="exhaustive", target=target)


# -- the oracle, cached on disk --------------------------------------------------------------------
def oracle_for(op: str, attrs: dict[str, Any], dtype: str, x: np.ndarray, out_dtype: str,
               cache_dir: Path | None) -> np.ndarray:
    """The precise oracle's outputs for ``x``, from the disk cache when it holds them."""
    key = hashlib.sha256(json.dumps([op, sorted((k, str(v)) for k, v in attrs.items()), dtype, out_dtype,
                                     len(x), hashlib.sha256(x.tobytes()).hexdigest(), precise.version()])
                         .encode()).hexdigest()[:24]
    path = cache_dir / f"{op}-{dtype}-{key}.npy" if cache_dir else None
    if path is not None and path.exists():
        try:
            bits = np.load(path)
            return bits.view(dt.np_dtype(out_dtype))
        except (OSError, ValueError):
            pass  # a torn file: recompute
    with np.errstate(all="ignore"):
        y = precise.compute(op, [x], attrs, [out_dtype])[0]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, y.view(dt.finfo(out_dtype).uint))
        os.replace(tmp, path)
    return y


# -- judging one output ------------------------------------------------------------------------------
def _hex(v: np.ndarray) -> str:
    fi = dt.finfo(dt.name_of(v.dtype))
    return f"0x{int(np.asarray(v).view(fi.uint)):0{fi.bits // 4}x}"


def judge_row(op: str, attrs: dict[str, Any], x: np.ndarray, got: np.ndarray, want: np.ndarray,
              ftz: bool) -> dict[str, Any]:
    """One target's row: ``got`` against the oracle ``want`` under the op's accuracy budget."""
    spec = get_op(op)
    out_dtype = dt.name_of(want.dtype)
    budget = budget_for(op, out_dtype)
    undefined = spec.undefined([x], attrs)
    m = measure(got, want, budget, skip=undefined, signed_zero=spec.policy.signed_zero, ftz=ftz,
                compute_dtype=dt.compute_dtype(out_dtype))
    with np.errstate(all="ignore"):
        ulp = ulp_distance(got, want)
    score = np.where(m.over_mask, np.inf, 0.0) + np.where(np.isnan(ulp), 0.0, ulp)
    if undefined is not None:
        score = np.where(np.broadcast_to(undefined, score.shape), -1.0, score)
    order = np.argsort(-score, kind="stable")[:WORST]
    worst = [{"input": _hex(x[i]), "x": float(x[i]), "want": float(want[i]), "got": float(got[i]),
              "ulp": None if np.isnan(ulp[i]) else float(ulp[i]), "over_budget": bool(m.over_mask[i])}
             for i in order if score[i] > 0]
    return {"n": int(x.size), "checked": m.checked, "max_ulp": m.max_ulp, "over_budget": m.over,
            "nan_mismatch": m.nan, "inf_mismatch": m.inf, "signed_zero_mismatch": m.signed_zero,
            "signed_zero_asserted": spec.policy.signed_zero, "ftz_used": m.ftz,
            "budget": budget.to_json(), "worst": worst}


# -- worker ------------------------------------------------------------------------------------------
def _run_one(job: dict[str, Any], target: Target, x: np.ndarray, want: np.ndarray) -> dict[str, Any]:
    op, attrs = job["op"], job["attrs"]
    t0 = time.perf_counter()
    b = get_backend(target.backend)
    try:
        with np.errstate(all="ignore"):
            got = b.run(op, [x.copy()], attrs, target.device, target.mode)[0]
    except UnsupportedError as e:
        return {"outcome": "skip", "message": str(e), "seconds": time.perf_counter() - t0}
    except Exception as e:  # noqa: BLE001 — a kernel failure is a row, not a dead sweep
        return {"outcome": "error", "message": f"{type(e).__name__}: {e}", "seconds": time.perf_counter() - t0}
    row = judge_row(op, attrs, x, got, want, b.flushes_subnormals(target.device))
    row["seconds"] = time.perf_counter() - t0
    return row


def _sweep_job(job: dict[str, Any], send: Callable[[Any], None]) -> None:
    """The sweep's task function (worker.serve applies it to each job in a worker): the inputs
    and the oracle, then each target from ``job["next"]`` on, announced by ("start", i) before it
    runs (a crash or hang is then that target's) and reported as (i, row)."""
    if job["dtype"] == "float32":
        _sweep_f32_job(job, send)
        return
    try:
        x = inputs_for(job["dtype"], job["f32_sample"])
        out_dtype = job["attrs"].get("to", job["dtype"]) if job["op"] == "cast" else job["dtype"]
        t0 = time.perf_counter()
        want = oracle_for(job["op"], job["attrs"], job["dtype"], x, out_dtype,
                          Path(job["cache"]) if job["cache"] else None)
        oracle_s = time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 — the oracle's failure is the harness's: every row errors
        for i in range(job["next"], len(job["targets"])):
            send((i, {"outcome": "error", "message": f"harness error in the oracle: {type(e).__name__}: {e}"}))
        return
    for i in range(job["next"], len(job["targets"])):
        send(("start", i))
        row = _run_one(job, Target.parse(job["targets"][i]), x, want)
        row["oracle_s"] = oracle_s
        send((i, row))


def _sweep_f32_job(job: dict[str, Any], send: Callable[[Any], None]) -> None:
    """The float32 job: each target through exhaustive_f32.sweep (chunked; the float64 oracle on
    CuPy or numpy, MPFR for what it leaves undecided), announced and reported as _sweep_job does."""
    op, attrs = job["op"], job["attrs"]
    out_dtype = attrs.get("to", "float32") if op == "cast" else "float32"
    for i in range(job["next"], len(job["targets"])):
        send(("start", i))
        target = Target.parse(job["targets"][i])
        t0 = time.perf_counter()
        b = get_backend(target.backend)

        def compute(x: np.ndarray) -> np.ndarray:
            return b.run(op, [x], attrs, target.device, target.mode)[0]
        try:
            row = exhaustive_f32.sweep(op, attrs, out_dtype, compute, b.flushes_subnormals(target.device),
                                       range_=job["f32_range"], sample=job["f32_sample"],
                                       chunk=job.get("f32_chunk"), oracle=job.get("f32_oracle", "auto"))
        except UnsupportedError as e:
            row = {"outcome": "skip", "message": str(e)}
        except Exception as e:  # noqa: BLE001 — a kernel failure is a row, not a dead sweep
            row = {"outcome": "error", "message": f"{type(e).__name__}: {e}"}
        row["seconds"] = round(time.perf_counter() - t0, 3)
        send((i, row))


@dataclass
class _SweepWorker(worker.Worker):
    """A worker and its job: ``cur`` is the target it announced last (None before the first)."""

    job: dict[str, Any] | None = None
    deadline: float = float("inf")
    cur: int | None = None


class _Pool:
    """A few long-lived workers; one job at a time each; a dead or silent worker is replaced."""

    def __init__(self, workers: int, timeout: float, init: str | None):
        self.ctx = worker.context()  # a forkserver with numpy and the reference preloaded (spawn on macOS)
        self.n, self.timeout, self.init = workers, timeout, init

    def _spawn(self) -> _SweepWorker:
        w = worker.start(self.ctx, _sweep_job, init=self.init, hint="(an exhaustive sweep's worker)")
        return _SweepWorker(w.proc, w.conn)

    def run(self, jobs: list[dict[str, Any]], emit: Callable[[dict, int, dict], None]) -> None:
        queue = deque(jobs)
        pool = [self._spawn() for _ in range(min(self.n, len(jobs)))]
        try:
            while queue or any(w.job for w in pool):
                for w in pool:
                    if w.job is None and queue:
                        w.job = queue.popleft()
                        w.cur = None
                        # the oracle of a cold cache takes a while: the first deadline is generous
                        w.deadline = time.monotonic() + self.timeout + 600
                        w.send(w.job)
                busy = [w for w in pool if w.job]
                left = max(0.0, min(w.deadline for w in busy) - time.monotonic())
                ready = worker.wait_any(busy, left)
                for w in busy:
                    answers, dead = w.answers(ready)
                    for i, msg in answers:
                        if i == worker.DONE:
                            w.job = None
                            break
                        if i == "start":
                            w.cur = msg
                            w.deadline = time.monotonic() + self.timeout
                            continue
                        emit(w.job, i, msg)
                        w.job["next"] = i + 1
                    if w.job and (dead or time.monotonic() > w.deadline):
                        job, timed_out = w.job, not dead
                        ended = w.end(hung=timed_out)
                        i = w.cur if w.cur is not None else job["next"]
                        emit(job, i, {"outcome": "timeout" if timed_out else "crash", "message": (
                            f"no result within {self.timeout:g} s; worker killed" if timed_out else
                            f"worker process died ({ended}) while running this target")})
                        job["next"] = i + 1
                        if job["next"] < len(job["targets"]):
                            queue.appendleft(job)
                        pool.remove(w)
                        pool.append(self._spawn())
        finally:
            worker.stop(pool)


# -- the sweep ------------------------------------------------------------------------------------
def _verdict(row: dict[str, Any], job: dict[str, Any], target: Target) -> dict[str, Any]:
    if row.get("outcome") in ("skip", "error", "crash", "timeout"):
        bad = row["outcome"] != "skip"
    else:
        bad = row["over_budget"] > 0
        row["outcome"] = "fail" if bad else "pass"
    if target == REFERENCE:
        if bad and row["outcome"] == "fail":
            row["message"] = ("reference bug: the CPU reference is over the accuracy budget on "
                              f"{row['over_budget']} input(s)")
        return row
    n = row.get("n") or (1 << 16)
    case = pseudo_case(job["op"], job["attrs"], job["dtype"], n, target)
    # a failing row is over budget (a "value" failure measured in max_ulp), or dead or hung: only
    # an entry that excuses that kind, within its cap, excuses it
    # max_ulp is the row's worst over every input, within budget or not: only a worst beyond the
    # op's ULP budget is a "value" failure (a row whose only failures are NaN/inf mismatches, next
    # to in-budget rounding elsewhere, is a nonfinite failure alone)
    worst, allowed = row.get("max_ulp"), (row.get("budget") or {}).get("ulp")
    value_ulp = worst if worst is not None and (allowed is None or worst > allowed) else 0.0
    got = SimpleNamespace(outcome=row["outcome"], max_ulp=value_ulp, max_rel_err=None,
                          max_abs_err=None,
                          nonfinite_mismatches=(row.get("nan_mismatch") or 0) + (row.get("inf_mismatch") or 0))
    d = known_divergence(case, got if bad else None)
    if bad and d is None and (why := unexcused(case, got)):
        row["message"] = f"{row.get('message', '')} [{why}]".strip()
    if d is None or row["outcome"] == "skip":
        return row
    row["divergence"] = {"entry": d.key, "category": d.category, "reason": d.reason}
    if bad:
        row["message"] = (f"known divergence {d.key} ({d.category}): was {row['outcome']}: "
                          f"{row.get('message', '')}").rstrip(": ")
        row["divergence"]["was"] = row["outcome"]
        row["outcome"] = "xfail"
    elif d.strict and d.exhaustive:
        part = d.part(case.op, case.dtype, case.id)  # one op of an entry's op list, say
        row["outcome"] = "xpass"
        row["message"] = (f"known divergence {d.key}" + (f" ({d.describe(part)})" if part else "")
                          + " no longer reproduces: remove it from cases/known_divergences.toml")
    return row


def rejudge(doc: dict[str, Any]) -> dict[str, Any]:
    """A sweep's document judged again under cases/known_divergences.toml as it is now (the
    sweep's counterpart of run/outcomes.rejudge): each row back to what it measured (over budget
    or not; dead or hung), then :func:`_verdict`. Rows of sweeps that predate ``divergence.was``
    read it from their message."""
    rows = []
    for r in doc["rows"]:
        r = dict(r)
        div = r.pop("divergence", None) or {}
        if r["outcome"] == "xfail":
            m = re.search(r"\): was (\w+)(?:: |$)", r.get("message") or "")
            was = div.get("was") or (m.group(1) if m else "fail")
            r["message"] = (r.get("message") or "").split(f": was {was}", 1)[-1].lstrip(": ")
            r["outcome"] = was if was in ("error", "crash", "timeout") else "fail"
        elif r["outcome"] == "xpass":
            r["outcome"], r["message"] = "pass", ""
        elif div.get("excused") is False or (r["outcome"] == "fail" and (r.get("message") or "").endswith("]")):
            # unexcused()'s note (the whole message where the row had no other), made again below
            r["message"] = re.sub(r"\s*\[outside known divergence .*\]$", "", r["message"])
        job = {"op": r["op"], "attrs": r.get("attrs") or {}, "dtype": r["dtype"]}
        rows.append(_verdict(r, job, Target.parse(r["target"])))
    summary = Counter(r["outcome"] for r in rows)
    return doc | {"rows": rows, "failed": any(r["outcome"] in SWEEP_FAILING for r in rows),
                  "summary": {o: summary.get(o, 0) for o in ("pass", "fail", "xfail", "xpass", "error", "crash",
                                                            "timeout", "skip")} | {"total": len(rows)}}


def run_exhaustive(targets: Sequence[Target], ops: Sequence[str] | None = None,
                   dtypes: Sequence[str] | None = None, report_dir: Path | str | None = None, *,
                   f32_sample: int = 0, f32_range: str = "sample", f32_oracle: str = "auto",
                   f32_chunk: int | None = None, workers: int | None = None, timeout: float = 120.0,
                   cache_dir: Path | str | None | bool = True, reference: bool = True,
                   init: str | None = None, shard: tuple[int, int] | None = None,
                   on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Sweep the unary float ops (``ops``: name globs, default all) over ``dtypes`` (default
    float16 and bfloat16; float32 needs ``f32_sample`` > 0) on the CPU reference (``reference``)
    and each target, in isolated workers. Returns the report document (schema
    rlx-conformance/exhaustive/v1: run, summary, rows) and writes it to
    ``report_dir/exhaustive.json`` when a directory is given. ``cache_dir``: True = the default
    oracle cache (default_cache_dir()), a path, or None/False for none. A row's ``outcome`` is
    one of pass, fail, xfail, xpass, error, crash, timeout, skip; the run failed if any is in
    SWEEP_FAILING (``doc["failed"]``). float32: ``f32_range`` "full" (all 2^32 patterns, in
    chunks of ``f32_chunk``) or "sample" (about ``f32_sample``); ``f32_oracle`` "auto" (CuPy
    where it sees a GPU, else numpy), "cupy" or "numpy" (exhaustive_f32.py). ``shard``: (I, N), sweep only the I-th of every N jobs
    (op, attributes, dtype), as ``run --shard I/N --exhaustive`` does on each machine."""
    dtypes = list(dtypes or ("float16", "bfloat16"))
    for d in dtypes:
        if d not in DTYPES:
            raise RlxError(f"exhaustive: dtype {d} not sweepable (float16, bfloat16, float32)")
    if f32_range not in ("sample", "full"):
        raise RlxError(f"exhaustive: float32 range {f32_range!r} (sample, full)")
    if "float32" in dtypes and f32_sample <= 0 and f32_range != "full":
        dtypes.remove("float32")
    cache = default_cache_dir() if cache_dir is True else (Path(cache_dir) if cache_dir else None)
    sel = unary_ops(ops)
    if not sel:
        raise RlxError("exhaustive: no unary float op matches " + ", ".join(ops or []))
    tlist = ([REFERENCE] if reference else []) + [t for t in targets if t != REFERENCE]
    jobs = []
    for op, attrs in sel:
        for d in dtypes:
            if d in get_op(op).dtypes:
                jobs.append({"op": op, "attrs": attrs, "dtype": d, "targets": [str(t) for t in tlist],
                             "next": 0, "f32_sample": f32_sample, "f32_range": f32_range,
                             "f32_oracle": f32_oracle, "f32_chunk": f32_chunk, "cache": str(cache) if cache else None})
    if shard is not None:
        jobs = [j for k, j in enumerate(jobs) if k % shard[1] == shard[0] - 1]
    rows: list[dict[str, Any]] = []
    started = _dt.datetime.now(_dt.UTC)
    t0 = time.perf_counter()

    def emit(job, i, row):
        target = Target.parse(job["targets"][i])
        row = {"op": job["op"], "attrs": job["attrs"], "dtype": job["dtype"], "target": str(target),
               "backend": target.backend, "device": target.device, "mode": target.mode, **row}
        row = _verdict(row, job, target)
        rows.append(row)
        if on_row:
            on_row(row)

    n_workers = workers if workers is not None else min(os.cpu_count() or 1, 4)
    _Pool(max(n_workers, 1), timeout, init).run(jobs, emit)
    key = {(j["op"], _attr_label(j["attrs"]), j["dtype"]): k for k, j in enumerate(jobs)}
    rows.sort(key=lambda r: (key[(r["op"], _attr_label(r["attrs"]), r["dtype"])], r["target"] != str(REFERENCE), r["target"]))
    doc = {"schema": SCHEMA,
           "run": run_metadata(start=started.isoformat(timespec="seconds"),
                               wall_s=round(time.perf_counter() - t0, 3), targets=[str(t) for t in tlist],
                               dtypes=dtypes, ops=sorted({op for op, _ in sel}), float32_sample=f32_sample,
                               **({"float32_range": f32_range,
                                   "float32_oracle": exhaustive_f32.array_module(f32_oracle)[1]}
                                  if "float32" in dtypes else {}),
                               workers=n_workers, oracle_version=precise.version(),
                               oracle_cache=str(cache) if cache else None,
                               wide_longdouble=precise.WIDE_LONGDOUBLE,
                               **({"shard": f"{shard[0]}/{shard[1]}"} if shard else {})),
           **_verdicts(rows)}
    if report_dir is not None:
        write_doc(doc, Path(report_dir))
    return doc


def _verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A sweep document's summary, failed and rows, from its rows."""
    summary = Counter(r["outcome"] for r in rows)
    return {"summary": {o: summary.get(o, 0) for o in ("pass", "fail", "xfail", "xpass", "error", "crash",
                                                       "timeout", "skip")} | {"total": len(rows)},
            "failed": any(r["outcome"] in SWEEP_FAILING for r in rows), "rows": rows}


def write_doc(doc: dict[str, Any], report_dir: Path) -> None:
    """``report_dir/exhaustive.json``; sets ``doc["path"]``."""
    path = Path(report_dir) / "exhaustive.json"
    atomic_write_text(path, json.dumps(_jsonable({k: v for k, v in doc.items() if k != "path"}), indent=1,
                                       allow_nan=False) + "\n")
    doc["path"] = str(path)


def merge_docs(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The sweep documents of the shards of one run (``run --shard I/N --exhaustive``) as one: every
    row, the first shard's metadata with its wall time the longest and no shard label."""
    rows = sorted((r for d in docs for r in d["rows"]),
                  key=lambda r: (r["op"], _attr_label(r["attrs"]), r["dtype"], r["target"] != str(REFERENCE),
                                 r["target"]))
    run = {k: v for k, v in docs[0]["run"].items() if k != "shard"}
    run["wall_s"] = max(d["run"].get("wall_s") or 0 for d in docs)
    return {"schema": SCHEMA, "run": run, **_verdicts(rows)}
