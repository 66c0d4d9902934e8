"""One object in a bucket read at any offset, as the hashing engine and the
checkpoint reader read a file (a ``hashing.RangeReader``): ``ObjectReader``,
its bytes fetched as they are read, by ``ObjectStorage.stream_range`` in a
thread that pulls them ahead of the reader (``download.Download``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .download import Download
from .etags import Pin
from .objects import ObjectStorage


class ObjectReader:
    """One object's bytes at any offset, for the hashing engine and the
    checkpoint reader (a ``hashing.RangeReader``), fetched as they are read.

    Its first bytes come with its size and etag, in the one request that
    makes it (``open_reader``), and are kept: a header is parsed more than
    once. A read elsewhere is served by a streamed GET that a thread of its
    own (``Download``) pulls ahead of the reader, so the next chunks arrive
    while the last ones are copied into the caller's buffer and hashed; a
    read that continues where the last one ended continues the same
    stream: a whole checkpoint is one GET of its data. A GET runs to the
    end of the planned range it starts in (``plan``, which also starts the
    first one), to the end of the object when there is no plan, or covers
    only the bytes asked for when the read lies outside every planned
    range. Every GET carries ``If-Match`` with the etag read when the reader
    was made, so an object replaced meanwhile fails the read
    (``FormatError``) instead of mixing two objects; for the same reason a
    stream broken by the network or a 5xx, or cut short by an answer that
    lied, is resumed where it stopped (``ObjectStorage.stream_range``: after
    the last try, a ``StorageError`` naming the object). A 412 is taken
    for a replaced object only once the object's HEAD agrees: a first
    answer whose ETag lied, the first bytes being the same under the HEAD's,
    goes on under the HEAD's ETag (``ObjectStorage._refused``; ``Pin``).
    """

    def __init__(self, storage: ObjectStorage, name: str, meta: Any, head: bytes) -> None:
        self._storage = storage
        self._name = name
        self._size = int(meta["size"])
        self._head = head
        self._pin = Pin(meta.get("e_tag"), head)
        self._plan: Sequence[tuple[int, int]] | None = None
        self._download: Download | None = None
        self._pos = 0
        self._until = 0  # where the download under way ends
        self._left = memoryview(b"")
        #: how many bytes the server sent so far, in every request
        self.fetched = len(head)

    def size(self) -> int:
        return self._size

    def plan(self, ranges: Sequence[tuple[int, int]] | None) -> None:
        """The ``(offset, length)`` ranges the next reads will cover (None:
        read to the end of the object; empty: fetch only what each read
        asks). The download of the first range beyond the kept first bytes
        starts at once."""
        self._plan = ranges
        self.close()
        start = len(self._head)
        if ranges is None:
            self._open(start, self._size - start)
            return
        for offset, length in ranges:
            if offset + length > start:
                self._open(max(offset, start), offset + length - max(offset, start))
                return

    def close(self) -> None:
        """Stops the download under way, if any, and joins its thread."""
        if self._download is not None:
            self._download.close()
        self._download, self._left = None, memoryview(b"")

    def pread_into(self, buf: memoryview, offset: int) -> int:
        want = max(0, min(len(buf), self._size - offset))
        done = max(0, min(want, len(self._head) - offset))
        buf[:done] = self._head[offset : offset + done]
        if done == want:
            return done
        if self._download is None or offset + done != self._pos:
            self._open(offset + done, want - done)
        while done < want:
            if not self._left:
                chunk = self._download.next() if self._download is not None else None
                if chunk is None and self._pos == self._until < self._size:
                    self._open(self._pos, want - done)  # a GET ended where it was planned to
                    continue
                if chunk is None:
                    break  # the object ended early
                self._left = memoryview(chunk)
            n = min(len(self._left), want - done)
            buf[done : done + n] = self._left[:n]
            self._left = self._left[n:]
            done += n
            self._pos += n
        return done

    def _stop(self, offset: int, want: int) -> int:
        if self._plan is None:
            return self._size
        for start, length in self._plan:
            if start <= offset < start + length:
                return max(start + length, offset + want)
        return offset + want

    def _open(self, offset: int, want: int) -> None:
        self.close()
        self._pos = offset
        stop = self._until = min(self._stop(offset, want), self._size)
        if stop > offset:
            self._download = Download(self._pulling(offset, stop))

    def _pulling(self, start: int, stop: int) -> Callable[[Callable[[Any], None]], None]:
        """Pulls the bytes of ``[start, stop)``, handing each part over as it
        arrives (``ObjectStorage.stream_range``)."""

        def pull(put: Callable[[Any], None]) -> None:
            def each(part: memoryview) -> None:
                self.fetched += len(part)
                put(part)

            self._storage.stream_range(self._name, (start, stop), self._pin, each)

        return pull


def open_reader(storage: ObjectStorage, name: str) -> ObjectReader | None:
    """A ``RangeReader`` of object ``name``, or None if there is no such
    object. Its first bytes, size and etag come in one ranged GET
    (``ObjectStorage.first_bytes``)."""
    found = storage.first_bytes(name)
    return None if found is None else ObjectReader(storage, name, *found)
