"""``save_async``: a checkpoint written, hashed and fsynced on a background
thread while training goes on.

The arrays are copied to host memory before ``save_async`` returns, so the
caller may donate or overwrite them at once. The background thread hashes
with one core in the idle scheduling class (``yield_cpu``), so that a
training step running meanwhile keeps the cores it needs: the save takes
only the CPU time nothing else wants. It syncs what it wrote every
``FLUSH_EVERY`` bytes itself, so that pushing the pages to disk is idle work
too. The write is ``save``'s, so it is atomic: a crash or a kill at any
instant leaves the previous file at the path intact, and never a half file
under the final name. Each save runs on
its own non-daemon thread, so an interpreter that exits normally first lets
the pending saves finish.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook is registered before ours
import contextlib
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..keydtype import is_key_dtype
from ..surgery import Surgery
from .format import Header
from .read import read_header
from .write import write_checkpoint

#: A background save syncs what it wrote after each this many bytes, so its
#: own thread (in the idle class) pushes the pages to disk, not the kernel's
#: writeback threads at the training step's priority.
FLUSH_EVERY = 64 * 1024 * 1024
#: Where the idle scheduling class is refused: how much lower than the
#: caller's the priority of a background save's threads is (``nice``).
NICER = 10

_lock = threading.Lock()
#: Every save not yet finished, oldest first.
_in_flight: list[SaveHandle] = []


class SaveHandle:
    """A checkpoint being written in the background by ``save_async`` (or
    ``ArtifactStore.put(..., block=False)``).

    Attributes:
      path: the checkpoint's path (or the store's root).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._finished = threading.Event()
        self._header: Any = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def done(self) -> bool:
        """Whether the save has finished (written, or failed)."""
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """Waits for the save; returns the written file's header (for a
        store's ``put``, the new version's name).

        Args:
          timeout: seconds to wait at most; None waits as long as it takes.

        Returns:
          The ``Header`` of the file written, or the version's name.

        Raises:
          TimeoutError: if the save has not finished within ``timeout``.
          InvalidTreeError, OSError, TypeError: what ``save`` raised.
        """
        if not self._finished.wait(timeout):
            raise TimeoutError(f"{self.path}: the save is still being written")
        if self._error is not None:
            raise self._error
        return self._header

    def __repr__(self) -> str:
        state = "done" if self.done() else "writing"
        return f"SaveHandle({self.path!r}, {state})"

    def _run(self, work: Callable[[], Any]) -> None:
        yield_cpu()
        try:
            self._header = work()
        except BaseException as e:  # noqa: BLE001 - handed to whoever calls result()
            self._error = e
        finally:
            with _lock:
                if self in _in_flight:
                    _in_flight.remove(self)
            self._finished.set()


