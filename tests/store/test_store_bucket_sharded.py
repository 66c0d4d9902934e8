"""Sharded versions in a bucket, against a real SeaweedFS S3 server: put on
a 2x4 mesh of the 8 CPU devices, verify, promote, load onto a 4x2 mesh,
rollback and gc; a changed or missing shard object refused by name, by a
load and by a promote's check, also a byte changed late in a large one; a
partial load that fetches only its shards; a put killed between its shards
and its manifest, which leaves no version and whose objects gc removes
once older than the grace; a gc during a put, which leaves its shards."""

from __future__ import annotations

import os
import re
import signal
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import jax
import numpy as np
import obstore
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.buckets import raw_store
from tests.subproc import start_python, stop
from treeguard import ArtifactStore, IntegrityError, InvalidTreeError, RetentionPolicy, StoreError
from treeguard.provenance import generate_keys

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

ROOT = Path(__file__).resolve().parents[2]
SAVE = {"dense": {"w": P("x", "y"), "b": P("y")}, "embed": P(None, "x")}
LOAD = {"dense": {"w": P("x", "y"), "b": P()}, "embed": P("x", "y")}


def _host(scale: float) -> dict[str, Any]:
    rng = np.random.default_rng(int(scale * 10))
    return {
        "dense": {
            "w": (rng.standard_normal((64, 64)) * scale).astype(np.float32),
            "b": rng.standard_normal(64).astype(np.float32),
        },
        "embed": rng.integers(-100, 100, (16, 64)).astype(np.int8),
    }


def _mesh(shape: tuple[int, int]) -> jax.sharding.Mesh:
    return jax.make_mesh(shape, ("x", "y"), devices=jax.devices("cpu")[:8])


def _placed(host: dict[str, Any]) -> Any:
    mesh = _mesh((2, 4))
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), host, SAVE)


def _like(host: dict[str, Any]) -> Any:
    mesh = _mesh((4, 2))
    return jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)),
        host,
        LOAD,
    )


def _same(out: Any, host: Any) -> None:
    for a, h in zip(jax.tree.leaves(out), jax.tree.leaves(host)):
        assert np.asarray(a).tobytes() == np.asarray(h).tobytes()


def _names(url: str) -> set[str]:
    return {o["path"] for batch in obstore.list(raw_store(url)) for o in batch}


def _promoted(store: ArtifactStore, host: dict[str, Any]) -> str:
    v = store.put_sharded(_placed(host))
    assert store.verify(v).status == "verified"
    store.promote(v)
    return v


def _shards(url: str, version: str) -> list[str]:
    return sorted(n for n in _names(url) if n.startswith(f"versions/{version}/data-"))


def test_the_lifecycle_of_a_sharded_version_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h1, h2 = _host(1.0), _host(2.0)
    v1 = store.put_sharded(_placed(h1), metadata={"mesh": "2x4"})
    info = store.info(v1)
    assert (info.kind, info.status, info.metadata) == ("sharded", "candidate", {"mesh": "2x4"})
    assert f"versions/{v1}/treeguard.sharded.json" in _names(s3_url)
    # 8 shards of w, 4 of b (replicated over x: written once), 2 of embed
    assert len(_shards(s3_url, v1)) == 14
    assert store.verify(v1).status == "verified"  # whole, in this process
    store.promote(v1)
    _same(store.load_current(_like(h1)), h1)  # onto another mesh
    v2 = store.put_sharded(_placed(h2))
    assert store.verify(v2, like=_like(h2)).status == "verified"  # onto the 4x2 mesh
    store.promote(v2)
    out = store.load_current(_like(h2))
    _same(out, h2)
    assert out["embed"].sharding.mesh.shape == {"x": 4, "y": 2}
    assert store.rollback() == v1
    _same(store.load_current(_like(h1)), h1)
    store.promote(v2)
    v3 = store.put_sharded(_placed(h1))  # a candidate: gc keeps only current and previous
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == [v3]
    assert not [n for n in _names(s3_url) if n.startswith(f"versions/{v3}/")]
    assert f"retired/{v3}" in _names(s3_url)
    _same(ArtifactStore(s3_url).load_version(v2, _like(h2)), h2)
    _same(ArtifactStore(s3_url).load_version(v1, _like(h1)), h1)


