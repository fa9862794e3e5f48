"""Known divergences (cases/known_divergences.toml): which entry scopes a case, and which entries
a set of records shows to be stale.

An entry is named by its ``key`` (unique, checked at load): records (``divergence.entry``),
reports and messages use it, so that adding or moving an entry renames no other. Its scope is an
op glob or a list of them, and optionally a dtype or list of dtypes, backend, device, mode, value
class (``vals``), shape and case-id globs. Each item of a list field is a *part* of the entry,
judged stale on its own: the file keeps one entry per reason, and a fix of one op still shows.

Knows nothing of case generation: the run layer (run/staleness.py) says whether a run held an
entry's whole scope, and passes that in.
"""
from __future__ import annotations

import fnmatch
import itertools
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError

# convention: a derivative at a kink, tie or domain edge, where the spec leaves the value to a
# convention (the reference declares its own: DerivativeRule.convention) and the backend picks
# another; scoped to those points (their value class, e.g. vals = "kink").
CATEGORIES = ("unimplemented", "undefined-by-spec", "backend-bug", "precision", "convention")

# The kinds of failure an entry may excuse (its ``excuses`` field), from a record
# (:func:`failure_kinds`): finite values outside the tolerance, bound or accuracy budget; a NaN,
# infinity or order-dependent outcome where the reference has another; an exception or a broken
# call convention; a dead worker; no result in time.
KINDS = ("value", "nonfinite", "error", "crash", "timeout")
# What each category can explain. A precision entry explains wrong digits (and, where its reason
# says so, an infinity or a zero at a range limit): never a dead or failing process. An
# unimplemented op raises or aborts; it does not compute wrong numbers.
CATEGORY_KINDS = {
    "precision": frozenset({"value", "nonfinite"}),
    "unimplemented": frozenset({"error", "crash"}),
    "undefined-by-spec": frozenset({"value", "nonfinite", "error"}),
    "backend-bug": frozenset(KINDS),
    "convention": frozenset({"value", "nonfinite"}),
}
CAPS = ("max_ulp", "max_rel_err", "max_abs_err")  # an entry excusing "value" names at least one

FILE = "cases/known_divergences.toml"
_KEY = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
_FIELDS = frozenset({"key", "op", "category", "reason", "excuses", *CAPS, "dtype", "backend", "device",
                     "mode", "vals", "shape", "id", "link", "timeout", "strict", "isolate", "grad",
                     "layout"})
_LISTS = ("op", "dtype", "id")  # the fields that take a list; each item is a part of the entry

# A part of an entry: for each list field of more than one item, the item a case falls under
# (op, then dtype, then id); () for an entry without such lists, which is one part.
Part = tuple[str, ...]


class Measured(Protocol):
    """What excusing needs of a record: its outcome, and for a failed comparison what was measured."""

    outcome: str
    max_ulp: float | None
    max_rel_err: float | None
    max_abs_err: float | None
    nonfinite_mismatches: int | None
    # and ``mismatch`` where the judge listed the wrong elements (run/execute.py): the caps are
    # checked against its maxima (:func:`capped`)


def capped(r: Measured) -> tuple[dict[str, float], bool]:
    """What an entry's caps are checked against, and whether it is the wrong values' own: the
    largest errors among the elements the failure is about (the record's ``mismatch``, where its
    judge measured them), not the record's maxima, which run over every asserted element (a
    passing 1e-9 within an absolute bound where the reference is 0 has relative error inf and
    would exceed any relative cap). Records without them (written before, a whole-output judge's,
    an accuracy budget exceeded with every element within its bound) give the record's maxima:
    never less than the wrong values' own, so a cap is never looser for them."""
    wrong = getattr(r, "mismatch", None) or {}
    of_wrong = any(k in wrong for k in CAPS)
    return {k: float(wrong[k] if k in wrong else (getattr(r, k, None) or 0)) for k in CAPS}, of_wrong


