"""A small map that forgets its least recently used entry when full: the one
home of the caches that keep what was worked out for the last few trees (a
structure walked, a header laid out, a program compiled for a sharding).
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


class Bounded(Generic[_K, _V]):
    """At most ``size`` entries; ``get`` makes an entry the most recently
    used, ``put`` forgets the least recently used one when full. Safe to
    share between threads. A copy (``pickle``, ``copy.deepcopy``: of an
    object that holds one, an updater sent to a worker) has its own lock
    and starts empty: what a map keeps was worked out in one process
    (programs compiled for its devices, the devices themselves, which do
    not pickle) and is worked out again where it is needed.

    Args:
      size: the most entries kept (at least 1).

    Raises:
      ValueError: if ``size`` is less than 1.

    Example:
      >>> kept = Bounded[str, int](2)
      >>> kept.put("a", 1); kept.put("b", 2)
      >>> kept.get("a")  # "a" is now the most recently used
      1
      >>> kept.put("c", 3)  # so "b" is forgotten
      >>> kept.get("b") is None, kept.get("c"), len(kept)
      (True, 3, 2)
      >>> import copy; len(copy.deepcopy(kept))
      0
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a bounded map keeps at least 1 entry, not {size}")
        self._size = size
        self._data: collections.OrderedDict[_K, _V] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: _K) -> _V | None:
        """The value kept for ``key``, or None."""
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: _K, value: _V) -> None:
        """Keeps ``value`` for ``key``, forgetting the least recently used
        entry if the map is full."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Forgets every entry."""
        with self._lock:
            self._data.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"size": self._size}  # neither the lock nor the entries (see the class)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._size = state["size"]
        self._data = collections.OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
