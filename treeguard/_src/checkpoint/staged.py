"""A load onto an accelerator through a few reused host buffers.

A load onto a TPU or a GPU reads each batch of tensors into host memory,
hashes it there and hands it to ``jax.device_put``, which copies it onto
the device; the host copy is garbage once the transfer is done. Reading
into freshly allocated memory makes every load pay the kernel's first
touch of each page again, the larger part of a load's time on an
accelerator's host (on the lent TPU v5e, about 0.7 s a GiB against about
0.25 s for the reads and the hashing). So a load there reads each batch
into one of ``SLOTS`` buffers of ``SLOT`` bytes, faulted in once per
process and handed from one load to the next, and waits for a buffer's
transfers to finish before it reads the next batch into it.

The bytes go the same way as in any load: read with ``preadv`` (a file
that shrinks is refused, never a crash), hashed in the buffer, and handed
on only once their digest matches, so the device gets the bytes that were
verified. Used only where every leaf of ``like`` is placed on devices that
are not the CPU's: there ``jax.device_put`` may alias host memory, and
each array keeps its own buffer. A tensor larger than a slot gets a buffer
of its own, as before.

The buffers of one load at a time are kept for the next (``SLOTS *
SLOT`` bytes of host memory, 192 MiB, for the life of the process); a
load running while another holds them uses buffers of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .restore import buffer

#: The bytes of one staging buffer: the batch a load onto devices reads at a time.
SLOT = 64 * 1024 * 1024
#: How many batches may be in flight to the devices while the next is read.
SLOTS = 3

_LOCK = threading.Lock()
#: The buffers kept between loads (at most one set).
_KEPT: list[list[np.ndarray[Any, Any]]] = []


def wanted(refs: Sequence[Any]) -> bool:
    """Whether a load into these ``like`` leaves goes through staging
    buffers: every leaf is bound to devices (a jax array, or a
    ``ShapeDtypeStruct`` with a sharding), none of them the CPU's.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> wanted([jnp.ones(2)]) == (jax.default_backend() != "cpu")
      True
      >>> wanted([]), wanted([None])
      (False, False)
    """
    if not refs:
        return False
    for ref in refs:
        sharding = getattr(ref, "sharding", None)
        if sharding is None:
            return False
        if any(d.platform == "cpu" for d in sharding.device_set):
            return False
        # host memory spaces of an accelerator (pinned_host, ...) may alias too
        if getattr(sharding, "memory_kind", None) not in (None, "device"):
            return False
    return True


def _take() -> list[np.ndarray[Any, Any]]:
    with _LOCK:
        if _KEPT:
            return _KEPT.pop()
    return [buffer(SLOT) for _ in range(SLOTS)]


def _keep(slots: list[np.ndarray[Any, Any]]) -> None:
    with _LOCK:
        if not _KEPT:
            _KEPT.append(slots)


class Staging:
    """The staging buffers of one load: ``buffer(n)`` hands out the next
    one (after its last batch reached the devices), ``hold(values)`` names
    what was placed from it, ``close()`` waits for every transfer and keeps
    the buffers for the next load. A context manager.

    Example:
      >>> import jax.numpy as jnp
      >>> with Staging() as stage:
      ...     buf = stage.buffer(8)
      ...     buf[:8] = 1
      ...     stage.hold([jnp.asarray(buf[:8])])
      ...     stage.buffer(SLOT + 1) is None  # too large: a buffer of its own
      True
    """

    def __init__(self, take: Callable[[], list[np.ndarray[Any, Any]]] = _take) -> None:
        self._slots = take()
        self._held: list[Any] = [None] * len(self._slots)
        self._turn = 0
        self._current: int | None = None

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is None:
            self.close()
            return
        # the load already failed: its error is the one the caller sees
        with contextlib.suppress(Exception):
            self.close()

    def buffer(self, nbytes: int) -> np.ndarray[Any, Any] | None:
        """A buffer of at least ``nbytes`` that no transfer still reads, or
        None for a batch larger than a slot."""
        self._current = None
        if nbytes > SLOT:
            return None
        s = self._turn % len(self._slots)
        self._turn += 1
        self._wait(s)
        self._current = s
        return self._slots[s]

    def hold(self, values: Any) -> None:
        """The arrays placed from the last buffer handed out: it is reused
        only once they are ready on their devices."""
        if self._current is not None:
            self._held[self._current] = values
            self._current = None

    def close(self) -> None:
        """Waits for every transfer from the buffers, then keeps them for the
        next load (or frees them, if another load's are kept).

        Raises:
          Exception: the first transfer that failed, once every buffer is
            free (a failed transfer reads its buffer no more either).
        """
        failed: BaseException | None = None
        for s in range(len(self._held)):
            try:
                self._wait(s)
            except Exception as e:  # noqa: BLE001 - raised below, once all are waited for
                failed = failed or e
        if self._slots:
            slots, self._slots = self._slots, []
            _keep(slots)
        if failed is not None:
            raise failed

    def _wait(self, s: int) -> None:
        held, self._held[s] = self._held[s], None
        if held is not None:
            import jax  # staging is only for leaves already on devices

            jax.block_until_ready(held)  # type: ignore[no-untyped-call]
