"""The host delegate: an MLX "kernel" that runs the CPU reference kernel on host copies of its
operands and hands the results back as mx.arrays (RLX's OnnxHostDelegate, without its flaw).

RLX's delegate guesses each operand's dtype from its bytes per element (1 bool, 2 f16, 4 f32,
8 i64), so float64 values arrive as int64 and int32 indices as float32. Here every operand
crosses with its declared dtype: the call's dtypes are checked against the op's spec
(OpSpec.validate: T inputs agree, index inputs are one of their declared dtypes), inputs are
copied exactly (to_numpy), and outputs go back with the dtypes the spec infers (to_mlx passes
the dtype explicitly: mx.array would otherwise turn float64 into float32).

Delegated kernels are registered with native=False, so results say kernel="delegated" and
agreement through the delegate is never mistaken for a validated port. Two uses:

* :func:`register_delegates`: a fallback for every custom op that has a CPU kernel and no MLX
  kernel (run at import, after the other kernel modules);
* :func:`force_delegate` (or RLX_CONFORMANCE_FORCE_DELEGATE=1, or a comma-separated list of op
  globs): route ops through the delegate even where a native kernel exists, so the delegate path
  is itself under test; :func:`restore_native` undoes it.

A delegate reads its inputs, i.e. evaluates the graph up to the op, as RLX's does. Under
mx.compile that is impossible (a traced array has no values): the delegate raises
UnsupportedError there, so compiled-mode cases of delegated ops report skip with the reason.
"""
from __future__ import annotations

import fnmatch
import importlib
import os
import pkgutil
from collections.abc import Sequence

import numpy as np

from rlx_conformance.backends import get_backend
from rlx_conformance.backends.base import KernelEntry, _as_list
from rlx_conformance.backends.mlx import BACKEND, dtype_name, to_mlx, to_numpy
from rlx_conformance.backends.mlx import __path__ as _PKG_PATH
from rlx_conformance.core.errors import UnsupportedError
from rlx_conformance.ops import all_ops, get_op

ENV = "RLX_CONFORMANCE_FORCE_DELEGATE"
_NATIVE: dict[str, KernelEntry] = {}  # entries force_delegate replaced, for restore_native
_TRACING = "function transformations"


def _cpu():
    return get_backend("cpu")


def make_delegate(op: str):
    """A kernel for ``op`` with the MLX call convention that runs the CPU kernel on the host."""
    spec = get_op(op)

    def delegated(*args, **attrs):
        declared = [dtype_name(a) for a in args]
        attrs, outs = spec.validate([tuple(a.shape) for a in args], declared, attrs)
        host = []
        for a, d in zip(args, declared):
            try:
                h = to_numpy(a)
            except ValueError as e:
                if _TRACING in str(e):
                    raise UnsupportedError(
                        f"{op}: the host delegate cannot run under mx.compile (it must read its "
                        "inputs, which a traced graph does not have); run eager or lazy") from None
                raise
            host.append(h)
        res = _as_list(_cpu().entry(op).fn(*host, **attrs))
        return tuple(to_mlx(np.asarray(r), d) for r, (_, d) in zip(res, outs))

    delegated.__name__ = f"delegate_{op.replace('.', '_')}"
    delegated.__doc__ = f"host delegate for {op}: the CPU kernel on host copies, declared dtypes"
    return delegated


def _load_siblings() -> None:
    """Import every other kernel module first, so their native kernels are registered before the
    fallback and forcing decisions (the loader imports modules in name order)."""
    for m in sorted(x.name for x in pkgutil.iter_modules(_PKG_PATH)):
        if not m.startswith("_") and m != "delegate":
            importlib.import_module(f"{__package__}.{m}")


def register_delegates(families: Sequence[str] | None = ("custom",)) -> list[str]:
    """Register a delegated kernel for each op (of ``families``; None: any) that has a CPU kernel
    and no MLX kernel. Returns the ops delegated."""
    cpu = _cpu()
    done = []
    for spec in all_ops():
        if families is not None and spec.family not in families:
            continue
        if spec.name in BACKEND.kernels or spec.name not in cpu.kernels:
            continue
        claims = cpu.kernels[spec.name].dtypes.get("cpu", frozenset(spec.dtypes))
        BACKEND.register(spec.name, make_delegate(spec.name), dtypes=claims, native=False,
                         origin="delegate", note="no MLX kernel: host delegate to the CPU kernel")
        done.append(spec.name)
    return done


def force_delegate(patterns: Sequence[str] | str = ("*",)) -> list[str]:
    """Route every MLX kernel whose op matches a glob (and has a CPU kernel) through the host
    delegate, keeping its dtype claims and options. Returns the ops rerouted."""
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    cpu = _cpu()
    done = []
    for op, entry in list(BACKEND.kernels.items()):
        if not entry.native or op not in cpu.kernels:
            continue
        if not any(fnmatch.fnmatchcase(op, p) for p in patterns):
            continue
        _NATIVE[op] = entry
        BACKEND.kernels[op] = KernelEntry(op, make_delegate(op), dict(entry.dtypes), native=False,
                                          origin="delegate", note="forced host delegation",
                                          options=dict(entry.options))
        done.append(op)
    return done


def restore_native() -> list[str]:
    """Undo force_delegate."""
    ops = list(_NATIVE)
    for op in ops:
        BACKEND.kernels[op] = _NATIVE.pop(op)
    return ops


def forced_patterns() -> list[str] | None:
    """The ops RLX_CONFORMANCE_FORCE_DELEGATE asks for: None when unset or 0."""
    v = os.environ.get(ENV, "").strip()
    if v.lower() in ("", "0", "false", "no"):
        return None
    if v.lower() in ("1", "true", "yes", "all", "*"):
        return ["*"]
    return [p.strip() for p in v.split(",") if p.strip()]


_load_siblings()
register_delegates()
if (_p := forced_patterns()) is not None:
    force_delegate(_p)
