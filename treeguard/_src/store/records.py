"""A version's record, ``status.json``: what it is, and the verdict on it.

A record holds the version's status (``writing``, ``candidate``,
``verified``, ``rejected``), its ``uid`` (random, fixed at put, so a
verdict can tell whether the version it checked is still the one there),
the sizes, the caller's metadata and, once verified or rejected, the
verdict: the reason, the checks, the digest of the file it was computed on
and, in a store with a key, the verdict's signature. Records are read
strictly: every field's type is checked, and a damaged record is reported,
never guessed at.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Any

from .. import strictjson
from ..atomic import DirSyncs, atomic_write, read_regular, sync_dir, temp_path, write_new
from ..checkpoint import user_metadata_json
from ..errors import FormatError, StoreError
from ..hashing import Algorithm, check_algorithm
from ..provenance.trail import Trail
from .layout import MODEL_FILE, SMALL_FILE_LIMIT, STATUS_FILE, STORE_FORMAT, check_name

STATUSES = ("writing", "candidate", "verified", "rejected")
#: The statuses of a version whose put returned: what gc's policy counts.
FINISHED = ("candidate", "verified", "rejected")
#: What a version holds: one checkpoint file (``model.safetensors``), or a
#: sharded checkpoint (``save_sharded``'s manifest and data) in its directory,
#: or a manifest of the store's shared tensor objects (tensors.py).
KINDS = ("file", "sharded", "tensors")
#: The status ``versions`` gives a version whose ``status.json`` cannot be
#: read; its ``reason`` says why. Nothing changes such a version, ``gc`` included.
UNREADABLE = "unreadable"

_HINT = "the store writes status.json itself; restore it from a backup, or verify the version again"

#: The optional fields of a record and the JSON types each may have.
_FIELDS: dict[str, tuple[type, ...]] = {
    "uid": (str,),
    "pid": (int,),
    "reason": (str,),
    "created": (str,),
    "updated": (str,),
    "metadata": (dict,),
    "checks": (list,),
    "contract": (str,),
    "num_leaves": (int,),
    "num_params": (int,),
    "nbytes": (int,),
    "digest": (str,),
    "signature": (str,),
    "verified_env": (dict,),
    "format": (str,),
    "version": (str,),
    "kind": (str,),
    "host": (str,),
    "writer": (str,),
    "seq": (int,),
    "stored_digest": (str,),
    "exported": (str,),
}


def now() -> str:
    """The time, ISO 8601 in UTC, to the millisecond."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


@dataclasses.dataclass(frozen=True)
class CheckRecord:
    """The outcome of one check run by ``verify``.

    Attributes:
      name: the check's name.
      ok: whether it passed.
      detail: why it failed, or a short note.
    """

    name: str
    ok: bool
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class VersionInfo:
    """A version's record, read from its ``status.json``.

    Attributes:
      version: the name.
      status: ``writing``, ``candidate``, ``verified`` or ``rejected``;
        ``unreadable`` (from ``versions`` only) if its ``status.json`` is
        damaged.
      reason: why it was rejected or is unreadable (or a note), else None.
      created: when it was put, ISO 8601 in UTC.
      updated: when its status last changed.
      metadata: the caller's metadata given to ``put``.
      checks: the checks the last ``verify`` ran.
      contract: what the last ``verify`` compared the structure with.
      num_leaves: the leaf count.
      num_params: the element count.
      nbytes: the bytes of array data.
      digest: the digest of the checkpoint the verdict was computed on
        (of a sharded version: the digest of its manifest).
      path: the checkpoint file, or a sharded or tensors version's directory.
      signed: whether the verdict carries a signature (whether it is a
        valid one is checked by the store that holds the key).
      signature: the verdict's signature as recorded (unchecked), or None;
        ``trail`` reads who it names.
      kind: ``file`` (one checkpoint file), ``sharded`` (``save_sharded``) or
        ``tensors`` (a manifest of tensors stored once per content, in a
        store made with ``dedup=True``).
      seq: its place in the order of puts, from the store's own counter
        (never the clock); None for a version put by an older treeguard.
    """

    version: str
    status: str
    reason: str | None
    created: str
    updated: str
    metadata: dict[str, Any]
    checks: tuple[CheckRecord, ...]
    contract: str | None
    num_leaves: int | None
    num_params: int | None
    nbytes: int | None
    digest: str | None
    path: str
    signed: bool = False
    kind: str = "file"
    seq: int | None = None
    signature: str | None = None

    def trail(self) -> Trail | None:
        """Who the verdict's signature says signed it (not checked here);
        None for an unsigned version."""
        return Trail.of(self.signature)


def read(version_dir: str, *, dir_fd: int | None = None) -> dict[str, Any]:
    """The record in ``version_dir``, validated field by field.

    Args:
      version_dir: the version's directory (named in messages).
      dir_fd: that directory's descriptor, when it is open: the record is
        then read through it, never through the path.

    Raises:
      StoreError: for a record that is not a regular file, not strict JSON,
        of another format, or with a field of the wrong type, naming the
        file and the field.
    """
    path = os.path.join(version_dir, STATUS_FILE)
    try:
        raw = read_regular(
            STATUS_FILE if dir_fd is not None else path,
            limit=SMALL_FILE_LIMIT,
            what="status file",
            dir_fd=dir_fd,
        )
    except FormatError as e:
        raise StoreError(e.message, context=path, hint=_HINT) from e
    return parse(raw, path)


