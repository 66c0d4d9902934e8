"""Removing a version directory, through directory descriptors only.

Someone who can write ``versions/`` can swap a symbolic link into any path
between the moment gc looks at it and the moment it deletes. So nothing
here is ever resolved by path twice: the ``versions/`` directory and the
version's directory are opened once with ``O_NOFOLLOW | O_DIRECTORY``, and
every later look, rename, unlink and rmdir is relative to those
descriptors (``dir_fd=``). A link found anywhere is unlinked as a link or
keeps the version where it is; it is never followed.

A version is first renamed out of sight (``.trash-NAME-RANDOM``, atomic),
so a crash leaves either the whole version or a trash directory the next
gc clears; the renamed entry must be the very directory that was checked
(same device and inode), else nothing is deleted.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator

from ..atomic import stale_temp
from ..dirtree import plain_bytes
from ..errors import StoreError
from ..sharded.manifest import MANIFEST_NAME, is_data_name
from .layout import MAX_TREE_ENTRIES, MODEL_FILE, STATUS_FILE
from .storage import open_dir
from .tensors import TENSORS_FILE

#: The prefix of a version directory being removed.
TRASH = ".trash-"
#: The only files a version directory holds that the store wrote: the
#: checkpoint, the record, a sharded version's manifest and a tensors
#: version's manifest.
OWN_FILES = (MODEL_FILE, STATUS_FILE, MANIFEST_NAME, TENSORS_FILE)


@contextlib.contextmanager
def opened_dir(name: str, *, dir_fd: int | None = None) -> Iterator[int]:
    """``open_dir`` as a context manager that closes the descriptor."""
    fd = open_dir(name, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _mode(name: str, dir_fd: int) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def _own_file(name: str) -> bool:
    """A file the store writes, or a temp of one left by a dead writer."""
    if name in OWN_FILES:
        return True
    temp = stale_temp(name)
    return temp is not None and temp in OWN_FILES


def _orbax_dir(name: str) -> bool:
    """A directory ``save_sharded`` writes: a data directory, or orbax's
    temporary directory of one."""
    head = name.split(".", 1)[0]
    return is_data_name(name) or (is_data_name(head) and ".orbax-checkpoint-tmp" in name)


def _not_plain(*what: object) -> StoreError:
    return StoreError("not a directory the store wrote")  # caught below, never shown


def _plain(fd: int) -> bool:
    """Whether the directory open at ``fd`` holds only regular files and
    real directories, at every depth (followed nowhere)."""
    try:
        plain_bytes(fd, max_entries=MAX_TREE_ENTRIES, refuse=_not_plain, too_big=_not_plain)
    except (StoreError, OSError):
        return False
    return True


def _removable(name: str, fd: int, *, temps_only: bool) -> bool:
    mode = _mode(name, fd)
    if mode is None:
        return True  # gone already
    if temps_only:
        return stale_temp(name) in OWN_FILES and stat.S_ISREG(mode)
    if _orbax_dir(name) and stat.S_ISDIR(mode):
        try:
            with opened_dir(name, dir_fd=fd) as sub:
                return _plain(sub)
        except OSError:
            return False
    return _own_file(name) and stat.S_ISREG(mode)


def _empty(fd: int) -> None:
    """Removes everything in the directory open at ``fd``, bottom up; a link
    is unlinked, never followed."""
    for name in os.listdir(fd):
        mode = _mode(name, fd)
        if mode is None:
            continue
        if stat.S_ISDIR(mode):
            with opened_dir(name, dir_fd=fd) as sub:
                _empty(sub)
            os.rmdir(name, dir_fd=fd)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=fd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def remove_version(
    base: str, name: str, *, may_remove: Callable[[int], bool] | None = None
) -> bool:
    """Removes ``base/name`` if it is a real directory holding only what the
    store wrote (without a record: only stale temps of the store's files,
    left by a put that died before it wrote the record).

    Args:
      base: the ``versions/`` directory.
      name: the version's name there.
      may_remove: called with the version directory's descriptor, after it
        is opened and before anything is removed; a false answer keeps the
        version (gc reads the record through it, and retires the name).

    Returns:
      Whether it was removed.
    """
    try:
        bfd = open_dir(base)
    except OSError:
        return False
    try:
        try:
            vfd = open_dir(name, dir_fd=bfd)
        except OSError:
            return False
        try:
            return _remove_open(bfd, vfd, name, may_remove=may_remove)
        finally:
            os.close(vfd)
    finally:
        os.close(bfd)


def _remove_open(
    bfd: int, vfd: int, name: str, *, may_remove: Callable[[int], bool] | None
) -> bool:
    try:
        names = os.listdir(vfd)
        temps_only = STATUS_FILE not in names
        if not all(_removable(n, vfd, temps_only=temps_only) for n in names):
            return False
    except OSError:
        return False
    if may_remove is not None and not may_remove(vfd):
        return False
    try:
        names = os.listdir(vfd)
        if not all(_removable(n, vfd, temps_only=temps_only) for n in names):
            return False
    except OSError:
        return False
    checked = os.fstat(vfd)
    trash = f"{TRASH}{name}-{secrets.token_hex(4)}"
    try:
        os.rename(name, trash, src_dir_fd=bfd, dst_dir_fd=bfd)
    except OSError:
        return False
    try:
        renamed = os.stat(trash, dir_fd=bfd, follow_symlinks=False)
    except OSError:
        return False
    if not _same(renamed, checked):
        return False  # something else was swapped in: the next gc sees it as trash, unfollowed
    return _remove_trash_open(bfd, vfd, trash)


def _remove_trash_open(bfd: int, vfd: int, trash: str) -> bool:
    try:
        _empty(vfd)
        os.rmdir(trash, dir_fd=bfd)
    except OSError:
        return False
    return True


def clean(base: str) -> None:
    """Finishes removals a crash interrupted, and reclaims dead writers' temps.

    A ``.trash-*`` directory in ``base`` that holds only what the store
    wrote is emptied through descriptors and removed; a trash entry that is
    no directory (a link swapped in) is unlinked, never followed. In every
    other real directory, the stale temps of the store's files go."""
    try:
        bfd = open_dir(base)
    except OSError:
        return
    try:
        for name in os.listdir(bfd):
            mode = _mode(name, bfd)
            if mode is None:
                continue
            if not name.startswith(TRASH):
                if stat.S_ISDIR(mode):
                    _remove_stale_temps(name, bfd)
                continue
            if not stat.S_ISDIR(mode):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=bfd)
                continue
            try:
                vfd = open_dir(name, dir_fd=bfd)
            except OSError:
                continue
            try:
                if all(_removable(n, vfd, temps_only=False) for n in os.listdir(vfd)):
                    _remove_trash_open(bfd, vfd, name)
            except OSError:
                continue
            finally:
                os.close(vfd)
    finally:
        os.close(bfd)


def _remove_stale_temps(name: str, bfd: int) -> None:
    try:
        fd = open_dir(name, dir_fd=bfd)
    except OSError:
        return
    try:
        for n in os.listdir(fd):
            mode = _mode(n, fd)
            if mode is not None and stat.S_ISREG(mode) and stale_temp(n) is not None:
                with contextlib.suppress(OSError):
                    os.unlink(n, dir_fd=fd)
    finally:
        os.close(fd)
