"""The MLX backend: mlx.core on the CPU or a GPU, in the RLX MLX backend's three modes.

* eager: evaluate after each stage of the op (widen, kernel, narrow), as RLX evaluates per node;
* lazy: build the whole graph and evaluate once;
* compiled: ``mx.compile`` of the whole function, cached per (op, attributes, dtypes, stream).

Inputs cross into MLX with explicit dtypes, outputs leave through exact views (bfloat16 as raw
bits). On a GPU device, float64 operands and ops flagged ``cpu_stream`` (linalg) run on the CPU
stream, never at another precision; the result records which stream ran.
"""
from __future__ import annotations

import os
from typing import Any

import mlx.core as mx
import numpy as np

from rlx_conformance import dtypes as dt
from rlx_conformance.errors import SpecError
from rlx_conformance.registry import OpSpec, OutSpec

from ..base import Backend, KernelEntry, _as_list, check_outputs, compute_dtypes

MX_DTYPES = {
    "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "float64": mx.float64,
    "int8": mx.int8, "int16": mx.int16, "int32": mx.int32, "int64": mx.int64, "uint8": mx.uint8,
    "uint32": mx.uint32, "bool": mx.bool_,
}
_NAMES = {v: k for k, v in MX_DTYPES.items()}
MODES = ("eager", "lazy", "compiled")


def dtype_name(a: mx.array) -> str:
    try:
        return _NAMES[a.dtype]
    except KeyError:
        raise ValueError(f"MLX dtype {a.dtype} is outside the harness's dtype list") from None


def to_mlx(x: np.ndarray, dtype: str) -> mx.array:
    """numpy → MLX with the dtype given explicitly (mx.array would turn float64 into float32)."""
    return mx.array(x, dtype=MX_DTYPES[dtype])


def to_numpy(a: mx.array) -> np.ndarray:
    """MLX → numpy, exactly; bfloat16 goes through its bits (numpy has no PEP 3118 bfloat16)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(dt.np_dtype("bfloat16"))
    return np.array(a)


def mode_from_env(mode: str | None = None) -> str:
    """The option, else RLX_MLX_MODE (as RLX reads it, case-insensitive), else compiled."""
    if mode:
        return mode
    env = os.environ.get("RLX_MLX_MODE", "").lower()
    return env if env in MODES else "compiled"


class MlxBackend(Backend):
    name = "mlx"
    modes = MODES

    def __init__(self) -> None:
        super().__init__()
        self._compiled: dict[Any, Any] = {}

    @property
    def default_mode(self) -> str:  # type: ignore[override]
        return mode_from_env()

    def all_devices(self) -> tuple[str, ...]:
        return ("cpu", "gpu")

    def devices(self) -> list[str]:
        return ["cpu"] + (["gpu"] if mx.is_available(mx.gpu) else [])

    def stream_for(self, entry: KernelEntry, dtypes: list[str], device: str) -> str:
        """Which stream runs a call: float64 and cpu_stream kernels stay on the CPU."""
        if device == "gpu" and ("float64" in dtypes or entry.options.get("cpu_stream")):
            return "cpu"
        return device

    def _execute(self, entry: KernelEntry, spec: OpSpec, inputs: list[np.ndarray],
                 in_dtypes: list[str], attrs: dict[str, Any], outs: list[OutSpec], device: str,
                 mode: str) -> list[np.ndarray]:
        cdts = compute_dtypes(spec, in_dtypes)
        out_dtypes = [d for _, d in outs]
        stream = mx.cpu if self.stream_for(entry, in_dtypes + out_dtypes, device) == "cpu" else mx.gpu
        with mx.stream(stream):
            args = [to_mlx(x, d) for x, d in zip(inputs, in_dtypes)]
            if mode == "compiled":
                # Keyed by shapes too: the traced graph bakes in the declared output shapes.
                key = (spec.name, repr(sorted(attrs.items())), tuple(in_dtypes),
                       tuple(x.shape for x in inputs), str(stream), id(entry.fn))
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = mx.compile(self._graph(entry, spec, attrs, cdts, outs, None))
                res = fn(*args)
                mx.eval(res)
            elif mode in ("eager", "lazy"):
                res = self._graph(entry, spec, attrs, cdts, outs, mx.eval if mode == "eager" else None)(*args)
                mx.eval(res)
            else:
                raise SpecError(f"mlx: unknown mode {mode!r}")
        return [to_numpy(r) for r in res]

    def _graph(self, entry, spec, attrs, cdts, outs, step):
        """widen → kernel → contract check → narrow, with ``step`` (mx.eval in eager mode) between."""
        def fn(*args):
            wide = [a.astype(MX_DTYPES[c]) if dtype_name(a) != c else a for a, c in zip(args, cdts)]
            if step:
                step(wide)
            res = _as_list(entry.fn(*wide, **attrs))
            check_outputs(self.name, spec, res, outs, lambda o: (o.shape, dtype_name(o)))
            if step:
                step(res)
            return [r.astype(MX_DTYPES[d]) if dtype_name(r) != d else r for r, (_, d) in zip(res, outs)]
        return fn


BACKEND = MlxBackend()

from .._loader import load_kernel_modules  # noqa: E402

load_kernel_modules(__name__, __path__)  # every kernel module in this package registers itself
