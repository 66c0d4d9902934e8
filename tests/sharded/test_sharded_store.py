"""Sharded versions in the artifact store, in one process on one device: the
lifecycle, every gate on a changed byte or manifest, links and FIFOs, gc,
an unfinished put, signatures and the command line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from click.testing import CliRunner
from shardtools import MANIFEST_NAME, data_dir, flip_byte

from treeguard import (
    ArtifactStore,
    IntegrityError,
    RetentionPolicy,
    SignatureError,
    StoreError,
    spec_of,
)
from treeguard._cli.store import store as store_cli

#: More than 1 KiB, so OCDBT stores it in a data file rather than inline in its index.
W = (np.arange(512, dtype=np.float32).reshape(32, 16) * 1.5 + 0.25).astype(np.float32)


def _params(scale: float = 1.0) -> dict[str, Any]:
    return {
        "dense1": {"w": jnp.asarray(W * scale), "b": jnp.arange(16, dtype=jnp.bfloat16)},
        "dense2": {"w": jnp.ones((16, 2), jnp.int8), "b": jnp.asarray(3.0)},
    }


def _like() -> Any:
    one = jax.sharding.make_single_device_sharding(jax.devices()[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), _params())


def _same(a: Any, b: Any) -> None:
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def _vdir(store: ArtifactStore, version: str) -> Path:
    return Path(store.root) / "versions" / version


def _promoted(store: ArtifactStore, tree: Any, **kw: Any) -> str:
    v = store.put_sharded(tree, **kw)
    assert store.verify(v).status == "verified"
    store.promote(v)
    return v


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_lifecycle_of_a_sharded_version(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = store.put_sharded(_params(), metadata={"step": 1})
    info = store.info(v1)
    assert (info.kind, info.status, info.metadata) == ("sharded", "candidate", {"step": 1})
    assert info.path == str(_vdir(store, v1)) and info.num_leaves == 4
    assert (_vdir(store, v1) / MANIFEST_NAME).is_file()
    with pytest.raises(StoreError, match="candidate, not verified"):
        store.promote(v1)
    finite = ("finite", lambda t: bool(jnp.isfinite(t["dense1"]["w"]).all()))
    info = store.verify(v1, checks=[finite])
    assert info.status == "verified" and info.digest is not None
    assert [c.name for c in info.checks] == ["integrity", "contract", "finite"]
    store.promote(v1)
    _same(store.load_current(_like()), _params())
    _same(store.load_verified(v1, _params()), _params())
    # a candidate of another structure is rejected against the current version
    grown = _params()
    grown["dense2"]["w"] = jnp.ones((16, 3), jnp.int8)
    v2 = store.put_sharded(grown)
    info = store.verify(v2)
    assert info.status == "rejected"
    assert info.reason is not None and info.reason.startswith(
        f"contract: 1 mismatch between the checkpoint and version {v1} (current):\n"
        "  ['dense2']['w']: shape (16, 2) in version v000001 (current), (16, 3) in the checkpoint"
    )
    # a sharded candidate against a current single-file version, and back
    v3 = store.put(jax.tree.map(np.asarray, _params(2.0)))
    assert store.verify(v3).status == "verified"
    store.promote(v3)
    v4 = _promoted(store, _params(3.0))
    assert store.rollback() == v3
    _same(store.load_current(_params()), jax.tree.map(np.asarray, _params(2.0)))
    store.promote(v4)
    _same(store.load_current(_like()), _params(3.0))
    assert [v.kind for v in store.versions()] == ["sharded", "sharded", "file", "sharded"]


def test_a_sharded_version_needs_shardings_to_load(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    _promoted(store, _params())
    with pytest.raises(ValueError, match="version v000001 is sharded: `like` must be a tree"):
        store.load_current(jax.tree.map(np.asarray, _params()))
    with pytest.raises(ValueError, match="is sharded"):
        store.load_current()


def test_verify_onto_a_sharded_like(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v = store.put_sharded(_params())
    info = store.verify(v, like=_like(), checks=[lambda t: isinstance(t["dense1"]["w"], jax.Array)])
    assert info.status == "verified" and info.contract == "`like`"
    wrong = _like()
    wrong["dense1"]["b"] = jax.ShapeDtypeStruct(
        (17,), jnp.bfloat16, sharding=wrong["dense2"]["b"].sharding
    )
    v2 = store.put_sharded(_params())
    assert store.verify(v2, like=wrong).status == "rejected"
    assert store.verify(v2, like=spec_of(_params())).status == "verified"


def test_a_byte_flipped_after_promote_is_refused_and_rolled_past(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = store.put(jax.tree.map(np.asarray, _params()))
    store.verify(v1)
    store.promote(v1)
    v2 = _promoted(store, _params(2.0))
    v3 = _promoted(store, _params(3.0))
    flip_byte(_vdir(store, v3), (W * 3.0)[0, 1:4].tobytes())
    with pytest.raises(IntegrityError) as e:
        store.load_current(_like())
    assert e.value.version == v3 and e.value.path == "['dense1']['w']"
    assert str(e.value).startswith(f"version {v3}: its checkpoint changed since it was verified: ")
    assert "['dense1']['w']" in str(e.value)
    _same(store.load_current(_like(), fallback=True), _params(2.0))
    flip_byte(_vdir(store, v2), (W * 2.0)[0, 1:4].tobytes())
    assert store.rollback() == v1  # v2 is skipped: promote's gate re-hashes every shard
    events = [e for e in store.history() if e.action == "rollback"]
    assert events and any(v2 in s and "['dense1']['w']" in s for s in events[-1].detail["skipped"])
    with pytest.raises(IntegrityError, match=r"\['dense1'\]\['w'\]"):
        store.promote(v2)
    assert store.current() == v1


def test_promote_rehashes_the_shards_not_only_the_manifest(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v = store.put_sharded(_params())
    assert store.verify(v).status == "verified"
    flip_byte(_vdir(store, v), W[0, 1:4].tobytes())
    store.check_verified(v)  # the record and the manifest alone still pass
    with pytest.raises(IntegrityError) as e:
        store.promote(v)
    assert e.value.path == "['dense1']['w']" and e.value.version == v
    assert store.current() is None


def test_a_tampered_manifest_fails_the_digest_gate(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = _promoted(store, _params())
    manifest = _vdir(store, v1) / MANIFEST_NAME
    doc = json.loads(manifest.read_bytes())
    doc["metadata"] = {"step": 999}  # valid, consistent, and not what was verified
    manifest.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match="the manifest's digest is .* the verdict's") as e:
        store.load_current(_like())
    assert e.value.version == v1
    with pytest.raises(IntegrityError, match="manifest's digest"):
        store.promote(v1)
    with pytest.raises(StoreError, match="no former version"):
        store.rollback()


def test_a_link_in_a_sharded_version_is_refused_not_followed(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = _promoted(store, _params())
    data = data_dir(_vdir(store, v1))
    outside = tmp_path / "outside"
    os.rename(data, outside)  # the same bytes, reached through a link
    data.symlink_to(outside, target_is_directory=True)
    with pytest.raises(IntegrityError, match=f"{data.name} is a symbolic link") as e:
        store.load_current(_like())
    assert e.value.version == v1
    with pytest.raises(IntegrityError, match="symbolic link"):
        store.promote(v1)
    before = sorted(p.name for p in outside.rglob("*"))
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == []  # current: kept
    assert sorted(p.name for p in outside.rglob("*")) == before


def test_a_fifo_in_a_sharded_version_never_hangs(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = _promoted(store, _params())
    v2 = store.put_sharded(_params(2.0))
    os.mkfifo(data_dir(_vdir(store, v1)) / "extra")
    with pytest.raises(IntegrityError, match="extra is a FIFO"):
        store.load_current(_like())
    os.mkfifo(data_dir(_vdir(store, v2)) / "extra")
    info = store.verify(v2)
    assert info.status == "rejected" and info.reason is not None and "a FIFO" in info.reason
    # gc never removes what the store and orbax did not write
    assert v2 not in store.gc(policy=RetentionPolicy(keep_last=0))
    assert (data_dir(_vdir(store, v2)) / "extra").exists()


def test_gc_removes_a_sharded_version_whole(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v0 = store.put_sharded(_params())
    (_vdir(store, v0) / "notes.txt").write_text("not the store's")
    v1 = store.put_sharded(_params())
    v2 = _promoted(store, _params(2.0))
    v3 = _promoted(store, _params(3.0))
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == [v1]
    assert not _vdir(store, v1).exists()
    assert sorted(os.listdir(Path(store.root) / "versions")) == [v0, v2, v3]
    _same(store.load_current(_like()), _params(3.0))
    with pytest.raises(StoreError, match="existed and was removed by gc"):
        store.put_sharded(_params(), version=v1)


def test_an_unfinished_sharded_put_is_never_used_and_gc_reclaims_it(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = _promoted(store, _params())
    v2 = store.put_sharded(_params(2.0))
    status = _vdir(store, v2) / "status.json"
    record = json.loads(status.read_text())
    record.update(status="writing", pid=_dead_pid())  # as a put killed before its record
    status.write_text(json.dumps(record))
    (_vdir(store, v2) / MANIFEST_NAME).unlink()  # and before its manifest
    with pytest.raises(StoreError, match="still being written"):
        store.verify(v2)
    with pytest.raises(StoreError, match="writing, not verified"):
        store.promote(v2)
    with pytest.raises(StoreError, match="still being written"):
        store.load_version(v2, _like())
    record["host"] = "another-host"  # a writer elsewhere: its pid means nothing here
    status.write_text(json.dumps(record))
    assert store.gc(policy=RetentionPolicy(keep_last=5)) == []
    record["host"] = socket.gethostname()
    status.write_text(json.dumps(record))
    assert store.gc(policy=RetentionPolicy(keep_last=5)) == [v2]
    assert not _vdir(store, v2).exists() and store.current() == v1
    _same(store.load_current(_like()), _params())


def test_a_signed_sharded_verdict_binds_its_kind(tmp_path: Path) -> None:
    key = b"k" * 32
    store = ArtifactStore(tmp_path / "s", key=key)
    v1 = _promoted(store, _params())
    assert store.info(v1).signed
    status = _vdir(store, v1) / "status.json"
    record = json.loads(status.read_text())
    record["kind"] = "file"
    status.write_text(json.dumps(record))
    with pytest.raises(SignatureError, match="signature does not match"):
        store.check_verified(v1)


def test_the_command_line_on_sharded_versions(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = store.put_sharded(_params())
    v2 = store.put_sharded(_params(2.0))
    run = CliRunner().invoke
    res = run(store_cli, ["ls", store.root])
    assert res.exit_code == 0 and "sharded" in res.output
    doc = json.loads(run(store_cli, ["ls", "--json", store.root]).output)
    assert [v["kind"] for v in doc["versions"]] == ["sharded", "sharded"]
    for v in (v1, v2):
        res = run(store_cli, ["verify", store.root, v])
        assert res.exit_code == 0, res.output
        res = run(store_cli, ["promote", store.root, v])
        assert res.exit_code == 0, res.output
    flip_byte(_vdir(store, v1), W[0, 1:4].tobytes())
    res = run(store_cli, ["rollback", store.root])
    assert res.exit_code == 1 and "['dense1']['w']" in res.output
    res = run(store_cli, ["gc", "--keep", "0", store.root])
    assert res.exit_code == 0 and "nothing" in res.output


def test_the_messages_of_the_sharded_gates(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    v1 = _promoted(store, _params())
    with pytest.raises(ValueError) as e:
        store.load_current(jax.tree.map(np.asarray, _params()))
    assert str(e.value) == (
        "version v000001 is sharded: `like` must be a tree of jax.Arrays or "
        "jax.ShapeDtypeStructs with shardings, the layout to restore onto\n"
        "hint: `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))` "
        "for each leaf"
    )
    vdir = _vdir(store, v1)
    (vdir / "note").symlink_to(tmp_path)
    with pytest.raises(IntegrityError) as f:
        store.load_current(_like())
    assert str(f.value) == (
        f"{vdir}: version v000001: note is a symbolic link, not a file the store or orbax "
        "wrote; refused\n"
        "hint: the store never follows links; remove it, or restore the version from a backup"
    )
    (vdir / "note").unlink()
    manifest = vdir / MANIFEST_NAME
    manifest.write_bytes(manifest.read_bytes() + b"\n")
    with pytest.raises(IntegrityError) as g:
        store.load_current(_like())
    digest = store.info(v1).digest
    assert digest is not None
    text = str(g.value)
    assert text.startswith(
        "version v000001: its checkpoint changed since it was verified: the manifest's digest is "
    )
    assert text.endswith(
        f"the verdict's {digest[:16]}...: the checkpoint was replaced or edited\n"
        "hint: do not use it; restore it from a backup, or put the weights again"
    )
