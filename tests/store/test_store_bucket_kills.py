"""A writer SIGKILLed at random moments against a store in a bucket (a real
SeaweedFS S3 server): after every kill the store reads clean, the version
last acknowledged as promoted is still there and loads, no half-written
version is ever visible, and gc leaves nothing of the dead puts behind."""

from __future__ import annotations

import numpy as np
import obstore
import pytest

from tests.store.buckets import raw_store
from tests.store.storm import storm
from treeguard import ArtifactStore, RetentionPolicy


def _objects(url: str) -> set[str]:
    return {o["path"] for batch in obstore.list(raw_store(url)) for o in batch}


def _acknowledged(printed: str, before: str | None) -> str | None:
    """The version the writer last saw promoted, unless it then started a
    rollback (which forgets the version it leaves, by design)."""
    last = before
    for line in printed.splitlines():
        if line.startswith("promoted "):
            last = line.split()[1]
        elif line == "rolling back":
            last = None
    return last


def _consistent(url: str, acknowledged: str | None) -> None:
    store = ArtifactStore(url)
    listed = store.versions()
    assert not [v for v in listed if v.status == "unreadable"], listed
    names = [v.version for v in listed]
    assert len(names) == len(set(names))
    held = _objects(url)
    for v in listed:  # no half version: every record has its checkpoint, which loads
        assert f"versions/{v.version}/model.safetensors" in held, v
        assert store.load_version(v.version)["w"].shape == (64, 64)
    current, previous = store.current(), store.previous()
    if acknowledged is not None:
        assert acknowledged in (current, *store._pointer().previous), (acknowledged, current)
    for v in filter(None, (current, previous)):
        store.load_verified(v)  # every gate, every hash
    if current is not None:
        assert store.load_current()["w"].shape == (64, 64)
    store.gc(policy=RetentionPolicy(keep_last=2))  # a dead put's young objects may stay
    assert store.current() == current
    # the writer is dead: with no grace (as after a crash), nothing of its puts stays
    store.gc(policy=RetentionPolicy(keep_last=2, orphan_grace_s=0))
    assert store.current() == current
    left = {n.split("/")[1] for n in _objects(url) if n.startswith("versions/")}
    assert left == {v.version for v in store.versions()}


# In no xdist group (on its worker, the session's SeaweedFS server, one a
# worker): after the bucket races the reliability run's longest test, it
# starts right after one of them (``long``) rather than last, alone at the end.
@pytest.mark.reliability
@pytest.mark.long(120)
def test_a_writer_killed_at_random_moments_leaves_a_bucket_store_consistent(
    s3_url: str,
) -> None:
    ArtifactStore.init(s3_url)
    acknowledged: list[str | None] = [None]

    def check(printed: str) -> None:
        acknowledged[0] = _acknowledged(printed, acknowledged[0])
        _consistent(s3_url, acknowledged[0])

    assert storm(s3_url, check, longest=3.0) >= 30
    assert np.isfinite(ArtifactStore(s3_url).load_current()["w"]).all()
