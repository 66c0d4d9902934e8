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
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import ServingError
from .slots import Slot, Slots

Outputs = list[tuple[str, np.ndarray[Any, Any]]]


@dataclasses.dataclass(eq=False)
class Pending:
    """One request waiting for its batch."""

    leaves: list[np.ndarray[Any, Any]]
    rows: int
    chunks: tuple[int, ...]
    future: asyncio.Future[tuple[Outputs, str]]
    deadline: float
    enqueued: float = dataclasses.field(default_factory=time.monotonic)


class Batcher:
    """Gathers requests into batches and runs them on the active slot.

    Args:
      slots: the ``Slots`` whose active params run each batch.
    """

    def __init__(self, slots: Slots) -> None:
        self.slots = slots
        self.spec = slots.spec
        self.metrics = slots.metrics
        self._queue: collections.deque[Pending] = collections.deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._queue)

    def start(self) -> None:
        """Starts the worker on the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())

    async def stop(self) -> None:
        """Stops the worker; waiting requests fail with 503."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while self._queue:
            p = self._queue.popleft()
            if not p.future.done():
                p.future.set_exception(ServingError("the server is stopping", status=503))

    async def submit(
        self, leaves: list[np.ndarray[Any, Any]], rows: int, chunks: tuple[int, ...]
    ) -> tuple[Outputs, str]:
        """Queues one request and waits for its outputs.

        Returns:
          ``[(output path, rows)]`` and the version that computed them.

        Raises:
          ServingError: 429 when the queue is full.
          TimeoutError: when the request's deadline passes first.
          ServingError: when its batch fails.
        """
        if len(self._queue) >= self.spec.limits.max_queue:
            raise ServingError(
                f"the queue is full ({len(self._queue)} requests waiting)",
                status=429,
                hint="retry after a short wait",
            )
        if not self._queue and self.spec.limits.max_delay_ms == 0:
            # nothing waiting and nothing to wait for: run it here, with no hop
            # through the queue and the worker (a batch runs synchronously on
            # this thread either way, so none is running now)
            self.metrics.queued(0.0)
            return self._run_alone(leaves, rows, chunks)
        loop = asyncio.get_running_loop()
        timeout = self.spec.limits.timeout_s
        pending = Pending(leaves, rows, chunks, loop.create_future(), time.monotonic() + timeout)
        self._queue.append(pending)
        self.metrics.depth(len(self._queue))
        self._wake.set()
        expiry = loop.call_later(timeout, _expire, pending.future)
        try:
            return await pending.future
        finally:
            expiry.cancel()

    async def _next(self, until: float | None) -> Pending | None:
        while not self._queue:
            self._wake.clear()
            if until is None:
                await self._wake.wait()
                continue
            left = until - time.monotonic()
            if left <= 0:
                return None
            try:
                await asyncio.wait_for(self._wake.wait(), left)
            except TimeoutError:
                return None
        return self._queue[0]

    async def _work(self) -> None:
        largest = self.spec.largest
        delay = self.spec.limits.max_delay_ms / 1000
        while True:
            first = await self._next(None)
            assert first is not None
            self._queue.popleft()
            batch = [first]
            if len(first.chunks) == 1:
                rows = first.rows
                until = first.enqueued + delay
                while rows < largest:
                    nxt = await self._next(until)
                    if nxt is None or len(nxt.chunks) != 1 or rows + nxt.rows > largest:
                        break
                    self._queue.popleft()
                    batch.append(nxt)
                    rows += nxt.rows
            self.metrics.depth(len(self._queue))
            now = time.monotonic()
            live = []
            for p in batch:
                if p.future.done():
                    continue
                if now > p.deadline:
                    p.future.set_exception(TimeoutError())
                    continue
                self.metrics.queued(now - p.enqueued)
                live.append(p)
            if not live:
                continue
            try:
                # on the loop's thread: a hop to a worker thread costs more than a
                # small batch (measured in benchmarks/serving.py); swaps and their
                # checks run in threads and never hold this up for long
                results = self._run(live)
            except Exception as e:  # noqa: BLE001 - the batch's failure goes to its requests
                for p in live:
                    if not p.future.done():
                        p.future.set_exception(e)
                continue
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
        outs, version = self.slots.run(slot, leaves, rows)
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
            return self.slots.run(slot, leaves, rows)
        parts: list[Outputs] = []
        start = 0
        for n in chunks:
            outs, _ = self.slots.run(slot, [x[start : start + n] for x in leaves], n)
            parts.append(outs)
            start += n
        joined = [
            (path, np.concatenate([part[i][1] for part in parts]))
            for i, (path, _) in enumerate(parts[0])
        ]
        return joined, slot.version

    def _active(self) -> Slot:
        slot = self.slots.active
        if slot is None:
            raise ServingError("no version is loaded yet", status=503)
        return slot


def _expire(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())
