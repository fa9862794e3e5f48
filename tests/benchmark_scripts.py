"""The scripts under benchmarks/ as modules, for the tests that check their helpers or the
experimental kernels they carry. benchmarks/ is not a package and its scripts import each other
by plain name (``from bench_gpu_custom import ...``), so it is on sys.path while one is imported."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    """benchmarks/<name>.py, imported once (later calls return the same module)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
