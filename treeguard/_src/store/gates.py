"""The gates a version passes before it is promoted, rolled back to or
served (``gate``): its verdict must be ``verified``, signed when the store
has a signer (the rule is ``verdicts.check_verdict``), and computed on the very
bytes that are there now.

Integrity and authenticity are different promises. Every store checks
integrity: each verdict records the digest of the checkpoint it was computed
on (the header digest, which covers every tensor's digest), and each gate
re-reads the file and compares. Anyone who can write the store's directory
can still recompute hashes and edit ``status.json``; only a store opened
with a key also gives authenticity. It signs each verdict (signing.py:
HMAC-SHA256 over the store's id, the version, its uid, the file digest, the
status, the reason and the checks), and its gates refuse a verdict,
``verified`` or ``rejected`` alike, that is unsigned or whose signature does
not match: a forged rejection is reported as forged, before its status is
read.

A sharded version (``put_sharded``) is gated the same way. Its digest is the
digest of its manifest, which holds the digest of every shard; since the
manifest alone does not prove the bytes, ``promote`` and ``rollback`` read
every shard again and hash it (``ShardedPayload.recheck``), and every load checks
each shard it returns. Its directory may hold only regular files and real
directories: a link, FIFO, socket or device anywhere in it is refused before
anything is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from ..errors import FormatError, IntegrityError, StoreError, TreeguardError
from ..sharded.manifest import MANIFEST_NAME
from . import objecterrors, pointer, verdicts
from .backend import Backend, Wanted
from .layout import MODEL_FILE, check_name
from .signing import VerdictSigner
from .tensors import TENSORS_FILE


def gate(
    backend: Backend,
    signer: VerdictSigner | None,
    version: str,
    *,
    full: bool,
    marker: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any], str]:
    """Checks that ``version`` may be used: verified, its verdict signed when
    the store has a signer, its record's kind what it holds and (``full``)
    its every byte matching the verdict's digest.

    Args:
      backend, signer: the store's.
      version: the version.
      full: whether every byte is read and hashed again.
      marker: the store's marker as the caller read it during this
        operation (a load reads it once, for the pointer and the gate);
        read here when None.

    Returns:
      Its location, record and recorded digest.

    Raises:
      StoreError: if it is not verified.
      SignatureError: for a verdict the signer does not vouch for.
      IntegrityError: for bytes that are not the verdict's.
      UnknownVersionError: for an unknown version.
    """
    check_name(version)
    marker = backend.require() if marker is None else marker
    location, data = backend.record(version)
    verdicts.check_verdict(signer, marker, version, data)
    digest = require_verified(version, data)
    backend.check_payload(version, location, data)
    if full:
        backend.recheck(version, location, data, digest)
    return location, data, digest


def load_gated(
    backend: Backend,
    signer: VerdictSigner | None,
    version: str,
    want: Wanted,
    marker: dict[str, Any] | None = None,
) -> Any:
    """The part of ``version`` that ``want`` selects, once it passes every
    gate (``marker`` as ``gate`` takes it), its bytes checked against the
    verdict's digest on the read that loads them (``want.digest`` is
    ignored)."""
    location, data, digest = gate(backend, signer, version, full=False, marker=marker)
    return backend.load(version, location, data, dataclasses.replace(want, digest=digest))


def load_current(
    backend: Backend, signer: VerdictSigner | None, want: Wanted, *, fallback: bool
) -> Any:
    """The current version through every gate; with ``fallback``, the most
    recent former current one that passes them all when it fails one (the
    fall back logged). The marker is read once, for the pointer and the
    current version's gate (a former one's gate, later, reads it again).

    Raises:
      StoreError: if nothing was promoted yet, or the current version fails
        a gate (and, with ``fallback``, every former one too).
    """
    marker = backend.require()
    ptr = pointer.of_store(backend, marker)
    if ptr.current is None:
        raise StoreError(
            "no current version",
            context=backend.root,
            hint="promote a verified version first: store.promote(version)",
        )
    try:
        return load_gated(backend, signer, ptr.current, want, marker)
    except (IntegrityError, FormatError, OSError, StoreError) as first:
        if not fallback:
            raise
        for v in ptr.previous:
            try:
                tree = load_gated(backend, signer, v, want)
            except (IntegrityError, FormatError, OSError, StoreError):
                continue
            with backend.locked():
                backend.append(
                    "fallback", v, {"current": ptr.current, "reason": str(first).splitlines()[0]}
                )
            return tree
        raise


@contextlib.contextmanager
def reading(
    version: str,
    *,
    since: str,
    where: str | None = None,
    unreadable: tuple[type[Exception], ...] = (FormatError, OSError),
) -> Iterator[None]:
    """Names ``version`` in the errors of reading its checkpoint, the one
    relabel of every backend: bytes that hash wrong are a checkpoint that
    changed since it was ``since`` (``"put"`` or ``"verified"``), and a read
    that fails (one of ``unreadable``) is a checkpoint that no longer reads,
    and one caused by a request to storage that failed
    (``objecterrors.from_a_request``) a checkpoint that could not be read,
    each an ``IntegrityError`` caused by what was raised (an error that
    names the version already passes unchanged).

    Args:
      version: the version read.
      since: what the bytes were checked against: ``"verified"`` for a
        verdict's digest, ``"put"`` for the one recorded at put.
      where: the checkpoint's location, for the message's context.
      unreadable: the errors that mean the read failed; others pass.

    Raises:
      IntegrityError: as above.
    """
    try:
        yield
    except IntegrityError as e:
        if e.version == version:
            raise
        if objecterrors.from_a_request(e):  # the storage failed: nothing said of the bytes
            what, hint = "could not be read", "check the server or a proxy in front of it; retry"
        else:
            what = f"changed since it was {since}"
            hint = "do not use it; restore it from a backup, or put the weights again"
        raise IntegrityError(
            f"version {version}: its checkpoint {what}: {e.message}",
            path=e.path,
            version=version,
            context=where,
            hint=hint,
        ) from e
    except unreadable as e:
        why = (
            e.message
            if isinstance(e, TreeguardError)
            else getattr(e, "strerror", None) or type(e).__name__
        )
        raise IntegrityError(
            f"version {version}: its checkpoint no longer reads: {why}",
            version=version,
            context=where or getattr(e, "filename", None),
            hint="something else is replacing or removing it; retry, and if it still fails, "
            "restore it from a backup or put the weights again",
        ) from e


def require_verified(version: str, record: dict[str, Any]) -> str:
    """The recorded digest of a verified version.

    Raises:
      StoreError: if the version is not verified or has no digest.
    """
    if record["status"] != "verified":
        why = f": {record['reason'].splitlines()[0]}" if record.get("reason") else ""
        raise StoreError(
            f"version {version} is {record['status']}, not verified{why}",
            version=version,
            hint=f"run store.verify({version!r}) first; only a verified version is used",
        )
    digest = record.get("digest")
    if not isinstance(digest, str):
        raise StoreError(
            f"version {version} is marked verified but its record holds no file digest",
            version=version,
            hint=f"verify it again: store.verify({version!r})",
        )
    return digest


def require_kind(version: str, version_dir: str, record: dict[str, Any]) -> None:
    """Refuses a record whose kind (``file``, ``sharded`` or ``tensors``) is
    not what its directory holds: a ``model.safetensors`` for a file
    version, a manifest for a sharded one, a ``tensors.json`` for a tensors
    one, never two of them. Only the names are looked at (``lstat``).

    Raises:
      IntegrityError: naming the version, the kind its record claims and
        what the directory holds.
    """
    kind = record.get("kind", "file")
    own = {"sharded": MANIFEST_NAME, "tensors": TENSORS_FILE}.get(kind, MODEL_FILE)
    names = (MODEL_FILE, MANIFEST_NAME, TENSORS_FILE)
    held = [n for n in names if os.path.lexists(os.path.join(version_dir, n))]
    if held == [own]:
        return
    holds = " and ".join(held) or "neither"
    raise IntegrityError(
        f"version {version}: its record says kind {kind!r}, which keeps {own}, but its "
        f"directory holds {holds}: the record or the directory was changed",
        version=version,
        context=version_dir,
        hint="do not use it; restore the version from a backup, or put the weights again",
    )