def failure_kinds(r: Measured) -> frozenset[str]:
    """The kinds of failure a record shows (:data:`KINDS`); empty for a pass or a skip. A failed
    comparison is "value", "nonfinite" or both (finite elements off and NaN/inf pattern off).
    Records before 2026-12-05 cannot say whether a NaN/inf mismatch came with wrong finite values
    too; any nonzero error in them counts as "value" (never fewer kinds than they showed)."""
    if r.outcome in ("error", "contract"):
        return frozenset({"error"})
    if r.outcome in ("crash", "timeout"):
        return frozenset({r.outcome})
    if r.outcome != "fail":
        return frozenset()
    out = set()
    if getattr(r, "nonfinite_mismatches", None):
        out.add("nonfinite")
    wrong = getattr(r, "mismatch", None) or {}
    if out and wrong.get("unlisted") == 0:
        # every failing comparison listed its wrong elements (records since 2026-12-05): "value"
        # only where a finite value (or a zero's sign) is wrong, not where a NaN/inf mismatch
        # comes with passing elements that differ from the reference within their bound
        if any(wrong.get("kinds", {}).get(k) for k in ("value", "signed zero")):
            out.add("value")
    elif not out or any((getattr(r, k, None) or 0) > 0 for k in CAPS):
        out.add("value")  # a record that cannot tell: any difference counts
    return frozenset(out)


class CaseLike(Protocol):
    """What matching needs of a case: a matrix Case, an exhaustive row's pseudo case, or a
    record's fields (rejudge)."""

    op: str
    dtype: str
    id: str
    target: Any  # backend, device, mode
    # and ``grad`` where the case checks a derivative (absent or "" for the op itself), and
    # ``layout`` where its inputs are views (absent or "" for contiguous inputs)


def _id_fields(case_id: str) -> tuple[str, str]:
    """(shape, vals) of a case id op/dtype/shape:S/attr:v/.../vals:V[/grad:G]/target; "" where
    absent."""
    parts = case_id.split("/")
    shape = parts[2][6:] if len(parts) > 2 and parts[2].startswith("shape:") else ""
    vals = next((p[5:] for p in reversed(parts[:-1]) if p.startswith("vals:")), "")
    return shape, vals


