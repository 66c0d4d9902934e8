"""The OpenSSF Model Signing v1.0 format, as bytes: the statement and the bundle.

A signature of a model (``model.sig``) is a Sigstore bundle (media type
``application/vnd.dev.sigstore.bundle.v0.3+json``) whose ``dsseEnvelope``
holds one ECDSA signature over the DSSE encoding of an in-toto statement
(``https://in-toto.io/Statement/v1``). The statement's predicate
(``https://model_signing/signature/v1.0``) lists a digest for each file of
the model (``resources``: name, algorithm, hex digest) and how they were
computed (``serialization``: method ``files``, the hash type, the paths left
out); its one subject is the model's name with the sha256 over every
resource's digest bytes, in the order listed. ``verificationMaterial``
names the key by the sha256 of its PEM (``publicKey.hint``), the
fingerprint ``keys.fingerprint_of`` gives.

This module writes and reads that format, strictly; it never touches the
files (``model.py`` hashes them). It accepts the ``files`` method with
``sha256`` (what ``model_signing sign key`` writes by default) or ``blake3``
(what treeguard writes: the digests the hashing engine already computes).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any

from .. import strictjson
from ..errors import FormatError
from ..hashing import HEX_RE, Algorithm
from .keys import PrivateKey
from .trust import Signed, TrustPolicy, pae

MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
#: The hash types a signature may use here (those of the hashing engine).
HASH_TYPES: tuple[Algorithm, ...] = ("blake3", "sha256")
#: The most bytes a signature file may hold.
BUNDLE_LIMIT = 16 * 1024 * 1024
#: The most files one signed model may list.
MAX_FILES = 100_000


@dataclasses.dataclass(frozen=True)
class ModelManifest:
    """What a model signature vouches for: a digest for each file.

    Attributes:
      name: the model's name (its directory's or file's name).
      algorithm: the hash of every digest, ``"blake3"`` or ``"sha256"``.
      digests: each file's digest (hex), by its path relative to the model,
        with ``/`` between parts (``"."`` for a model that is one file).
      ignore_paths: the paths left out of the signature (``model.sig``,
        ``.git``...), relative to the model.

    Example:
      >>> m = ModelManifest("mlp", "sha256", {"model.safetensors": "00" * 32})
      >>> ModelManifest.from_statement(m.statement()).digests == m.digests
      True
    """

    name: str
    algorithm: Algorithm
    digests: Mapping[str, str]
    ignore_paths: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [n for n in self.digests if not safe_name(n)]
        if bad:
            raise FormatError(
                f"the file name {bad[0][:80]!r} cannot be signed: a name holds no control "
                "characters, and no empty, '.' or '..' part",
                context=self.name,
                hint="rename the file; a signature names every file as it is",
            )

    def root_digest(self) -> str:
        """The subject's sha256: over every digest's bytes, sorted by name."""
        h = hashlib.sha256()
        for name in sorted(self.digests):
            h.update(bytes.fromhex(self.digests[name]))
        return h.hexdigest()

    def statement(self) -> bytes:
        """The in-toto statement, as the JSON bytes a signature covers."""
        doc = {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": self.name, "digest": {"sha256": self.root_digest()}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {
                "serialization": {
                    "method": "files",
                    "hash_type": self.algorithm,
                    "allow_symlinks": False,
                    "ignore_paths": list(self.ignore_paths),
                },
                "resources": [
                    {"name": n, "algorithm": self.algorithm, "digest": self.digests[n]}
                    for n in sorted(self.digests)
                ],
            },
        }
        return strictjson.dumps(doc).encode("ascii")

    @classmethod
    def from_statement(cls, payload: bytes, /, *, context: str | None = None) -> ModelManifest:
        """Reads a statement, refusing anything but a v1.0 ``files`` one whose
        subject digest matches its resources.

        Raises:
          FormatError: naming the field at fault.
        """
        doc = strictjson.loads(payload, "the signed statement", context=context)
        bad = _Refuser(context)
        if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
            raise bad(f"the statement is not an in-toto {STATEMENT_TYPE}")
        if doc.get("predicateType") != PREDICATE_TYPE:
            raise bad(
                f"predicateType is {str(doc.get('predicateType'))[:80]!r}, not {PREDICATE_TYPE!r}",
                hint="sign the model again with model_signing 1.0 or later",
            )
        subjects = doc.get("subject")
        if not (
            isinstance(subjects, list) and len(subjects) == 1 and isinstance(subjects[0], dict)
        ):
            raise bad("the statement must have exactly one subject")
        name = subjects[0].get("name")
        root = (subjects[0].get("digest") or {}).get("sha256")
        if not isinstance(name, str) or not isinstance(root, str):
            raise bad("the subject has no name or no sha256 digest")
        predicate = doc.get("predicate")
        if not isinstance(predicate, dict):
            raise bad("the statement has no predicate")
        how = predicate.get("serialization")
        if not isinstance(how, dict) or how.get("method") != "files":
            method = how.get("method") if isinstance(how, dict) else None
            raise bad(
                f"serialization method {str(method)[:40]!r}; only 'files' is read here",
                hint="sign the model file by file (model_signing's default)",
            )
        algorithm = how.get("hash_type")
        if algorithm not in HASH_TYPES:
            raise bad(
                f"hash_type {str(algorithm)[:40]!r}; one of {', '.join(HASH_TYPES)} is read here",
                hint="sign with sha256 (model_signing's default) or blake3",
            )
        ignore = how.get("ignore_paths", [])
        if not (isinstance(ignore, list) and all(isinstance(p, str) for p in ignore)):
            raise bad("serialization.ignore_paths is not a list of paths")
        digests = _resources(predicate.get("resources"), algorithm, bad)
        manifest = cls(name, algorithm, digests, tuple(ignore))
        listed = hashlib.sha256()
        for r in predicate["resources"]:
            listed.update(bytes.fromhex(r["digest"]))
        if listed.hexdigest() != root:
            raise bad(
                "the subject's sha256 is not that of the resources' digests: the statement "
                "is inconsistent",
                hint="do not use this model; ask for a fresh signature",
            )
        return manifest


class _Refuser:
    def __init__(self, context: str | None) -> None:
        self.context = context

    def __call__(self, message: str, *, hint: str | None = None) -> FormatError:
        return FormatError(
            message,
            context=self.context,
            hint=hint or "this is not an OpenSSF Model Signing v1.0 signature; sign again",
        )


def _resources(found: Any, algorithm: str, bad: _Refuser) -> dict[str, str]:
    if not isinstance(found, list) or not found:
        raise bad("the statement lists no resources")
    if len(found) > MAX_FILES:
        raise bad(f"the statement lists more than {MAX_FILES:,} files")
    out: dict[str, str] = {}
    for i, r in enumerate(found):
        if not isinstance(r, dict):
            raise bad(f"resources[{i}] is not an object")
        name, algo, value = r.get("name"), r.get("algorithm"), r.get("digest")
        if not isinstance(name, str) or not safe_name(name):
            raise bad(f"resources[{i}].name {str(name)[:80]!r} is not a relative path in the model")
        if algo != algorithm:
            raise bad(f"resources[{i}] ({name}) is hashed with {str(algo)[:20]!r}, not {algorithm}")
        if not isinstance(value, str) or not HEX_RE.match(value):
            raise bad(f"resources[{i}] ({name}) has no 64-digit hex digest")
        if name in out:
            raise bad(f"resources list {name!r} twice")
        out[name] = value
    if "." in out and len(out) > 1:
        raise bad("the statement lists the model itself ('.') beside other files")
    return out


def safe_name(name: str, /) -> bool:
    """Whether ``name`` is a path inside a model: relative, ``/``-separated,
    without empty, ``.`` or ``..`` parts or control characters (``"."`` alone
    is the model that is one file).

    Example:
      >>> [safe_name(n) for n in (".", "a/b.bin", "../x", "/etc/passwd", "a//b")]
      [True, True, False, False, False]
    """
    if name == ".":
        return True
    if not name or len(name) > 4096 or any(ord(c) < 32 or c == "\x7f" for c in name):
        return False
    parts = name.split("/")
    return not posixpath.isabs(name) and all(p not in ("", ".", "..") for p in parts)


def write_oms_bundle(manifest: ModelManifest, key: PrivateKey, /) -> bytes:
    """The signature file (``model.sig``) of ``manifest``, signed with ``key``.

    Example:
      >>> import json, os, tempfile
      >>> from treeguard.provenance import generate_keys, PrivateKey
      >>> path, _ = generate_keys(os.path.join(tempfile.mkdtemp(), "k"))
      >>> m = ModelManifest("mlp", "blake3", {"model.safetensors": "ab" * 32})
      >>> json.loads(write_oms_bundle(m, PrivateKey.load(path)))["mediaType"] == MEDIA_TYPE
      True
    """
    payload = manifest.statement()
    signature = key.sign(pae(PAYLOAD_TYPE, payload))
    doc = {
        "mediaType": MEDIA_TYPE,
        "verificationMaterial": {
            "publicKey": {"hint": key.public.fingerprint},
            "tlogEntries": [],
        },
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode("ascii"),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(signature).decode("ascii"), "keyid": ""}],
        },
    }
    return (strictjson.dumps(doc) + "\n").encode("ascii")


def read_oms_bundle(
    data: bytes, policy: TrustPolicy, /, *, context: str | None = None
) -> tuple[ModelManifest, Signed]:
    """Checks a signature file's signature against ``policy``, then reads its manifest.

    Args:
      data: the signature file's bytes.
      policy: the keys whose signatures count.
      context: where the bytes came from, for messages.

    Returns:
      The manifest it vouches for, and the key that signed it.

    Raises:
      FormatError: for a file that is not a v0.3 bundle with one DSSE
        signature over an in-toto statement.
      RevokedKeyError, UntrustedKeyError, BadSignatureError: as
        ``TrustPolicy.check`` (before the statement is interpreted).
    """
    bad = _Refuser(context)
    doc = strictjson.loads(data, "the signature file", context=context)
    if not isinstance(doc, dict) or doc.get("mediaType") != MEDIA_TYPE:
        found = doc.get("mediaType") if isinstance(doc, dict) else None
        raise bad(f"mediaType is {str(found)[:80]!r}, not {MEDIA_TYPE!r}")
    material = doc.get("verificationMaterial")
    hint = None
    if isinstance(material, dict) and isinstance(material.get("publicKey"), dict):
        hint = material["publicKey"].get("hint")
        if hint is not None and not (isinstance(hint, str) and HEX_RE.match(hint)):
            raise bad("verificationMaterial.publicKey.hint is not a sha256 fingerprint")
    envelope = doc.get("dsseEnvelope")
    if not isinstance(envelope, dict):
        raise bad("the bundle holds no dsseEnvelope (a Sigstore keyless bundle is not read here)")
    if envelope.get("payloadType") != PAYLOAD_TYPE:
        raise bad(f"payloadType is {str(envelope.get('payloadType'))[:80]!r}, not {PAYLOAD_TYPE!r}")
    signatures = envelope.get("signatures")
    if not (
        isinstance(signatures, list) and len(signatures) == 1 and isinstance(signatures[0], dict)
    ):
        raise bad("the envelope must hold exactly one signature")
    payload = _b64(envelope.get("payload"), "dsseEnvelope.payload", bad)
    raw = _b64(signatures[0].get("sig"), "dsseEnvelope.signatures[0].sig", bad)
    signed = policy.check(PAYLOAD_TYPE, payload, raw, fingerprint=hint)
    return ModelManifest.from_statement(payload, context=context), signed


def _b64(value: Any, field: str, bad: _Refuser) -> bytes:
    if not isinstance(value, str):
        raise bad(f"{field} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise bad(f"{field} is not valid base64") from None
