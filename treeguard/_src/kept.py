"""Thread pools kept between short jobs.

A local store's put runs its reservation, its writes and its manifest on a
few threads for some tens of milliseconds; starting those threads anew for
each put cost about 1.7 ms on the 2-core CPU box and more on the TPU host,
where a thread starts in about a millisecond. A job :func:`borrowed` a pool
of its own (two jobs at once never share one: a job's tasks wait on each
other, and a shared pool's threads could all be waiting on a task queued
behind them), waits at its end for every task it submitted, as leaving a
``with ThreadPoolExecutor`` block does, and hands the pool back for the next
job of its kind. At most ``KEEP`` idle pools of each kind are kept; a forked
child starts with none (its parent's threads are not in it).

A job whose end removes what its tasks wrote needs every task it submitted
ended first, also when Ctrl-C comes: a task's submit and its note are held
together (``interrupts.deferred``), so no interrupt leaves a task running
unwaited, and so is the job's end, so a second Ctrl-C does not end its wait.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor, wait
from typing import Any, ParamSpec, TypeVar

from . import interrupts

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: Idle pools kept of each kind (its thread count and name).
KEEP = 2

_lock = threading.Lock()
_idle: dict[tuple[int, str], list[ThreadPoolExecutor]] = {}


class Job(Executor):
    """One job's view of a borrowed pool: what it submits is remembered, so
    that the job's end waits for all of it."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._submitted: list[Future[Any]] = []

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        with interrupts.deferred():  # a task submitted is one the job's end waits for
            future = self._pool.submit(fn, *args, **kwargs)
            self._submitted.append(future)
        return future

    def settle(self) -> None:
        """Waits until every task submitted has finished (run or failed)."""
        wait(self._submitted)


@contextlib.contextmanager
def borrowed(workers: int, name: str) -> Iterator[Job]:
    """A pool of ``workers`` threads named ``name``, this job's alone until
    the block ends, which waits for every task the job submitted (Ctrl-C
    meanwhile is raised once they have ended).

    Example:
      >>> with borrowed(2, "treeguard-doc") as pool:
      ...     pool.submit(sum, [1, 2]).result()
      3
    """
    kind = (workers, name)
    with _lock:
        idle = _idle.get(kind)
        pool = idle.pop() if idle else ThreadPoolExecutor(workers, thread_name_prefix=name)
    job = Job(pool)
    try:
        yield job
    finally:
        with interrupts.deferred():  # Ctrl-C again: once no task of the job runs
            job.settle()
            with _lock:
                kept = _idle.setdefault(kind, [])
                spare = len(kept) >= KEEP
                if not spare:
                    kept.append(pool)
            if spare:
                # its tasks are done, so this only joins its idle threads: none is
                # left when the job ends (wait=False left them ending after it)
                pool.shutdown(wait=True)


def _forget() -> None:
    """In a forked child: the parent's pools have no threads here."""
    global _lock  # noqa: PLW0603 - a lock another thread held at the fork stays held
    _lock = threading.Lock()
    _idle.clear()


os.register_at_fork(after_in_child=_forget)
