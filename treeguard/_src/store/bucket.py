"""The store's primitives on object storage (see backend.py), over ``ObjectStorage``.

``ArtifactStore("s3://bucket/prefix")`` runs its one lifecycle over
``BucketBackend``, which keeps the local store's rules with the only
primitives a bucket offers, conditional writes, so it needs no lock:

::

    PREFIX/
      STORE.json                    the marker (made by ``init``; its
                                    ``counter``, ``seq`` and ``signed`` are
                                    moved by compare-and-swap)
      CURRENT.json                  the pointer (pointer.py, compare-and-swap)
      log/TIME-RANDOM.json          one create-only object per event
      retired/NAME                  a name gc removed (create-only, never reused)
      versions/NAME/status.json     the record, create-only: it reserves the name
      versions/NAME/model.safetensors   the checkpoint, create-only
      versions/NAME/tensors.json    in a dedup store, the manifest instead,
                                    create-only (tensors.py), its tensors
                                    under tensors/ and gc's marks under doomed/
      versions/NAME/treeguard.sharded.json   a sharded version's manifest instead,
                                    create-only, written last; its shards under
                                    versions/NAME/data-HEX/ (bucketshards.py)
      versions/NAME/verdict.json    the verdict, create-only: never replaced

Nothing the store wrote is overwritten, but the marker and the pointer,
and those only by compare-and-swap. Every read of a checkpoint goes
through the checkpoint reader (bucketreads.py), every hash checked, a
sharded version's through the sharded reader.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Callable
from typing import Any

from .. import strictjson
from ..checkpoint import Header
from ..checkpoint.write import checkpoint_bytes, laid_out
from ..errors import (
    FormatError,
    NotAStoreError,
    StorageError,
    StoreError,
    UnknownVersionError,
)
from ..hashing import digest as hash_bytes
from ..sharded.manifest import MANIFEST_NAME, metadata_json, new_data_name
from ..spec import TreeSpec
from . import bucketshards, records, tensors
from .backend import Offered
from .bucketgc import OWN_OBJECTS, VERDICT_FILE, BucketGc
from .bucketreads import BucketReads, version_object
from .layout import (
    AUTO_RE,
    MARKER_FILE,
    MODEL_FILE,
    SMALL_FILE_LIMIT,
    STATUS_FILE,
    STORE_FORMAT,
    check_name,
)
from .lead import lead_acts, not_made, not_recorded
from .log import Event
from .log import parse as parse_event
from .objects import ObjectStorage
from .storage import Conflict
from .tensors import TENSORS_FILE

#: What a verdict object may set in a version's record (never its uid or sizes).
VERDICT_FIELDS = frozenset(
    (
        "status",
        "reason",
        "checks",
        "contract",
        "digest",
        "verified_env",
        "signature",
        "updated",
        "exported",
    )
)
#: How many times a compare-and-swap of the marker is tried before giving up.
_MARKER_TRIES = 64
#: How many auto-numbered names a put tries when each is taken.
_NAME_TRIES = 64
#: How many times a log event is written before its error is raised.
_LOG_TRIES = 3
_NOT_A_STORE_HINT = (
    "pass the URL given to `treeguard store init`, or make this prefix a store with "
    "`treeguard store init URL` (ArtifactStore.init(url))"
)


def _dumps(data: dict[str, Any]) -> bytes:
    return (strictjson.dumps(data) + "\n").encode("ascii")


class _Doomed(Exception):
    """A put's manifest was taken back: gc marked one of its objects."""


