"""What the oracle tests (tests/test_independent_oracles.py, tests/test_oracles_*.py) share: the
CPU reference as a backend, the target their cases are generated for, float64's unit roundoff
and Higham's gamma, each output dtype's rounding unit and subnormal floor, and the loop that runs
an oracle over every case of one op. Nothing of the harness's bounds or geometry: the oracles stay
independent of the reference they check."""
from __future__ import annotations

from collections.abc import Callable, Iterable

from rlx_conformance.backends import get_backend
from rlx_conformance.generate import matrix

CPU = get_backend("cpu")
TARGET = matrix.Target("cpu", "cpu", "eager")
U64 = 2.0 ** -53

# the output dtype's unit roundoff, plus float32's for the 16-bit dtypes (whose results may round
# through float32), and half the smallest subnormal of each output dtype
UNIT = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11 + 2.0 ** -24,
        "bfloat16": 2.0 ** -8 + 2.0 ** -24}
ETA = {"float64": 2.0 ** -1075, "float32": 2.0 ** -150, "float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}


def gamma(n: int, u: float = U64) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error bound of n roundings."""
    return n * u / (1 - n * u)


def assert_each_case(cases: Iterable[matrix.Case], check: Callable[[matrix.Case], str | None],
                     show: int = 20) -> None:
    """``check`` (a message where the reference disagrees with the oracle, else None) on every
    case; fails listing the first ``show`` disagreements, and when there was no case at all."""
    failures, n = [], 0
    for case in cases:
        n += 1
        msg = check(case)
        if msg:
            failures.append(f"{case.id}: {msg}")
    assert n > 0
    assert not failures, f"{len(failures)} of {n} cases:\n" + "\n".join(failures[:show])
