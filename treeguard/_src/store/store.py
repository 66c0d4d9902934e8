"""``ArtifactStore``: the lifecycle of a model's weights, in a directory or a bucket.

A version moves candidate -> verified or rejected by ``verify``; only a
verified version is promoted to current, and ``rollback`` returns to the
previous verified one. The lifecycle is written once, here, over a
``Backend`` (backend.py): ``LocalBackend`` (local.py) for a directory,
``BucketBackend`` (bucket.py) for ``s3://`` and ``gs://``. The backends
differ only in their primitives (the lock, how a record, a verdict and a
log event are written, how a version's bytes are read and removed); which
version may be used, what the pointer may say and what gc keeps are
decided here, with the parts beside this module: ``pointer``
(``CURRENT.json``), ``gates`` (verdict, signature and digest checks),
``payload`` (the verdict's evidence), ``checks`` (the caller's checks) and
``retention`` (what ``gc`` keeps).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ..checkpoint import asyncsave, user_metadata_json
from ..env import environment
from ..errors import (
    ConflictError,
    DanglingPointerError,
    FormatError,
    IntegrityError,
    RetiredVersionError,
    SignatureError,
    StoreError,
    UnknownVersionError,
)
from ..hashing import DEFAULT, Algorithm, check_algorithm
from ..spec import TreeSpec
from . import gates, log, objects, payload, pointer, records
from .backend import Backend, Wanted
from .bucket import BucketBackend
from .checks import Check
from .layout import POINTER_FILE, check_name
from .lead import lead_acts
from .local import LocalBackend
from .payload import shardable
from .records import CheckRecord, VersionInfo
from .retention import RetentionPolicy

#: How many former current versions the pointer remembers (and gc keeps).
POINTER_DEPTH = 16
#: How many times an operation reads the pointer again when it moved meanwhile.
_POINTER_TRIES = 32


class ArtifactStore:
    """Versions of a model's weights, with verify, promote, rollback and gc.

    Opening a store reads nothing and creates nothing: the first ``put`` (or
    ``ArtifactStore.init``) makes the directory a store, and every other
    operation refuses a directory that is not one.

    Args:
      root: the store's directory, or ``s3://BUCKET/PREFIX`` /
        ``gs://BUCKET/PREFIX`` for a store in a bucket (made by ``init``;
        file versions only, every write conditional; see bucket.py).
      key: a secret of at least 16 bytes. With a key, each verdict is signed
        and ``promote``, ``rollback``, ``load_current`` and ``load_verified``
        refuse a verdict that is unsigned or wrongly signed. Without one, the
        key file named by ``$TREEGUARD_STORE_KEY_FILE`` is used if set.

    Raises:
      StoreError: for a key that is too short, a key file that cannot be
        read, others may rewrite or lies inside the store; for a bucket URL
        without a valid bucket name.
      ConfigError: for ``$TREEGUARD_STORE_KEY_FILE`` set but empty.

    Example:
      >>> import tempfile, numpy as np
      >>> store = ArtifactStore(tempfile.mkdtemp())
      >>> params = {"w": np.ones((2, 3), np.float32)}
      >>> v1 = store.put(params, metadata={"step": 100})
      >>> store.verify(v1, checks=[lambda tree: bool(np.isfinite(tree["w"]).all())]).status
      'verified'
      >>> store.promote(v1)
      >>> store.current() == v1, store.load_current(params)["w"].shape
      (True, (2, 3))
      >>> v2 = store.put({"w": np.ones((3, 2), np.float32)})
      >>> print(store.verify(v2).reason)
      contract: 1 mismatch between the checkpoint and version v000001 (current):
        ['w']: shape (2, 3) in version v000001 (current), (3, 2) in the checkpoint
      hint: ...
      >>> store.promote(v2)
      Traceback (most recent call last):
      ...
      treeguard.StoreError: version v000002 is rejected, not verified: ...
    """

    def __init__(self, root: str | os.PathLike[str], /, *, key: bytes | str | None = None):
        bucket = objects.is_url(root)
        self._backend: Backend = (
            BucketBackend(objects.normal_url(root)) if bucket else LocalBackend(root)
        )
        self.root = self._backend.root
        self._key = gates.resolve_key(key, root=None if bucket else self.root)

    @classmethod
    def init(
        cls, root: str | os.PathLike[str], /, *, key: bytes | str | None = None
    ) -> ArtifactStore:
        """Makes ``root`` a store (creating it if absent) and opens it.

        An existing store is opened unchanged. A directory of an older
        treeguard store (``versions/`` without the marker) is adopted, its
        numbering continued.

        Raises:
          StoreError: for a root or ``versions/`` that is a link or not a directory.
        """
        store = cls(root, key=key)
        store._backend.init()
        return store

    @property
    def signed(self) -> bool:
        """Whether this store signs verdicts and requires signatures (has a key)."""
        return self._key is not None

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root!r}{', signed' if self.signed else ''})"

    # -- reading ---------------------------------------------------------
    def _record(self, version: str) -> tuple[str, dict[str, Any]]:
        """The location and validated record of a version, after checking
        that the root is a store."""
        check_name(version)
        self._backend.require()
        return self._backend.record(version)

    def info(self, version: str, /) -> VersionInfo:
        """The record of one version.

        Args:
          version: the version's name.

        Returns:
          Its ``VersionInfo``, read from its ``status.json``.

        Raises:
          UnknownVersionError: for a version that does not exist or a bad name.
          StoreError: if the root is not a store or the record is malformed
            (naming the file and the field).

        Example:
          >>> import tempfile, numpy as np
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> v = store.put({"w": np.ones(3, np.float32)}, metadata={"step": 1})
          >>> info = store.info(v)
          >>> info.status, info.metadata, info.num_params
          ('candidate', {'step': 1}, 3)
        """
        location, data = self._record(version)
        return records.info(version, location, data)

    def versions(self) -> list[VersionInfo]:
        """Every version with a status record, oldest first.

        A version whose ``status.json`` cannot be read is listed last, with
        status ``unreadable`` and the error as its reason, so that a damaged
        record is reported rather than hidden.

        Raises:
          StoreError: if the root is not a store.

        Example:
          >>> import tempfile, numpy as np
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> _ = store.put({"w": np.ones(3, np.float32)})
          >>> [(v.version, v.status) for v in store.versions()]
          [('v000001', 'candidate')]
        """
        self._backend.require()
        return self._listing()[1]

    def _listing(self) -> tuple[list[str], list[VersionInfo]]:
        """One listing of the store: every name that may be a version, and
        the record of each that has one, sorted as ``versions`` returns them
        (a name without a record is a put under way, or one that died)."""
        names = self._backend.version_names()
        out: list[VersionInfo] = []
        for name in names:
            try:
                location, data = self._backend.record(name)
            except UnknownVersionError:
                continue  # a put that has not written its record, or a version gc removed
            except (StoreError, FormatError) as e:
                location = self._backend.storage.where(f"versions/{name}")
                out.append(records.unreadable(name, str(e), location))
                continue
            out.append(records.info(name, location, data))
        listed = sorted(
            out,
            key=lambda v: (
                v.status == records.UNREADABLE,
                -1 if v.seq is None else v.seq,  # an older store's versions come first
                v.created,
                v.version,
            ),
        )
        return names, listed

    def forged_verdicts(self, versions: Sequence[VersionInfo] | None = None) -> dict[str, str]:
        """The versions whose verdict this store's key does not vouch for.

        ``info`` and ``versions`` return a record as it is; this checks, in a
        store with a key, the signature of each verdict (``verified`` or
        ``rejected``) as the gates do. A verdict that is unsigned or whose
        signature does not match is forged, or was written before the key:
        a person must look at it. Without a key nothing can be told apart.

        Args:
          versions: the versions to check, as ``versions()`` lists them;
            None for every version.

        Returns:
          Each forged verdict's version, with why (the ``SignatureError``'s
          message); empty in a store without a key. A version whose record
          changed since it was listed is left out.

        Raises:
          StoreError: if the root is not a store.

        Example:
          >>> import json, pathlib, tempfile, numpy as np
          >>> store = ArtifactStore(tempfile.mkdtemp(), key=b"a key of sixteen bytes")
          >>> v = store.put({"w": np.ones(3, np.float32)})
          >>> store.verify(v).status, store.forged_verdicts()
          ('verified', {})
          >>> status = pathlib.Path(store.root, "versions", v, "status.json")
          >>> record = json.loads(status.read_text())
          >>> del record["signature"]  # as written by someone without the key
          >>> _ = status.write_text(json.dumps(record))
          >>> store.forged_verdicts()
          {'v000001': "version v000001's verdict is not signed, and this store has a key"}
        """
        marker = self._backend.require()
        if self._key is None:
            return {}
        out: dict[str, str] = {}
        for info in self.versions() if versions is None else versions:
            if info.status in gates.VERDICTS:
                try:
                    self._check_verdict(marker, info.version, self._backend.record(info.version)[1])
                except SignatureError as e:
                    out[info.version] = e.message
                except StoreError:
                    continue  # changed since it was listed (gc's remove() reads it again)
        return out

    def _pointer(self) -> pointer.Pointer:
        marker = self._backend.require()
        ptr = pointer.read(self._backend.storage, promoted=False)
        if ptr.tag is None and marker.get("promoted") and self._ever_moved():
            return pointer.read(self._backend.storage, promoted=True)  # raises: damaged
        # marked promoted but never moved: a first promote killed between the
        # marker and the pointer (as older versions wrote them); nothing is current
        return ptr

    def _ever_moved(self) -> bool:
        """Whether the log records a promote or a rollback (a pointer was written)."""
        try:
            events = self._backend.history()
        except StoreError:
            return True  # cannot tell: the missing pointer is a damaged one
        return any(e.action in ("promote", "rollback") for e in events)

    def current(self) -> str | None:
        """The current version's name, or None before the first promotion.

        Raises:
          StoreError: if the root is not a store or the pointer is damaged.
        """
        return self._pointer().current

    def previous(self) -> str | None:
        """The version ``rollback`` would try first: the most recent formerly
        current version whose record says verified; None if there is none."""
        return self._previous_verified(self._pointer())[0]

    def _previous_verified(self, ptr: pointer.Pointer) -> tuple[str | None, tuple[str, ...]]:
        for i, v in enumerate(ptr.previous):
            try:
                if self._record(v)[1]["status"] == "verified":
                    return v, ptr.previous[i + 1 :]
            except StoreError:
                continue
        return None, ()

    def history(self) -> list[Event]:
        """Every whole logged event, oldest first (a torn line is skipped).

        Raises:
          StoreError: if the root is not a store, or the log is not a
            regular file.
        """
        self._backend.require()
        return self._backend.history()

    def log_event(self, action: str, version: str | None, /, **detail: Any) -> None:
        """Appends an event to the store's log (a server records its swaps here).

        Args:
          action: a short name such as ``"swap"``.
          version: the version concerned, or None.
          **detail: JSON-serialisable details.

        Raises:
          StoreError: if the root is not a store.
          ValueError: for an action that is not a short identifier.
        """
        if not (isinstance(action, str) and action.isidentifier() and len(action) <= 40):
            raise ValueError(f"action must be a short identifier, not {str(action)[:40]!r}")
        if version is not None:
            check_name(version)
        self._log(action, version, dict(detail))

    def _log(self, action: str, version: str | None, detail: dict[str, Any]) -> None:
        with self._backend.locked():
            self._backend.append(action, version, detail)

    def put(
        self,
        tree: Any,
        /,
        *,
        metadata: Mapping[str, Any] | None = None,
        version: str | None = None,
        digest: Algorithm = DEFAULT,
        block: bool = True,
    ) -> Any:
        """Saves a tree as a new candidate version.

        The first ``put`` into a directory that does not exist, or is empty,
        makes it a store.

        Args:
          tree: the parameters.
          metadata: JSON-serialisable data kept with the version.
          version: a name for it; by default the next ``v000001``,
            ``v000002``... A name is never handed out twice, even after
            ``gc`` removed its version.
          digest: the checkpoint's hash algorithm, ``"blake3"`` (the
            default) or ``"sha256"``; versions of both kinds live side by
            side and are verified, promoted and loaded alike.
          block: False copies the tree's arrays to host memory and returns a
            ``SaveHandle`` at once (as ``save_async`` does, one at a time);
            its ``result()`` is the version's name or the error.

        Returns:
          The version's name (a ``SaveHandle`` with ``block=False``).

        Raises:
          StoreError: if the named version exists or existed, or the root is
            a directory with other content that is not a store.
          UnknownVersionError: for a name that is not allowed.
          StorageError: for a disk that filled up while it was written,
            naming the version; nothing of it is kept.
          InvalidTreeError: for a tree that cannot be saved.
          TypeError: for metadata that is not JSON, naming the key; nothing
            is created then.
        """
        user = json.loads(user_metadata_json(metadata))  # refuse bad metadata before any write
        algorithm = check_algorithm(digest)
        if version is not None:
            check_name(version)
        if not block:  # the same put, on a background thread, from a host copy
            asyncsave.wait_for_slot(1)
            host = asyncsave.host_copy(tree)
            return asyncsave.start(
                self.root,
                lambda: self.put(host, metadata=user, version=version, digest=algorithm),
                exclusive=False,
            )
        return self._backend.put(tree, user, version, algorithm)

    def put_sharded(
        self,
        tree: Any,
        /,
        *,
        metadata: Mapping[str, Any] | None = None,
        version: str | None = None,
        digest: Algorithm = DEFAULT,
    ) -> str:
        """Saves a tree of sharded ``jax.Array``s as a new candidate version,
        through ``save_sharded``, into the version's directory.

        In a multi-process job every process calls it, with its part of the
        same global arrays, as it calls ``save_sharded``: process 0 picks
        the name and makes the version's record (``writing``), every process
        writes its shards, and once every process is done process 0 records
        the version as a candidate. Every process returns the same name.
        Until then the version is ``writing``: never verified, promoted or
        loaded, and removed by ``gc`` once its writer is gone, so a kill at
        any moment leaves the store, and its current version, as they were.

        Args:
          tree: a pytree whose leaves are ``jax.Array``s.
          metadata: JSON-serialisable data kept with the version.
          version: a name for it (see ``put``).
          digest: the shards' hash algorithm (see ``put``).

        Returns:
          The version's name.

        Raises:
          StoreError: as ``put`` does, or if process 0 could not record the
            version (in every process).
          UnknownVersionError: for a name that is not allowed.
          StorageError: for a disk that filled up while it was written,
            naming the version; nothing of it is kept.
          InvalidTreeError, TypeError: for a tree ``save_sharded`` refuses,
            or metadata that is not JSON; nothing is kept then.

        Example:
          >>> import tempfile, jax.numpy as jnp
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> v = store.put_sharded({"w": jnp.ones((4, 2))}, metadata={"step": 1})
          >>> store.info(v).kind, store.verify(v).status
          ('sharded', 'verified')
          >>> store.promote(v)
          >>> store.load_current({"w": jnp.zeros((4, 2))})["w"].sum()
          Array(8., dtype=float32)
        """
        user = json.loads(user_metadata_json(metadata))  # refuse bad metadata before any write
        algorithm = check_algorithm(digest)
        if version is not None:
            check_name(version)
        return self._backend.put_sharded(tree, user, version, algorithm)

    # -- verify ----------------------------------------------------------

    def verify(
        self,
        version: str,
        /,
        *,
        like: Any = None,
        checks: Sequence[Check] = (),
    ) -> VersionInfo:
        """Checks a version and records it as verified or rejected.

        The checkpoint is loaded with every hash checked, and its structure
        compared with the contract: ``like`` when given, else the current
        version's spec (so a candidate of another structure is rejected),
        else (the first version) only its own stored spec. Then each check
        runs on the loaded tree. The first failure rejects the version with
        its reason; a version is verified only if everything passes. The
        verdict is bound to the digest of the file it was computed on (and
        signed, in a store with a key); if the version was replaced while it
        was checked, no verdict is recorded.

        Args:
          version: the version to check.
          like: the tree or ``TreeSpec`` it must match; its structure is
            also the one the checks receive. For a sharded version, a tree
            whose leaves carry shardings is loaded onto them (in a
            multi-process job every process calls ``verify`` then, and the
            verdict is agreed and written by process 0); otherwise the
            version is read whole onto this process's first device.
          checks: callables taking the tree, or ``(name, callable)`` pairs.
            A check passes by returning None or a true value, fails by
            returning a false one (``False``, ``np.False_``, a false 0-d jax
            array) or raising; a returned array of any other shape fails, as
            it is no truth value.

        Returns:
          The updated ``VersionInfo``; ``status`` is ``verified`` or
          ``rejected`` (see ``reason``).

        Raises:
          UnknownVersionError: for an unknown version.
          StoreError: for a version still being written, one replaced while
            it was checked, or whose ``status.json`` is malformed.
          IntegrityError: for a record whose kind (``file`` or ``sharded``)
            is not what the version's directory holds.
          SignatureError: in a signed store opened without its key; in a
            store with a key, for a verdict that may not be replaced (in a
            bucket) and is unsigned or forged, of either status.
        """
        location, before = self._record(version)
        try:
            self._backend.verifiable(version, location, before)
        except StoreError as refused:  # by the verdict it holds (a bucket's): is that one forged?
            self._check_refusing_verdict(version, before, refused)
            raise
        if self._key is None and self._backend.require().get("signed"):
            raise gates.unkeyed(version)
        contract, contract_name = self._contract_for(version, like)
        kind = payload.of(before)
        results, reason, digest = payload.judge(
            lambda digests: self._backend.read_for_verdict(version, before, contract, digests),
            kind.evidence,
            contract_name,
            checks,
        )
        if kind.collective and shardable(like):
            return self._record_agreed(version, before, results, reason, digest, contract_name)
        return self._record_verdict(version, before, results, reason, digest, contract_name)

    def _check_refusing_verdict(
        self, version: str, before: dict[str, Any], refused: StoreError
    ) -> None:
        """Names a forged verdict that stands in the way of a new one as forged."""
        try:
            self._check_verdict(self._backend.require(), version, before)
        except SignatureError as e:
            raise SignatureError(
                f"{e.message}; {refused.message}",
                version=version,
                context=refused.context,
                hint=refused.hint,
            ) from e

    def _record_agreed(  # noqa: PLR0917 - one call site
        self,
        version: str,
        before: dict[str, Any],
        results: list[CheckRecord],
        reason: str | None,
        digest: str | None,
        contract_name: str,
    ) -> VersionInfo:
        """In a multi-process job: the verdict agreed by every process (the
        first reason any gives), recorded by process 0, read by every one."""
        from ..sharded import hosts  # lazy: jax's multi-process utilities

        if hosts.process_count() == 1:
            return self._record_verdict(version, before, results, reason, digest, contract_name)
        reasons = hosts.allgather_bytes((reason or "").encode("utf-8"))
        first = next((r.decode("utf-8") for r in reasons if r), None)
        if first is not None and reason is None:
            reason = first
            results = [*results, CheckRecord("other processes", False, first)]

        def record() -> bytes:
            self._record_verdict(version, before, results, reason, digest, contract_name)
            return b""

        lead_acts(
            record,
            failed=lambda why: StoreError(
                f"process 0 could not record the verdict on {version}: {why}",
                version=version,
                hint=f"verify it again: store.verify({version!r})",
            ),
        )
        return self.info(version)

    def _record_verdict(  # noqa: PLR0917 - two call sites
        self,
        version: str,
        before: dict[str, Any],
        results: list[CheckRecord],
        reason: str | None,
        digest: str | None,
        contract_name: str,
    ) -> VersionInfo:
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
        with self._backend.locked():
            location, data = self._record(version)
            if data.get("uid") != before.get("uid") or (
                digest is not None and self._backend.digest_now(version, location, data) != digest
            ):
                raise StoreError(
                    f"version {version} was replaced while it was verified; no verdict recorded",
                    version=version,
                    hint=f"verify it again: store.verify({version!r})",
                )
            marker = self._backend.require()
            if self._key is not None:
                # from now on the store refuses to be used without the key
                marker = self._backend.mark("signed")
                verdict["signature"] = gates.sign(
                    self._key, str(marker["id"]), version, data | verdict
                )
            elif marker.get("signed"):
                raise gates.unkeyed(version)
            data = self._backend.save_verdict(version, data, verdict)
            self._backend.append("verify", version, {"status": verdict["status"], "reason": reason})
        return records.info(version, location, data)

    def _contract_for(self, version: str, like: Any) -> tuple[Any, str]:
        if like is not None:
            return like, "`like`"
        cur = self.current()
        if cur is not None and cur != version:
            return spec_of_version(self, cur), f"version {cur} (current)"
        return None, "its own stored spec"

    # -- the gates -------------------------------------------------------

    def _gate(self, version: str, *, full: bool) -> tuple[str, dict[str, Any], str]:
        """Checks that ``version`` may be used: verified, signed when the
        store has a key and (``full``) its every byte matches the verdict's
        digest. Returns its location, record and recorded digest."""
        check_name(version)
        marker = self._backend.require()
        location, data = self._backend.record(version)
        self._check_verdict(marker, version, data)
        digest = gates.require_verified(version, data)
        self._backend.check_payload(version, location, data)
        if full:
            self._backend.recheck(version, location, data, digest)
        return location, data, digest

    def _check_verdict(self, marker: dict[str, Any], version: str, data: dict[str, Any]) -> None:
        """Checks the signature of a version's verdict, whatever its status,
        before the status is trusted: a forged ``rejected`` is refused as
        forged, as a forged ``verified`` is. A candidate has no verdict."""
        if data["status"] in gates.VERDICTS:
            gates.check_signature(
                self._key, str(marker["id"]), version, data, signed=bool(marker.get("signed"))
            )

    def check_verified(self, version: str, /) -> str:
        """Checks, without reading the weights, that ``version`` may still be
        served: its record says verified and, in a store with a key, its
        verdict is signed with it. A server calls this before it returns to
        weights it already holds.

        Returns:
          The digest of the file the verdict was computed on; a caller that
          holds weights loaded through ``load_verified`` compares it with
          the digest it loaded them under.

        Raises:
          StoreError: if the version is not verified.
          SignatureError: if the store has a key and the verdict is not
            signed with it.
          UnknownVersionError: for an unknown version.
        """
        return self._gate(version, full=False)[2]

    def load_verified(
        self,
        version: str,
        /,
        like: Any = None,
        *,
        subtree: str | None = None,
        ignore: Collection[str] = (),
    ) -> Any:
        """Loads a version only if it passes every gate.

        The version must be verified, signed in a store with a key, and its
        file must still match, byte for byte, the digest its verdict was
        computed on (checked on the same read that loads it, so it costs no
        extra pass over the data).

        Args:
          version: the version.
          like: the tree or ``TreeSpec`` whose structure the result takes;
            for a sharded version, a tree of ``jax.Array``s or
            ``jax.ShapeDtypeStruct``s with the shardings to restore onto
            (every process of a job calls it).
          subtree: the key path of the one stored subtree to load (``like``
            then describes it alone); only its tensors are read and hashed.
          ignore: key paths of stored subtrees to leave unread.

        Returns:
          The tree.

        Raises:
          StoreError: if the version is not verified.
          SignatureError: if the store has a key and the verdict is not
            signed with it.
          IntegrityError: if the file changed since it was verified (naming
            the version).
          TreeMismatchError: if it does not match ``like``.
          ValueError: for a sharded version and a ``like`` without shardings.
        """
        location, data, digest = self._gate(version, full=False)
        return self._backend.load(version, location, data, Wanted(like, digest, subtree, ignore))

    def load_version(
        self,
        version: str,
        /,
        like: Any = None,
        *,
        subtree: str | None = None,
        ignore: Collection[str] = (),
    ) -> Any:
        """Loads any version with every hash checked; a verified one is also
        checked against its verdict's digest (a candidate has none yet).
        ``subtree`` and ``ignore`` select a part, as for ``load_verified``.

        Raises:
          UnknownVersionError: for an unknown version.
          IntegrityError, FormatError: for a damaged file.
          TreeMismatchError: if it does not match ``like``.
          ValueError: for a sharded version and a ``like`` without shardings.
        """
        location, data = self._record(version)
        digest = data.get("digest") if data["status"] == "verified" else None
        self._backend.check_payload(version, location, data)
        return self._backend.load(version, location, data, Wanted(like, digest, subtree, ignore))

    def load_current(
        self,
        like: Any = None,
        *,
        fallback: bool = False,
        subtree: str | None = None,
        ignore: Collection[str] = (),
    ) -> Any:
        """Loads the current version through every gate (see ``load_verified``).

        Args:
          like: the tree or ``TreeSpec`` whose structure the result takes;
            for a sharded version, a tree of ``jax.Array``s or
            ``jax.ShapeDtypeStruct``s with the shardings to restore onto
            (every process of a job calls it).
          fallback: if the current version fails a gate, load the most
            recent former current version that passes them all instead (the
            fall back is logged).
          subtree: the key path of the one stored subtree to load (``like``
            then describes it alone); only its tensors are read and hashed.
          ignore: key paths of stored subtrees to leave unread.

        Returns:
          The tree.

        Raises:
          StoreError: if nothing was promoted yet, or the current version
            fails a gate (and, with ``fallback``, every former one too).
          IntegrityError, FormatError: if the current file is damaged.
          TreeMismatchError: if it does not match ``like``.
          ValueError: for a sharded version and a ``like`` without shardings.
        """
        ptr = self._pointer()
        if ptr.current is None:
            raise StoreError(
                "no current version",
                context=self.root,
                hint="promote a verified version first: store.promote(version)",
            )
        try:
            return self.load_verified(ptr.current, like, subtree=subtree, ignore=ignore)
        except (IntegrityError, FormatError, OSError, StoreError) as first:
            if not fallback:
                raise
            for v in ptr.previous:
                try:
                    tree = self.load_verified(v, like, subtree=subtree, ignore=ignore)
                except (IntegrityError, FormatError, OSError, StoreError):
                    continue
                self._log(
                    "fallback", v, {"current": ptr.current, "reason": str(first).splitlines()[0]}
                )
                return tree
            raise

    # -- promote and rollback --------------------------------------------

    def promote(self, version: str, /) -> None:
        """Makes a verified version current; the old current becomes the one
        ``rollback`` returns to.

        Under the store's lock, the version passes every gate: verified,
        signed in a store with a key, and its whole file read again and
        matched with the digest its verdict was computed on. For a sharded
        version: its directory holds only regular files and directories,
        its manifest's digest is the verdict's, and every shard is read
        again in this process (a group of arrays at a time) and hashed.

        Args:
          version: the version to make current.

        Raises:
          StoreError: if the version is not verified.
          SignatureError: if the store has a key and the verdict is not signed with it.
          IntegrityError: if its file changed since it was verified.
          UnknownVersionError: for an unknown version.
        """
        check_name(version)
        with self._backend.locked():
            self._gate(version, full=True)
            for _ in range(_POINTER_TRIES):
                ptr = self._pointer()
                if ptr.current == version:
                    return
                self._refuse_retired(version)  # after reading the pointer: see gc
                if pointer.write(
                    self._backend.storage, ptr.promoting(version, POINTER_DEPTH), replacing=ptr
                ):
                    break
            else:
                raise _kept_moving(self.root)
            # after the pointer: from now on a missing pointer is a damaged one (for
            # readers that look at the marker); a kill between the two reads as it is
            self._backend.mark("promoted")
            self._backend.append("promote", version, {"previous": ptr.current})

    def _refuse_retired(self, version: str) -> None:
        """Refuses a version whose name gc retired: it is never current again."""
        if self._backend.retired(version):
            raise RetiredVersionError(
                f"version {version} was retired by gc: it is being removed and is never "
                "made current again",
                version=version,
                context=self.root,
                hint="put the weights again as a new version, verify it and promote that one",
            )

    def rollback(self) -> str:
        """Makes the most recent former current version that passes every
        gate current again (see ``promote``); each one that fails is skipped
        and the reason logged.

        Returns:
          The version now current.

        Raises:
          StoreError: if no former version passes; the pointer is unchanged.
        """
        with self._backend.locked():
            for _ in range(_POINTER_TRIES):
                ptr = self._pointer()
                skipped: list[str] = []
                for i, v in enumerate(ptr.previous):
                    try:
                        self._gate(v, full=True)
                        self._refuse_retired(v)  # after reading the pointer: see gc
                    except (StoreError, IntegrityError, FormatError, OSError) as e:
                        skipped.append(f"{v}: {str(e).splitlines()[0]}")
                        continue
                    if not pointer.write(
                        self._backend.storage,
                        pointer.Pointer(v, ptr.previous[i + 1 :]),
                        replacing=ptr,
                    ):
                        break  # rewritten unchanged meanwhile: read it again
                    self._backend.append(
                        "rollback", v, {"previous": ptr.current, "skipped": skipped}
                    )
                    return v
                else:
                    raise pointer.nothing_to_roll_back_to(ptr, skipped, self.root)
            raise _kept_moving(self.root)

    def repair(self, version: str, /) -> list[str]:
        """Points a damaged store at ``version``: the way out of a pointer
        that names a version the store does not hold (``DanglingPointerError``),
        or that is missing or malformed.

        Nothing is guessed: a person names the version to make current, and it
        must pass every gate ``promote`` checks (verified, signed with the key
        where there is one, every byte matching its verdict's digest, its name
        not retired). The former versions the pointer remembers are kept in
        their order, less those the store does not hold or that were retired;
        the pointer is replaced by compare-and-swap and read back, and the
        repair is logged with what it dropped.

        Args:
          version: the version to make current.

        Returns:
          The names dropped from the pointer (absent or retired ones), and
          the former current one if it was absent.

        Raises:
          StoreError: if the version fails a gate.
          RetiredVersionError: for a version gc retired.
          UnknownVersionError: for an unknown version.
          ConflictError: if another process moved the pointer meanwhile.

        Example:
          >>> import os, tempfile, numpy as np
          >>> from treeguard import DanglingPointerError
          >>> store = ArtifactStore(tempfile.mkdtemp())
          >>> v1, v2 = (store.put({"w": np.full(3, i, np.float32)}) for i in (1, 2))
          >>> for v in (v1, v2):
          ...     _ = store.verify(v)
          ...     store.promote(v)
          >>> import shutil; shutil.rmtree(os.path.join(store.root, "versions", v2))
          >>> try:
          ...     store.gc()
          ... except DanglingPointerError as e:
          ...     print(e.message.split(";")[0])
          the pointer names version v000002 as current, and the store does not hold it
          >>> store.repair(v1)
          ['v000002']
          >>> store.current(), store.gc()
          ('v000001', [])
        """
        check_name(version)
        with self._backend.locked():
            self._gate(version, full=True)
            self._refuse_retired(version)
            old = pointer.salvage(self._backend.storage)
            held = {v.version for v in self._listing()[1]}
            keep = [
                v
                for v in old.previous
                if v != version and v in held and not self._backend.retired(v)
            ]
            dropped = [v for v in (old.current, *old.previous) if v is not None and v not in held]
            dropped += [v for v in old.previous if v in held and v not in keep and v != version]
            if not pointer.write(
                self._backend.storage, pointer.Pointer(version, tuple(keep)), replacing=old
            ):
                raise _kept_moving(self.root)
            self._backend.mark("promoted")
            self._backend.append("repair", version, {"previous": old.current, "dropped": dropped})
        return dropped

    # -- gc --------------------------------------------------------------

    def gc(self, *, policy: RetentionPolicy | None = None) -> list[str]:
        """Removes old versions.

        It never removes the current version or any former current one the
        pointer remembers (whatever their status files say), the newest
        versions the policy keeps, a version being written by a live
        process (or by one on another host, whose pid means nothing here), a
        version whose record cannot be read, in a store with a key a version
        whose verdict is unsigned or wrongly signed (which ``keep_verified``
        never counts as verified), or a directory that holds files the store
        did not write. It refuses to run when the
        pointer is damaged, since it cannot then tell what is current.

        Args:
          policy: what to keep; ``RetentionPolicy()`` (the 3 newest) by default.

        Returns:
          The versions removed.

        Raises:
          StoreError: if the root is not a store or the pointer is damaged.
        """
        policy = policy or RetentionPolicy()
        with self._backend.locked():
            ptr, names, listed = self._consistent_view()
            protect = ptr.names() | self._kept(policy, listed)
            finished = {v.version for v in listed if v.status in records.FINISHED}
            doomed = [n for n in names if n not in protect]
            for name in doomed:
                if name in finished:  # a writing, unreadable or unrecorded one: remove() decides
                    self._backend.retire(name)
            spared = self._fence() if doomed else set()
            removed = [
                n
                for n in doomed
                if n not in spared and self._backend.remove(n, retired=n in finished)
            ]
            self._backend.after_gc()
            if removed or spared & set(doomed):
                self._backend.append(
                    "gc",
                    None,
                    {
                        "removed": removed,
                        "keep": policy.keep_last,
                        "spared": sorted(spared & set(doomed)),
                    },
                )
        return removed

    def _consistent_view(self) -> tuple[pointer.Pointer, list[str], list[VersionInfo]]:
        """The pointer and one listing of the store, with every version the
        pointer names held (the listing may not show one made after it).

        Raises:
          DanglingPointerError: for a pointer that names a version the store
            does not hold, twice in a row (never a guess at what is current).
        """
        for _ in range(_POINTER_TRIES):
            ptr = self._pointer()  # raises on a damaged pointer: nothing is deleted then
            names, listed = self._listing()
            present = set(names) | {v.version for v in listed}
            absent = [v for v in ptr.names() if v not in present and not self._holds(v)]
            if not absent:
                return ptr, names, listed
            if self._pointer() == ptr:  # not a pointer moved under the listing: damage
                which = "as current" if ptr.current in absent else "among the former ones"
                missing = ptr.current if ptr.current in absent else absent[0]
                raise DanglingPointerError(
                    f"the pointer names version {missing} {which}, and the store does not "
                    "hold it; gc deleted nothing",
                    version=missing,
                    context=self._backend.storage.where(POINTER_FILE),
                    hint="point the store at a version you choose: "
                    f"`treeguard store repair {self.root} VERSION` (ArtifactStore.repair)",
                )
        raise _kept_moving(self.root)

    def _holds(self, version: str) -> bool:
        """Whether the store holds ``version`` now (its record, readable or not)."""
        try:
            self._backend.record(version)
        except UnknownVersionError:
            return False
        except (StoreError, FormatError):
            return True
        return True

    def _fence(self) -> set[str]:
        """After gc retired the names it chose: the versions the pointer names
        once it is rewritten unchanged, by compare-and-swap, from a fresh read.

        Why nothing current, or that could become current, is deleted: a
        name enters the pointer only by ``promote`` (which reads the pointer,
        then refuses a retired name, then swaps the pointer on the tag it
        read) or by ``rollback`` (which moves to a name the pointer already
        holds). Every swap is ordered on the pointer. A promote whose swap
        comes before the fence's is seen by the fence's read (or makes the
        fence's swap fail, and the fence reads again); a promote whose swap
        comes after the fence read the pointer after the fence, so after gc
        retired its names, and refuses them. So every pointer from the fence
        on names only versions the fence saw, or versions gc did not retire;
        gc deletes neither. A name gc chose without retiring it (no finished
        record when it listed: a put under way or dead) may be promoted
        after the fence, once its put ends; for those the backend deletes
        only data that still has no record (``remove(retired=False)``).
        """
        for _ in range(_POINTER_TRIES):
            ptr = self._pointer()
            try:
                if pointer.write(
                    self._backend.storage,
                    pointer.Pointer(ptr.current, ptr.previous),
                    replacing=ptr,
                ):
                    return ptr.names()
            except ConflictError:
                continue  # moved by a promote or rollback: read it again
        raise _kept_moving(self.root)

    def _kept(self, policy: RetentionPolicy, listed: list[VersionInfo]) -> set[str]:
        finished = [v for v in listed if v.status in records.FINISHED]
        newest = finished[max(0, len(finished) - policy.keep_last) :] if policy.keep_last else []
        forged = self.forged_verdicts(finished).keys()  # kept, never counted as verified
        kept = {v.version for v in newest} | forged
        verified = [
            v.version for v in finished if v.status == "verified" and v.version not in forged
        ]
        if policy.keep_verified:
            kept.update(verified[-policy.keep_verified :])
        return kept


def _kept_moving(root: str) -> StoreError:
    return StoreError(
        f"the pointer kept moving under {_POINTER_TRIES} tries in a row",
        context=root,
        hint="too many promotes, rollbacks or gcs at once; try again",
    )


Event = log.Event


def spec_of_version(store: ArtifactStore, version: str) -> TreeSpec:
    """The stored spec of one version, from its header (or manifest) only."""
    location, data = store._record(version)
    return store._backend.stored_spec(version, location, data)
