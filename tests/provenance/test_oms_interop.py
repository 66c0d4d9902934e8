"""OpenSSF Model Signing both ways, with the real ``model_signing`` command line.

Out: a model signed by ``sign_model`` passes ``model_signing verify key`` and
fails it after one byte changes. In: a model signed by ``model_signing sign
key`` passes ``verify_model`` with its key trusted, and every attack on it
(a changed byte, an added or removed file, an untrusted, revoked or
wrong-curve key, no signature) is refused with a typed error.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from tests.subproc import ROOT, installed, run_module
from treeguard import FormatError
from treeguard.provenance import (
    BadSignatureError,
    KeyFileError,
    MissingSignatureError,
    PrivateKey,
    PublicKey,
    RevokedKeyError,
    SignedDigestError,
    TrustPolicy,
    UntrustedKeyError,
    generate_keys,
    sign_model,
    verify_model,
)

DATA = ROOT / "treeguard" / "examples" / "data"
#: The bundled models' checkpoints and a safetensors file another tool wrote.
MODELS = {
    "mlp": DATA / "mlp.regression.safetensors",
    "cnn": DATA / "cnn.regression.safetensors",
    "eqx_mlp": DATA / "eqx_mlp.regression.safetensors",
    "chess_cv": ROOT / "tests" / "data" / "chess_cv_pieces.safetensors",
}

# one worker runs the file: the module fixture signs with model_signing once
pytestmark = [installed("model_signing"), pytest.mark.xdist_group("oms_interop")]


def _oms(*args: str | Path) -> tuple[int, str]:
    done = run_module("model_signing", [str(a) for a in args], timeout=60)
    return done.returncode, done.stdout + done.stderr


def _model_dir(tmp_path: Path, *names: str) -> Path:
    model = tmp_path / "model"
    (model / "extra").mkdir(parents=True)
    for name in names:
        shutil.copyfile(MODELS[name], model / f"{name}.safetensors")
    (model / "extra" / "config.json").write_text('{"layers": 2}')
    return model


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_out_model_signing_verifies_what_treeguard_signed(tmp_path: Path) -> None:
    key, pub = generate_keys(tmp_path / "alice", curve="P-384")
    model = _model_dir(tmp_path, *MODELS)
    manifest = sign_model(model, PrivateKey.load(key))
    assert set(manifest.digests) == {*(f"{n}.safetensors" for n in MODELS), "extra/config.json"}
    rc, out = _oms("verify", "key", model, "--signature", model / "model.sig", "--public_key", pub)
    assert rc == 0, out
    bundle = json.loads((model / "model.sig").read_text())
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == PublicKey.load(pub).fingerprint
    _flip(model / "chess_cv.safetensors", 1000)
    rc, out = _oms("verify", "key", model, "--signature", model / "model.sig", "--public_key", pub)
    assert rc == 1 and re.search(r"Hash mismatch for \\*'chess_cv\.safetensors", out)


def test_out_a_single_file_model(tmp_path: Path) -> None:
    key, pub = generate_keys(tmp_path / "alice")
    model = tmp_path / "mlp.safetensors"
    shutil.copyfile(MODELS["mlp"], model)
    sign_model(model, PrivateKey.load(key), signature=tmp_path / "mlp.sig")
    rc, out = _oms("verify", "key", model, "--signature", tmp_path / "mlp.sig", "--public_key", pub)
    assert rc == 0, out


@pytest.fixture(scope="module")
def signed_by_model_signing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A directory and a single file, each signed by ``model_signing sign key``."""
    tmp = tmp_path_factory.mktemp("oms")
    key, pub = generate_keys(tmp / "alice", curve="P-521")
    model = _model_dir(tmp, *MODELS)
    rc, out = _oms("sign", "key", model, "--private_key", key, "--signature", model / "model.sig")
    assert rc == 0, out
    single = tmp / "cnn.safetensors"
    shutil.copyfile(MODELS["cnn"], single)
    rc, out = _oms("sign", "key", single, "--private_key", key, "--signature", tmp / "cnn.sig")
    assert rc == 0, out
    return model, Path(pub), tmp


