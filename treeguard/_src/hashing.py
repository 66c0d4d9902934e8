"""The one hashing engine: BLAKE3 and sha256, chunked, threaded, overlapped
with the reads and writes that move the bytes.

Every digest treeguard records or checks is computed here. Two algorithms:

* ``"blake3"`` (the default for everything written now): one hasher uses every
  core (the ``blake3`` package's ``max_threads``), so one worker thread is
  enough and a single large tensor is hashed in parallel;
* ``"sha256"`` (files written before BLAKE3, and on request): a hasher runs on
  one core, so one worker per core each takes whole items.

The engine is a pipeline: the calling thread moves a chunk (``preadv`` into
the array's final buffer, or a ``write`` of the leaf's own buffer) and hands
the same memory to a worker, then moves the next chunk while the worker
hashes the last one. No byte is copied after it is read. Reading a file into
memory, a few reader threads ``preadv`` the chunks at once: each read also
takes the page faults of the freshly allocated memory it fills (the larger
part of a load's cost where first touching memory is dear), so they are
taken on several cores while the chunks already read are hashed; the chunks
are still hashed in order. The threads are named ``treeguard-hash-N`` and
``treeguard-hash-read_N``; they are joined before any call here returns or
raises, so no hashing thread outlives a failed load.

The API:

* ``digest(buf, algorithm)``: the hex digest of bytes already in memory;
* ``Span(offset, dest, expected)`` and ``read_spans(fd, spans, algorithm)``:
  read any list of file ranges straight into their destination buffers and
  hash each, in one call; returns the digests found; ``read_spans_checked`` does
  the same and returns the spans whose digest is not their ``expected``;
* ``hash_ranges(fd, [(offset, length), ...], algorithm)``: the digest of
  each range, keeping none of the bytes (a few reused chunk buffers);
* ``write_hashed(fd, buffers, algorithm)``: write buffers while hashing them;
  ``copy_hashed(dest, buffers, algorithm)`` copies them into memory instead;
* ``Pipeline(algorithm)``: the streaming form under all of these: ``feed(key,
  chunk)`` any number of chunks per key, in order, then ``digests()``;
* ``hash_file(fd, algorithm)``: one digest over a whole file.

Where a function reads, its ``fd`` may also be a ``RangeReader``: bytes at
offsets that are not a file (an object in a bucket, fetched as it is read),
so a download is hashed while it arrives, into the arrays' final memory
(``BytesReader`` serves bytes already in memory the same way).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import mmap
import os
import queue
import re
import sys
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, Protocol

import blake3

Algorithm = Literal["blake3", "sha256"]
#: Every algorithm a digest may be recorded in, newest first.
ALGORITHMS: tuple[Algorithm, ...] = ("blake3", "sha256")
#: The algorithm new files are written with.
DEFAULT: Algorithm = "blake3"
#: Both algorithms give 32 bytes, written as 64 lowercase hex digits.
HEX_LEN = 64
HEX_RE = re.compile(r"^[0-9a-f]{64}$")
#: The bytes moved (read or written) and handed to a worker at a time.
CHUNK = 8 * 1024 * 1024
#: The name prefix of the hashing threads (a test counts them by it).
THREAD_PREFIX = "treeguard-hash"
#: The most bytes one ``write`` call copies into the kernel. A shorter copy is
#: a shorter stretch of kernel time no other thread can preempt: a background
#: save's writes then leave the cores to a training step at once (and a
#: write of this size is no slower than a whole chunk's).
WRITE_PIECE = 256 * 1024
#: Chunks queued per worker besides the one it is hashing.
_DEPTH = 2
#: The most threads that read one call's chunks from a file at once.
MAX_READERS = 8
#: Linux's ``madvise`` advice that faults in a range's pages for writing.
_MADV_POPULATE_WRITE = 23
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
    if _LIBC is None or buf.readonly or len(buf) < 2 * _PAGE:
        return
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    first = -(-start // _PAGE) * _PAGE
    end = (start + len(buf)) // _PAGE * _PAGE
    if end > first:
        _LIBC.madvise(ctypes.c_void_p(first), ctypes.c_size_t(end - first), _MADV_POPULATE_WRITE)


class RangeReader(Protocol):
    """Bytes at any offset of something that is not a file descriptor."""

    def size(self) -> int:
        """How many bytes there are."""
        ...

    def pread_into(self, buf: memoryview, offset: int) -> int:
        """Fills ``buf`` from ``offset``; how many bytes were read (fewer
        only at the end)."""
        ...


class BytesReader:
    """Bytes already in memory as a ``RangeReader``.

    Example:
      >>> buf = bytearray(2)
      >>> BytesReader(b"abc").pread_into(memoryview(buf), 2), bytes(buf)
      (1, b'c\\x00')
    """

    def __init__(self, data: Any) -> None:
        self._data = memoryview(data).cast("B")

    def size(self) -> int:
        return len(self._data)

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


def check_algorithm(name: Any, *, what: str = "digest") -> Algorithm:
    """``name`` as an ``Algorithm``, or a ``ValueError`` naming the choices.

    Example:
      >>> check_algorithm("blake3")
      'blake3'
      >>> check_algorithm("md5")
      Traceback (most recent call last):
      ...
      ValueError: digest must be one of 'blake3', 'sha256', got 'md5'
    """
    if name == "blake3":
        return "blake3"
    if name == "sha256":
        return "sha256"
    shown = repr(name[:40]) if isinstance(name, str) else type(name).__name__
    raise ValueError(f"{what} must be one of 'blake3', 'sha256', got {shown}")


def _new(algorithm: Algorithm, threads: int | None = None) -> Any:
    if algorithm == "blake3":
        return blake3.blake3(max_threads=threads or blake3.blake3.AUTO)
    return hashlib.sha256()


def digest(buf: Any, algorithm: Algorithm) -> str:
    """The hex digest of bytes in memory (every core for BLAKE3; the GIL is
    released either way).

    Args:
      buf: bytes, a memoryview or any C-contiguous buffer.
      algorithm: ``"blake3"`` or ``"sha256"``.

    Returns:
      64 lowercase hex digits.

    Example:
      >>> digest(b"abc", "sha256")[:16]
      'ba7816bf8f01cfea'
      >>> digest(b"abc", "blake3")[:16]
      '6437b3ac38465133'
    """
    h = _new(algorithm)
    h.update(buf)
    return str(h.hexdigest())


def _workers(algorithm: Algorithm, items: int, threads: int | None = None) -> int:
    if algorithm == "blake3":  # one hasher already spreads over every core
        return 1
    return max(1, min(items, threads or os.cpu_count() or 1))


class Pipeline:
    """Hashes chunks in worker threads while the caller moves the next ones.

    Chunks of one key are hashed in the order fed. Use it as a context
    manager: leaving it (normally or by an exception) stops and joins every
    worker. A chunk's memory must stay unchanged until ``digests()`` returns
    (the caller's arrays; nothing is copied).

    Args:
      algorithm: ``"blake3"`` or ``"sha256"``.
      items: how many keys will be fed at most (bounds the worker count).
      threads: how many threads may hash at once (None: one per core); a
        background save passes 1, leaving the other cores to the caller.

    Example:
      >>> with Pipeline("sha256", items=2) as p:
      ...     p.feed("a", b"ab")
      ...     p.feed("a", b"c")
      ...     p.feed("b", b"")
      ...     found = p.digests()
      >>> found["a"] == digest(b"abc", "sha256"), len(found)
      (True, 2)
    """

    def __init__(self, algorithm: Algorithm, *, items: int = 1, threads: int | None = None) -> None:
        self.algorithm = check_algorithm(algorithm)
        self._threads_per_hasher = threads
        n = _workers(self.algorithm, items, threads)
        self._queues: list[queue.Queue[tuple[Hashable, Any] | None]] = [
            queue.Queue(_DEPTH) for _ in range(n)
        ]
        self._owner: dict[Hashable, int] = {}
        self._hashers: dict[Hashable, Any] = {}
        self._failed: list[BaseException] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        #: Hash in the caller's thread: set when no thread can be started,
        #: as while the interpreter shuts down (Python 3.12 refuses new
        #: threads then; a save finishing at exit still hashes its bytes).
        self._inline = False
        try:
            for i, q in enumerate(self._queues):
                t = threading.Thread(
                    target=self._work, args=(q,), name=f"{THREAD_PREFIX}-{i}", daemon=True
                )
                t.start()
                self._threads.append(t)
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            self.close()
            self._stop.clear()
            self._threads = []
            self._inline = True

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _work(self, q: queue.Queue[tuple[Hashable, Any] | None]) -> None:
        while True:
            item = q.get()
            if item is None or self._stop.is_set():
                return
            key, chunk = item
            try:
                self._hashers[key].update(chunk)
            except BaseException as e:  # noqa: BLE001 - handed to the caller in digests()
                self._failed.append(e)
                self._stop.set()
                return

    def _put(self, q: queue.Queue[tuple[Hashable, Any] | None], item: Any) -> None:
        while True:
            if self._stop.is_set():
                self._raise_failed()
                raise RuntimeError("the hashing pipeline was closed; its digests are incomplete")
            try:
                q.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _raise_failed(self) -> None:
        """Raises, in the caller's thread, what a worker raised."""
        if self._failed:
            raise self._failed[0]

    @property
    def workers(self) -> int:
        """How many worker threads hash."""
        return len(self._threads)

    def lane(self, key: Hashable) -> int:
        """The worker that hashes ``key`` (chosen on first use, in turn).
        Each worker hashes its chunks in the order they were fed, so a
        caller reusing buffers may reuse one per worker once ``_DEPTH + 1``
        later chunks were fed to the same worker."""
        if key not in self._owner:
            self._owner[key] = len(self._owner) % len(self._queues)
            self._hashers[key] = _new(self.algorithm, self._threads_per_hasher)
        return self._owner[key]

    def feed(self, key: Hashable, chunk: Any) -> None:
        """Hands ``chunk`` (the next bytes of ``key``) to its worker."""
        lane = self.lane(key)
        if self._inline:
            self._hashers[key].update(chunk)
            return
        self._put(self._queues[lane], (key, chunk))

    def digests(self) -> dict[Hashable, str]:
        """Waits for every chunk fed; returns each key's hex digest."""
        if not self._inline:
            for q in self._queues:
                self._put(q, None)
        for t in self._threads:
            t.join()
        self._raise_failed()
        return {k: str(h.hexdigest()) for k, h in self._hashers.items()}

    def close(self) -> None:
        """Stops the workers (dropping chunks not yet hashed) and joins them."""
        self._stop.set()
        for q in self._queues:
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)
        for t in self._threads:
            t.join()


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


