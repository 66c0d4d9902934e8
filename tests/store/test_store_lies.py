"""A bucket that lies, through a proxy in front of a real SeaweedFS server:
wrong ETags, short, cut and reordered ranges, a shard object's stream longer or
shorter than the size its answer announced (sent chunked, which the client
reads to its end whatever the Content-Length says), a size, a 404 or a 412
its HEAD contradicts, a 200 for a write it did not perform and a 412 for one
it did.
Every case ends typed, nothing unverified is returned, nothing is lost, and no
success is reported for what did not happen; a transient read failure, or an
answer that lies on every try, never becomes a permanent verdict; a load or a
verify lied to once reads that object again and succeeds."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import numpy as np
import obstore
import pytest
from click.testing import CliRunner

from tests.store.buckets import raw_store, sharded_version
from tests.store.liars import Liar
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StorageError
from treeguard._cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


def _params(value: float) -> dict[str, Any]:
    # larger than the first ranged GET (64 KiB), so the data comes in a second one
    w = np.random.default_rng(int(value)).standard_normal((128, 256)).astype(np.float32)
    return {"w": w, "b": np.zeros(8, np.float32)}


def _verified(store: ArtifactStore, value: float) -> str:
    v = store.put(_params(value))
    assert store.verify(v).status == "verified"
    return v


def _first_of_two_promoted(store: ArtifactStore) -> tuple[str, str]:
    v1, v2 = _verified(store, 1.0), _verified(store, 2.0)
    store.promote(v1)
    return v1, v2


def test_a_checkpoint_put_acknowledged_but_not_performed_is_refused(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    liar.arm("ack", "PUT", "model.safetensors")
    with pytest.raises(StorageError, match="acknowledged it, but reading it back found no such"):
        store.put(_params(1.0))
    assert liar.times == 0 and honest.versions() == []


def test_a_checkpoint_put_refused_but_performed_is_the_putters(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    liar.arm("refuse", "PUT", "model.safetensors")
    v = store.put(_params(1.0), version="release-1")
    assert liar.times == 0 and v == "release-1"
    assert honest.verify(v).status == "verified"


def test_a_checkpoint_put_answered_with_a_wrong_etag_is_confirmed_by_its_bytes(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    # the answer's ETag is not the object's: its MD5 decides, and it is the put's
    store, honest = lying
    liar.arm("etag", "PUT", "model.safetensors")
    v = store.put(_params(1.0))
    assert liar.times == 0
    assert honest.verify(v).status == "verified"


def test_a_large_write_its_put_s_answer_tags_is_confirmed_without_an_md5(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the HEAD's size and ETag are the PUT answer's: hashing the bytes again
    # would cost four times their BLAKE3 digest
    store = ArtifactStore.init(s3_url)
    hashed: list[int] = []
    md5 = hashlib.md5

    def counted(data: Any = b"", **kwargs: Any) -> Any:
        hashed.append(len(data))
        return md5(data, **kwargs)

    monkeypatch.setattr(hashlib, "md5", counted)
    v = store.put(_params(1.0))
    assert hashed == []
    assert store.verify(v).status == "verified"


def test_a_pointer_write_acknowledged_but_not_performed_is_no_promote(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1, v2 = _first_of_two_promoted(store)
    liar.arm("ack", "PUT", "CURRENT.json")
    with pytest.raises(StorageError, match="writing CURRENT.json failed: the server acknowl"):
        store.promote(v2)
    assert liar.times == 0 and honest.current() == v1
    store.promote(v2)
    liar.arm("ack", "PUT", "CURRENT.json")
    with pytest.raises(StorageError, match="writing CURRENT.json failed"):
        store.rollback()
    assert honest.current() == v2


def test_a_pointer_write_refused_but_performed_is_a_rollback_done(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1, v2 = _first_of_two_promoted(store)
    liar.arm("refuse", "PUT", "CURRENT.json")
    store.promote(v2)  # no ConflictError: its own write moved the pointer
    assert liar.times == 0 and honest.current() == v2
    liar.arm("refuse", "PUT", "CURRENT.json")
    assert store.rollback() == v1
    assert liar.times == 0 and (honest.current(), honest.previous()) == (v1, None)


def test_a_verdict_write_acknowledged_but_not_performed_is_no_verdict(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v = store.put(_params(1.0))
    liar.arm("ack", "PUT", "verdict.json")
    with pytest.raises(StorageError, match="writing versions/v000001/verdict.json failed"):
        store.verify(v)
    assert liar.times == 0 and honest.info(v).status == "candidate"
    assert store.verify(v).status == "verified"  # tried again: recorded


def test_a_verdict_write_refused_but_performed_is_the_verdict_recorded(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v = store.put(_params(1.0))
    liar.arm("refuse", "PUT", "verdict.json")
    assert store.verify(v).status == "verified"
    assert liar.times == 0 and honest.info(v).status == "verified"


@pytest.mark.parametrize(
    ("kind", "data"), [("short", True), ("reorder", True), ("etag", False)], ids=str
)
def test_a_read_that_lies_once_during_verify_is_read_again_not_rejected(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, kind: str, data: bool
) -> None:
    store, honest = lying
    v = store.put(_params(1.0))
    liar.arm(kind, "GET", "model.safetensors", data=data)
    assert store.verify(v).status == "verified"
    assert liar.times == 0 and honest.info(v).status == "verified"


@pytest.mark.parametrize("kind", ["short", "refuse"])
def test_a_read_that_fails_on_every_try_is_no_verdict(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, kind: str
) -> None:
    store, honest = lying
    v = store.put(_params(1.0))
    liar.arm(kind, "GET", "model.safetensors", times=100, data=True)  # refuse: a 412
    with pytest.raises(StorageError, match="for its verdict failed 3 times.*no verdict"):
        store.verify(v)
    assert honest.info(v).status == "candidate"  # verify it again once the server is mended


@pytest.mark.parametrize(
    ("kind", "times"),
    [("short", 1), ("cut", 1), ("short", 100), ("cut", 100), ("reorder", 100)],
    ids=str,
)
def test_a_load_the_bucket_lies_to_returns_nothing_unverified(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, kind: str, times: int
) -> None:
    store, honest = lying
    v = _verified(honest, 1.0)
    honest.promote(v)
    liar.arm(kind, "GET", "model.safetensors", times=times, data=True)
    if times == 1:  # a range whose body ended early, with no error: the rest asked for again
        assert np.array_equal(store.load_current(_params(0.0))["w"], _params(1.0)["w"])
        assert liar.times == 0
        return
    with pytest.raises((IntegrityError, StorageError)) as e:  # every try: refused
        store.load_current(_params(0.0))
    # a range cut short is a request that lied; bytes that hash wrong speak of the version
    # (ETags that lie: test_store_lies_heads.py)
    assert isinstance(e.value, IntegrityError) == (kind == "reorder"), str(e.value)
    assert np.array_equal(honest.load_current(_params(0.0))["w"], _params(1.0)["w"])


def test_a_gc_whose_clock_write_is_not_performed_reports_its_removals_and_keeps_young_data(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1, v2 = _first_of_two_promoted(store)
    liar.arm("ack", "PUT", "status.json")  # a put that leaves its checkpoint object, no record
    with pytest.raises(StorageError):
        store.put(_params(3.0))
    liar.arm("ack", "PUT", "")
    liar.pick = lambda req: req.method == "PUT" and "/clock/" in f"/{req.key}"
    # the bucket's clock cannot be read: nothing is old, and gc still ends with what it removed
    with pytest.warns(RuntimeWarning, match="could not read the storage's clock"):
        assert store.gc(policy=RetentionPolicy(keep_last=0, orphan_grace_s=1e-9)) == [v2]
    assert liar.times == 0 and [v.version for v in honest.versions()] == [v1]
    assert honest.gc(policy=RetentionPolicy(keep_last=0, orphan_grace_s=0)) == ["v000003"]


def test_store_gc_keeps_a_dead_put_s_data_for_its_grace_and_removes_it_with_grace_0(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1 = _verified(store, 1.0)
    liar.arm("ack", "PUT", "status.json")  # a put that leaves its checkpoint object, no record
    with pytest.raises(StorageError):
        store.put(_params(3.0))
    gc = ["store", "gc", str(honest.root), "--keep", "1"]
    kept = CliRunner().invoke(main, gc)
    assert kept.exit_code == 0 and "removed 0: nothing" in kept.output, kept.output
    removed = CliRunner().invoke(main, [*gc, "--orphan-grace", "0"])
    assert removed.exit_code == 0 and "removed 1: v000002" in removed.output, removed.output
    assert [v.version for v in honest.versions()] == [v1]
    refused = CliRunner().invoke(main, [*gc, "--orphan-grace", "-1"])
    assert refused.exit_code == 2 and "--orphan-grace" in refused.output


_SHARD = "/0.4096-8192"
#: What each lie about the shard object ``_SHARD`` makes its answer say, after
#: the object's URL (16,384 bytes, as its HEAD says).
_LIES = {
    "longer": "reading {name} failed: its stream ran past its 16,384 bytes: 16,484 or more came",
    "shorter": "reading {name} failed: its stream ended after 8,192 of its 16,384 bytes",
    "inflated": "reading {name} failed: its answer was 16,484 bytes, its HEAD 16,384 bytes",
    "missing": "reading {name} failed: its answer was a 404, its HEAD 16,384 bytes",
}


@pytest.mark.parametrize("kind", list(_LIES))
def test_a_shard_object_lied_about_once_is_read_again_by_every_load(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, kind: str
) -> None:
    store, honest = lying
    v, like, w = sharded_version(honest)
    assert honest.verify(v).status == "verified"
    honest.promote(v)
    for load in (lambda: store.load_version(v, like), lambda: store.load_current(like)):
        liar.arm(kind, "GET", _SHARD)  # one answer lies; the next is the object's
        got = load()["w"]
        assert liar.times == 0 and np.array_equal(np.asarray(got), w)


@pytest.mark.parametrize("kind", list(_LIES))
def test_a_shard_object_lied_about_on_every_try_is_a_storage_error_naming_it(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str, kind: str
) -> None:
    store, honest = lying
    v, like, w = sharded_version(honest)
    assert honest.verify(v).status == "verified"
    name = rf"versions/{v}/data-[0-9a-f]{{16}}/0\.4096-8192"
    said = rf"^{re.escape(s3_url)}/{name}: "
    said += re.escape(_LIES[kind]).replace(r"\{name\}", name) + r" \(on each of 3 tries\)$"
    # a load streams each shard into its buffer (100 bytes more would not fit it: refused
    # before a byte past it is handed over); a promote's check streams it through the hash
    for read in (lambda: store.load_version(v, like), lambda: store.promote(v)):
        liar.arm(kind, "GET", _SHARD, times=100)  # on every try
        with pytest.raises(StorageError) as e:
            read()
        assert not isinstance(e.value, IntegrityError)  # nothing said of the stored bytes
        assert liar.times < 100 and re.search(said, str(e.value), re.MULTILINE), str(e.value)
        assert "hint: the server or a proxy in front of it" in str(e.value)
    assert honest.current() is None and np.array_equal(honest.load_version(v, like)["w"], w)


@pytest.mark.parametrize("kind", list(_LIES))
@pytest.mark.parametrize("times", [1, 100], ids=["once", "always"])
def test_a_shard_object_the_transport_lies_about_is_no_rejected_verdict(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, kind: str, times: int
) -> None:
    store, honest = lying
    v, _, _ = sharded_version(honest)
    liar.arm(kind, "GET", _SHARD, times=times)
    if times == 1:  # read again, whole: verified
        assert store.verify(v).status == "verified"
        assert liar.times == 0 and honest.info(v).status == "verified"
        return
    # a stream of another length than announced, or an announced size or a 404 the object's
    # HEAD contradicts, on every try: a failed read, not a verdict on bytes never seen
    with pytest.raises(StorageError, match="for its verdict failed 3 times.*no verdict") as e:
        store.verify(v)
    said = rf"\(last: reading versions/{v}/data-[0-9a-f]{{16}}/0\.4096-8192 failed: "
    assert liar.times < 100 and re.search(said, str(e.value)), str(e.value)
    assert honest.info(v).status == "candidate"  # verify it again once the server is mended
    liar.times = 0
    assert store.verify(v).status == "verified"


def test_a_shard_object_stored_with_a_byte_more_is_rejected(
    lying: tuple[ArtifactStore, ArtifactStore], s3_url: str
) -> None:
    store, honest = lying
    v, _, _ = sharded_version(honest)
    name = next(
        o["path"]
        for batch in obstore.list(raw_store(s3_url), f"versions/{v}/")
        for o in batch
        if o["path"].endswith(_SHARD)
    )
    raw = bytes(obstore.get(raw_store(s3_url), name).bytes())
    obstore.put(raw_store(s3_url), name, raw + b"\0")  # its HEAD and its GET agree
    verdict = store.verify(v)
    assert verdict.status == "rejected", verdict
    assert f"is {len(raw) + 1} bytes, the manifest records {len(raw)}" in (verdict.reason or "")


def _file_version(store: ArtifactStore, s3_url: str) -> tuple[str, str, dict[str, Any], int, int]:
    """A verified, promoted file version of two 128 KiB arrays (``a`` before
    ``z``), its checkpoint object's name, the tree, the object's size and
    where ``a`` ends in it."""
    tree = {k: np.arange(128 * 256, dtype=np.float32) + i for i, k in enumerate("az")}
    v = store.put(tree)
    assert store.verify(v).status == "verified"
    store.promote(v)
    name = f"versions/{v}/model.safetensors"
    raw = raw_store(s3_url)
    header = int.from_bytes(bytes(obstore.get_range(raw, name, start=0, length=8)), "little")
    meta = json.loads(bytes(obstore.get_range(raw, name, start=8, length=header)))
    size = int(obstore.head(raw, name)["size"])
    return v, name, tree, size, 8 + header + meta["['a']"]["data_offsets"][1]


def _cut_on_each_try(start: int, stop: int) -> str:
    """What the range ``[start, stop)`` cut to half its bytes on each of three
    tries says on the last: each try resumes where the last one's bytes ended."""
    for _ in range(2):
        start += (stop - start) // 2
    n = stop - start
    return f"its stream of the range at {start:,} ended after {n // 2:,} of its {n:,} bytes"


