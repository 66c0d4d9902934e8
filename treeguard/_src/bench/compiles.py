"""Counting JAX's traces, lowerings and compiles through ``jax.monitoring``.

JAX records a duration event for each jaxpr trace, each lowering to MLIR and
each backend compile. One listener, registered on first use, hands every such
event to the ``CompileCounter`` windows open at that moment, so a benchmark
knows exactly what compiled while its clock ran. Events from other threads
count too: a compile anywhere in the process during the timed window is a
disturbance of the timing.
"""

from __future__ import annotations

import dataclasses
import threading
from types import TracebackType

from jax import monitoring

#: The ``jax.monitoring`` duration events counted, by kind.
EVENTS: dict[str, str] = {
    "/jax/core/compile/jaxpr_trace_duration": "trace",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
    "/jax/core/compile/backend_compile_duration": "compile",
}

_lock = threading.Lock()
_open: list[CompileCounter] = []
_registered: list[bool] = []  # holds True once the listener is registered


def _listener(event: str, duration_secs: float, **kwargs: str | int) -> None:
    kind = EVENTS.get(event)
    if kind is None:
        return
    with _lock:
        windows = list(_open)
    for w in windows:
        w.add(kind, duration_secs)


def _ensure_listener() -> None:
    with _lock:
        if not _registered:
            monitoring.register_event_duration_secs_listener(_listener)
            _registered.append(True)


@dataclasses.dataclass
class CompileCounter:
    """A window that counts compile events while it is open.

    Use it as a context manager; windows may nest and overlap.

    Attributes:
      counts: events seen, by kind (``trace``, ``lower``, ``compile``).
      seconds: their summed durations, by kind.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> with CompileCounter() as c:
      ...     _ = jax.jit(lambda x: x * 3)(jnp.arange(3.0))
      >>> c.counts["compile"] >= 1
      True
    """

    counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("trace", "lower", "compile"), 0)
    )
    seconds: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("trace", "lower", "compile"), 0.0)
    )

    def add(self, kind: str, duration: float) -> None:
        with _lock:
            self.counts[kind] += 1
            self.seconds[kind] += float(duration)

    @property
    def total(self) -> int:
        """Traces, lowerings and compiles together."""
        return sum(self.counts.values())

    def __enter__(self) -> CompileCounter:
        _ensure_listener()
        with _lock:
            _open.append(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with _lock:
            _open.remove(self)
