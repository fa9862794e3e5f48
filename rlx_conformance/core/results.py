"""Case results and the results.json sink. Every output (terminal summary, pytest item, JUnit,
results.json) is made from CaseResult records alone."""
from __future__ import annotations

import gzip
import importlib
import json
import math
import os
import platform
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from rlx_conformance.core import provenance
from rlx_conformance.core.errors import ResultsWriteError, RlxError

SCHEMA = "rlx-conformance/results/v1"
# contract: the kernel broke the call convention (wrong output count/shape/dtype, a non-array
# output, an input modified in place): reported as such, never as a numeric mismatch.
# not-run: the runner stopped the case's kernel (an op on a target) after consecutive crashes or
# timeouts (run/runner.py, --max-consecutive-failures): nothing was checked, so it fails the run.
OUTCOMES = ("pass", "fail", "xfail", "xpass", "error", "contract", "crash", "timeout", "not-run", "skip")
RUN_FAILING = ("fail", "xpass", "error", "contract", "crash", "timeout", "not-run")  # outcomes that fail a run
# Row outcomes that fail an exhaustive sweep (run/exhaustive.py; its HTML section): those that fail
# a run but "contract" (a sweep records a broken call convention as "error") and "not-run".
SWEEP_FAILING = ("fail", "xpass", "error", "crash", "timeout")


@dataclass
class CaseResult:
    id: str
    op: str
    dtype: str
    shape: list[list[int]]
    family: str
    attrs: dict[str, Any]
    vals: str
    backend: str
    device: str
    mode: str
    outcome: str
    kernel: str = "native"  # native | delegated
    origin: str = "builtin"  # where the target's kernel comes from (validate --kernel, an entry point)
    stream: str | None = None  # the MLX stream that ran (cpu/gpu) when it differs from the device
    variant: str = ""  # the target's backend variant, e.g. "tf32:off" (matrix.Target.variant)
    # the derivative the case checks ("" for the op itself): vjp, jvp or hvp (matrix.Case.grad)
    grad: str = ""
    # how the inputs lay in memory for the target ("" contiguous): transposed, strided, offset,
    # reversed, broadcast or mixed (matrix.Case.layout, issue 17)
    layout: str = ""
    # a graph case (op "graph:NAME", issue 17): nodes, the mode actually run where RLX's fallback
    # applies, and what the node-by-node bound left unasserted (run/graphs.py)
    graph: dict[str, Any] | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    max_ulp: float | None = None
    tolerance: dict[str, Any] | None = None
    # output elements not fully asserted (None: none): ``order_dependent``, judged only by the
    # outcomes the spec leaves legal there (e.g. a sum whose partial sums may overflow in some
    # order); ``unbounded``, whose finite value no error bound covers (NaN/inf still asserted)
    unasserted: dict[str, int] | None = None
    duration_s: float = 0.0  # the whole case in its worker: inputs, reference, target, comparison
    backend_s: float = 0.0  # of which the target backend's run
    message: str = ""
    seed: int = 0
    declared: bool = True
    divergence: dict[str, Any] | None = None
    # bit-stability (stability.py): sha256 of the target's outputs (bytes, shapes, dtypes); with
    # --repeat N, which run this record is (journal) and, merged, every run's digest in order
    output_digest: str | None = None
    repeat: int = 0
    repeat_digests: list[str | None] | None = None
    repro: str | None = None  # the case's repro bundle, relative to the report dir (bundle.py)
    # the precise oracle (accuracy.py; None where the op has none): max ULP distance of the
    # reference and of the target from the correctly rounded result, elements over the op's
    # accuracy budget (cases/accuracy.toml), the verdict (ok | target-over-budget |
    # reference-bug | supports-reference | both-within-budget), and whether a flushed subnormal
    # was accepted under the backend's declared FTZ
    oracle_ulp_ref: float | None = None
    oracle_ulp_target: float | None = None
    over_budget: int | None = None
    over_budget_ref: int | None = None
    budget: dict[str, Any] | None = None
    oracle_verdict: str | None = None
    ftz_used: bool = False
    # accumulating budgets (judge/budgets.py): measured against the precise "oracle" or the
    # "reference", and the largest |error| / allowance over the assessed elements (> 1: over)
    budget_against: str | None = None
    budget_ratio: float | None = None
    # elements where the worst-case bound is vacuous: larger than |result| (no digit of the
    # result is certain from it; the accuracy budget is what judges them)
    vacuous_bound: int | None = None
    # output elements whose NaN/inf pattern differs from the reference's (compare.Comparison.
    # nonfinite): such a failure is of kind "nonfinite", not "value" (failure_kind)
    nonfinite_mismatches: int | None = None
    # a failing case's wrong elements (run/execute.py mismatch; None otherwise, and in records
    # written before it existed): count, checked, counts per kind (NaN, inf, value, signed
    # zero, ...), the largest errors among the wrong finite values (max_abs_err, max_rel_err,
    # max_ulp: what a known divergence's caps bound; absent in records before 2026-12-05), and
    # the first few positions with the reference's and the target's values and, for a gather or
    # scatter, the index tuple that produced them ("from")
    mismatch: dict[str, Any] | None = None

    @classmethod
    def for_case(cls, case, outcome: str, **kw: Any) -> CaseResult:
        t = case.target
        return cls(id=case.id, op=case.op, dtype=case.dtype, shape=[list(s) for s in case.shapes],
                   family=case.family, attrs={k: _jsonable(v) for k, v in case.attrs}, vals=case.vals,
                   backend=t.backend, device=t.device, mode=t.mode, variant=t.variant, outcome=outcome,
                   grad=getattr(case, "grad", ""), layout=getattr(case, "layout", ""),
                   seed=case.seed, declared=case.declared, repeat=case.repeat, **kw)

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: NaN becomes null and +-inf the strings "inf"/"-inf", anywhere in the record.
        The fields one by one, not dataclasses.asdict: _jsonable builds fresh containers anyway,
        and asdict's deep copy of every value was most of the parent's CPU per record (the
        journal and results.json each encode every record)."""
        return {name: _jsonable(getattr(self, name)) for name in _field_names(type(self))}

    @classmethod
    def from_json(cls, rec: dict[str, Any]) -> CaseResult:
        """A record of results.json back as a CaseResult (merge re-judges shard records): fields
        this version does not know are dropped; measured errors "inf"/"-inf" become floats again
        (NaN was stored as null and stays None), so ``to_json`` gives the record back."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in rec.items() if k in names}
        for k in ("max_abs_err", "max_rel_err", "max_ulp"):
            if isinstance(kw.get(k), str):
                kw[k] = float(kw[k])
        return cls(**kw)


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


