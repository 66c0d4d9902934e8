"""``ArtifactStore``, the store's face: it opens a ``Backend`` and a ``VerdictSigner``
and hands each operation to the module that owns it (README.md says which)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ..checkpoint import asyncsave
from ..hashing import DEFAULT, Algorithm, memo
from ..spec import TreeSpec
from . import exchange, exported, lifecycle, log, objects, records, verdicts
from .backend import Backend, Offered, record_of
from .bucket import BucketBackend
from .checks import Check
from .layout import check_name
from .loads import GatedLoads
from .local import LocalBackend
from .pointer import Pointer, of_store
from .records import VersionInfo
from .retention import RetentionPolicy
from .signing import EcKeys, VerdictSigner, signer_for


class ArtifactStore(GatedLoads, exchange.SignedModels):
    """Versions of a model's weights, with verify, promote, rollback and gc.

    Opening a store reads nothing and creates nothing: the first ``put`` (or
    ``ArtifactStore.init``) makes the directory a store, and every other
    operation refuses a directory that is not one.

    Args:
      root: the store's directory, or ``s3://BUCKET/PREFIX`` /
        ``gs://BUCKET/PREFIX`` for a store in a bucket (made by ``init``;
        file versions only, every write conditional; see bucket.py).
      key: a secret of at least 16 bytes (HMAC). With a key, each verdict is
        signed and ``promote``, ``rollback``, ``load_current`` and
        ``load_verified`` refuse a verdict that is unsigned or wrongly
        signed. Without one, the key file named by
        ``$TREEGUARD_STORE_KEY_FILE`` is used if set.
      signing_key: an EC private key file (``treeguard keys new``; the
        ``sign`` extra): each verdict is signed with it, and its own public
        key is trusted unless revoked.
      trusted_keys: EC public key files: every gate honours only a verdict
        signed by one of them (or by ``signing_key``) that is not revoked.
        A store with public keys only checks verdicts and cannot make one.
      revoked_keys: EC public key files whose verdicts no longer count, at
        once (a ``RevokedKeyError`` naming the key). Without any of the three,
        ``$TREEGUARD_SIGNING_KEY_FILE``, ``$TREEGUARD_TRUSTED_KEYS`` and
        ``$TREEGUARD_REVOKED_KEYS`` name them (lists joined by ``os.pathsep``).

    Raises:
      StoreError: for a key that is too short, a key file that cannot be
        read, others may rewrite or lies inside the store; for a bucket URL
        without a valid bucket name.
      ConfigError: for a key variable set but empty, or an HMAC key and
        EC keys at once.
      KeyFileError: for an EC key file that cannot be used (a private key
        others may read, one inside the store, another curve).

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

    def __init__(
        self,
        root: str | os.PathLike[str],
        /,
        *,
        key: bytes | str | None = None,
        signing_key: str | os.PathLike[str] | None = None,
        trusted_keys: Sequence[str | os.PathLike[str]] = (),
        revoked_keys: Sequence[str | os.PathLike[str]] = (),
    ):
        bucket = objects.is_url(root)
        self._backend: Backend = (
            BucketBackend(objects.normal_url(root)) if bucket else LocalBackend(root)
        )
        self.root = self._backend.root
        keys = EcKeys(signing_key, tuple(trusted_keys), tuple(revoked_keys))
        self._signer: VerdictSigner | None = signer_for(
            key, root=None if bucket else self.root, keys=keys
        )

    @classmethod
    def init(
        cls,
        root: str | os.PathLike[str],
        /,
        *,
        key: bytes | str | None = None,
        signing_key: str | os.PathLike[str] | None = None,
        trusted_keys: Sequence[str | os.PathLike[str]] = (),
        revoked_keys: Sequence[str | os.PathLike[str]] = (),
        dedup: bool = False,
    ) -> ArtifactStore:
        """Makes ``root`` a store (creating it if absent) and opens it.

        An existing store is opened unchanged, but for ``dedup``. A
        directory of an older treeguard store (``versions/`` without the
        marker) is adopted, its numbering continued.

        Args:
          root: as for ``ArtifactStore``.
          key: as for ``ArtifactStore``.
          signing_key: as for ``ArtifactStore``.
          trusted_keys: as for ``ArtifactStore``.
          revoked_keys: as for ``ArtifactStore``.
          dedup: store tensors once per content: from now on each ``put``
            writes a manifest of the tensors by digest and only the tensors
            the store does not hold yet (``STORE.json`` records it; versions
            put before stay as they are, readable and promotable).

        Returns:
          The store.

        Raises:
          StoreError: for a root or ``versions/`` that is a link or not a directory.

        Example:
          >>> import tempfile, numpy as np
          >>> store = ArtifactStore.init(tempfile.mkdtemp(), dedup=True)
          >>> base = {"head": np.zeros(4, np.float32), "body": np.ones(1000, np.float32)}
          >>> v1 = store.put(base)
          >>> v2 = store.put({**base, "head": np.ones(4, np.float32)})  # writes only the head
          >>> store.info(v2).kind, store.verify(v2).status
          ('tensors', 'verified')
        """
        store = cls(
            root,
            key=key,
            signing_key=signing_key,
            trusted_keys=trusted_keys,
            revoked_keys=revoked_keys,
        )
        store._backend.init(dedup=dedup)
        return store

    @property
    def signed(self) -> bool:
        """Whether this store signs verdicts and requires signatures (has a key)."""
        return self._signer is not None

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root!r}{', signed' if self.signed else ''})"

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
        return records.info(version, *record_of(self._backend, version))

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
        return lifecycle.listing(self._backend)[1]

    def forged_verdicts(self, versions: Sequence[VersionInfo] | None = None) -> dict[str, str]:
        """The versions whose verdict this store's key does not vouch for.

        ``info`` and ``versions`` return a record as it is; this checks the
        signature of each verdict (``verified`` or ``rejected``) as the gates
        do. A verdict unsigned or wrongly signed is forged, or was written
        before the key: a person must look at it.

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
        if versions is None and self._signer is not None:
            versions = self.versions()
        return verdicts.forged(self._backend, self._signer, versions or [])

    def _pointer(self) -> Pointer:
        return of_store(self._backend)

    def current(self) -> str | None:
        """The current version's name, or None before the first promotion.

        Raises:
          StoreError: if the root is not a store or the pointer is damaged.
        """
        return self._pointer().current

    def previous(self) -> str | None:
        """The version ``rollback`` would try first: the most recent formerly
        current version whose record says verified; None if there is none."""
        return lifecycle.previous_verified(self._backend, self._pointer())[0]

    def history(self) -> list[log.Event]:
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
        with self._backend.locked():
            self._backend.append(action, version, dict(detail))

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
        user, algorithm = records.put_arguments(metadata, version, digest)
        if not block:  # the same put, on a background thread, from a host copy
            asyncsave.wait_for_slot(1)
            carried = memo.Carried(algorithm)  # what the memo knew of the arrays copied
            host = asyncsave.host_copy(tree, carried.add)
            return asyncsave.start(
                self.root,
                lambda: self._backend.put(Offered(host, user, version, algorithm, carried)),
                exclusive=False,
            )
        return self._backend.put(Offered(tree, user, version, algorithm))

    def attach_exported(self, version: str, blob: bytes, meta: dict[str, Any], /) -> str:
        """Keeps an exported function (``treeguard.export``'s) beside
        ``version``'s params: create-only, covered by the next verdict
        (``verify`` records its digest, which the verdict's signature signs).

        Args:
          version: a version that holds no artifact yet.
          blob: the serialized function.
          meta: its description (JSON).

        Returns:
          The digest the next verdict will cover.

        Raises:
          StoreError: for a version still being written or that already
            holds an artifact.
          UnknownVersionError: for an unknown version.
        """
        check_name(version)
        return exported.attach(self._backend, version, blob, meta)

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
        through ``save_sharded``, into the version's directory; in a bucket,
        each saved shard as its own create-only object and the manifest last.

        In a multi-process job every process calls it, with its part of the
        same global arrays, as it calls ``save_sharded``: process 0 picks
        the name and makes the version's record (``writing``), every process
        writes its shards, and once every process is done process 0 records
        the version as a candidate. Every process returns the same name.
        Until then the version is ``writing``: never verified, promoted or
        loaded, and removed by ``gc`` once its writer is gone, so a kill at
        any moment leaves the store, and its current version, as they were.
        In a bucket no version is seen until process 0 has written the
        manifest and the record, after every process's shards are confirmed;
        gc removes the shards of a put that died before that.

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
          UnknownVersionError, StorageError, InvalidTreeError, TypeError: as
            ``put`` does (for a tree ``save_sharded`` refuses).

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
        user, algorithm = records.put_arguments(metadata, version, digest)
        return self._backend.put_sharded(Offered(tree, user, version, algorithm))

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
          StorageError: for a read that failed on every try (no verdict).
        """
        return verdicts.verify(self._backend, self._signer, version, like, checks)

    def promote(self, version: str, /) -> None:
        """Makes a verified version current; the old current becomes the one
        ``rollback`` returns to.

        Under the store's lock, the version passes every gate: verified,
        signed in a store with a key, and its whole file (a sharded
        version's manifest and every shard, a group of arrays at a time)
        read again and matched with the digest its verdict was computed on.

        Args:
          version: the version to make current.

        Raises:
          StoreError: if the version is not verified.
          SignatureError: if the store has a key and the verdict is not signed with it.
          IntegrityError: if its file changed since it was verified.
          UnknownVersionError: for an unknown version.
        """
        lifecycle.promote(self._backend, self._signer, version)

    def rollback(self) -> str:
        """Makes the most recent former current version that passes every
        gate current again (see ``promote``); each one that fails is skipped
        and the reason logged.

        Returns:
          The version now current.

        Raises:
          StoreError: if no former version passes; the pointer is unchanged.
        """
        return lifecycle.rollback(self._backend, self._signer)

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
        return lifecycle.repair(self._backend, self._signer, version)

    def gc(self, *, policy: RetentionPolicy | None = None) -> list[str]:
        """Removes old versions.

        It never removes the current version or any former current one the
        pointer remembers (whatever their status files say), the newest
        versions the policy keeps, a version being written by a live
        process (the writer itself: on Linux, not another process that got
        its pid after a restart or a reboot; or one on another host, whose
        pid means nothing here; in a bucket, what a put wrote before its
        record, until it is ``policy.orphan_grace_s`` old by the bucket's
        clock), a version whose record cannot be read, in a store with a key a version
        whose verdict is unsigned or wrongly signed (which ``keep_verified``
        never counts as verified), or a directory that holds files the store
        did not write. It refuses to run when the pointer is damaged.

        Args:
          policy: what to keep; ``RetentionPolicy()`` (the 3 newest) by default.

        Returns:
          The versions removed.

        Raises:
          StoreError: if the root is not a store or the pointer is damaged.
        """
        return lifecycle.gc(self._backend, self._signer, policy or RetentionPolicy())


def spec_of_version(store: ArtifactStore, version: str) -> TreeSpec:
    """The stored spec of one version, from its header (or manifest) only."""
    location, data = record_of(store._backend, version)
    return store._backend.stored_spec(version, location, data)
