"""cases/accuracy.toml read and looked up: the accuracy budget of an (op, output dtype).

Its own module, below judge/accuracy.py (which measures against the budgets) and the bounds, so
that judge/tolerances.py (whose [from_budget] ops take their tolerance from the budget) and the
budget functions (judge/budgets.py, which use the bounds' geometry) import no circle.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError

# "ulp" and the accumulating kinds, one per function of judge/budgets.py (KINDS there; a test
# keeps the two lists equal)
KINDS = ("ulp", "summation", "mean", "product", "softmax", "dot", "norm", "attention", "xent")
# The depth law each kind takes its summation depth from (judge/budgets.py): "c", pairwise and
# blocked-pairwise summation, D(n) = min(n - 1, floor(c ceil(log2 n))); "block", K-blocked dot
# products (BLAS, fused attention), D(n) = min(n - 1, block - 1 + ceil(n / block)); None, no depth
# enters (ulp; product: every multiplication rounds the whole product, budgets.product).
LAW = {"ulp": None, "product": None, "summation": "c", "mean": "c", "softmax": "c", "norm": "c",
       "xent": "c", "dot": "block", "attention": "block"}
_FIELDS = {"op", "dtype", "ulp", "atol", "kind", "c", "block", "reason"}


def pairwise_depth(n: int | np.ndarray, c: float) -> int | np.ndarray:
    """D(n) = min(n - 1, floor(c ceil(log2 n))) for n >= 2, 0 below (elementwise for arrays)."""
    if np.ndim(n) == 0:
        n = int(n)
        return 0 if n <= 1 else min(n - 1, math.floor(c * math.ceil(math.log2(n))))
    m = np.asarray(n, np.int64)
    lg = np.ceil(np.log2(np.maximum(m, 2)))
    return np.where(m <= 1, 0, np.minimum(m - 1, np.floor(c * lg))).astype(np.int64)


def blocked_depth(n: int | np.ndarray, block: int) -> int | np.ndarray:
    """D(n) = min(n - 1, block - 1 + ceil(n / block)) for n >= 2, 0 below: blocks of ``block``
    terms summed sequentially, their partial sums accumulated sequentially (elementwise)."""
    if np.ndim(n) == 0:
        n = int(n)
        return 0 if n <= 1 else min(n - 1, block - 1 + -(-n // block))
    m = np.asarray(n, np.int64)
    return np.where(m <= 1, 0, np.minimum(m - 1, block - 1 + -(-m // block))).astype(np.int64)


@dataclass(frozen=True)
class Budget:
    """Allowed distance from the exact result. ``kind = "ulp"``: ``ulp`` ULP of the output dtype
    from the correctly rounded result, or ``atol`` absolute. An accumulating kind: the per-element
    allowance of judge/budgets.py's function of that name with depth constant ``c``, plus ``ulp``
    ULP of the output dtype for the final rounding (the measured side's and the reference's)."""

    ulp: float
    atol: float = 0.0
    kind: str = "ulp"
    c: float | None = None
    block: int | None = None
    reason: str = ""
    source: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"ulp": self.ulp, "atol": self.atol, "kind": self.kind, "c": self.c, "block": self.block,
                "bound": None, "source": self.source}

    def depth(self, n: int | np.ndarray) -> int | np.ndarray:
        """The summation depth this budget allows n terms (its kind's law, :data:`LAW`)."""
        if self.c is not None:
            return pairwise_depth(n, self.c)
        if self.block is not None:
            return blocked_depth(n, self.block)
        return np.maximum(np.asarray(n, np.int64) - 1, 0) if np.ndim(n) else max(int(n) - 1, 0)

    def law(self) -> str:
        if self.c is not None:
            return f"D = min(n-1, {self.c:g} ceil(log2 n))"
        if self.block is not None:
            return f"D = min(n-1, {self.block - 1} + ceil(n/{self.block}))"
        return "D = n-1"

    def describe(self, op: str, dtype: str) -> str:
        """The budget in one phrase, for messages: where it is and what it allows."""
        if self.kind == "ulp":
            what = f"{self.ulp:g} ulp"
        else:
            what = f"{self.kind}: gamma_D, {self.law()}, + {self.ulp:g} ulp"
        return f"{self.source}: {op} {dtype} <= {what}"


@cache
def _entries() -> tuple[dict[str, Any], ...]:
    raw = data.load("accuracy.toml").get("budget", [])
    out = []
    for i, e in enumerate(raw):
        where = f"cases/accuracy.toml budget #{i + 1} ({e.get('op', '?')})"
        unknown = set(e) - _FIELDS
        if unknown:
            raise RlxError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
        if not e.get("reason"):
            raise RlxError(f"{where}: needs a reason")
        ops = e.get("op")
        if isinstance(ops, str):
            ops = [ops]
        if not ops or not all(isinstance(o, str) for o in ops):
            raise RlxError(f"{where}: op must be a glob or a list of globs")
        if "ulp" not in e or not isinstance(e["ulp"], (int, float)) or e["ulp"] < 0:
            raise RlxError(f"{where}: needs ulp >= 0")
        dtypes = e.get("dtype")
        if isinstance(dtypes, str):
            dtypes = [dtypes]
        if dtypes is not None and (not dtypes or not all(d in dt.FLOATS for d in dtypes)):
            raise RlxError(f"{where}: dtype must be a float dtype or a list of them")
        if "atol" in e and (not isinstance(e["atol"], (int, float)) or e["atol"] < 0):
            raise RlxError(f"{where}: atol must be a number >= 0")
        kind = e.get("kind", "ulp")
        if kind not in KINDS:
            raise RlxError(f"{where}: kind must be one of {', '.join(KINDS)}")
        law = LAW[kind]
        for f in ("c", "block"):
            if f != law and f in e:
                raise RlxError(f"{where}: kind {kind} takes no {f} (its depth law: {law or 'none'})")
        if law == "c" and (not isinstance(e.get("c"), (int, float)) or e["c"] < 1):
            raise RlxError(f"{where}: kind {kind} needs c >= 1 (its summation depth constant)")
        if law == "block" and (not isinstance(e.get("block"), int) or e["block"] < 1):
            raise RlxError(f"{where}: kind {kind} needs an integer block >= 1 (its K-block)")
        out.append({**e, "op": tuple(ops), "dtype": None if dtypes is None else tuple(dtypes), "index": i + 1})
    return tuple(out)


@dataclass(frozen=True)
class LowPrecision:
    """cases/accuracy.toml [low_precision]: outputs of these dtypes are computed in float32 and
    rounded once, so their budget is the float32 one with ``ulp`` at most ``max_ulp``."""

    dtypes: tuple[str, ...]
    max_ulp: float
    reason: str


@cache
def low_precision() -> LowPrecision:
    e = data.load("accuracy.toml").get("low_precision")
    where = "cases/accuracy.toml [low_precision]"
    if not isinstance(e, dict) or set(e) != {"dtypes", "max_ulp", "reason"}:
        raise RlxError(f"{where}: needs dtypes, max_ulp and reason")
    if not isinstance(e["dtypes"], list) or not all(d in dt.FLOATS and dt.compute_dtype(d) != d
                                                   for d in e["dtypes"]):
        raise RlxError(f"{where}: dtypes must be float dtypes computed in another dtype (float16, bfloat16)")
    if not isinstance(e["max_ulp"], (int, float)) or e["max_ulp"] < 0 or not e["reason"]:
        raise RlxError(f"{where}: needs max_ulp >= 0 and a reason")
    return LowPrecision(tuple(e["dtypes"]), float(e["max_ulp"]), e["reason"])


def _budget(e: dict[str, Any]) -> Budget:
    return Budget(ulp=float(e["ulp"]), atol=float(e.get("atol", 0.0)), kind=e.get("kind", "ulp"),
                  c=None if e.get("c") is None else float(e["c"]), block=e.get("block"), reason=e["reason"],
                  source=f"accuracy.toml#{e['index']}:{'|'.join(e['op'])}"
                         + (f"/{'|'.join(e['dtype'])}" if e["dtype"] else ""))


@cache
def budget_for(op: str, dtype: str) -> Budget:
    """The first entry matching (op, output dtype). A float16/bfloat16 output without an entry
    naming its dtype takes the op's float32 budget with ulp capped by [low_precision]. RlxError
    if none."""
    entries, low = _entries(), low_precision()
    for e in entries:
        if any(fnmatch.fnmatchcase(op, g) for g in e["op"]) and (
                dtype in e["dtype"] if e["dtype"] else dtype not in low.dtypes):
            return _budget(e)
    if dtype in low.dtypes:
        try:
            b = budget_for(op, dt.compute_dtype(dtype))
        except RlxError:
            pass
        else:
            return replace(b, ulp=min(b.ulp, low.max_ulp), reason=low.reason,
                           source=f"accuracy.toml[low_precision]/{dtype} from {b.source}")
    raise RlxError(f"cases/accuracy.toml has no budget for {op} on {dtype}")


