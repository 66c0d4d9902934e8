"""The gated loads of an ``ArtifactStore``: what a server and a caller read
through every gate (``gates.py``), and a plain load of any version."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..errors import TreeguardError
from . import exported, gates
from .backend import Backend, Wanted, record_of
from .signing import VerdictSigner


class GatedLoads:
    """The loads of ``ArtifactStore``, over its backend and signer."""

    _backend: Backend
    _signer: VerdictSigner | None

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
        return gates.gate(self._backend, self._signer, version, full=False)[2]

    def load_exported(self, version: str, /) -> tuple[dict[str, Any], bytes]:
        """``version``'s exported artifact, only if the version passes the
        gates of ``check_verified`` and its verdict covers the artifact as it
        is now: the description's digest the (signed) verdict recorded, the
        bytes' digest the description names.

        Returns:
          The artifact's description (JSON) and its bytes.

        Raises:
          StoreError: if the version is not verified.
          SignatureError: if the store has a key and the verdict is not
            signed with it.
          ArtifactError: if the version holds no artifact, its verdict covers
            none, or the artifact changed since (``field`` says which).
        """
        _, data, _ = gates.gate(self._backend, self._signer, version, full=False)
        covered = data.get("exported")
        return exported.read(self._backend, version, covered if isinstance(covered, str) else None)

    def peek_exported(self, version: str, /) -> tuple[str, dict[str, Any] | None] | None:
        """What ``version`` holds of an exported artifact, cheaply, for a
        listing: its verdict checked as ``check_verified`` checks it, its
        description read and matched against the digest the verdict covers,
        its bytes found at the size the description names; the bytes are
        neither read nor hashed (``load_exported`` does that, at every load).

        Returns:
          None for a version that holds no artifact; else its state
          (``covered``, ``unverified``, ``uncovered``, ``changed``,
          ``missing``, ``unreadable`` or ``refused``) and, when ``covered``,
          its description (JSON).

        Raises:
          UnknownVersionError: for an unknown version.
          StoreError: for a root that is not a store, or a damaged record.

        Example:
          >>> import tempfile, numpy as np, treeguard
          >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
          >>> v = store.put({"w": np.ones(3, np.float32)})
          >>> _ = store.attach_exported(v, b"a function", {"platforms": ["cpu"]})
          >>> store.peek_exported(v)
          ('unverified', None)
          >>> store.verify(v).status, store.peek_exported(v)[0]
          ('verified', 'covered')
        """
        _, data = record_of(self._backend, version)
        verified = data["status"] == "verified"
        covered = data.get("exported") if verified else None
        found = exported.peek(self._backend, version, covered)
        if found is None or not verified:
            return found if found is None else ("unverified", None)
        try:
            gates.gate(self._backend, self._signer, version, full=False)
        except TreeguardError:  # a verdict the key does not vouch for, a damaged version
            return "refused", None
        return found

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
        return gates.load_gated(
            self._backend, self._signer, version, Wanted(like, None, subtree, ignore)
        )

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
        location, data = record_of(self._backend, version)
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
          like: the tree to match, as for ``load_verified``.
          subtree: the part to load, as for ``load_verified``.
          ignore: key paths left out, as for ``load_verified``.
          fallback: if the current version fails a gate, load the most
            recent former current version that passes them all instead (the
            fall back is logged).

        Returns:
          The tree.

        Raises:
          StoreError: if nothing was promoted yet, or the current version
            fails a gate (and, with ``fallback``, every former one too).
          IntegrityError, FormatError: if the current file is damaged.
          TreeMismatchError: if it does not match ``like``.
          ValueError: for a sharded version and a ``like`` without shardings.
        """
        want = Wanted(like, None, subtree, ignore)
        return gates.load_current(self._backend, self._signer, want, fallback=fallback)
