"""The file primitives every writer and reader shares.

Writes are atomic: the bytes go to a uniquely named temp file beside the
target (``.NAME.PID.RANDOM.tmp``), which is fsynced and renamed over the
target, and then the directory is fsynced. A crash at any instant leaves the
old file or the new one, never a mix, and a failed write leaves no temp file.
Temps of a writer that died are reclaimed by :func:`remove_stale_temps`.

Reads never follow a symbolic link, never block on a FIFO or a device and are
bounded: :func:`open_regular` opens only regular files, and
:func:`read_regular` refuses a file larger than its limit before reading it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import threading
from collections.abc import Callable
from concurrent.futures import Executor

from . import interrupts
from .errors import FormatError

#: Bytes one ``os.write`` call hands the kernel.
CHUNK = 64 * 1024 * 1024
#: The mode of every file treeguard writes (before the umask), as ``open`` gives.
FILE_MODE = 0o666

_TMP_RE = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def file_kind(mode: int) -> str:
    """What a file that is not regular is, for an error message.

    Example:
      >>> file_kind(stat.S_IFIFO)
      'a FIFO'
    """
    for test, kind in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return kind
    return "not a file"  # pragma: no cover - every POSIX file type is named above


def temp_path(target: str) -> str:
    """A fresh temp name beside ``target``, recognised by :func:`remove_stale_temps`."""
    dirname, base = os.path.split(target)
    return os.path.join(dirname, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


#: What ``fsync`` of a directory answers where the file system or the
#: platform has none: no failure of the disk, and nothing to sync.
_NO_DIR_FSYNC = frozenset(
    getattr(errno, name)
    for name in ("EINVAL", "EBADF", "ENOSYS", "ENOTSUP", "EOPNOTSUPP", "EROFS")
    if hasattr(errno, name)
)


#: What opening a directory for its fsync answers when the process or the
#: disk, not the platform, fails it: the sync did not happen.
_NO_DIR_OPEN_NOW = frozenset(
    getattr(errno, name) for name in ("EMFILE", "ENFILE", "ENOMEM", "EIO") if hasattr(errno, name)
)


def fsync_dir(dirname: str) -> None:
    """Makes a rename or an unlink in ``dirname`` durable.

    Raises:
      OSError: if the disk failed the fsync (an EIO, a full disk), or the
        directory could not be opened for it (no descriptor left, an EIO),
        naming the directory: the entries may not outlive a crash. A file
        system or platform without directory fsyncs (or that opens no
        directory) is no failure.
    """
    try:
        dfd = os.open(dirname or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError as e:
        if e.errno in _NO_DIR_OPEN_NOW:
            raise _naming(e, dirname or ".") from None
        return  # a platform that opens no directory, or one gone: nothing to sync
    try:
        os.fsync(dfd)
    except OSError as e:
        if e.errno not in _NO_DIR_FSYNC:
            raise _naming(e, dirname or ".") from None
    finally:
        os.close(dfd)


def _naming(e: OSError, path: str) -> OSError:
    """``e``, a failed call on a descriptor, as the error naming ``path``."""
    return OSError(e.errno, e.strerror, os.path.abspath(path))


class DirSyncs:
    """Directories whose new entries (a rename, a link, a ``mkdir``), and
    files whose bytes, are made durable later, together: ``sync`` fsyncs
    each once. A writer whose entries must all be durable before one last
    write (a store's put before its record) syncs them in one batch there,
    rather than one after each entry: on a journaling file system the first
    fsync commits them all and the others return at once, and none of them
    waits, one after another, behind a large file's bytes another thread is
    syncing. Safe to share between threads.

    Example:
      >>> import tempfile, os
      >>> d = tempfile.mkdtemp()
      >>> later = DirSyncs()
      >>> atomic_write(os.path.join(d, "a"), b"1", dirs=later)  # the file fsynced, not d
      >>> later.pending() == [d]
      True
      >>> later.sync(); later.pending()
      []
      >>> write_new(os.path.join(d, "b"), b"2", sync=False)  # its fsync left to later
      >>> later.add_file(os.path.join(d, "b")); later.add(d)
      >>> later.sync(); later.pending()
      []
      >>> later.add_file(os.path.join(d, "gone")); later.sync()
      Traceback (most recent call last):
      ...
      FileNotFoundError: [Errno 2] No such file or directory: '...gone'
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dirs: dict[str, None] = {}  # in the order added, each once
        self._files: dict[str, None] = {}

    def add(self, dirname: str) -> None:
        """Makes ``dirname`` one of the directories the next ``sync`` fsyncs."""
        with self._lock:
            self._dirs[os.path.abspath(dirname or ".")] = None

    def add_file(self, path: str) -> None:
        """Makes the file at ``path`` (written, not yet fsynced, and not to
        be renamed before the ``sync``) one of those the next ``sync``
        fsyncs; its directory's entry is ``add``'s to ask for."""
        with self._lock:
            self._files[os.path.abspath(path)] = None

    def pending(self) -> list[str]:
        """The directories and files the next ``sync`` fsyncs."""
        with self._lock:
            return [*self._dirs, *self._files]

    def sync(self, pool: Executor | None = None) -> None:
        """Fsyncs each directory and file added since the last ``sync``,
        once; all at the same time when ``pool``'s threads are given (each
        fsync may wait for its own flush of the disk's cache; flushes asked
        for at once are served by one).

        Raises:
          OSError: if a file or a directory could not be synced (a
            directory's fsync is skipped where the file system has none).
        """
        with self._lock:
            jobs = [(fsync_dir, d) for d in self._dirs] + [(fsync_file, f) for f in self._files]
            self._dirs, self._files = {}, {}
        if pool is None:
            for job, path in jobs:
                job(path)
            return
        others = [pool.submit(job, path) for job, path in jobs[1:]]
        try:
            for job, path in jobs[:1]:
                job(path)
        finally:
            for f in others:
                interrupts.result(f)  # Ctrl-C never leaves a future's lock held


def fsync_file(path: str) -> None:
    """Makes the bytes a writer left in the regular file at ``path`` durable.

    Raises:
      OSError: if it cannot be opened or synced, naming it.
    """
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        raise _naming(e, path) from None
    finally:
        os.close(fd)


def sync_dir(dirname: str, later: DirSyncs | None = None) -> None:
    """Fsyncs ``dirname`` now, or leaves it to ``later`` when given."""
    if later is None:
        fsync_dir(dirname)
    else:
        later.add(dirname)


def write_all(fd: int, buf: memoryview | bytes) -> None:
    """Writes every byte of ``buf`` (``os.write`` may write fewer)."""
    view = memoryview(buf).cast("B")
    while len(view):
        n = os.write(fd, view[:CHUNK])
        view = view[n:]


def write_new(path: str, data: bytes | memoryview, *, sync: bool = True) -> None:
    """Creates ``path`` (which must not exist), writes ``data`` and fsyncs
    it (unless not ``sync``: the caller's ``DirSyncs.add_file`` then), but
    not its directory: for a temp file linked under its final name next,
    whose directory the caller then fsyncs. Removed if it fails.

    Raises:
      FileExistsError: if ``path`` exists.
      OSError: if it cannot be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    try:
        try:
            _written(fd, data, sync, path)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _written(
    fd: int, data: bytes | memoryview | Callable[[int], None], sync: bool, path: str
) -> None:
    """``data`` written to ``fd`` (or written by it, a function of the
    descriptor), fsynced when ``sync``; a write or a sync that fails is the
    ``OSError`` naming ``path`` (the file the caller means: ``atomic_write``'s
    target, ``write_new``'s own path)."""
    try:
        if callable(data):
            data(fd)
        else:
            write_all(fd, data)
        if sync:
            os.fsync(fd)
    except OSError as e:
        if e.filename is not None:
            raise
        raise _naming(e, path) from None


def atomic_write(
    path: str | os.PathLike[str],
    data: bytes | Callable[[int], None],
    /,
    *,
    sync: bool = True,
    dirs: DirSyncs | None = None,
) -> None:
    """Replaces ``path`` with new content, atomically and durably.

    Args:
      path: the file to write. A symbolic link there is replaced, never
        followed.
      data: the bytes, or a function that writes them to the open file
        descriptor it is given (and may ``pwrite`` into it).
      sync: fsync the file and the directory (turn off only for scratch files).
      dirs: with ``sync``, the directory is added to these, for the caller
        to sync later with others (the file itself is fsynced before its
        rename all the same), instead of synced now.

    Raises:
      OSError: if the directory cannot be written; nothing is left behind.

    Example:
      >>> import tempfile, pathlib
      >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.json"
      >>> atomic_write(target, b"{}")
      >>> target.read_bytes(), oct(target.stat().st_mode & 0o777) == oct(0o666 & ~current_umask())
      (b'{}', True)
    """
    target = os.path.abspath(os.fspath(path))
    tmp = temp_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    try:
        try:
            _written(fd, data, sync, target)
        finally:
            os.close(fd)
        os.replace(tmp, target)  # a failed rename (a directory there) leaves no temp
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        sync_dir(os.path.dirname(target), dirs)


def current_umask() -> int:
    """The process's umask (read without changing it for long)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def process_mark(pid: int | None = None) -> str | None:
    """What tells a process apart from any other that had or will have its
    pid on this host: the boot's id and the process's start time (in clock
    ticks since the boot), ``"BOOT:START"``; None where ``/proc`` does not
    say (not Linux, or no such process). ``pid``: this process by default.

    Example:
      >>> mark = process_mark()
      >>> mark is None or mark == process_mark(os.getpid())
      True
    """
    try:
        boot = _read_proc("/proc/sys/kernel/random/boot_id").strip()
        stat = _read_proc(f"/proc/{os.getpid() if pid is None else pid}/stat")
        start = stat[stat.rindex(")") + 2 :].split()[19]  # field 22, after the name
    except (OSError, ValueError, IndexError):
        return None
    return f"{boot}:{start}" if boot and start.isdigit() else None


def _read_proc(path: str) -> str:
    with open(path, encoding="ascii", errors="replace") as f:
        return f.read(4096)


def writer_alive(pid: int, mark: object = None) -> bool:
    """Whether the writer that recorded ``pid`` (and ``mark``, its
    ``process_mark`` then, if it recorded one) still runs on this host: a
    process with that pid exists and, where both marks can be read, is the
    same process (not one that got the pid after a restart or a reboot)."""
    if not pid_alive(pid):
        return False
    if not isinstance(mark, str):
        return True  # recorded by an older build, or where /proc said nothing
    now = process_mark(pid)
    return now is None or now == mark


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def stale_temp(name: str, /) -> str | None:
    """The target name of a temp file left by a writer that is gone, or None
    (not a temp of ours, or its writer still runs).

    Example:
      >>> stale_temp(f".status.json.{2**22 + 1}.0123abcd.tmp")
      'status.json'
      >>> stale_temp(".notes.tmp") is None
      True
    """
    m = _TMP_RE.match(name)
    if m is None or pid_alive(int(m.group("pid"))):
        return None
    return m.group("base")


def remove_stale_temps(dirname: str, base: str | None = None) -> list[str]:
    """Removes temp files left by writers that died (their pid is gone).

    A crash during a write leaves ``.{name}.{pid}.{random}.tmp`` beside the
    target. It never blocks a later write (every writer uses a fresh name);
    this only reclaims the space. Only regular files are removed.

    Args:
      dirname: the directory to clean.
      base: only temps for this target file name; all when None.

    Returns:
      The names removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(dirname or ".")
    except OSError:
        return removed
    for entry in names:
        m = _TMP_RE.match(entry)
        if m is None or (base is not None and m.group("base") != base):
            continue
        if pid_alive(int(m.group("pid"))):
            continue
        path = os.path.join(dirname, entry)
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
                removed.append(entry)
    return removed


def open_regular(
    path: str | os.PathLike[str], /, *, what: str = "file", dir_fd: int | None = None
) -> int:
    """Opens a regular file for reading and returns its descriptor.

    A symbolic link (also one swapped in after a check), a directory, a FIFO,
    a device or a socket is refused without blocking.

    Args:
      path: the file.
      what: what the file is, for the message (``"checkpoint"``).
      dir_fd: a directory descriptor ``path`` is relative to.

    Raises:
      FormatError: for anything that is not a regular file, naming its kind.
      FileNotFoundError: if nothing is there.

    Example:
      >>> import tempfile
      >>> open_regular(tempfile.mkdtemp(), what="status file")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ...: the status file is not a regular file but a directory
      hint: ...
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise _not_regular(name, what, stat.S_IFLNK) from None
        if e.errno == errno.EISDIR:
            raise _not_regular(name, what, stat.S_IFDIR) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _not_regular(name, what, st.st_mode)
    return fd


def _not_regular(name: str, what: str, mode: int) -> FormatError:
    return FormatError(
        f"the {what} is not a regular file but {file_kind(mode)}",
        context=name,
        hint="treeguard reads only regular files it wrote, and never follows links; "
        "remove what is there and write the file again",
    )


def read_regular(
    path: str | os.PathLike[str],
    /,
    *,
    limit: int,
    what: str = "file",
    dir_fd: int | None = None,
) -> bytes:
    """Reads a whole regular file of at most ``limit`` bytes (see :func:`open_regular`;
    ``dir_fd`` is a directory descriptor ``path`` is relative to).

    Raises:
      FormatError: for a file that is not regular, or larger than ``limit``.
      FileNotFoundError: if nothing is there.

    Example:
      >>> import tempfile, pathlib
      >>> p = pathlib.Path(tempfile.mkdtemp()) / "x"
      >>> _ = p.write_bytes(b"abc")
      >>> read_regular(p, limit=3)
      b'abc'
    """
    fd = open_regular(path, what=what, dir_fd=dir_fd)
    try:
        return _read_all(fd, os.fstat(fd).st_size, limit=limit, what=what, name=os.fspath(path))
    finally:
        os.close(fd)


def _read_all(fd: int, size: int, *, limit: int, what: str, name: str) -> bytes:
    """The whole of the open file ``fd`` of ``size`` bytes, at most ``limit``."""
    if size > limit:
        raise FormatError(
            f"the {what} is {size} bytes, more than the {limit} allowed",
            context=name,
            hint="this is not a file treeguard wrote; restore it from a backup",
        )
    chunks: list[bytes] = []
    total = 0
    while total <= limit:  # the file may grow while it is read
        chunk = os.read(fd, min(CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    if total > limit:
        raise FormatError(
            f"the {what} grew past the {limit} bytes allowed while it was read",
            context=name,
        )
    return b"".join(chunks)


def read_key_file(
    path: str,
    /,
    *,
    what: str,
    limit: int,
    outside: str | None,
    fix: str,
    refuse: Callable[[str, str], Exception],
) -> tuple[bytes, int]:
    """Reads a key file, which must stay secret: a regular file (see
    :func:`open_regular`) of at most ``limit`` bytes that does not lie inside
    the directory ``outside`` (a store's root, where anyone who can write the
    store could read or replace it).

    Args:
      path: the key file.
      what: what it is, for the messages (``"key file"``).
      limit: the most bytes it may hold.
      outside: a directory it may not lie in, or None.
      fix: the hint for a file that cannot be read or is too large.
      refuse: makes the error to raise from a message and a hint.

    Returns:
      Its bytes, and its mode (``st_mode`` of the file read) for the
      caller's rule on who else may read or write it.

    Raises:
      Exception: ``refuse(message, hint)`` for a key file inside ``outside``,
        one that cannot be read or is not a regular file, or one over ``limit``.

    Example:
      >>> import tempfile, os
      >>> d = tempfile.mkdtemp()
      >>> with open(os.path.join(d, "k"), "w") as f:
      ...     _ = f.write("secret")
      >>> read_key_file(os.path.join(d, "k"), what="key", limit=64, outside=None, fix="",
      ...               refuse=lambda m, h: ValueError(m))[0]
      b'secret'
      >>> read_key_file(os.path.join(d, "k"), what="key", limit=64, outside=d, fix="",
      ...               refuse=lambda m, h: ValueError(m))
      Traceback (most recent call last):
      ...
      ValueError: the key lies inside the store's directory, where anyone who can write ...
    """
    if outside is not None:
        real, root = os.path.realpath(path), os.path.realpath(outside)
        if os.path.commonpath([real, root]) == root:
            raise refuse(
                f"the {what} lies inside the store's directory, where anyone who can write "
                "the store can read or replace it",
                "keep the key outside the store, readable only by its owner (chmod 600)",
            )
    try:
        fd = open_regular(path, what=what)
        try:
            st = os.fstat(fd)
            data = _read_all(fd, st.st_size, limit=limit, what=what, name=path)
        finally:
            os.close(fd)
    except FormatError as e:  # its own hint speaks of checkpoints: the caller's fix stands
        raise refuse(f"cannot read the {what}: {e.message}", fix) from None
    except OSError as e:
        raise refuse(f"cannot read the {what}: {e}", fix) from None
    return data, st.st_mode
