"""The backward family (ops/backward.py): RLX's explicit backward op kinds as registry ops.

* The CPU reference (the forward's reference VJP rule, backends/cpu/backward.py) agrees with
  central finite differences of the forward's own reference kernel, with Richardson
  extrapolation (test_reference_derivatives._ridders) so the test's own error is known: for a
  random direction v, <backward(x, dy), v> = d/de <forward(x + e v), dy>.
* The MLX kernels (backends/mlx/backward.py) pass on every mode on a small subset, or their
  failures are recorded in cases/known_divergences.toml.
* A deliberately wrong MLX kernel (a missing factor, a dropped duplicate index) is rejected.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from test_reference_derivatives import _ridders

from rlx_conformance.backends import get_backend
from rlx_conformance.generate.matrix import Case, Target, generate, make_inputs
from rlx_conformance.judge.divergences import known_divergence
from rlx_conformance.ops import all_ops, get_op
from rlx_conformance.run.execute import run_case

CPU = get_backend("cpu")
BACKWARD = sorted(s.name for s in all_ops() if s.family == "backward")
# op -> (forward op, position of the forward input it differentiates, forward input count)
FORWARD = {"relu_backward": (None, 0, 1), "activation_backward": (None, 0, 1),
           "conv2d_backward_input": ("conv", 0, 3), "conv2d_backward_weight": ("conv", 1, 3),
           "cumsum_backward": ("cumsum", 0, 1), "gather_backward": ("gather", 0, 2),
           "rope_backward": ("rope", 0, 3), "softmax_cross_entropy_backward": ("softmax_cross_entropy", 0, 2),
           "max_pool2d_backward": ("pool", 0, 1)}
FORWARD.update({"attention_backward_q": ("attention", 0, 4), "attention_backward_k": ("attention", 1, 4),
                "attention_backward_v": ("attention", 2, 4)})
FORWARD.update({"layer_norm_backward_input": ("layer_norm", 0, 3), "layer_norm_backward_gamma": ("layer_norm", 1, 3),
                "rms_norm_backward_input": ("rms_norm", 0, 3), "rms_norm_backward_gamma": ("rms_norm", 1, 3),
                "group_norm_backward_input": ("group_norm", 0, 3),
                "group_norm_backward_gamma": ("group_norm", 1, 3), "group_norm_backward_beta": ("group_norm", 2, 3),
                "batch_norm_inference_backward_input": ("batch_norm_inference", 0, 5),
                "batch_norm_inference_backward_gamma": ("batch_norm_inference", 1, 5),
                "batch_norm_inference_backward_beta": ("batch_norm_inference", 2, 5)})


def _size(c: Case) -> int:
    return sum(math.prod(s) for s in c.shapes)


def _subset(op: str, dtype: str, targets: list[Target], vals: str = "random", per_op: int = 3) -> list[Case]:
    """The ``per_op`` smallest non-empty input sets of ``op`` (one per attribute setting first),
    every target."""
    cases = [c for c in generate(targets, ops=[op], dtypes=[dtype]) if c.vals == vals and _size(c) > 0]
    seen: dict[str, Case] = {}
    for c in sorted(cases, key=lambda c: (_size(c), c.id)):
        seen.setdefault(c.attrs and repr(c.attrs) or c.input_id, c)
    keep = {c.input_id for c in sorted(seen.values(), key=_size)[:per_op]}
    return [c for c in cases if c.input_id in keep]


def test_the_family_is_declared() -> None:
    assert BACKWARD == sorted(FORWARD)
    for op in BACKWARD:
        assert CPU.kernels.get(op) is not None and get_backend("mlx").kernels.get(op) is not None, op


def _directional(fwd: str, xs: list[np.ndarray], attrs: dict, wrt: int, v: np.ndarray, dy: np.ndarray):
    """h -> the central difference of <fwd(xs with input wrt moved by h v), dy> over 2h."""
    def central(h: float) -> float:
        hi, lo = list(xs), list(xs)
        hi[wrt], lo[wrt] = np.asarray(xs[wrt] + h * v), np.asarray(xs[wrt] - h * v)
        (fh,), (fl,) = CPU.run(fwd, hi, attrs), CPU.run(fwd, lo, attrs)
        return math.fsum(((fh - fl) * dy).ravel().tolist()) / (2 * h)
    return central


@pytest.mark.parametrize("op", BACKWARD)
def test_reference_matches_finite_differences(op: str) -> None:
    cases = _subset(op, "float64", [Target("cpu", "cpu", "eager")])
    assert cases, op
    rng = np.random.default_rng(16)
    for c in cases:
        ins = make_inputs(c)
        attrs = c.attr_dict
        fwd, wrt, n = FORWARD[op]
        fwd = fwd or ("relu" if op == "relu_backward" else attrs["activation"])
        fattrs = {} if fwd == "relu" or op == "activation_backward" else \
            {**attrs, "kind": "max"} if op == "max_pool2d_backward" else attrs
        xs, dy = ins[:n], ins[n]
        (dx,) = CPU.run(op, ins, attrs)
        assert dx.shape == xs[wrt].shape and dx.dtype == xs[wrt].dtype
        v = rng.uniform(-1, 1, xs[wrt].shape)
        radius = CPU.smooth_radius(fwd, xs, fattrs)[wrt]  # keep the stencil off kinks and ties
        if radius is not None:
            v = v * np.minimum(1.0, radius)

        fd, err = _ridders(_directional(fwd, xs, fattrs, wrt, v, dy), 0.5, 8)
        got = math.fsum((dx * v).ravel().tolist())
        scale = math.fsum(np.abs(dx * v).ravel().tolist()) + 1e-300
        assert abs(fd - got) <= 10 * err + 1e-9 * scale, (c.id, fd, got, err)


MODES = ("eager", "lazy", "compiled")


@pytest.mark.parametrize("op", BACKWARD)
def test_mlx_passes_or_is_recorded(op: str) -> None:
    targets = [Target("mlx", "cpu", m) for m in MODES]
    cases = _subset(op, "float32", targets, per_op=2) + _subset(op, "float16", targets, per_op=1)
    assert {c.target.mode for c in cases} == set(MODES)
    for c in cases:
        r = run_case(c)
        assert r.outcome == "pass" or (r.outcome == "fail" and known_divergence(c, r) is not None), \
            (c.id, r.outcome, r.message)


def _wrong(op: str):
    """A wrong kernel of ``op``: a missing factor, or duplicate indices dropped."""
    import mlx.core as mx
    if op == "activation_backward":
        return lambda x, dy, *, activation: dy * mx.sigmoid(x)  # sigmoid': the (1 - s) factor missing
    if op == "conv2d_backward_weight":
        right = get_backend("mlx").kernels[op].fn
        return lambda x, w, bias, dy, **kw: right(x, w, bias, dy, **kw) * (1 + 2 ** -10)
    if op == "gather_backward":
        def dropped(x, indices, dy, *, axis):  # a store, not an add: one of each duplicate kept
            a = axis % x.ndim
            idx = indices.reshape(-1)
            idx = mx.where(idx < 0, idx + x.shape[a], idx)
            lead = list(range(a, a + indices.ndim))
            rest = [d for d in range(dy.ndim) if d not in lead]
            upd = dy.transpose(lead + rest).reshape([idx.size] + [dy.shape[d] for d in rest])
            acc = mx.zeros([x.shape[a]] + [dy.shape[d] for d in rest], dtype=dy.dtype)
            acc[idx] = upd
            return mx.moveaxis(acc, 0, a)
        return dropped
    if op in _WRONG_NORMS:
        return _WRONG_NORMS[op]()
    raise KeyError(op)


def _wrong_layer_norm_input():
    """LayerNormBackwardInput without the xhat mean(g xhat) term (the variance's path dropped)."""
    import mlx.core as mx

    def run(x, gamma, beta, dy, *, axis, eps):
        a = axis % x.ndim
        x2 = x.reshape(-1, math.prod(x.shape[a:]))
        g = (dy * gamma).reshape(x2.shape)
        d = x2 - mx.mean(x2, axis=-1, keepdims=True)
        rs = mx.rsqrt(mx.mean(d * d, axis=-1, keepdims=True) + eps)
        return ((g - mx.mean(g, axis=-1, keepdims=True)) * rs).reshape(x.shape)
    return run


def _wrong_group_norm_input():
    """GroupNormBackwardInput with gamma dropped (g = dy)."""
    right = get_backend("mlx").kernels["group_norm_backward_input"].fn
    import mlx.core as mx
    return lambda x, gamma, beta, dy, **kw: right(x, mx.ones_like(gamma), beta, dy, **kw)


def _wrong_rms_norm_gamma():
    """RmsNormBackwardGamma with its sum over the wrong axis: the statistics taken over the rows
    (axis 0 of [rows, n]) instead of the normalized dims."""
    import mlx.core as mx

    def run(x, gamma, beta, dy, *, axis, eps):
        a = axis % x.ndim
        x2 = x.reshape(-1, math.prod(x.shape[a:]))
        xhat = x2 * mx.rsqrt(mx.mean(x2 * x2, axis=0, keepdims=True) + eps)
        return mx.sum(dy.reshape(x2.shape) * xhat, axis=0).reshape(gamma.shape)
    return run


_WRONG_NORMS = {"layer_norm_backward_input": _wrong_layer_norm_input,
                "group_norm_backward_input": _wrong_group_norm_input,
                "rms_norm_backward_gamma": _wrong_rms_norm_gamma}


def _has_duplicates(idx: np.ndarray, size: int) -> bool:
    rows = np.where(idx < 0, idx + size, idx).ravel()
    return len(set(rows.tolist())) < rows.size


@pytest.mark.parametrize("op,filter_id", [("activation_backward", "activation:sigmoid/"),
                                          ("conv2d_backward_weight", "shape:1x8x24x24"),
                                          ("gather_backward", "gather_backward/float32/"),
                                          ("layer_norm_backward_input", "shape:7x33+"),
                                          ("group_norm_backward_input", "shape:2x8x4x4+"),
                                          ("rms_norm_backward_gamma", "shape:7x33+")])
def test_a_wrong_kernel_is_rejected(op: str, filter_id: str, monkeypatch) -> None:
    mlx = get_backend("mlx")
    entry = mlx.kernels[op]
    monkeypatch.setitem(mlx.kernels, op, dataclasses.replace(entry, fn=_wrong(op)))
    cases = [c for c in generate([Target("mlx", "cpu", "eager")], ops=[op], dtypes=["float32"])
             if c.vals == "random" and filter_id in c.id and _size(c) > 0]
    if op == "gather_backward":  # inputs with a duplicate index
        cases = [c for c in cases if _has_duplicates(make_inputs(c)[1], make_inputs(c)[0].shape[c.attr_dict["axis"]])]
    assert cases
    for c in cases[:2]:
        r = run_case(c)
        assert r.outcome == "fail", (c.id, r.outcome, r.message)


# -- AttentionBackward and the conv backward's asymmetric padding ---------------------------------
def test_attention_backward_attributes_are_attentions() -> None:
    """ops/backward.py repeats attention's attributes (ops/nn.py registers later): the same
    names, kinds, defaults and choices, and the same sweep on every attention_backward family."""
    from rlx_conformance.generate.matrix import shape_families
    fwd = get_op("attention")
    for op in ("attention_backward_q", "attention_backward_k", "attention_backward_v"):
        spec = get_op(op)
        assert [(a.name, a.kind, a.default, a.choices) for a in spec.attrs] == \
            [(a.name, a.kind, a.default, a.choices) for a in fwd.attrs]
        for shapes in shape_families(spec.shapes).values():
            for a, b in zip(spec.attrs, fwd.attrs):
                sweep = lambda x: tuple(x.sweep(shapes[:4])) if callable(x.sweep) else x.sweep
                assert sweep(a) == sweep(b), (op, a.name)


def _attention_case(family: str, **want) -> Case:
    cases = [c for c in generate([Target("mlx", "cpu", "eager")], ops=["attention_backward_k"], dtypes=["float32"])
             if c.family == family and all(c.attr_dict[k] == v for k, v in want.items())]
    assert cases, (family, want)
    return cases[0]


def test_attention_backward_query_with_no_key() -> None:
    """A custom mask that leaves a query no key: its dq is undefined (attention's output there
    is), and it passes no cotangent to k and v: the MLX kernels agree with the reference on every
    other element, within the bound, with no NaN leaking into dk or dv."""
    mlx = get_backend("mlx")
    c = _attention_case("masked", mask_kind="custom")
    ins = make_inputs(c)
    ins[3] = ins[3].copy()
    ins[3][1] = 0  # query 1 sees no key
    for op in ("attention_backward_q", "attention_backward_k", "attention_backward_v"):
        spec = get_op(op)
        (want,), (got,) = CPU.run(op, ins, c.attr_dict), mlx.run(op, ins, c.attr_dict)
        skip = spec.undefined(ins, c.attr_dict)
        if op == "attention_backward_q":
            assert skip is not None and skip[:, 1].all() and not skip[:, 0].any()
        else:
            assert skip is None and np.isfinite(got).all()
        ok = skip if skip is not None else np.zeros(got.shape, bool)
        bound = np.asarray(spec.policy.bound(ins, c.attr_dict, "float32"))
        err = np.abs(got.astype(np.float64) - want)
        assert (ok | (err <= bound + np.spacing(np.abs(want).astype(np.float32)))).all(), op


def _heads(a, n: int, d: int):
    return a.reshape(a.shape[0], a.shape[1], n, d).transpose(0, 2, 1, 3)


def _unheads(a):
    return a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], a.shape[1] * a.shape[3])