def read_spans_checked(
    fd: Source,
    spans: Sequence[Span],
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
    progress: Callable[[int, int], None] | None = None,
) -> list[tuple[int, str]]:
    """Reads every span into its buffer, hashing as it goes, and compares each
    digest with the span's ``expected``: one call for a whole load, or for a
    partial one that reads only some tensors.

    Returns:
      ``(position, digest found)`` for every span whose digest differs from
      its ``expected`` (empty when all match); the buffers are filled either
      way, and must not be used unless the list is empty.

    Raises:
      ShortRead: if the file ends before a span.

    Example:
      >>> import os, tempfile
      >>> fd, path = tempfile.mkstemp()
      >>> _ = os.write(fd, b"0123456789")
      >>> good = Span(0, memoryview(bytearray(4)), digest(b"0123", "blake3"))
      >>> bad = Span(4, memoryview(bytearray(2)), digest(b"xx", "blake3"))
      >>> [i for i, _ in read_spans_checked(fd, [good, bad], "blake3")]
      [1]
      >>> os.close(fd)
    """
    found = read_spans(fd, spans, algorithm, chunk=chunk, progress=progress)
    return [(i, found[i]) for i in mismatched(spans, found)]


def write_hashed(
    fd: int,
    buffers: Iterable[memoryview],
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
    threads: int | None = None,
    flush_every: int | None = None,
) -> list[str]:
    """Writes each buffer to ``fd`` (at its current position) while its
    chunks are hashed; returns one digest per buffer. ``buffers`` may be a
    generator (a leaf copied to the host only when its turn comes).
    ``threads`` bounds the hashing threads, as for ``Pipeline``.
    ``flush_every``: after each that many bytes, the written data is synced
    to disk by the writing thread itself (``fdatasync``), rather than later by
    the kernel's writeback threads: a writer at idle priority then does that
    work at idle priority too.

    Example:
      >>> import os, tempfile
      >>> fd, path = tempfile.mkstemp()
      >>> found = write_hashed(fd, [memoryview(b"ab"), memoryview(b"")], "sha256")
      >>> found[0] == digest(b"ab", "sha256"), os.path.getsize(path)
      (True, 2)
      >>> os.close(fd)
    """
    unsynced = 0

    def write(view: memoryview) -> None:
        nonlocal unsynced
        _write_all(fd, view)
        unsynced += len(view)
        if flush_every is not None and unsynced >= flush_every:
            unsynced = 0
            _datasync(fd)

    return _moved_hashed(write, buffers, algorithm, chunk=chunk, threads=threads)


