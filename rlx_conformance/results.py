"""Case results and the results.json sink. Every output (terminal summary, pytest item, JUnit,
results.json) is made from CaseResult records alone."""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "rlx-conformance/results/v1"
OUTCOMES = ("pass", "fail", "xfail", "xpass", "error", "crash", "timeout", "skip")
BAD = ("fail", "xpass", "error", "crash", "timeout")  # outcomes that fail a run


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
    stream: str | None = None  # the MLX stream that ran (cpu/gpu) when it differs from the device
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    max_ulp: float | None = None
    tolerance: dict[str, Any] | None = None
    duration_s: float = 0.0  # the whole case in its worker: inputs, reference, target, comparison
    backend_s: float = 0.0  # of which the target backend's run
    message: str = ""
    seed: int = 0
    declared: bool = True
    divergence: dict[str, Any] | None = None

    @classmethod
    def for_case(cls, case, outcome: str, **kw: Any) -> "CaseResult":
        t = case.target
        return cls(id=case.id, op=case.op, dtype=case.dtype, shape=[list(s) for s in case.shapes],
                   family=case.family, attrs={k: _jsonable(v) for k, v in case.attrs}, vals=case.vals,
                   backend=t.backend, device=t.device, mode=t.mode, outcome=outcome,
                   seed=case.seed, declared=case.declared, **kw)

    def to_json(self) -> dict[str, Any]:
        """Strict JSON: NaN becomes null and +-inf the strings "inf"/"-inf", anywhere in the record."""
        return _jsonable(asdict(self))


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):  # numpy scalars
        v = v.item()
    if isinstance(v, float):
        if v != v:
            return None
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
    return v


def summarize(results: Iterable[CaseResult]) -> dict[str, int]:
    c = Counter(r.outcome for r in results)
    return {o: c.get(o, 0) for o in OUTCOMES} | {"total": sum(c.values())}


def run_metadata(**kw: Any) -> dict[str, Any]:
    import numpy

    meta = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
    }
    try:
        import mlx.core as mx

        meta["mlx"] = mx.__version__
    except ImportError:
        meta["mlx"] = None
    meta["env"] = {k: v for k, v in os.environ.items() if k.startswith(("RLX_", "MLX_"))}
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
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_results(path: Path, run: dict[str, Any], results: list[CaseResult]) -> None:
    doc = {"schema": SCHEMA, "run": run, "summary": summarize(results),
           "cases": [r.to_json() for r in results]}
    atomic_write_text(path, json.dumps(doc, indent=1, allow_nan=False) + "\n")


class Journal:
    """Append-only JSON-lines log of results as they arrive, so a run killed outright (SIGKILL,
    power loss) still leaves everything it had gathered; removed once results.json is written."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("w")

    def add(self, r: CaseResult) -> None:
        self._f.write(json.dumps(r.to_json(), allow_nan=False) + "\n")
        self._f.flush()

    def close(self, remove: bool) -> None:
        self._f.close()
        if remove:
            self.path.unlink(missing_ok=True)


def load_results(path: Path) -> dict[str, Any]:
    with open(path) as f:
        doc = json.load(f)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a results file of schema {SCHEMA}")
    return doc
