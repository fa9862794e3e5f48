"""Normalization, attention and rope: the CPU reference against independent float64 oracles
written as plain loops (per row, per query, per head), and the error bounds (they admit the
reference and reject a numerically unstable implementation or a wrong answer)."""
from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from rlx_conformance.backends import get_backend
from rlx_conformance.core.errors import SpecError
from rlx_conformance.generate import matrix
from rlx_conformance.judge.bounds import nn as bounds
from rlx_conformance.judge.compare import Tolerance, compare
from rlx_conformance.ops import get_op

CPU = get_backend("cpu")
T = matrix.Target("mlx", "cpu", "eager")


def run(op, inputs, **attrs):
    return CPU.run(op, [np.asarray(x) for x in inputs], attrs)[0]


def rand(seed, shape, lo=-3, hi=3):
    return np.random.default_rng(seed).uniform(lo, hi, shape)


# -- oracles ------------------------------------------------------------------------------------------
def loop_norm(x, g, b, axis, eps, rms):
    lead = x.shape[:axis]
    out = np.empty_like(x)
    for idx in np.ndindex(*lead):
        row = x[idx].ravel().tolist()
        if rms:
            r = 1 / math.sqrt(math.fsum(v * v for v in row) / len(row) + eps)
            z = [v * r for v in row]
        else:
            mu = math.fsum(row) / len(row)
            var = statistics.pvariance(row, mu)
            z = [(v - mu) / math.sqrt(var + eps) for v in row]
        out[idx] = (np.array(z).reshape(x[idx].shape) * g + b)
    return out


@pytest.mark.parametrize("rms", [False, True])
@pytest.mark.parametrize("shape,axis", [((7, 33), -1), ((4, 6, 9), 1), ((1031,), 0)])
def test_layer_and_rms_norm_against_loops(rms, shape, axis):
    x = rand(1, shape, -10, 10)
    g, b = rand(2, shape[axis:]), rand(3, shape[axis:])
    op = "rms_norm" if rms else "layer_norm"
    np.testing.assert_allclose(run(op, [x, g, b], axis=axis, eps=1e-5),
                               loop_norm(x, g, b, axis % x.ndim, 1e-5, rms), rtol=1e-12, atol=1e-12)


def test_group_norm_against_loops():
    x = rand(4, (2, 6, 5, 3))
    g, b = rand(5, (6,)), rand(6, (6,))
    want = np.empty_like(x)
    for n in range(2):
        for grp in range(3):
            ch = slice(2 * grp, 2 * grp + 2)
            z = loop_norm(x[n, ch][None], np.ones(x[n, ch].shape), np.zeros(x[n, ch].shape), 1, 1e-5, False)[0]
            want[n, ch] = z * g[ch, None, None] + b[ch, None, None]
    np.testing.assert_allclose(run("group_norm", [x, g, b], num_groups=3, eps=1e-5), want, rtol=1e-12, atol=1e-12)


def test_batch_norm_inference():
    x = rand(7, (5, 4))
    g, b, m, v = rand(8, (4,)), rand(9, (4,)), rand(10, (4,)), rand(11, (4,), 0.1, 2)
    want = [[(x[i, c] - m[c]) / math.sqrt(v[c] + 1e-3) * g[c] + b[c] for c in range(4)] for i in range(5)]
    np.testing.assert_allclose(run("batch_norm_inference", [x, g, b, m, v], eps=1e-3), want, rtol=1e-14)


def loop_attention(q, k, v, mask, h, d, kind, window, scale, cap):
    """Per batch, head and query: scores, mask, max-subtracted softmax, weighted sum."""
    bsz, sq, _ = q.shape
    sk = k.shape[1]
    hkv = k.shape[2] // d
    scale = scale or 1 / math.sqrt(d)
    out = np.full((bsz, sq, h * d), np.nan)
    m4 = np.broadcast_to(mask, (bsz, h, sq, sk)) if mask.size else None
    for b in range(bsz):
        for hh in range(h):
            kv = hh // (h // hkv)
            for i in range(sq):
                pos = sk - sq + i
                scores = {}
                for j in range(sk):
                    if kind == "causal" and j > pos or kind == "sliding_window" and not (pos - window < j <= pos):
                        continue
                    if kind == "custom" and m4[b, hh, i, j] == 0:
                        continue
                    s = scale * math.fsum(q[b, i, hh * d + t] * k[b, j, kv * d + t] for t in range(d))
                    if cap:
                        s = cap * math.tanh(s / cap)
                    if kind == "bias":
                        s += m4[b, hh, i, j]
                    scores[j] = s
                if not scores:
                    continue
                top = max(scores.values())
                w = {j: math.exp(s - top) for j, s in scores.items()}
                tot = math.fsum(w.values())
                for t in range(d):
                    out[b, i, hh * d + t] = math.fsum(w[j] * v[b, j, kv * d + t] for j in w) / tot
    return out


