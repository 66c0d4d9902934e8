"""In a multi-process job: process 0 acts on the store, every process hears.

A sharded put or an agreed verdict changes the store once, from process 0,
but every process must return the same answer or raise. ``lead_acts`` is
that step: process 0 runs the action, its reply (or its failure, as text)
is gathered by every process, and the gather is also the barrier after it.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import StoreError

#: How much of process 0's error the other processes hear.
_ERROR_LIMIT = 500


def lead_acts(act: Callable[[], bytes], *, failed: Callable[[str], StoreError]) -> bytes:
    """Runs ``act`` in process 0 and returns its reply in every process.

    Args:
      act: what process 0 does; returns a short reply for every process.
      failed: the error the other processes raise, given process 0's error
        as text.

    Returns:
      ``act``'s reply.

    Raises:
      Exception: process 0 raises what ``act`` raised; every other process
        raises ``failed(text)``.
    """
    from ..sharded import hosts  # lazy: jax's multi-process utilities

    error: BaseException | None = None
    reply = b""
    if hosts.process_index() == 0:
        try:
            reply = b"+" + act()
        except Exception as e:  # noqa: BLE001 - every process must hear of it
            error = e
            reply = b"!" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:_ERROR_LIMIT]
    heard = hosts.allgather_bytes(reply)[0]
    if error is not None:
        raise error
    if not heard.startswith(b"+"):
        raise failed(heard[1:].decode("utf-8", "replace"))
    return heard[1:]


def not_made(root: str) -> Callable[[str], StoreError]:
    """``lead_acts``'s ``failed`` for a put whose version process 0 could
    not make (nothing was written)."""
    return lambda why: StoreError(
        f"process 0 could not make the version: {why}",
        context=root,
        hint="see process 0's error; nothing was written",
    )


def not_recorded(version: str, root: str, *, left: str) -> Callable[[str], StoreError]:
    """``lead_acts``'s ``failed`` for a put whose version process 0 could
    not record; ``left``: what is left of it."""
    return lambda why: StoreError(
        f"process 0 could not record version {version}: {why}",
        version=version,
        context=root,
        hint=f"see process 0's error; {left}",
    )
