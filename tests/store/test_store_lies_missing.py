"""A bucket that answers 404 for an object it holds (a proxy, or a gateway
not yet consistent), through a lying proxy in front of a real SeaweedFS
server, about every small object whose absence the store acts on: a
version's record (``status.json``) and verdict, a retired name, the pointer,
the marker, a log event, an exported artifact, and an object just written
read back. Each such 404 is checked against the object's HEAD and read
again (``ObjectStorage.read(..., confirm_missing=True)``), so none makes gc
delete a version, a promote make a retired name current, a verdict miss
what it covers, or an error call a store damaged or not a store; one that
lies on every try is a ``StorageError`` naming the object."""

from __future__ import annotations

from typing import Any

import numpy as np
import obstore
import pytest
from obstore.store import S3Store

from tests.s3server import Request, S3Server
from tests.store.buckets import raw_store
from tests.store.liars import Liar
from treeguard import (
    ArtifactStore,
    NotAStoreError,
    RetentionPolicy,
    RetiredVersionError,
    StorageError,
    StoreError,
)
from treeguard._src.store import lifecycle  # _src: a promote between two steps of gc

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


def _params(value: float) -> dict[str, Any]:
    return {"w": np.full((16, 16), value, np.float32), "b": np.zeros(8, np.float32)}


def _verified(store: ArtifactStore, value: float) -> str:
    v = store.put(_params(value))
    assert store.verify(v).status == "verified"
    return v


def _lie_about(liar: Liar, pick: Any, times: int) -> None:
    """Answers 404 to the next ``times`` requests ``pick`` selects."""
    liar.kind, liar.times, liar.pick = "missing", times, pick


