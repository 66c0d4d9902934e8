"""Where the hashing functions read from: a file descriptor, or a
``RangeReader`` (bytes at offsets that are not a file: an object in a
bucket fetched as it is read, or ``BytesReader``'s bytes in memory), which
may also take a plan of the ranges it will be asked for
(``PlannedReader``, told by ``announce``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable


class RangeReader(Protocol):
    """Bytes at any offset of something that is not a file descriptor."""

    def size(self) -> int:
        """How many bytes there are."""
        ...

    def pread_into(self, buf: memoryview, offset: int) -> int:
        """Fills ``buf`` from ``offset``; how many bytes were read (fewer
        only at the end)."""
        ...


@runtime_checkable
class PlannedReader(RangeReader, Protocol):
    """A ``RangeReader`` that is told what will be read before it is read:
    the optional part of the protocol. A bucket's object reader fetches
    exactly the announced ranges ahead of the reads; a source without
    ``plan`` is read the same way, unannounced."""

    def plan(self, ranges: Sequence[tuple[int, int]] | None) -> None:
        """The ``(offset, length)`` ranges the next reads cover, in file
        order, neighbours merged (None: to the end)."""
        ...


def announce(src: Source, ranges: Iterable[tuple[int, int]]) -> None:
    """Tells ``src`` the ``(offset, length)`` ranges the next reads cover,
    when it takes a plan (a ``PlannedReader``); a descriptor or another
    source is left alone. The ranges are sorted, neighbours merged into one
    and empty ones dropped, so a reader may fetch each run in one request.

    Example:
      >>> class Told(BytesReader):
      ...     def plan(self, ranges):
      ...         print(ranges)
      >>> announce(Told(b"0123456789"), [(6, 2), (0, 2), (2, 3), (9, 0)])
      [(0, 5), (6, 2)]
      >>> announce(0, [(0, 2)])  # a descriptor: nothing to tell
    """
    if isinstance(src, int) or not isinstance(src, PlannedReader):
        return
    merged: list[tuple[int, int]] = []
    for offset, length in sorted(ranges):
        if length <= 0:
            continue
        if merged and merged[-1][0] + merged[-1][1] >= offset:
            start = merged[-1][0]
            merged[-1] = (start, max(merged[-1][1], offset + length - start))
        else:
            merged.append((offset, length))
    src.plan(merged)


class BytesReader:
    """Bytes already in memory as a ``RangeReader``; with ``size``, the
    first bytes of a file of that size (a header standing for its file:
    what lies beyond them reads as nothing).

    Example:
      >>> buf = bytearray(2)
      >>> BytesReader(b"abc").pread_into(memoryview(buf), 2), bytes(buf)
      (1, b'c\\x00')
      >>> BytesReader(b"abc", size=10).size()
      10
    """

    def __init__(self, data: Any, *, size: int | None = None) -> None:
        self._data = memoryview(data).cast("B")
        self._size = len(self._data) if size is None else size

    def size(self) -> int:
        return self._size

    def pread_into(self, buf: memoryview, offset: int) -> int:
        n = max(0, min(len(buf), len(self._data) - offset))
        buf[:n] = self._data[offset : offset + n]
        return n


#: What the reading functions read from: a file descriptor or a ``RangeReader``.
Source = int | RangeReader


def source_size(src: Source) -> int:
    """The size of a file descriptor's file, or of a ``RangeReader``'s bytes."""
    return os.fstat(src).st_size if isinstance(src, int) else src.size()


class ShortRead(EOFError):
    """A file ended before a span it was asked for (it shrank while read).

    Attributes:
      index: the position of the span in the list given to ``read_spans``.
    """

    def __init__(self, index: int) -> None:
        super().__init__(f"span {index}: the file ended before it")
        self.index = index


def pread_into(fd: Source, buf: memoryview, offset: int) -> int:
    """Fills ``buf`` from ``offset``; returns how many bytes were read (fewer
    only where the file ends)."""
    if not isinstance(fd, int):
        return fd.pread_into(buf, offset)
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done
