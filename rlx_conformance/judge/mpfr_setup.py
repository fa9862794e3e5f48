"""gmpy2 (MPFR), imported for the precise oracle (precise.py) and its fast path
(precise_fast.py) with the process's SIGFPE handling left as it was. Both import this module
before using gmpy2, so whichever loads first sets it up."""
from __future__ import annotations

import signal

import gmpy2  # noqa: F401 — imported here first, for the handler reset below

# Importing gmpy2 installs GMP's SIGFPE handler, which prints "gmp: overflow in mpz type" and
# aborts: a kernel's own SIGFPE (MLX's integer INT_MIN / -1) would then read as SIGABRT from GMP.
# The oracle never relies on it (MPFR reports through flags, not signals), so restore the default.
try:
    signal.signal(signal.SIGFPE, signal.SIG_DFL)
except ValueError:  # imported off the main thread: signals can only be set from it
    pass