def parse(raw: bytes, path: str) -> dict[str, Any]:
    """A record's bytes (read from ``path``, named in messages), validated
    field by field.

    Raises:
      StoreError: as ``read`` does.
    """
    try:
        data = strictjson.loads(raw, "the status file", context=path)
    except FormatError as e:
        raise StoreError(e.message, context=path, hint=_HINT) from e
    if not isinstance(data, dict) or data.get("status") not in STATUSES:
        status = data.get("status") if isinstance(data, dict) else None
        raise StoreError(
            f"status.json is malformed: status {str(status)[:40]!r} is not one of "
            f"{', '.join(STATUSES)}",
            context=path,
            hint=_HINT,
        )
    for key, kinds in _FIELDS.items():
        value = data.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            raise StoreError(
                f"status.json is malformed: {key} is a {type(value).__name__}, expected "
                f"{' or '.join(k.__name__ for k in kinds)}",
                context=path,
                hint=_HINT,
            )
    if data.get("kind", "file") not in KINDS:
        raise StoreError(
            f"status.json is malformed: kind {str(data.get('kind'))[:40]!r} is not one of "
            f"{', '.join(KINDS)}",
            context=path,
            hint=_HINT,
        )
    check_results(data.get("checks") or [], path)
    return data


def is_sharded(data: dict[str, Any]) -> bool:
    """Whether a validated record is of a sharded version."""
    return data.get("kind") == "sharded"


def checkpoint_path(version_dir: str, data: dict[str, Any]) -> str:
    """Where a version's checkpoint is: its file, or (sharded, tensors) its directory."""
    if is_sharded(data) or data.get("kind") == "tensors":
        return version_dir
    return os.path.join(version_dir, MODEL_FILE)


def write(
    version_dir: str, version: str, data: dict[str, Any], *, dirs: DirSyncs | None = None
) -> dict[str, Any]:
    """Replaces the record atomically; returns what was written. ``dirs``:
    the directory's fsync is left to these (``atomic.DirSyncs``)."""
    data, raw = _stamped(version, data)
    atomic_write(os.path.join(version_dir, STATUS_FILE), raw, dirs=dirs)
    return data


def staged(version_dir: str, version: str, data: dict[str, Any], *, sync: bool = True) -> str:
    """Writes the record ``write`` would to a temp file beside it, fsynced
    (unless not ``sync``: then the caller's, before ``commit``), for
    ``commit``; its path (the record is unchanged until then)."""
    tmp = temp_path(os.path.join(version_dir, STATUS_FILE))
    write_new(tmp, _stamped(version, data)[1], sync=sync)
    return tmp


def commit(version_dir: str, tmp: str, *, dirs: DirSyncs | None = None) -> None:
    """Replaces the record with the one ``staged`` wrote to ``tmp``, durably
    (once ``dirs`` are synced, when given)."""
    os.replace(tmp, os.path.join(version_dir, STATUS_FILE))
    sync_dir(version_dir, dirs)


def _stamped(version: str, data: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    data = {**data, "format": STORE_FORMAT, "version": version, "updated": now()}
    text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False)
    return data, (text + "\n").encode("ascii")


def check_results(raw: list[Any], where: str) -> tuple[CheckRecord, ...]:
    """The ``checks`` of a record, validated."""
    out: list[CheckRecord] = []
    for i, c in enumerate(raw):
        if (
            not isinstance(c, dict)
            or not {"name", "ok"} <= set(c) <= {"name", "ok", "detail"}
            or not isinstance(c["name"], str)
            or not isinstance(c["ok"], bool)
            or not isinstance(c.get("detail", ""), str)
        ):
            raise StoreError(
                f'status.json is malformed: checks[{i}] is not {{"name": str, "ok": bool, '
                '"detail": str}',
                context=where,
                hint=_HINT,
            )
        out.append(CheckRecord(c["name"], c["ok"], c.get("detail", "")))
    return tuple(out)


def info(version: str, version_dir: str, data: dict[str, Any]) -> VersionInfo:
    """The public view of a validated record."""
    return VersionInfo(
        version=version,
        status=data["status"],
        reason=data.get("reason"),
        created=data.get("created") or "",
        updated=data.get("updated") or "",
        metadata=data.get("metadata") or {},
        checks=check_results(data.get("checks") or [], version_dir),
        contract=data.get("contract"),
        num_leaves=data.get("num_leaves"),
        num_params=data.get("num_params"),
        nbytes=data.get("nbytes"),
        digest=data.get("digest"),
        path=checkpoint_path(version_dir, data),
        signed=isinstance(data.get("signature"), str),
        signature=data["signature"] if isinstance(data.get("signature"), str) else None,
        kind=data.get("kind", "file"),
        seq=data.get("seq"),
    )


def unreadable(version: str, reason: str, version_dir: str) -> VersionInfo:
    """The record ``versions`` lists for a version whose status cannot be read."""
    return VersionInfo(
        version=version,
        status=UNREADABLE,
        reason=reason,
        created="",
        updated="",
        metadata={},
        checks=(),
        contract=None,
        num_leaves=None,
        num_params=None,
        nbytes=None,
        digest=None,
        path=os.path.join(version_dir, MODEL_FILE),
    )


def put_arguments(
    metadata: Any, version: str | None, digest: Algorithm
) -> tuple[dict[str, Any], Algorithm]:
    """A put's metadata as the JSON its record keeps, and its digest
    algorithm, both refused (with a name that is not allowed) before anything
    is written.

    Raises:
      TypeError: for metadata that is not JSON, naming the key.
      UnknownVersionError: for a name that is not allowed.
      ValueError: for an unknown digest algorithm.
    """
    user = json.loads(user_metadata_json(metadata))
    algorithm = check_algorithm(digest)
    if version is not None:
        check_name(version)
    return user, algorithm