def _datasync(fd: int) -> None:
    """``fdatasync`` where the system has it (not macOS), else ``fsync``."""
    sync = getattr(os, "fdatasync", None) or os.fsync
    sync(fd)


def copy_hashed(
    dest: memoryview,
    buffers: Iterable[memoryview],
    algorithm: Algorithm,
    *,
    chunk: int = CHUNK,
) -> list[str]:
    """Copies the buffers one after another into ``dest`` while their
    chunks are hashed, as ``write_hashed`` writes them to a file; returns one
    digest per buffer.

    Raises:
      ValueError: if the buffers do not fill ``dest`` exactly.

    Example:
      >>> dest = memoryview(bytearray(3))
      >>> found = copy_hashed(dest, [memoryview(b"ab"), memoryview(b"c")], "blake3")
      >>> bytes(dest), found[1] == digest(b"c", "blake3")
      (b'abc', True)
    """
    pos = 0

    def copy(view: memoryview) -> None:
        nonlocal pos
        if pos + len(view) > len(dest):
            raise ValueError(f"the buffers hold more than the {len(dest)} bytes of dest")
        dest[pos : pos + len(view)] = view
        pos += len(view)

    found = _moved_hashed(copy, buffers, algorithm, chunk=chunk, threads=None)
    if pos != len(dest):
        raise ValueError(f"the buffers hold {pos} bytes, dest {len(dest)}")
    return found


