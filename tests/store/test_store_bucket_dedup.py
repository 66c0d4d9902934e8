"""Tensors stored once per content in a bucket (``dedup=True``): create-only
tensor objects keyed by digest, every load checking every byte, gc
deleting a tensor only once no version refers to it, export writing the one
plain file, file versions put before dedup still usable, and a gc during a
put leaving the tensors it uploaded (younger than the grace) unmarked."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import jax
import numpy as np
import obstore
import pytest
import safetensors.numpy

from tests.s3server import Lie, LyingProxy, Request, S3Server
from tests.store.buckets import raw_store
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy
from treeguard.provenance import generate_keys

# Every test here talks to the session's SeaweedFS server.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]


def _tree(head: float = 0.0) -> dict[str, Any]:
    return {
        "body": {f"l{i}": np.full((32, 8), i, np.float32) for i in range(4)},
        "head": np.full(8, head, np.float32),
    }


def _objects(url: str) -> set[str]:
    return {
        o["path"].split("/", 1)[1]
        for batch in obstore.list(raw_store(url), prefix="tensors/")
        for o in batch
    }


def _same(a: Any, b: Any) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def test_the_dedup_lifecycle_in_a_bucket(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url, dedup=True)
    v1 = store.put(_tree(0.0))
    first = _objects(s3_url)
    assert len(first) == 5
    v2 = store.put(_tree(1.0))
    assert len(_objects(s3_url) - first) == 1  # the changed head only
    held = _objects(s3_url)
    v3 = store.put(_tree(1.0))
    assert _objects(s3_url) == held  # an identical version: a manifest only
    for v in (v1, v2, v3):
        assert store.info(v).kind == "tensors"
        assert store.verify(v).status == "verified"
    store.promote(v1)
    store.promote(v3)
    assert _same(store.load_current(_tree()), _tree(1.0))
    assert store.load_current(subtree="['head']")[0] == 1.0
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == [v2]
    assert _objects(s3_url) == held  # v2's tensors are v1's and v3's
    assert store.rollback() == v1
    assert _same(store.load_current(_tree()), _tree(0.0))


def test_a_fine_tune_in_a_bucket_uploads_only_the_changed_tensor(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url, dedup=True)
    v1 = store.put(_tree(0.0))
    assert store.verify(v1).status == "verified"
    store.promote(v1)
    params = store.load_current(jax.tree.map(jax.numpy.asarray, _tree()))  # digests remembered
    held = _objects(s3_url)
    v2 = store.put({**params, "head": params["head"] + 5})
    assert len(_objects(s3_url) - held) == 1  # the head; the body named from its digests
    assert store.verify(v2).status == "verified"
    assert _same(store.load_version(v2, like=_tree()), _tree(5.0))


def test_gc_in_a_bucket_removes_only_unshared_tensors(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url, dedup=True)
    versions = [store.put(_tree(float(i))) for i in range(3)]
    assert store.gc(policy=RetentionPolicy(keep_last=1)) == versions[:2]
    # the tensors no version names now are younger than the grace: a put may be naming them
    assert len(_objects(s3_url)) > 4 + 1
    assert store.gc(policy=RetentionPolicy(keep_last=1, orphan_grace_s=0)) == []
    assert len(_objects(s3_url)) == 4 + 1
    assert _same(store.load_version(versions[2], like=_tree()), _tree(2.0))
    v = store.put(_tree(0.0))  # a head gc removed (and marked) is written anew
    assert _same(store.load_version(v, like=_tree()), _tree(0.0))


def test_a_tampered_tensor_object_in_a_bucket_is_refused_naming_it(s3_url: str) -> None:
    store = ArtifactStore.init(s3_url, dedup=True)
    v = store.put(_tree(7.0))
    assert store.verify(v).status == "verified"
    (head,) = [
        n
        for n in _objects(s3_url)
        if obstore.head(raw_store(s3_url), f"tensors/{n}")["size"] == 8 * 4
    ]
    obstore.put(raw_store(s3_url), f"tensors/{head}", np.full(8, 9.0, np.float32).tobytes())
    with pytest.raises(IntegrityError) as e:
        store.load_version(v)
    assert e.value.path == "['head']" and e.value.version == v
    with pytest.raises(IntegrityError):
        store.promote(v)


def test_export_and_file_versions_in_a_dedup_bucket(s3_url: str, tmp_path: Path) -> None:
    key, _ = generate_keys(tmp_path / "ci", curve="P-256")
    old = ArtifactStore.init(s3_url, signing_key=key)
    f = old.put(_tree(0.0))
    assert old.verify(f).status == "verified"
    store = ArtifactStore.init(s3_url, dedup=True, signing_key=key)
    t = store.put(_tree(3.0))
    assert (store.info(f).kind, store.info(t).kind) == ("file", "tensors")
    assert store.verify(t).status == "verified"
    store.promote(f)
    store.promote(t)
    store.export(t, tmp_path / "out")
    plain = safetensors.numpy.load_file(tmp_path / "out" / "model.safetensors")
    assert plain["['head']"][0] == 3.0
    assert store.rollback() == f
    assert _same(store.load_current(_tree()), _tree(0.0))


@pytest.mark.parametrize("grace", [3600.0, 0.0])
def test_a_gc_during_a_dedup_put_marks_none_of_its_young_tensors(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch, grace: float
) -> None:
    store = ArtifactStore.init(s3_url, dedup=True)
    removed: list[list[str]] = []
    once = threading.Lock()

    def gc_before_the_manifest(req: Request) -> Lie | None:
        # the put's tensors are uploaded, the manifest that names them is not
        if req.method == "PUT" and req.key.endswith("/tensors.json") and once.acquire(False):
            removed.append(store.gc(policy=RetentionPolicy(keep_last=0, orphan_grace_s=grace)))
        return None

    with LyingProxy(s3_server.endpoint, gc_before_the_manifest) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        v = ArtifactStore(s3_url).put(_tree(3.0))
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    assert removed == [[]]
    marked = list(obstore.list(raw_store(s3_url), prefix="doomed/"))
    names = _objects(s3_url)
    if grace:  # left alone: the put wrote each tensor once, under its digest
        assert marked == [] and len(names) == 5 and not any("." in n for n in names)
    else:  # what the grace prevents: gc took them, the put wrote them again under new names
        assert marked and len(names) == 5 and all("." in n for n in names)
    assert _same(store.load_version(v, like=_tree()), _tree(3.0))
