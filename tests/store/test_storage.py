"""The storage protocol under a store, on a local disk and in a real S3
bucket (SeaweedFS): create-only writes, compare-and-swap, reads, ranged
reads, listing and deletion, with the same typed outcomes on both."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from machine import needs_inet_sockets

from treeguard import StorageError

# The storage protocol and its backends on purpose: the layer under the store.
from treeguard._src.store import objects, storage  # _src: the storage protocol itself

LIMIT = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


def _documented_read_ahead() -> int:
    """How many chunks wait ahead of a bucket download's reader at most, as
    the bucket guide states it ("at most four chunks ... wait ahead")."""
    text = " ".join((ROOT / "docs" / "guides" / "bucket.md").read_text().split())
    found = re.search(r"at most (\w+) chunks of about 4 MiB wait ahead", text)
    assert found is not None, "docs/guides/bucket.md no longer states the read-ahead bound"
    return ["one", "two", "three", "four", "five", "six", "seven", "eight"].index(found[1]) + 1


S3 = (pytest.mark.slow, pytest.mark.xdist_group("s3"))  # the session's SeaweedFS server


@pytest.fixture(params=["local", pytest.param("s3", marks=S3)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> storage.Storage:
    if request.param == "local":
        (tmp_path / "versions").mkdir()
        return storage.LocalStorage(str(tmp_path))
    return objects.ObjectStorage(request.getfixturevalue("s3_url"))


def test_create_writes_once_and_reports_an_existing_name(backend: storage.Storage) -> None:
    tag = backend.create("versions/a", b"first")
    assert isinstance(tag, str)
    assert backend.create("versions/a", b"second") is storage.Conflict.EXISTS
    assert backend.read("versions/a", limit=LIMIT, what="object") == (b"first", tag)
    assert backend.read("versions/missing", limit=LIMIT, what="object") is None


def test_swap_replaces_only_what_was_read(backend: storage.Storage) -> None:
    assert backend.swap("POINTER", b"one", "not-a-tag") is storage.Conflict.CHANGED  # absent
    first = backend.swap("POINTER", b"one", None)
    assert isinstance(first, str)
    assert backend.swap("POINTER", b"two", None) is storage.Conflict.CHANGED  # present now
    second = backend.swap("POINTER", b"two", first)
    assert isinstance(second, str) and second != first
    assert backend.swap("POINTER", b"three", first) is storage.Conflict.CHANGED  # stale
    assert backend.read("POINTER", limit=LIMIT, what="object") == (b"two", second)


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_of_many_racing_swappers_on_a_bucket_exactly_one_wins(s3_url: str) -> None:
    backend = objects.ObjectStorage(s3_url)
    tag = backend.create("POINTER", b"start")
    assert isinstance(tag, str)
    outcomes: list[str | storage.Conflict] = []
    barrier = threading.Barrier(6)

    def promote(i: int) -> None:
        barrier.wait(timeout=30)
        outcomes.append(backend.swap("POINTER", f"winner {i}".encode(), tag))

    threads = [threading.Thread(target=promote, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(isinstance(o, str) for o in outcomes) == 1
    assert outcomes.count(storage.Conflict.CHANGED) == 5


def test_ranged_reads_sizes_listing_and_deletion(backend: storage.Storage) -> None:
    backend.create("versions/b", bytes(range(256)))
    backend.create("versions/a", b"x")
    assert backend.read_range("versions/b", 10, 5) == bytes(range(10, 15))
    assert backend.read_range("versions/b", 250, 100) == bytes(range(250, 256))
    assert (backend.size("versions/b"), backend.size("versions/none")) == (256, None)
    assert backend.list("versions") == ["a", "b"]
    backend.delete("versions/a")
    backend.delete("versions/a")  # absent: nothing happens
    assert backend.list("versions") == ["b"]
    with pytest.raises(ValueError, match="is not an object name inside a store"):
        backend.read("../escape", limit=LIMIT, what="object")


def test_an_object_over_the_limit_is_refused_by_name(backend: storage.Storage) -> None:
    backend.create("big", b"x" * 100)
    with pytest.raises(Exception, match="the marker is 100 bytes, more than the 10 allowed"):
        backend.read("big", limit=10, what="marker")


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
    backend = objects.ObjectStorage("s3://treeguard/nowhere")
    for call in (
        lambda: backend.read("STORE.json", limit=LIMIT, what="marker"),
        lambda: backend.create("versions/v1/status.json", b"{}"),
        lambda: backend.list("versions"),
    ):
        with pytest.raises(StorageError, match="failed: the connection failed") as e:
            call()
        text = str(e.value)
        assert "s3://treeguard/nowhere/" in text
        assert "very-secret-key" not in text and "AKIDVISIBLEID" not in text


def test_store_urls_are_parsed_strictly() -> None:
    urls = ("s3://bucket/a/b", "gs://bucket", "/tmp/s3:")
    assert [objects.is_url(u) for u in urls] == [True, True, False]
    assert objects.split_url("s3://models/mlp/") == ("s3", "models", "mlp")
    for bad in ("s3://", "s3://B/x", "s3://bucket/a//b", "gs://bucket/../x"):
        with pytest.raises(Exception, match="not a store URL"):
            objects.split_url(bad)
    assert os.sep not in objects.split_url("gs://bucket")[2]


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_a_reader_that_stops_early_holds_a_bounded_download_and_joins_its_thread(
    s3_url: str,
) -> None:
    backend = objects.ObjectStorage(s3_url)
    data = np.arange(12 << 20, dtype=np.uint32).tobytes()  # 48 MiB: twelve streamed chunks
    backend.create("big", data)
    reader = backend.reader("big")
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


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_a_buckets_clock_and_ages_are_the_servers_and_leave_nothing(s3_url: str) -> None:
    backend = objects.ObjectStorage(s3_url)
    backend.create("a/x", b"1")
    backend.create("a/y", b"2")
    backend.delete("a/y")
    written = backend.modified("a")
    assert list(written) == ["x"]  # objects only, none deleted, never the prefix itself
    now = backend.now()
    assert now >= written["x"]  # both on the server's clock
    assert backend.list("clock") == []  # the object whose time it read is gone
    backend.delete("a/x")
    assert backend.modified("a") == {} and backend.list("a") == []
