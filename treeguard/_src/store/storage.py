"""The storage a store's small records live on, as one small protocol.

Every store invariant needs only these operations on named objects (names
are ``/``-separated, relative to the store's root, such as
``versions/v000001/status.json``):

- ``create``: write an object only if none has that name;
- ``swap``: replace an object only if it is still the one read (its tag);
- ``read`` and ``read_range``: the bytes (and the tag) of an object;
- ``size``: how many bytes an object holds, none of them read;
- ``list``: the names under a prefix;
- ``delete``: remove one object.

A write that loses returns a typed outcome, never raises for it:
``Conflict.EXISTS`` (``create`` found the name taken) or
``Conflict.CHANGED`` (``swap`` found the object changed under it). Failing
storage raises ``StorageError`` naming the operation and the object.

``LocalStorage`` keeps today's local store: objects are files under the
root, written atomically (``atomic.atomic_write``), opened without following
links. ``create`` is ``link(2)`` of a finished temp file, which fails on an
existing name. Its tag is the file's device, inode, size and modification
time: every write makes a new inode, so a tag never matches a file written
since. Its ``swap`` compares the tag and renames in two steps, so it is a
compare-and-swap only among writers that hold the store's lock, as every
local writer does.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
from typing import Protocol

from ..atomic import (
    DirSyncs,
    atomic_write,
    fsync_file,
    open_regular,
    sync_dir,
    temp_path,
    write_new,
)
from ..errors import FormatError, StorageError, StoreError


class Conflict(enum.Enum):
    """Why a conditional write did not happen."""

    EXISTS = "exists"
    CHANGED = "changed"


class Storage(Protocol):
    """What a store needs of the storage under it."""

    def where(self, name: str) -> str:
        """How ``name`` is shown in a message (a path or a URL)."""
        ...

    def create(self, name: str, data: bytes | memoryview) -> str | Conflict:
        """Writes ``name`` only if absent; its new tag, or ``Conflict.EXISTS``."""
        ...

    def swap(self, name: str, data: bytes, expected: str | None) -> str | Conflict:
        """Replaces ``name`` only if its tag is ``expected`` (absent when
        None); its new tag, or ``Conflict.CHANGED``."""
        ...

    def read(
        self, name: str, *, limit: int, what: str, confirm_missing: bool = False
    ) -> tuple[bytes, str] | None:
        """The bytes and tag of ``name``, or None if absent (with
        ``confirm_missing``, absent by a second account where the storage
        has one: an object's HEAD beside its GET's 404)."""
        ...

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer at its end)."""
        ...

    def size(self, name: str) -> int | None:
        """How many bytes ``name`` holds, or None if absent."""
        ...

    def list(self, prefix: str) -> list[str]:
        """The names directly under ``prefix`` (a directory-like name)."""
        ...

    def delete(self, name: str) -> None:
        """Removes ``name``; nothing happens if it is absent."""
        ...


_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


def open_dir(name: str, *, dir_fd: int | None = None) -> int:
    """Opens a real directory (never through a link) and returns its descriptor.

    Raises:
      OSError: for a link (``ELOOP``), a file that is not a directory
        (``ENOTDIR``), or nothing there.
    """
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def check_object_name(name: str) -> str:
    """``name`` if it can name an object inside a store, else ``ValueError``."""
    parts = name.split("/")
    if not name or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{name!r} is not an object name inside a store")
    return name


