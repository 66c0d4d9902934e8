"""``log.jsonl``: one JSON event per line, appended whole.

Each event is one ``write`` of one complete line to a file opened for
appending, never through a link, then fsynced. A crash can still leave the
last line torn; reading skips a line that is not a whole event, and the
next append first ends the torn line, so a torn line never swallows the
event written after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Callable
from typing import Any

from .. import interrupts, strictjson
from ..atomic import FILE_MODE, file_kind, read_regular
from ..errors import FormatError, StoreError
from .layout import LOG_FILE
from .records import now

#: The most bytes of log ``history`` reads.
LOG_LIMIT = 256 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Event:
    """One line of the store's log.

    Attributes:
      time: ISO 8601 in UTC.
      action: ``init``, ``put``, ``verify``, ``promote``, ``rollback``,
        ``gc``, ``fallback``, or one a caller logged (a server's ``swap``).
      version: the version acted on (the new current for promote and
        rollback), or None.
      detail: the rest: status, reason, previous current, removed versions.
    """

    time: str
    action: str
    version: str | None
    detail: dict[str, Any]


def append(
    root: str,
    action: str,
    version: str | None,
    detail: dict[str, Any],
    *,
    written: Callable[[], object] | None = None,
) -> None:
    """Appends one event; call it under the store's lock. ``written`` is
    called once the line is written, before it is synced (an interrupt
    during the sync then comes after it); Ctrl-C is held from the line's
    write to that call, so the line is never written without it."""
    line = json.dumps(
        {"time": now(), "action": action, "version": version, "detail": detail},
        sort_keys=True,
        ensure_ascii=True,
        default=str,
    ).encode("ascii")
    path = os.path.join(root, LOG_FILE)
    flags = (
        os.O_RDWR
        | os.O_APPEND
        | os.O_CREAT
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NONBLOCK", 0)
    )
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as e:
        raise StoreError(
            f"cannot open the log for appending ({e.strerror})",
            context=path,
            hint="the log must be a regular file; the store never follows links",
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(
                f"the log is {file_kind(st.st_mode)}, not a regular file",
                context=path,
                hint="remove it; the store starts a new log",
            )
        torn = st.st_size > 0 and os.pread(fd, 1, st.st_size - 1) != b"\n"
        with interrupts.deferred():
            os.write(fd, (b"\n" if torn else b"") + line + b"\n")
            if written is not None:
                written()
        os.fsync(fd)
    finally:
        os.close(fd)


def read(root: str) -> list[Event]:
    """Every whole event, oldest first; torn or foreign lines are skipped.

    Raises:
      StoreError: for a log that is not a regular file or is too large.
    """
    path = os.path.join(root, LOG_FILE)
    if not os.path.lexists(path):
        return []
    try:
        raw = read_regular(path, limit=LOG_LIMIT, what="log")
    except FormatError as e:
        raise StoreError(e.message, context=path, hint=e.hint) from e
    out: list[Event] = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        event = parse(line)  # None: a line torn by a crash
        if event is not None:
            out.append(event)
    return out


def parse(raw: bytes) -> Event | None:
    """The event one log line (or one log object) holds, or None if it is
    not a whole event."""
    try:
        d = strictjson.loads(raw, "a log line")
    except FormatError:
        return None
    if (
        isinstance(d, dict)
        and isinstance(d.get("time"), str)
        and isinstance(d.get("action"), str)
        and isinstance(d.get("version"), (str, type(None)))
        and isinstance(d.get("detail", {}), dict)
    ):
        return Event(d["time"], d["action"], d.get("version"), d.get("detail") or {})
    return None
