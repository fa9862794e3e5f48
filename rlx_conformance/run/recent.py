"""The last few references a worker computed, by key: the cases of one input id differ only in
target (or in a layout that leaves the values alone) and run back to back, so one worker makes
their inputs and reference once. A reference that raised is kept as its exception, which each
case records as its error."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """``make(key_source)`` memoised for the last ``size`` keys (``key(key_source)``); an
    exception from ``make`` is cached and returned, not raised."""

    def __init__(self, make: Callable[[K], V], key: Callable[[K], str], size: int = 4):
        self.make, self.key, self.size = make, key, size
        self._d: OrderedDict[str, V | Exception] = OrderedDict()

    def get(self, item: K) -> V | Exception:
        k = self.key(item)
        hit = self._d.get(k)
        if hit is None:
            try:
                hit = self.make(item)
            except Exception as e:  # noqa: BLE001 — recorded as the case's error
                hit = e
            self._d[k] = hit
            if len(self._d) > self.size:
                self._d.popitem(last=False)
        return hit
