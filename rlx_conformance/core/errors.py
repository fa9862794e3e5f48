"""Exceptions the harness raises on purpose. Each carries a one-line message meant for a user;
:func:`error_detail` words a kernel's own exception for a record."""

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


class KernelContractError(RlxError):
    """A kernel broke the call convention: wrong output count, shape or dtype, or not an array."""


# the folder that holds the rlx_conformance package (site-packages, or a checkout's root)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _short_path(filename: str) -> str:
    """A traceback frame's file as the package or library names it, not this machine's path
    (``rlx_conformance/backends/mlx/__init__.py``, ``mlx/nn/layers/activations.py``): the path
    past the longest ``sys.path`` entry that holds it (site-packages, a ``pip --target`` folder,
    PYTHONPATH), or past the folder that holds this package (a checkout's root, for an editable
    install). Records and reports then read the same on every machine."""
    roots = [r for r in (p.rstrip(os.sep) for p in (*sys.path, _ROOT)) if r and filename.startswith(r + os.sep)]
    return filename[len(max(roots, key=len)) + 1:] if roots else filename


def error_detail(e: BaseException, frames: int = 2) -> str:
    """A failing kernel's record message: the exception (an RlxError's text alone), then where it
    was raised, the last ``frames`` frames with package-relative paths."""
    if isinstance(e, RlxError):
        return str(e)
    tail = traceback.extract_tb(e.__traceback__)[-frames:]
    where = "".join(f'  File "{_short_path(f.filename)}", line {f.lineno}, in {f.name}\n'
                    + (f"    {f.line.strip()}\n" if f.line else "") for f in tail)
    return f"{type(e).__name__}: {e}\n{where}".strip()