def _moved_hashed(
    move: Callable[[memoryview], None],
    buffers: Iterable[memoryview],
    algorithm: Algorithm,
    *,
    chunk: int,
    threads: int | None,
) -> list[str]:
    """Moves each buffer chunk by chunk with ``move`` while a worker hashes
    the chunks moved before; one digest per buffer."""
    with Pipeline(algorithm, items=os.cpu_count() or 1, threads=threads) as p:
        count = 0
        for i, buf in enumerate(buffers):
            count += 1
            p.feed(i, b"")
            for start in range(0, len(buf), chunk):
                view = buf[start : start + chunk]
                move(view)
                p.feed(i, view)
        found = p.digests()
    return [found[i] for i in range(count)]


def _write_all(fd: int, buf: memoryview) -> None:
    while len(buf):
        n = os.write(fd, buf[:WRITE_PIECE])
        buf = buf[n:]


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
    # per worker, in flight at once: _DEPTH queued, one being hashed, one being read
    rings: list[list[memoryview]] = [[] for _ in range(pipeline.workers)]
    turns = [0] * pipeline.workers

    def target(i: int, start: int, n: int) -> memoryview:
        w = pipeline.lane(i)
        if len(rings[w]) < _DEPTH + 2:
            rings[w].append(memoryview(bytearray(size)))
        buf = rings[w][turns[w] % (_DEPTH + 2)]
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
