"""The CPU reference backend: numpy/scipy (ml_dtypes for bfloat16). It defines the semantics
every other backend is judged against, so its kernels favour being right over being fast:
float32 math is evaluated in float64 and rounded once. Next to each differentiable op's kernel
its module registers the op's reference derivatives, a VJP and a JVP rule in float64
(``BACKEND.vjp`` / ``BACKEND.jvp``: backends/base.py DerivativeRule; shared helpers in _grad.py),
verified by tests/test_reference_derivatives.py."""
from __future__ import annotations

from typing import Any

import numpy as np

from rlx_conformance.backends._loader import load_kernel_modules
from rlx_conformance.backends.base import (
    Backend,
    KernelEntry,
    _as_list,
    check_inputs_unchanged,
    check_outputs,
    compute_dtypes,
)
from rlx_conformance.core import dtypes as dt
from rlx_conformance.spec.registry import OpSpec, OutSpec


class CpuBackend(Backend):
    name = "cpu"
    modes = ("eager",)
    default_mode = "eager"
    layouts = "values"  # the reference sees the logical values, whatever the layout

    def _execute(self, entry: KernelEntry, spec: OpSpec, inputs: list[np.ndarray],
                 in_dtypes: list[str], attrs: dict[str, Any], outs: list[OutSpec] | None, device: str,
                 mode: str) -> list[np.ndarray]:
        args = [x.astype(dt.np_dtype(c)) if c != d else x
                for x, d, c in zip(inputs, in_dtypes, compute_dtypes(spec, in_dtypes))]
        check = outs is not None and bool(entry.options.get("check_inputs"))
        pristine = [a.copy() for a in args] if check else []
        with np.errstate(all="ignore"):
            res = _as_list(entry.fn(*args, **attrs))
        if outs is None:  # run_unchecked
            return [np.asarray(o) for o in res]
        if check:
            check_inputs_unchanged(self.name, spec, pristine, args)
        check_outputs(self.name, spec, res, outs, lambda o: (np.shape(o), dt.name_of(o.dtype)))
        with np.errstate(all="ignore"):
            return [dt.narrow(np.asarray(o), d) for o, (_, d) in zip(res, outs)]


BACKEND = CpuBackend()

load_kernel_modules(__name__, __path__)  # every kernel module in this package registers itself
