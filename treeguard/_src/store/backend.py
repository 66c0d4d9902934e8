"""What the store's one lifecycle asks of the place its versions live.

The store runs put, verify (verdicts.py), promote, rollback, gc
(lifecycle.py) and every load (gates.py) once, over a ``Backend``. Two backends implement it:
``LocalBackend`` (local.py: a directory, a ``flock`` around each change,
records rewritten in place) and ``BucketBackend`` (bucket.py: a bucket
prefix, no lock, every object create-only but the marker and the pointer,
which move by compare-and-swap). They differ in these primitives only;
every rule about which version may be used, what gc keeps and what the
pointer may say lives in the lifecycle.

Each method that changes the store is called by the lifecycle inside
``locked()`` (a no-op in a bucket, where every write is conditional).
A version's ``location`` is what ``VersionInfo.path`` shows: its directory,
or its URL prefix in a bucket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..hashing import Algorithm, Source
from ..hashing.memo import Carried
from ..spec import TreeSpec
from .layout import check_name
from .log import Event
from .storage import Storage


@dataclasses.dataclass(frozen=True)
class Wanted:
    """What a load asks for.

    Attributes:
      like: the tree or ``TreeSpec`` whose structure the result takes, or None.
      digest: the digest the version's verdict was computed on (None for a
        version without one).
      subtree: the key path of the one stored subtree to load.
      ignore: key paths of stored subtrees to leave unread.
    """

    like: Any
    digest: str | None
    subtree: str | None = None
    ignore: Collection[str] = ()


@dataclasses.dataclass(frozen=True)
class Offered:
    """What a put asks to write.

    Attributes:
      tree: the tree.
      user: the user's metadata, checked (``records.put_arguments``).
      version: the name asked for, or None for the next free one.
      digest: the hash algorithm of the tensors (or shards) and the header.
      carried: the digests a host copy of the tree carries from the memo (a
        non-blocking put's), for a tensors version's leaves (tensors.py).
    """

    tree: Any
    user: dict[str, Any]
    version: str | None
    digest: Algorithm
    carried: Carried | None = None


#: A version's validated record.
Record = dict[str, Any]


class Backend(Protocol):
    """The primitives of one kind of store (see the module's docstring)."""

    #: the store's directory or URL
    root: str

    @property
    def storage(self) -> Storage:
        """The store's small objects: the marker and the pointer."""
        ...

    def init(self, *, dedup: bool = False) -> None:
        """Makes the root a store; an existing one is left as it is, but
        ``dedup`` turns on storing tensors once per content for later puts."""
        ...

    def locked(self) -> AbstractContextManager[None]:
        """Holds the store's lock, where it has one."""
        ...

    def require(self) -> dict[str, Any]:
        """The marker, after checking that the root is a store."""
        ...

    def mark(self, flag: str) -> dict[str, Any]:
        """Sets ``flag`` in the marker (compare-and-swap); the marker written."""
        ...

    def append(self, action: str, version: str | None, detail: dict[str, Any]) -> None:
        """Logs one event."""
        ...

    def history(self) -> list[Event]:
        """Every whole logged event, oldest first."""
        ...

    def record(self, version: str) -> tuple[str, dict[str, Any]]:
        """The location and validated record (with its verdict) of a version
        (the lifecycle has checked that the root is a store)."""
        ...

    def version_names(self) -> list[str]:
        """The names that may be versions (foreign entries left out)."""
        ...

    def put(self, offered: Offered) -> str:
        """Writes a file version (a tensors version in a ``dedup`` store) as
        a candidate; its name."""
        ...

    def put_sharded(self, offered: Offered) -> str:
        """Writes a sharded version as a candidate; its name (``carried`` unused)."""
        ...

    def verifiable(self, version: str, location: str, record: dict[str, Any]) -> None:
        """Refuses a version that cannot be given a verdict now."""
        ...

    def check_payload(self, version: str, location: str, record: dict[str, Any]) -> None:
        """Refuses a version whose data is not what its record says it is,
        looking at names only."""
        ...

    def read_for_verdict(
        self, version: str, record: Record, contract: Any, digests: list[str]
    ) -> Any:
        """Loads the version against ``contract`` with every hash checked,
        leaving the digest it read under in ``digests`` first."""
        ...

    def digest_now(self, version: str, location: str, record: dict[str, Any]) -> str | None:
        """The digest of the data there now, or None if it does not read."""
        ...

    def save_verdict(
        self, version: str, record: dict[str, Any], verdict: dict[str, Any]
    ) -> dict[str, Any]:
        """Records the verdict; the record with it."""
        ...

    def recheck(self, version: str, location: str, record: dict[str, Any], digest: str) -> None:
        """Reads every byte again, refusing another digest (``IntegrityError``)."""
        ...

    def load(self, version: str, location: str, record: dict[str, Any], want: Wanted) -> Any:
        """The version's tree (or the part selected), every hash read checked."""
        ...

    def stored_spec(self, version: str, location: str, record: dict[str, Any]) -> TreeSpec:
        """The version's stored spec, from its header or manifest only."""
        ...

    def checkpoint_source(self, version: str, location: str) -> AbstractContextManager[Source]:
        """A file or tensors version's checkpoint as a ``hashing.Source`` (a
        descriptor, the object read as it downloads, or a tensors version's
        ``TensorsReader``), for a copy of its bytes; the caller checks them."""
        ...

    def retire(self, version: str) -> None:
        """Records that ``version``'s name is never used again (never made
        current, never handed out): before gc deletes anything of it."""
        ...

    def retired(self, version: str) -> bool:
        """Whether ``version``'s name was retired."""
        ...

    def remove(self, version: str, *, retired: bool, grace: float) -> bool:
        """Removes a version gc does not protect, retiring its name first;
        whether it was removed (never what cannot be read or is foreign).
        ``retired``: gc retired it (it had a finished record when gc listed);
        one gc did not retire is never removed once it has a record.
        ``grace``: where a put's data is there before anything tells a live
        put from a dead one (a bucket), the seconds its objects must be old
        before they are removed as a dead put's (grace.py)."""
        ...

    def after_gc(self, grace: float) -> None:
        """Clears what gc leaves behind (trash, stale temporary files) and
        deletes the tensor objects no version refers to (tensors.py); in a
        bucket only those older than ``grace`` seconds."""
        ...


def record_of(backend: Backend, version: str) -> tuple[str, dict[str, Any]]:
    """The location and validated record of ``version``, after checking its
    name and that the root is a store.

    Raises:
      UnknownVersionError: for a bad name or a version that does not exist.
      StoreError: if the root is not a store or the record is malformed.
    """
    check_name(version)
    backend.require()
    return backend.record(version)