@dataclass(frozen=True)
class Divergence:
    """A known divergence. It scopes a set of cases; the failures among them report xfail. When
    none of the cases of one of its parts fails any more, that part is stale: its cases report
    xpass (strict)."""

    key: str  # the entry's identity in records, reports and messages
    op: tuple[str, ...]  # op name globs
    category: str
    reason: str
    dtype: tuple[str, ...] | None = None
    backend: str | None = None
    device: str | None = None
    mode: str | None = None
    vals: str | None = None  # glob over the case's value class
    shape: str | None = None  # glob over the shape part of the case id (1x2, 0x5+5x4)
    id: tuple[str, ...] | None = None  # globs over the whole case id, any of which may match
    link: str | None = None
    timeout: float | None = None  # a known hang: kill its cases after this many seconds
    # false for a nondeterministic divergence (a hang or heap corruption that shows only in some
    # runs): its cases never report xpass, since passing once proves nothing.
    strict: bool = True
    # true for a divergence that corrupts the process (heap corruption): its cases run alone in
    # a worker that is replaced afterwards, so that nothing later runs on a damaged heap.
    isolate: bool = False
    excuses: frozenset[str] = frozenset()  # the failure kinds it excuses (KINDS)
    # which cases: the op itself ("", the default: an entry says nothing of derivatives unless it
    # names them), a derivative glob (vjp, "?*" for every derivative), or "*" for both
    grad: str = ""
    # which memory layouts (layouts.LAYOUTS; "" contiguous): a glob, "*" by default, since a
    # divergence in the values an op computes holds however its inputs lie in memory; an entry
    # for a layout-only bug names its layout(s) ("reversed", "[sr]*")
    layout: str = "*"
    # caps of an excused value failure: a record measured above any of them is not excused
    max_ulp: float | None = None
    max_rel_err: float | None = None
    max_abs_err: float | None = None

    def excuse(self, r: Measured) -> str | None:
        """None if this entry excuses the failure ``r`` records, else why not (for the message)."""
        kinds = failure_kinds(r)
        extra = sorted(kinds - self.excuses)
        if extra:
            return f"it excuses {', '.join(sorted(self.excuses))}, not {', '.join(extra)}"
        if "value" in kinds:
            got, of_wrong = capped(r)
            over = [f"{k} {got[k]:.3g} > cap {getattr(self, k):.3g}" for k in CAPS
                    if getattr(self, k) is not None and got[k] > getattr(self, k)]
            if over:
                return "; ".join(over) + (" (of the wrong values)" if of_wrong else "")
        return None

    def caps(self) -> str:
        """The caps in words ("16 ulp, 1e-06 relative")."""
        names = {"max_ulp": "ulp", "max_rel_err": "relative", "max_abs_err": "absolute"}
        return ", ".join(f"{getattr(self, k):g} {names[k]}" for k in CAPS if getattr(self, k) is not None)

    def matches(self, case: CaseLike) -> bool:
        return any(fnmatch.fnmatchcase(case.op, g) for g in self.op) and self._holds(case)

    def _holds(self, case: CaseLike) -> bool:
        """:meth:`matches` but for the op globs (scoping has already picked the entries by op)."""
        t = case.target
        if not ((self.dtype is None or case.dtype in self.dtype)
                and self.backend in (None, t.backend) and self.device in (None, t.device)
                and self.mode in (None, t.mode)
                and fnmatch.fnmatchcase(getattr(case, "grad", "") or "", self.grad or "")
                and fnmatch.fnmatchcase(getattr(case, "layout", "") or "", self.layout)):
            return False
        if self.vals is not None or self.shape is not None:
            shape, vals = _id_fields(case.id)
            if not ((self.vals is None or fnmatch.fnmatchcase(vals, self.vals))
                    and (self.shape is None or fnmatch.fnmatchcase(shape, self.shape))):
                return False
        return self.id is None or any(fnmatch.fnmatchcase(case.id, g) for g in self.id)

    @property
    def exhaustive(self) -> bool:
        """Scoped to the exhaustive sweep's rows (vals exhaustive), which the matrix never makes."""
        return self.vals == "exhaustive" or any("vals:exhaustive" in g for g in self.id or ())

    def part(self, op: str, dtype: str, case_id: str) -> Part:
        """The part of this entry a case (of its scope) falls under."""
        out: list[str] = []
        if len(self.op) > 1:
            out.append(next((g for g in self.op if fnmatch.fnmatchcase(op, g)), op))
        if self.dtype is not None and len(self.dtype) > 1:
            out.append(dtype)
        if self.id is not None and len(self.id) > 1:
            out.append(next((g for g in self.id if fnmatch.fnmatchcase(case_id, g)), ""))
        return tuple(out)

    def parts(self) -> list[Part]:
        """Every part of the entry: the product of its list fields' items."""
        lists = [list(v) for v in (self.op, self.dtype, self.id) if v is not None and len(v) > 1]
        return [tuple(p) for p in itertools.product(*lists)]

    def part_ops(self, part: Part) -> tuple[str, ...]:
        """The op globs of a part: its op, or every op glob of an entry without an op list."""
        return (part[0],) if len(self.op) > 1 else self.op

    def describe(self, part: Part = ()) -> str:
        """A part in words for messages ("sin", "sign float16"); the op globs for the whole entry."""
        return " ".join(part) if part else ", ".join(self.op)


def _strings(v: Any, name: str, where: str) -> tuple[str, ...]:
    items = (v,) if isinstance(v, str) else v
    if not isinstance(items, list | tuple) or not items or not all(isinstance(s, str) and s for s in items):
        raise RlxError(f"{where}: {name} must be a string or a non-empty list of strings")
    return tuple(items)


