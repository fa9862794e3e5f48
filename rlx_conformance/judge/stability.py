"""Bit-stability: is a backend's output bit-identical when a case runs again, and across modes?

MLX against itself, separate from MLX against the reference (tolerances). Each case records a
digest of the target's outputs (:func:`output_digest`, computed in execute.run_case); with
``--repeat N`` a case runs N times, in different worker processes where possible, and the
records of one id are merged into one (:func:`merge_repeats`) that keeps every repeat's digest.
From those records alone, :func:`classify` sorts every (op, dtype, backend, device, mode) group
into one of:

* ``nondeterministic`` — some case of the group gave different outputs on repeated runs;
* ``mode-dependent`` — deterministic, but for the same inputs (input id) the output differs
  from another mode's on the same device (every mode taking part in such a disagreement is);
* ``bit-stable`` — every comparison made (repeats, other modes) was bit-identical;
* ``unknown`` — no comparison was possible: one run of one mode.

``cases/bit_stable.toml`` (written by ``rlx-conformance stability --update RESULTS.json``) lists
the (op, dtype, backend, device) groups observed bit-identical across a set of modes and repeats;
:func:`enforce` makes a later run fail every case whose modes or repeats disagree bit-wise within
such a group (``session.execute`` calls it after ``runner.finalize``).
"""
from __future__ import annotations

import hashlib
import platform
import tomllib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge import divergences as kd

CLASSES = ("bit-stable", "mode-dependent", "nondeterministic", "unknown")
RECORDED_FILE = "bit_stable.toml"  # under cases/
# Outcomes whose digest is compared when enforcing (a skip or an error has no meaningful output).
_ENFORCED = ("pass", "fail", "xfail", "xpass")
_EXAMPLES = 5  # case ids kept per group and kind in the report


# -- digests -------------------------------------------------------------------------------------
def output_digest(outputs: Sequence[np.ndarray]) -> str:
    """sha256 (hardware-accelerated on x86-64 and arm64: ~1.5 GB/s, twice blake2b's) over every
    output's dtype, shape and raw bytes, 128 bits of it in hex. NaN payloads and the sign of zero
    count: bit-exact means bits."""
    h = hashlib.sha256()
    for a in outputs:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.dtype.name}{a.shape};".encode())
        h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()[:32]


def _get(r: Any, key: str) -> Any:
    return r.get(key) if isinstance(r, dict) else getattr(r, key, None)


def digests_of(r: Any) -> list[str]:
    """The digests a record holds: every repeat's (merged record) or its own; none when the
    target produced no output (error, crash, timeout, a confirmed skip)."""
    ds = _get(r, "repeat_digests")
    if not ds:
        ds = [_get(r, "output_digest")]
    return [d for d in ds if d]


def mode_label(r: Any) -> str:
    """The record's mode, with its backend variant where it has one (``lazy-tf32:off``): a
    variant is a numerics setting, so modes are compared within one variant only."""
    v = _get(r, "variant")
    return f"{_get(r, 'mode')}-{v}" if v else _get(r, "mode")


def subject(r: Any) -> str:
    """What a record's outputs are of: its op for a forward case, ``op:KIND`` for a derivative
    case (CaseResult.grad: vjp, jvp, hvp), so that an op's forward and derivative outputs are
    grouped, compared, recorded and enforced apart (a record without the field is a forward one)."""
    g = _get(r, "grad")
    return f"{_get(r, 'op')}:{g}" if g else _get(r, "op")


def input_id(r: Any) -> str:
    """The case id without its target: the same inputs (and reference) in every mode."""
    return _get(r, "id").rsplit("/", 1)[0]


# -- repeats -------------------------------------------------------------------------------------
def repeat_cases(cases: Sequence[Any], n: int) -> list[Any]:
    """Every case n times, repeat by repeat (the runner sends a task's later repeats to other
    workers where it can); ids, inputs and seeds do not change."""
    if n < 1:
        raise RlxError(f"--repeat wants N >= 1, got {n}")
    if n == 1:
        return list(cases)
    return [replace(c, repeat=k) for k in range(n) for c in cases]


_SEVERITY = ("crash", "timeout", "not-run", "contract", "error", "fail", "xpass", "xfail", "pass", "skip")  # worst first


