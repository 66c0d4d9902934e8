"""Answers only the object's HEAD tells apart from the object, through a
lying proxy in front of a real SeaweedFS server: a file version's first
answer with an ETag that is not the object's (the next GET, carrying it in
``If-Match``, is answered 412), and a sharded or a dedup version's
manifest answered 404 while its HEAD finds it (a 412 for the ETag the
object has: test_store_lies.py). Each is read again, and one that lies on
every try is a ``StorageError`` naming the object, never an
``IntegrityError`` about the version nor a ``rejected`` verdict, nor a gc
that takes a version's tensors; an object really replaced while it is
read still fails the read as replaced, whatever its first answer's ETag
said. A write answered 412 whose ETag is no MD5 of its bytes (SSE-KMS's)
is judged by its bytes read back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import obstore
import pytest

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.buckets import raw_store, sharded_version
from tests.store.liars import Liar
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StorageError, StoreError

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

#: Two arrays of 128 KiB: the data comes past the first ranged GET (64 KiB).
_TREE = {k: np.arange(128 * 256, dtype=np.float32) + i for i, k in enumerate("az")}


def _other(shift: float) -> dict[str, Any]:
    return {k: a + shift for k, a in _TREE.items()}


def _promoted(store: ArtifactStore) -> tuple[str, str]:
    """A verified, promoted file version of ``_TREE``, and its checkpoint object."""
    v = store.put(_TREE)
    assert store.verify(v).status == "verified"
    store.promote(v)
    return v, f"versions/{v}/model.safetensors"


@pytest.mark.parametrize("times", [1, 100], ids=["once", "always"])
def test_a_file_version_s_first_answer_with_another_etag_is_read_on_under_its_head_s(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, times: int
) -> None:
    store, honest = lying
    v, _ = _promoted(honest)
    reads = [
        lambda: store.load_version(v, _TREE)["z"],
        lambda: store.load_current(_TREE)["z"],
        lambda: store.load_version(v, _TREE["z"], subtree="['z']"),  # a partial load
    ]
    for read in reads:
        # the first bytes' answer says another ETag: the data's GET carrying it is refused
        # (412), the HEAD gives the object's, under which the first bytes read the same
        liar.arm("etag", "GET", "model.safetensors", times=times, first=True)
        assert np.array_equal(read(), _TREE["z"])
        assert liar.times == max(0, times - 2)  # and that second read's ETag too, if always
    candidate = honest.put(_other(2.0))
    liar.arm("etag", "GET", "model.safetensors", times=times, first=True)
    assert store.verify(candidate).status == "verified"


@pytest.mark.parametrize("etag", [False, True], ids=["honest", "first-etag-lies"])
def test_a_file_version_replaced_before_its_data_is_read_is_still_an_object_replaced(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, etag: bool
) -> None:
    store = ArtifactStore.init(s3_url)
    v, name = _promoted(store)
    raw = raw_store(s3_url)  # the server's, not the proxy's
    other = store.put(_other(1.0))
    data = bytes(obstore.get(raw, f"versions/{other}/model.safetensors").bytes())
    replaced: list[bool] = []

    def replace(req: Request) -> Lie | None:
        ranged = req.header("range") or ""
        if replaced or req.method != "GET" or not req.key.endswith(name) or not ranged:
            return None
        if ranged.startswith("bytes=0-"):
            return Lie(kind="etag") if etag else None
        obstore.put(raw, name, data)  # before the data's GET reaches the server
        replaced.append(True)
        return None

    with LyingProxy(s3_server.endpoint, replace) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(IntegrityError) as e:
            ArtifactStore(s3_url).load_current(_TREE)
    assert replaced and e.value.version == v, str(e.value)
    said = f"version {v}: its checkpoint no longer reads: the object was replaced while it was read"
    assert str(e.value).splitlines()[0].endswith(said), str(e.value)


def test_a_sharded_manifest_s_404_its_head_contradicts_is_read_again_then_a_storage_error(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str
) -> None:
    store, honest = lying
    v, like, w = sharded_version(honest)
    name = f"versions/{v}/treeguard.sharded.json"
    liar.arm("missing", "GET", name)  # once: read again
    assert np.array_equal(np.asarray(store.load_version(v, like)["w"]), w) and liar.times == 0
    size = int(obstore.head(raw_store(s3_url), name)["size"])
    said = (
        f"{s3_url}/{name}: reading {name} failed: its answer was a 404, its HEAD {size:,} bytes "
        "(on each of 3 tries)"
    )
    liar.arm("missing", "GET", name, times=100)
    with pytest.raises(StorageError) as e:
        store.load_version(v, like)
    assert not isinstance(e.value, IntegrityError)  # never "its checkpoint object is missing"
    assert liar.times == 97 and str(e.value).splitlines()[0] == said, str(e.value)
    liar.arm("missing", "GET", name, times=100)
    with pytest.raises(StorageError, match="for its verdict failed 3 times.*no verdict"):
        store.verify(v)
    assert honest.info(v).status == "candidate"  # never rejected
    liar.times = 0
    assert store.verify(v).status == "verified"


def test_a_dedup_manifest_s_404_its_head_contradicts_is_read_again_by_a_load_and_by_gc(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str
) -> None:
    store, honest = lying
    ArtifactStore.init(s3_url, dedup=True)  # the store made a dedup one: puts keep tensors
    v1, v2 = honest.put(_TREE), honest.put(_other(1.0))  # no tensor in common
    assert honest.info(v1).kind == "tensors"
    name = f"versions/{v1}/tensors.json"
    liar.arm("missing", "GET", name)  # once: read again
    assert np.array_equal(store.load_version(v1, _TREE)["z"], _TREE["z"]) and liar.times == 0
    liar.arm("missing", "GET", name, times=100)
    with pytest.raises(StorageError, match=rf"reading {name} failed: its answer was a 404, its"):
        store.load_version(v1, _TREE)
    assert liar.times == 97
    # gc keeps both versions and sweeps the tensors no manifest names: v1's manifest
    # unread, it sweeps none (before, v1's tensors went as named by none)
    liar.arm("missing", "GET", name, times=100)
    assert store.gc(policy=RetentionPolicy(keep_last=2, orphan_grace_s=0)) == []
    assert liar.times < 100
    for v, tree in ((v1, _TREE), (v2, _other(1.0))):
        assert np.array_equal(honest.load_version(v, _TREE)["z"], tree["z"])


def _kms_like(refused: str) -> Callable[[Request], Lie | None]:
    """A server whose ETags are of an MD5's form but no MD5 of the bytes
    (SSE-KMS's): every HEAD of an object named ``.../refused`` answers
    another ETag, and its create-only PUT is performed but answered 412
    (an answer lost, the retry refused)."""

    def tamper(req: Request) -> Lie | None:
        if not req.key.endswith(refused):
            return None
        return Lie(kind={"PUT": "refuse", "HEAD": "etag"}.get(req.method))

    return tamper


def test_a_put_refused_but_performed_under_etags_that_are_no_md5_is_confirmed_by_its_bytes(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint's ETag is neither the PUT's answer (a 412 has none)
    nor its bytes' MD5: the object is read back and compared, and the put
    is the putter's. Before, the put took it for another writer's object
    (``Conflict.EXISTS``) and failed."""
    honest = ArtifactStore.init(s3_url)
    with LyingProxy(s3_server.endpoint, _kms_like("model.safetensors")) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        v = ArtifactStore(s3_url).put(_TREE, version="release-1")
    assert v == "release-1"
    assert honest.verify(v).status == "verified"


def test_another_writer_s_object_under_etags_that_are_no_md5_is_still_another_s(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same server, another writer's object of the same size (one bit
    apart) written under the name as the put's PUT arrives (after the put
    looked for the name), so the server refuses the create-only PUT: read
    back (a GET of the whole object), its bytes differ, so it is not taken
    for this put's (the read back confirms only the putter's own bytes).
    Before, the object was written before the put, which found the name
    taken by its listing and never came to the read back."""
    honest = ArtifactStore.init(s3_url)
    raw = raw_store(s3_url)  # the server's, not the proxy's
    data = bytearray(obstore.get(raw, f"versions/{honest.put(_TREE)}/model.safetensors").bytes())
    data[-1] ^= 1
    taken = "versions/release-1/model.safetensors"
    kms = _kms_like(taken)
    read_back: list[str] = []

    def tamper(req: Request) -> Lie | None:
        if req.key.endswith(taken) and req.method == "PUT":
            obstore.put(raw, taken, bytes(data))  # another writer's, first
        if req.key.endswith(taken) and req.method == "GET":
            read_back.append(req.header("range") or "whole")
        return kms(req)

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StoreError, match="version release-1 already exists"):
            ArtifactStore(s3_url).put(_TREE, version="release-1")
    assert read_back == ["whole"]
    assert bytes(obstore.get(raw, taken).bytes()) == data


def test_a_put_s_object_replaced_by_one_of_another_size_during_its_read_back_is_not_its_own(
    s3_url: str, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same server, the put's checkpoint object replaced with other
    bytes of another size between its HEAD (its size then the put's) and
    the GET that reads it back: the read back ends with another size, so
    the object is not the putter's. Before, ``_reads_as`` took any size
    the stream returned for a match (no part was compared), and the put
    returned ``release-1`` recorded over bytes that are not its own."""
    honest = ArtifactStore.init(s3_url)
    raw = raw_store(s3_url)  # the server's, not the proxy's
    taken = "versions/release-1/model.safetensors"
    kms = _kms_like("model.safetensors")
    replaced: list[bool] = []

    def tamper(req: Request) -> Lie | None:
        if req.method == "GET" and req.key.endswith(taken) and not replaced:
            replaced.append(True)  # another writer's object, 100 bytes longer
            obstore.put(raw, taken, bytes(obstore.get(raw, taken).bytes()) + bytes(100))
        return kms(req)

    with LyingProxy(s3_server.endpoint, tamper) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        with pytest.raises(StoreError) as e:
            ArtifactStore(s3_url).put(_TREE, version="release-1")
    assert replaced and "release-1" in str(e.value)
    assert [i.version for i in honest.versions() if i.status != "writing"] == []
