"""What the judges catch: per accumulating op and float dtype, at the op's largest generated
shape, the smallest uniform relative error that the judges reject in every case.

    python benchmarks/judge_audit.py [--ops GLOB,...] [--dtypes GLOB,...] [--markdown] [--every-attr]

The wrong kernel is the CPU reference's own output with every element scaled by (1 + e),
computed as y + y e in float64 and rounded once to the output dtype, and handed to
run.execute.verdict, which judges it exactly as the matrix judges a backend (worst-case bound or
tolerance, NaN/inf pattern, own check, accuracy budget). No backend under test runs.

Per case, the smallest e it rejects is found by bisection over log e between 1e-18 and 1, down
to a ratio of 1.05 (rejection is monotone in e: y(1 + e) rounds monotonically, and neither the
bound nor the budget reads the output under test). Of the cases at the op's largest shape (the
family whose inputs are largest: one case per value class and attribute combination, taking
only the plainest of the reduction, scan and mask variants, unless --every-attr) two are reported: the hardest, whose e every case catches, and the easiest, the
smallest e any case catches. A case is only searched where it can be a new extreme (it passes
the hardest case's e, or rejects just below the easiest's), so most are judged twice, not
bisected. Cases whose reference output has no finite non-zero element (all NaN, say) cannot
show a scaling and are left out.

Columns: the largest shape, the cases judged, and for the hardest and the easiest case: e
(one significant digit; "> 1": even e = 1 passes), the judge that rejects there (bound: the
worst-case bound or tolerance; budget: the accuracy budget; check: the op's own check;
nonfinite: the NaN/inf pattern; "bound + budget" when both do) and the case's value class.
Where the hardest case is a cancelling one (random signs, alternating), |result| << sum|terms|
and no relative error of the result is detectable, by design: the judges bound the error by
sum|terms|, not by |result|.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.core import dtypes as dt
from rlx_conformance.generate.matrix import (
    Case,
    Target,
    fmt_shape,
    generate,
    make_inputs,
)
from rlx_conformance.judge.budgets import ACCUMULATING
from rlx_conformance.ops import get_op
from rlx_conformance.run.execute import Verdict, verdict

TARGET = Target("mlx", "cpu", "eager")  # names the cases only: nothing runs on MLX
E_LO, E_HI, RATIO = 1e-18, 1.0, 1.05
# Attribute values of the plainest case of a value class (reductions over everything, no
# exclusive or reversed scan, no mask or softcap).
PLAIN = {"axes": (), "keep_dim": False, "exclusive": False, "reverse": False,
         "mask_kind": "none", "logit_softcap": 0.0}


class Judged:
    """One case: its inputs and reference, judged with the reference scaled by (1 + e)."""

    def __init__(self, case: Case):
        self.case = case
        self.inputs = make_inputs(case)
        self.expected = get_backend("cpu").run(case.op, [x.copy() for x in self.inputs],
                                               case.attr_dict)

    def at(self, e: float) -> Verdict:
        return verdict(self.case, self.inputs, self.expected, scaled(self.expected, e))

    def rejects(self, e: float) -> bool:
        v = self.at(e)
        if v.reference_bug:
            raise RuntimeError(f"{self.case.input_id}: {v.reference_bug}")
        return not v.ok


@dataclass
class Extreme:
    """A case and the smallest e it rejects (math.inf: not even E_HI)."""

    e: float
    judged: Judged


@dataclass
class Searched:
    """One (op, dtype) at its largest shape: its hardest case (the e every case catches) and its
    easiest (the smallest e any case catches)."""

    op: str
    dtype: str
    shape: str
    cases: int = 0
    left_out: int = 0
    hard: Extreme | None = None
    easy: Extreme | None = None


def largest_cases(op: str, dtype: str, every_attr: bool) -> tuple[str, list[Case]]:
    """(the largest family's name and shape, its cases: one per value class unless
    ``every_attr``). The largest family is the one whose cases have the most input elements."""
    cases = list(generate([TARGET], ops=[op], dtypes=[dtype]))
    if not cases:
        return "", []
    top = max(c.size() for c in cases)
    big = [c for c in cases if c.size() == top]
    shape = f"{big[0].family} {'+'.join(fmt_shape(s) for s in big[0].shapes)}"
    if every_attr:
        return shape, big

    def plainness(c: Case) -> int:
        return -sum(c.attr_dict.get(k, v) == v for k, v in PLAIN.items())

    def kind(c: Case) -> tuple[Any, ...]:
        """The value class and the attributes PLAIN leaves (an axis counted from the front:
        axis 0 and -1 of a vector are one case)."""
        nd = len(c.shapes[0]) if c.shapes else 0
        return (c.vals,) + tuple((k, v % nd if k == "axis" and nd else v) for k, v in c.attrs
                                 if k not in PLAIN)
    by_kind: dict[tuple[Any, ...], Case] = {}
    for c in sorted(big, key=plainness):
        by_kind.setdefault(kind(c), c)
    return shape, list(by_kind.values())


def scaled(expected: list[np.ndarray], e: float) -> list[np.ndarray]:
    """Every finite float output times (1 + e), as y + y e (one rounding even for e < u);
    NaN and infinities stay as they are (inf * 0 would make a NaN at e = 0)."""
    out = []
    for y in expected:
        if dt.is_float(dt.name_of(y.dtype)):
            with np.errstate(all="ignore"):
                y64 = y.astype(np.float64)
                y = np.where(np.isfinite(y64), y64 + y64 * e, y64).astype(y.dtype)
        out.append(y)
    return out


def judgeable(expected: list[np.ndarray]) -> bool:
    """Whether scaling can change anything: some finite non-zero float output element."""
    for y in expected:
        if dt.is_float(dt.name_of(y.dtype)):
            y64 = y.astype(np.float64)
            if np.any(np.isfinite(y64) & (y64 != 0)):
                return True
    return False


NONFINITE = re.compile(r"elements differ \((NaN|inf|order-dependent)|in NaN/inf|non-finite")


def judges_of(case: Case, v: Verdict) -> str:
    """Which judges reject: the differential one (bound, check or nonfinite) from the message,
    the budget from the count of elements over it."""
    names = []
    if not v.message.startswith("over accuracy budget"):
        if NONFINITE.search(v.message):
            names.append("nonfinite")
        elif case.spec.policy.check is not None:
            names.append("check")
        else:
            names.append("bound")
    if (v.measured.get("over_budget") or 0) > 0:
        names.append("budget")
    return " + ".join(names)


def threshold(j: Judged, lo: float, hi: float) -> float:
    """The smallest e in (lo, hi] that ``j`` rejects, to a ratio of RATIO, given that it passes
    lo (bisection over log e); math.inf if it passes hi too."""
    if not j.rejects(hi):
        return math.inf
    while hi / lo > RATIO:
        mid = math.sqrt(lo * hi)
        if j.rejects(mid):
            hi = mid
        else:
            lo = mid
    return hi


def search(op: str, dtype: str, every_attr: bool) -> Searched:
    """The hardest and the easiest judgeable case at the op's largest shape. A case is searched
    only where it can be a new extreme: harder if it passes the hardest one's e, easier if it
    rejects just below the easiest one's."""
    shape, cases = largest_cases(op, dtype, every_attr)
    res = Searched(op, dtype, shape)
    for case in cases:
        try:
            j = Judged(case)
        except Exception as ex:  # noqa: BLE001 — the reference rejects the input: nothing to judge
            print(f"skipped {case.input_id}: the reference raised {type(ex).__name__}: {ex}")
            continue
        if not judgeable(j.expected):
            res.left_out += 1
            continue
        res.cases += 1
        if j.rejects(0.0):
            raise RuntimeError(f"{case.input_id}: the reference's own output is rejected")
        if res.hard is None or res.easy is None:
            res.hard = res.easy = Extreme(threshold(j, E_LO, E_HI), j)
            continue
        if res.hard.e < math.inf and not j.rejects(res.hard.e):
            res.hard = Extreme(threshold(j, res.hard.e, E_HI), j)
        below = res.easy.e / RATIO if res.easy.e < math.inf else E_HI
        if j.rejects(below):
            res.easy = Extreme(threshold(j, E_LO, below), j)
    return res


