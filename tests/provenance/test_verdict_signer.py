"""The EC verdict signer: who can sign, whose signatures count."""

from __future__ import annotations

from pathlib import Path

import pytest
from dsse import sign_text

from treeguard._src.provenance.verdicts import EcSigner  # _src: the signer without a store
from treeguard.provenance import (
    BadSignatureError,
    PrivateKey,
    ProvenanceError,
    RevokedKeyError,
    Trail,
    TrustPolicy,
    UntrustedKeyError,
    generate_keys,
)


def test_the_writer_signs_and_a_reader_with_public_keys_only_checks(tmp_path: Path) -> None:
    key_path, pub = generate_keys(tmp_path / "ci")
    writer = EcSigner(PrivateKey.load(key_path), TrustPolicy())
    text = writer.sign(b"verdict")
    assert writer.verify(b"verdict", text) is None  # its own key counts
    reader = EcSigner(None, TrustPolicy.from_paths(trusted=[pub]))
    assert reader.verify(b"verdict", text) is None
    with pytest.raises(BadSignatureError):
        reader.verify(b"verdict, edited", text)
    with pytest.raises(ProvenanceError, match="public keys only"):
        reader.sign(b"a forged verdict")
    trail = Trail.of(text)
    assert (
        trail is not None
        and trail.fingerprint == writer.policy.key(trail.fingerprint)[0].fingerprint
    )


def test_revoked_untrusted_hmac_and_cross_purpose_signatures(tmp_path: Path) -> None:
    key_path, pub = generate_keys(tmp_path / "old")
    _, other = generate_keys(tmp_path / "new")
    key = PrivateKey.load(key_path)
    text = EcSigner(key, TrustPolicy()).sign(b"verdict")
    with pytest.raises(RevokedKeyError, match=key.public.fingerprint):
        EcSigner(None, TrustPolicy.from_paths(trusted=[pub, other], revoked=[pub])).verify(
            b"verdict", text
        )
    with pytest.raises(RevokedKeyError):  # a revoked key no longer signs either
        EcSigner(key, TrustPolicy.from_paths(revoked=[pub])).sign(b"verdict")
    with pytest.raises(UntrustedKeyError):
        EcSigner(None, TrustPolicy.from_paths(trusted=[other])).verify(b"verdict", text)
    with pytest.raises(BadSignatureError, match="HMAC"):
        EcSigner(key, TrustPolicy()).verify(b"verdict", "hmac-sha256:" + "0" * 64)
    # a signature the same key made for another purpose (a model's statement) is not a verdict's
    model_sig = sign_text(key, "application/vnd.in-toto+json", b"verdict")
    with pytest.raises(BadSignatureError):
        EcSigner(key, TrustPolicy()).verify(b"verdict", model_sig)
    # and one made over DSSE's encoding as its spec writes it is (the encoding is the spec's)
    assert (
        EcSigner(key, TrustPolicy()).verify(
            b"v", sign_text(key, "application/vnd.treeguard.verdict+json", b"v")
        )
        is None
    )
