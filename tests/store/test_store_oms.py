"""Store versions out and in as OpenSSF Model Signing models, with the real
``model_signing`` command line: ``store export`` writes a directory that
``model_signing verify key`` accepts (and refuses once a byte changes);
``store add`` takes a model ``model_signing sign key`` signed, and refuses a
tampered, untrusted, revoked, unsigned or wrong-curve one with nothing written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import obstore
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from jax.sharding import NamedSharding, PartitionSpec
from obstore.store import S3Store

import treeguard as tg
from tests.machine import cpu_mesh
from tests.subproc import ROOT, installed, run_module
from treeguard._cli.main import main
from treeguard.examples import mlp
from treeguard.provenance import (
    KeyFileError,
    MissingSignatureError,
    ProvenanceError,
    PublicKey,
    RevokedKeyError,
    SignedDigestError,
    UntrustedKeyError,
    generate_keys,
)

CHESS = ROOT / "tests" / "data" / "chess_cv_pieces.safetensors"

pytestmark = installed("model_signing")


def _oms(*args: str | Path) -> tuple[int, str]:
    done = run_module("model_signing", [str(a) for a in args], timeout=60)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, curve in (("ci", "P-256"), ("hf", "P-384"), ("mallory", "P-256")):
        out[f"{name}.key"], out[f"{name}.pub"] = generate_keys(tmp_path / name, curve=curve)  # type: ignore[arg-type]
    return out


def _released(root: Path, keys: dict[str, str], tree: Any) -> str:
    store = tg.ArtifactStore(root, signing_key=keys["ci.key"])
    v = store.put(tree)
    assert store.verify(v).status == "verified"
    return v


def _same(a: Any, b: Any) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _round_trip(tmp_path: Path, keys: dict[str, str], name: str, params: Any) -> None:
    v = _released(tmp_path / "store", keys, params)
    out = tmp_path / f"{name}-export"
    tg.ArtifactStore(tmp_path / "store", signing_key=keys["ci.key"]).export(v, out)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "model.sig"]
    rc, text = _oms(
        "verify", "key", out, "--signature", out / "model.sig", "--public_key", keys["ci.pub"]
    )
    assert rc == 0, text
    # and in again, signed by another party with model_signing, into a store that trusts it
    theirs = tmp_path / f"{name}-theirs"
    shutil.copytree(out, theirs)
    (theirs / "model.sig").unlink()
    rc, text = _oms(
        "sign", "key", theirs, "--private_key", keys["hf.key"], "--signature", theirs / "model.sig"
    )
    assert rc == 0, text
    inbox = tg.ArtifactStore(tmp_path / "inbox", trusted_keys=[keys["hf.pub"]])
    added = inbox.add_signed(theirs)
    signed = inbox.info(added).metadata["signed_model"]
    assert signed["fingerprint"] == PublicKey.load(keys["hf.pub"]).fingerprint
    assert signed["digests"].keys() == {"model.safetensors"}
    # the same tensors, by name (a model put from a file is nested by its names)
    before = tg.read_foreign(out / "model.safetensors", names="flat")
    after = tg.read_foreign(inbox.info(added).path, names="flat")
    assert before.keys() == after.keys() and _same(before, after)


def test_export_and_add_the_seed_mlp(tmp_path: Path, keys: dict[str, str]) -> None:
    _round_trip(tmp_path, keys, "mlp", mlp.init(jax.random.key(0)))


@pytest.mark.slow
@pytest.mark.parametrize("example", ["cnn", "eqx_mlp"])
def test_export_and_add_the_bundled_models(
    tmp_path: Path, keys: dict[str, str], example: str
) -> None:
    module = __import__(f"treeguard.examples.{example}", fromlist=["init"])
    _round_trip(tmp_path, keys, example, module.init(jax.random.key(0)))


def test_an_exported_byte_changed_fails_model_signing(tmp_path: Path, keys: dict[str, str]) -> None:
    v = _released(tmp_path / "store", keys, mlp.seed_params())
    out = tmp_path / "out"
    runner = CliRunner()
    done = runner.invoke(
        main,
        ["store", "export", str(tmp_path / "store"), v, str(out), "--signing-key", keys["ci.key"]],
    )
    assert done.exit_code == 0, done.output
    data = bytearray((out / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (out / "model.safetensors").write_bytes(bytes(data))
    rc, text = _oms(
        "verify", "key", out, "--signature", out / "model.sig", "--public_key", keys["ci.pub"]
    )
    assert rc == 1 and re.search(r"Hash mismatch for \\*'model\.safetensors", text)


def test_export_refuses_without_a_signing_key_an_unverified_version_or_an_existing_dir(
    tmp_path: Path, keys: dict[str, str]
) -> None:
    root = tmp_path / "store"
    v = _released(root, keys, mlp.seed_params())
    with pytest.raises(ProvenanceError, match="public keys only"):
        tg.ArtifactStore(root, trusted_keys=[keys["ci.pub"]]).export(v, tmp_path / "a")
    writer = tg.ArtifactStore(root, signing_key=keys["ci.key"])
    candidate = writer.put(mlp.seed_params())
    with pytest.raises(tg.StoreError, match="candidate, not verified"):
        writer.export(candidate, tmp_path / "b")
    (tmp_path / "c").mkdir()
    with pytest.raises(FileExistsError):
        writer.export(v, tmp_path / "c")
    # the version's file changed after its verdict: the copy is refused, nothing left
    model = Path(writer.info(v).path)
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    with pytest.raises(tg.IntegrityError, match="changed since it was verified"):
        writer.export(v, tmp_path / "d")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith((".key", ".pub"))) == [
        "c",
        "store",
    ]


@pytest.fixture
def signed_chess(tmp_path: Path, keys: dict[str, str]) -> Path:
    model = tmp_path / "chess"
    model.mkdir()
    shutil.copyfile(CHESS, model / "pieces.safetensors")
    (model / "config.json").write_text('{"classes": 13}')
    rc, text = _oms(
        "sign", "key", model, "--private_key", keys["hf.key"], "--signature", model / "model.sig"
    )
    assert rc == 0, text
    return model


def _nothing_written(root: Path) -> bool:
    return not (root / "versions").exists() or not any((root / "versions").iterdir())


def test_add_a_foreign_model_signed_by_model_signing(
    tmp_path: Path, keys: dict[str, str], signed_chess: Path
) -> None:
    root = tmp_path / "inbox"
    runner = CliRunner()
    done = runner.invoke(
        main, ["store", "add", str(root), str(signed_chess), "--trusted-key", keys["hf.pub"]]
    )
    assert done.exit_code == 0, done.output
    inbox = tg.ArtifactStore(root, trusted_keys=[keys["hf.pub"]])
    (info,) = inbox.versions()
    assert info.status == "candidate" and info.num_params == 156_461
    assert set(info.metadata["signed_model"]["digests"]) == {"pieces.safetensors", "config.json"}
    # a model that is one file, its signature beside it
    single = tmp_path / "pieces.safetensors"
    shutil.copyfile(CHESS, single)
    rc, text = _oms(
        "sign",
        "key",
        single,
        "--private_key",
        keys["hf.key"],
        "--signature",
        tmp_path / "pieces.sig",
    )
    assert rc == 0, text
    v = inbox.add_signed(single, signature=tmp_path / "pieces.sig")
    assert list(inbox.info(v).metadata["signed_model"]["digests"]) == ["."]


def test_add_refuses_and_writes_nothing(
    tmp_path: Path, keys: dict[str, str], signed_chess: Path
) -> None:
    root = tmp_path / "inbox"
    tg.ArtifactStore.init(root)
    trusting = tg.ArtifactStore(root, trusted_keys=[keys["hf.pub"]])
    with pytest.raises(UntrustedKeyError):
        tg.ArtifactStore(root, trusted_keys=[keys["mallory.pub"]]).add_signed(signed_chess)
    with pytest.raises(RevokedKeyError, match=PublicKey.load(keys["hf.pub"]).fingerprint):
        tg.ArtifactStore(
            root, trusted_keys=[keys["hf.pub"], keys["ci.pub"]], revoked_keys=[keys["hf.pub"]]
        ).add_signed(signed_chess)
    with pytest.raises(ProvenanceError, match="needs a store opened with EC keys"):
        tg.ArtifactStore(root).add_signed(signed_chess)
    tampered = tmp_path / "tampered"
    shutil.copytree(signed_chess, tampered)
    data = bytearray((tampered / "pieces.safetensors").read_bytes())
    data[5000] ^= 1
    (tampered / "pieces.safetensors").write_bytes(bytes(data))
    with pytest.raises(SignedDigestError, match="pieces.safetensors") as e:
        trusting.add_signed(tampered)
    assert e.value.context == str(tampered)  # named by the user's path, not the private copy
    linked = tmp_path / "linked"
    shutil.copytree(signed_chess, linked)
    (linked / "config.json").unlink()
    (linked / "config.json").symlink_to(signed_chess / "config.json")
    with pytest.raises(tg.FormatError, match="symbolic link"):
        trusting.add_signed(linked)
    (tampered / "model.sig").unlink()
    with pytest.raises(MissingSignatureError):
        trusting.add_signed(tampered)
    assert _nothing_written(root)
    runner = CliRunner()
    refused = runner.invoke(
        main, ["store", "add", str(root), str(tampered), "--trusted-key", keys["hf.pub"]]
    )
    assert refused.exit_code == 1 and "no signature" in refused.output
    k1 = tmp_path / "k1.pub"
    k1.write_bytes(
        ec.generate_private_key(ec.SECP256K1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    wrong = runner.invoke(
        main, ["store", "add", str(root), str(signed_chess), "--trusted-key", str(k1)]
    )
    assert wrong.exit_code == 2 and "secp256k1" in wrong.output
    with pytest.raises(KeyFileError):
        tg.ArtifactStore(root, trusted_keys=[k1])
    assert _nothing_written(root)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_export_and_add_on_a_store_in_a_bucket(
    tmp_path: Path, keys: dict[str, str], signed_chess: Path, s3_url: str
) -> None:
    # out: the version's object streamed into the directory, re-hashed, signed
    writer = tg.ArtifactStore(s3_url, signing_key=keys["ci.key"])
    tg.ArtifactStore.init(s3_url)
    params = mlp.init(jax.random.key(1))
    v = writer.put(params)
    assert writer.verify(v).status == "verified"
    out = tmp_path / "out"
    writer.export(v, out)
    rc, text = _oms(
        "verify", "key", out, "--signature", out / "model.sig", "--public_key", keys["ci.pub"]
    )
    assert rc == 0, text
    assert _same(tg.load(out / "model.safetensors", like=params), params)
    # in: a model signed by model_signing becomes a candidate in the bucket
    inbox = tg.ArtifactStore(s3_url + "-inbox", trusted_keys=[keys["hf.pub"]])
    tg.ArtifactStore.init(s3_url + "-inbox")
    added = inbox.add_signed(signed_chess)
    info = inbox.info(added)
    assert info.status == "candidate" and info.num_params == 156_461
    # a tampered one leaves nothing in the bucket
    tampered = tmp_path / "tampered"
    shutil.copytree(signed_chess, tampered)
    data = bytearray((tampered / "pieces.safetensors").read_bytes())
    data[5000] ^= 1
    (tampered / "pieces.safetensors").write_bytes(bytes(data))
    with pytest.raises(SignedDigestError):
        inbox.add_signed(tampered)
    assert [i.version for i in inbox.versions()] == [added]


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_a_bucket_export_of_a_changed_object_is_refused_and_leaves_nothing(
    tmp_path: Path, keys: dict[str, str], s3_url: str
) -> None:
    tg.ArtifactStore.init(s3_url)
    writer = tg.ArtifactStore(s3_url, signing_key=keys["ci.key"])
    v = writer.put(mlp.seed_params())
    assert writer.verify(v).status == "verified"
    # another writer of the bucket replaces the version's object after its verdict
    forged = tmp_path / "forged.safetensors"
    tg.save(forged, jax.tree.map(lambda x: x + 1, mlp.seed_params()))
    bucket, _, prefix = s3_url.split("://", 1)[1].partition("/")
    raw = S3Store(bucket, prefix=prefix)  # the bucket itself, past the store
    obstore.put(raw, f"versions/{v}/model.safetensors", forged.read_bytes())
    with pytest.raises(tg.IntegrityError):
        writer.export(v, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_export_a_sharded_version(tmp_path: Path, keys: dict[str, str]) -> None:
    mesh = cpu_mesh((2, 4), ("data", "model"))
    sharding = NamedSharding(mesh, PartitionSpec("data", "model"))
    tree = {"w": jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), sharding)}
    writer = tg.ArtifactStore(tmp_path / "store", signing_key=keys["ci.key"])
    v = writer.put_sharded(tree)
    assert writer.verify(v, like=tree).status == "verified"
    out = tmp_path / "out"
    writer.export(v, out)
    rc, text = _oms(
        "verify", "key", out, "--signature", out / "model.sig", "--public_key", keys["ci.pub"]
    )
    assert rc == 0, text
    assert np.array_equal(tg.load_sharded(out, tree)["w"], tree["w"])
    # a shard changed after the verdict: the copy is refused and nothing is left
    data = sorted(
        p for p in Path(writer.info(v).path).rglob("*") if p.is_file() and "data-" in str(p)
    )
    biggest = max(data, key=lambda p: p.stat().st_size)
    raw = bytearray(biggest.read_bytes())
    raw[-1] ^= 1
    biggest.write_bytes(bytes(raw))
    with pytest.raises((tg.IntegrityError, tg.FormatError)):
        writer.export(v, tmp_path / "again")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith((".key", ".pub"))) == [
        "out",
        "store",
    ]