class BucketBackend(BucketReads, BucketGc):
    """The store's primitives under a bucket URL (see backend.py).

    Args:
      url: ``s3://bucket/prefix`` or ``gs://bucket/prefix``.
    """

    def __init__(self, url: str) -> None:
        self.storage = ObjectStorage(url)
        self.root = self.storage.url

    # -- the marker ------------------------------------------------------

    def _read_marker(self) -> tuple[dict[str, Any], str] | None:
        found = self.storage.read(
            MARKER_FILE, limit=SMALL_FILE_LIMIT, what="marker", confirm_missing=True
        )
        if found is None:
            return None
        raw, tag = found
        where = self.storage.where(MARKER_FILE)
        try:
            data = strictjson.loads(raw, "the store marker", context=where)
        except FormatError as e:
            raise StoreError(e.message, context=where, hint=_NOT_A_STORE_HINT) from e
        if (
            not isinstance(data, dict)
            or data.get("format") != STORE_FORMAT
            or not isinstance(data.get("id"), str)
            or not all(isinstance(data.get(k, 0), int) for k in ("counter", "seq"))
            or not isinstance(data.get("dedup", False), bool)
        ):
            raise StoreError(
                f"the marker is not a {STORE_FORMAT} marker",
                context=where,
                hint="restore STORE.json from a backup",
            )
        return data, tag

    def require(self) -> dict[str, Any]:
        """The marker, after checking that the prefix is a store.

        Raises:
          NotAStoreError: for a prefix without a marker.
          StoreError: for a damaged marker.
        """
        found = self._read_marker()
        if found is None:
            raise NotAStoreError(
                "not a store: the prefix holds no STORE.json marker",
                context=self.root,
                hint=_NOT_A_STORE_HINT,
            )
        marker: dict[str, Any] = found[0]
        return marker

    def _bump(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
        """Applies ``change`` to the marker by compare-and-swap, retried on a
        lost race; returns the marker written."""
        for _ in range(_MARKER_TRIES):
            found = self._read_marker()
            if found is None:
                self.require()  # raises: not a store
                continue
            marker, tag = found
            new = change(dict(marker))
            if new == marker:
                return marker
            new["rev"] = secrets.token_hex(8)  # every marker written is told apart
            if not isinstance(self.storage.swap(MARKER_FILE, _dumps(new), tag), Conflict):
                return new
        raise StoreError(
            f"the marker changed under {_MARKER_TRIES} tries in a row",
            context=self.storage.where(MARKER_FILE),
            hint="too many writers at once; try again",
        )

    def mark(self, flag: str) -> dict[str, Any]:
        return self._bump(lambda m: m | {flag: True})

    def locked(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # every write is conditional: no lock

    def init(self, *, dedup: bool = False) -> None:
        """Creates the marker; an existing store is left as it is (but for
        ``dedup``, set by compare-and-swap).

        Raises:
          StoreError: for a prefix that holds objects but no marker.
        """
        if self._read_marker() is not None:
            if dedup:
                self.mark("dedup")
            return
        if self.storage.list(""):
            raise StoreError(
                "the prefix holds objects but no store marker; a store is made only in an "
                "empty prefix",
                context=self.root,
                hint="pick an empty prefix; nothing was created",
            )
        marker = {
            "format": STORE_FORMAT,
            "id": secrets.token_hex(16),
            "counter": 0,
            "seq": 0,
            "signed": False,
            "dedup": dedup,
        }
        if isinstance(self.storage.create(MARKER_FILE, _dumps(marker)), Conflict):
            self.require()  # another init made it first: that one stands
            return
        self.append("init", None, {})

    # -- the log ---------------------------------------------------------

    def append(self, action: str, version: str | None, detail: dict[str, Any]) -> None:
        """Writes one event as its own create-only object, under a new name on
        each of ``_LOG_TRIES`` tries (one that read back missing was not
        written). The lifecycle logs an event once what it records is done,
        so the error of an event that could not be written says so."""
        time = records.now()
        data = {"time": time, "action": action, "version": version, "detail": detail}
        raw = json.dumps(data, sort_keys=True, ensure_ascii=True, default=str).encode("ascii")
        stamp = time.replace(":", "").replace("-", "").replace("+", "Z")
        for _ in range(_LOG_TRIES):
            try:
                self.storage.create(f"log/{stamp}-{secrets.token_hex(8)}.json", raw + b"\n")
                return
            except StorageError as e:
                failed = e
        raise StorageError(
            f"the {action} event could not be logged after {_LOG_TRIES} tries "
            f"({failed.message}); what it records was done",
            version=version,
            context=failed.context,
            hint="nothing to redo: `treeguard store ls` shows the store as it is; the log "
            "misses this one event",
        ) from failed

    def history(self) -> list[Event]:
        """Every readable event, oldest first; a foreign object is skipped."""
        out: list[Event] = []
        for name in self.storage.list("log"):
            found = self.storage.read(
                f"log/{name}", limit=SMALL_FILE_LIMIT, what="log event", confirm_missing=True
            )
            event = parse_event(found[0]) if found is not None else None
            if event is not None:
                out.append(event)
        return sorted(out, key=lambda e: e.time)

    # -- records ---------------------------------------------------------

    def record(self, version: str) -> tuple[str, dict[str, Any]]:
        """A version's record merged with its verdict, validated.

        Raises:
          UnknownVersionError: for a version that does not exist.
          StoreError: for a damaged record or verdict.
        """
        return self._location(version), self._record(version)

    def _record(self, version: str) -> dict[str, Any]:
        name = version_object(version, STATUS_FILE)
        found = self.storage.read(
            name, limit=SMALL_FILE_LIMIT, what="status file", confirm_missing=True
        )
        if found is None:
            raise UnknownVersionError(
                f"version {version} does not exist",
                version=version,
                context=self.root,
                hint=f"`treeguard store ls {self.root}` lists the versions",
            )
        data = records.parse(found[0], self.storage.where(name))
        verdict_name = version_object(version, VERDICT_FILE)
        verdict = self.storage.read(
            verdict_name, limit=SMALL_FILE_LIMIT, what="verdict", confirm_missing=True
        )
        if verdict is not None:
            where = self.storage.where(verdict_name)
            try:
                given = strictjson.loads(verdict[0], "the verdict", context=where)
            except FormatError as e:
                raise StoreError(e.message, context=where, hint=e.hint) from e
            if not isinstance(given, dict) or given.get("status") not in ("verified", "rejected"):
                raise StoreError(
                    "the verdict is malformed: its status is not verified or rejected",
                    context=where,
                    hint="the store writes verdicts itself; put the weights again",
                )
            verdict_fields = {k: v for k, v in given.items() if k in VERDICT_FIELDS}
            data = records.parse(_dumps({**data, **verdict_fields}), where)
        return data

    def _location(self, version: str) -> str:
        return self.storage.where(f"versions/{version}")

    def version_names(self) -> list[str]:
        return [n for n in self.storage.list("versions") if check_name_or_none(n) is not None]

    # -- put -------------------------------------------------------------

    def put(self, offered: Offered) -> str:
        if self.require().get("dedup"):
            version = self._put_tensors(offered)
            leaf = TENSORS_FILE
        else:
            user, digest = offered.user, offered.digest
            # one upload needs it all
            data = checkpoint_bytes(offered.tree, metadata=user, digest=digest)
            header = tensors.header_of(data, len(data), self.root)
            record = _candidate(user, "file", header.spec, header.digest)
            version = self._reserve(offered.version, MODEL_FILE, data, record)
            leaf = MODEL_FILE
        self._unless_retired(version, (STATUS_FILE, leaf))
        self.append("put", version, {"status": "candidate"})
        return version

    def _unless_retired(self, version: str, leaves: tuple[str, ...], data: str = "") -> None:
        """Undoes a put whose name gc retired while it ran (gc took its data for a
        dead put's): deletes its ``leaves`` (record first) and shards under ``data``."""
        if not self.retired(version):
            return
        for name in leaves:
            self.storage.delete(version_object(version, name))
        if data:
            bucketshards.discard(self.storage, version_object(version, data))
        raise StoreError(
            f"version {version} was removed by gc while it was put; nothing of it is kept",
            version=version,
            context=self.root,
            hint="put it again",
        )

    def _put_tensors(self, offered: Offered) -> str:
        """A tensors version: the tensors the store lacks, then the manifest,
        which reserves the name (taken back if gc marked one of its objects:
        tensors.py), then the record."""
        names: list[str] = []

        def place(raw: bytes, objects: list[str], header: Header) -> bool:
            def ready() -> bool:
                return not tensors.doomed_among(self.storage, objects)

            record = _candidate(offered.user, "tensors", header.spec, header.digest)
            try:
                names.append(self._reserve(offered.version, TENSORS_FILE, raw, record, ready))
            except _Doomed:
                return False
            return True

        draft = laid_out(offered.tree, metadata=offered.user, digest=offered.digest)
        tensors.put(self.storage, draft, place, self.root, offered.carried)
        return names[-1]

    def put_sharded(self, offered: Offered) -> str:
        """Process 0 picks the name and the data prefix; every process writes
        its shards (bucketshards.py); once all are confirmed, process 0
        writes the manifest, then the record. Until the manifest is there no
        version is seen, and gc removes what a put that died left."""
        from ..sharded.save import checked_leaves  # lazy: jax

        user, digest = offered.user, offered.digest
        spec, leaves, paths = checked_leaves(offered.tree)  # every process refuses before any write
        chosen = lead_acts(lambda: self._begin_sharded(offered.version), failed=not_made(self.root))
        name, seq, data = chosen.decode("ascii").split()
        prefix = version_object(name, data)
        committed: list[bool] = []  # process 0's: the record is written
        try:
            gathered = bucketshards.put_everywhere(self.storage, prefix, leaves, digest)
            lead_acts(  # also the barrier after the record
                lambda: self._finish_sharded(
                    name,
                    int(seq),
                    data,
                    (spec, leaves, paths),
                    user,
                    [digest, gathered, committed],
                ),
                failed=not_recorded(name, self.root, left="nothing of it is kept"),
            )
        except BaseException:
            # once recorded, the version keeps its shards whatever fails after
            # (its event, the barrier): as a file put keeps its checkpoint
            if bucketshards.process_index() == 0 and not committed:
                with contextlib.suppress(StorageError):
                    bucketshards.discard(self.storage, prefix)
            raise
        return name

    def _begin_sharded(self, version: str | None) -> bytes:
        """Process 0: ``NAME SEQ DATA`` of a sharded put."""
        self.require()
        for _ in range(_NAME_TRIES):
            chosen = self._choose(version)
            if chosen is not None:
                return f"{chosen[0]} {chosen[1]} {new_data_name()}".encode("ascii")
        raise StoreError(
            f"no free version name after {_NAME_TRIES} tries",
            context=self.root,
            hint="too many writers at once; try again",
        )

    def _finish_sharded(  # noqa: PLR0917 - one call site
        self,
        name: str,
        seq: int,
        data: str,
        tree: tuple[Any, list[Any], list[str]],
        user: dict[str, Any],
        hashed: list[Any],
    ) -> bytes:
        """Process 0: the manifest from every process's digests, then the
        record (told to ``hashed``'s last item, the caller's flag), then the
        put's event."""
        from ..sharded.save import manifest_of  # lazy: jax

        spec, leaves, paths = tree
        algorithm, gathered, committed = hashed
        manifest = manifest_of(data, spec, metadata_json(user), paths, leaves, gathered, algorithm)
        raw = manifest.to_json().encode("utf-8")
        record = _candidate(user, "sharded", spec, hash_bytes(raw, algorithm))
        if not self._commit(name, seq, MANIFEST_NAME, raw, record):
            raise _exists(name, self.root)
        committed.append(True)
        self._unless_retired(name, (STATUS_FILE, MANIFEST_NAME), data)
        self.append("put", name, {"status": "candidate"})
        return b""

    def retired(self, version: str) -> bool:
        found = self.storage.read(
            f"retired/{version}", limit=1024, what="retired name", confirm_missing=True
        )
        return found is not None

    def retire(self, version: str) -> None:
        """Creates ``retired/NAME`` (create-only: a second gc finds it made)."""
        self.storage.create(f"retired/{version}", b"")

    def _reserve(
        self,
        version: str | None,
        leaf: str,
        data: bytes | memoryview,
        record: dict[str, Any],
        ready: Callable[[], bool] = lambda: True,
    ) -> str:
        """Picks a name (``_choose``) and writes the checkpoint object
        ``leaf`` and the record there (``_commit``), under another name when
        an auto-numbered one was taken meanwhile. Returns the name."""
        for _ in range(_NAME_TRIES):
            chosen = self._choose(version)
            if chosen is None:
                continue
            if self._commit(*chosen, leaf, data, record, ready):
                return chosen[0]
            if version is not None:
                raise _exists(chosen[0], self.root)
        raise StoreError(
            f"no free version name after {_NAME_TRIES} tries",
            context=self.root,
            hint="too many writers at once; try again",
        )

    def _choose(self, version: str | None) -> tuple[str, int] | None:
        """A name for a put and its place in the marker's order (``seq``),
        both taken by one compare-and-swap of the marker: an auto-numbered
        name is the marker's ``counter``, moved past every name listed, so
        two puts never pick the same one. None when that name was retired.

        Raises:
          StoreError: for a given name that is retired or already a version.
        """
        taken = (
            []
            if version is not None
            else [
                int(m.group(1))
                for n in [*self.storage.list("versions"), *self.storage.list("retired")]
                if (m := AUTO_RE.match(n))
            ]
        )

        def step(m: dict[str, Any]) -> dict[str, Any]:
            out = m | {"seq": int(m.get("seq", 0)) + 1}
            if version is None:
                out["counter"] = max([int(m.get("counter", 0)), *taken]) + 1
            return out

        marker = self._bump(step)
        name = version or f"v{int(marker['counter']):06d}"
        if self.retired(name):
            if version is None:
                return None
            raise StoreError(
                f"version {name} existed and was removed by gc; a name is never reused",
                version=name,
                context=self.root,
                hint="pick another name",
            )
        if version is not None and set(self.storage.list(f"versions/{name}")) & set(OWN_OBJECTS):
            raise _exists(name, self.root)  # before the upload
        return name, int(marker["seq"])

    def _commit(  # noqa: PLR0917 - two call sites
        self,
        name: str,
        seq: int,
        leaf: str,
        data: bytes | memoryview,
        record: dict[str, Any],
        ready: Callable[[], bool] = lambda: True,
    ) -> bool:
        """Writes the checkpoint object ``leaf`` (create-only; a tensors
        version's manifest, taken back with ``_Doomed`` raised unless
        ``ready()`` once it is written), then the record (create-only, with
        the put's place ``seq`` in the marker's order): a record is never
        seen without its data. The record, whose uid is random, decides
        whose the version is: two puts of the same bytes under one name both
        find the checkpoint object theirs (``create`` confirms the bytes,
        not the writer), and only one makes the record. Whether this put
        made it."""
        if isinstance(self.storage.create(version_object(name, leaf), data), Conflict):
            return False
        if not ready():
            self.storage.delete(version_object(name, leaf))
            raise _Doomed
        body = _dumps(record | {"seq": seq, "format": STORE_FORMAT, "version": name})
        return not isinstance(
            self.storage.create(version_object(name, STATUS_FILE), body), Conflict
        )

    # -- verify ----------------------------------------------------------

    def verifiable(self, version: str, location: str, record: dict[str, Any]) -> None:
        if record["status"] != "candidate":
            raise StoreError(
                f"version {version} already has a verdict ({record['status']}); a verdict in a "
                "bucket is never replaced",
                version=version,
                context=self.storage.where(version_object(version, VERDICT_FILE)),
                hint="put the weights again as a new version to verify them again",
            )

    def save_verdict(
        self, version: str, record: dict[str, Any], verdict: dict[str, Any]
    ) -> dict[str, Any]:
        name = version_object(version, VERDICT_FILE)
        if isinstance(self.storage.create(name, _dumps(verdict)), Conflict):
            raise StoreError(
                f"another process recorded a verdict on version {version} first",
                version=version,
                context=self.storage.where(name),
                hint=f"read it: store.info({version!r})",
            )
        return records.parse(_dumps(record | verdict), self.storage.where(name))


def _exists(version: str, root: str) -> StoreError:
    return StoreError(
        f"version {version} already exists",
        version=version,
        context=root,
        hint="pick another name, or leave version= out to number it",
    )


def check_name_or_none(name: str) -> str | None:
    """``name`` if it can name a version, else None (a foreign object)."""
    try:
        return check_name(name)
    except UnknownVersionError:
        return None


def _candidate(user: dict[str, Any], kind: str, spec: TreeSpec, digest: str) -> dict[str, Any]:
    """The record of a version of ``kind`` put as a candidate: its sizes
    from ``spec``, ``digest`` the one its reads are checked against."""
    return {
        "status": "candidate",
        "uid": secrets.token_hex(16),
        "created": records.now(),
        "metadata": user,
        "kind": kind,
        "num_leaves": spec.num_leaves,
        "num_params": spec.num_params,
        "nbytes": spec.nbytes,
        "stored_digest": digest,
    }
