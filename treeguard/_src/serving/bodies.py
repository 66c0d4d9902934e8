"""Request bodies read under limits: REST's size limit, body deadline and
cap on bodies read at once.

Most bodies are whole by the time their request runs: then every receive
returns without a wait, and the body needs neither a timer nor a place
among the bodies being read. A body still arriving is read under the body
deadline (one timer that cancels the reading task), with at most
``max_bodies`` read at once; past the cap a request is refused, never
queued. ``BodyReads`` holds the bodies being waited for, so a server
shutting down answers each with 503 at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import Any

from .protocol import refuse
from .spec import Limits
from .transport import Dropped

_SHUTTING_DOWN = (
    "the server is shutting down with this request's body still arriving; send it again"
)


class Disconnected(Exception):
    """The client went away before its request body was whole (499)."""


def size_in(text: str) -> int | None:
    """A header's byte count: ASCII digits, at most 18 of them; None for
    anything else (``str.isdigit`` takes ``²`` too, and ``int`` refuses
    thousands of digits).

    Example:
      >>> size_in("130"), size_in("²"), size_in("9" * 5000), size_in("-1")
      (130, None, None, None)
    """
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None


class _Deadline:
    """Cancels the task that made it, once: when its timer fires, or when the
    server shuts down (see ``BodyReads.close``); ``reason`` says which."""

    __slots__ = ("reason", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.reason: str | None = None

    def expire(self, reason: str = "body_timeout") -> None:
        if self.task is not None and self.reason is None:
            self.reason = reason
            self.task.cancel()


class BodyReads:
    """The request bodies an app is waiting for now (each body that was not
    whole when its request ran), so that a server shutting down can end
    them: ``close`` answers each with 503 and refuses any more, while
    requests whose bodies are whole are still answered.

    Example:
      >>> reads = BodyReads()
      >>> reads.close()
      >>> reads.closed, len(reads.waiting)
      (True, 0)
    """

    __slots__ = ("closed", "waiting")

    def __init__(self) -> None:
        self.waiting: set[_Deadline] = set()
        self.closed = False

    def close(self) -> None:
        """Ends every body being waited for, and refuses any more (idempotent)."""
        self.closed = True
        for deadline in list(self.waiting):
            deadline.expire("shutdown")


class _Body:
    """A request body as its messages arrive, under a size limit: the first
    message's bytes as they came, later ones added to one buffer (a list of
    tiny chunks would cost many times their size)."""

    __slots__ = ("first", "limit", "more", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.first: bytes | None = None
        self.more: bytearray | None = None
        self.size = 0

    def take(self, message: Any) -> bool:
        """Adds one ``receive`` message's bytes; whether it was the last.

        Raises:
          Disconnected: for a disconnect instead of body bytes.
          InvalidRequestError: 413 once the body is over the limit.
        """
        if message["type"] != "http.request":
            raise Disconnected()
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            raise refuse(
                f"the body is over the limit of {self.limit} bytes",
                "size",
                413,
                hint="send fewer rows per request",
            )
        if self.first is None:
            self.first = chunk
        elif self.more is None:
            self.more = bytearray(self.first)
            self.more += chunk
        else:
            self.more += chunk
        return not message.get("more_body", False)

    def joined(self) -> bytes:
        if self.more is not None:
            return bytes(self.more)
        return self.first or b""


class _Rest:
    """The rest of a coroutine already run up to its first wait (``waits_for``,
    what it yielded there): awaiting this goes on from that wait, passing
    what the task sends or throws in (a cancel) on to the coroutine, as
    ``await`` of it would have."""

    __slots__ = ("coro", "waits_for")

    def __init__(self, coro: Any, waits_for: Any) -> None:
        self.coro, self.waits_for = coro, waits_for

    def close(self) -> None:
        """Abandons the coroutine (it is never resumed)."""
        self.coro.close()

    def __await__(self) -> Any:
        coro, signal = self.coro, self.waits_for
        while True:
            try:
                sent = yield signal
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as thrown:  # noqa: BLE001 - a cancel goes on to the coroutine
                try:
                    signal = coro.throw(thrown)
                except StopIteration as done:
                    return done.value
                continue
            try:
                signal = coro.send(sent)
            except StopIteration as done:
                return done.value


class BodyReader:
    """Reads whole request bodies under one spec's limits.

    Args:
      limits: the spec's ``Limits`` (``max_request_bytes``,
        ``body_timeout_s``, ``max_bodies``).
      reading: the bodies being waited for (a server closes it as it shuts
        down).
    """

    def __init__(self, limits: Limits, reading: BodyReads) -> None:
        self.limits = limits
        self.reading = reading

    async def read(self, announced: str | None, receive: Any) -> bytes:
        """The whole body, under the size limit and the body deadline.

        Args:
          announced: the ``content-length`` header, if any.
          receive: the ASGI ``receive``.

        Raises:
          InvalidRequestError: 400 for a length that is not a size, 413 over
            the size limit.
          Dropped: 408 past the body deadline, 503 over the cap on bodies
            read at once or while the server shuts down.
          Disconnected: when the client goes away first.
        """
        limit = self.limits.max_request_bytes
        if announced is not None:
            size = size_in(announced)
            if size is None:
                raise refuse("content-length is not a size", status=400)
            if size > limit:
                raise refuse(
                    f"the body announces {size} bytes, over the limit of {limit}",
                    "size",
                    413,
                    hint="send fewer rows per request",
                )
        body = _Body(limit)
        while True:
            step = receive()
            if not isinstance(step, Coroutine):  # a server's own awaitable: awaited, timed
                return await self._read_rest(body, step, receive)
            try:
                waits_for = step.send(None)
            except StopIteration as done:
                if body.take(done.value):
                    return body.joined()
                continue
            return await self._read_rest(body, _Rest(step, waits_for), receive)

    async def _read_rest(self, body: _Body, pending: Awaitable[Any], receive: Any) -> bytes:
        """The rest of a body from a receive that waits on, under the
        deadline and the cap on bodies read at once."""
        limits, reading = self.limits, self.reading
        if reading.closed or len(reading.waiting) >= limits.max_bodies:
            if isinstance(pending, _Rest):
                pending.close()
            if reading.closed:
                raise Dropped("shutdown", 503, _SHUTTING_DOWN)
            raise Dropped("bodies", 503, f"{limits.max_bodies} request bodies are being read")
        # the deadline is one timer that cancels this task (``asyncio.timeout``
        # costs several times as much per request)
        deadline = _Deadline()
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + limits.body_timeout_s, deadline.expire)
        reading.waiting.add(deadline)
        try:
            if body.take(await pending):
                return body.joined()
            while not body.take(await receive()):
                pass
            return body.joined()
        except asyncio.CancelledError:
            if deadline.reason is None or deadline.task is None or deadline.task.uncancel() > 0:
                raise  # someone else's cancel, not the deadline's
            if deadline.reason == "shutdown":
                raise Dropped("shutdown", 503, _SHUTTING_DOWN) from None
            raise Dropped(
                "body_timeout", 408, f"the body did not arrive within {limits.body_timeout_s:g} s"
            ) from None
        finally:
            timer.cancel()
            reading.waiting.discard(deadline)
