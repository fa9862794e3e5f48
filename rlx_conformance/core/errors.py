"""Exceptions the harness raises on purpose. Each carries a one-line message meant for a user."""


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
