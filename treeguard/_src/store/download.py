"""The thread that downloads an object ahead of its reader (``ObjectReader``
in objectreader.py): chunks pulled into a bounded queue, handed over in
order; and the hand-over of a streamed object's parts, never past its size."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from . import objecterrors

#: How many streamed chunks are downloaded ahead of the reader at most.
AHEAD = 4
#: The name of the thread that downloads ahead of a reader.
FETCH_THREAD = "treeguard-fetch"
#: How often a thread waiting on a full queue checks whether it was stopped.
_POLL = 0.05


def hand_over(
    parts: Iterable[Any],
    size: int,
    each: Callable[[int, memoryview], None],
    *,
    name: str,
    where: str,
    at: int | None = None,
) -> int:
    """Hands the ``parts`` of an object of ``size`` bytes (as its answer
    announced) to ``each(offset, part)`` in order; ``size``.

    Args:
      parts: the object's bytes, in order, as its answer streams them.
      size: the bytes its answer announced.
      each: given each part and its offset.
      name, where: the object's name and URL, for the error.
      at: where the range streamed starts in the object, for the error
        (None: the whole object).

    Raises:
      objecterrors.Contradicted: naming the object and its size, when the
        parts run past ``size`` (before the part that would, which is never
        handed over) or end short of it.
    """
    pos = 0
    for part in parts:
        n = len(part)
        if pos + n > size:
            raise objecterrors.stream_size(name, where, size, pos + n, more=True, at=at)
        each(pos, memoryview(part))
        pos += n
    if pos != size:
        raise objecterrors.stream_size(name, where, size, pos, more=False, at=at)
    return pos


class Stopped(Exception):
    """Raised to a ``Download``'s producer by a hand-over after ``close``:
    it ends the pulling (never a failed request, never tried again)."""


class Download:
    """Chunks pulled by a thread of their own (``FETCH_THREAD``), at most
    ``AHEAD`` of them ahead of the reader.

    ``next`` hands them over in order, then None, and raises in the
    reader's thread what the pulling raised. ``close`` stops the thread and
    joins it: it ends once the request in flight answers (every request has
    the client's timeout; during a pause before another try, once that
    try's request answers). Where no thread
    can be started (the interpreter shutting down), the chunks are pulled
    in the reader's thread, all of them before the first is handed over.

    Args:
      pull: given the function that hands over one chunk (which raises
        ``Stopped`` once ``close`` was called), pulls them all.
    """

    def __init__(self, pull: Callable[[Callable[[Any], None]], None]) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(AHEAD)
        self._stopped = threading.Event()
        self._ended = False
        self._inline: Iterator[Any] | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._pull, args=(pull,), name=FETCH_THREAD, daemon=True
        )
        try:
            self._thread.start()
        except RuntimeError:  # "can't create new thread at interpreter shutdown"
            self._thread, pulled = None, list[Any]()
            try:
                pull(pulled.append)
            except Exception as e:  # noqa: BLE001 - raised again by next
                pulled.append(e)
            self._inline = iter(pulled)

    def _pull(self, pull: Callable[[Callable[[Any], None]], None]) -> None:
        try:
            pull(self._put)
        except Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - raised again in the reader's thread
            self._hand(e)
            return
        self._hand(None)

    def _put(self, chunk: Any) -> None:
        if not self._hand(chunk):
            raise Stopped

    def _hand(self, item: Any) -> bool:
        """Queues ``item``; False once ``close`` was called."""
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def next(self) -> Any:
        """The next chunk, or None at the end."""
        if self._ended:
            return None
        item = next(self._inline, None) if self._inline is not None else self._queue.get()
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        self._ended = item is None
        return item

    def close(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