def merge_repeats(results: Iterable[Any]) -> list[Any]:
    """One record per case id from the records of its repeats (CaseResult.repeat = 0..N-1), in
    the order ids first arrived. The merged record is the worst-outcome repeat's (the first
    repeat's when all agree) with ``repeat_digests`` = every repeat's digest in repeat order
    (None where a repeat produced no output) and ``repeat`` = 0; when outcomes differ between
    repeats its message says so (that too is nondeterminism, or load: a timeout)."""
    by_id: dict[str, list[Any]] = {}
    for r in results:
        by_id.setdefault(r.id, []).append(r)
    out = []
    for rs in by_id.values():
        rs.sort(key=lambda r: r.repeat)
        if len(rs) == 1 and rs[0].repeat == 0:
            out.append(rs[0])
            continue
        pick = min(rs, key=lambda r: _SEVERITY.index(r.outcome) if r.outcome in _SEVERITY else -1)
        outcomes = [r.outcome for r in rs]
        if len(set(outcomes)) > 1:
            pick.message = (f"outcome differs between {len(rs)} repeats "
                            f"({', '.join(outcomes)}); repeat {pick.repeat}: {pick.message}")
        pick.repeat_digests = [r.output_digest for r in rs]
        pick.repeat = 0
        out.append(pick)
    return out


# -- classification ------------------------------------------------------------------------------
@dataclass
class _Group:
    cases: int = 0  # cases with at least one output digest
    repeated: int = 0  # of which, run more than once with output
    nondeterministic: list[str] = field(default_factory=list)
    compared_with: set[str] = field(default_factory=set)  # other modes sharing an input id
    differs_from: set[str] = field(default_factory=set)
    mode_dependent: list[str] = field(default_factory=list)

    @property
    def cls(self) -> str:
        if self.nondeterministic:
            return "nondeterministic"
        if self.differs_from:
            return "mode-dependent"
        if self.repeated or self.compared_with:
            return "bit-stable"
        return "unknown"


GroupKey = tuple[str, str, str, str, str]  # subject (op or op:KIND), dtype, backend, device, mode


def _groups(results: Iterable[Any]) -> dict[GroupKey, _Group]:
    groups: dict[GroupKey, _Group] = {}
    # (input id, backend, device) -> mode -> the case's one digest (deterministic cases only)
    across: dict[tuple[str, str, str], dict[str, tuple[str, str, GroupKey]]] = defaultdict(dict)
    for r in results:
        ds = digests_of(r)
        if not ds:
            continue
        dtype, backend, device = (_get(r, k) for k in ("dtype", "backend", "device"))
        op, mode = subject(r), mode_label(r)
        g = groups.setdefault((op, dtype, backend, device, mode), _Group())
        g.cases += 1
        if len(ds) > 1:
            g.repeated += 1
        if len(set(ds)) > 1:
            g.nondeterministic.append(_get(r, "id"))
            continue
        across[(input_id(r), backend, device, _get(r, "variant") or "")][mode] = (
            ds[0], _get(r, "id"), (op, dtype, backend, device, mode))
    for by_mode in across.values():
        if len(by_mode) < 2:
            continue
        for m, (d, cid, key) in by_mode.items():
            g = groups[key]
            others = {m2 for m2 in by_mode if m2 != m}
            g.compared_with |= others
            differ = {m2 for m2 in others if by_mode[m2][0] != d}
            if differ:
                g.differs_from |= differ
                g.mode_dependent.append(cid)
    return groups


def classify(results: Iterable[Any]) -> dict[str, Any]:
    """The ``stability`` section of results.json: counts per class and one entry per
    (op, dtype, backend, device, mode) group that produced output, from the records alone
    (CaseResults or their JSON dicts). A derivative group's ``op`` is its :func:`subject`
    ("tanh:vjp"), so cases/bit_stable.toml records and enforces it apart from the forward."""
    groups = _groups(results)
    entries = []
    for (op, dtype, backend, device, mode), g in sorted(groups.items()):
        e: dict[str, Any] = {"op": op, "dtype": dtype, "backend": backend, "device": device,
                             "mode": mode, "class": g.cls, "cases": g.cases, "repeated": g.repeated,
                             "compared_with": sorted(g.compared_with)}
        if g.nondeterministic:
            e["nondeterministic_cases"] = len(g.nondeterministic)
            e["examples"] = g.nondeterministic[:_EXAMPLES]
        elif g.differs_from:
            e["differs_from"] = sorted(g.differs_from)
            e["mode_dependent_cases"] = len(g.mode_dependent)
            e["examples"] = g.mode_dependent[:_EXAMPLES]
        entries.append(e)
    counts = Counter(e["class"] for e in entries)
    return {"counts": {c: counts.get(c, 0) for c in CLASSES}, "groups": entries}


