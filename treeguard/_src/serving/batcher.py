"""The dynamic batcher: gathers concurrent requests into padded buckets.

Requests wait in one bounded FIFO queue (full: 429). A worker takes the
oldest, gathers more for up to the spec's max delay while they fit the
largest bucket, runs them as one batch, and slices each request's rows back out. Padding
rows are sliced off before anything is returned; requests keep their order;
a request whose deadline passed is never run. A request over the largest
bucket (with ``overflow="split"``) runs alone as several batches on the
same params, so its response names one version.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ServingError
from .runner import Runner, Slot
from .weights import Weights

Outputs = list[tuple[str, np.ndarray[Any, Any]]]

log = logging.getLogger("treeguard.serving")


class Unavailable(ServingError):
    """503: the batcher itself cannot run requests (stopping, stopped or
    failed); no version is to blame for it."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, status=503, hint=hint)


class Pending:
    """One request waiting for its batch (a plain class with slots: one is
    made per request)."""

    __slots__ = ("chunks", "enqueued", "future", "leaves", "rows")

    def __init__(
        self,
        leaves: list[np.ndarray[Any, Any]],
        rows: int,
        chunks: tuple[int, ...],
        future: asyncio.Future[tuple[Outputs, str]],
        enqueued: float,
    ) -> None:
        self.leaves, self.rows, self.chunks = leaves, rows, chunks
        self.future, self.enqueued = future, enqueued


