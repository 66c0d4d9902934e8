"""The gates a version passes before it is promoted, rolled back to or
served: its verdict must be ``verified``, signed when the store has a key,
and computed on the very bytes that are there now.

Integrity and authenticity are different promises. Every store checks
integrity: each verdict records the digest of the checkpoint it was computed
on (the header digest, which covers every tensor's digest), and each gate
re-reads the file and compares. Anyone who can write the store's directory
can still recompute hashes and edit ``status.json``; only a store opened
with a key also gives authenticity. It signs each verdict with HMAC-SHA256
over the store's id, the version, its uid, the file digest, the status, the
reason and the checks, and its gates refuse a verdict, ``verified`` or
``rejected`` alike, that is unsigned or whose signature does not match: a
forged rejection is reported as forged, before its status is read.

A sharded version (``put_sharded``) is gated the same way. Its digest is the
digest of its manifest, which holds the digest of every shard; since the
manifest alone does not prove the bytes, ``promote`` and ``rollback`` read
every shard again and hash it (``recheck_sharded``), and every load checks
each shard it returns. Its directory may hold only regular files and real
directories: a link, FIFO, socket or device anywhere in it is refused before
anything is read.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Collection
from typing import Any

from .. import strictjson
from ..atomic import open_regular
from ..checkpoint import Header, load, verify_file
from ..errors import ConfigError, FormatError, IntegrityError, SignatureError, StoreError
from ..sharded.manifest import MANIFEST_NAME
from .layout import MODEL_FILE

#: The statuses a verdict records; each is signed, and checked, alike.
VERDICTS = ("verified", "rejected")
#: The environment variable naming a key file, used when no ``key=`` is given.
KEY_ENV = "TREEGUARD_STORE_KEY_FILE"
_PREFIX = "hmac-sha256:"
_MIN_KEY = 16
_KEY_FILE_LIMIT = 4096


def resolve_key(key: bytes | str | None, *, root: str | None) -> bytes | None:
    """The key to sign with: ``key``, else the file ``$TREEGUARD_STORE_KEY_FILE`` names.

    Args:
      key: the key given to the store, or None.
      root: the store's directory (a key file may not lie inside it), or
        None for a store in a bucket.

    Raises:
      StoreError: for a key shorter than 16 bytes, or a key file that cannot
        be read, that others may rewrite (group- or world-writable) or that
        lies inside the store.
      ConfigError: for ``$TREEGUARD_STORE_KEY_FILE`` set to the empty string
        (an unset shell variable expanded), which would silently mean "no key".
    """
    source = "key="
    if key is None:
        path = os.environ.get(KEY_ENV)
        if path is None:
            return None
        if not path.strip():
            raise ConfigError(
                f"{KEY_ENV} is set but empty, so no key file is named",
                context=KEY_ENV,
                hint=f"set it to the key file's path, or unset it (`unset {KEY_ENV}`) to run "
                "the store unsigned on purpose",
            )
        source = f"{KEY_ENV}={path}"
        key = _read_key_file(path, source, root)
    raw = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if len(raw) < _MIN_KEY:
        raise StoreError(
            f"the store key is {len(raw)} bytes; at least {_MIN_KEY} are needed",
            context=source,
            hint="make one with `python -c 'import secrets; print(secrets.token_hex(32))'`",
        )
    return raw


def _read_key_file(path: str, source: str, root: str | None) -> bytes:
    real = os.path.realpath(path)
    store = os.path.realpath(root) if root is not None else None
    if store is not None and os.path.commonpath([real, store]) == store:
        raise StoreError(
            "the key file lies inside the store's directory, where anyone who can write "
            "the store can read or replace it",
            context=source,
            hint="keep the key outside the store, readable only by its owner (chmod 600)",
        )
    try:
        fd = open_regular(path, what="key file")
        try:
            st = os.fstat(fd)
            raw = os.read(fd, _KEY_FILE_LIMIT + 1)
        finally:
            os.close(fd)
    except (FormatError, OSError) as e:
        raise StoreError(
            f"cannot read the key file: {e}",
            context=source,
            hint="point the variable at a regular file of at least 16 random bytes",
        ) from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            f"the key file is writable by others (mode {stat.S_IMODE(st.st_mode):04o}), so "
            "anyone may replace the key and sign verdicts",
            context=source,
            hint="chmod 600 the key file",
        )
    if len(raw) > _KEY_FILE_LIMIT:
        raise StoreError(
            f"the key file is more than {_KEY_FILE_LIMIT} bytes",
            context=source,
            hint="point the variable at a file holding only the key",
        )
    return raw.strip()


def _message(store_id: str, version: str, record: dict[str, Any]) -> bytes:
    signed = {
        "store": store_id,
        "version": version,
        "uid": record.get("uid"),
        "digest": record.get("digest"),
        "status": record.get("status"),
        "reason": record.get("reason"),
        "checks": record.get("checks") or [],
    }
    if record.get("kind", "file") != "file":  # absent from older records, signed without it
        signed["kind"] = record["kind"]
    return strictjson.dumps(signed).encode("ascii")


def sign(key: bytes, store_id: str, version: str, record: dict[str, Any]) -> str:
    """The signature of a verdict record."""
    return _PREFIX + hmac.new(key, _message(store_id, version, record), hashlib.sha256).hexdigest()


def check_signature(
    key: bytes | None, store_id: str, version: str, record: dict[str, Any], *, signed: bool
) -> None:
    """Refuses a verdict that a store with a key did not sign, and any
    verdict of a signed store opened without its key.

    Args:
      key: the store's key, or None.
      store_id: the store's id (signed with each verdict).
      version: the version.
      record: its record.
      signed: whether the store has ever signed a verdict (its marker says so).

    Raises:
      SignatureError: if ``key`` is set and the record is unsigned or its
        signature does not match what it claims; if ``key`` is None and the
        store is signed or the verdict carries a signature.
    """
    if key is None:
        if signed or isinstance(record.get("signature"), str):
            raise unkeyed(version)
        return
    got = record.get("signature")
    if not isinstance(got, str):
        raise SignatureError(
            f"version {version}'s verdict is not signed, and this store has a key",
            version=version,
            hint=f"verify it again with the key (store.verify({version!r})) to sign it",
        )
    if not hmac.compare_digest(got, sign(key, store_id, version, record)):
        raise SignatureError(
            f"version {version}'s verdict signature does not match: the verdict or its "
            "file digest was changed, or it was signed with another key",
            version=version,
            hint="do not trust this version; verify it again with the right key",
        )


def unkeyed(version: str | None) -> SignatureError:
    """The error of a signed store opened without its key."""
    return SignatureError(
        "this store signs its verdicts, and it was opened without its key: no verdict "
        "can be trusted or written",
        version=version,
        hint=f"open it with its key (key=..., or ${KEY_ENV} naming the key file)",
    )


def changed(version: str, e: IntegrityError) -> IntegrityError:
    """The error of a version whose checkpoint no longer matches its verdict."""
    return IntegrityError(
        f"version {version}: its checkpoint changed since it was verified: {e.message}",
        path=e.path,
        version=version,
        hint="do not use it; restore the file from a backup or verify it again",
    )


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
    """Refuses a record whose kind (``file`` or ``sharded``) is not what its
    directory holds: a ``model.safetensors`` for a file version, a manifest
    for a sharded one, never both. Only the names are looked at (``lstat``).

    Raises:
      IntegrityError: naming the version, the kind its record claims and
        what the directory holds.
    """
    kind = "sharded" if record.get("kind") == "sharded" else "file"
    has = {
        name: os.path.lexists(os.path.join(version_dir, name))
        for name in (MODEL_FILE, MANIFEST_NAME)
    }
    own, other = (MANIFEST_NAME, MODEL_FILE) if kind == "sharded" else (MODEL_FILE, MANIFEST_NAME)
    if has[own] and not has[other]:
        return
    holds = " and ".join(n for n in (MODEL_FILE, MANIFEST_NAME) if has[n]) or "neither"
    raise IntegrityError(
        f"version {version}: its record says kind {kind!r}, which keeps {own}, but its "
        f"directory holds {holds}: the record or the directory was changed",
        version=version,
        context=version_dir,
        hint="do not use it; restore the version from a backup, or put the weights again",
    )


def load_expecting(
    path: str,
    /,
    *,
    like: Any,
    digest: str | None,
    subtree: str | None = None,
    ignore: Collection[str] = (),
) -> Any:
    """``load`` with every hash checked, refusing a file whose header digest
    is not ``digest`` (when given) before any array is read, on the same read
    (of the part ``subtree`` and ``ignore`` select)."""
    return load(path, like=like, expect_digest=digest, subtree=subtree, ignore=ignore)


def verify_expecting(path: str, /, *, digest: str) -> Header:
    """``verify_file`` (every byte re-hashed), refusing another header digest."""
    return verify_file(path, expect_digest=digest)


def load_sharded_expecting(
    directory: str,
    /,
    *,
    like: Any,
    digest: str | None,
    subtree: str | None = None,
    ignore: Collection[str] = (),
) -> Any:
    """``load_sharded`` onto ``like``'s shardings with every shard hashed,
    refusing a manifest whose digest is not ``digest`` (when given) before
    any array is read (a collective in a multi-process job)."""
    from ..sharded.load import load_expecting

    return load_expecting(directory, like, digest=digest, subtree=subtree, ignore=ignore)


def recheck_sharded(directory: str, /, *, digest: str) -> None:
    """Reads every shard of a sharded version in this process and checks
    its digest, refusing another manifest digest; holds one group of arrays
    at a time, and waits on no other process."""
    from ..sharded.recheck import read_local

    read_local(directory, digest=digest, keep=False)