@pytest.mark.parametrize("kind", ["cut", "short"])
def test_a_file_version_s_range_cut_short_on_every_try_is_a_storage_error_naming_it(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str, kind: str
) -> None:
    store, honest = lying
    v, name, tree, size, a_end = _file_version(honest, s3_url)
    whole = _cut_on_each_try(1 << 16, size)  # the data past the first 64 KiB, in one GET
    part = _cut_on_each_try(1 << 16, a_end)  # a partial load asks for ``a``'s bytes only
    reads = [
        (lambda: store.load_version(v, tree), whole),
        (lambda: store.load_current(tree), whole),
        (lambda: store.load_version(v, tree["a"], subtree="['a']"), part),
        (lambda: store.promote(v), whole),  # its check reads every byte again
    ]
    for read, why in reads:
        liar.arm(kind, "GET", "model.safetensors", times=100, data=True)
        with pytest.raises(StorageError) as e:
            read()
        assert not isinstance(e.value, IntegrityError)  # nothing said of the stored bytes
        said = f"{s3_url}/{name}: reading {name} failed: {why} (on each of 3 tries)"
        assert liar.times == 97 and str(e.value).splitlines()[0] == said, str(e.value)
        assert "hint: the server or a proxy in front of it" in str(e.value)
    liar.times = 0
    assert np.array_equal(store.load_version(v, tree["a"], subtree="['a']"), tree["a"])


