"""The store's lifecycle on object storage, over the ``Storage`` protocol.

``ArtifactStore("s3://bucket/prefix")`` hands every operation to
``BucketLifecycle``. It keeps the local store's rules with the only
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
      versions/NAME/verdict.json    the verdict, create-only: never replaced

Nothing the store wrote is overwritten, but the marker and the pointer,
and those only by compare-and-swap. Every read of a checkpoint stages the
object's bytes to a private temporary file and goes through the checkpoint
reader, which checks every hash before anything is returned; its digest is
compared with the one recorded at put and, for a verified version, with the
verdict's. Only file versions are kept in a bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .. import strictjson
from ..checkpoint import read_header, save, user_metadata_json
from ..env import environment
from ..errors import (
    FormatError,
    IntegrityError,
    NotAStoreError,
    StoreError,
    UnknownVersionError,
)
from ..hashing import DEFAULT, Algorithm
from . import gates, pointer, records
from .checks import Check
from .layout import (
    AUTO_RE,
    MARKER_FILE,
    MODEL_FILE,
    SMALL_FILE_LIMIT,
    STATUS_FILE,
    STORE_FORMAT,
    check_name,
)
from .log import Event
from .log import parse as parse_event
from .objects import ObjectStorage
from .payload import judge
from .records import VersionInfo
from .retention import RetentionPolicy
from .storage import Conflict

VERDICT_FILE = "verdict.json"
#: What a verdict object may set in a version's record (never its uid or sizes).
VERDICT_FIELDS = frozenset(
    ("status", "reason", "checks", "contract", "digest", "verified_env", "signature", "updated")
)
#: The objects a version holds; gc leaves a version holding anything else.
OWN_OBJECTS = (STATUS_FILE, VERDICT_FILE, MODEL_FILE)
#: The most bytes of one checkpoint object a load stages.
CHECKPOINT_LIMIT = 1 << 40
#: How many times a compare-and-swap of the marker is tried before giving up.
_MARKER_TRIES = 64
#: How many auto-numbered names a put tries when each is taken.
_NAME_TRIES = 64
_DEPTH = 16
_NOT_A_STORE_HINT = (
    "pass the URL given to `treeguard store init`, or make this prefix a store with "
    "`treeguard store init URL` (ArtifactStore.init(url))"
)


def _dumps(data: dict[str, Any]) -> bytes:
    return (strictjson.dumps(data) + "\n").encode("ascii")


def _version_object(version: str, leaf: str) -> str:
    return f"versions/{version}/{leaf}"


class BucketLifecycle:
    """Verify, promote, rollback and gc of file versions under a bucket URL.

    Args:
      url: ``s3://bucket/prefix`` or ``gs://bucket/prefix``.
      key: as ``ArtifactStore``'s.
    """

    def __init__(self, url: str, key: bytes | str | None) -> None:
        self.storage = ObjectStorage(url)
        self.root = self.storage.url
        self.key = gates.resolve_key(key, root=None)

    # -- the marker ------------------------------------------------------

    def _read_marker(self) -> tuple[dict[str, Any], str] | None:
        found = self.storage.read(MARKER_FILE, limit=SMALL_FILE_LIMIT, what="marker")
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
            if not isinstance(self.storage.swap(MARKER_FILE, _dumps(new), tag), Conflict):
                return new
        raise StoreError(
            f"the marker changed under {_MARKER_TRIES} tries in a row",
            context=self.storage.where(MARKER_FILE),
            hint="too many writers at once; try again",
        )

    def init(self) -> None:
        """Creates the marker; an existing store is left as it is.

        Raises:
          StoreError: for a prefix that holds objects but no marker.
        """
        if self._read_marker() is not None:
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
        }
        if isinstance(self.storage.create(MARKER_FILE, _dumps(marker)), Conflict):
            self.require()  # another init made it first: that one stands
            return
        self.append("init", None, {})

    # -- the log ---------------------------------------------------------

    def append(self, action: str, version: str | None, detail: dict[str, Any]) -> None:
        """Writes one event as its own create-only object."""
        time = records.now()
        data = {"time": time, "action": action, "version": version, "detail": detail}
        raw = json.dumps(data, sort_keys=True, ensure_ascii=True, default=str).encode("ascii")
        stamp = time.replace(":", "").replace("-", "").replace("+", "Z")
        self.storage.create(f"log/{stamp}-{secrets.token_hex(8)}.json", raw + b"\n")

    def history(self) -> list[Event]:
        """Every readable event, oldest first; a foreign object is skipped."""
        self.require()
        out: list[Event] = []
        for name in self.storage.list("log"):
            found = self.storage.read(f"log/{name}", limit=SMALL_FILE_LIMIT, what="log event")
            event = parse_event(found[0]) if found is not None else None
            if event is not None:
                out.append(event)
        return sorted(out, key=lambda e: e.time)

    # -- records ---------------------------------------------------------

    def record(self, version: str) -> dict[str, Any]:
        """A version's record merged with its verdict, validated.

        Raises:
          UnknownVersionError: for a bad name or a version that does not exist.
          StoreError: for a damaged record or verdict.
        """
        check_name(version)
        self.require()
        return self._record(version)

    def _record(self, version: str) -> dict[str, Any]:
        name = _version_object(version, STATUS_FILE)
        found = self.storage.read(name, limit=SMALL_FILE_LIMIT, what="status file")
        if found is None:
            raise UnknownVersionError(
                f"version {version} does not exist",
                version=version,
                context=self.root,
                hint=f"`treeguard store ls {self.root}` lists the versions",
            )
        data = records.parse(found[0], self.storage.where(name))
        verdict_name = _version_object(version, VERDICT_FILE)
        verdict = self.storage.read(verdict_name, limit=SMALL_FILE_LIMIT, what="verdict")
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

    def info(self, version: str) -> VersionInfo:
        data = self.record(version)
        return records.info(version, self._location(version), data)

    def _location(self, version: str) -> str:
        return self.storage.where(f"versions/{version}")

    def versions(self) -> list[VersionInfo]:
        self.require()
        out: list[VersionInfo] = []
        for name in self.storage.list("versions"):
            if check_name_or_none(name) is None:
                continue
            try:
                out.append(records.info(name, self._location(name), self._record(name)))
            except UnknownVersionError:
                continue  # a put that has not written its record, or a version gc removed
            except (StoreError, FormatError) as e:
                out.append(records.unreadable(name, str(e), self._location(name)))
        return sorted(
            out,
            key=lambda v: (v.status == records.UNREADABLE, v.seq or 0, v.created, v.version),
        )

    # -- the pointer -----------------------------------------------------

    def read_pointer(self) -> pointer.Pointer:
        """The pointer; a missing one after a logged promote is a damaged one."""
        self.require()
        ptr = pointer.read(self.storage, promoted=False)
        if ptr.tag is None and self._ever_moved():
            return pointer.read(self.storage, promoted=True)  # raises: damaged
        return ptr

    def _ever_moved(self) -> bool:
        return any(e.action in ("promote", "rollback") for e in self.history())

    def previous_verified(self, ptr: pointer.Pointer) -> str | None:
        for v in ptr.previous:
            with contextlib.suppress(StoreError):
                if self._record(v)["status"] == "verified":
                    return str(v)
        return None

    # -- put -------------------------------------------------------------

    def put(
        self,
        tree: Any,
        metadata: Mapping[str, Any] | None,
        version: str | None,
        digest: Algorithm = DEFAULT,
    ) -> str:
        user = json.loads(user_metadata_json(metadata))  # refuse bad metadata before any write
        if version is not None:
            check_name(version)
        self.require()
        with tempfile.TemporaryDirectory(prefix="treeguard-put-") as tmp:
            path = os.path.join(tmp, MODEL_FILE)
            save(path, tree, metadata=user, digest=digest)
            header = read_header(path)
            with open(path, "rb") as f:
                data = f.read()
        spec = header.spec
        record = {
            "status": "candidate",
            "uid": secrets.token_hex(16),
            "created": records.now(),
            "metadata": user,
            "kind": "file",
            "num_leaves": spec.num_leaves,
            "num_params": spec.num_params,
            "nbytes": spec.nbytes,
            "stored_digest": header.digest,
        }
        version = self._reserve(version, record)
        model = _version_object(version, MODEL_FILE)
        try:
            if isinstance(self.storage.create(model, data), Conflict):
                raise StoreError(
                    f"version {version}'s checkpoint object already exists, though its "
                    "record was just made: something else writes under this prefix",
                    version=version,
                    context=self.storage.where(model),
                    hint="keep other writers out of the store's prefix",
                )
        except BaseException:
            self.storage.delete(_version_object(version, STATUS_FILE))  # our own record only
            raise
        self.append("put", version, {"status": "candidate"})
        return version

    def _reserve(self, version: str | None, record: dict[str, Any]) -> str:
        """Creates the record, which reserves the name (create-only)."""
        for _ in range(_NAME_TRIES):
            marker = self._bump(lambda m: m | {"seq": int(m.get("seq", 0)) + 1})
            name = version
            if name is None:
                taken = [
                    int(m.group(1))
                    for n in [*self.storage.list("versions"), *self.storage.list("retired")]
                    if (m := AUTO_RE.match(n))
                ]
                number = max([int(marker.get("counter", 0)), *taken]) + 1
                name = f"v{number:06d}"
            if self.storage.read("retired/" + name, limit=1024, what="retired name") is not None:
                if version is None:
                    continue
                raise StoreError(
                    f"version {name} existed and was removed by gc; a name is never reused",
                    version=name,
                    context=self.root,
                    hint="pick another name",
                )
            body = _dumps(record | {"seq": marker["seq"], "format": STORE_FORMAT, "version": name})
            if not isinstance(
                self.storage.create(_version_object(name, STATUS_FILE), body), Conflict
            ):
                return name
            if version is not None:
                raise StoreError(
                    f"version {name} already exists",
                    version=name,
                    context=self.root,
                    hint="pick another name, or leave version= out to number it",
                )
        raise StoreError(
            f"no free version name after {_NAME_TRIES} tries",
            context=self.root,
            hint="too many writers at once; try again",
        )

    # -- reading a checkpoint --------------------------------------------

    @contextlib.contextmanager
    def staged(self, version: str) -> Iterator[str]:
        """The version's checkpoint object, copied to a private temporary file."""
        name = _version_object(version, MODEL_FILE)
        found = self.storage.read(name, limit=CHECKPOINT_LIMIT, what="checkpoint")
        if found is None:
            raise IntegrityError(
                f"version {version}: its checkpoint object is missing",
                version=version,
                context=self.storage.where(name),
                hint="do not use it; put the weights again",
            )
        with tempfile.TemporaryDirectory(prefix="treeguard-load-") as tmp:
            path = os.path.join(tmp, MODEL_FILE)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(found[0])
            yield path

    def _unreadable(self, version: str, e: FormatError) -> IntegrityError:
        return IntegrityError(
            f"version {version}: its checkpoint object no longer reads: {e.message}",
            version=version,
            context=self.storage.where(_version_object(version, MODEL_FILE)),
            hint="do not use it; something replaced the object behind the store; put the "
            "weights again",
        )

    def _expected(self, version: str, data: dict[str, Any]) -> str | None:
        """The digest a load must find: the verdict's, else the one recorded at put."""
        if data["status"] == "verified":
            return data.get("digest")
        return data.get("stored_digest")

    def load(self, version: str, data: dict[str, Any], like: Any) -> Any:
        digest = self._expected(version, data)
        with self.staged(version) as path:
            try:
                return gates.load_expecting(path, like=like, digest=digest)
            except IntegrityError as e:
                raise self._replaced(version, e) from e
            except FormatError as e:
                raise self._unreadable(version, e) from e

    def _replaced(self, version: str, e: IntegrityError) -> IntegrityError:
        return IntegrityError(
            f"version {version}: its checkpoint object was changed behind the store: {e.message}",
            version=version,
            context=self.storage.where(_version_object(version, MODEL_FILE)),
            hint="do not use it; restore the object from a backup, or put the weights again",
        )

    def spec_of(self, version: str) -> Any:
        with self.staged(version) as path:
            return read_header(path).spec

    # -- the gates -------------------------------------------------------

    def gate(self, version: str, *, full: bool) -> tuple[dict[str, Any], str]:
        """The record and digest of a version that may be used (see ``ArtifactStore._gate``)."""
        data = self.record(version)
        digest = gates.require_verified(version, data)
        marker = self.require()
        gates.check_signature(
            self.key, str(marker["id"]), version, data, signed=bool(marker.get("signed"))
        )
        if full:
            with self.staged(version) as path:
                try:
                    gates.verify_expecting(path, digest=digest)
                except IntegrityError as e:
                    raise self._replaced(version, e) from e
                except FormatError as e:
                    raise self._unreadable(version, e) from e
        return data, digest

    # -- verify ----------------------------------------------------------

    def verify(
        self, version: str, like: Any, checks: Sequence[Check], current: str | None
    ) -> VersionInfo:
        before = self.record(version)
        if before["status"] != "candidate":
            raise StoreError(
                f"version {version} already has a verdict ({before['status']}); a verdict in a "
                "bucket is never replaced",
                version=version,
                context=self.storage.where(_version_object(version, VERDICT_FILE)),
                hint="put the weights again as a new version to verify them again",
            )
        marker = self.require()
        if self.key is None and marker.get("signed"):
            raise gates.unkeyed(version)
        if like is not None:
            contract, contract_name = like, "`like`"
        elif current is not None and current != version:
            contract, contract_name = self.spec_of(current), f"version {current} (current)"
        else:
            contract, contract_name = None, "its own stored spec"
        with self.staged(version) as path:

            def read(digests: list[str]) -> Any:
                digests.append(read_header(path).digest)
                if digests[0] != before.get("stored_digest"):
                    raise self._replaced(
                        version,
                        IntegrityError("its digest is not the one recorded at put"),
                    )
                return gates.load_expecting(path, like=contract, digest=digests[0])

            results, reason, digest = judge(
                read,
                ("header valid", "header and every tensor hash match"),
                contract_name,
                checks,
            )
        verdict: dict[str, Any] = {
            "status": "rejected" if reason else "verified",
            "reason": reason,
            "checks": [dataclasses.asdict(r) for r in results],
            "contract": contract_name,
            "digest": digest,
            "verified_env": environment(),
            "signature": None,
            "updated": records.now(),
        }
        if self.key is not None:
            if not marker.get("signed"):
                marker = self._bump(lambda m: m | {"signed": True})
            verdict["signature"] = gates.sign(
                self.key, str(marker["id"]), version, {**before, **verdict}
            )
        name = _version_object(version, VERDICT_FILE)
        if isinstance(self.storage.create(name, _dumps(verdict)), Conflict):
            raise StoreError(
                f"another process recorded a verdict on version {version} first",
                version=version,
                context=self.storage.where(name),
                hint=f"read it: store.info({version!r})",
            )
        self.append("verify", version, {"status": verdict["status"], "reason": reason})
        return self.info(version)

    # -- promote, rollback, gc ------------------------------------------

    def promote(self, version: str) -> None:
        check_name(version)
        self.gate(version, full=True)
        ptr = self.read_pointer()
        if ptr.current == version:
            return
        pointer.write(self.storage, ptr.promoting(version, _DEPTH), replacing=ptr)
        self.append("promote", version, {"previous": ptr.current})

    def rollback(self) -> str:
        ptr = self.read_pointer()
        skipped: list[str] = []
        for i, v in enumerate(ptr.previous):
            try:
                self.gate(v, full=True)
            except (StoreError, IntegrityError, FormatError) as e:
                skipped.append(f"{v}: {str(e).splitlines()[0]}")
                continue
            pointer.write(self.storage, pointer.Pointer(v, ptr.previous[i + 1 :]), replacing=ptr)
            self.append("rollback", v, {"previous": ptr.current, "skipped": skipped})
            return v
        raise pointer.nothing_to_roll_back_to(ptr, skipped, self.root)

    def gc(self, policy: RetentionPolicy, kept: set[str]) -> list[str]:
        ptr = self.read_pointer()  # raises on a damaged pointer: nothing is deleted then
        protect = {ptr.current, *ptr.previous} | kept
        removed: list[str] = []
        for name in self.storage.list("versions"):
            if name in protect or check_name_or_none(name) is None:
                continue
            try:
                self._record(name)
            except UnknownVersionError:
                continue  # a put that has not written its record yet
            except (StoreError, FormatError):
                continue  # never delete what cannot be read: a person must look
            held = self.storage.list(f"versions/{name}")
            if not set(held) <= set(OWN_OBJECTS):
                continue  # objects the store did not write: a person must look
            self.storage.create(f"retired/{name}", b"")  # retired before anything is deleted
            for leaf in (MODEL_FILE, VERDICT_FILE, STATUS_FILE):  # the record goes last
                self.storage.delete(_version_object(name, leaf))
            removed.append(name)
        if removed:
            self.append("gc", None, {"removed": removed, "keep": policy.keep_last})
        return removed


def check_name_or_none(name: str) -> str | None:
    """``name`` if it can name a version, else None (a foreign object)."""
    try:
        return check_name(name)
    except UnknownVersionError:
        return None
