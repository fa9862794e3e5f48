"""The CPU reference of the exactly defined elementwise ops against Python's own arithmetic, over
the generated case matrix: every case of the comparisons, the bit ops and shifts, mod, max/min,
where, clamp, fma and cast, in every dtype, and of integer add, sub, mul and div (their float
dtypes are MPFR's, tests/test_oracles_precise.py), element by element.

The oracle is written here from docs/ops.md (elementwise: "Integer add/sub/mul wrap; integer div
truncates toward zero and mod takes the sign of the dividend (C fmod) ... max/min propagate NaN;
comparisons follow IEEE"), with Python ints (unbounded, then wrapped to the dtype's width), Python
floats (IEEE binary64, exact for every value of the four float dtypes) and fractions.Fraction
(exact rationals, rounded here once to the output format with ties to even): nothing of numpy's
elementwise kernels, of the harness's rounding helpers or of its bounds is used. Every op here
is exact (a selection, a comparison, integer arithmetic, fmod, or one correctly rounded result:
fma, and a cast that rounds), so the judgement is bit-exact; signed zeros are compared where
docs/ops.md says the judge includes them (mod, where, cast; fma's 0-ulp judge compares them too),
otherwise -0 == +0 (max, min, clamp).

Not asserted, because docs/ops.md leaves them undefined: integer div and mod by zero and
INT_MIN / -1,
shift counts outside [0, bits), and a float -> int cast of NaN, inf or a value whose truncation is
out of the target range.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from rlx_conformance.generate import matrix

from oracle_common import CPU, TARGET, assert_each_case

# IEEE binary formats: (precision p, smallest normal exponent emin, largest exponent emax)
FORMAT = {"float64": (53, -1022, 1023), "float32": (24, -126, 127), "float16": (11, -14, 15),
          "bfloat16": (8, -126, 127)}
# integer dtypes: (bits, signed)
INT = {"int8": (8, True), "int16": (16, True), "int32": (32, True), "int64": (64, True),
       "uint8": (8, False), "uint32": (32, False)}
NP_DTYPE = {"bfloat16": ml_dtypes.bfloat16, "bool": np.bool_}


def np_dtype(name: str) -> Any:
    return NP_DTYPE.get(name, np.dtype(name))


def wrap(v: int, dtype: str) -> int:
    """Two's complement (or unsigned) wraparound of an unbounded int to the dtype's width."""
    bits, signed = INT[dtype]
    v %= 1 << bits
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def round_to(q: Fraction, dtype: str, negative_zero: bool = False) -> float:
    """The exact rational ``q`` rounded once to ``dtype`` (to nearest, ties to even; overflow to
    infinity; subnormals by the fixed quantum 2^(emin - p + 1)). A zero result carries the sign
    of ``q`` (``negative_zero`` for an exact zero)."""
    p, emin, emax = FORMAT[dtype]
    if q == 0:
        return -0.0 if negative_zero else 0.0
    a = abs(q)
    e = a.numerator.bit_length() - a.denominator.bit_length()  # 2^e <= a < 2^(e+2)
    if Fraction(2) ** e > a:
        e -= 1
    if Fraction(2) ** (e + 1) <= a:
        e += 1
    quantum = Fraction(2) ** (max(e, emin) - p + 1)
    n, rem = divmod(a, quantum)
    n = int(n)
    if rem > quantum / 2 or (rem == quantum / 2 and n % 2 == 1):
        n += 1
    r = n * quantum
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    v = math.inf if r > largest else float(r)
    return -v if q < 0 else v


def fits(v: float, dtype: str) -> bool:
    """``v`` is a value of the float dtype (so a reference result can be compared to it)."""
    return math.isnan(v) or math.isinf(v) or (v == 0 or round_to(Fraction(v), dtype) == v)


def elements(x: np.ndarray, shape: tuple[int, ...]) -> list:
    """The input broadcast to the output shape (numpy's rules, which docs/ops.md adopts), as a
    flat list of Python values (float16/bfloat16 widen exactly to float)."""
    b = np.broadcast_to(x, shape)
    if b.dtype.kind == "f" or b.dtype == np_dtype("bfloat16"):
        return [float(v) for v in b.astype(np.float64).ravel()]
    return [bool(v) if b.dtype == np.bool_ else int(v) for v in b.ravel()]


def same(got: Any, want: Any, zeros: bool) -> bool:
    """Bit-exact on floats (NaN == NaN; -0 vs +0 only when ``zeros``), equal otherwise."""
    if isinstance(want, float):
        if math.isnan(want):
            return math.isnan(got)
        return got == want and (not zeros or want != 0 or math.copysign(1, got) == math.copysign(1, want))
    return got == want


# -- per-element oracles: (values...) -> expected, or None where docs/ops.md leaves it undefined --
def compare(fn: Callable[[Any, Any], bool]) -> Callable[..., bool]:
    return lambda a, b: fn(a, b)  # Python floats compare by IEEE (NaN unequal), ints and bools exactly


def nan_max(a: Any, b: Any, pick_max: bool) -> Any:
    if isinstance(a, float) and (math.isnan(a) or math.isnan(b)):
        return math.nan
    return (a if a >= b else b) if pick_max else (a if a <= b else b)


def fmod(a: Any, b: Any, dtype: str) -> Any:
    """C fmod: a - trunc(a / b) b, the sign of the dividend; exact, so Fractions suffice."""
    if dtype in INT:
        bits, signed = INT[dtype]
        if b == 0 or (signed and a == -(1 << (bits - 1)) and b == -1):
            return None
        r = abs(a) % abs(b)
        return -r if a < 0 else r
    if math.isnan(a) or math.isnan(b) or math.isinf(a) or b == 0:
        return math.nan
    if math.isinf(b):
        return a
    fa, fb = Fraction(a), Fraction(b)
    q = abs(fa) / abs(fb)
    r = abs(fa) - int(q) * abs(fb)
    return math.copysign(float(r), a)


def int_arith(a: int, b: int, dtype: str, op: str) -> int | None:
    """Integer add/sub/mul wrap; div truncates toward zero (undefined: by zero, INT_MIN / -1)."""
    if op == "div":
        bits, signed = INT[dtype]
        if b == 0 or (signed and a == -(1 << (bits - 1)) and b == -1):
            return None
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q
    return wrap({"add": a + b, "sub": a - b, "mul": a * b}[op], dtype)


def shift(a: int, b: int, dtype: str, left: bool) -> int | None:
    bits, _ = INT[dtype]
    if not 0 <= b < bits:
        return None
    return wrap(a << b, dtype) if left else a >> b  # Python's >> is arithmetic on negative ints


def bitwise(a: Any, b: Any, dtype: str, fn: Callable[[int, int], int]) -> Any:
    if dtype == "bool":
        return bool(fn(int(a), int(b)))
    return wrap(fn(a, b), dtype)


def fma(a: float, b: float, c: float, dtype: str) -> float:
    """a * b + c exactly, rounded once; IEEE's rules where an operand is not finite."""
    if not all(math.isfinite(v) for v in (a, b, c)):
        if math.isnan(a) or math.isnan(b) or math.isnan(c):
            return math.nan
        if math.isinf(a) or math.isinf(b):
            if a == 0 or b == 0:
                return math.nan
            prod = math.copysign(math.inf, a) * math.copysign(1.0, b)
            return math.nan if math.isinf(c) and c != prod else prod
        return c
    prod_negative = (math.copysign(1, a) * math.copysign(1, b)) < 0
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    # an exact zero sum is -0 only when both addends are -0 (IEEE 754, round to nearest)
    both_negative_zero = exact == 0 and a * b == 0 and prod_negative and c == 0 and math.copysign(1, c) < 0
    return round_to(exact, dtype, negative_zero=both_negative_zero)


def clamp(x: Any, dtype: str, lo: float, hi: float) -> Any:
    """min(max(x, min), max) with the bounds converted to x's dtype (the matrix's bounds are
    integers within every dtype's range, so the conversion is exact)."""
    if dtype in INT:
        lo_, hi_ = int(lo), int(hi)
        assert lo_ == lo and hi_ == hi
        return min(max(x, lo_), hi_)
    if math.isnan(x):
        return math.nan
    return min(max(x, lo), hi)


def cast(x: Any, src: str, to: str) -> Any:
    """docs/ops.md: float -> int truncates, -> bool is x != 0, -> float rounds to nearest even."""
    if to == "bool":
        return bool(x != 0)  # NaN != 0
    if isinstance(x, bool):
        x = int(x)
    if to in INT:
        if isinstance(x, float):
            if not math.isfinite(x):
                return None
            t = math.trunc(x)
            bits, signed = INT[to]
            lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
            return t if lo <= t <= hi else None
        return wrap(x, to)
    if isinstance(x, float) and not math.isfinite(x):
        return x
    return round_to(Fraction(x), to, negative_zero=isinstance(x, float) and math.copysign(1, x) < 0)


def oracle(op: str, dtype: str, attrs: dict[str, Any]) -> tuple[Callable[..., Any], bool]:
    """(per-element function, compare signed zeros)."""
    ops: dict[str, tuple[Callable[..., Any], bool]] = {
        "add": (lambda a, b: int_arith(a, b, dtype, "add"), False),
        "sub": (lambda a, b: int_arith(a, b, dtype, "sub"), False),
        "mul": (lambda a, b: int_arith(a, b, dtype, "mul"), False),
        "div": (lambda a, b: int_arith(a, b, dtype, "div"), False),
        "eq": (compare(lambda a, b: a == b), False),
        "ne": (compare(lambda a, b: a != b), False),
        "lt": (compare(lambda a, b: a < b), False),
        "le": (compare(lambda a, b: a <= b), False),
        "gt": (compare(lambda a, b: a > b), False),
        "ge": (compare(lambda a, b: a >= b), False),
        "max": (lambda a, b: nan_max(a, b, True), False),
        "min": (lambda a, b: nan_max(a, b, False), False),
        "mod": (lambda a, b: fmod(a, b, dtype), True),
        "bit_and": (lambda a, b: bitwise(a, b, dtype, lambda x, y: x & y), False),
        "bit_or": (lambda a, b: bitwise(a, b, dtype, lambda x, y: x | y), False),
        "bit_xor": (lambda a, b: bitwise(a, b, dtype, lambda x, y: x ^ y), False),
        "shl": (lambda a, b: shift(a, b, dtype, True), False),
        "shr": (lambda a, b: shift(a, b, dtype, False), False),
        "where": (lambda c, a, b: a if c else b, True),
        "fma": (lambda a, b, c: fma(a, b, c, dtype), True),
        "clamp": (lambda x: clamp(x, dtype, attrs.get("min"), attrs.get("max")), False),
        "cast": (lambda x: cast(x, dtype, attrs.get("to")), True),
    }
    return ops[op]


INT_ARITH = ["add", "sub", "mul", "div"]  # their float dtypes: tests/test_oracles_precise.py (MPFR)
OPS = INT_ARITH + ["eq", "ne", "lt", "le", "gt", "ge", "max", "min", "mod", "bit_and", "bit_or", "bit_xor",
       "shl", "shr", "where", "fma", "clamp", "cast"]
CASES = [c for c in matrix.generate([TARGET], ops=OPS) if c.op not in INT_ARITH or c.dtype in INT]


def mismatches(case: matrix.Case, inputs: Sequence[np.ndarray], out: np.ndarray) -> list[str]:
    """The positions where ``out`` differs from the oracle (a few, with their values)."""
    fn, zeros = oracle(case.op, case.dtype, case.attr_dict)
    shape = np.broadcast_shapes(*(x.shape for x in inputs))
    assert out.shape == shape, (out.shape, shape)
    want_dtype = "bool" if case.op in ("eq", "ne", "lt", "le", "gt", "ge") else \
        case.attr_dict.get("to", case.dtype) if case.op == "cast" else case.dtype
    assert out.dtype == np_dtype(want_dtype), (out.dtype, want_dtype)
    cols = [elements(x, shape) for x in inputs]
    got = elements(out, shape)
    bad = []
    for i, args in enumerate(zip(*cols)):
        want = fn(*args)
        if want is None:
            continue
        if want_dtype in FORMAT and isinstance(want, float):
            assert fits(want, want_dtype), (case.id, args, want)
        if not same(got[i], want, zeros):
            bad.append(f"{np.unravel_index(i, shape) if shape else ()}: {args} -> {got[i]!r}, want {want!r}")
    return bad


@pytest.mark.parametrize("op", OPS)
def test_reference_against_python_arithmetic(op: str) -> None:
    """Every matrix case of the op, every element: the reference's bits are the oracle's."""
    def check(case: matrix.Case) -> str | None:
        inputs = matrix.make_inputs(case)
        (out,) = CPU.run(case.op, [x.copy() for x in inputs], case.attr_dict)
        bad = mismatches(case, inputs, np.asarray(out))
        return f"{len(bad)} elements, e.g. {bad[:3]}" if bad else None

    assert_each_case((c for c in CASES if c.op == op), check)


def test_every_dtype_of_the_ops_is_in_the_matrix() -> None:
    """The loop above sees every dtype each op declares (the oracle's scope is the whole matrix)."""
    from rlx_conformance.ops import get_op
    for op in OPS:
        declared = {d for d in get_op(op).dtypes if op not in INT_ARITH or d in INT}
        seen = {c.dtype for c in CASES if c.op == op}
        assert declared <= seen, (op, declared - seen)


@pytest.mark.parametrize("op,break_it", [
    ("fma", lambda a, b, c: np.asarray(np.asarray(a, np.float64) * b + c).astype(a.dtype)),
    ("mod", lambda a, b: np.remainder(a, b)),
    ("shr", lambda a, b: (a.view(np.uint8 if a.dtype == np.int8 else a.dtype) >> b).astype(a.dtype)
     if a.dtype.kind == "i" else a >> b),
    ("cast", None),
])
def test_the_oracle_rejects_a_wrong_kernel(op: str, break_it: Any) -> None:
    """The comparison can fail: plausible wrong kernels (fma as a float64 product and sum rounded
    twice, Python's floor-mod instead of C fmod, a logical right shift, a cast that truncates
    float64 -> float32) are caught on the matrix's cases."""
    caught = 0
    for case in (c for c in CASES if c.op == op):
        inputs = matrix.make_inputs(case)
        if op == "cast":
            if case.dtype != "float64" or case.attr_dict["to"] != "float32":
                continue
            x = inputs[0]
            bits = x.view(np.uint64) & ~np.uint64((1 << 29) - 1)  # chop: round toward zero
            out = np.where(np.isfinite(x), bits.view(np.float64), x).astype(np.float32)
        else:
            with np.errstate(all="ignore"):
                out = break_it(*[x.copy() for x in inputs])
        caught += bool(mismatches(case, inputs, np.asarray(out)))
    assert caught > 0
