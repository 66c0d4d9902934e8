"""Ctrl-C held over a few steps that must run whole.

Python runs a signal's handler on the main thread between two bytecodes, so
``KeyboardInterrupt`` (or whatever a ``SIGINT`` handler raises) can land
between any two steps, even those a line apart. A few steps of a store's put
must never be split that way: a task handed to a thread and the note that the
put waits for it, the log's line written and the note that its version is
whole, and the put's end, which waits for its threads and removes what a
failed put wrote. :func:`deferred` runs such steps with the handler replaced
by one that only remembers the signal, and calls the handler it replaced
once they have run, so the interrupt lands after them.

A wait for a thread's work is one such step too: CPython's ``Condition``
takes and lets go of a future's lock in Python code, so an interrupt
landing just after it took it, or just before it lets go, leaves it held,
and the thread that would end the future then waits for it forever (and a
put waiting for that thread with it). :func:`result` waits in slices of
``SLICE`` seconds, each with Ctrl-C held, so Ctrl-C still ends the wait,
between two slices.

Only the main thread runs signal handlers, so on any other thread nothing can
land and :func:`deferred` does nothing; nor where ``SIGINT`` is ignored or
kills the process (no Python handler: a kill, which the store's writes are
ordered for). What it holds is one interrupt however often it came, and a
wait inside it (for threads writing to a disk) is one Ctrl-C does not end:
the steps it holds are short, and wait for no other process.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from types import FrameType
from typing import Any, TypeVar

_T = TypeVar("_T")
_R = TypeVar("_R")

#: The longest a wait for a thread's work (``result``) holds Ctrl-C, in seconds.
SLICE = 0.05


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Holds ``SIGINT`` until the block has run, then hands it to the
    handler it held it from (which raises ``KeyboardInterrupt``, unless the
    program installed another), once however often it came. Sections
    nest: an inner one hands what it held to the outer one.

    Returns:
      A context manager; the block runs whole, on the main thread, whatever
      Ctrl-C does meanwhile (elsewhere no handler runs).

    Raises:
      KeyboardInterrupt: (what the held handler raises) after the block, if
        Ctrl-C came while it ran; an error the block raised is then its
        ``__context__``.

    Example:
      >>> import signal
      >>> def stop(signum, frame):
      ...     raise RuntimeError("stopped")
      >>> before = signal.signal(signal.SIGINT, stop)
      >>> try:
      ...     with deferred():
      ...         signal.raise_signal(signal.SIGINT)  # held: the block goes on
      ...         print("ran whole")
      ... except RuntimeError as e:
      ...     print(e)
      ... finally:
      ...     _ = signal.signal(signal.SIGINT, before)
      ran whole
      stopped
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # no handler runs on this thread: nothing lands here
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # ignored, the default (a kill), or not Python's to restore
        yield
        return
    held: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append((signum, frame))

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            previous(*held[0])


def result(future: Future[_T], /) -> _T:
    """``future.result()``, waited for in slices of ``SLICE`` seconds with
    Ctrl-C held in each (``deferred``): Ctrl-C ends the wait between two,
    never while it holds the future's lock.

    Args:
      future: the work of a thread.

    Returns:
      Its result.

    Raises:
      Exception: what the work raised.
      KeyboardInterrupt: (what the ``SIGINT`` handler raises) if Ctrl-C came
        while it waited, at most ``SLICE`` seconds later.

    Example:
      >>> from concurrent.futures import ThreadPoolExecutor
      >>> with ThreadPoolExecutor(1) as pool:
      ...     result(pool.submit(sum, [1, 2]))
      3
    """
    return _waited(future, Future.result)


def error(future: Future[Any], /) -> BaseException | None:
    """``future.exception()``, waited for as ``result`` waits: what the
    work raised, or None.

    Example:
      >>> from concurrent.futures import ThreadPoolExecutor
      >>> with ThreadPoolExecutor(1) as pool:
      ...     error(pool.submit(int, "x"))
      ValueError("invalid literal for int() with base 10: 'x'")
    """
    return _waited(future, Future.exception)


def _waited(future: Future[_T], outcome: Callable[[Future[_T]], _R]) -> _R:
    """``outcome(future)`` once it is done, waited for in slices, each with
    Ctrl-C held."""
    while True:
        with deferred():
            if wait([future], timeout=SLICE).done:
                return outcome(future)