def _tamper(url: str, version: str, index: int) -> str:
    name = _shards(url, version)[index]
    raw = bytearray(obstore.get(raw_store(url), name).bytes())
    raw[len(raw) // 2] ^= 1
    obstore.put(raw_store(url), name, bytes(raw))
    return name


def test_a_changed_shard_object_is_refused_naming_it(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v = _promoted(store, h)
    name = _tamper(s3_url, v, 0)
    with pytest.raises(IntegrityError) as e:
        store.load_current(_like(h))
    assert e.value.version == v and name in str(e.value), str(e.value)
    assert "does not match the manifest" in str(e.value)
    w = store.put_sharded(_placed(h))
    _tamper(s3_url, w, 3)
    verdict = store.verify(w)  # every shard read in this process
    assert verdict.status == "rejected" and "does not match the manifest" in verdict.reason


def test_a_missing_shard_object_is_refused_before_any_read(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v = _promoted(store, h)
    obstore.delete(raw_store(s3_url), _shards(s3_url, v)[5])
    with pytest.raises(IntegrityError, match="its arrays claim 17,664 bytes, its files hold") as e:
        store.load_current(_like(h))  # the objects hold fewer bytes than the manifest claims
    assert e.value.version == v
    with pytest.raises(IntegrityError, match="its files hold"):
        store.promote(v)  # every shard re-hashed first


def test_a_shard_object_gone_among_others_is_refused_naming_it(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v = _promoted(store, h)
    name = _shards(s3_url, v)[5]
    size = len(bytes(obstore.get(raw_store(s3_url), name).bytes()))
    obstore.delete(raw_store(s3_url), name)
    obstore.put(raw_store(s3_url), name.rsplit("/", 1)[0] + "/9.0-1", b"x" * size)  # as many bytes
    with pytest.raises(IntegrityError, match="is missing, the manifest records [0-9]+ bytes") as e:
        store.load_current(_like(h))
    assert e.value.version == v and name in str(e.value), str(e.value)
    with pytest.raises(IntegrityError, match="is missing, the manifest records [0-9]+ bytes") as e:
        store.promote(v)  # a check: streamed and hashed into no buffer
    assert name in str(e.value), str(e.value)


def test_a_shard_object_with_a_byte_more_is_refused_naming_it(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v = _promoted(store, h)
    name = _shards(s3_url, v)[2]
    raw = bytes(obstore.get(raw_store(s3_url), name).bytes())
    obstore.put(raw_store(s3_url), name, raw + b"\0")  # the listing still holds enough bytes
    want = f"is {len(raw) + 1} bytes, the manifest records {len(raw)} bytes"
    with pytest.raises(IntegrityError, match=want) as e:
        store.load_current(_like(h))
    assert e.value.version == v and name in str(e.value), str(e.value)
    with pytest.raises(IntegrityError, match=want):
        store.promote(v)


def test_a_byte_changed_late_in_a_streamed_shard_object_is_refused(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    host = np.random.default_rng(3).standard_normal((1024, 2048)).astype(np.float32)
    sharding = NamedSharding(_mesh((2, 4)), P("x", "y"))
    tree = {"w": jax.device_put(host, sharding)}
    like = {"w": jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=sharding)}
    v1, v2 = store.put_sharded(tree), store.put_sharded(tree)
    assert store.verify(v1).status == "verified"
    store.promote(v1)
    assert store.verify(v2).status == "verified"
    name = _shards(s3_url, v2)[6]
    raw = bytearray(obstore.get(raw_store(s3_url), name).bytes())
    assert len(raw) == 1 << 20  # streamed in several parts, each hashed as it arrives
    raw[-1] ^= 1  # in the last part
    obstore.put(raw_store(s3_url), name, bytes(raw))
    with pytest.raises(IntegrityError, match="does not match the manifest") as e:
        store.promote(v2)  # a check: every shard object streamed and hashed, kept nowhere
    assert e.value.version == v2 and name in str(e.value), str(e.value)
    assert store.current() == v1
    with pytest.raises(IntegrityError, match="does not match the manifest") as e:
        store.load_version(v2, like)  # streamed into the arrays' buffers
    assert e.value.version == v2 and name in str(e.value), str(e.value)
    _same(store.load_current(like), {"w": host})


def test_a_subtree_fetches_only_its_shard_objects(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    _promoted(store, h)
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def watch(req: Request) -> None:
        with lock:
            seen.append((req.method, req.key))

    with LyingProxy(s3_server.endpoint, watch) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        out = ArtifactStore(s3_url).load_current(_like(h)["dense"], subtree="['dense']")
    _same(out, h["dense"])
    fetched = {k.rsplit("/", 1)[-1] for m, k in seen if m == "GET" and "/data-" in k}
    # dense is the first subtree (b, then w: keys 0 and 1): 4 + 8 shards, embed's none
    assert fetched and all(n.split(".")[0] in ("0", "1") for n in fetched), fetched
    assert len(fetched) == 12


def _documented_window() -> int:
    """The bytes of shard objects a bucket load has under way at most, as the
    bucket guide states it ("up to 256 MiB of shards under way")."""
    text = " ".join((ROOT / "docs" / "guides" / "bucket.md").read_text().split())
    found = re.search(r"up to (\d+) MiB of shards under way", text)
    assert found is not None, "docs/guides/bucket.md no longer states a load's window"
    return int(found[1]) << 20


def _column(k: int) -> int:
    """Array ``k``'s columns: every array a shard size of its own, growing with ``k``."""
    return 4096 + 384 * k


def _counted(k: int) -> np.ndarray[Any, Any]:
    """Array ``k``: every element its own value, so a misplaced byte shows."""
    return np.arange(1024 * _column(k), dtype=np.int32).reshape(1024, _column(k)) + k


def test_a_resharded_load_of_many_shard_sizes_holds_a_bounded_scratch(s3_url: str) -> None:
    # 24 arrays of 16 to 51 MiB (798 MiB), each of a shard size of its own (8 shards of
    # 2 to 6.3 MiB on 2x4), smallest first: each saved shard read into scratch and copied
    # onto the 4x2 mesh; a scratch pool that kept every buffer would hold all of them
    window = _documented_window()
    store = ArtifactStore.init(s3_url)
    save, load = (
        NamedSharding(_mesh((2, 4)), P("x", "y")),
        NamedSharding(_mesh((4, 2)), P("x", "y")),
    )
    v = store.put_sharded({f"a{k:02d}": jax.device_put(_counted(k), save) for k in range(24)})
    like = {
        f"a{k:02d}": jax.ShapeDtypeStruct((1024, _column(k)), np.int32, sharding=load)
        for k in range(24)
    }
    total = sum(4 * 1024 * _column(k) for k in range(24))
    largest = 4 * 1024 * _column(23) // 8
    tracemalloc.start()  # numpy reports its buffers to it
    try:
        tracemalloc.reset_peak()
        start = tracemalloc.get_traced_memory()[0]
        out = store.load_version(v, like)
        peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    for k in range(24):
        assert np.array_equal(np.asarray(out[f"a{k:02d}"]), _counted(k)), k
    # the arrays, a window of reads in flight and at most a window of free scratch, and 2 MiB
    # for the rest (1.13 GB of 1.39 GB here; a pool that kept every free buffer held 1.69 GB)
    bound = total + 2 * window + 2 * largest + (2 << 20)
    assert peak <= bound, (peak, bound)


KILLED_PUT = r"""
import sys
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
import treeguard
mesh = jax.make_mesh((2, 4), ("x", "y"))
w = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
tree = {"w": jax.device_put(w, NamedSharding(mesh, P("x", "y")))}
print("PUTTING", flush=True)
treeguard.ArtifactStore(sys.argv[1]).put_sharded(tree)
print("FINISHED", flush=True)
"""


def test_a_put_killed_before_its_manifest_leaves_no_version(
    s3_server: S3Server, s3_url: str
) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v1 = _promoted(store, h)
    child: list[int] = []

    def kill_at_manifest(req: Request) -> Lie | None:
        if req.method == "PUT" and req.key.endswith("/treeguard.sharded.json") and child:
            os.kill(child[0], signal.SIGKILL)  # the shards are written, the manifest never
            return Lie(kind="ack")  # and the request never reaches the server
        return None

    with LyingProxy(s3_server.endpoint, kill_at_manifest) as proxy:
        env = {
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        }
        proc = start_python(KILLED_PUT, s3_url, env=env)
        child.append(proc.pid)
        out, err = stop(proc, timeout=120)
    assert proc.returncode == -signal.SIGKILL and "FINISHED" not in out, err[-2000:]
    left = [n for n in _names(s3_url) if n.startswith("versions/v000002/")]
    assert len(left) == 8 and all("/data-" in n for n in left), left  # shards only
    assert [v.version for v in store.versions()] == [v1]  # no version seen
    assert store.gc() == []  # younger than the grace: it could be a put still uploading
    assert len([n for n in _names(s3_url) if n.startswith("versions/v000002/")]) == 8
    assert store.gc(policy=RetentionPolicy(orphan_grace_s=0)) == ["v000002"]
    assert not [n for n in _names(s3_url) if n.startswith("versions/v000002/")]
    assert "retired/v000002" in _names(s3_url)
    v3 = store.put_sharded(_placed(h))
    assert v3 == "v000003"  # a name is never reused
    _same(store.load_version(v3, _like(h)), h)


def test_a_tree_put_sharded_refuses_is_refused_before_any_write(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    before = _names(s3_url)
    with pytest.raises(InvalidTreeError, match="stores jax.Array leaves"):
        store.put_sharded({"w": np.ones((4, 2), np.float32)})
    assert _names(s3_url) == before


def test_a_sharded_put_with_a_taken_name_writes_nothing(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    store.put_sharded(_placed(h), version="best")
    before = _names(s3_url)
    with pytest.raises(StoreError, match="already exists"):
        store.put_sharded(_placed(h), version="best")
    assert {n for n in _names(s3_url) if not n.startswith("log/")} == {
        n for n in before if not n.startswith("log/")
    }


def test_exporting_a_sharded_version_in_a_bucket_is_refused(s3_url: str, tmp_path: Path) -> None:
    key, _ = generate_keys(tmp_path / "ci", curve="P-256")
    store = ArtifactStore.init(s3_url, signing_key=key)
    v = store.put_sharded(_placed(_host(1.0)))
    store.verify(v)
    with pytest.raises(StoreError, match="sharded and kept in a bucket"):
        store.export(v, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_sharded_put_whose_event_is_not_logged_keeps_its_recorded_version(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)

    def lose_the_log(req: Request) -> Lie | None:
        # every event write answered 200 and never made: the put's event fails
        if req.method == "PUT" and "/log/" in f"/{req.key}":
            return Lie(kind="ack")
        return None

    with LyingProxy(s3_server.endpoint, lose_the_log) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StoreError, match="could not be logged"):
            ArtifactStore(s3_url).put_sharded(_placed(h))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    # recorded before its event failed: it keeps its shards, as a file put its checkpoint
    (v,) = [info.version for info in store.versions()]
    assert _shards(s3_url, v)
    assert store.verify(v).status == "verified"
    _same(store.load_version(v, _like(h)), h)


def test_a_sharded_put_stops_reading_shards_once_a_write_failed(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    mesh = _mesh((2, 4))
    tree = {
        f"w{i}": jax.device_put(np.full((64, 64), i, np.float32), NamedSharding(mesh, P("x", "y")))
        for i in range(6)
    }  # 48 shard objects
    tried: set[str] = set()
    lock = threading.Lock()

    def fail_shards(req: Request) -> Lie | None:
        if req.method == "PUT" and "/data-" in req.key:
            with lock:
                tried.add(req.key)
            return Lie(kind="ack")  # answered 200, never written: the read-back fails
        return None

    with LyingProxy(s3_server.endpoint, fail_shards) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StoreError):
            ArtifactStore(s3_url).put_sharded(tree)
    # at most twice the upload threads' shards were in hand when the first failed
    assert 0 < len(tried) <= 2 * 8 < 48, len(tried)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert store.versions() == []


def _put_with_gc_inside(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, policy: RetentionPolicy
) -> tuple[list[list[str]], Any]:
    """A sharded put into a store whose gc (``policy``, from another client
    straight to the server) runs once the put's first shard object is
    written: when the put reads it back. What gc removed, and what the put
    returned or raised."""
    gc_store = ArtifactStore(s3_url)  # its client talks to the server itself
    h = _host(1.0)
    removed: list[list[str]] = []
    shards_then: list[int] = []
    once = threading.Lock()

    def gc_after_a_shard(req: Request) -> Lie | None:
        if req.method == "GET" and "/data-" in req.key and once.acquire(blocking=False):
            shards_then.append(len(_shards(s3_url, "v000002")))
            removed.append(gc_store.gc(policy=policy))
        return None

    with LyingProxy(s3_server.endpoint, gc_after_a_shard) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        try:
            out: Any = ArtifactStore(s3_url).put_sharded(_placed(h))
        except StoreError as e:
            out = e
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert shards_then and shards_then[0] >= 1, shards_then  # gc saw shards of the put
    return removed, out


def test_a_gc_during_a_sharded_put_leaves_its_shards(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    h = _host(1.0)
    v1 = _promoted(store, h)
    removed, v = _put_with_gc_inside(s3_server, s3_url, monkeypatch, RetentionPolicy(keep_last=0))
    assert removed == [[]] and v == "v000002"  # its shards are younger than the grace
    assert "retired/v000002" not in _names(s3_url)
    assert store.verify(v).status == "verified"
    _same(store.load_version(v, _like(h)), h)
    assert [info.version for info in store.versions()] == [v1, v]


def test_a_gc_with_no_grace_during_a_sharded_put_makes_it_fail(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = _promoted(store, _host(1.0))
    # what the grace prevents: gc takes a live put's shards for a dead put's
    removed, out = _put_with_gc_inside(
        s3_server, s3_url, monkeypatch, RetentionPolicy(keep_last=0, orphan_grace_s=0)
    )
    assert removed == [["v000002"]] and isinstance(out, StoreError), out
    assert [info.version for info in store.versions()] == [v1]
    assert not _shards(s3_url, "v000002")
