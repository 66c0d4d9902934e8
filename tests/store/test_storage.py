"""The guarantees a store rests on, through ``ArtifactStore`` on a local disk
and in a real S3 bucket (SeaweedFS): strict store URLs, an unreachable
server named by object and never by key, an over-large pointer refused by
name, of many promotes racing on one pointer exactly one winning, gc's ages
on the bucket's clock, never the client's; and a bucket reader stopped
early, which no public call reaches (below the store)."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import obstore
import pytest
from machine import needs_inet_sockets

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.buckets import raw_store
from treeguard import ArtifactStore, ConflictError, RetentionPolicy, StorageError, StoreError
from treeguard._src.store import objectreader, objects  # _src: no public call stops a reader midway

ROOT = Path(__file__).resolve().parents[2]
#: The most bytes a store reads of a pointer, a marker or a status file.
SMALL_FILE_LIMIT = 16 << 20
S3 = (pytest.mark.slow, pytest.mark.xdist_group("s3"))  # the session's SeaweedFS server


def _documented_read_ahead() -> int:
    """How many chunks wait ahead of a bucket download's reader at most, as
    the bucket guide states it ("at most four chunks ... wait ahead")."""
    text = " ".join((ROOT / "docs" / "guides" / "bucket.md").read_text().split())
    found = re.search(r"at most (\w+) chunks of about 4 MiB wait ahead", text)
    assert found is not None, "docs/guides/bucket.md no longer states the read-ahead bound"
    return ["one", "two", "three", "four", "five", "six", "seven", "eight"].index(found[1]) + 1


def _params(value: float) -> dict[str, Any]:
    return {"w": np.full((4, 4), value, np.float32)}


@pytest.fixture(params=["local", pytest.param("s3", marks=S3)])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store's root: a local directory, or a prefix in the session's bucket."""
    return (
        str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("s3_url")
    )


def test_store_urls_are_parsed_strictly(tmp_path: Path) -> None:
    assert ArtifactStore("s3://models/mlp/").root == "s3://models/mlp"
    assert ArtifactStore("gs://bucket").root == "gs://bucket"
    assert ArtifactStore(tmp_path / "s3:").root == str(tmp_path / "s3:")  # a local path
    for bad in ("s3://", "s3://B/x", "s3://bucket/a//b", "gs://bucket/../x"):
        with pytest.raises(StoreError, match="not a store URL") as e:
            ArtifactStore(bad)
        assert str(e.value).startswith(f"{bad}: ") and "://BUCKET/PREFIX" in str(e.value)


def test_an_unreachable_server_is_a_storage_error_naming_the_object_never_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    needs_inet_sockets()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDVISIBLEID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret-key")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    with pytest.raises(StorageError, match="reading STORE.json failed: the connection failed") as e:
        ArtifactStore("s3://treeguard/nowhere").versions()
    text = str(e.value)
    assert text.startswith("s3://treeguard/nowhere/STORE.json: "), text
    assert "very-secret-key" not in text and "AKIDVISIBLEID" not in text


def test_a_pointer_over_the_limit_is_refused_by_name(root: str) -> None:
    store = ArtifactStore.init(root)
    huge = b" " * (SMALL_FILE_LIMIT + 1)
    if root.startswith("s3://"):
        obstore.put(raw_store(root), "CURRENT.json", huge)
    else:
        Path(root, "CURRENT.json").write_bytes(huge)
    with pytest.raises(StoreError, match=f"more than the {SMALL_FILE_LIMIT} allowed") as e:
        store.current()
    assert str(e.value).startswith(f"{root}/CURRENT.json: "), str(e.value)
    assert f"the pointer is {SMALL_FILE_LIMIT + 1} bytes" in str(e.value)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_of_many_promotes_racing_on_a_bucket_exactly_one_wins(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = ArtifactStore.init(s3_url)
    versions = [honest.put(_params(i)) for i in range(7)]
    for v in versions:
        honest.verify(v)
    honest.promote(versions[0])
    # every promote reads the pointer before any writes it (its write waits for all six),
    # then they write it one at a time, each once the one before returned
    met, turn = threading.Barrier(6), threading.Semaphore(1)

    def together(req: Request) -> Lie | None:
        if req.method == "PUT" and req.key.endswith("/CURRENT.json"):
            met.wait(timeout=60)
            assert turn.acquire(timeout=60)
        return None

    won: list[str] = []
    lost: list[ConflictError] = []

    def promote(v: str) -> None:
        try:
            ArtifactStore(s3_url).promote(v)
            won.append(v)
        except ConflictError as e:
            lost.append(e)
        finally:
            turn.release()

    with LyingProxy(s3_server.endpoint, together) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        threads = [threading.Thread(target=promote, args=(v,)) for v in versions[1:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert len(won) == 1 and len(lost) == 5, (won, lost)
    assert honest.current() == won[0] and honest.previous() == versions[0]
    for e in lost:
        assert "another process moved the pointer first" in str(e)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_gc_ages_a_dead_puts_objects_on_the_buckets_clock_never_the_clients(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = store.put(_params(1.0))
    raw = raw_store(s3_url)
    data = bytes(obstore.get(raw, f"versions/{v1}/model.safetensors").bytes())
    obstore.put(raw, "versions/v000002/model.safetensors", data)  # a put killed before its record
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 86400)  # the client's clock a day ahead
    assert store.gc(policy=RetentionPolicy(keep_last=10)) == []  # younger than the hour's grace
    monkeypatch.undo()
    assert store.gc(policy=RetentionPolicy(keep_last=10, orphan_grace_s=0)) == ["v000002"]
    names = {o["path"] for batch in obstore.list(raw) for o in batch}
    assert not [n for n in names if n.startswith(("clock/", "versions/v000002/"))], names


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_a_reader_that_stops_early_holds_a_bounded_download_and_joins_its_thread(
    s3_url: str,
) -> None:
    backend = objects.ObjectStorage(s3_url)
    data = np.arange(12 << 20, dtype=np.uint32).tobytes()  # 48 MiB: twelve streamed chunks
    backend.create("big", data)
    reader = objectreader.open_reader(backend, "big")
    assert reader is not None
    reader.plan(None)  # the whole object, pulled ahead by the thread
    buf = memoryview(bytearray(1 << 20))
    assert (
        reader.pread_into(buf, 1 << 16) == len(buf) and buf == data[1 << 16 : (1 << 16) + len(buf)]
    )
    fetched, still = -1, 0
    for _ in range(400):  # until it stops pulling: its queue is full
        still = still + 1 if reader.fetched == fetched else 0
        if still == 10:
            break
        fetched = reader.fetched
        time.sleep(0.05)
    assert still == 10
    # the first bytes, the chunks queued ahead, one waiting to be queued and the one being read
    assert (
        fetched
        <= (1 << 16) + (_documented_read_ahead() + 2) * (objects._STREAM_CHUNK + (1 << 20))
        < len(data)
    )
    reader.close()
    reader.close()
    assert not [t for t in threading.enumerate() if t.name == "treeguard-fetch"]
    assert reader.pread_into(buf, len(data) - len(buf)) == len(buf) and buf == data[-len(buf) :]
    reader.close()
    assert not [t for t in threading.enumerate() if t.name == "treeguard-fetch"]
