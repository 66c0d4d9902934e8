"""``CURRENT.json``: the current version and the stack of former ones.

The pointer is replaced atomically under the store's lock. It is read
strictly: a pointer that is damaged, a link, a FIFO or a directory stops
every operation that depends on it with a ``StoreError`` naming the file,
rather than being taken for an empty store.
"""

from __future__ import annotations

import dataclasses
import os

from .. import strictjson
from ..atomic import atomic_write, read_regular
from ..errors import FormatError, StoreError
from .layout import NAME_RE, POINTER_FILE, SMALL_FILE_LIMIT, STORE_FORMAT
from .records import now


@dataclasses.dataclass(frozen=True)
class Pointer:
    """The current version (None before the first promotion) and the former
    current ones, most recent first."""

    current: str | None
    previous: tuple[str, ...]


def _damaged(path: str, why: str) -> StoreError:
    return StoreError(
        f"the pointer is damaged: {why}",
        context=path,
        hint="restore CURRENT.json from a backup; the store's log (log.jsonl) lists every "
        "promote and rollback",
    )


def read(root: str, *, promoted: bool) -> Pointer:
    """The pointer of the store at ``root``.

    Args:
      root: the store's directory.
      promoted: whether the store has promoted a version before (its marker
        says so); then a missing pointer is a damaged one, not an empty one.

    Raises:
      StoreError: for a pointer that cannot be read, is malformed, or is
        missing after a promotion.
    """
    path = os.path.join(root, POINTER_FILE)
    if not os.path.lexists(path):
        if promoted:
            raise _damaged(path, "it is missing, but the store has promoted versions")
        return Pointer(None, ())
    try:
        data = strictjson.loads(
            read_regular(path, limit=SMALL_FILE_LIMIT, what="pointer"),
            "the pointer",
            context=path,
        )
    except FormatError as e:
        raise _damaged(path, e.message) from e
    if not isinstance(data, dict):
        raise _damaged(path, "it is not a JSON object")
    current, previous = data.get("current"), data.get("previous", [])
    if current is not None and (not isinstance(current, str) or not NAME_RE.match(current)):
        raise _damaged(path, "current is not a version name")
    if not isinstance(previous, list) or not all(
        isinstance(v, str) and NAME_RE.match(v) for v in previous
    ):
        raise _damaged(path, "previous is not a list of version names")
    return Pointer(current, tuple(previous))


def write(root: str, pointer: Pointer) -> None:
    """Replaces the pointer atomically."""
    data = {
        "format": STORE_FORMAT,
        "current": pointer.current,
        "previous": list(pointer.previous),
        "updated": now(),
    }
    atomic_write(os.path.join(root, POINTER_FILE), (strictjson.dumps(data) + "\n").encode())
