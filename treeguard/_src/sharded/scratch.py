"""The host memory a sharded read fills: aligned buffers on small pages,
and a pool of scratch buffers bounded in bytes.

A saved shard that is no target shard of this process (a reshard) is read
into a scratch buffer, its pieces copied on, and the buffer read into again:
fresh memory costs its page faults, memory already faulted in does not.
The pool hands out any free buffer large enough (the smallest such), so
shards of many sizes share a few buffers, and keeps at most ``limit`` bytes
of free ones (the smallest dropped first), so a read of arrays of ``k``
distinct shard sizes never holds ``k`` buffers of each.
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from ..hashing import prefault, small_pages

#: The alignment of every buffer read into: on the CPU backend, JAX places an
#: array this aligned on a device without copying it.
ALIGN = 64


def aligned(
    shape: tuple[int, ...], dtype: np.dtype[Any], *, fault: bool = True
) -> np.ndarray[Any, Any]:
    """An uninitialised C-order array whose data starts on an ``ALIGN``
    boundary, on small pages, faulted in at once unless ``fault`` is False
    (the fetch that fills it does so in its own thread): a reshard's first
    load into fresh memory taken a fault at a time, on the huge pages numpy
    asks for, spent more CPU in the copies than the reads and hashes did."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    small_pages(memoryview(raw.data))  # no stall compacting memory for a huge page
    if fault:
        prefault(memoryview(raw.data))  # and every page in one call, not a fault at a time
    skip = -raw.ctypes.data % ALIGN
    out: np.ndarray[Any, Any] = raw[skip : skip + nbytes].view(dtype).reshape(shape)
    return out


class Scratch:
    """Free scratch buffers, reused by capacity, at most ``limit`` bytes of them.

    ``take`` gives a buffer of a shape and dtype (a view of the start of the
    smallest free buffer that holds it, or a new one); ``give`` takes one
    back once nothing reads it. ``held`` is the bytes of free buffers now,
    ``peak`` the most there were.

    Args:
      limit: the most bytes of free buffers kept.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        #: free buffers (flat uint8, aligned), by capacity, smallest first
        self._sizes: list[int] = []
        self._free: list[np.ndarray[Any, Any]] = []
        self.held = 0
        self.peak = 0

    def take(
        self, shape: tuple[int, ...], dtype: np.dtype[Any], *, fault: bool
    ) -> np.ndarray[Any, Any]:
        """A buffer of ``shape`` and ``dtype``, C order, aligned; faulted in
        when new unless ``fault`` is False."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        at = bisect.bisect_left(self._sizes, nbytes)
        if at == len(self._sizes) or nbytes == 0:
            return aligned(shape, dtype, fault=fault)
        del self._sizes[at]
        raw = self._free.pop(at)
        self.held -= raw.nbytes
        out: np.ndarray[Any, Any] = raw[:nbytes].view(dtype).reshape(shape)
        return out

    def give(self, buf: np.ndarray[Any, Any]) -> None:
        """Takes back ``buf`` (from ``take``), its whole capacity; drops the
        smallest free buffers while more than ``limit`` bytes are free."""
        flat = _capacity(buf)
        at = bisect.bisect_left(self._sizes, flat.nbytes)
        self._sizes.insert(at, flat.nbytes)
        self._free.insert(at, flat)
        self.held += flat.nbytes
        while self.held > self._limit and self._free:
            self._sizes.pop(0)
            self.held -= self._free.pop(0).nbytes
        self.peak = max(self.peak, self.held)


def _capacity(buf: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The whole aligned uint8 buffer that ``buf`` (from ``aligned``, or a
    view of its start) begins: its capacity, as a flat array."""
    base = buf
    while isinstance(base.base, np.ndarray):
        base = base.base
    # ``base`` is the raw allocation of ``aligned``: ALIGN spare bytes around an aligned span
    start = buf.ctypes.data - base.ctypes.data
    flat: np.ndarray[Any, Any] = base[start : start + base.nbytes - ALIGN]
    return flat