_PLAIN = (str, int, bool, type(None))  # exact types _jsonable returns as they are


def _jsonable(v: Any) -> Any:
    t = type(v)
    if t in _PLAIN:
        return v
    if t is float:
        return v if math.isfinite(v) else (None if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if is_dataclass(v) and not isinstance(v, type):  # what asdict made of a nested record
        return _jsonable(asdict(v))
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        v = v.item()
    if isinstance(v, float):
        if math.isnan(v):
            return None
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
    return v


def summarize(results: Iterable[CaseResult]) -> dict[str, int]:
    c = Counter(r.outcome for r in results)
    return {o: c.get(o, 0) for o in OUTCOMES} | {"total": sum(c.values())}


def run_metadata(**kw: Any) -> dict[str, Any]:
    meta = {
        "harness": provenance.harness(),  # version, and the git commit when run from a checkout
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
    }
    for mod in ("numpy", "ml_dtypes", "scipy"):  # the reference's libraries (an old ml_dtypes rounded differently)
        try:
            meta[mod] = importlib.import_module(mod).__version__
        except ImportError:
            meta[mod] = None
    try:  # the distribution's version: the parent process never loads MLX itself
        meta["mlx"] = metadata.version("mlx")
    except metadata.PackageNotFoundError:
        meta["mlx"] = None
    meta["env"] = {k: v for k, v in os.environ.items() if k.startswith(("RLX_", "MLX_"))}
    # TF32 for float32 matmul/conv on CUDA (MLX reads it once per process; unset = MLX's default,
    # on). Cases run under another setting carry it in their target (variant tf32:on/tf32:off).
    meta["mlx_enable_tf32"] = os.environ.get("MLX_ENABLE_TF32", "unset (MLX default: 1)")
    meta.update(kw)
    return meta


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temporary file in the same directory and rename: readers (and a killed run)
    never see a truncated file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report is for everyone to read
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_results(path: Path, run: dict[str, Any], results: list[CaseResult],
                  stability: dict[str, Any]) -> None:
    """results.json, atomically. ``stability`` is the bit-stability section the judge layer
    classified from these results (judge.stability.classify)."""
    head = {"schema": SCHEMA, "run": run, "summary": summarize(results), "stability": stability}
    try:
        atomic_write_text(path, dumps_results(head, [r.to_json() for r in results]))
    except OSError as e:
        raise ResultsWriteError(f"cannot write {path}: {e.strerror or e}") from e


def dumps_results(head: dict[str, Any], cases: list[dict[str, Any]]) -> str:
    """A results document's text: ``head``'s fields indented, then ``"cases"``, one record a line.
    One line a record reads and greps as well as an indented one, and json's C encoder writes it
    (``indent`` sends json to its pure-Python encoder: 2.7 s of the parent's CPU for 32,000
    records, against 0.3 s)."""
    text = json.dumps(head, indent=1, allow_nan=False)  # "{\n ...\n}"
    body = ",\n".join(json.dumps(c, allow_nan=False) for c in cases)
    return text[:-2] + ',\n "cases": [' + ("\n" + body + "\n" if cases else "") + "]\n}\n"


class Journal:
    """Append-only JSON-lines log of results as they arrive, so a run killed outright (SIGKILL,
    power loss) still leaves everything it had gathered; removed once results.json is written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("w")

    def add(self, r: CaseResult) -> None:
        try:
            self._f.write(json.dumps(r.to_json(), allow_nan=False) + "\n")
            self._f.flush()
        except OSError as e:
            raise ResultsWriteError(f"cannot write {self.path}: {e.strerror or e}") from e

    def close(self, remove: bool) -> None:
        try:
            self._f.close()
        except OSError:  # the flush of a write that already failed (a full disk): nothing more to save
            pass
        if remove:
            self.path.unlink(missing_ok=True)


def load_resumable(report_dir: Path) -> tuple[dict[str, Any], list[CaseResult]]:
    """What an earlier run in ``report_dir`` recorded: its results.json or results.json.gz (an
    interrupted run's too), else the journal of one killed outright (a torn last line is dropped). Returns the
    run metadata ({} from a journal) and the records."""
    report_dir = Path(report_dir)
    journal = report_dir / "results.partial.jsonl"
    for done in (report_dir / "results.json", report_dir / "results.json.gz"):
        if done.exists():
            doc = load_results(done)
            return doc["run"], [CaseResult.from_json(c) for c in doc["cases"]]
    if journal.exists():
        recs = []
        for line in journal.read_text().splitlines():
            try:
                recs.append(CaseResult.from_json(json.loads(line)))
            except (ValueError, TypeError):
                break  # the line being written when the run died
        return {}, recs
    raise ValueError(f"{report_dir}: no results.json(.gz) or results.partial.jsonl to resume")


def load_results(path: Path) -> dict[str, Any]:
    """A results.json, or a gzipped one (``.gz``)."""
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a results file of schema {SCHEMA}")
    return doc


# -- reading a results.json back (reports, merge, resume) -------------------------------------
# A case record as results.json holds it (CaseResult.to_json): the sinks that work after a run take
# these, not CaseResult objects, so a file from a newer harness keeps the fields this one lacks.
Record = dict[str, Any]


@dataclass
class Report:
    """One results.json: run metadata, summary and case records."""

    path: Path
    run: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, int] = field(default_factory=dict)
    cases: list[Record] = field(default_factory=list)
    stability: dict[str, Any] | None = None  # the run's bit-stability section, where it has one

    @property
    def dir(self) -> Path:
        return self.path.parent

    def by_id(self) -> dict[str, Record]:
        return {c["id"]: c for c in self.cases}


def results_path(path: str | Path) -> Path:
    """A results.json (or results.json.gz, as the committed baseline is kept) given itself or the
    report directory that holds it."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json" if (p / "results.json").is_file() else p / "results.json.gz"
    if not p.is_file():
        raise RlxError(f"no results file at {p}")
    return p


def load_report(path: str | Path) -> Report:
    """A results.json (or its report directory) read back as a :class:`Report`."""
    p = results_path(path)
    try:
        doc = load_results(p)
    except json.JSONDecodeError as e:
        raise RlxError(f"{p}: not valid JSON ({e})") from None
    except ValueError as e:
        raise RlxError(str(e)) from None
    cases = doc.get("cases") or []
    counts = Counter(r.get("outcome") for r in cases)
    summary = doc.get("summary") or ({o: counts.get(o, 0) for o in OUTCOMES} | {"total": len(cases)})
    stab = doc.get("stability")
    return Report(path=p, run=doc.get("run") or {}, summary=summary, cases=cases,
                  stability=stab if isinstance(stab, dict) else None)