class LocalStorage:
    """A store's objects as files under a local directory.

    Args:
      root: the store's directory.
    """

    def __init__(self, root: str) -> None:
        self.root = root

    def where(self, name: str) -> str:
        return os.path.join(self.root, *check_object_name(name).split("/"))

    def _failed(self, operation: str, name: str, e: OSError) -> StorageError:
        return StorageError(
            f"{operation} {name} failed: {e.strerror or type(e).__name__}",
            context=self.where(name),
            hint="free space or fix the permissions; the store was left as it was",
        )

    @staticmethod
    def _tag(st: os.stat_result) -> str:
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"

    def _tag_of(self, path: str) -> str | None:
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return None
        except FormatError as e:
            raise StoreError(e.message, context=path, hint=e.hint) from e
        try:
            return self._tag(os.fstat(fd))
        finally:
            os.close(fd)

    def create(
        self, name: str, data: bytes | memoryview, *, dirs: DirSyncs | None = None
    ) -> str | Conflict:
        """As the protocol's; ``dirs``: the directory's fsync is left to
        these (``atomic.DirSyncs``) rather than made now."""
        tag = self.link(self.stage(name, data), name)
        if not isinstance(tag, Conflict):
            sync_dir(os.path.dirname(self.where(name)), dirs)
        return tag

    def stage(self, name: str, data: bytes | memoryview, *, sync: bool = True) -> str:
        """Writes ``data`` to a fresh temp file beside ``name`` and fsyncs it
        (unless not ``sync``: then the caller's, before anything relies on
        it); its path, for ``link`` (the first half of ``create``, which a
        caller may run while it still works out the name: any name in the
        same directory will do)."""
        tmp = temp_path(self.where(name))
        try:
            write_new(tmp, data, sync=sync)  # durable once linked and the directory synced
        except OSError as e:
            raise self._failed("creating", name, e) from e
        return tmp

    def sync_staged(self, name: str, tmp: str) -> None:
        """Fsyncs the temp file ``stage`` wrote beside ``name`` with
        ``sync=False`` (before ``link``: a name is only given to bytes made
        durable)."""
        try:
            fsync_file(tmp)
        except OSError as e:
            raise self._failed("creating", name, e) from e

    def link(self, tmp: str, name: str, *, tag: bool = True) -> str | Conflict:
        """Names the temp file ``stage`` wrote ``name``, only if absent, and
        removes the temp; the new tag (``""`` when not ``tag``: a caller
        that needs none saves opening the file), or ``Conflict.EXISTS``.
        Durable once the caller fsyncs the directory (one fsync for several
        links)."""
        target = self.where(name)
        try:
            os.link(tmp, target)
        except FileExistsError:
            return Conflict.EXISTS
        except OSError as e:
            raise self._failed("creating", name, e) from e
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return (self._tag_of(target) or "") if tag else ""

    def swap(
        self, name: str, data: bytes, expected: str | None, *, dirs: DirSyncs | None = None
    ) -> str | Conflict:
        """As the protocol's; ``dirs`` as ``create``'s."""
        target = self.where(name)
        if self._tag_of(target) != expected:
            return Conflict.CHANGED
        if expected is None:
            return self.create(name, data, dirs=dirs)
        try:
            atomic_write(target, data, dirs=dirs)
        except OSError as e:
            raise self._failed("writing", name, e) from e
        return self._tag_of(target) or ""

    def read(
        self, name: str, *, limit: int, what: str, confirm_missing: bool = False
    ) -> tuple[bytes, str] | None:
        """The file's bytes and tag; None if absent (the file system's word,
        which ``confirm_missing`` has no second account of)."""
        path = self.where(name)
        try:
            fd = open_regular(path, what=what)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size > limit:
                raise FormatError(
                    f"the {what} is {st.st_size} bytes, more than the {limit} allowed",
                    context=path,
                    hint="the store writes this file itself; restore it from a backup",
                )
            data = _pread_all(fd, st.st_size)
            return data, self._tag(st)
        finally:
            os.close(fd)

    def read_range(self, name: str, start: int, length: int) -> bytes:
        path = self.where(name)
        fd = open_regular(path)
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def size(self, name: str) -> int | None:
        try:
            fd = open_regular(self.where(name), what="object")
        except FileNotFoundError:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def list(self, prefix: str) -> list[str]:
        path = self.where(prefix) if prefix else self.root
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def delete(self, name: str) -> None:
        """Unlinks ``name`` through descriptors of its real parent
        directories (a link on the way is never followed)."""
        *dirs, leaf = check_object_name(name).split("/")
        try:
            fd = open_dir(self.root)
        except OSError as e:
            raise self._failed("deleting", name, e) from e
        try:
            for d in dirs:
                sub = open_dir(d, dir_fd=fd)
                os.close(fd)
                fd = sub
            os.unlink(leaf, dir_fd=fd)
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno in (errno.EISDIR, errno.EPERM):
                raise ValueError(f"{name} is a directory, not an object") from None
            raise self._failed("deleting", name, e) from e
        finally:
            os.close(fd)


def _pread_all(fd: int, size: int) -> bytes:
    parts: list[bytes] = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        parts.append(chunk)
        offset += len(chunk)
    return b"".join(parts)