def _entry(raw: dict[str, Any], where: str) -> Divergence:
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise RlxError(f"{where}: unknown field(s) {', '.join(unknown)} (fields: {', '.join(sorted(_FIELDS))})")
    key = raw.get("key")
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise RlxError(f"{where}: needs a key of lowercase letters, digits and dashes "
                       "(e.g. key = \"float64-float32-grade-math\")")
    if raw.get("category") not in CATEGORIES:
        raise RlxError(f"{where}: category must be one of {', '.join(CATEGORIES)}")
    if not raw.get("reason"):
        raise RlxError(f"{where}: needs a reason")
    if "op" not in raw:
        raise RlxError(f"{where}: needs an op (a glob or a list of globs)")
    kw = dict(raw)
    for name in _LISTS:
        if name in kw:
            kw[name] = _strings(kw[name], name, where)
    for name in ("backend", "device", "mode", "vals", "shape", "link", "grad", "layout"):
        if name in kw and not isinstance(kw[name], str):
            raise RlxError(f"{where}: {name} must be a string")
    for name in ("strict", "isolate"):
        if name in kw and not isinstance(kw[name], bool):
            raise RlxError(f"{where}: {name} must be true or false")
    if "timeout" in kw and (isinstance(kw["timeout"], bool) or not isinstance(kw["timeout"], int | float)):
        raise RlxError(f"{where}: timeout must be a number of seconds")
    excuses = _strings(raw.get("excuses", []) or [""], "excuses", where) if "excuses" in raw else ()
    if not excuses or not set(excuses) <= set(KINDS):
        raise RlxError(f"{where}: excuses must list the failure kinds it excuses, of {', '.join(KINDS)}")
    beyond = sorted(set(excuses) - CATEGORY_KINDS[kw["category"]])
    if beyond:
        raise RlxError(f"{where}: an entry of category {kw['category']} cannot excuse {', '.join(beyond)} "
                       f"(it explains {', '.join(sorted(CATEGORY_KINDS[kw['category']]))})")
    kw["excuses"] = frozenset(excuses)
    for name in CAPS:
        if name in kw and (isinstance(kw[name], bool) or not isinstance(kw[name], int | float) or kw[name] < 0):
            raise RlxError(f"{where}: {name} must be a non-negative number")
    if "value" in excuses and not any(name in kw for name in CAPS):
        raise RlxError(f"{where}: an entry that excuses value mismatches needs a cap "
                       f"({', '.join(CAPS)}): a failure above it is reported as a failure")
    if "value" not in excuses and any(name in kw for name in CAPS):
        raise RlxError(f"{where}: caps apply to value mismatches, which the entry does not excuse")
    return Divergence(**kw)


@cache
def divergences() -> tuple[Divergence, ...]:
    """The entries of cases/known_divergences.toml in file order (checked: fields, unique keys)."""
    raw = data.load("known_divergences.toml").get("divergence", [])
    out: list[Divergence] = []
    seen: set[str] = set()
    for i, d in enumerate(raw):
        where = f"{FILE} entry {d.get('key') or f'#{i + 1}'} ({d.get('op', '?')})"
        e = _entry(d, where)
        if e.key in seen:
            raise RlxError(f"{where}: key {e.key!r} is used by an earlier entry too; keys are unique")
        seen.add(e.key)
        out.append(e)
    return tuple(out)


_by_key: list[Any] = [None, {}]  # (the divergences() tuple it was built from, key -> entry)


def by_key() -> dict[str, Divergence]:
    """The entries by key (rebuilt whenever divergences() gives another tuple)."""
    divs = divergences()
    if divs is not _by_key[0]:
        _by_key[:] = [divs, {d.key: d for d in divs}]
    return _by_key[1]


