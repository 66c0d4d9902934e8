"""The compile guard: counts XLA compiles by phase through ``jax.monitoring``.

Every bucket is compiled at warm-up, so a compile while serving means a call
of a signature nobody planned for (a weak-typed or re-dtyped input, params of
another structure). The guard counts compiles from JAX's public monitoring
events, attributes them to the phase (``warmup``, ``serving``, ``swap``) of
the thread that triggered them, and explains a serving compile by comparing
the call's signature with the warmed ones.

One process-wide listener is registered once; it hands each event to the
guard active in the calling thread, so two servers in one process (tests)
count apart.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..leaf import short_dtype

#: The monitoring event JAX records once for each executable it builds
#: (a fresh compile or one read from the persistent cache).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
PHASES = ("warmup", "serving", "swap", "shadow")

log = logging.getLogger("treeguard.serving")

_local = threading.local()
_registered: list[bool] = []
_register_lock = threading.Lock()

Signature = tuple[tuple[tuple[int, ...], str, bool], ...]


def _on_event(event: str, duration_secs: float, **_: str | int) -> None:
    duration = duration_secs
    if event != COMPILE_EVENT:
        return
    current: tuple[CompileGuard, str] | None = getattr(_local, "current", None)
    if current is not None:
        current[0]._count(current[1], duration)


def _register() -> None:
    with _register_lock:
        if not _registered:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _registered.append(True)


def signature(leaves: Sequence[Any]) -> Signature:
    """The compile-relevant signature of a call's leaves: shape, dtype, weak type."""
    out = []
    for x in leaves:
        weak = bool(getattr(x, "weak_type", False))
        aval = getattr(x, "aval", None)
        if aval is not None:
            weak = bool(aval.weak_type)
        out.append((tuple(np.shape(x)), np.dtype(x.dtype).name, weak))
    return tuple(out)


def explain(sig: Signature, warmed: Sequence[Signature], paths: Sequence[str]) -> str:
    """Why a call of ``sig`` compiled: how it differs from the closest warmed one.

    Example:
      >>> a = (((4, 2), "float32", False),)
      >>> b = (((4, 2), "float32", True),)
      >>> explain(b, [a], ["['x']"])
      "['x']: f32[4,2] weak-typed in this call, f32[4,2] strong at warm-up"
    """
    if not warmed:
        return "no call was warmed up"
    best = min(warmed, key=lambda w: sum(a != b for a, b in zip(w, sig)) + abs(len(w) - len(sig)))
    parts = []
    for path, got, want in zip(paths, sig, best):
        (gs, gd, gw), (ws, wd, ww) = got, want
        g = f"{short_dtype(np.dtype(gd))}[{','.join(map(str, gs))}]"
        w = f"{short_dtype(np.dtype(wd))}[{','.join(map(str, ws))}]"
        if gw != ww:
            parts.append(
                f"{path}: {g} {'weak-typed' if gw else 'strong'} in this call, "
                f"{w} {'weak-typed' if ww else 'strong'} at warm-up"
            )
        elif got != want:
            parts.append(f"{path}: {g} in this call, {w} at warm-up")
    if len(sig) != len(best):
        parts.append(f"{len(sig)} leaves in this call, {len(best)} at warm-up")
    return "; ".join(parts) or "the same signature as at warm-up (a re-created function?)"


class CompileGuard:
    """Counts compiles by phase and remembers the warmed signatures.

    Example:
      >>> guard = CompileGuard()
      >>> f = jax.jit(lambda x: x * 2)
      >>> with guard.phase("warmup"):
      ...     _ = f(np.ones(3, np.float32))
      >>> guard.counts["warmup"]
      1
    """

    def __init__(self, *, on_compile: Any = None) -> None:
        _register()
        self.counts = dict.fromkeys(PHASES, 0)
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._lock = threading.Lock()
        self._on_compile = on_compile

    def _count(self, phase: str, duration: float) -> None:
        with self._lock:
            self.counts[phase] += 1
            self.seconds[phase] += duration
        if self._on_compile is not None:
            self._on_compile(phase)

    def phase(self, name: str) -> _Phase:
        """Attributes the compiles this thread triggers inside to ``name``."""
        if name not in PHASES:
            raise ValueError(f"phase {name!r} is not one of {PHASES}")
        return _Phase(self, name)

    def enter(self, name: str) -> tuple[CompileGuard, str] | None:
        """``phase`` without a context object, for the path each batch
        takes: attributes this thread's compiles to ``name`` (one of
        ``PHASES``, unchecked) until ``leave`` is given what this returned.

        Example:
          >>> guard = CompileGuard()
          >>> token = guard.enter("serving")
          >>> try:
          ...     _ = jax.jit(lambda x: x + 1)(np.ones(2, np.float32))
          ... finally:
          ...     guard.leave(token)
          >>> guard.counts["serving"]
          1
        """
        prev: tuple[CompileGuard, str] | None = getattr(_local, "current", None)
        _local.current = (self, name)
        return prev

    @staticmethod
    def leave(token: tuple[CompileGuard, str] | None) -> None:
        """Ends what ``enter`` began: the thread's phase before it again."""
        _local.current = token

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class _Phase:
    """The context of ``CompileGuard.phase``: a plain class, as it is entered
    once per batch (a generator-based context manager costs twice as much)."""

    __slots__ = ("guard", "name", "prev")

    def __init__(self, guard: CompileGuard, name: str) -> None:
        self.guard, self.name = guard, name
        self.prev: tuple[CompileGuard, str] | None = None

    def __enter__(self) -> None:
        self.prev = self.guard.enter(self.name)

    def __exit__(self, *exc: object) -> None:
        self.guard.leave(self.prev)


def enable_persistent_cache(directory: str | os.PathLike[str]) -> None:
    """Turns on JAX's persistent compilation cache in ``directory``, for every
    program however fast it compiles, so a restart reuses warm executables."""
    os.makedirs(directory, exist_ok=True)
    update: Any = jax.config.update
    update("jax_compilation_cache_dir", os.fspath(directory))
    update("jax_persistent_cache_min_compile_time_secs", 0.0)
    update("jax_persistent_cache_min_entry_size_bytes", 0)
