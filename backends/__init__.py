"""Backends: kernels only. Each backend registers kernels against registry op names with the
shared call convention ``kernel(*inputs, **attrs)``; it knows its devices, modes and how to move
arrays in and out, and nothing about cases or tolerances."""
from __future__ import annotations

import importlib

from rlx_conformance.backends.base import Backend, KernelEntry  # noqa: F401
from rlx_conformance.core.errors import RlxError

BACKENDS = {"cpu": "rlx_conformance.backends.cpu", "mlx": "rlx_conformance.backends.mlx"}


def get_backend(name: str) -> Backend:
    """The backend object, its kernels loaded. RlxError when unknown or not installed."""
    try:
        module = BACKENDS[name]
    except KeyError:
        raise RlxError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})") from None
    try:
        return importlib.import_module(module).BACKEND
    except ImportError as e:
        raise RlxError(f"backend {name!r} is not available: {e}") from None
