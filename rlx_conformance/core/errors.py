"""Exceptions the harness raises on purpose. Each carries a one-line message meant for a user;
:func:`error_detail` words a kernel's own exception for a record."""

import linecache
import os
import sys
import traceback


class RlxError(Exception):
    """Base class: bad input to the harness's API or CLI (shown as one line, never a traceback)."""


class SpecError(RlxError, ValueError):
    """Inputs or attributes that an op's spec rejects: bad shape, rank, dtype, axis or attribute."""


class UnknownOpError(RlxError, KeyError):
    """An op name that the registry does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class RegistrationError(RlxError, TypeError):
    """A kernel registered for an unknown op, or with a signature that does not fit the op's spec."""


class UnsupportedError(RlxError):
    """A backend does not support this op/dtype/device combination (declared)."""


class ResultsWriteError(RlxError):
    """The results (journal or results.json) could not be written: a full disk, a folder gone."""


class KernelContractError(RlxError):
    """A kernel broke the call convention: wrong output count, shape or dtype, or not an array."""


# the folder that holds the rlx_conformance package (site-packages, or a checkout's root)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _short_path(filename: str, module: str | None = None) -> str:
    """A traceback frame's file as the package or library names it, not this machine's path:
    from the frame's module where it has one (``rlx_conformance.backends.mlx`` ->
    ``rlx_conformance/backends/mlx/__init__.py``, the same from a checkout, whose backends/ the
    package maps, as from an install; ``mlx.nn.layers.activations`` ->
    ``mlx/nn/layers/activations.py``), else past the longest ``sys.path`` entry (or the checkout's
    root) that holds it. Records and reports then read the same on every machine."""
    if module and module != "__main__" and filename.endswith(".py"):
        tail = "/__init__.py" if os.path.basename(filename) == "__init__.py" else ".py"
        return module.replace(".", "/") + tail
    roots = [r for r in (p.rstrip(os.sep) for p in (*sys.path, _ROOT) if isinstance(p, str))
             if r and filename.startswith(r + os.sep)]
    return filename[len(max(roots, key=len)) + 1:] if roots else filename


def error_detail(e: BaseException, frames: int = 2) -> str:
    """A failing kernel's record message: the exception (an RlxError's text alone), then where it
    was raised, the last ``frames`` frames with package-relative paths."""
    if isinstance(e, RlxError):
        return str(e)
    where = ""
    for frame, lineno in list(traceback.walk_tb(e.__traceback__))[-frames:]:
        code = frame.f_code
        where += f'  File "{_short_path(code.co_filename, frame.f_globals.get("__name__"))}", line {lineno}, in {code.co_name}\n'
        line = linecache.getline(code.co_filename, lineno).strip()
        if line:
            where += f"    {line}\n"
    return f"{type(e).__name__}: {e}\n{where}".strip()
