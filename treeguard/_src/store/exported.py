"""A version's exported function: its bytes and their description, kept
beside the params and covered by the version's verdict.

A version may hold an exported artifact (``jax.export``'s serialized
function, written by ``treeguard export``) in two objects of its directory:
``exported.bin`` (the bytes) and ``exported.json`` (what they are: the
description the exporter gives, with the bytes' BLAKE3 digest and size).
Both are create-only: an artifact is attached once, the bytes first, so the
description (which names their digest) is the commit point.

The digest of ``exported.json`` is what a verdict covers: ``verify`` records
it in the verdict's ``exported`` field, which the verdict's signature
signs (``verdicts.message``). ``read`` is the gate: it re-hashes the
description against the digest a verdict recorded, then the bytes against
the digest the description names. The store never parses what the bytes
hold; the exporter and the server do.

``peek`` is the listing's cheap look (``treeguard store ls``): the
description read and checked against the verdict, the bytes' object found
at the size the description names, none of the bytes read; their hash is
the gate's, at every load.
"""

from __future__ import annotations

from typing import Any

from .. import strictjson
from ..errors import ArtifactError, FormatError, StoreError
from ..hashing import Algorithm
from ..hashing.engine import digest as digest_of
from .backend import Backend, record_of
from .storage import Conflict, Storage

#: The serialized function, in the version's directory.
ARTIFACT_FILE = "exported.bin"
#: Its description (with the artifact's digest); its digest is what a verdict covers.
META_FILE = "exported.json"
#: The most bytes an artifact may have: a function's code, not its params.
ARTIFACT_LIMIT = 1 << 30
#: The most bytes its description may have.
META_LIMIT = 16 << 20
#: The hash of both, as the params' default.
ALGORITHM: Algorithm = "blake3"


def _name(version: str, leaf: str) -> str:
    return f"versions/{version}/{leaf}"


def attach(backend: Backend, version: str, blob: bytes, meta: dict[str, Any]) -> str:
    """Writes ``blob`` and its description ``meta`` beside ``version``'s params.

    Args:
      backend: the store's backend.
      version: a version that is not being written.
      blob: the serialized function.
      meta: what it is (JSON); ``artifact_digest`` and ``artifact_bytes`` are added.

    Returns:
      The digest of the description written, the one a verdict will cover.

    Raises:
      StoreError: for a version still being written, or one that already
        holds an artifact (they are create-only: put a new version).
      UnknownVersionError: for an unknown version.
    """
    described = {**meta, "artifact_digest": digest_of(blob, ALGORITHM), "artifact_bytes": len(blob)}
    text = (strictjson.dumps(described) + "\n").encode("ascii")
    storage = backend.storage
    with backend.locked():
        _, record = record_of(backend, version)
        if record["status"] == "writing":
            raise StoreError(
                f"version {version} is still being written",
                version=version,
                hint="export it once its put returns",
            )
        for name, data in ((ARTIFACT_FILE, blob), (META_FILE, text)):
            if isinstance(storage.create(_name(version, name), data), Conflict):
                raise StoreError(
                    f"version {version} already holds an exported artifact ({name})",
                    version=version,
                    context=storage.where(_name(version, name)),
                    hint="an artifact is written once: put the params again as a new version "
                    "and export that",
                )
        backend.append("export", version, {"exported": digest_of(text, ALGORITHM)})
    return digest_of(text, ALGORITHM)


def digest_now(backend: Backend, version: str) -> str | None:
    """The digest of ``version``'s artifact description as it is now, or
    None when it holds none."""
    found = _description(backend, version)
    return None if found is None else digest_of(found, ALGORITHM)


def _description(backend: Backend, version: str) -> bytes | None:
    """The bytes of ``version``'s artifact description (at most ``META_LIMIT``),
    or None when it has none.

    Raises:
      FormatError: for one over the limit, or that is not a regular file.
    """
    found = backend.storage.read(
        _name(version, META_FILE),
        limit=META_LIMIT,
        what="exported artifact's description",
        confirm_missing=True,  # its absence is recorded in a verdict, never replaced
    )
    return None if found is None else found[0]


def read(backend: Backend, version: str, expected: str | None) -> tuple[dict[str, Any], bytes]:
    """``version``'s artifact, each byte checked: its description against
    ``expected`` (the digest its verdict covers), its bytes against the
    digest the description names.

    Args:
      backend: the store's backend.
      version: the version.
      expected: the ``exported`` digest of its verdict; None when the
        verdict covers no artifact (then it is refused).

    Returns:
      The description and the bytes.

    Raises:
      ArtifactError: ``missing`` (no artifact), ``verdict`` (the verdict
        covers none: it was exported after it was verified), ``digest``
        (the description or the bytes changed since).
    """
    meta = _described(backend, version, expected)
    return meta, _artifact_bytes(backend.storage, version, meta)


