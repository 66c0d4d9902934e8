"""Walking a directory that must hold only regular files and real directories.

Every directory tree that treeguard reads or removes and did not just write
(an orbax checkpoint to import, a sharded checkpoint, a store's version) is
walked here first, because the libraries that read it follow symbolic links
and block forever opening a FIFO. The walk goes through directory descriptors
opened with ``O_NOFOLLOW | O_DIRECTORY`` and looks at each entry with
``lstat`` relative to its directory's descriptor, so nothing below the
directory is followed, not even a link swapped in for a subdirectory while
the walk runs (opening it then fails with ``ELOOP``). Each caller turns what
is refused into its own error.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterator

#: The deepest nesting of directories a walked tree may have; it also bounds
#: the descriptors the walk holds open at once.
MAX_DEPTH = 64

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@contextlib.contextmanager
def _opened(name: str, *, dir_fd: int | None, follow: bool) -> Iterator[int]:
    fd = os.open(name, _DIR_FLAGS | (0 if follow else _NOFOLLOW), dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def plain_bytes(
    directory: str | os.PathLike[str] | int,
    /,
    *,
    max_entries: int,
    refuse: Callable[[str, int], Exception],
    too_big: Callable[[str], Exception],
    found: Callable[[str], None] | None = None,
) -> int:
    """Walks ``directory`` without following any link and returns the bytes
    its regular files hold, refusing anything but regular files and real
    directories at any depth.

    ``directory`` itself is opened as named (a path reached through a link
    the caller chose is fine); nothing under it is followed. An entry that
    disappears during the walk is skipped: it is no longer there to be read.

    Args:
      directory: a path, or the descriptor of a directory already open (it
        stays open).
      max_entries: the most files and directories the tree may hold.
      refuse: builds the caller's error for an entry that is neither a
        regular file nor a directory, from its path relative to
        ``directory`` and its ``st_mode``.
      too_big: builds the caller's error for a tree over a bound, from a
        phrase naming it (``"more than 1,000 entries"``).
      found: called with each regular file's path relative to
        ``directory`` (``/`` between parts), in sorted order.

    Returns:
      The total size of the regular files, in bytes.

    Raises:
      Exception: what ``refuse`` or ``too_big`` built.
      OSError: when ``directory`` cannot be opened, or a subdirectory is
        replaced while it is walked (``ELOOP`` for a link).

    Example:
      >>> import os, tempfile
      >>> d = tempfile.mkdtemp()
      >>> os.makedirs(os.path.join(d, "a"))
      >>> with open(os.path.join(d, "a", "w.bin"), "wb") as f:
      ...     _ = f.write(b"1234")
      >>> def no(what, mode=0): return ValueError(what)
      >>> plain_bytes(d, max_entries=10, refuse=no, too_big=no)
      4
      >>> os.symlink("/etc", os.path.join(d, "a", "etc"))
      >>> plain_bytes(d, max_entries=10, refuse=no, too_big=no)
      Traceback (most recent call last):
      ...
      ValueError: a/etc
    """
    state = [0, 0]  # entries seen, bytes held

    def walk(fd: int, prefix: str, depth: int) -> None:
        for name in sorted(os.listdir(fd)):
            state[0] += 1
            if state[0] > max_entries:
                raise too_big(f"more than {max_entries:,} entries")
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                state[1] += st.st_size
                if found is not None:
                    found(prefix + name)
            elif not stat.S_ISDIR(st.st_mode):
                raise refuse(prefix + name, st.st_mode)
            elif depth >= MAX_DEPTH:
                raise too_big(f"directories nested more than {MAX_DEPTH} deep")
            else:
                try:
                    with _opened(name, dir_fd=fd, follow=False) as sub:
                        walk(sub, f"{prefix}{name}/", depth + 1)
                except FileNotFoundError:
                    continue

    if isinstance(directory, int):
        walk(directory, "", 0)
    else:
        with _opened(os.fspath(directory), dir_fd=None, follow=True) as top:
            walk(top, "", 0)
    return state[1]
