"""Built-in op declarations, one module per family (docs/ops.md is generated from them).

Importing this package fills the registry with every family module in it, so the layers above
look ops up here (:func:`get_op`, :func:`all_ops`), never in an unfilled registry."""
import importlib
import pkgutil

from rlx_conformance.spec.registry import REGISTRY, OpSpec

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_m}")


def get_op(name: str) -> OpSpec:
    """The OpSpec for ``name`` (built-in or custom); UnknownOpError with close names otherwise."""
    return REGISTRY[name]


def all_ops() -> list[OpSpec]:
    return list(REGISTRY.values())
