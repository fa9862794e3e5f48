"""The command line: ``rlx-conformance COMMAND``, one module per command in this package (each
with ``register(subparsers)``; they are found, not listed). Bad input gets one line on stderr and
exit status 2; a run exits 1 when any case failed, errored, crashed, timed out or xpassed."""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from types import ModuleType

from rlx_conformance.core import data
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.provenance import version_line

_NOT_COMMANDS = ("main", "options")


def command_modules() -> list[ModuleType]:
    """The command modules of this package, in name order."""
    pkg = importlib.import_module(__package__)
    return [importlib.import_module(f"{__package__}.{m.name}")
            for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name)
            if not m.name.startswith("_") and m.name not in _NOT_COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlx-conformance", description=(
        "Differential conformance harness: runs the op matrix on a backend and on the CPU reference."))
    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)
    for mod in command_modules():
        mod.register(sub)
    for sp in sub.choices.values():  # every command reads the data: each takes --cases
        sp.add_argument("--cases", metavar="DIR", default=None,
                        help="a folder of data files that replace the shipped ones of the same name "
                             "(known_divergences.toml, tolerances.toml, shapes/…); also "
                             f"${data.ENV}")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        data.set_override(getattr(args, "cases", None))
        return args.fn(args)
    except RlxError as e:
        print(f"rlx-conformance: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0



if __name__ == "__main__":
    sys.exit(main())
