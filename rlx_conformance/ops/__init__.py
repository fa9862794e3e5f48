"""Built-in op declarations, one module per family (OPS.md). Importing this package fills the
registry with every module in it."""
import importlib
import pkgutil

for _m in sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")):
    importlib.import_module(f"{__name__}.{_m}")