def _plain_attention(q, k, v, dy, num_heads, head_dim, score_scale):
    """q, k, v, dy in heads (k, v repeated to the query heads), P and the scale, for the wrong
    kernels below (no mask, no softcap: their cases are filtered so)."""
    import mlx.core as mx
    h, d = num_heads, head_dim
    hkv = k.shape[-1] // d
    scale = score_scale or 1 / math.sqrt(d)
    qh, do = _heads(q, h, d), _heads(dy, h, d)
    kh, vh = (mx.repeat(_heads(a, hkv, d), h // hkv, axis=1) for a in (k, v))
    p = mx.softmax(scale * (qh @ mx.swapaxes(kh, -1, -2)), axis=-1)
    return qh, kh, vh, do, p, scale, hkv


def _wrong_attention(what: str):
    """A wrong attention backward kernel: dk without the score scale, dq's dS without the
    rowsum(dP * P) term, or dv of a GQA head taken from one query head of its group instead of
    their sum."""
    import mlx.core as mx
    if what == "dk_unscaled":
        right = get_backend("mlx").kernels["attention_backward_k"].fn
        return lambda q, k, v, mask, dy, **kw: right(q, k, v, mask, dy, **kw) / (
            kw["score_scale"] or 1 / math.sqrt(kw["head_dim"]))

    def run(q, k, v, mask, dy, *, num_heads, head_dim, mask_kind, window, score_scale, logit_softcap):
        qh, kh, vh, do, p, scale, hkv = _plain_attention(q, k, v, dy, num_heads, head_dim, score_scale)
        if what == "dq_no_rowsum":
            ds = p * (do @ mx.swapaxes(vh, -1, -2))  # P * dP: the softmax Jacobian's rank-one part missing
            return _unheads(scale * (ds @ kh))
        dv = mx.swapaxes(p, -1, -2) @ do  # [B, H, Sk, D]
        return _unheads(dv[:, ::num_heads // hkv])  # one query head per kv head, the group's others dropped
    return run


@pytest.mark.parametrize("what,op,family", [("dk_unscaled", "attention_backward_k", "masked"),
                                            ("dq_no_rowsum", "attention_backward_q", "gqa"),
                                            ("dv_gqa_unsummed", "attention_backward_v", "gqa")])
def test_a_wrong_attention_kernel_is_rejected(what: str, op: str, family: str, monkeypatch) -> None:
    mlx = get_backend("mlx")
    monkeypatch.setitem(mlx.kernels, op, dataclasses.replace(mlx.kernels[op], fn=_wrong_attention(what)))
    cases = [c for c in generate([Target("mlx", "cpu", "eager")], ops=[op], dtypes=["float32"])
             if c.family == family and (what == "dk_unscaled" or (c.attr_dict["mask_kind"] == "none"
                                                                   and c.attr_dict["logit_softcap"] == 0))]
    assert len(cases) >= 2
    for c in cases[:2]:
        r = run_case(c)
        assert r.outcome == "fail", (c.id, r.outcome, r.message)


@pytest.mark.parametrize("op", ["conv2d_backward_input", "conv2d_backward_weight"])
def test_conv_backward_asymmetric_padding(op: str, monkeypatch) -> None:
    """The asymmetric padding cases exist (both new families, a strided one among them) and pass;
    the kernel with the padding's begins and ends swapped fails them."""
    mlx = get_backend("mlx")
    cases = [c for c in generate([Target("mlx", "cpu", "eager")], ops=[op], dtypes=["float32"])
             if c.attr_dict["padding"] == (0, 2, 1, 0)]
    assert {"asymmetric", "asymmetric_strided"} <= {c.family for c in cases}
    for c in cases:
        r = run_case(c)
        assert r.outcome == "pass", (c.id, r.outcome, r.message)
    right = mlx.kernels[op].fn

    def swapped(x, w, bias, dy, *, padding, **kw):
        return right(x, w, bias, dy, padding=tuple(padding[2:]) + tuple(padding[:2]), **kw)
    monkeypatch.setitem(mlx.kernels, op, dataclasses.replace(mlx.kernels[op], fn=swapped))
    for c in cases:
        r = run_case(c)
        assert r.outcome == "fail", (c.id, r.outcome, r.message)