def test_a_verdict_answered_404_is_read_again_so_gc_keeps_the_newest_verified(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1, v2 = _verified(honest, 1.0), _verified(honest, 2.0)
    verdict = f"versions/{v2}/verdict.json"
    # before: v2 read as a candidate, so the older v1 was the verified one kept and v2 removed
    liar.arm("missing", "GET", verdict)
    assert store.gc(policy=RetentionPolicy(keep_last=0, keep_verified=1)) == [v1]
    assert liar.times == 0 and [v.version for v in honest.versions()] == [v2]
    liar.arm("missing", "GET", verdict)  # before: "v2 is candidate, not verified"
    store.promote(v2)
    assert honest.current() == v2
    liar.arm("missing", "GET", verdict, times=100)
    with pytest.raises(StorageError, match=rf"reading {verdict} failed: its answer was a 404"):
        store.load_current(_params(0.0))


def test_a_record_answered_404_is_read_again_so_repair_keeps_the_former_version(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v1, v2, v3 = (_verified(honest, x) for x in (1.0, 2.0, 3.0))
    honest.promote(v1)
    honest.promote(v2)
    # before: v1 was taken for a version the store does not hold, and dropped from the pointer
    liar.arm("missing", "GET", f"versions/{v1}/status.json")
    assert store.repair(v3) == []
    assert liar.times == 0 and (honest.current(), honest.previous()) == (v3, v1)


def test_a_retired_name_answered_404_is_read_again_so_a_promote_after_gc_s_fence_is_refused(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, honest = lying
    v1, v2 = _verified(honest, 1.0), _verified(honest, 2.0)
    honest.promote(v1)
    fence, promoted = lifecycle._fence, []

    def promote_after(backend: Any) -> set[str]:
        spared = fence(backend)  # gc retired v2, and now deletes what the pointer does not name
        liar.arm("missing", "GET", f"retired/{v2}")
        with pytest.raises(RetiredVersionError):  # before: promoted, then deleted by this gc
            store.promote(v2)
        promoted.append(liar.times == 0)
        return spared

    monkeypatch.setattr(lifecycle, "_fence", promote_after)
    assert honest.gc(policy=RetentionPolicy(keep_last=0)) == [v2]
    monkeypatch.undo()
    assert promoted == [True] and honest.current() == v1
    assert np.array_equal(honest.load_current(_params(0.0))["w"], _params(1.0)["w"])


def test_a_marker_answered_404_is_read_again_never_not_a_store(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v = honest.put(_params(1.0))
    for operation in (store.versions, lambda: ArtifactStore.init(store.root)):
        # before: NotAStoreError, or "the prefix holds objects but no store marker"
        liar.arm("missing", "GET", "STORE.json")
        operation()
        assert liar.times == 0
    assert [i.version for i in store.versions()] == [v]
    liar.arm("missing", "GET", "STORE.json", times=100)
    with pytest.raises(StorageError, match="reading STORE.json failed") as e:
        store.versions()
    assert not isinstance(e.value, NotAStoreError)


def test_log_events_answered_404_never_make_a_missing_pointer_an_empty_one(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str
) -> None:
    store, honest = lying
    v1, v2 = _verified(honest, 1.0), _verified(honest, 2.0)
    honest.promote(v2)
    raw = raw_store(s3_url)
    obstore.delete(raw, "CURRENT.json")  # damage: the log says it was moved
    events = {o["path"] for batch in obstore.list(raw, "log/") for o in batch}
    _lie_about(liar, lambda r: r.method == "GET" and any(r.key.endswith(e) for e in events), 100)
    # before: the log read as holding no promote, the pointer as never written: gc removed all
    with pytest.raises(StoreError, match="the pointer is damaged: it is missing"):
        store.gc(policy=RetentionPolicy(keep_last=0))
    assert liar.times < 100 and [v.version for v in honest.versions()] == [v1, v2]


def test_a_record_answered_404_after_gc_retired_a_dead_put_s_name_keeps_its_data(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, s3_url: str, s3_server: S3Server
) -> None:
    """gc looks for the record of a put it found without one, retires the
    name, and looks again: a put that wrote its record between the two (and
    found its name not yet retired) is finished, and the second look is
    answered 404."""
    store, honest = lying
    v = honest.put(_params(1.0))
    _, rest = s3_url.split("://", 1)
    bucket, _, prefix = rest.partition("/")
    direct = S3Store(bucket, prefix=prefix, endpoint=s3_server.endpoint)  # past the proxy
    status = f"versions/{v}/status.json"
    record = bytes(obstore.get(direct, status).bytes())
    obstore.delete(direct, status)  # the put between its data and its record when gc lists
    late: list[bool] = []

    def pick(req: Request) -> bool:
        if req.method == "PUT" and req.key.endswith(f"retired/{v}") and not late:
            obstore.put(direct, status, record)  # the put ends before gc retires its name
            late.append(True)
            return False
        return bool(late) and req.method == "GET" and req.key.endswith(status)

    _lie_about(liar, pick, 1)
    # before: gc took the second look's 404 and deleted the finished version's checkpoint
    assert store.gc(policy=RetentionPolicy(keep_last=10, orphan_grace_s=0)) == []
    assert late and liar.times == 0
    assert np.array_equal(honest.load_version(v, _params(0.0))["w"], _params(1.0)["w"])


@pytest.mark.parametrize("times", [2, 100], ids=["twice", "always"])
def test_a_pointer_answered_404_is_read_again_never_called_damaged(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, times: int
) -> None:
    store, honest = lying
    v1, v2 = _verified(honest, 1.0), _verified(honest, 2.0)
    honest.promote(v1)
    operations = [
        lambda: store.promote(v2),
        store.rollback,
        lambda: store.load_current(_params(0.0)),
        lambda: store.gc(policy=RetentionPolicy(keep_last=2)),
    ]
    for operation in operations:
        liar.arm("missing", "GET", "CURRENT.json", times=times)
        if times == 2:  # before: "the pointer is damaged: it is missing"
            operation()
            assert liar.times == 0
        else:
            with pytest.raises(StorageError, match="reading CURRENT.json failed: its answer was"):
                operation()
    assert [v.version for v in honest.versions()] == [v1, v2]
    assert honest.current() == v1


@pytest.mark.parametrize(
    ("leaf", "nth"),
    [("CURRENT.json", 1), ("CURRENT.json", 2), ("status.json", 1)],
    ids=["pointer-swap", "pointer-id", "record"],
)
def test_an_object_written_then_answered_404_is_read_again_and_the_write_taken(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar, leaf: str, nth: int
) -> None:
    """The ``nth`` read of ``leaf`` after its write is answered 404: the
    storage's own read back (1), or the pointer's, for its id (2)."""
    store, honest = lying
    v1, v2 = _verified(honest, 1.0), _verified(honest, 2.0)
    honest.promote(v1)
    seen: list[int] = []

    def after_a_write(req: Request) -> bool:
        if req.key.endswith(leaf) and req.method == "PUT":
            seen.append(0)
        elif req.key.endswith(leaf) and req.method == "GET" and seen:
            seen[-1] += 1
            return seen[-1] == nth
        return False

    _lie_about(liar, after_a_write, 1)
    # before: "the server acknowledged it, but reading it back found no such object"
    # (or "but the pointer does not hold it"), for a write it had made
    if leaf == "CURRENT.json":
        store.promote(v2)
        assert honest.current() == v2
    else:
        v3 = store.put(_params(3.0))
        assert honest.info(v3).status == "candidate"
    assert liar.times == 0


def test_an_exported_artifact_answered_404_is_read_again_and_covered_by_the_verdict(
    lying: tuple[ArtifactStore, ArtifactStore], liar: Liar
) -> None:
    store, honest = lying
    v = honest.put(_params(1.0))
    honest.attach_exported(v, b"a function", {"platforms": ["cpu"]})
    # before: the verdict, never replaced in a bucket, recorded no artifact: "uncovered"
    liar.arm("missing", "GET", "exported.json", times=2)
    assert store.verify(v).status == "verified"
    peeked = honest.peek_exported(v)
    assert liar.times == 0 and peeked is not None and peeked[0] == "covered", peeked
    for leaf in ("exported.json", "exported.bin"):
        liar.arm("missing", "GET", leaf)  # before: "holds no exported artifact", "absent now"
        assert store.load_exported(v)[1] == b"a function"
        assert liar.times == 0