# Records written before entries had keys name an entry by its position in the file as it was
# then (1-based); these are the keys of those positions (the 118 entries of that file, merged
# since into one entry per reason), so that such a record still finds its entry.
_KEYS_BY_OLD_POSITION: tuple[str, ...] = (
    *(("float64-float32-grade-math",) * 11),  # 1-11
    "gelu-approx-tanh-cancellation",  # 12
    "mlx-cpu-float32-exp-ulp",  # 13
    "mlx-cpu-bfloat16-exp-erf-subnormal-flush",  # 14
    "mlx-cpu-float32-erf-ulp",  # 15
    "mlx-cpu-float16-erf-ulp",  # 16
    "mlx-cpu-bfloat16-exp-erf-subnormal-flush",  # 17
    "mlx-cpu-float32-exp-activations",  # 18
    "float32-exp-activations",  # 19
    *(("mlx-cpu-float32-exp-activations",) * 2),  # 20-21
    *(("float32-exp-activations",) * 2),  # 22-23
    "bfloat16-sigmoid-subnormal-flush",  # 24
    *(("mlx-cpu-bfloat16-exp-erf-subnormal-flush",) * 3),  # 25-27
    *(("silu-mish-neg-inf-nan",) * 4),  # 28-31
    *(("hard-swish-neg-inf-nan",) * 4),  # 32-35
    "gelu-erf-cancellation",  # 36
    "gelu-approx-tanh-cancellation",  # 37
    "gelu-erf-cancellation",  # 38
    "gelu-approx-tanh-cancellation",  # 39
    "gelu-erf-cancellation",  # 40
    "gelu-approx-tanh-cancellation",  # 41
    "mlx-cpu-float32-cos-near-zeros",  # 42
    "sign-nan-is-zero",  # 43
    "softsign-inf-over-inf",  # 44
    "sign-nan-is-zero",  # 45
    "softsign-inf-over-inf",  # 46
    "sign-nan-is-zero",  # 47
    "softsign-inf-over-inf",  # 48
    "sign-nan-is-zero",  # 49
    "softsign-inf-over-inf",  # 50
    *(("integer-div-mod-by-zero-sigfpe",) * 4),  # 51-54
    "empty-leading-axis-reduction-hang",  # 55
    "empty-reduction-identity",  # 56
    "argmax-argmin-empty-rows",  # 57
    *(("no-fused-multiply-add",) * 2),  # 58-59
    *(("float64-cast-double-rounding",) * 2),  # 60-61
    "float64-softmax-exp",  # 62
    "float32-softmax-exp-ulp",  # 63
    "logsumexp-empty-rows",  # 64
    "float64-softmax-cross-entropy-exp",  # 65
    "onnx-scatter-max-min-nan",  # 66
    "float64-lu-1x1-heap-corruption",  # 67
    "float64-attention-exp",  # 68
    "float64-grouped-conv-unsupported",  # 69
    "float64-conv-float32-accuracy",  # 70
    "float64-strided-conv-transpose-unsupported",  # 71
    "float64-conv-transpose-float32-accuracy",  # 72
    "float32-det-cofactor-overflow",  # 73
    "log-det-cofactor-overflow",  # 74
    "float64-det-exp",  # 75
    *(("float64-norm-cpu-fallback-float32",) * 2),  # 76-77
    "float32-triangular-solve-inverse",  # 78
    "float64-solve-1x1-heap-corruption",  # 79
    "exhaustive-sign-nan-is-zero",  # 80
    "exhaustive-softsign-inf-over-inf",  # 81
    *(("exhaustive-neg-inf-times-zero",) * 3),  # 82-84
    "exhaustive-cpu-bfloat16-exp-subnormal-flush",  # 85
    "exhaustive-bfloat16-sigmoid-subnormal-flush",  # 86
    *(("exhaustive-cpu-bfloat16-exp-subnormal-flush",) * 2),  # 87-88
    "exhaustive-bfloat16-elu-cancellation",  # 89
    "exhaustive-cpu-erf-small-x",  # 90
    "cuda-float32-matmul-no-rows-sigsegv",  # 91
    *(("cuda-tf32-matmul",) * 2),  # 92-93
    "cuda-float32-attention-tf32",  # 94
    "cuda-conv-transpose-stride2-garbage",  # 95
    *(("cuda-compiled-activation-empty-sigabrt",) * 4),  # 96-99
    "cuda-compiled-mode-empty-arrays",  # 100
    "cuda-compiled-gather-empty-index",  # 101
    "cuda-sort-strided-axis-graph-error",  # 102
    "cuda-fft-length-1-strided",  # 103
    "cuda-scatter-add-atomics-flush",  # 104
    "float64-grouped-conv-transpose-unsupported",  # 105
    "cuda-sort-strided-axis-graph-error",  # 106
    *(("cuda-norm-no-rows-graph-error",) * 2),  # 107-108
    "cuda-float64-matmul-no-rows-sigsegv",  # 109
    *(("cuda-compiled-activation-empty-sigfpe",) * 6),  # 110-115
    *(("cuda-uint8-div-mod-after-zero-divisor",) * 2),  # 116-117
    "cuda-bfloat16-elu-cancellation",  # 118
)