def _copy(model: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy" / "model"
    shutil.copytree(model, out)
    return out


def test_in_treeguard_verifies_what_model_signing_signed(
    signed_by_model_signing: tuple[Path, Path, Path],
) -> None:
    model, pub, _ = signed_by_model_signing
    signed = verify_model(model, policy=TrustPolicy.from_paths(trusted=[pub]))
    assert signed.key.fingerprint == PublicKey.load(pub).fingerprint
    assert signed.key.curve == "P-521" and signed.manifest.algorithm == "sha256"
    assert set(signed.manifest.digests) == {
        *(f"{n}.safetensors" for n in MODELS),
        "extra/config.json",
    }


def test_in_a_single_file(signed_by_model_signing: tuple[Path, Path, Path]) -> None:
    _, pub, tmp = signed_by_model_signing
    signed = verify_model(
        tmp / "cnn.safetensors",
        policy=TrustPolicy.from_paths(trusted=[pub]),
        signature=tmp / "cnn.sig",
    )
    assert list(signed.manifest.digests) == ["."]


def test_in_a_tampered_byte_added_and_removed_files(
    signed_by_model_signing: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, pub, _ = signed_by_model_signing
    policy = TrustPolicy.from_paths(trusted=[pub])
    copy = _copy(model, tmp_path)
    _flip(copy / "mlp.safetensors", 200)
    (copy / "extra" / "config.json").unlink()
    (copy / "extra" / "new.bin").write_bytes(b"x")
    with pytest.raises(SignedDigestError) as e:
        verify_model(copy, policy=policy)
    text = str(e.value)
    assert "3 file(s) differ" in text
    assert "extra/config.json: missing" in text and "extra/new.bin: not signed" in text
    assert "mlp.safetensors: sha256" in text
    assert set(e.value.names) == {"extra/config.json", "extra/new.bin", "mlp.safetensors"}
    assert e.value.exit_code == 1


def test_in_untrusted_revoked_missing_and_wrong_curve(
    signed_by_model_signing: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, pub, _ = signed_by_model_signing
    _, other = generate_keys(tmp_path / "bob")
    with pytest.raises(UntrustedKeyError, match="not trusted"):
        verify_model(model, policy=TrustPolicy.from_paths(trusted=[other]))
    with pytest.raises(RevokedKeyError, match=PublicKey.load(pub).fingerprint):
        verify_model(model, policy=TrustPolicy.from_paths(trusted=[pub, other], revoked=[pub]))
    copy = _copy(model, tmp_path)
    (copy / "model.sig").unlink()
    with pytest.raises(MissingSignatureError):
        verify_model(copy, policy=TrustPolicy.from_paths(trusted=[pub]))
    k1 = tmp_path / "k1.pub"
    k1.write_bytes(
        ec.generate_private_key(ec.SECP256K1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(KeyFileError, match="secp256k1"):
        TrustPolicy.from_paths(trusted=[k1])


def test_in_a_forged_statement_and_a_malformed_bundle(
    signed_by_model_signing: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, pub, _ = signed_by_model_signing
    policy = TrustPolicy.from_paths(trusted=[pub])
    copy = _copy(model, tmp_path)
    bundle = json.loads((copy / "model.sig").read_text())
    # an attacker rewrites the payload (recomputing every digest) but cannot sign it
    payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    payload["predicate"]["resources"][0]["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (copy / "model.sig").write_text(json.dumps(bundle))
    with pytest.raises(BadSignatureError):
        verify_model(copy, policy=policy)
    for broken in (
        "{",
        "[]",
        json.dumps({**bundle, "mediaType": "x"}),
        json.dumps({**bundle, "dsseEnvelope": None}),
    ):
        (copy / "model.sig").write_text(broken)
        with pytest.raises(FormatError):
            verify_model(copy, policy=policy)


def test_a_link_in_the_model_is_refused(
    signed_by_model_signing: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    model, pub, _ = signed_by_model_signing
    copy = _copy(model, tmp_path)
    (copy / "extra" / "config.json").unlink()
    (copy / "extra" / "config.json").symlink_to("/etc/hostname")
    with pytest.raises(FormatError, match="symbolic link"):
        verify_model(copy, policy=TrustPolicy.from_paths(trusted=[pub]))