def summary_line(section: Mapping[str, Any]) -> str:
    c = section["counts"]
    line = "stability: " + ", ".join(f"{c[k]} {k}" for k in CLASSES) + \
        " (groups of op × dtype × device × mode)"
    if sum(c.values()) and c["unknown"] == sum(c.values()):
        line += "; compare with --mode all or --repeat 2"
    return line


# -- the recorded bit-stable groups (cases/bit_stable.toml) -----------------------------------------
RecordKey = tuple[str, str, str, str]  # op, dtype, backend, device


def stable_modes(section: Mapping[str, Any]) -> dict[RecordKey, list[str]]:
    """From a classification: per (op, dtype, backend, device), the largest set of modes that
    are each deterministic and pairwise bit-identical wherever they were compared (every pair
    compared at least once); a single mode only when repeats showed it deterministic."""
    fam: dict[RecordKey, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for e in section["groups"]:
        fam[(e["op"], e["dtype"], e["backend"], e["device"])][e["mode"]] = e
    out: dict[RecordKey, list[str]] = {}
    for key, by_mode in fam.items():
        ok = sorted(m for m, e in by_mode.items() if e["class"] != "nondeterministic")

        def agree(a: str, b: str) -> bool:
            ea = by_mode[a]
            return b in ea["compared_with"] and b not in ea.get("differs_from", ())

        best: list[str] = []
        for n in range(len(ok), 1, -1):
            for sub in combinations(ok, n):
                if all(agree(a, b) for a, b in combinations(sub, 2)):
                    best = list(sub)
                    break
            if best:
                break
        if not best:
            rep = [m for m in ok if by_mode[m]["repeated"]]
            best = rep[:1]
        if best:
            out[key] = best
    return out


def host(platform_string: str | None = None, machine: str | None = None) -> str:
    """Where bits were observed, e.g. Linux-x86_64 or macOS-arm64: the same build of a backend
    may round differently on another OS or architecture (libm, SIMD, the JIT's compiler), so a
    recorded group applies on its host only. Without arguments: this host; else from a
    results.json's run.platform and run.machine."""
    return (f"{(platform_string or platform.platform()).split('-')[0]}-"
            f"{machine or platform.machine()}")


# The file: one [[stable]] table per (backend, device, host, modes), holding [[stable.ops]]
# sub-tables of ops that share their dtypes, and its provenance: `recorded` (one line per
# `stability --update` that wrote into it) and an optional `note` by hand. A table whose modes
# are fewer than another's of the same backend, device and host lists the exceptions: there
# only those modes agree bit-wise.
TableKey = tuple[str, str, str, tuple[str, ...]]  # backend, device, host, modes
HostKey = tuple[str, str, str, str, str]  # op, dtype, backend, device, host
_TABLE_FIELDS = {"backend", "device", "host", "modes", "recorded", "note", "ops"}


@dataclass
class Recorded:
    """cases/bit_stable.toml as read: the modes recorded per (op, dtype, backend, device, host)
    and each table's provenance (``recorded`` lines, ``note``)."""

    modes: dict[HostKey, tuple[str, ...]] = field(default_factory=dict)
    provenance: dict[TableKey, dict[str, Any]] = field(default_factory=dict)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def read_recorded(path: Path) -> Recorded:
    """The recorded groups of the file at ``path`` (every host's); empty when it is absent."""
    out = Recorded()
    if not path.is_file():
        return out
    try:
        with path.open("rb") as f:
            tables = tomllib.load(f).get("stable", [])
    except tomllib.TOMLDecodeError as e:
        raise RlxError(f"{path}: {e}") from None
    for i, t in enumerate(tables):
        where = f"{path} [[stable]] #{i + 1}"
        if set(t) - _TABLE_FIELDS or not all(isinstance(t.get(k), str) for k in ("backend", "device", "host")) \
                or not _strings(t.get("modes")) or not t["modes"] or not _strings(t.get("recorded", [])) \
                or not isinstance(t.get("note", ""), str) or not isinstance(t.get("ops"), list):
            raise RlxError(f"{where}: needs backend, device, host (strings), modes (a list), [[stable.ops]] "
                           "and optionally recorded (a list of lines) and note")
        key = (t["backend"], t["device"], t["host"], tuple(sorted(t["modes"])))
        prov = out.provenance.setdefault(key, {"recorded": [], "note": ""})
        prov["recorded"] += [r for r in t.get("recorded", []) if r not in prov["recorded"]]
        prov["note"] = prov["note"] or t.get("note", "")
        for j, sub in enumerate(t["ops"]):
            if set(sub) != {"dtypes", "ops"} or not _strings(sub["dtypes"]) or not _strings(sub["ops"]):
                raise RlxError(f"{where}, [[stable.ops]] #{j + 1}: needs ops and dtypes (lists of names)")
            for op in sub["ops"]:
                for dtype in sub["dtypes"]:
                    k = (op, dtype, t["backend"], t["device"], t["host"])
                    if k in out.modes:
                        raise RlxError(f"{where}: {op}/{dtype} on {t['backend']}-{t['device']} ({t['host']}) "
                                       "is recorded twice")
                    out.modes[k] = key[3]
    return out


def load_recorded(where: str | None = None) -> dict[RecordKey, frozenset[str]]:
    """The groups of cases/bit_stable.toml recorded on host ``where`` (default: this host), as
    {(op, dtype, backend, device): modes}; empty when the file is absent."""
    where = where or host()
    return {(op, dtype, backend, device): frozenset(modes)
            for (op, dtype, backend, device, h), modes in read_recorded(data.data_path(RECORDED_FILE)).modes.items()
            if h == where}


def _known_to_vary(r: Any) -> bool:
    """An xfail under a non-strict known divergence (strict = false: its wrong output comes and
    goes from run to run, by the entry's own account): its output is left out of the bit-wise
    comparison, which the other modes' outputs still make among themselves. A strict entry's
    xfail stays compared: a deterministic wrong output must be the same in every mode."""
    if r.outcome != "xfail":
        return False
    hit = kd.part_of(r)  # the entry the record names (old positional keys too)
    return hit is not None and not hit[0].strict


def _fail(r: Any, why: str) -> None:
    was = r.outcome
    r.outcome = "fail"
    r.message = f"bit-stability: {why}" + (f" — was {was}: {r.message}" if was != "pass" or r.message else "")


def enforce(results: list[Any], recorded: Mapping[RecordKey, frozenset[str]] | None = None) -> int:
    """Within the recorded bit-stable groups, fail every case whose repeats disagree bit-wise,
    and the cases of an input id whose recorded modes disagree (the odd ones out where a strict
    majority agrees, else all of them). Mutates the records; returns how many it failed."""
    recorded = load_recorded() if recorded is None else recorded
    if not recorded:
        return 0
    where = f"a group recorded bit-stable in cases/{RECORDED_FILE}"
    by_input: dict[tuple[str, str, str, str], list[Any]] = defaultdict(list)
    for r in results:
        modes = recorded.get((subject(r), r.dtype, r.backend, r.device))
        if (modes is None or mode_label(r) not in modes or r.outcome not in _ENFORCED or not digests_of(r)
                or _known_to_vary(r)):
            continue
        by_input[(input_id(r), r.backend, r.device, getattr(r, "variant", ""))].append(r)
    failed = 0
    for rs in by_input.values():
        single = []
        for r in rs:
            ds = digests_of(r)
            if len(set(ds)) > 1:
                _fail(r, f"{len(ds)} repeats gave {len(set(ds))} different outputs in mode "
                         f"{mode_label(r)}, for {where}")
                failed += 1
            else:
                single.append((r, ds[0]))
        if len({d for _, d in single}) < 2:
            continue
        counts = Counter(d for _, d in single)
        top, n = counts.most_common(1)[0]
        if n * 2 > len(single):
            agree = sorted(mode_label(r) for r, d in single if d == top)
            for r, d in single:
                if d != top:
                    _fail(r, f"mode {mode_label(r)} disagrees bit-wise with {' and '.join(agree)}, for {where}")
                    failed += 1
        else:
            modes = " and ".join(sorted(mode_label(r) for r, _ in single))
            for r, _ in single:
                _fail(r, f"modes {modes} disagree bit-wise, for {where}")
                failed += 1
    return failed
