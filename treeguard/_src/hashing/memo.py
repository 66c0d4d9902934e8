"""The digest memo: what a verified load learned of each device array it
handed back, so that a later put of the same array object need not bring
its bytes to the host and hash them again.

An entry says: this very ``jax.Array`` object holds bytes whose digest
(under this algorithm) is this, as this dtype and shape. It is made only
by a load that checked every byte against that digest before it handed
the array back (``checkpoint/read.py``), and read only by a put
(``store/tensors.py``), which uses the digest to find the tensor object the
store already holds instead of hashing the array's bytes.

Why an entry is never wrong:

* Only ``jax.Array`` objects are remembered, never numpy arrays: a jax
  array's value cannot change (every operation makes a new array), while a
  numpy array can be written in place (``a[0] = 1``; ``flags.writeable``
  can be set back to True on an array that owns its memory), so a digest
  of a numpy array's bytes says nothing of its bytes later. A load that
  hands one buffer back both as a numpy leaf and as a jax array (one tensor
  named by two leaves) remembers neither: on the CPU a jax array may share
  that numpy buffer. (Memory changed from outside Python, through DLPack
  or a debugger, is beyond any memo, as it is beyond jax itself.)
* Entries are keyed by the object's identity, and each holds a weak
  reference to its object: a lookup matches only if the reference still
  gives that very object (``ref() is x``), so an object freed and a new one
  made at the same address (the same ``id``) never matches; the reference's
  callback drops the entry when its object is freed.
* A deleted array (``x.delete()``, or a buffer donated to a jitted
  function) holds no bytes: it never matches, and its entry is dropped at
  the lookup.
* An entry matches only for its algorithm, and only if the array's dtype
  and shape are still those recorded.

The memo holds no array alive and no bytes: an entry is a weak reference,
a digest and a dtype and shape.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from .engine import Algorithm


@dataclasses.dataclass(frozen=True)
class _Entry:
    ref: weakref.ref[Any]
    algorithm: Algorithm
    digest: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


# reentrant: a weak reference's callback may run on a thread that holds it
# (a garbage collection started inside remember)
_LOCK = threading.RLock()
_ENTRIES: dict[int, _Entry] = {}


def _is_device_array(x: Any) -> bool:
    """Whether ``x`` is a concrete, live ``jax.Array`` (never a tracer)."""
    jax = sys.modules.get("jax")  # no jax array exists unless jax was imported
    if jax is None or not isinstance(x, jax.Array) or isinstance(x, jax.core.Tracer):
        return False
    return not x.is_deleted()


def remember(
    x: Any, algorithm: Algorithm, digest: str, dtype: np.dtype[Any], shape: Sequence[int]
) -> bool:
    """Records that ``x`` holds bytes of ``digest``: call only once every
    byte of ``x`` was checked against it. Returns whether it was recorded
    (only a live ``jax.Array`` of that dtype and shape is)."""
    shape = tuple(int(d) for d in shape)
    if not _is_device_array(x) or x.dtype != dtype or tuple(x.shape) != shape:
        return False
    key = id(x)

    def gone(ref: weakref.ref[Any]) -> None:
        with _LOCK:
            entry = _ENTRIES.get(key)
            if entry is not None and entry.ref is ref:
                del _ENTRIES[key]

    entry = _Entry(weakref.ref(x, gone), algorithm, digest, np.dtype(dtype), shape)
    with _LOCK:
        _ENTRIES[key] = entry
    return True


def known(x: Any, algorithm: Algorithm) -> str | None:
    """The digest of ``x``'s bytes under ``algorithm`` if a verified load
    recorded it for this very object, else None."""
    with _LOCK:
        entry = _ENTRIES.get(id(x))
    if entry is None or not _alive_as(entry, x):
        return None
    if not _is_device_array(x):  # deleted, or donated, since
        drop(x)
        return None
    if entry.algorithm != algorithm or x.dtype != entry.dtype or tuple(x.shape) != entry.shape:
        return None
    return entry.digest


def drop(x: Any) -> None:
    """Drops ``x``'s entry, if it has one."""
    with _LOCK:
        entry = _ENTRIES.get(id(x))
        if entry is not None and _alive_as(entry, x):
            del _ENTRIES[id(x)]


def _alive_as(entry: _Entry, x: object) -> bool:
    """Whether ``entry``'s object is alive and is ``x`` itself (not another
    object that took a freed one's ``id``)."""
    return entry.ref() is x


def held() -> set[int]:
    """The ``id`` of every array the memo holds an entry for (each alive)."""
    with _LOCK:
        return set(_ENTRIES)


class Carried:
    """The digests the memo knew of the arrays a host copy was made from,
    for those copies (a non-blocking put's, ``ArtifactStore.put(block=False)``).

    A copy's digest is its array's: the array's bytes cannot change (a jax
    array is immutable), the copy is made from them before the call
    returns, and it is held only by the put, which writes nothing into it.
    A copy is matched by identity (``is``), never by ``id`` alone; it is
    never entered in the memo, whose entries stay jax arrays only.

    Args:
      algorithm: the put's hash algorithm.
    """

    def __init__(self, algorithm: Algorithm) -> None:
        self._algorithm = algorithm
        self._copies: dict[int, tuple[Any, str]] = {}

    def add(self, array: Any, copy: Any) -> None:
        """Carries ``array``'s digest, if the memo knows it, to ``copy``
        (made from it just now, with its dtype and shape)."""
        found = known(array, self._algorithm)
        if found is not None and copy.dtype == array.dtype and copy.shape == array.shape:
            self._copies[id(copy)] = (copy, found)

    def known(self, x: Any, algorithm: Algorithm) -> str | None:
        """The digest of ``x``'s bytes: a copy's carried one, or the memo's."""
        carried = self._copies.get(id(x))
        if carried is not None and carried[0] is x and algorithm == self._algorithm:
            return carried[1]
        return known(x, algorithm)