def entry_key(entry: Any) -> Any:
    """A record's ``divergence.entry`` as a key: keys pass through, an old position is looked up
    (see _KEYS_BY_OLD_POSITION); anything else comes back as it is."""
    if isinstance(entry, int) and not isinstance(entry, bool) and 1 <= entry <= len(_KEYS_BY_OLD_POSITION):
        return _KEYS_BY_OLD_POSITION[entry - 1]
    return entry


class _Record(Protocol):
    op: str
    dtype: str
    id: str
    outcome: str
    device: str
    mode: str
    divergence: dict[str, Any] | None


def part_of(r: _Record) -> tuple[Divergence, Part] | None:
    """The entry (and part of it) a record's divergence names; None for a record outside every
    entry, or one naming an entry the file no longer has."""
    if r.divergence is None:
        return None
    d = by_key().get(entry_key(r.divergence.get("entry")))
    return None if d is None else (d, d.part(r.op, r.dtype, r.id))


def entry_name(r: _Record) -> str:
    """The entry a record's divergence names, for messages: its key, and the part of it where the
    entry has several ("sign-nan-is-zero (sign float16)")."""
    hit = part_of(r)
    if hit is None:
        return str((r.divergence or {}).get("entry"))
    d, part = hit
    return d.key + (f" ({d.describe(part)})" if part else "")


# The unit of staleness: a part of an entry, one op its globs match, one device and one mode.
Unit = tuple[Divergence, Part, str, str, str]
# The units whose whole scope on the run's targets is among the records: the run layer's answer
# (run/staleness.py), which generates the cases of each unit.
Coverage = Callable[[list[Unit], Sequence[_Record]], list[Unit]]


def stale_entries(results: Sequence[_Record], fully_covered: Coverage
                  ) -> tuple[set[tuple[str, Part, str, str, str]], list[tuple[Divergence, Part]]]:
    """The units of entries (a part, an op, a device, a mode) none of whose matched cases failed
    (xpass: the divergence is gone there) as (key, part, op, device, mode), and the parts that
    matched no case at all (a warning: the scope is wrong or the cases were removed). Per op and
    per target, so that an entry spanning reduce_* does not stay alive through reduce_prod alone,
    nor one spanning both devices through one of them. Only a run that held a unit's every case
    can call it stale: that is ``fully_covered``'s to say (a run of --dtypes float32 must not call
    a float32-and-float64 entry's op stale)."""
    matched: dict[Unit, bool] = {}
    for r in results:
        hit = part_of(r)
        if hit is not None:
            u = (*hit, r.op, r.device, r.mode)
            # a skip that names an entry is a case of it the run left out (runner.py, in-process):
            # what it would have shown is unknown, so its unit is not stale
            matched[u] = matched.get(u, False) or r.outcome not in ("pass", "xpass")
    stale = [u for u, failed in matched.items() if not failed and u[0].strict]
    if stale:
        stale = fully_covered(stale, results)
    ops = {r.op for r in results}  # only parts about ops this run covered can be "unmatched"
    devices, modes = {r.device for r in results}, {r.mode for r in results}  # (a GPU entry in a CPU run)
    seen = {(u[0], u[1]) for u in matched}
    unmatched = [(d, p) for d in divergences() if not d.exhaustive  # the sweep's rows (exhaustive.py)
                 and d.device in (None, *devices) and d.mode in (None, *modes)
                 for p in d.parts() if (d, p) not in seen
                 and any(fnmatch.fnmatchcase(op, g) for op in ops for g in d.part_ops(p))]
    return {(d.key, p, op, dev, mode) for d, p, op, dev, mode in stale}, unmatched


