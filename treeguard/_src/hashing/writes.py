"""Writing hashed: ``write_hashed`` writes buffers to a file while their
chunks are hashed, ``copy_hashed`` copies them into memory the same way."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from .engine import (
    CHUNK,
    Algorithm,
    Pipeline,
    digest,  # noqa: F401 - the examples use it
)

#: The most bytes one ``write`` call copies into the kernel. A shorter copy is
#: a shorter stretch of kernel time no other thread can preempt: a background
#: save's writes then leave the cores to a training step at once (and a
#: write of this size is no slower than a whole chunk's).
WRITE_PIECE = 256 * 1024


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

      Buffers that overfill ``dest``, or leave some of it unwritten, are
      refused, and no hashing thread is left running:

      >>> copy_hashed(memoryview(bytearray(2)), [memoryview(b"abc")], "blake3")
      Traceback (most recent call last):
      ...
      ValueError: the buffers hold more than the 2 bytes of dest
      >>> copy_hashed(memoryview(bytearray(4)), [memoryview(b"abc")], "sha256")
      Traceback (most recent call last):
      ...
      ValueError: the buffers hold 3 bytes, dest 4
      >>> import threading
      >>> [t.name for t in threading.enumerate() if t.name.startswith("treeguard-hash")]
      []
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
