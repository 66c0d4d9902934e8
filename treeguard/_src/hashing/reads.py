"""Reading hashed: ``read_spans`` reads file ranges straight into their
destination buffers (the arrays' final memory) while their chunks are
hashed; ``hash_ranges`` and ``hash_file`` hash ranges keeping none of the
bytes.

Reading a file into memory, a few reader threads ``preadv`` the chunks at
once: each read also takes the page faults of the freshly allocated memory
it fills (the larger part of a load's cost where first touching memory is
dear), so they are taken on several cores while the chunks already read
are hashed; the chunks are still hashed in order. The reader threads are
named ``treeguard-hash-read_N``; they are joined before any call here
returns or raises.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from .engine import (
    CHUNK,
    DEPTH,
    THREAD_PREFIX,
    Algorithm,
    Pipeline,
    digest,  # noqa: F401 - the examples use it
)
from .sources import ShortRead, Source, pread_into

#: The most threads that read one call's chunks from a file at once.
MAX_READERS = 8
#: Linux's ``madvise`` advice that faults in a range's pages for writing.
_MADV_POPULATE_WRITE = 23
_MADV_NOHUGEPAGE = 15
_PAGE = mmap.PAGESIZE
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
#: The cores, counted once (glibc reads a file in /sys to count them).
_CORES = os.cpu_count() or 1


def prefault(buf: memoryview) -> None:
    """Faults in the whole pages inside ``buf`` before it is written, in one
    call into the kernel (``MADV_POPULATE_WRITE``, Linux 5.14 and later),
    without holding the GIL: cheaper than taking each fault as a ``preadv``
    first writes the page, and several threads can do it at once. Does
    nothing elsewhere, for a read-only or tiny buffer, or where the kernel
    refuses the advice (the pages are then faulted in as they are written).

    Example:
      >>> buf = memoryview(bytearray(3 * mmap.PAGESIZE))
      >>> prefault(buf)
      >>> bytes(buf[:2])
      b'\\x00\\x00'
    """
    _advise(buf, _MADV_POPULATE_WRITE)


def small_pages(buf: memoryview) -> None:
    """Advises the kernel to back the whole pages inside ``buf`` with small
    pages (``MADV_NOHUGEPAGE``). numpy asks for transparent huge pages on
    large arrays; where the kernel compacts memory to find one, a first
    touch can stall, and a buffer filled once and handed on gains nothing
    from them. Does nothing elsewhere, or for a buffer under two pages.

    Example:
      >>> buf = memoryview(bytearray(3 * mmap.PAGESIZE))
      >>> small_pages(buf)
      >>> len(buf) == 3 * mmap.PAGESIZE
      True
    """
    _advise(buf, _MADV_NOHUGEPAGE)


def _advise(buf: memoryview, advice: int) -> None:
    """``madvise`` over the whole pages inside a writable ``buf`` of two pages or more."""
    if _LIBC is None or buf.readonly or len(buf) < 2 * _PAGE:
        return
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    first = -(-start // _PAGE) * _PAGE
    end = (start + len(buf)) // _PAGE * _PAGE
    if end > first:
        _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), advice)


@dataclasses.dataclass(frozen=True)
class Span:
    """One range of a file to read into memory and hash.

    Attributes:
      offset: the file offset of its first byte.
      dest: the writable buffer it is read into (its length is the span's);
        the array's final memory, so nothing is copied afterwards.
      expected: the digest it should have, or None.
    """

    offset: int
    dest: memoryview
    expected: str | None = None


def read_spans(
    fd: Source,
    spans: Sequence[Span],
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
    readers: int | None = None,
) -> list[str]:
    """Reads every span into its buffer while its chunks are hashed; returns
    the digest of each span's bytes, in order.

    Reader threads read (and fault in) the next chunks while a worker hashes
    the chunks already read, in order. Every thread is joined before this
    returns or raises.

    Args:
      fd: a descriptor open for reading.
      spans: the ranges, in any order (reading them in file order is fastest).
      algorithm: ``"blake3"`` or ``"sha256"``.
      chunk: the bytes read and handed over at a time.
      progress: called as ``progress(bytes_read, bytes_total)`` after each
        chunk, in the calling thread.
      readers: how many threads read at once; None: one per core, at most
        ``MAX_READERS`` (a ``RangeReader`` is always read by one).

    Returns:
      One hex digest per span.

    Raises:
      ShortRead: if the file ends before a span (naming its position).
      OSError: if a read fails.

    Example:
      >>> import os, tempfile
      >>> fd, path = tempfile.mkstemp()
      >>> _ = os.write(fd, b"0123456789")
      >>> a, b = bytearray(3), bytearray(4)
      >>> found = read_spans(fd, [Span(0, memoryview(a)), Span(5, memoryview(b))], "blake3")
      >>> bytes(a), bytes(b), found[1] == digest(b"5678", "blake3")
      (b'012', b'5678', True)
      >>> os.close(fd)
    """
    ranges = [(s.offset, len(s.dest)) for s in spans]
    return _read_hashed(
        fd,
        ranges,
        algorithm,
        chunk=chunk,
        progress=progress,
        target=lambda i, start, n: spans[i].dest[start : start + n],
        readers=_readers(fd, ranges, chunk, readers),
    )


def _readers(fd: Source, ranges: Sequence[tuple[int, int]], chunk: int, asked: int | None) -> int:
    """How many threads read these ranges into their buffers: ``asked``, or
    one per core (at most ``MAX_READERS``), and no more than there are
    chunks, for a file; one for a ``RangeReader``, whose bytes arrive in order."""
    if not isinstance(fd, int):
        return 1
    chunks = sum(-(-n // chunk) for _, n in ranges) if chunk > 0 else 1
    wanted = asked if asked is not None else min(MAX_READERS, _CORES)
    return max(1, min(wanted, chunks))


def _read_hashed(
    fd: Source,
    ranges: Sequence[tuple[int, int]],
    algorithm: Algorithm,
    *,
    chunk: int,
    progress: Callable[[int, int], None] | None,
    target: Callable[[int, int, int], memoryview],
    pipeline: Pipeline | None = None,
    readers: int = 1,
) -> list[str]:
    """Reads each range chunk by chunk into ``target(i, start, length)`` and
    feeds it to the pipeline (a fresh one unless given), then waits for
    every digest. With ``readers`` above one, that many threads read the
    chunks, fewer than two each in flight (``target`` must then give each chunk
    its own memory); the calling thread feeds each chunk in order once it is
    read, and calls ``progress``."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 byte, got {chunk}")
    total = sum(n for _, n in ranges)
    done = 0
    inflight: deque[tuple[int, memoryview, Future[int] | int]] = deque()
    pool = None
    with pipeline or Pipeline(algorithm, items=len(ranges)) as p:
        try:

            def settle() -> None:
                nonlocal done
                i, buf, read = inflight.popleft()
                if (read.result() if isinstance(read, Future) else read) != len(buf):
                    raise ShortRead(i)
                p.feed(i, buf)
                done += len(buf)
                if progress is not None:
                    progress(done, total)

            if readers > 1:
                pool = ThreadPoolExecutor(readers, thread_name_prefix=f"{THREAD_PREFIX}-read")
            for i, (offset, n) in enumerate(ranges):
                p.feed(i, b"")
                for start in range(0, n, chunk):
                    buf = target(i, start, min(chunk, n - start))
                    if pool is None:
                        inflight.append((i, buf, pread_into(fd, buf, offset + start)))
                    else:
                        inflight.append((i, buf, pool.submit(_fill, fd, buf, offset + start)))
                    while len(inflight) > 2 * (readers - 1):
                        settle()
            while inflight:
                settle()
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)
        found = p.digests()
    return [found[i] for i in range(len(ranges))]