class _ByOp:
    """The entries one of whose op globs matches each op name, in file order: the runner asks
    about every case several times (timeout, isolation, outcome), and 100-odd fnmatch calls per
    question cost seconds of the parent's CPU per run. Rebuilt whenever divergences() gives
    another tuple."""

    def __init__(self) -> None:
        self.divs: tuple[Divergence, ...] | None = None
        self.by_op: dict[str, list[Divergence]] = {}

    def __call__(self, op: str) -> list[Divergence]:
        divs = divergences()
        if divs is not self.divs:
            self.divs, self.by_op = divs, {}
        hit = self.by_op.get(op)
        if hit is None:
            hit = self.by_op[op] = [d for d in divs if any(fnmatch.fnmatchcase(op, g) for g in d.op)]
        return hit


_entries_for = _ByOp()


class _Scoping:
    """:func:`scoping`'s last answers: the runner asks about each case several times in a row
    (its kernel's time limit, isolation, the outcome), each a full match of every entry of its
    op. Keyed by everything :meth:`Divergence.matches` reads, so a record's pseudo case (rejudge)
    and the matrix Case it came from share an answer; bounded (the runner's questions about a
    case come close together, but the runner's planning asks about every case of the run before
    the first runs: 2^16 answers hold a whole mode of the matrix); emptied whenever
    divergences() gives another tuple."""

    SIZE = 1 << 16

    def __init__(self) -> None:
        self.divs: tuple[Divergence, ...] | None = None
        self.hits: OrderedDict[tuple, list[Divergence]] = OrderedDict()

    def __call__(self, case: CaseLike) -> list[Divergence]:
        divs = divergences()
        if divs is not self.divs:
            self.divs, self.hits = divs, OrderedDict()
        t = case.target
        key = (case.op, case.dtype, case.id, t.backend, t.device, t.mode,
               getattr(case, "grad", "") or "", getattr(case, "layout", "") or "")
        hit = self.hits.get(key)
        if hit is None:
            hit = self.hits[key] = [d for d in _entries_for(case.op) if d._holds(case)]
            if len(self.hits) > self.SIZE:
                self.hits.popitem(last=False)
        return hit


_scoping = _Scoping()


def scoping(case: CaseLike) -> list[Divergence]:
    """Every entry whose scope holds ``case``, in file order (a fresh list: callers may keep it)."""
    return list(_scoping(case))


def known_divergence(case: CaseLike, result: Measured | None = None) -> Divergence | None:
    """The first entry whose scope holds ``case``; given the case's ``result`` (a failure), the
    first that excuses it: its kind among the entry's ``excuses``, its measured error within the
    entry's caps."""
    for d in scoping(case):
        if result is None or not failure_kinds(result) or d.excuse(result) is None:
            return d
    return None


def unexcused(case: CaseLike, result: Measured) -> str:
    """Why the entries scoping a failing case do not excuse it ("" where none scopes it), for
    its message: the failure stays a failure, with the entry named."""
    why = [f"{d.key} ({d.excuse(result)})" for d in scoping(case) if d.excuse(result) is not None]
    return ("outside known divergence " + "; ".join(why)) if why else ""