def yield_cpu() -> None:
    """Moves the calling thread to Linux's idle scheduling class
    (``SCHED_IDLE``): it runs only on a core no other thread of the machine
    wants, and gives way at once to one that does. Where that is refused, its
    priority is lowered by ``NICER`` instead (a niced thread still takes a
    share of a busy core). Threads it starts (the hashing workers) inherit
    either. Off Linux nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        with contextlib.suppress(OSError):
            lower = min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICER)
            os.setpriority(os.PRIO_PROCESS, tid, lower)


def host_copy(tree: Any, copied: Callable[[Any, Any], None] = lambda x, c: None) -> Any:
    """The tree with every array copied to host memory (typed PRNG keys stay
    jax arrays: JAX never donates a buffer a key array shares);
    ``copied(array, copy)`` is called for each jax array copied."""
    import jax  # only a tree holding jax arrays needs it; it is imported by then

    def copy(x: Any) -> Any:
        if isinstance(x, jax.Array):
            if is_key_dtype(x.dtype):
                return x
            out = np.array(jax.device_get(x), copy=True)
            copied(x, out)
            return out
        if isinstance(x, np.ndarray):
            return np.array(x, copy=True)
        return x

    return jax.tree.map(copy, tree)


def save_async(
    path: str | os.PathLike[str],
    tree: Any,
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
    surgery: Surgery | None = None,
    max_in_flight: int = 1,
) -> SaveHandle:
    """Starts writing a checkpoint in the background; returns at once after
    copying the arrays to host memory.

    The file is written, hashed and fsynced by ``save`` on a background
    thread, atomically: until it is complete the previous file at ``path``
    (if any) stays there, whole. At most ``max_in_flight`` saves run at once;
    a call beyond that first waits for the oldest to finish (its error, if
    any, stays with its handle).

    Args:
      path: where the checkpoint goes.
      tree: the tree to save; its arrays are copied before the call returns,
        so they may be donated or overwritten at once.
      metadata: as for ``save``.
      surgery: as for ``save``.
      max_in_flight: how many saves may run at once (at least 1).

    Returns:
      The ``SaveHandle``: ``done()``, ``result()`` (the header, or the typed
      error ``save`` raised).

    Raises:
      ConfigError: if another save is still writing ``path``, or for a
        ``max_in_flight`` below 1.

    Example:
      >>> import os, tempfile, numpy as np
      >>> path = os.path.join(tempfile.mkdtemp(), "step1.safetensors")
      >>> params = {"w": np.ones(3, np.float32)}
      >>> handle = save_async(path, params)
      >>> params["w"][:] = 0  # the copy was taken: the file holds ones
      >>> handle.result().spec
      TreeSpec({'w': f32[3]})
    """
    target = os.path.abspath(os.fspath(path))
    with _lock:
        busy = [h for h in _in_flight if h.path == target]
    if busy:
        raise ConfigError(
            "another save is still writing this path",
            context=target,
            hint="wait for its handle (handle.result()), or save to another path",
        )
    wait_for_slot(max_in_flight)
    host = host_copy(tree)

    def work() -> Header:
        write_checkpoint(
            target, host, metadata=metadata, surgery=surgery, threads=1, flush_every=FLUSH_EVERY
        )
        return read_header(target)

    return start(target, work, exclusive=True)


def start(target: str, work: Callable[[], Any], *, exclusive: bool) -> SaveHandle:
    """Runs ``work`` on a background thread behind a new handle (the caller
    has waited for a slot and copied what ``work`` reads).

    Raises:
      ConfigError: with ``exclusive``, if a save is still writing ``target``.
    """
    handle = SaveHandle(target)
    thread = threading.Thread(
        target=handle._run, args=(work,), name=f"treeguard-save-{os.path.basename(target)[:40]}"
    )
    handle._thread = thread
    with _lock:
        if exclusive and any(h.path == target for h in _in_flight):  # started meanwhile
            raise ConfigError(
                "another save is still writing this path",
                context=target,
                hint="wait for its handle (handle.result()), or save to another path",
            )
        _in_flight.append(handle)
    thread.start()
    return handle


def wait_for_slot(max_in_flight: int) -> None:
    """Waits until fewer than ``max_in_flight`` saves run (oldest first).

    Raises:
      ConfigError: for a ``max_in_flight`` below 1.
    """
    if not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ConfigError(f"max_in_flight must be an int of at least 1, got {max_in_flight!r}")
    while True:
        with _lock:
            oldest = _in_flight[0] if len(_in_flight) >= max_in_flight else None
        if oldest is None:
            return
        oldest._finished.wait()


def _finish_at_exit() -> None:
    """Has interpreter exit wait for the pending saves before the thread pools
    that hash them refuse new work.

    ``concurrent.futures`` stops its pools in a ``threading`` exit hook that
    runs before non-daemon threads are joined and before ``atexit``; only a
    hook registered the same way, later (they run last in, first out), runs
    before it. The standard library has no public name for that hook: this is
    its one use, and a Python without it falls back to ``atexit``, where a
    pending save fails and its temporary file is removed.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_wait_quietly)
    else:  # pragma: no cover - every CPython from 3.9 has the hook
        atexit.register(_wait_quietly)


def _wait_quietly() -> None:
    with _lock:
        pending = list(_in_flight)
    for h in pending:
        h._finished.wait()


_finish_at_exit()
