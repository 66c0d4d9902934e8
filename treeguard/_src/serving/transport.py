"""What every transport shares: the bounds on what a client sends besides
its tensors, a request dropped before the engine saw it, and the budget of
connections the process's open-file limit allows.

A connection costs one file descriptor. With idle connections up to the
process's open-file limit, the server can no longer accept one more (nor
open a file), and every client is locked out, health checks included. So
the server raises its soft limit toward the hard one at start (``raise_file_limit``)
and keeps each transport's connections below what that limit leaves after
the descriptors the process needs for itself (``connection_cap``).

No JAX, no HTTP, no gRPC here: both transports and the command line import it.
"""

from __future__ import annotations

import dataclasses
import resource

#: The most bytes of request line and headers (REST) or of metadata (gRPC) one
#: request may send; more is refused before the request is read.
MAX_METADATA_BYTES = 16 * 1024
#: The file descriptors kept for the process itself (store files, logs, the
#: compilation cache, listening sockets), beside its connections.
FD_RESERVE = 128


class Dropped(Exception):
    """The transport gave up on a request before the engine saw it whole.

    Attributes:
      reason: one of ``metrics.DROP_REASONS``.
      status: the HTTP status it is answered with.
    """

    def __init__(self, reason: str, status: int, message: str) -> None:
        self.reason = reason
        self.status = status
        super().__init__(message)


@dataclasses.dataclass(frozen=True)
class FileLimit:
    """The process's open-file limit, before and after ``raise_file_limit``.

    Attributes:
      was: the soft limit the process started with.
      soft: the soft limit now.
      hard: the hard limit (the most the soft one may be raised to).
    """

    was: int
    soft: int
    hard: int

    def describe(self) -> str:
        """One line for the server's log.

        Example:
          >>> FileLimit(1024, 4096, 4096).describe()
          'open-file limit raised from 1024 to 4096 (the hard limit)'
          >>> FileLimit(1024, 1024, 1024).describe()
          'open-file limit 1024 (the hard limit; it cannot be raised)'
        """
        if self.soft > self.was:
            whole = " (the hard limit)" if self.soft == self.hard else f" (hard limit {self.hard})"
            return f"open-file limit raised from {self.was} to {self.soft}{whole}"
        if self.soft >= self.hard:
            return f"open-file limit {self.soft} (the hard limit; it cannot be raised)"
        return f"open-file limit {self.soft} (hard limit {self.hard})"


#: The soft limit ``raise_file_limit`` asks for at most (an unlimited hard limit is not a target).
FILE_LIMIT_TARGET = 1 << 16


def raise_file_limit(target: int = FILE_LIMIT_TARGET) -> FileLimit:
    """Raises the soft open-file limit toward the hard one (up to ``target``),
    where the hard one allows; never lowers it.

    Args:
      target: the soft limit wanted.

    Returns:
      The ``FileLimit`` before and after.

    Example:
      >>> limit = raise_file_limit(target=1)  # never lowered
      >>> limit.soft == limit.was
      True
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        except (OSError, ValueError):  # a container that refuses: keep what we have
            return FileLimit(soft, soft, hard)
        return FileLimit(soft, ceiling, hard)
    return FileLimit(soft, soft, hard)


def connection_cap(max_connections: int, soft: int) -> int:
    """The connections each transport may hold: ``max_connections``, or less
    where the open-file limit ``soft`` leaves fewer descriptors.

    What ``FD_RESERVE`` leaves is shared three ways: REST's connections,
    as many more REST may accept at once before it closes the oldest idle
    ones, and gRPC's connections.

    Example:
      >>> connection_cap(256, 1024), connection_cap(4096, 1024), connection_cap(256, 100)
      (256, 298, 1)
      >>> connection_cap(256, resource.RLIM_INFINITY)
      256
    """
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, (soft - FD_RESERVE) // 3))
