"""A disk that fills up or fails while a version is written, as one typed
error.

A full disk or quota (``ENOSPC``, ``EDQUOT``; tensorstore's
``ValueError('RESOURCE_EXHAUSTED: ...')``), met by the put itself or by
the storage under it (a ``StorageError`` raised from such an ``OSError``),
becomes a ``StorageError`` that names the version, and the leaf being
written when it was one leaf's bytes; a sync the disk failed (``syncing``)
one that names the version and what was synced, and any other failure of
a write (``writing``) one that names the version and the file. The caller
removes what was written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import weakref
from collections.abc import Callable, Iterator

from ..errors import StorageError

#: The errors ``typed`` raised for a full disk, told apart by identity (no
#: field of theirs is inferred from).
_FULL: weakref.WeakSet[StorageError] = weakref.WeakSet()


def is_full(e: BaseException) -> bool:
    """Whether ``e`` says the disk or the quota is full."""
    if isinstance(e, StorageError):
        return e.__cause__ is not None and is_full(e.__cause__)
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, ValueError) and str(e).startswith("RESOURCE_EXHAUSTED")


def filled(e: BaseException) -> bool:
    """Whether ``e`` is the error ``typed`` raised for a full disk (which
    names the version: a leaf's error met with it says more)."""
    return isinstance(e, StorageError) and e in _FULL


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
        at = "" if leaf is None else f" at {leaf}"
        error = _failed(
            path,
            f"{at}: no space left on the device",
            where=path,
            fix="free space (store.gc() removes old versions) and put it again",
        )
        _FULL.add(error)
        raise error from None


@contextlib.contextmanager
def syncing(directory: str) -> Iterator[None]:
    """Turns a sync the disk failed inside (``atomic.fsync_dir``'s or
    ``fsync_file``'s ``OSError``, which names what it synced) into a
    ``StorageError`` naming the version (``directory``: its directory) and
    what was synced: the entries written may not outlive a crash."""
    try:
        yield
    except OSError as e:
        raise _disk(directory, e, "syncing it to the disk failed ({})") from e


@contextlib.contextmanager
def writing(directory: str) -> Iterator[None]:
    """Turns an ``OSError`` met inside while a version's files are written
    (a write or a sync the disk failed: ``EIO``; a full disk is left to
    ``typed``) into a ``StorageError`` naming the version (``directory``:
    its directory) and the file the error names, else the directory."""
    try:
        yield
    except OSError as e:
        if is_full(e):
            raise
        raise _disk(directory, e, "{}") from e


def _disk(directory: str, e: OSError, why: str) -> StorageError:
    """The error of the version at ``directory`` whose disk failed ``e``
    (``why``: the message's end, ``{}`` the disk's reason), at the file or
    directory ``e`` names, else at ``directory``."""
    return _failed(
        directory,
        ": " + why.format(e.strerror or type(e).__name__),
        where=e.filename if isinstance(e.filename, str) else directory,
        fix=_FIXES.get(e.errno or 0, "check the disk (the kernel's log says why it failed)")
        + " and put it again",
    )


#: The likely fix of a failure that is not the disk's own.
_FIXES = {
    errno.EROFS: "the file system is mounted read-only: remount it writable",
    errno.EACCES: "this user may not write there: check the store directory's permissions",
    errno.EPERM: "this user may not write there: check the store directory's permissions",
    errno.ENOENT: "a directory of the store was removed meanwhile: check what removes it",
}


def _failed(path: str, why: str, *, where: str, fix: str) -> StorageError:
    """The error of a version (at ``path``) whose write failed ``why``, at
    ``where``; nothing of it is kept."""
    version = os.path.basename(path)
    return StorageError(
        f"writing version {version} failed{why}",
        version=version,
        context=where,
        hint=f"{fix}; nothing of this version was kept",
    )


def _reserved(reserving: Callable[[], str]) -> str:
    """The directory ``reserving`` returns once the name is reserved; if
    the same full disk stopped the reservation, the directory of the
    version it names (this leaf's error says more: what filled the disk);
    anything else that refused the name is raised."""
    try:
        return reserving()
    except StorageError as e:
        if not filled(e) or not e.context:
            raise
        return e.context
