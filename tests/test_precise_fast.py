"""The oracle's fast path (rlx_conformance/judge/precise_fast.py): float64 interval arithmetic that
decides an element only where it proves MPFR's answer. Checked here on a subset of every sweep
the exhaustive mode runs (every 61st float16 / bfloat16 pattern, the neighbours of each op's
thresholds, and the decided inputs closest to a rounding boundary), against pure MPFR, bit for
bit; and the enclosures themselves against MPFR at 256 bits.

The full check, all 65,536 patterns of both formats for every op (about 3 minutes of CPU):
``python benchmarks/verify_fast_oracle.py``.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import gmpy2
import numpy as np
import pytest

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge import precise, rounding
from rlx_conformance.judge import precise_fast as pf
from rlx_conformance.ops import get_op
from rlx_conformance.run import exhaustive as ex

SWEEPS = [(op, attrs, d) for op, attrs in ex.unary_ops() for d in ("float16", "bfloat16")
          if d in get_op(op).dtypes]
IDS = [f"{op}[{','.join(f'{k}={v}' for k, v in sorted(a.items()))}]-{d}" for op, a, d in SWEEPS]

# Where the ops change regime: overflow / underflow / subnormal thresholds of exp, sigmoid and
# friends in both formats (ln 65520, ln 2^-25, ln 2^128, ln 2^-134, ...), the float64 cut-offs
# of the fast path (exp's 709, exp underflow at -745, erfc's at 26.5 * sqrt 2), hard_*'s +-3.
ANCHORS = (0.5, 1.0, 3.0, 9.70, 11.09, 16.64, 17.33, 22.0, 37.5, 38.0, 87.34, 88.72, 92.88,
           700.0, 709.0, 745.0)


def _out(op: str, attrs: dict, dtype: str) -> str:
    return attrs.get("to", dtype) if op == "cast" else dtype


def _neighbours(dtype: str, radius: int = 4) -> np.ndarray:
    """The bit patterns within ``radius`` of each anchor (both signs) and of the format's
    smallest subnormal, smallest normal and largest finite value."""
    fi = dt.finfo(dtype)
    vals = np.array(ANCHORS + (fi.smallest_subnormal, fi.tiny, fi.max), np.float64)
    bits = np.concatenate([vals, -vals]).astype(dt.np_dtype(dtype)).view(np.uint16).astype(np.int64)
    around = (bits[:, None] + np.arange(-radius, radius + 1)[None, :]).reshape(-1)
    return np.unique(around % (1 << 16)).astype(np.uint16)


def _near_boundary(op: str, attrs: dict, dtype: str, rel: float = 2.0 ** -20, cap: int = 128) -> np.ndarray:
    """Bit patterns the fast path decides although their exact value is within ``rel``
    (relative) of a rounding boundary of the output: its closest calls (at most ``cap``, evenly
    spread)."""
    out = _out(op, attrs, dtype)
    x = ex.inputs_for(dtype)
    if not pf.applies(op, [x.dtype], attrs, out):
        return np.zeros(0, np.uint16)
    decided = pf.decide(op, x, attrs, out)[1]
    xs = x[decided]
    lo, hi = pf.enclose(op, xs.astype(np.float64), attrs)
    with np.errstate(all="ignore"):
        mid = lo / 2 + hi / 2
        half = (hi - lo) / 2 + np.abs(mid) * rel
        a = rounding.round_dd(mid - half, np.zeros_like(mid), out)
        b = rounding.round_dd(mid + half, np.zeros_like(mid), out)
    uint = dt.finfo(out).uint
    near = xs.view(np.uint16)[a.view(uint) != b.view(uint)]
    return near[np.linspace(0, near.size - 1, min(cap, near.size)).astype(int)] if near.size else near


def _subset(op: str, attrs: dict, dtype: str) -> np.ndarray:
    every = np.arange(0, 1 << 16, 61, dtype=np.uint32).astype(np.uint16)
    bits = np.unique(np.concatenate([every, _neighbours(dtype), _near_boundary(op, attrs, dtype)]))
    return bits.view(dt.np_dtype(dtype))


@pytest.mark.parametrize("op,attrs,dtype", SWEEPS, ids=IDS)
def test_fast_path_is_bit_identical_to_mpfr(op, attrs, dtype):
    x = _subset(op, attrs, dtype)
    out = _out(op, attrs, dtype)
    with np.errstate(all="ignore"):
        fast = precise.elementwise(op, [x], attrs, out)
        pure = precise.elementwise(op, [x], attrs, out, fast=False)
    uint = dt.finfo(out).uint
    bad = np.flatnonzero(fast.view(uint) != pure.view(uint))
    assert bad.size == 0, [(hex(int(x.view(np.uint16)[i])), float(fast[i]), float(pure[i])) for i in bad[:5]]


def _exact(op: str, v: float, attrs: dict):
    """The op's value at 256 bits (exactly, for the rational and exact ops), from precise's own
    definitions: what every enclosure must contain."""
    kind, fn = precise.ELEMENTWISE[op]
    with gmpy2.context(precision=256):
        return fn([gmpy2.mpfr(v, 128)], attrs)


@pytest.mark.parametrize("op,attrs,dtype", SWEEPS, ids=IDS)
def test_enclosures_contain_the_exact_value(op, attrs, dtype):
    """The error bounds themselves, not only the rounding they lead to: lo <= exact <= hi
    wherever the fast path produced an interval (a wrong bound could still round right)."""
    bits = np.unique(np.concatenate([np.arange(1, 1 << 16, 257, dtype=np.uint32).astype(np.uint16),
                                     _neighbours(dtype)]))
    with np.errstate(all="ignore"):
        x = bits.view(dt.np_dtype(dtype)).astype(np.float64)
    x = x[np.isfinite(x) & (x != 0)]
    lo, hi = pf.enclose(op, x, attrs)
    checked = 0
    for xi, li, hi_ in zip(x.tolist(), lo.tolist(), hi.tolist()):
        if np.isnan(li) or np.isnan(hi_):
            continue  # no interval (e.g. log of a negative): MPFR decides
        v = _exact(op, xi, attrs)
        assert gmpy2.mpfr(li) <= v <= gmpy2.mpfr(hi_), (op, dtype, xi.hex(), li, float(v), hi_)
        checked += 1
    assert checked > x.size // 3


@pytest.mark.parametrize("op", ["exp", "gelu", "mish", "sin", "clamp", "cast"])
def test_mpfr_only_sees_what_the_fast_path_leaves(op, monkeypatch):
    """elementwise routes only the undecided elements to MPFR: on all float16 patterns of these
    ops just the special inputs (NaN, inf, zero: 2,050 of them)."""
    attrs = {"exp": {}, "gelu": {}, "mish": {}, "sin": {}, "clamp": {"min": -3.0, "max": 5.0},
             "cast": {"to": "bfloat16"}}[op]
    seen = []
    real = precise._mpfr_values

    def spy(op_, cols, attrs_, out_dtype):
        seen.append(len(cols[0]))
        return real(op_, cols, attrs_, out_dtype)

    monkeypatch.setattr(precise, "_mpfr_values", spy)
    x = ex.inputs_for("float16")
    with np.errstate(all="ignore"):
        precise.elementwise(op, [x], attrs, _out(op, attrs, "float16"))
    assert seen == [2 * 1023 + 2 + 2]


def test_scope():
    f16, bf16, f32 = (dt.np_dtype(d) for d in ("float16", "bfloat16", "float32"))
    assert pf.applies("exp", [f16], {}, "float16") == pf.LIBM_DOCUMENTED
    assert pf.applies("sqrt", [bf16], {}, "bfloat16")
    assert not pf.applies("exp", [f32], {}, "float32")  # not exhaustively verified: MPFR
    assert not pf.applies("exp", [f16], {}, "float32")  # inexact into a wider format: MPFR
    assert pf.applies("cast", [bf16], {"to": "float64"}, "float64")  # exact: any float output
    assert not pf.applies("add", [f16, f16], {}, "float16")
    assert pf.applies("clamp", [f16], {"min": -3.0, "max": 5.0}, "float16")
    assert not pf.applies("clamp", [f16], {"min": 0.1, "max": 5.0}, "float16")  # MPFR rounds 0.1 first


def test_without_documented_libm_only_ieee_ops_are_fast(monkeypatch):
    monkeypatch.setattr(pf, "LIBM_DOCUMENTED", False)
    f16 = dt.np_dtype("float16")
    assert not pf.applies("gelu", [f16], {}, "float16")
    assert pf.applies("recip", [f16], {}, "float16") and pf.applies("neg", [f16], {}, "float16")


def test_flushed_subnormals_turn_the_fast_path_off(monkeypatch):
    """The outward steps need float64 subnormals: under FTZ / DAZ everything is MPFR."""
    assert pf._subnormals_work()  # this process: IEEE arithmetic
    monkeypatch.setattr(pf, "_subnormals_work", lambda: False)
    assert not pf.applies("neg", [dt.np_dtype("float16")], {}, "float16")


def test_cache_key_covers_the_fast_path():
    """The exhaustive mode's oracle cache is keyed by the source of the precise oracle, its fast
    path and the rounding both use."""
    src = Path(precise.__file__)
    want = hashlib.sha256(src.read_bytes() + src.with_name("precise_fast.py").read_bytes()
                          + src.with_name("rounding.py").read_bytes()).hexdigest()[:16]
    assert precise.version() == want