class Batcher:
    """Gathers requests into batches and runs them on the active slot.

    Args:
      runner: the ``Runner`` that runs each batch.
      weights: the ``Weights`` whose active params run each batch.
      clock: the monotonic clock deadlines and the gathering delay are
        measured on.
    """

    def __init__(
        self, runner: Runner, weights: Weights, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.runner = runner
        self.weights = weights
        self.spec = runner.spec
        self.metrics = runner.metrics
        self.clock = clock
        self._queue: collections.deque[Pending] = collections.deque()
        #: The requests the worker took off the queue for the batch it makes.
        self._taken: list[Pending] = []
        #: The worker's wait for the queue to fill, while it waits.
        self._waiter: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> bool:
        """Whether the worker runs (started, not stopped, not failed)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Starts the worker on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Stops the worker; waiting requests fail with 503."""
        if self._task is not None:
            self._task.cancel()
            # a worker that failed was logged when it did
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        error = Unavailable("the server is stopping")
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(error)

    def run_now(
        self, leaves: list[np.ndarray[Any, Any]], rows: int, chunks: tuple[int, ...]
    ) -> tuple[Outputs, str] | None:
        """Runs one request at once, on the calling thread, when nothing waits
        and the spec gives no delay to gather a batch in; None otherwise (then
        ``submit`` it). A batch runs synchronously on the event loop's thread
        either way, so none is running now, and the queue and the worker are
        no hop worth making.

        Raises:
          ServingError: when its batch fails (as ``submit``).
        """
        if self._queue or self.spec.limits.max_delay_ms != 0:
            return None
        if not self.running:
            return None  # ``submit`` refuses it, saying why
        self.metrics.queued(0.0)
        return self._run_alone(leaves, rows, chunks)

    async def submit(
        self, leaves: list[np.ndarray[Any, Any]], rows: int, chunks: tuple[int, ...]
    ) -> tuple[Outputs, str]:
        """Queues one request and waits for its outputs.

        Returns:
          ``[(output path, rows)]`` and the version that computed them.

        Raises:
          ServingError: 429 when the queue is full, 503 when the worker is
            not running or stops.
          TimeoutError: when the request's deadline passes before its batch runs.
          ServingError: when its batch fails.
        """
        limits = self.spec.limits
        queue = self._queue
        if len(queue) >= limits.max_queue:
            raise ServingError(
                f"the queue is full ({len(queue)} requests waiting)",
                status=429,
                hint="retry after a short wait",
            )
        if not self.running:
            raise Unavailable("the batcher is not running")
        # no timer per request: deadlines grow in queue order, so the worker
        # reaches every expired request before it runs another batch, and
        # fails it there; a worker that ends fails all that wait (``_work``)
        future: asyncio.Future[tuple[Outputs, str]] = asyncio.get_running_loop().create_future()
        queue.append(Pending(leaves, rows, chunks, future, self.clock()))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return await future

    async def _next(self, until: float | None) -> Pending | None:
        """The oldest waiting request, waited for until ``until`` (on the
        batcher's clock) or for ever; None when ``until`` passes.
        One future per wait, woken by ``submit`` or by one timer (``wait_for``
        would make a task and a timeout for each)."""
        loop = asyncio.get_running_loop()
        while not self._queue:
            left = None if until is None else until - self.clock()
            if left is not None and left <= 0:
                return None
            waiter = self._waiter = loop.create_future()
            timer = None if left is None else loop.call_later(left, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        return self._queue[0]

    async def _work(self) -> None:
        error = Unavailable("the server is stopping")
        try:
            await self._gather_and_run()
        except Exception as e:
            log.error("the batcher's worker failed: %s", type(e).__name__)
            error = Unavailable("the batcher failed", hint="see the server's log")
            raise
        finally:  # cancelled by ``stop``, or failed: nobody waits for nothing
            for p in (*self._taken, *self._queue):
                if not p.future.done():
                    p.future.set_exception(error)
            self._taken = []
            self._queue.clear()

    async def _gather_and_run(self) -> None:
        while True:
            first = await self._next(None)
            assert first is not None
            self._queue.popleft()
            await self._gather_and_answer(first)
            # nothing of an answered batch is held while the worker waits
            first = None
            self._taken = []

    async def _gather_and_answer(self, first: Pending) -> None:
        """Gathers a batch behind ``first`` (taken off the queue), runs it and
        answers each request in it."""
        largest = self.spec.largest
        queue = self._queue
        batch = self._taken = [first]  # taken off the queue, not answered yet
        if len(first.chunks) == 1:
            rows = first.rows
            until = first.enqueued + self.spec.limits.max_delay_ms / 1000
            while rows < largest:
                # those already waiting are taken with no await
                nxt = queue[0] if queue else await self._next(until)
                if nxt is None or len(nxt.chunks) != 1 or rows + nxt.rows > largest:
                    break
                queue.popleft()
                batch.append(nxt)
                rows += nxt.rows
        self.metrics.depth(len(queue))
        now = self.clock()
        timeout = self.spec.limits.timeout_s
        live = []
        waits = []
        for p in batch:
            if p.future.done():
                continue
            if now - p.enqueued > timeout:
                p.future.set_exception(TimeoutError())
                continue
            waits.append(now - p.enqueued)
            live.append(p)
        if not live:
            return
        self.metrics.queued_many(waits)
        try:
            # on the loop's thread: a hop to a worker thread costs more than a
            # small batch (measured in benchmarks/serving.py); swaps and their
            # checks run in threads and never hold this up for long
            results = self._run(live)
        except Exception as e:  # noqa: BLE001 - the batch's failure goes to its requests
            for p in live:
                if not p.future.done():
                    p.future.set_exception(e)
            return
        for p, r in zip(live, results):
            if not p.future.done():
                p.future.set_result(r)

    def _run(self, batch: Sequence[Pending]) -> list[tuple[Outputs, str]]:
        """Runs one batch on one snapshot of the active slot."""
        if len(batch) == 1:
            p = batch[0]
            return [self._run_alone(p.leaves, p.rows, p.chunks)]
        slot = self._active()
        rows = sum(p.rows for p in batch)
        leaves = [np.concatenate([p.leaves[i] for p in batch]) for i in range(len(batch[0].leaves))]
        outs, version = self.runner.run(slot, leaves, rows)
        results = []
        start = 0
        for p in batch:
            mine = [(path, x[start : start + p.rows]) for path, x in outs]
            start += p.rows
            results.append((mine, version))
        return results

    def _run_alone(
        self, leaves: list[np.ndarray[Any, Any]], rows: int, chunks: tuple[int, ...]
    ) -> tuple[Outputs, str]:
        """Runs one request as its own batch, or (split) as several on one slot."""
        slot = self._active()
        if len(chunks) == 1:
            return self.runner.run(slot, leaves, rows)
        parts: list[Outputs] = []
        start = 0
        for n in chunks:
            outs, _ = self.runner.run(slot, [x[start : start + n] for x in leaves], n)
            parts.append(outs)
            start += n
        joined = [
            (path, np.concatenate([part[i][1] for part in parts]))
            for i, (path, _) in enumerate(parts[0])
        ]
        return joined, slot.version

    def _active(self) -> Slot:
        slot = self.weights.active
        if slot is None:
            raise Unavailable("no version is loaded yet")
        return slot


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
