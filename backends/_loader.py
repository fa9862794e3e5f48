"""Imports every kernel module of a backend package (one per op family), so adding a family is
adding a file."""
import importlib
import pkgutil


def load_kernel_modules(package: str, path) -> None:
    for name in sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_")):
        importlib.import_module(f"{package}.{name}")
