"""Backends: kernels only. Each backend registers kernels against registry op names with the
shared call convention ``kernel(*inputs, **attrs)``; it knows its devices, modes and how to move
arrays in and out, and nothing about cases or tolerances."""
from __future__ import annotations

import importlib
from types import ModuleType

from rlx_conformance.backends.base import Backend, KernelEntry  # noqa: F401
from rlx_conformance.core.errors import RlxError

BACKENDS = {"cpu": "rlx_conformance.backends.cpu", "mlx": "rlx_conformance.backends.mlx"}


_LOADED: dict[str, ModuleType] = {}  # importlib.import_module costs ~18 µs even when imported, and the
# stale-entry check asks hundreds of thousands of times at the end of a run


def get_backend(name: str) -> Backend:
    """The backend object, its kernels loaded. RlxError when unknown or not installed."""
    module = _LOADED.get(name)
    if module is None:
        try:
            path = BACKENDS[name]
        except KeyError:
            raise RlxError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})") from None
        try:
            module = _LOADED[name] = importlib.import_module(path)
        except ImportError as e:
            raise RlxError(f"backend {name!r} is not available: {e}") from None
    return module.BACKEND
