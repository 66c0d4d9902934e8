"""A store's EC verdict signer, through the store: who can sign, whose
signatures count, and that a signature made for another purpose is no
verdict's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dsse import sign_text

import treeguard as tg
from treeguard.provenance import (
    BadSignatureError,
    PrivateKey,
    ProvenanceError,
    PublicKey,
    RevokedKeyError,
    UntrustedKeyError,
    generate_keys,
)


def _tree(i: float) -> dict[str, Any]:
    return {"w": np.full((2, 3), i, np.float32)}


def _released(root: Path, key: str) -> str:
    """A version the store holding ``key`` verified and promoted."""
    store = tg.ArtifactStore(root, signing_key=key)
    v = store.put(_tree(1.0))
    assert store.verify(v).status == "verified"
    store.promote(v)  # its own key counts: no trusted key was named
    return v


def _status(root: Path, version: str) -> Path:
    return root / "versions" / version / "status.json"


def _signed_with(root: Path, version: str, signature: str) -> None:
    path = _status(root, version)
    record = json.loads(path.read_text())
    record["signature"] = signature
    path.write_text(json.dumps(record))


def _verdict_text(root: Path, version: str) -> bytes:
    """What a verdict's signature covers, as the provenance guide lists it:
    the store's id, the version, its uid, the digest, the status, the reason
    and the checks (canonical JSON: sorted keys, no spaces)."""
    record = json.loads(_status(root, version).read_text())
    fields = {
        "store": json.loads((root / "STORE.json").read_text())["id"],
        "version": version,
        **{k: record.get(k) for k in ("uid", "digest", "status", "reason")},
        "checks": record.get("checks") or [],
    }
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode("ascii")


def test_the_writer_signs_and_a_reader_with_public_keys_only_checks(tmp_path: Path) -> None:
    key_path, pub = generate_keys(tmp_path / "ci")
    root = tmp_path / "store"
    v = _released(root, key_path)
    reader = tg.ArtifactStore(root, trusted_keys=[pub])
    assert reader.load_current(_tree(0.0))["w"][0, 0] == 1.0
    trail = reader.info(v).trail()
    assert trail is not None and trail.fingerprint == PublicKey.load(pub).fingerprint
    candidate = tg.ArtifactStore(root, signing_key=key_path).put(_tree(2.0))
    with pytest.raises(ProvenanceError, match="public keys only"):
        reader.verify(candidate)
    # the verdict edited after it was signed
    record = json.loads(_status(root, v).read_text())
    record["reason"] = "edited"
    _status(root, v).write_text(json.dumps(record))
    with pytest.raises(BadSignatureError):
        reader.load_current(_tree(0.0))


def test_revoked_untrusted_hmac_and_cross_purpose_signatures(tmp_path: Path) -> None:
    key_path, pub = generate_keys(tmp_path / "old")
    _, other = generate_keys(tmp_path / "new")
    key = PrivateKey.load(key_path)
    root = tmp_path / "store"
    v = _released(root, key_path)
    revoking = tg.ArtifactStore(root, trusted_keys=[pub, other], revoked_keys=[pub])
    with pytest.raises(RevokedKeyError, match=key.public.fingerprint):
        revoking.load_current(_tree(0.0))
    candidate = tg.ArtifactStore(root, signing_key=key_path).put(_tree(2.0))
    with pytest.raises(RevokedKeyError):  # a revoked key no longer signs either
        tg.ArtifactStore(root, signing_key=key_path, revoked_keys=[pub]).verify(candidate)
    with pytest.raises(UntrustedKeyError):
        tg.ArtifactStore(root, trusted_keys=[other]).load_current(_tree(0.0))
    signed = tg.ArtifactStore(root, signing_key=key_path)
    good = json.loads(_status(root, v).read_text())["signature"]
    _signed_with(root, v, "hmac-sha256:" + "0" * 64)
    with pytest.raises(BadSignatureError, match="HMAC"):
        signed.load_current(_tree(0.0))
    # a signature the same key made for another purpose (a model's statement) is not a verdict's
    text = _verdict_text(root, v)
    _signed_with(root, v, sign_text(key, "application/vnd.in-toto+json", text))
    with pytest.raises(BadSignatureError):
        signed.load_current(_tree(0.0))
    # and one made over DSSE's encoding as its spec writes it is (the encoding is the spec's)
    _signed_with(root, v, sign_text(key, "application/vnd.treeguard.verdict+json", text))
    assert signed.load_current(_tree(0.0))["w"][0, 0] == 1.0
    _signed_with(root, v, good)
    assert signed.load_current(_tree(0.0))["w"][0, 0] == 1.0
