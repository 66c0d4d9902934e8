"""``CURRENT.json``: the current version and the stack of former ones.

The pointer is replaced by compare-and-swap on the tag it was read with
(under the store's lock, where there is one). It is read strictly: a
pointer that is damaged, a link, a FIFO or a directory stops every
operation that depends on it with a ``StoreError`` naming the file, rather
than being taken for an empty store.

A write is not taken as done until the pointer is read back: each pointer
carries a random ``id`` and the ids of the pointers it replaced (``chain``,
the most recent ``CHAIN`` of them), so a writer recognises its own write
whatever the server answered, even after other writers moved the pointer
on. A write the server acknowledged but did not perform is a
``StorageError``; one it refused (412) but performed is a success; a
pointer rewritten unchanged since it was read (``gc``'s fence, see
lifecycle.py) is told apart from one moved to another version, so the writer
tries again instead of reporting a conflict.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
from typing import Any

from .. import strictjson
from ..errors import ConflictError, FormatError, StorageError, StoreError
from .backend import Backend
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
    #: the random id of the write that made it (None: an older pointer, or none)
    id: str | None = dataclasses.field(default=None, compare=False)
    #: the ids of the pointers it replaced, most recent first
    chain: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    def names(self) -> set[str]:
        """The versions it names: the current one and the former ones."""
        return {*(() if self.current is None else (self.current,)), *self.previous}

    def promoting(self, version: str, depth: int) -> Pointer:
        """The pointer that makes ``version`` current: the current one goes on
        top of the former ones (``version`` taken out), ``depth`` kept."""
        stack = [v for v in self.previous if v != version]
        if self.current is not None:
            stack.insert(0, self.current)
        return Pointer(version, tuple(stack[:depth]))


#: How many ids of former pointers a pointer keeps to recognise its writers.
CHAIN = 32
_ID_RE = re.compile(r"^[0-9a-f]{16}$")


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
        found = storage.read(
            POINTER_FILE, limit=SMALL_FILE_LIMIT, what="pointer", confirm_missing=True
        )
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
    pid, chain = data.get("id"), data.get("chain", [])
    ids = (
        tuple(c for c in chain if isinstance(c, str) and _ID_RE.match(c))
        if isinstance(chain, list)
        else ()
    )
    return Pointer(
        current,
        tuple(previous),
        tag,
        pid if isinstance(pid, str) and _ID_RE.match(pid) else None,
        ids[:CHAIN],
    )


def of_store(backend: Backend, marker: dict[str, Any] | None = None) -> Pointer:
    """The store's pointer; a missing one is damaged once the store has
    moved it (its marker says promoted and its log records a move).

    Args:
      backend: the store's.
      marker: the store's marker, read before the pointer by the caller
        (a load passes the one its gate checks); read here when None.

    Raises:
      StoreError: if the root is not a store or the pointer is damaged.
    """
    marker = backend.require() if marker is None else marker
    ptr = read(backend.storage, promoted=False)
    if ptr.tag is None and marker.get("promoted") and _ever_moved(backend):
        return read(backend.storage, promoted=True)  # raises: damaged
    # marked promoted but never moved: a first promote killed between the
    # marker and the pointer (as older versions wrote them); nothing is current
    return ptr


def _ever_moved(backend: Backend) -> bool:
    """Whether the log records a promote or a rollback (a pointer was written)."""
    try:
        events = backend.history()
    except StoreError:
        return True  # cannot tell: the missing pointer is a damaged one
    return any(e.action in ("promote", "rollback") for e in events)


def salvage(storage: Storage) -> Pointer:
    """The pointer as far as it can be read, for a repair: a missing or
    damaged one is an empty pointer with the tag of what is there."""
    try:
        return read(storage, promoted=False)
    except StoreError:
        found = storage.read(
            POINTER_FILE, limit=SMALL_FILE_LIMIT, what="pointer", confirm_missing=True
        )
        return Pointer(None, (), None if found is None else found[1])


def write(storage: Storage, pointer: Pointer, *, replacing: Pointer) -> bool:
    """Replaces the pointer ``replacing`` was read from, only if it is still
    that one (compare and swap on its tag), and reads it back.

    Returns:
      True once the pointer is read back holding this write (or one made
      after it); False if the pointer was rewritten unchanged since
      ``replacing`` was read (read it again and retry).

    Raises:
      ConflictError: if another process moved the pointer since, naming
        the version it made current.
      StorageError: if the server acknowledged the write but the pointer
        does not hold it, or refused it while the pointer is unchanged.
    """
    wid = secrets.token_hex(8)
    chain = ((replacing.id,) if replacing.id else ()) + replacing.chain
    data = {
        "format": STORE_FORMAT,
        "current": pointer.current,
        "previous": list(pointer.previous),
        "updated": now(),
        "id": wid,
        "chain": list(chain[:CHAIN]),
    }
    got = storage.swap(POINTER_FILE, (strictjson.dumps(data) + "\n").encode(), replacing.tag)
    where = storage.where(POINTER_FILE)
    try:
        held: Pointer | None = read(storage, promoted=False)
    except StoreError:
        held = None
    if held is not None and (held.id == wid or wid in held.chain):
        return True  # ours landed, whatever the server answered
    unchanged = held is not None and held.tag == replacing.tag and held.id == replacing.id
    if not isinstance(got, Conflict) or unchanged:
        raise StorageError(
            "writing the pointer failed: the server "
            + ("refused it as a conflict" if isinstance(got, Conflict) else "acknowledged it")
            + ", but the pointer "
            + ("is unchanged" if unchanged else "does not hold it"),
            context=where,
            hint="the current version is the one `treeguard store ls` shows; check the server "
            "and promote or roll back again",
        )
    if held is not None and held == replacing:
        return False  # rewritten unchanged (a gc's fence): nothing moved
    winner = held.current if held is not None else None
    raise ConflictError(
        f"another process moved the pointer first; version {winner} is current",
        version=winner,
        context=where,
        hint="nothing was lost: look at `treeguard store ls`, and promote or roll back "
        "again if you still want to",
    )
