"""Answers only the object's HEAD tells apart from the object, through a
lying proxy in front of a real SeaweedFS server: a sharded or a dedup
version's manifest answered 404 while its HEAD finds it. Each is read
again, and one that lies on every try is a ``StorageError`` naming the
object, never an ``IntegrityError`` about the version nor a ``rejected``
verdict, nor a gc that takes a version's tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import obstore
import pytest

from tests.store.buckets import raw_store, sharded_version
from tests.store.liars import Liar
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StorageError

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

#: Two arrays of 128 KiB: the data comes past the first ranged GET (64 KiB).
_TREE = {k: np.arange(128 * 256, dtype=np.float32) + i for i, k in enumerate("az")}


def _other(shift: float) -> dict[str, Any]:
    return {k: a + shift for k, a in _TREE.items()}


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
