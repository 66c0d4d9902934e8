"""The store in a bucket, against a real SeaweedFS S3 server."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np
import obstore
import pytest
from click.testing import CliRunner, Result

from tests.s3server import CuttingProxy, S3Server
from tests.store.buckets import raw_store
from treeguard import (
    ArtifactStore,
    ConflictError,
    DanglingPointerError,
    IntegrityError,
    RetentionPolicy,
    RetiredVersionError,
    SignatureError,
    StorageError,
    StoreError,
    UnknownVersionError,
    read_header,
)
from treeguard._cli.main import main
from treeguard._src.store import lifecycle  # _src: a race between two steps of gc
from treeguard.examples import mlp

# Every test here talks to the session's SeaweedFS server: the slow run starts
# it, on the one worker that runs the group.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

KEY = b"k" * 32


def _params(seed: int = 0) -> Any:
    return mlp.init(jax.random.key(seed))


def _fetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "treeguard-fetch"]


def _names(url: str) -> set[str]:
    return {o["path"] for batch in obstore.list(raw_store(url)) for o in batch}


def test_the_lifecycle_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    assert store.root == s3_url and store.current() is None
    p1, p2 = _params(0), _params(1)
    v1 = store.put(p1, metadata={"step": 1})
    assert store.info(v1).status == "candidate" and store.info(v1).metadata == {"step": 1}
    assert store.verify(v1).status == "verified"
    store.promote(v1)
    got = store.load_current(p1)
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(p1), strict=True)
    )
    v2 = store.put(p2)
    assert store.verify(v2).status == "verified"
    store.promote(v2)
    assert (store.current(), store.previous()) == (v2, v1)
    assert store.rollback() == v1 and store.current() == v1
    v3 = store.put(p2)
    v4 = store.put(p2)
    removed = store.gc(policy=RetentionPolicy(keep_last=1))
    # v1 is current (rolled back to, so the stack above it is gone), v4 the newest
    assert removed == [v2, v3]
    assert [v.version for v in store.versions()] == [v1, v4]
    with pytest.raises(StoreError, match="never reused"):
        store.put(p1, version=v3)
    assert store.put(p1) == "v000005"  # the retired name is skipped
    actions = [e.action for e in store.history()]
    assert actions[0] == "init" and actions.count("promote") == 2 and "gc" in actions
    assert not any(n.startswith("versions/v000003/") for n in _names(s3_url))


def test_a_verdict_is_never_replaced(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v = store.put(_params())
    store.verify(v)
    with pytest.raises(StoreError, match="a verdict in a bucket is never replaced"):
        store.verify(v)


def test_two_putters_of_one_name_one_wins(s3_url: str) -> None:
    stores = [ArtifactStore.init(s3_url), ArtifactStore(s3_url)]
    outcomes: list[str] = []
    start = threading.Barrier(2)

    def put(s: ArtifactStore) -> None:
        start.wait(timeout=30)
        try:
            outcomes.append(s.put(_params(), version="release"))
        except StoreError as e:
            outcomes.append(e.message)

    threads = [threading.Thread(target=put, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["release", "version release already exists"]


def test_racing_promoters_never_both_win(s3_url: str) -> None:
    first = ArtifactStore.init(s3_url)
    versions = [first.put(_params(i)) for i in range(4)]
    for v in versions:
        first.verify(v)
    stores = [ArtifactStore(s3_url) for _ in versions]
    won: list[str] = []
    lost: list[ConflictError] = []
    start = threading.Barrier(len(versions))

    def promote(s: ArtifactStore, v: str) -> None:
        start.wait(timeout=30)
        try:
            s.promote(v)
            won.append(v)
        except ConflictError as e:
            lost.append(e)

    threads = [
        threading.Thread(target=promote, args=(s, v)) for s, v in zip(stores, versions, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(won) + len(lost) == len(versions)
    # every promote that returned is in the history, in the order the pointer took
    promoted = [e.version for e in first.history() if e.action == "promote"]
    assert sorted(promoted) == sorted(won)
    assert first.current() in won
    for e in lost:
        assert e.version in versions and "another process moved the pointer first" in str(e)


def _signed_with_a_candidate(s3_url: str) -> tuple[ArtifactStore, str, str]:
    """A store with a key: v1 verified and current, v2 put and not verified."""
    signed = ArtifactStore.init(s3_url, key=KEY)
    v1 = signed.put(_params(0))
    signed.verify(v1)
    signed.promote(v1)
    return signed, v1, signed.put(_params(1))


def test_a_signed_store_refuses_a_forged_unsigned_verdict(s3_url: str) -> None:
    signed, v1, v2 = _signed_with_a_candidate(s3_url)
    forged = ArtifactStore(s3_url)  # no key: it may not write a verdict
    with pytest.raises(SignatureError, match="opened without its key"):
        forged.verify(v2)
    # a verdict object written behind the store, unsigned
    obstore.put(
        raw_store(s3_url),
        f"versions/{v2}/verdict.json",
        json.dumps({"status": "verified", "digest": signed.info(v1).digest}).encode(),
    )
    with pytest.raises(SignatureError, match="is not signed, and this store has a key"):
        signed.promote(v2)
    with pytest.raises(SignatureError, match="opened without its key"):
        forged.load_current(_params(0))
    assert signed.current() == v1


def test_a_signed_store_refuses_a_forged_rejected_verdict_as_forged(s3_url: str) -> None:
    signed, v1, v2 = _signed_with_a_candidate(s3_url)
    raw = raw_store(s3_url)
    # an unsigned rejected verdict written behind the store, on a candidate
    obstore.put(
        raw,
        f"versions/{v2}/verdict.json",
        json.dumps({"status": "rejected", "reason": "forged"}).encode(),
    )
    with pytest.raises(
        SignatureError, match=f"version {v2}'s verdict is not signed, .*never replaced"
    ) as e:
        signed.verify(v2)
    assert e.value.version == v2
    with pytest.raises(SignatureError, match=f"version {v2}'s verdict is not signed"):
        signed.promote(v2)
    # the current version's signed verdict turned into a rejected one, its signature kept
    verdict = json.loads(bytes(obstore.get(raw, f"versions/{v1}/verdict.json").bytes()))
    obstore.put(
        raw, f"versions/{v1}/verdict.json", json.dumps(verdict | {"status": "rejected"}).encode()
    )
    forged = f"version {v1}'s verdict signature does not match"
    with pytest.raises(SignatureError, match=forged):
        signed.load_current(_params(0))
    with pytest.raises(SignatureError, match=forged):
        signed.check_verified(v1)
    # listed as the objects say, never a crash
    assert [(v.version, v.status) for v in signed.versions()] == [
        (v1, "rejected"),
        (v2, "rejected"),
    ]
    assert signed.current() == v1


def test_an_object_replaced_behind_the_store_is_an_integrity_error(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = store.put(_params(0))
    store.verify(v1)
    store.promote(v1)
    v2 = store.put(_params(1))
    store.verify(v2)
    raw = raw_store(s3_url)
    other = bytes(obstore.get(raw, f"versions/{v2}/model.safetensors").bytes())
    obstore.put(raw, f"versions/{v1}/model.safetensors", other)
    with pytest.raises(IntegrityError, match="version v000001: its checkpoint") as e:
        store.load_current(_params(0))
    assert e.value.version == v1
    with pytest.raises(IntegrityError, match="version v000001"):
        store.load_version(v1)
    store.promote(v2)
    with pytest.raises(
        StoreError,
        match=r"skipped v000001: \S+/versions/v000001/model.safetensors: version v000001: its chec",
    ):
        store.rollback()
    assert store.current() == v2
    for junk in (b"not a checkpoint", b""):
        obstore.put(raw, f"versions/{v2}/model.safetensors", junk)
        with pytest.raises(IntegrityError, match="version v000002: its checkpoint no longer"):
            store.load_current(_params(1))


def test_a_candidate_replaced_before_verify_is_rejected(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    raw = raw_store(s3_url)
    obstore.put(
        raw,
        f"versions/{v1}/model.safetensors",
        bytes(obstore.get(raw, f"versions/{v2}/model.safetensors").bytes()),
    )
    info = store.verify(v1)
    assert info.status == "rejected" and "not the one recorded at put" in (info.reason or "")


def test_a_prefix_that_is_not_a_store_is_refused_and_nothing_created(s3_url: str) -> None:
    store = ArtifactStore(s3_url)
    for call in (
        store.current,
        store.versions,
        store.history,
        lambda: store.put(_params()),
        lambda: store.gc(),
        lambda: store.promote("v000001"),
    ):
        with pytest.raises(StoreError, match="not a store: the prefix holds no STORE.json"):
            call()
    assert _names(s3_url) == set()
    obstore.put(raw_store(s3_url), "someone-elses.txt", b"x")
    with pytest.raises(StoreError, match="holds objects but no store marker"):
        ArtifactStore.init(s3_url)
    assert _names(s3_url) == {s3_url.split("/", 3)[3] + "/someone-elses.txt"} or _names(s3_url) == {
        "someone-elses.txt"
    }


def test_gc_refuses_a_missing_pointer_and_keeps_foreign_objects(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    versions = [store.put(_params(i)) for i in range(3)]
    store.verify(versions[0])
    store.promote(versions[0])
    obstore.put(raw_store(s3_url), f"versions/{versions[1]}/notes.txt", b"mine")
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == [versions[2]]
    obstore.delete(raw_store(s3_url), "CURRENT.json")
    with pytest.raises(StoreError, match="the pointer is damaged: it is missing"):
        store.gc(policy=RetentionPolicy(keep_last=0))
    assert {v.version for v in store.versions()} == set(versions[:2])


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, ["store", *args])


def test_the_store_commands_on_a_bucket(s3_url: str) -> None:
    assert _cli("ls", s3_url).exit_code == 2  # not a store yet
    done = _cli("init", s3_url)
    assert done.exit_code == 0 and s3_url in done.output
    store = ArtifactStore(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    assert _cli("promote", s3_url, v1).exit_code == 1  # a candidate
    for v in (v1, v2):
        assert _cli("verify", s3_url, v).exit_code == 0
    assert _cli("promote", s3_url, v1).exit_code == 0
    assert _cli("promote", s3_url, v2).exit_code == 0
    listed = json.loads(_cli("ls", s3_url, "--json").output)
    assert (listed["root"], listed["current"], listed["previous"]) == (s3_url, v2, v1)
    assert [v["status"] for v in listed["versions"]] == ["verified", "verified"]
    done = _cli("rollback", s3_url)
    assert done.exit_code == 0 and f"{v2} -> {v1}" in done.output
    v3 = store.put(_params(2))
    store.put(_params(3))
    done = _cli("gc", s3_url, "--keep", "1")
    assert done.exit_code == 0 and f"removed 2: {v2}, {v3}" in done.output
    assert store.current() == v1


def test_a_verdict_object_cannot_change_what_was_recorded_at_put(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    store.verify(v2)
    raw = raw_store(s3_url)
    obstore.put(
        raw,
        f"versions/{v1}/model.safetensors",
        bytes(obstore.get(raw, f"versions/{v2}/model.safetensors").bytes()),
    )
    forged = {"status": "rejected", "stored_digest": store.info(v2).digest, "uid": "x"}
    obstore.put(raw, f"versions/{v1}/verdict.json", json.dumps(forged).encode())
    with pytest.raises(
        IntegrityError, match="version v000001: its checkpoint changed since it was put"
    ):
        store.load_version(v1)


def _flip_tensor(s3_url: str, version: str, tensor: str, tmp_path: Path) -> None:
    """Replaces the version's object behind the store by one whose bytes of
    ``tensor`` are changed (its header, and so its digest, unchanged)."""
    raw = raw_store(s3_url)
    name = f"versions/{version}/model.safetensors"
    data = bytearray(bytes(obstore.get(raw, name).bytes()))
    local = tmp_path / "copy.safetensors"
    local.write_bytes(data)
    header = read_header(local)
    t = next(t for t in header.tensors if t.name == tensor)
    data[header.data_start + t.begin] ^= 0xFF
    obstore.put(raw, name, bytes(data))


def test_a_partial_load_from_a_bucket_reads_only_what_it_selects(
    s3_url: str, tmp_path: Path
) -> None:
    store = ArtifactStore.init(s3_url)
    params = _params(0)
    v = store.put(params)
    store.verify(v)
    store.promote(v)
    _flip_tensor(s3_url, v, "['dense1']['w']", tmp_path)
    got = store.load_current(params["dense2"], subtree="['dense2']")
    assert np.array_equal(got["w"], params["dense2"]["w"])
    kept = {"dense2": params["dense2"]}
    got = store.load_version(v, kept, ignore=["['dense1']"])
    assert np.array_equal(got["dense2"]["b"], params["dense2"]["b"])
    with pytest.raises(IntegrityError, match=r"(?s)version v000001: .*\['dense1'\]\['w'\]"):
        store.load_current(params)
    with pytest.raises(IntegrityError, match=r"(?s)version v000001: .*\['dense1'\]\['w'\]"):
        store.load_verified(v, params["dense1"], subtree="['dense1']")
    assert not _fetch_threads()  # joined on the way out of a failed load


def test_a_partial_load_fetches_the_header_and_the_selected_ranges_only(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = ArtifactStore.init(s3_url)
    tree = {name: np.full(1 << 18, i, np.float32) for i, name in enumerate("abcd")}
    v = store.put(tree)
    local = tmp_path / "v.safetensors"
    local.write_bytes(
        bytes(obstore.get(raw_store(s3_url), f"versions/{v}/model.safetensors").bytes())
    )
    header = read_header(local)
    by_name = {t.name: t for t in header.tensors}
    b, c = by_name["['b']"], by_name["['c']"]
    data = [(header.data_start + t.begin, header.data_start + t.end) for t in header.tensors]

    def through_proxy(load: Any) -> tuple[Any, list[tuple[int, int]], int]:
        """What ``load`` returns, the ranges past the header's first read it
        asked for, and the bytes the server answered (every object)."""
        with CuttingProxy(s3_server.endpoint, after=1 << 40, cuts=0) as proxy:
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
            got = load(ArtifactStore(s3_url))
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
        # the header's first bytes (one range from 0), then the data's ranges
        assert [r for r in proxy.ranges if r[0] == 0] == [(0, 1 << 16)]
        return got, [r for r in proxy.ranges if r[0] > 0], proxy.answered

    want = {"b": tree["b"], "c": tree["c"]}
    got, ranges, answered = through_proxy(
        lambda s: s.load_version(v, want, ignore=["['a']", "['d']"])
    )
    assert np.array_equal(got["b"], tree["b"]) and np.array_equal(got["c"], tree["c"])
    # b and c lie side by side: one ranged GET of exactly their bytes, none of a or d
    assert ranges == [(header.data_start + b.begin, header.data_start + c.end)]
    # plus the header's first read and the small objects' answers, HTTP headers included
    assert answered < b.nbytes + c.nbytes + (1 << 16) + (1 << 15)
    got, ranges, answered = through_proxy(lambda s: s.load_version(v, tree["c"], subtree="['c']"))
    assert np.array_equal(got, tree["c"])
    assert ranges == [(header.data_start + c.begin, header.data_start + c.end)]
    assert answered < c.nbytes + (1 << 16) + (1 << 15)
    # the whole load, for scale: every tensor's bytes
    _, _, whole = through_proxy(lambda s: s.load_version(v, tree))
    assert whole >= sum(stop - start for start, stop in data)


def test_a_put_killed_between_its_data_and_its_record_leaves_nothing_visible(
    s3_url: str,
) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = store.put(_params(0))
    raw = raw_store(s3_url)
    data = bytes(obstore.get(raw, f"versions/{v1}/model.safetensors").bytes())
    # what a put killed after its checkpoint object and before its record leaves
    obstore.put(raw, "versions/v000002/model.safetensors", data)
    assert [v.version for v in store.versions()] == [v1]  # never a candidate
    with pytest.raises(StoreError, match="version v000002 already exists"):
        store.put(_params(1), version="v000002")
    assert store.put(_params(1)) == "v000003"
    # younger than the grace, it is left (a put could still be writing its record)
    assert store.gc(policy=RetentionPolicy(keep_last=10)) == []
    assert [v.version for v in store.versions()] == [v1, "v000003"]
    # once older, gc removes it, whatever the policy keeps, and retires its name
    assert store.gc(policy=RetentionPolicy(keep_last=10, orphan_grace_s=0)) == ["v000002"]
    assert not any(n.startswith("versions/v000002/") for n in _names(s3_url))
    with pytest.raises(StoreError, match="never reused"):
        store.put(_params(1), version="v000002")
    assert [v.version for v in store.versions()] == [v1, "v000003"]


def test_a_gc_killed_between_its_deletes_leaves_no_half_version(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2, v3 = (store.put(_params(i)) for i in range(3))
    store.verify(v2)
    store.verify(v3)
    store.promote(v3)
    raw = raw_store(s3_url)
    # a remove of v2 killed after its record went: its verdict and data remain
    obstore.put(raw, f"retired/{v2}", b"")
    obstore.delete(raw, f"versions/{v2}/status.json")
    # a remove of v1 killed after it retired the name, before any delete
    obstore.put(raw, f"retired/{v1}", b"")
    assert [v.version for v in store.versions()] == [v1, v3]  # v1 is whole, v2 is gone
    assert store.load_version(v1)["dense1"]["w"].shape == _params()["dense1"]["w"].shape
    with pytest.raises(UnknownVersionError, match=f"version {v2} does not exist"):
        store.load_version(v2)
    assert sorted(store.gc(policy=RetentionPolicy(keep_last=0))) == [v1, v2]
    assert {n.split("/")[1] for n in _names(s3_url) if n.startswith("versions/")} == {v3}
    assert [v.version for v in store.versions()] == [v3]


def test_gc_deletes_a_clock_object_a_killed_gc_left_once_it_is_as_old_as_the_grace(
    s3_url: str,
) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = store.put(_params(1))
    raw = raw_store(s3_url)
    obstore.put(raw, "clock/0123456789abcdef", b"")  # a gc killed between its write and delete
    assert store.gc() == []
    assert "clock/0123456789abcdef" in _names(s3_url)  # younger than the hour's grace
    assert store.gc(policy=RetentionPolicy(orphan_grace_s=0)) == []
    assert not [n for n in _names(s3_url) if n.startswith("clock/")]
    assert [v.version for v in store.versions()] == [v1]


def test_a_version_gc_removes_while_it_is_read_is_unknown_not_damaged(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1 = store.put(_params(0))
    raw = raw_store(s3_url)
    # the record was read, then gc retired the name and deleted the data
    record = store.info(v1)
    obstore.put(raw, f"retired/{v1}", b"")
    obstore.delete(raw, f"versions/{v1}/model.safetensors")
    with pytest.raises(
        UnknownVersionError, match=f"version {v1} was removed by gc while it was read"
    ):
        store.load_version(v1)
    assert record.status == "candidate"
    obstore.delete(raw, f"retired/{v1}")  # the data gone and the name never retired: damage
    with pytest.raises(IntegrityError, match="its checkpoint object is missing"):
        store.load_version(v1)


def test_a_plain_http_endpoint_without_allow_http_names_the_variable(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ALLOW_HTTP")
    for command in ("ls", "init"):
        done = _cli(command, s3_url)
        assert done.exit_code == 2, done.output
        assert "the endpoint is plain http and AWS_ALLOW_HTTP is not set" in done.output
        assert "set AWS_ALLOW_HTTP=true" in done.output
        assert "GenericError" not in done.output


def test_a_missing_bucket_is_said_to_be_missing(s3_url: str) -> None:
    url = "s3://no-such-bucket-here/models"
    for command in ("ls", "init", "gc"):
        done = _cli(command, url)
        assert done.exit_code == 2, done.output
        assert "the bucket no-such-bucket-here does not exist" in done.output, done.output
        assert "aws s3 mb s3://no-such-bucket-here" in done.output
        assert "store init" not in done.output and "404" not in done.output
    with pytest.raises(StorageError, match="does not exist"):
        ArtifactStore(url).put(_params(0))


def test_gc_stops_on_a_pointer_naming_an_absent_version_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    for v in (v1, v2):
        store.verify(v)
        store.promote(v)
    raw = raw_store(s3_url)
    pointer = json.loads(bytes(obstore.get(raw, "CURRENT.json").bytes()))
    obstore.put(raw, "CURRENT.json", json.dumps({**pointer, "current": "v000009"}).encode())
    with pytest.raises(DanglingPointerError, match="names version v000009 as current"):
        store.gc(policy=RetentionPolicy(keep_last=0))
    assert [v.version for v in store.versions()] == [v1, v2]  # the real current one is kept
    assert store.repair(v2) == ["v000009"]
    assert (store.current(), store.previous()) == (v2, v1)
    assert store.gc(policy=RetentionPolicy(keep_last=0)) == []


def test_promote_and_rollback_refuse_a_name_gc_retired_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2, v3 = store.put(_params(0)), store.put(_params(1)), store.put(_params(2))
    for v in (v1, v2, v3):
        store.verify(v)
    store.promote(v1)
    store.promote(v2)
    for v in (v1, v3):  # as a gc leaves them between retiring the names and deleting
        obstore.put(raw_store(s3_url), f"retired/{v}", b"")
    with pytest.raises(RetiredVersionError, match=f"version {v3} was retired by gc"):
        store.promote(v3)
    with pytest.raises(StoreError, match=f"skipped {v1}: .*{v1} was retired by gc"):
        store.rollback()
    assert store.current() == v2


def test_a_version_recorded_and_promoted_after_gc_listed_it_unrecorded_is_kept(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc lists while a put is between its data and its record; the put ends,
    and the version is verified and promoted after gc's fence, before it
    deletes: gc decided on a put that died, not on this version, and leaves it."""
    store, other = ArtifactStore.init(s3_url), ArtifactStore(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    for v in (v1, v2):
        store.verify(v)
    store.promote(v1)
    listing, fence = lifecycle.listing, lifecycle._fence

    def listed_mid_put(backend: Any) -> tuple[list[str], list[Any]]:
        names, listed = listing(backend)
        return names, [v for v in listed if v.version != v2]  # v2's record not yet there

    def promoted_meanwhile(backend: Any) -> set[str]:
        spared = fence(backend)
        other.promote(v2)  # after the fence: v2 was not retired, so it may be promoted
        return spared

    monkeypatch.setattr(lifecycle, "listing", listed_mid_put)
    monkeypatch.setattr(lifecycle, "_fence", promoted_meanwhile)
    assert v2 not in store.gc(policy=RetentionPolicy(keep_last=0))
    monkeypatch.undo()
    assert store.current() == v2 and store.load_current(_params(1)) is not None
