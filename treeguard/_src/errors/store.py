"""The errors of the artifact store: refused operations, unknown or retired
versions, dangling pointers, signatures, conflicts, storage failures."""

from __future__ import annotations

from .base import TreeguardError


class StoreError(TreeguardError, ValueError):
    """The store refused an operation: promoting an unverified version,
    rolling back with no previous verified version, a directory that is not
    a store, a damaged pointer or status file.

    Attributes:
      version: the version concerned, when there is one.
    """

    exit_code = 1

    def __init__(
        self,
        message: str = "",
        *,
        version: str | None = None,
        context: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.version = version
        super().__init__(message, context=context, hint=hint)


class NotAStoreError(StoreError):
    """A directory that is not a treeguard store (no ``STORE.json``), or a
    store root that is no directory: nothing there can be used."""

    exit_code = 2


class UnknownVersionError(StoreError, LookupError):
    """No such version in the store, or a name that cannot be a version
    (one that would escape the store's root)."""

    exit_code = 2

    def __str__(self) -> str:  # LookupError would quote the message
        return self._render()


class RetiredVersionError(UnknownVersionError):
    """A version whose name gc retired (it is being removed, or was): it is
    never made current again, so ``promote`` and ``rollback`` refuse it."""


class DanglingPointerError(StoreError):
    """The pointer names a version the store does not hold: the store is
    damaged, and nothing that depends on what is current (``gc``) acts on
    a guess. ``ArtifactStore.repair`` (``treeguard store repair``) points
    it at a version named by a person.

    Attributes:
      version: the missing version the pointer names.
    """


class SignatureError(StoreError):
    """A store opened with a key found a verdict that is unsigned, or signed
    with another key, or that no longer matches what it signed: the verdict
    is not trusted, whatever its status says."""


class ConflictError(StoreError):
    """Another process changed the store first: a promote or rollback that
    lost the race for the pointer, which is left as the winner made it.

    Attributes:
      version: the version the winner made current, when known.
    """


class StorageError(StoreError):
    """The storage under a store failed: a full disk, a refused or timed-out
    connection, a server error. The message names the operation and the
    object, never credentials; the store is left as it was before the
    operation. Exit code 2: what failed is the machine or the network, not
    a check of the version."""

    exit_code = 2
