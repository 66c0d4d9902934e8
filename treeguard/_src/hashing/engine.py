"""The algorithms, ``digest`` and the ``Pipeline`` every other hashing
function feeds: chunks hashed by worker threads while the caller moves the
next ones.

Two algorithms: ``"blake3"`` (the default for everything written now; one
hasher uses every core, the ``blake3`` package's ``max_threads``, so one
worker thread is enough and a single large tensor is hashed in parallel)
and ``"sha256"`` (files written before BLAKE3, and on request; a hasher runs
on one core, so one worker per core each takes whole items).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import re
import threading
from collections.abc import Hashable, Iterable
from typing import Any, Literal

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
#: Chunks queued per worker besides the one it is hashing.
DEPTH = 2


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


def hasher(algorithm: Algorithm) -> Any:
    """An incremental hasher on one core (``update(buf)``, ``hexdigest()``),
    for bytes hashed as they arrive.

    Example:
      >>> h = hasher("sha256")
      >>> h.update(b"ab"); h.update(b"c")
      >>> h.hexdigest() == digest(b"abc", "sha256")
      True
    """
    return _new(check_algorithm(algorithm), 1)


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


class _Runs:
    """Buffers fed as one item, iterated by the worker that hashes them."""

    def __init__(self, runs: Iterable[Any]) -> None:
        self.runs = runs


def _workers(
    algorithm: Algorithm, items: int, threads: int | None = None, whole: bool = False
) -> int:
    if algorithm == "blake3" and not whole:  # one hasher already spreads over every core
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
      whole: hash each key on one core, one worker per core, also for
        BLAKE3 (for many keys of a few MiB each, which one hasher would
        split over threads at more cost than it saves).

    Example:
      >>> with Pipeline("sha256", items=2) as p:
      ...     p.feed("a", b"ab")
      ...     p.feed("a", b"c")
      ...     p.feed("b", b"")
      ...     found = p.digests()
      >>> found["a"] == digest(b"abc", "sha256"), len(found)
      (True, 2)

      Many BLAKE3 items, each hashed whole on one core, one worker per core:

      >>> with Pipeline("blake3", items=8, whole=True) as p:
      ...     for k in range(8):
      ...         p.feed(k, bytes([k]) * 5000)
      ...     found = p.digests()
      >>> found[3] == digest(bytes([3]) * 5000, "blake3"), p.workers == min(8, os.cpu_count() or 1)
      (True, True)
    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        items: int = 1,
        threads: int | None = None,
        whole: bool = False,
    ) -> None:
        self.algorithm = check_algorithm(algorithm)
        self._threads_per_hasher = 1 if whole else threads
        n = _workers(self.algorithm, items, threads, whole)
        self._queues: list[queue.Queue[tuple[Hashable, Any] | None]] = [
            queue.Queue(DEPTH) for _ in range(n)
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
                if isinstance(chunk, _Runs):
                    update = self._hashers[key].update
                    for run in chunk.runs:
                        update(run)
                else:
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
        caller reusing buffers may reuse one per worker once ``DEPTH + 1``
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

    def feed_runs(self, key: Hashable, runs: Iterable[Any]) -> None:
        """Hands the buffers ``runs`` yields (the next bytes of ``key``, in
        order) to its worker, which iterates them itself: many small pieces
        of memory, hashed as one item, off the caller's thread.

        Example:
          >>> rows = [b"ab", b"c"]
          >>> with Pipeline("blake3", items=1, whole=True) as p:
          ...     p.feed_runs("k", iter(rows))
          ...     found = p.digests()
          >>> found["k"] == digest(b"abc", "blake3")
          True
        """
        lane = self.lane(key)
        if self._inline:
            for run in runs:
                self._hashers[key].update(run)
            return
        self._put(self._queues[lane], (key, _Runs(runs)))

    def digests(self) -> dict[Hashable, str]:
        """Waits for every chunk fed; returns each key's hex digest.

        Raises:
          RuntimeError: if the pipeline was closed first (its digests would
            leave out the chunks it dropped).

        Example:
          >>> p = Pipeline("sha256")
          >>> p.close()
          >>> p.digests()
          Traceback (most recent call last):
          ...
          RuntimeError: the hashing pipeline was closed; its digests are incomplete
        """
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
