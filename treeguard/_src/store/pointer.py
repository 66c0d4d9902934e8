"""``CURRENT.json``: the current version and the stack of former ones.

The pointer is replaced atomically under the store's lock. It is read
strictly: a pointer that is damaged, a link, a FIFO or a directory stops
every operation that depends on it with a ``StoreError`` naming the file,
rather than being taken for an empty store.
"""

from __future__ import annotations

import dataclasses

from .. import strictjson
from ..errors import ConflictError, FormatError, StoreError
from .layout import NAME_RE, POINTER_FILE, SMALL_FILE_LIMIT, STORE_FORMAT
from .records import now
from .storage import Conflict, Storage


@dataclasses.dataclass(frozen=True)
class Pointer:
    """The current version (None before the first promotion) and the former
    current ones, most recent first."""

    current: str | None
    previous: tuple[str, ...]
    #: the storage tag of the pointer this was read from (None: there was none)
    tag: str | None = dataclasses.field(default=None, compare=False)

    def promoting(self, version: str, depth: int) -> Pointer:
        """The pointer that makes ``version`` current: the current one goes on
        top of the former ones (``version`` taken out), ``depth`` kept."""
        stack = [v for v in self.previous if v != version]
        if self.current is not None:
            stack.insert(0, self.current)
        return Pointer(version, tuple(stack[:depth]))


def nothing_to_roll_back_to(ptr: Pointer, skipped: list[str], root: str) -> StoreError:
    """The error of a rollback that found no former version passing the gates."""
    return StoreError(
        f"no former version to roll back to passes the gates (current: {ptr.current})"
        + "".join(f"\n  skipped {s}" for s in skipped),
        context=root,
        hint="verify and promote a version explicitly",
    )


def _damaged(path: str, why: str) -> StoreError:
    return StoreError(
        f"the pointer is damaged: {why}",
        context=path,
        hint="restore CURRENT.json from a backup; the store's log (log.jsonl) lists every "
        "promote and rollback",
    )


def read(storage: Storage, *, promoted: bool) -> Pointer:
    """The pointer of a store.

    Args:
      storage: the store's storage.
      promoted: whether the store has promoted a version before (its marker
        says so); then a missing pointer is a damaged one, not an empty one.

    Raises:
      StoreError: for a pointer that cannot be read, is malformed, or is
        missing after a promotion.
    """
    path = storage.where(POINTER_FILE)
    try:
        found = storage.read(POINTER_FILE, limit=SMALL_FILE_LIMIT, what="pointer")
        if found is None:
            if promoted:
                raise _damaged(path, "it is missing, but the store has promoted versions")
            return Pointer(None, ())
        raw, tag = found
        data = strictjson.loads(raw, "the pointer", context=path)
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
    return Pointer(current, tuple(previous), tag)


def write(storage: Storage, pointer: Pointer, *, replacing: Pointer) -> None:
    """Replaces the pointer ``replacing`` was read from, only if it is still
    that one (compare and swap on its tag).

    Raises:
      ConflictError: if another process moved the pointer since, naming
        the version it made current.
    """
    data = {
        "format": STORE_FORMAT,
        "current": pointer.current,
        "previous": list(pointer.previous),
        "updated": now(),
    }
    got = storage.swap(POINTER_FILE, (strictjson.dumps(data) + "\n").encode(), replacing.tag)
    if isinstance(got, Conflict):
        try:
            winner = read(storage, promoted=False).current
        except StoreError:
            winner = None
        raise ConflictError(
            f"another process moved the pointer first; version {winner} is current",
            version=winner,
            context=storage.where(POINTER_FILE),
            hint="nothing was lost: look at `treeguard store ls`, and promote or roll back "
            "again if you still want to",
        )
