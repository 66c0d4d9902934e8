"""Where a store keeps what, and how each path in it is opened.

A store is a directory that holds a marker, ``STORE.json``; nothing else is
treated as a store. Every path inside is checked before it is used: the
root, ``versions/`` and each version's directory must be real directories
(never symbolic links), and files are opened only through
``atomic.open_regular``, which follows no link and never blocks. Version
names are validated so none escapes the root, and auto-numbered names come
from a counter in the marker, so a name is never handed out twice.

::

    ROOT/
      STORE.json       the marker: format, the store's id, the name counter,
                       the names gc retired, ``dedup`` (puts store tensors
                       once per content)
      CURRENT.json     the pointer (see pointer.py)
      log.jsonl        the event log (see log.py)
      .lock            taken with flock around every change
      versions/NAME/   model.safetensors and status.json (see records.py);
                       a sharded version holds, instead of the file,
                       save_sharded's treeguard.sharded.json and data-<hex>/;
                       a tensors version, tensors.json (see tensors.py)
      tensors/, doomed/  a dedup store's shared tensor objects and gc's marks
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterator
from typing import Any

from .. import dirtree, strictjson
from ..atomic import FILE_MODE, DirSyncs, file_kind
from ..errors import (
    ConflictError,
    FormatError,
    IntegrityError,
    NotAStoreError,
    StoreError,
    UnknownVersionError,
)
from .storage import Conflict, LocalStorage

STORE_FORMAT = "treeguard.store/1"
MARKER_FILE = "STORE.json"
MODEL_FILE = "model.safetensors"
STATUS_FILE = "status.json"
POINTER_FILE = "CURRENT.json"
LOG_FILE = "log.jsonl"
VERSIONS = "versions"
LOCK_FILE = ".lock"
#: The most bytes a small store file (marker, pointer, status) may have.
SMALL_FILE_LIMIT = 16 * 1024 * 1024
#: The most entries a sharded version directory may hold, at every depth.
MAX_TREE_ENTRIES = 1_000_000

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
AUTO_RE = re.compile(r"^v(\d{6,18})$")

_NOT_A_STORE_HINT = (
    "pass the directory given to the first put, or make this one a store with "
    "`treeguard store init ROOT` (ArtifactStore.init(root))"
)


def check_name(version: object) -> str:
    """``version`` if it can name a version, else ``UnknownVersionError``."""
    if not isinstance(version, str) or not NAME_RE.match(version) or ".." in version:
        raise UnknownVersionError(
            f"{str(version)[:60]!r} is not a version name: names are 1-128 letters, digits, "
            "'.', '_' or '-', starting with a letter or digit, so none escapes the store root",
            hint="use a name such as 'v000003' or 'release-2'",
        )
    return version


def _kind(path: str) -> str | None:
    """What is at ``path`` (without following a link), or None if nothing."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return "dir" if stat.S_ISDIR(mode) else file_kind(mode)


