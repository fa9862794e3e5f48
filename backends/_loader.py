"""Imports every kernel module of a backend package (one per op family), so adding a family is
adding a file; then the kernels other packages register through the entry-point group
``rlx_conformance.kernels``."""
import importlib
import importlib.metadata
import inspect
import pkgutil
import sys
import types

from rlx_conformance.core.errors import RegistrationError, RlxError

ENTRY_POINT_GROUP = "rlx_conformance.kernels"


def load_kernel_modules(package: str, path) -> None:
    for name in sorted(m.name for m in pkgutil.iter_modules(path) if not m.name.startswith("_")):
        importlib.import_module(f"{package}.{name}")
    load_entry_point_kernels(package)


def load_entry_point_kernels(package: str) -> None:
    """Kernels registered permanently by installed packages. An entry point of the group
    ``rlx_conformance.kernels`` is named after the backend it extends (``mlx`` or ``mlx.<label>``;
    other names are ignored) and points to a module, which registers its kernels when imported
    (``get_backend("mlx").kernel(...)``), or to a function, called with the Backend object. It
    loads with the backend, in every process, so its kernels take part in every run; each kernel
    it registers or replaces gets its origin (the entry point and its distribution) and the
    input-mutation check. A failure is a RegistrationError naming the entry point."""
    backend_name = package.rpartition(".")[2]
    backend = sys.modules[package].BACKEND
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.partition(".")[0] != backend_name:
            continue
        dist = f"{ep.dist.name} {ep.dist.version}" if getattr(ep, "dist", None) else "unknown distribution"
        where = f"entry point {ep.name} = {ep.value} ({dist})"
        before = dict(backend.kernels)
        try:
            obj = ep.load()
            if not isinstance(obj, types.ModuleType):
                if not callable(obj):
                    raise RegistrationError(f"points to a {type(obj).__name__}, not a module or function")
                params = inspect.signature(obj).parameters
                obj(backend) if params else obj()
        except RlxError as e:
            raise RegistrationError(f"{backend_name}: {where}: {e}") from None
        except Exception as e:  # noqa: BLE001 — a broken plugin is named, never a traceback
            raise RegistrationError(f"{backend_name}: {where} failed to load: {type(e).__name__}: {e}") from None
        for op, entry in backend.kernels.items():
            if before.get(op) is not entry:
                if entry.origin == "builtin":
                    entry.origin = f"{ep.value} (entry point {ep.name}, {dist})"
                entry.options.setdefault("check_inputs", True)
