"""rlx-conformance: a differential conformance harness for RLX's ML backends.

The public API for scripts is :func:`run_op`; the CLI is ``rlx-conformance`` and the pytest
plugin builds one test item per case of the matrix.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.core import provenance
from rlx_conformance.core.errors import (
    KernelContractError,
    RegistrationError,
    RlxError,
    SpecError,
    UnknownOpError,
    UnsupportedError,
)

__version__ = provenance.version()

__all__ = ["run_op", "__version__", "RlxError", "SpecError", "UnknownOpError", "UnsupportedError",
           "RegistrationError", "KernelContractError"]


def run_op(name: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any] | None = None,
           backend: str = "cpu", device: str = "cpu", mode: str = "compiled") -> list[np.ndarray]:
    """Run one op once, in this process. Inputs are numpy arrays (bfloat16 as
    ml_dtypes.bfloat16); outputs are numpy arrays in the dtypes the registry declares.
    Raises SpecError (bad shapes, dtypes or attributes), UnknownOpError, UnsupportedError."""
    from rlx_conformance.backends import get_backend

    b = get_backend(backend)
    if mode not in b.modes:
        mode = b.default_mode if backend == "cpu" else mode
    return b.run(name, list(inputs), attrs, device=device, mode=mode)
