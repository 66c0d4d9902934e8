"""A disk that fills up while a version is written, as one typed error.

A full disk or quota (``ENOSPC``, ``EDQUOT``; tensorstore's
``ValueError('RESOURCE_EXHAUSTED: ...')``), met by the put itself or by
the storage under it (a ``StorageError`` raised from such an ``OSError``),
becomes a ``StorageError`` that names the version, and the leaf being
written when it was one leaf's bytes; the caller removes what was written.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator

from ..errors import StorageError


def is_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk or the quota is full."""
    if isinstance(e, StorageError):
        return e.__cause__ is not None and is_full(e.__cause__)
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, ValueError) and str(e).startswith("RESOURCE_EXHAUSTED")


@contextlib.contextmanager
def typed(directory: str | Callable[[], str], leaf: str | None = None) -> Iterator[None]:
    """Turns a full disk or quota met inside into a ``StorageError`` naming
    the version (``directory``: its directory, or what returns it once the
    disk is full, for a write started while the version's name is being
    picked) and ``leaf``, the key path of the leaf being written, if one
    was."""
    try:
        yield
    except (OSError, ValueError) as e:
        if not is_full(e):
            raise
        path = directory if isinstance(directory, str) else _reserved(directory)
        version = os.path.basename(path)
        at = "" if leaf is None else f" at {leaf}"
        raise StorageError(
            f"writing version {version} failed{at}: no space left on the device",
            version=version,
            context=path,
            hint="free space (store.gc() removes old versions) and put it again; nothing of "
            "this version was kept",
        ) from None


def _reserved(reserving: Callable[[], str]) -> str:
    """The directory ``reserving`` returns once the name is reserved; if
    the same full disk stopped the reservation, the directory of the
    version it names (this leaf's error says more: what filled the disk);
    anything else that refused the name is raised."""
    try:
        return reserving()
    except StorageError as e:
        if e.version is None or not e.context or os.path.basename(e.context) != e.version:
            raise
        return e.context
