"""A store with EC keys: the attacks of docs/explanation/guarantees.md re-run
with asymmetric keys. A writer of the store's directory without the signing
key cannot get a version promoted, rolled back to, loaded through a gate or
counted as verified by gc; a host holding public keys only checks verdicts
and cannot make one; a revoked key's verdicts stop counting at once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import treeguard as tg
from treeguard._cli.main import main
from treeguard.provenance import (
    BadSignatureError,
    ProvenanceError,
    PublicKey,
    RevokedKeyError,
    UntrustedKeyError,
    generate_keys,
)


def _tree(i: int) -> dict[str, Any]:
    return {"w": np.full((2, 3), i, np.float32)}


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("ci", "new", "mallory"):
        key, pub = generate_keys(tmp_path / name)
        out[f"{name}.key"], out[f"{name}.pub"] = key, pub
    return out


def _released(root: Path, keys: dict[str, str], n: int = 2) -> list[str]:
    """A store whose CI (holding ci.key) verified and promoted ``n`` versions."""
    ci = tg.ArtifactStore(root, signing_key=keys["ci.key"])
    out = []
    for i in range(n):
        v = ci.put(_tree(i))
        assert ci.verify(v).status == "verified"
        ci.promote(v)
        out.append(v)
    return out


def _status(root: Path, version: str) -> Path:
    return root / "versions" / version / "status.json"


def _edit(root: Path, version: str, **fields: Any) -> None:
    path = _status(root, version)
    record = json.loads(path.read_text())
    record.update(fields)
    path.write_text(json.dumps(record))


def test_the_writer_signs_and_a_host_with_public_keys_only_uses_what_it_signed(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    root = tmp_path / "store"
    v1, v2 = _released(root, keys)
    host = tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]])
    assert host.signed and host.forged_verdicts() == {}
    assert host.load_current(_tree(0))["w"][0, 0] == 1
    assert host.rollback() == v1
    host.promote(v2)
    trail = host.info(v2).trail()
    assert trail is not None and trail.fingerprint == PublicKey.load(keys["ci.pub"]).fingerprint
    assert trail.algorithm == "ecdsa-p256-sha256"


def test_a_host_with_public_keys_only_cannot_make_a_verdict(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    root = tmp_path / "store"
    _released(root, keys, 1)
    v = tg.ArtifactStore(root, signing_key=keys["ci.key"]).put(_tree(7))
    host = tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]])
    before = _status(root, v).read_bytes()
    with pytest.raises(ProvenanceError, match="public keys only"):
        host.verify(v)
    assert _status(root, v).read_bytes() == before  # nothing written
    with pytest.raises(tg.StoreError, match="candidate, not verified"):
        host.promote(v)


@pytest.mark.parametrize("forgery", ["unsigned", "hmac", "own key", "another version's"])
def test_a_writer_without_the_key_cannot_get_a_version_used(
    tmp_path: Path, keys: dict[str, str], forgery: str
) -> None:
    root = tmp_path / "store"
    v1, v2 = _released(root, keys)
    # mallory can write the directory: a candidate of her own, marked verified
    bad = tg.ArtifactStore(root, signing_key=keys["ci.key"]).put(_tree(9))
    record = json.loads(_status(root, bad).read_text())
    record.update(
        status="verified",
        reason=None,
        digest=tg.read_header(root / "versions" / bad / "model.safetensors").digest,
        checks=[],
    )
    if forgery == "unsigned":
        record["signature"] = None
    elif forgery == "hmac":
        record["signature"] = "hmac-sha256:" + "0" * 64
    elif forgery == "own key":  # a verdict signed in a store of her own, with her key
        (mine,) = _released(tmp_path / "mallory", {"ci.key": keys["mallory.key"]}, n=1)
        record["signature"] = json.loads(_status(tmp_path / "mallory", mine).read_text())[
            "signature"
        ]
    else:
        record["signature"] = json.loads(_status(root, v2).read_text())["signature"]
    _status(root, bad).write_text(json.dumps(record))

    host = tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]])
    with pytest.raises(tg.SignatureError):
        host.promote(bad)
    with pytest.raises(tg.SignatureError):
        host.load_verified(bad, _tree(0))
    assert bad in host.forged_verdicts()
    assert host.current() == v2  # nothing moved
    # gc keeps a forged verdict for a person to look at, and never counts it verified
    removed = host.gc(policy=tg.RetentionPolicy(keep_last=0, keep_verified=1))
    assert bad not in removed and v2 not in removed
    # make the forged one the current one by hand: every load refuses it
    ptr = root / "CURRENT.json"
    pointer = json.loads(ptr.read_text())
    pointer["current"] = bad
    ptr.write_text(json.dumps(pointer))
    with pytest.raises(tg.SignatureError):
        host.load_current(_tree(0))
    assert host.load_verified(v1, _tree(0))["w"][0, 0] == 0  # what CI signed still loads


def test_rotation_and_revocation(tmp_path: Path, keys: dict[str, str]) -> None:
    root = tmp_path / "store"
    v1, v2 = _released(root, keys)
    rotating = tg.ArtifactStore(root, signing_key=keys["new.key"], trusted_keys=[keys["ci.pub"]])
    assert rotating.load_current(_tree(0))["w"].shape == (2, 3)  # both keys count meanwhile
    revoked = tg.ArtifactStore(
        root, trusted_keys=[keys["ci.pub"], keys["new.pub"]], revoked_keys=[keys["ci.pub"]]
    )
    fingerprint = PublicKey.load(keys["ci.pub"]).fingerprint
    with pytest.raises(RevokedKeyError, match=fingerprint) as e:
        revoked.load_current(_tree(0))
    assert e.value.version == v2 and e.value.fingerprint == fingerprint
    with pytest.raises(RevokedKeyError):
        revoked.promote(v1)
    with pytest.raises(tg.StoreError):
        revoked.rollback()
    assert set(revoked.forged_verdicts()) == {v1, v2}
    # re-verified with the new key, the version counts again
    renewed = tg.ArtifactStore(root, signing_key=keys["new.key"], revoked_keys=[keys["ci.pub"]])
    assert renewed.verify(v2).status == "verified"
    assert revoked.load_current(_tree(0))["w"][0, 0] == 1
    assert set(revoked.forged_verdicts()) == {v1}
    with pytest.raises(UntrustedKeyError):
        tg.ArtifactStore(root, trusted_keys=[keys["mallory.pub"]]).load_current(_tree(0))


def test_an_hmac_store_opened_with_ec_keys_and_the_other_way(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    root = tmp_path / "store"
    hmac_store = tg.ArtifactStore(root, key=b"a key of sixteen bytes")
    v = hmac_store.put(_tree(1))
    hmac_store.verify(v)
    hmac_store.promote(v)
    assert hmac_store.load_current(_tree(0))["w"][0, 0] == 1  # HMAC stores work as before
    with pytest.raises(BadSignatureError, match="HMAC"):
        tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]]).load_current(_tree(0))
    with pytest.raises(tg.ConfigError, match="not both"):
        tg.ArtifactStore(root, key=b"a key of sixteen bytes", trusted_keys=[keys["ci.pub"]])
    ec_root = tmp_path / "ec"
    _released(ec_root, keys, 1)
    with pytest.raises(tg.SignatureError, match="opened without its key"):
        tg.ArtifactStore(ec_root).load_current(_tree(0))
    with pytest.raises(tg.SignatureError):
        tg.ArtifactStore(ec_root, key=b"a key of sixteen bytes").load_current(_tree(0))


def test_keys_from_the_environment(
    tmp_path: Path, keys: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "store"
    monkeypatch.setenv("TREEGUARD_SIGNING_KEY_FILE", keys["ci.key"])
    v = tg.ArtifactStore(root).put(_tree(1))
    tg.ArtifactStore(root).verify(v)
    monkeypatch.delenv("TREEGUARD_SIGNING_KEY_FILE")
    monkeypatch.setenv("TREEGUARD_TRUSTED_KEYS", os.pathsep.join([keys["new.pub"], keys["ci.pub"]]))
    tg.ArtifactStore(root).promote(v)
    monkeypatch.setenv("TREEGUARD_REVOKED_KEYS", keys["ci.pub"])
    with pytest.raises(RevokedKeyError):
        tg.ArtifactStore(root).load_current(_tree(0))
    monkeypatch.setenv("TREEGUARD_TRUSTED_KEYS", "")
    with pytest.raises(tg.ConfigError, match="names no key file"):
        tg.ArtifactStore(root)
    monkeypatch.setenv("TREEGUARD_TRUSTED_KEYS", keys["ci.pub"])
    monkeypatch.setenv("TREEGUARD_STORE_KEY_FILE", keys["ci.pub"])
    with pytest.raises(tg.ConfigError, match="one scheme"):
        tg.ArtifactStore(root)


def test_a_signing_key_inside_the_store_or_readable_by_others(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    key, _ = generate_keys(root / "inside")
    with pytest.raises(tg.provenance.KeyFileError, match="inside the store"):
        tg.ArtifactStore(root, signing_key=key)
    os.chmod(keys["ci.key"], 0o640)
    with pytest.raises(tg.provenance.KeyFileError, match="chmod 600"):
        tg.ArtifactStore(tmp_path / "other", signing_key=keys["ci.key"])


def test_cli_flags(tmp_path: Path, keys: dict[str, str]) -> None:
    root = tmp_path / "store"
    v = tg.ArtifactStore(root, signing_key=keys["ci.key"]).put(_tree(1))
    runner = CliRunner()
    done = runner.invoke(main, ["store", "verify", str(root), v, "--signing-key", keys["ci.key"]])
    assert done.exit_code == 0, done.output
    done = runner.invoke(main, ["store", "promote", str(root), v, "--trusted-key", keys["ci.pub"]])
    assert done.exit_code == 0, done.output
    listed = runner.invoke(
        main, ["store", "ls", str(root), "--json", "--trusted-key", keys["ci.pub"]]
    )
    row = json.loads(listed.output)["versions"][0]
    assert row["signature"] == "valid"
    assert row["trail"]["fingerprint"] == PublicKey.load(keys["ci.pub"]).fingerprint
    assert (
        row["trail"]["digest"]
        == tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]]).info(v).digest
    )
    refused = runner.invoke(
        main,
        [
            "store",
            "promote",
            str(root),
            v,
            "--trusted-key",
            keys["ci.pub"],
            "--revoked-key",
            keys["ci.pub"],
        ],
    )
    assert refused.exit_code == 1
    assert PublicKey.load(keys["ci.pub"]).fingerprint in refused.output
