"""The float32 leg of the exhaustive sweep (run/exhaustive.py): every one of the 2^32 float32 bit
patterns (``range="full"``), or a deterministic sample covering every exponent (``"sample"``:
exhaustive.inputs_for), through one target, in chunks, against the fast float64 oracle
(judge/oracle_f64.py) with MPFR (judge/precise.py) for the inputs it leaves undecided.

The array module is CuPy where it is installed and sees a GPU (``oracle="cupy"``: the float64
evaluation, the comparison and the filter run on the device), else numpy. Per chunk:

1. the target computes the chunk (one call on the whole chunk, as the 16-bit sweep does);
2. the float64 oracle decides most elements; the few special inputs (NaN, inf, zero) take
   MPFR's value, one MPFR call per special value for the whole sweep;
3. on the array module, each decided element that judge.accuracy.settle passes whatever
   measure's options (bit-equal to the oracle, both NaN, or finite on both sides within the op's
   ULP budget and not a zero of the wrong sign) is settled: it only adds to ``checked`` and
   ``max_ulp``;
4. each decided element that measure() fails whatever its options (judge.accuracy.certainly_over:
   finite on both sides and over the ULP budget, no tolerance or declared flush that could pass
   it) is counted over budget there too; only its first few positions come to the host, for the
   row's first_over and worst inputs (an op far off on a large share of the inputs, elu's
   exp(x) - 1 on ~10^9 of them, would otherwise move them all through measure() on the host);
5. every other element (an infinity or NaN pattern that differs, a zero that may be a signed-zero
   mismatch or a flush, or undecided by float64) goes to the host, where MPFR fills in the
   undecided and judge.accuracy.measure judges them exactly as the 16-bit sweep does.

The row carries judge_row's fields (max_ulp, over_budget, NaN/inf/±0 counts, worst inputs), plus
``first_over`` (the first inputs over budget in bit-pattern order, hex), ``mpfr_resolved`` (the
elements MPFR decided), the chunking and the oracle used.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge import oracle_f64, precise
from rlx_conformance.judge.accuracy import budget_for, certainly_over, measure, settle
from rlx_conformance.judge.compare import ulp_distance
from rlx_conformance.ops import get_op

FULL = 1 << 32
CHUNK_GPU = 1 << 26  # 256 MiB of float32 per chunk: about 3 GiB of float64 temporaries on the device
CHUNK_CPU = 1 << 22
FIRST_OVER = 8  # inputs over budget listed per row, in bit-pattern order
WORST = 5


@functools.cache
def cupy_module():
    """CuPy, if it is installed and sees a GPU; else None."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
    except Exception:  # noqa: BLE001 — no CuPy, no driver, no device: the numpy path
        return None
    return None


def array_module(oracle: str = "auto"):
    """(xp, name): the array module of ``oracle`` ("auto": CuPy where usable, else numpy)."""
    if oracle in ("auto", "cupy"):
        cp = cupy_module()
        if cp is not None:
            return cp, "cupy-float64"
        if oracle == "cupy":
            raise RuntimeError("the float32 sweep's CuPy oracle needs CuPy and a GPU")
    return np, "numpy-float64"


def _hex(v: int, bits: int) -> str:
    return f"0x{int(v):0{bits // 4}x}"


def _specials(op: str, attrs: dict[str, Any], out_dtype: str) -> dict[int, Any]:
    """MPFR's value at NaN, +-inf and +-0, keyed by the float32 input's bits."""
    pats = np.array([0x7FC00000, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000], np.uint32)
    with np.errstate(all="ignore"):
        y = precise.compute(op, [pats.view(np.float32)], attrs, [out_dtype])[0]
    return {int(p): y[i] for i, p in enumerate(pats)}


def chunks(range_: str, sample: int, chunk: int) -> list[tuple[int, int] | np.ndarray]:
    """The sweep's inputs: (start, count) ranges of bit patterns for ``full``; the sample's
    patterns in one array otherwise."""
    if range_ == "full":
        return [(s, min(chunk, FULL - s)) for s in range(0, FULL, chunk)]
    return [sample_bits(sample)]