def _described(backend: Backend, version: str, expected: str | None) -> Any:
    """``version``'s artifact description, parsed, once its digest is
    checked against ``expected`` (``read``)."""
    where = backend.storage.where(_name(version, META_FILE))
    text = _description(backend, version)
    if text is None:
        raise ArtifactError(
            f"version {version} holds no exported artifact",
            version=version,
            field="missing",
            context=where,
            hint=f"export it: treeguard export MODULE:ATTR --store STORE {version}, then "
            "verify it again",
        )
    now = digest_of(text, ALGORITHM)
    if expected is None:
        raise ArtifactError(
            f"version {version}'s verdict does not cover its exported artifact (digest "
            f"{now[:12]}…): it was exported after the version was verified",
            version=version,
            field="verdict",
            context=where,
            hint=f"verify it again: treeguard store verify STORE {version} --model MODULE:ATTR",
        )
    if now != expected:
        raise ArtifactError(
            f"version {version}'s exported artifact changed since it was verified: its "
            f"description's digest is {now[:12]}… now, {expected[:12]}… in the verdict",
            version=version,
            field="digest",
            context=where,
            hint="do not serve it; export and verify the version again, or restore it",
        )
    try:
        return strictjson.loads(text, "the exported artifact's description", context=where)
    except FormatError as e:  # its digest matched: the store wrote it so
        raise ArtifactError(
            f"version {version}'s exported artifact description is not JSON: {e.message}",
            version=version,
            field="digest",
            context=where,
        ) from e


def _artifact_bytes(storage: Storage, version: str, meta: Any) -> bytes:
    """``version``'s artifact bytes, checked against the digest its
    description ``meta`` names (``read``)."""
    blob_found = storage.read(
        _name(version, ARTIFACT_FILE),
        limit=ARTIFACT_LIMIT,
        what="exported artifact",
        confirm_missing=True,
    )
    want = meta.get("artifact_digest") if isinstance(meta, dict) else None
    got = None if blob_found is None else digest_of(blob_found[0], ALGORITHM)
    if blob_found is None or not isinstance(want, str) or got != want:
        raise ArtifactError(
            f"version {version}'s exported artifact does not match its digest: "
            f"{'absent' if got is None else got[:12] + '…'} now, "
            f"{str(want)[:12]}… when it was exported",
            version=version,
            field="digest",
            context=storage.where(_name(version, ARTIFACT_FILE)),
            hint="do not serve it; export and verify the version again, or restore it",
        )
    return blob_found[0]


#: What ``peek`` says of an artifact, for each state.
STATES = {
    "covered": "covered by the verdict, its description unchanged, its bytes there at "
    "their size (a server hashes every byte when it loads them)",
    "unverified": "attached, and the version is not verified: verify it",
    "uncovered": "exported after the verdict: verify the version again",
    "changed": "its description changed since the verdict, or its bytes are not the "
    "size it names: do not serve it",
    "missing": "its description or its bytes are gone (or its export has not finished): "
    "do not serve it",
    "unreadable": "a description this treeguard cannot read (a newer format, or not "
    "JSON): upgrade it",
    "refused": "the version's own gate refuses it (its verdict's signature, say)",
}


def peek(
    backend: Backend, version: str, covered: str | None
) -> tuple[str, dict[str, Any] | None] | None:
    """What ``version`` holds of an artifact, without reading its bytes.

    Args:
      backend: the store's backend.
      version: the version.
      covered: the ``exported`` digest of its verdict; None when it has no
        verdict or one that covers no artifact.

    Returns:
      None when the version holds no trace of an artifact; else a state of
      ``STATES`` (never ``unverified`` or ``refused``: those are the
      verdict's, see ``GatedLoads.peek_exported``) and, for ``covered``
      alone, the description.
    """
    names = backend.storage.list(f"versions/{version}")
    if META_FILE not in names:
        return None if covered is None and ARTIFACT_FILE not in names else ("missing", None)
    try:
        text = _description(backend, version)
    except FormatError:  # over its limit, or not a regular file
        return "unreadable", None
    if text is None:  # removed since the listing
        return "missing", None
    if covered is None:
        return "uncovered", None
    if digest_of(text, ALGORITHM) != covered:
        return "changed", None
    try:
        meta = strictjson.loads(text, "the exported artifact's description")
    except FormatError:
        return "unreadable", None
    if not isinstance(meta, dict):
        return "unreadable", None
    try:
        size = backend.storage.size(_name(version, ARTIFACT_FILE))
    except FormatError:  # not a regular file: not what was attached
        return "changed", None
    if size is None:
        return "missing", None
    claimed = meta.get("artifact_bytes")
    exact = isinstance(claimed, int) and not isinstance(claimed, bool) and size == claimed
    return ("covered", meta) if exact else ("changed", None)