@pytest.mark.parametrize("kind,window,mask_shape", [("none", 0, (0,)), ("causal", 0, (0,)),
                                                    ("sliding_window", 2, (0,)), ("custom", 0, (3, 5)),
                                                    ("bias", 0, (2, 1, 3, 5))])
@pytest.mark.parametrize("scale,cap", [(0.0, 0.0), (0.4, 2.0)])
def test_attention_against_loops(kind, window, mask_shape, scale, cap):
    h, hkv, d = 4, 2, 3
    q, k, v = rand(12, (2, 3, h * d)), rand(13, (2, 5, hkv * d)), rand(14, (2, 5, hkv * d))
    mask = np.floor(rand(15, mask_shape, -3, 0.999)) if math.prod(mask_shape) else np.zeros(0)
    attrs = dict(num_heads=h, head_dim=d, mask_kind=kind, window=window, score_scale=scale, logit_softcap=cap)
    got = run("attention", [q, k, v, mask], **attrs)
    want = loop_attention(q, k, v, mask, h, d, kind, window, scale, cap)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)  # NaN where no key is visible


def test_causal_mask_sits_at_the_end():
    """With Sq = 1 the only query is the last position: causal attends to every key."""
    q, k, v = rand(16, (1, 1, 4)), rand(17, (1, 6, 4)), rand(18, (1, 6, 4))
    base = dict(num_heads=1, head_dim=4, window=0, score_scale=0.0, logit_softcap=0.0)
    np.testing.assert_allclose(run("attention", [q, k, v, np.zeros(0)], mask_kind="causal", **base),
                               run("attention", [q, k, v, np.zeros(0)], mask_kind="none", **base))