@pytest.mark.parametrize(
    ("kind", "data"),
    [("missing", False), ("missing", True), ("refuse", True)],
    ids=["404-first-bytes", "404-data", "412-data"],
)
def test_a_file_version_s_404_or_412_its_head_contradicts_is_read_again_then_a_storage_error(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str, kind: str, data: bool
) -> None:
    store, honest = lying
    v, name, tree, size, _ = _file_version(honest, s3_url)
    liar.arm(kind, "GET", "model.safetensors", data=data)  # once: read again
    assert np.array_equal(store.load_current(tree)["z"], tree["z"]) and liar.times == 0
    liar.arm(kind, "GET", "model.safetensors", times=100, data=data)
    with pytest.raises(StorageError) as e:
        store.load_version(v, tree)
    # never "its checkpoint object is missing", nor "the object was replaced" (a 412 for
    # the ETag asked for, which the object's HEAD gives)
    assert not isinstance(e.value, IntegrityError)
    answer = (
        f"a 404, its HEAD {size:,} bytes"
        if kind == "missing"
        else "a 412 for the ETag its HEAD gives"
    )
    said = f"{s3_url}/{name}: reading {name} failed: its answer was {answer} (on each of 3 tries)"
    assert liar.times == 97 and str(e.value).splitlines()[0] == said, str(e.value)
    assert "hint: the server or a proxy in front of it answers otherwise" in str(e.value)


def test_a_file_version_s_answers_of_another_length_on_every_try_are_a_storage_error(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str
) -> None:
    store, honest = lying
    v, name, tree, size, _ = _file_version(honest, s3_url)
    said = f"{s3_url}/{name}: reading {name} failed: its stream of the range at "
    # the first bytes cut to half, and the data's range with 100 bytes past its end
    for kind, data, why in [
        ("cut", False, "0 ended after 32,768 of its 65,536 bytes"),
        ("longer", True, f"65,536 ran past its {size - 65536:,} bytes: {size - 65436:,} or more"),
    ]:
        liar.arm(kind, "GET", "model.safetensors", times=100, data=data)
        with pytest.raises(StorageError) as e:
            store.load_version(v, tree)
        assert not isinstance(e.value, IntegrityError)
        first = str(e.value).splitlines()[0]
        assert liar.times == 97 and first.startswith(said + why), first
        assert first.endswith(" (on each of 3 tries)"), first
        liar.arm(kind, "GET", "model.safetensors", data=data)  # once: read again
        assert np.array_equal(store.load_version(v, tree)["z"], tree["z"]) and liar.times == 0
