"""Keys, fingerprints and trust policies, each guard shown failing on its bad case."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from dsse import pae, sign_text

from treeguard import SignatureError
from treeguard._cli.main import main

# The DSSE encoding and a raw signature on purpose: to forge signatures the public
# calls would never write.
from treeguard.provenance import (
    BadSignatureError,
    KeyFileError,
    PrivateKey,
    PublicKey,
    RevokedKeyError,
    TrustPolicy,
    UntrustedKeyError,
    generate_keys,
)


def _pem_private(key: object, path: Path, *, password: bytes | None = None) -> Path:
    enc = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(  # type: ignore[attr-defined]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc
        )
    )
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("curve", ["P-256", "P-384", "P-521"])
def test_each_curve_signs_and_verifies(tmp_path: Path, curve: str) -> None:
    key_path, pub_path = generate_keys(tmp_path / "k", curve=curve)  # type: ignore[arg-type]
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    key = PrivateKey.load(key_path)
    pub = PublicKey.load(pub_path)
    assert pub.fingerprint == key.public.fingerprint and pub.curve == curve
    policy = TrustPolicy.from_paths(trusted=[pub_path])
    text = sign_text(key, "t", b"payload")
    assert policy.check_text("t", b"payload", text).key.fingerprint == pub.fingerprint
    with pytest.raises(BadSignatureError):
        policy.check_text("t", b"payloaD", text)  # changed payload
    with pytest.raises(BadSignatureError):
        policy.check_text("other", b"payload", text)  # the same bytes for another purpose


def test_a_key_is_never_overwritten(tmp_path: Path) -> None:
    generate_keys(tmp_path / "k")
    with pytest.raises(KeyFileError, match="never overwritten") as e:
        generate_keys(tmp_path / "k")
    assert e.value.exit_code == 2


def test_private_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    key_path, _ = generate_keys(tmp_path / "k")
    os.chmod(key_path, 0o644)
    with pytest.raises(KeyFileError, match=r"mode 0644.*anyone could sign") as e:
        PrivateKey.load(key_path)
    assert "chmod 600" in str(e.value)


def test_private_key_inside_the_store_is_refused(tmp_path: Path) -> None:
    key_path, _ = generate_keys(tmp_path / "k")
    with pytest.raises(KeyFileError, match="inside the store"):
        PrivateKey.load(key_path, outside=str(tmp_path))


def test_wrong_curve_rsa_encrypted_and_junk_are_refused(tmp_path: Path) -> None:
    k1 = _pem_private(ec.generate_private_key(ec.SECP256K1()), tmp_path / "k1.key")
    with pytest.raises(KeyFileError, match="curve secp256k1"):
        PrivateKey.load(k1)
    r = _pem_private(rsa.generate_private_key(public_exponent=65537, key_size=2048), tmp_path / "r")
    with pytest.raises(KeyFileError, match="not an elliptic-curve key"):
        PrivateKey.load(r)
    enc = _pem_private(ec.generate_private_key(ec.SECP256R1()), tmp_path / "e", password=b"pw")
    with pytest.raises(KeyFileError, match="encrypted"):
        PrivateKey.load(enc)
    junk = tmp_path / "junk.pub"
    junk.write_text("not a key")
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        PublicKey.load(junk)
    key_path, _ = generate_keys(tmp_path / "k")
    with pytest.raises(KeyFileError, match=r"\.pub half"):
        PublicKey.load(key_path)  # the private key where a public one goes


def test_links_fifos_and_empty_paths_are_refused(tmp_path: Path) -> None:
    _, pub = generate_keys(tmp_path / "k")
    link = tmp_path / "link.pub"
    link.symlink_to(pub)
    with pytest.raises(KeyFileError, match="not a regular file"):
        PublicKey.load(link)
    fifo = tmp_path / "fifo.pub"
    os.mkfifo(fifo)
    with pytest.raises(KeyFileError, match="not a regular file"):
        PublicKey.load(fifo)
    with pytest.raises(KeyFileError, match="empty"):
        PublicKey.load("")


def test_untrusted_and_revoked_keys(tmp_path: Path) -> None:
    (a_key, a_pub), (_, b_pub) = generate_keys(tmp_path / "a"), generate_keys(tmp_path / "b")
    key = PrivateKey.load(a_key)
    text = sign_text(key, "t", b"x")
    with pytest.raises(UntrustedKeyError, match="not trusted") as e:
        TrustPolicy.from_paths(trusted=[b_pub]).check_text("t", b"x", text)
    assert e.value.fingerprint == key.public.fingerprint
    both = TrustPolicy.from_paths(trusted=[a_pub, b_pub])
    assert both.check_text("t", b"x", text)
    revoked = TrustPolicy.from_paths(trusted=[a_pub, b_pub], revoked=[a_pub])
    with pytest.raises(RevokedKeyError) as r:
        revoked.check_text("t", b"x", text)
    assert key.public.fingerprint in str(r.value)  # the message names the key
    assert isinstance(r.value, SignatureError) and r.value.exit_code == 1
    with pytest.raises(UntrustedKeyError):
        TrustPolicy().check_text("t", b"x", text)  # a policy that trusts nobody
    with pytest.raises(BadSignatureError, match="any trusted key"):
        # a signature that names no key (an older bundle): every trusted key is tried
        TrustPolicy.from_paths(trusted=[b_pub]).check(
            "t", b"x", key.sign(pae("t", b"x")), fingerprint=None
        )


def test_signature_text_that_is_not_one(tmp_path: Path) -> None:
    _, pub = generate_keys(tmp_path / "a")
    policy = TrustPolicy.from_paths(trusted=[pub])
    fp = PublicKey.load(pub).fingerprint
    for text in (
        "",
        "hmac-sha256:00",
        f"ecdsa-p256-sha256:{fp}:!!!!!!!!",
        f"ecdsa-p256-sha256:{fp}:AAAA",
    ):
        with pytest.raises(BadSignatureError):
            policy.check_text("t", b"x", text)
    with pytest.raises(BadSignatureError, match="signs with ecdsa-p256-sha256"):
        key = PrivateKey.load(str(pub)[:-4] + ".key")
        policy.check_text(
            "t", b"x", sign_text(key, "t", b"x").replace("p256-sha256", "p384-sha384")
        )


def test_cli_keys_new_and_fingerprint(tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["keys", "new", str(tmp_path / "alice"), "--curve", "P-521"])
    assert done.exit_code == 0, done.output
    fp = PublicKey.load(tmp_path / "alice.pub").fingerprint
    assert f"sha256:{fp}" in done.output
    assert stat.S_IMODE(os.stat(tmp_path / "alice.key").st_mode) == 0o600
    shown = runner.invoke(main, ["keys", "fingerprint", str(tmp_path / "alice.pub")])
    assert shown.exit_code == 0 and shown.output.strip() == f"P-521 sha256:{fp}"
    again = runner.invoke(main, ["keys", "new", str(tmp_path / "alice")])
    assert again.exit_code == 2 and "never overwritten" in again.output