def sample_bits(n: int) -> np.ndarray:
    """A deterministic sample of about ``n`` float32 bit patterns covering every exponent (both
    signs): per biased exponent the smallest, largest and evenly spaced significands."""
    per = max(n // 512, 3)
    mant = np.unique(np.concatenate([[0, 1, (1 << 23) - 1],
                                     np.linspace(0, (1 << 23) - 1, per).astype(np.uint64)])).astype(np.uint32)
    exps = np.arange(256, dtype=np.uint32)
    bits = (exps[:, None] << 23 | mant[None, :]).reshape(-1)
    return np.concatenate([bits, bits | np.uint32(0x80000000)])


def _host(a):
    """A numpy array of ``a`` (CuPy's copied from the device; numpy's as it is)."""
    return a if isinstance(a, np.ndarray) else a.get()


def _add_over(chunk_over: list[tuple[int, dict[str, Any]]], first_over: list[str],
              worst: list[tuple[float, dict[str, Any]]]) -> None:
    """A chunk's over-budget positions (from the device and the host), in bit-pattern order, into
    the row's ``first_over`` and ``worst``: every position over budget ahead of any within it, and
    among them the first in input order, as judge_row ranks them. (Where fewer than WORST are over
    budget, the rest of ``worst`` is the chunks' largest ULP distances within it, which need not be
    judge_row's: the device keeps one such position a chunk.)"""
    chunk_over.sort(key=lambda c: c[0])
    first_over += [e["input"] for _, e in chunk_over[:FIRST_OVER - len(first_over)]]
    worst += [(np.inf, e) for _, e in chunk_over[:WORST]]
    worst[:] = sorted(worst, key=lambda w: -w[0])[:WORST]


def sweep(op: str, attrs: dict[str, Any], out_dtype: str, compute: Callable[[np.ndarray], np.ndarray],
          ftz: bool, *, range_: str = "full", sample: int = 0, chunk: int | None = None,
          oracle: str = "auto") -> dict[str, Any]:
    """One target's row over the float32 inputs: ``compute(x)`` runs the target on a float32
    array. ``range_`` "full" (all 2^32 patterns) or "sample" (about ``sample``)."""
    xp, oracle_name = array_module(oracle)
    if not oracle_f64.applies(op, out_dtype):
        raise RuntimeError(f"no float64 oracle for {op} -> {out_dtype}")
    chunk = chunk or (CHUNK_GPU if xp is not np else CHUNK_CPU)
    spec = get_op(op)
    budget = budget_for(op, out_dtype)
    ofi = dt.finfo(out_dtype)
    onp = dt.np_dtype(out_dtype)
    special = _specials(op, attrs, out_dtype)
    nan_want = special[0x7FC00000]
    acc = {"n": 0, "checked": 0, "max_ulp": 0.0, "over": 0, "nan": 0, "inf": 0, "sz": 0, "ftz": 0, "mpfr": 0}
    worst: list[tuple[float, dict[str, Any]]] = []
    first_over: list[str] = []
    t_target = t_oracle = t_host = 0.0
    parts = chunks(range_, sample, chunk)
    base = np.arange(chunk, dtype=np.uint32) if range_ == "full" else None
    for part in parts:
        if isinstance(part, tuple):
            start, count = part  # the chunk's patterns: base + start (never past 2^32 - 1)
            xb_host = np.add(base[:count], np.uint32(start), dtype=np.uint32)
        else:
            xb_host = part
        x_host = xb_host.view(np.float32)
        t0 = time.perf_counter()
        with np.errstate(all="ignore"):
            got_host = np.ascontiguousarray(compute(x_host))
        t_target += time.perf_counter() - t0
        t0 = time.perf_counter()
        undefined = spec.undefined([x_host], attrs)
        xb = xp.asarray(xb_host)
        x32 = xb.view(xp.float32)
        want, decided = oracle_f64.decide(xp, op, x32, attrs, out_dtype)
        gb = xp.asarray(got_host.view(ofi.uint))
        # NaN inputs: MPFR's value at one NaN (no payloads in MPFR) stands for all of them
        # (an op that mapped NaN to a number would keep its NaN inputs on the host)
        if np.isnan(float(nan_want)):
            isnan_in = (xb & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)  # bits: CuPy's float32 flushes
            want = xp.where(isnan_in, xp.asarray(np.asarray(nan_want).view(ofi.uint)), want)
            decided = decided | isnan_in
        asserted = xp.ones(x32.shape, bool) if undefined is None else ~xp.asarray(np.broadcast_to(undefined, x32.shape))
        judged = settle(gb, want, out_dtype, budget, xp)
        settled = decided & judged.mask
        fin_settled = settled & judged.finite & asserted
        d = judged.ulp
        acc["checked"] += int(xp.count_nonzero(settled & asserted))
        if bool(fin_settled.any()):
            dm = xp.where(fin_settled, d, -1)
            k = int(xp.argmax(dm))
            dk = float(dm[k])
            acc["max_ulp"] = max(acc["max_ulp"], dk)
            if dk > 0:
                worst.append((dk, {"input": _hex(xb_host[k], 32), "x": float(x_host[k]),
                                   "want": float(_host(want[k:k + 1]).view(onp)[0]),
                                   "got": float(got_host[k]), "ulp": dk, "over_budget": False}))
        # over budget beyond doubt (accuracy.certainly_over: finite, no tolerance or flush could
        # pass them): counted here, only their first few positions go to the host
        over_dev = decided & asserted & certainly_over(judged, gb, want, out_dtype, budget, ftz=ftz, xp=xp)
        n_over = int(xp.count_nonzero(over_dev))
        chunk_over = []  # its over-budget positions, device's and host's, merged in bit-pattern order
        if n_over:
            acc["checked"] += n_over
            acc["over"] += n_over
            acc["max_ulp"] = max(acc["max_ulp"], float(xp.max(xp.where(over_dev, d, 0))))
            at = xp.nonzero(over_dev)[0][:max(FIRST_OVER, WORST)]  # the first, in bit-pattern order
            chunk_over = [(int(i), {"input": _hex(xb_host[i], 32), "x": float(x_host[i]), "want": float(w),
                                    "got": float(got_host[i]), "ulp": float(u), "over_budget": True})
                          for i, w, u in zip(_host(at), _host(want[at]).view(onp), _host(d[at]))]
        rest = xp.nonzero(~settled & ~over_dev)[0]
        rest_h = _host(rest)
        und_h = _host(~decided[rest])
        want_h = _host(want[rest]).view(onp).copy()
        t_oracle += time.perf_counter() - t0
        acc["n"] += x_host.size
        if rest_h.size == 0:
            _add_over(chunk_over, first_over, worst)
            continue
        t0 = time.perf_counter()
        xr = x_host[rest_h]
        if und_h.any():
            need = und_h & ~np.isnan(xr)
            for i in np.flatnonzero(und_h & np.isnan(xr)):  # NaN inputs of an op that maps NaN to a number
                want_h[i] = special[0x7FC00000]
            if need.any():
                with np.errstate(all="ignore"):
                    want_h[need] = precise.compute(op, [xr[need]], attrs, [out_dtype])[0]
            acc["mpfr"] += int(need.sum())
        gr = got_host[rest_h]
        skip = None if undefined is None else np.broadcast_to(undefined, x_host.shape)[rest_h]
        m = measure(gr, want_h, budget, skip=skip, signed_zero=spec.policy.signed_zero, ftz=ftz,
                    compute_dtype=dt.compute_dtype(out_dtype))
        for key, v in (("checked", m.checked), ("over", m.over), ("nan", m.nan), ("inf", m.inf),
                       ("sz", m.signed_zero), ("ftz", m.ftz)):
            acc[key] += v
        if m.max_ulp is not None:
            acc["max_ulp"] = max(acc["max_ulp"], m.max_ulp)
        with np.errstate(all="ignore"):
            ulp = ulp_distance(gr, want_h)
        def entry(i: int, over: bool) -> dict[str, Any]:
            return {"input": _hex(xb_host[rest_h[i]], 32), "x": float(xr[i]), "want": float(want_h[i]),
                    "got": float(gr[i]), "ulp": None if np.isnan(ulp[i]) else float(ulp[i]), "over_budget": over}
        chunk_over += [(int(rest_h[i]), entry(i, True))
                       for i in np.flatnonzero(m.over_mask)[:max(FIRST_OVER, WORST)]]
        _add_over(chunk_over, first_over, worst)
        # within budget but not exact: the largest ULP distances
        score = np.where(m.over_mask | np.isnan(ulp), 0.0, ulp)
        if skip is not None:
            score = np.where(skip, -1.0, score)
        top = np.argpartition(-score, WORST)[:WORST] if score.size > WORST else np.arange(score.size)
        for i in top[np.argsort(-score[top], kind="stable")]:
            if score[i] > 0:
                worst.append((float(score[i]), entry(i, False)))
        worst[:] = sorted(worst, key=lambda w: -w[0])[:WORST]
        t_host += time.perf_counter() - t0
    worst = sorted(worst, key=lambda w: -w[0])[:WORST]
    return {"n": acc["n"], "checked": acc["checked"], "max_ulp": acc["max_ulp"] if acc["checked"] else None,
            "over_budget": acc["over"], "nan_mismatch": acc["nan"], "inf_mismatch": acc["inf"],
            "signed_zero_mismatch": acc["sz"], "signed_zero_asserted": spec.policy.signed_zero,
            "ftz_used": acc["ftz"], "budget": budget.to_json(), "worst": [w for _, w in worst],
            "first_over": first_over, "float32_range": range_, "oracle": oracle_name,
            "mpfr_resolved": acc["mpfr"], "chunks": len(parts), "chunk": chunk if range_ == "full" else None,
            "target_s": round(t_target, 3), "oracle_s": round(t_oracle, 3), "host_judge_s": round(t_host, 3)}