def _fill(fd: Source, buf: memoryview, offset: int) -> int:
    """One reader's chunk: its fresh pages faulted in, then read (``pread_into``)."""
    prefault(buf)
    return pread_into(fd, buf, offset)


def mismatched(spans: Sequence[Span], found: Sequence[str]) -> list[int]:
    """The positions of the spans whose digest is not the expected one."""
    return [
        i
        for i, (s, d) in enumerate(zip(spans, found))
        if s.expected is not None and s.expected != d
    ]


def hash_ranges(
    fd: Source,
    ranges: Sequence[tuple[int, int]],
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> list[str]:
    """The digest of each ``(offset, length)`` range of a file, keeping none
    of the bytes: they pass through a few reused chunk buffers (the next
    chunk is read while the last ones are hashed), so memory stays at a few
    chunks per worker whatever the file's size.

    Raises:
      ShortRead: if the file ends before a range (naming its position).

    Example:
      >>> import os, tempfile
      >>> fd, path = tempfile.mkstemp()
      >>> _ = os.write(fd, b"0123456789")
      >>> hash_ranges(fd, [(2, 3)], "blake3") == [digest(b"234", "blake3")]
      True
      >>> os.close(fd)
    """
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 byte, got {chunk}")
    size = max(1, min(chunk, max((n for _, n in ranges), default=1)))
    pipeline = Pipeline(algorithm, items=len(ranges))
    # per worker, in flight at once: DEPTH queued, one being hashed, one being read
    rings: list[list[memoryview]] = [[] for _ in range(pipeline.workers)]
    turns = [0] * pipeline.workers

    def target(i: int, start: int, n: int) -> memoryview:
        w = pipeline.lane(i)
        if len(rings[w]) < DEPTH + 2:
            rings[w].append(memoryview(bytearray(size)))
        buf = rings[w][turns[w] % (DEPTH + 2)]
        turns[w] += 1
        return buf[:n]

    return _read_hashed(
        fd,
        ranges,
        algorithm,
        chunk=size,
        progress=progress,
        target=target,
        pipeline=pipeline,
    )


def hash_file(
    fd: int,
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """One digest over a whole file (its size when called), as ``hash_ranges``.

    Raises:
      ShortRead: if the file shrinks while it is read.

    Example:
      >>> import os, tempfile
      >>> fd, path = tempfile.mkstemp()
      >>> _ = os.write(fd, b"abc")
      >>> hash_file(fd, "sha256") == digest(b"abc", "sha256")
      True
      >>> os.close(fd)
    """
    size = os.fstat(fd).st_size
    return hash_ranges(fd, [(0, size)], algorithm, chunk=chunk, progress=progress)[0]