def ops_and_dtypes(op_globs: list[str] | None, dtype_globs: list[str]
                   ) -> Iterable[tuple[str, str]]:
    for op in ACCUMULATING:
        if op_globs and not any(fnmatch.fnmatchcase(op, p) for p in op_globs):
            continue
        for d in get_op(op).dtypes:
            if dt.is_float(d) and any(fnmatch.fnmatchcase(d, p) for p in dtype_globs):
                yield op, d


def describe(x: Extreme | None) -> tuple[str, str, str]:
    """(e to one significant digit, the judges that reject there, the case's value class)."""
    if x is None:
        return "-", "-", "-"
    if x.e == math.inf:
        return "> 1", "none", x.judged.case.vals
    return f"{x.e:.0e}", judges_of(x.judged.case, x.judged.at(x.e)), x.judged.case.vals


def cells(r: Searched) -> tuple[str, ...]:
    cases = f"{r.cases}" + (f" ({r.left_out} left out)" if r.left_out else "")
    return (r.op, r.dtype, r.shape, cases) + describe(r.hard) + describe(r.easy)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=None, help="comma-separated globs (default: every "
                    "accumulating op, judge/budgets.py ACCUMULATING)")
    ap.add_argument("--dtypes", default="float*,bfloat16", help="comma-separated globs")
    ap.add_argument("--markdown", action="store_true", help="a markdown table (for the README)")
    ap.add_argument("--every-attr", action="store_true",
                    help="every case of the largest shape, not one per value class")
    args = ap.parse_args()
    t0 = time.perf_counter()
    head = ("op", "dtype", "largest shape", "cases", "every case: e", "judge", "hardest",
            "easiest case: e", "judge", "easiest")
    widths = (22, 9, 34, 16, 14, 15, 12, 16, 15, 12)
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"] * 2 + ["---:"] + ["---"] * 2)
              + "|")
    else:
        print(" ".join(f"{h:<{w}}" for h, w in zip(head, widths)))
    pats = args.ops.split(",") if args.ops else None
    for op, d in ops_and_dtypes(pats, args.dtypes.split(",")):
        row = cells(search(op, d, args.every_attr))
        if args.markdown:
            print("| " + " | ".join(row) + " |", flush=True)
        else:
            print(" ".join(f"{c:<{w}}" for c, w in zip(row, widths)), flush=True)
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
