"""How old an object gc deletes as a dead put's must be (``RetentionPolicy.orphan_grace_s``).

In a bucket, a put's objects are there before its record (a sharded put's
shards, a dedup put's tensors, a checkpoint object): gc cannot tell a put
that died from one still uploading, and removing a live one's makes it
fail. So gc deletes such an object only once it is older than the grace.
Ages come from the storage's own clock, never the client's: the time
each object was last written (a bucket's ``LastModified``) against the
time the server gives an object gc writes and deletes at once
(``ObjectStorage.now``), read once per ``Grace``. Where that clock cannot
be read (the write failed), every object is taken as young: gc goes on,
deletes none of them and warns (``RuntimeWarning``), and the next gc looks
again. ``LastModified`` has whole seconds, so an age is known to a second.
"""

from __future__ import annotations

import math
import warnings
from typing import Protocol

from ..errors import StorageError


class Clocked(Protocol):
    """What a grace asks of the storage: its objects' ages on its own clock."""

    def modified(self, prefix: str) -> dict[str, float]:
        """When each object directly under ``prefix`` was last written, in
        seconds since the epoch by the storage's clock."""
        ...

    def now(self) -> float:
        """The storage's clock now, in seconds since the epoch."""
        ...


class Grace:
    """The objects younger than ``seconds`` on ``storage``'s clock; a grace
    of 0 spares none and asks the storage nothing.

    Args:
      storage: the objects' storage.
      seconds: how old an object must be to be deleted.
    """

    def __init__(self, storage: Clocked, seconds: float) -> None:
        self._storage, self._seconds = storage, seconds
        self._now: float | None = None

    def young(self, prefix: str) -> set[str]:
        """The objects directly under ``prefix`` written less than the grace
        ago (or after the storage's clock was read: their age is below 0)."""
        if self._seconds <= 0:
            return set()
        written = self._storage.modified(prefix)
        if not written:
            return set()
        if self._now is None:
            try:
                self._now = self._storage.now()
            except StorageError as e:  # no clock: nothing is old (gc has removed versions already)
                self._now = -math.inf
                warnings.warn(
                    f"gc could not read the storage's clock ({type(e).__name__}): it kept"
                    " every object of a put with no record, however old; the next gc"
                    " looks again. If this repeats, check that the store may write and"
                    " delete objects under clock/",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return {name for name, at in written.items() if self._now - at < self._seconds}