@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_rope_against_complex_rotation(style):
    s_, hd, nr = 5, 8, 6
    x = rand(19, (2, s_, 2 * hd))
    theta = rand(20, (s_, nr // 2), -4, 4)
    got = run("rope", [x, np.cos(theta), np.sin(theta)], head_dim=hd, n_rot=nr, style=style)
    want = x.copy()
    for b in range(2):
        for t in range(s_):
            for head in range(2):
                base = head * hd
                for kk in range(nr // 2):
                    i, j = (base + kk, base + kk + nr // 2) if style == "neox" else (base + 2 * kk, base + 2 * kk + 1)
                    z = complex(x[b, t, i], x[b, t, j]) * complex(math.cos(theta[t, kk]), math.sin(theta[t, kk]))
                    want[b, t, i], want[b, t, j] = z.real, z.imag
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-14)


# -- bounds -------------------------------------------------------------------------------------------
def one_pass_layer_norm32(x, g, b, eps):
    """E[x^2] - E[x]^2 in float32: the unstable variance the spread class exists to catch."""
    x = x.astype(np.float32)
    mu = x.mean(-1, keepdims=True, dtype=np.float32)
    var = (x * x).mean(-1, keepdims=True, dtype=np.float32) - mu * mu
    return ((x - mu) / np.sqrt(np.maximum(var, 0) + np.float32(eps)) * g + b).astype(np.float32)


def test_layer_norm_bound_admits_reference_rejects_one_pass_variance():
    c = next(c for c in matrix.generate([T], ops=["layer_norm"], dtypes=["float32"])
             if c.vals == "spread" and c.family == "rows")
    x, g, b = matrix.make_inputs(c)
    ref = CPU.run(c.op, [x, g, b], c.attr_dict)[0]
    bound = bounds.layer_norm_bound([x, g, b], c.attr_dict, "float32")
    assert np.all(np.isfinite(bound))
    bad = one_pass_layer_norm32(x, np.float32(1), np.float32(0), c.attr_dict["eps"]) * g + b
    assert np.any(np.abs(bad.astype(np.float64) - ref) > bound)


def test_attention_bound_rejects_a_dropped_key():
    c = next(c for c in matrix.generate([T], ops=["attention"], dtypes=["float32"]) if c.family == "gqa")
    inputs = matrix.make_inputs(c)
    ref = CPU.run(c.op, inputs, c.attr_dict)[0].astype(np.float64)
    bound = bounds.attention_bound(inputs, c.attr_dict, "float32")
    assert np.all(np.abs(ref - ref) <= bound) and np.all(bound < 1e-2 * np.abs(ref).max())
    k = inputs[1].copy()
    k[:, 0] = 0  # a changed key must move the output by more than the bound
    moved = CPU.run(c.op, [inputs[0], k, inputs[2], inputs[3]], c.attr_dict)[0].astype(np.float64)
    assert np.any(np.abs(moved - ref) > bound)


def test_rope_overflowing_products_admit_fma_rejects_garbage():
    """x1 c - x2 s where both float32 products overflow but the exact result is finite: an FMA
    (MLX's fused CUDA kernel) gets a finite value a few ulp from the reference; it must pass,
    and so must inf or NaN (the unfused order), while a finite value far off must not."""
    x = np.array([[[3.0e38, 2.9e38]]], np.float32)
    c = np.array([[0.9]], np.float32)
    s = np.array([[0.95]], np.float32)
    attrs = dict(head_dim=2, n_rot=2, style="neox")
    ref = CPU.run("rope", [x.astype(np.float64), c.astype(np.float64), s.astype(np.float64)], attrs)[0]
    ref = ref.astype(np.float32)
    bound = bounds.rope_bound([x, c, s], attrs, "float32")
    tol = Tolerance(max_ulp=2)

    def judge(out0):
        out = ref.copy()
        out[0, 0, 0] = out0
        return compare(ref, out, exact=False, signed_zero=False, tol=tol, bound=bound).ok

    assert np.isfinite(ref[0, 0, 0])
    assert judge(np.nextafter(np.nextafter(ref[0, 0, 0], np.float32(0)), np.float32(0)) * np.float32(1 - 3e-7))
    assert judge(np.float32(np.inf)) and judge(np.float32(np.nan))
    assert not judge(ref[0, 0, 0] * np.float32(0.5))


def test_nan_rows_must_stay_nan():
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 4.0]], np.float32)
    g = b = np.ones(3, np.float32)
    bound = np.asarray(bounds.layer_norm_bound([x, g, b], {"axis": -1, "eps": 1e-5}, "float32"))
    assert np.all(bound[0] == 0) and np.all(bound[1] > 0)


NN = ["layer_norm", "rms_norm", "group_norm", "batch_norm_inference", "attention", "rope"]


def default_cases(op: str) -> list[matrix.Case]:
    """Every default case of ``op``, but the ``huge`` family (attention over 10^6 keys: 0.2-2 s a
    case, 144 cases, 104 s of the unit tests' time on CI) in float32 for every attribute and value
    class, and its first case in each other dtype: the other dtypes take the code paths the smaller
    families run in every dtype, so their huge cases would add time, not paths."""
    seen: set[str] = set()
    out = []
    for c in matrix.generate([T], ops=[op]):
        if c.family == "huge" and c.dtype != "float32":
            if c.dtype in seen:
                continue
            seen.add(c.dtype)
        out.append(c)
    return out


@pytest.mark.parametrize("op", NN)  # one item per op: attention's 10^6-key cases take the longest
def test_every_default_case_has_a_reference(op):
    for c in default_cases(op):
        out = CPU.run(c.op, matrix.make_inputs(c), c.attr_dict)
        assert len(out) == 1, c.id


@pytest.mark.parametrize("op,desc,inputs,attrs", [(op, *e) for op in NN for e in get_op(op).error_inputs()],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_reference_rejects_error_inputs(op, desc, inputs, attrs):
    with pytest.raises(SpecError):
        CPU.run(op, [x.copy() for x in inputs], attrs)