class Layout:
    """The paths of one store, and the checks made before each is used.

    Args:
      root: the store's directory.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.storage = LocalStorage(self.root)
        self._seen = threading.local()  # the marker's tag as each thread last read it

    @property
    def _marker_tag(self) -> str | None:
        return getattr(self._seen, "tag", None)

    @_marker_tag.setter
    def _marker_tag(self, tag: str | None) -> None:
        self._seen.tag = tag

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def kind(self, *parts: str) -> str | None:
        """What is at a path under the root: ``"dir"``, another kind of
        file (``atomic.file_kind``), or None for nothing; no link is followed."""
        return _kind(self.path(*parts))

    # -- the marker ------------------------------------------------------

    def exists(self) -> bool:
        """Whether the root holds a store's marker (a regular file)."""
        return _kind(self.path(MARKER_FILE)) == "a regular file"

    def require(self) -> dict[str, Any]:
        """The marker, after checking that the root is a store.

        Raises:
          NotAStoreError: for a root that is missing, a link, not a directory,
            or holds no marker.
          StoreError: for a damaged marker; for a ``versions``
            that is not a real directory.
        """
        kind = _kind(self.root)
        if kind != "dir":
            what = "does not exist" if kind is None else f"is {kind}, not a directory"
            raise NotAStoreError(
                f"the store root {what}", context=self.root, hint=_NOT_A_STORE_HINT
            )
        if not self.exists():
            kind = _kind(self.path(MARKER_FILE))
            what = f" ({MARKER_FILE} is {kind})" if kind else f" (no {MARKER_FILE})"
            raise NotAStoreError(
                f"not a treeguard store{what}", context=self.root, hint=_NOT_A_STORE_HINT
            )
        marker = self._read_marker()
        self.versions_dir()
        return marker

    def _read_marker(self) -> dict[str, Any]:
        path = self.path(MARKER_FILE)
        try:
            found = self.storage.read(MARKER_FILE, limit=SMALL_FILE_LIMIT, what="store marker")
            if found is None:
                raise StoreError(
                    f"not a treeguard store (no {MARKER_FILE})",
                    context=self.root,
                    hint=_NOT_A_STORE_HINT,
                )
            raw, self._marker_tag = found
            data = strictjson.loads(raw, "the store marker", context=path)
        except FormatError as e:
            raise StoreError(e.message, context=path, hint=e.hint) from e
        if (
            not isinstance(data, dict)
            or data.get("format") != STORE_FORMAT
            or not isinstance(data.get("id"), str)
            or not isinstance(data.get("counter"), int)
            or isinstance(data.get("counter"), bool)
            or not isinstance(data.get("retired", []), list)
            or not all(isinstance(n, str) for n in data.get("retired", []))
            or not isinstance(data.get("promoted", False), bool)
            or not isinstance(data.get("signed", False), bool)
            or not isinstance(data.get("dedup", False), bool)
            or not isinstance(data.get("seq", 0), int)
            or isinstance(data.get("seq", 0), bool)
        ):
            raise StoreError(
                f"the store marker is not a {STORE_FORMAT} marker",
                context=path,
                hint="restore STORE.json from a backup; the store will not guess what it held",
            )
        return data

    def write_marker(self, marker: dict[str, Any], *, dirs: DirSyncs | None = None) -> None:
        """Replaces the marker read last, only if it is still that one
        (``dirs``: the root's fsync is left to these, ``atomic.DirSyncs``).

        Raises:
          ConflictError: if another process changed it since.
        """
        got = self.storage.swap(
            MARKER_FILE, (strictjson.dumps(marker) + "\n").encode(), self._marker_tag, dirs=dirs
        )
        if isinstance(got, Conflict):
            raise ConflictError(
                "the store marker changed under this process",
                context=self.path(MARKER_FILE),
                hint="another process changed the store at the same time; retry",
            )
        self._marker_tag = got

    def init(self) -> dict[str, Any]:
        """Makes the root a store (creating it if absent); a no-op on a store.

        Raises:
          StoreError: for a root or ``versions`` that is a link or not a
            directory.
        """
        kind = _kind(self.root)
        if kind is None:
            os.makedirs(self.root, exist_ok=True)
        elif kind != "dir":
            raise StoreError(
                f"the store root is {kind}, not a directory",
                context=self.root,
                hint="pass a directory",
            )
        if self.exists():
            return self.require()
        versions = self.path(VERSIONS)
        vkind = _kind(versions)
        if vkind is None:
            with contextlib.suppress(FileExistsError):  # another first put made it
                os.mkdir(versions)
        elif vkind != "dir":
            raise StoreError(
                f"{VERSIONS} is {vkind}, not a directory",
                context=self.root,
                hint="the store never follows links; remove it or pick another root",
            )
        counter = max(
            (int(m.group(1)) for n in os.listdir(versions) if (m := AUTO_RE.match(n))), default=0
        )
        marker = {
            "format": STORE_FORMAT,
            "id": secrets.token_hex(16),
            "counter": counter,
            "retired": [],
        }
        # Created only if absent: of two processes making the same store at
        # once, one marker wins and both use it.
        got = self.storage.create(MARKER_FILE, (strictjson.dumps(marker) + "\n").encode())
        if isinstance(got, Conflict):
            return self.require()
        self._marker_tag = got
        return marker

    # -- directories -----------------------------------------------------

    def versions_dir(self) -> str:
        path = self.path(VERSIONS)
        kind = _kind(path)
        if kind != "dir":
            what = "missing" if kind is None else f"{kind}, not a directory"
            raise StoreError(
                f"{VERSIONS} is {what}",
                context=self.root,
                hint="the store never follows links; restore versions/ from a backup",
            )
        return path

    def version_dir(self, version: str) -> str:
        """The directory of ``version`` (which may not exist yet)."""
        return os.path.join(self.versions_dir(), check_name(version))

    def existing_version(self, version: str) -> str:
        """The directory of an existing version, after checking it is real.

        Raises:
          UnknownVersionError: if there is no such version, or it is a link
            or not a directory.
        """
        path = self.version_dir(version)
        kind = _kind(path)
        if kind == "dir" and _kind(os.path.join(path, STATUS_FILE)) is not None:
            return path
        if kind not in (None, "dir"):
            raise UnknownVersionError(
                f"version {version} is {kind}, not a directory; refused",
                context=self.root,
                hint="the store never follows links; remove it",
            )
        raise UnknownVersionError(
            f"no version {version} in the store",
            context=self.root,
            hint="`treeguard store ls ROOT` lists the versions",
        )

    def names_taken(self) -> list[str]:
        """Every name under ``versions/``, whatever it is (a new version's
        name takes none of them; one syscall, where ``version_names`` looks
        at each)."""
        return os.listdir(self.versions_dir())

    def version_names(self) -> list[str]:
        """The names of the real directories under ``versions/`` that may be versions."""
        base = self.versions_dir()
        return sorted(
            n
            for n in os.listdir(base)
            if NAME_RE.match(n) and ".." not in n and _kind(os.path.join(base, n)) == "dir"
        )

    def plain_tree(self, directory: str, *, version: str) -> None:
        """Refuses a version directory that holds anything but regular files
        and real directories, at any depth (a link, a FIFO, a socket, a
        device). Nothing is followed or opened.

        Raises:
          IntegrityError: naming the first such entry.
        """
        try:
            self._plain_tree(directory, version=version)
        except OSError as e:  # removed or replaced while it was walked
            raise IntegrityError(
                f"version {version}: its directory changed while it was checked: "
                f"{e.strerror or type(e).__name__}: {e.filename}",
                version=version,
                context=directory,
                hint="something else is removing or replacing it; retry, or restore the "
                "version from a backup",
            ) from e

    def _plain_tree(self, directory: str, *, version: str) -> None:
        def refuse(path: str, mode: int) -> IntegrityError:
            return IntegrityError(
                f"version {version}: {path} is {file_kind(mode)}, not a file the store or "
                "orbax wrote; refused",
                version=version,
                context=directory,
                hint="the store never follows links; remove it, or restore the version "
                "from a backup",
            )

        def too_big(what: str) -> IntegrityError:
            return IntegrityError(
                f"version {version}: {what}; refused",
                version=version,
                context=directory,
                hint="restore the version from a backup",
            )

        dirtree.plain_bytes(directory, max_entries=MAX_TREE_ENTRIES, refuse=refuse, too_big=too_big)

    # -- the lock --------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, *, check: bool = True) -> Iterator[None]:
        """Holds the store's exclusive lock (``flock`` on ``.lock``), after
        checking that the root is a store (``check``; left out by a caller
        that reads the marker under the lock, or whose version it holds)."""
        if check:
            self.require()
        path = self.path(LOCK_FILE)
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0), FILE_MODE)
        except OSError as e:
            raise StoreError(
                f"cannot open the lock file ({e.strerror})",
                context=path,
                hint="the lock must be a regular file; remove whatever is there",
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(
                    f"the lock file is {file_kind(os.fstat(fd).st_mode)}",
                    context=path,
                    hint="remove it; the store makes a new one",
                )
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock
