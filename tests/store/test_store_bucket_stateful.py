"""The store in a bucket as a state machine, on a real SeaweedFS server:
put, verify, promote, rollback, gc, loads and objects replaced behind the
store, interleaved at random by hypothesis.

After every step: the current version loads and equals what was put under
its name, or (its object replaced) is refused with an ``IntegrityError``;
every version the pointer remembers is still listed; no name is handed out
twice.
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
import obstore
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from obstore.store import S3Store

from tests.s3server import S3Server
from treeguard import ArtifactStore, IntegrityError, RetentionPolicy, StoreError

KEY = b"b" * 32


def _params(scale: float) -> dict[str, Any]:
    return {"w": np.full((8, 4), scale, np.float32), "b": np.full(2, scale, np.float32)}


class BucketMachine(RuleBasedStateMachine):
    """One store under a fresh prefix of the session's bucket."""

    def __init__(self) -> None:
        super().__init__()
        name = f"machine-{secrets.token_hex(6)}"
        self.url = f"s3://treeguard/{name}"
        self.raw = S3Store("treeguard", prefix=name, config={"conditional_put": "etag"})
        self.store = ArtifactStore(self.url, key=KEY)
        self.scales: dict[str, float] = {}
        self.replaced: set[str] = set()
        self.holds: dict[str, str] = {}  # version -> the version whose bytes its object holds
        # every version's scale as written, kept after gc removes the version: an
        # object may still hold the bytes of a version gc has since removed
        self.written: dict[str, float] = {}
        self.names: list[str] = []

    @initialize()
    def make(self) -> None:
        ArtifactStore.init(self.url, key=KEY)

    @rule(scale=st.sampled_from([0.5, 1.0, 2.0, float("nan")]))
    def put(self, scale: float) -> None:
        v = self.store.put(_params(scale))
        assert v not in self.names
        self.names.append(v)
        self.scales[v] = scale
        self.written[v] = scale

    @precondition(lambda self: self.scales)
    @rule(data=st.data())
    def verify(self, data: st.DataObject) -> None:
        v = data.draw(st.sampled_from(sorted(self.scales)))
        if self.store.info(v).status != "candidate":
            with pytest.raises(StoreError, match="never replaced"):
                self.store.verify(v, checks=[lambda t: bool(np.isfinite(t["w"]).all())])
            return
        info = self.store.verify(v, checks=[lambda t: bool(np.isfinite(t["w"]).all())])
        finite = not np.isnan(self.scales[v])
        assert info.status == ("verified" if finite and v not in self.replaced else "rejected")

    @precondition(lambda self: self.scales)
    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        v = data.draw(st.sampled_from(sorted(self.scales)))
        status = self.store.info(v).status
        if status != "verified":
            with pytest.raises(StoreError, match="not verified"):
                self.store.promote(v)
        elif v in self.replaced:
            with pytest.raises(IntegrityError, match=f"version {v}"):
                self.store.promote(v)
        else:
            self.store.promote(v)
            assert self.store.current() == v

    @rule()
    def rollback(self) -> None:
        before = self.store.current()
        try:
            now = self.store.rollback()
        except StoreError:
            assert self.store.current() == before
            return
        assert now not in self.replaced and self.store.current() == now

    @rule(keep=st.integers(0, 2))
    def gc(self, keep: int) -> None:
        for v in self.store.gc(policy=RetentionPolicy(keep_last=keep)):
            self.scales.pop(v)
            self.replaced.discard(v)

    @precondition(lambda self: len(self.scales) >= 2)
    @rule(data=st.data())
    def replace_behind_the_store(self, data: st.DataObject) -> None:
        a, b = data.draw(st.permutations(sorted(self.scales)))[:2]
        source = self.holds.get(b, b)  # b's object may hold another version's bytes by now
        held = self.written[self.holds.get(a, a)]
        if held == self.written[source] or (np.isnan(held) and np.isnan(self.written[source])):
            return  # the same bytes but the metadata: not a change a reader must see
        other = bytes(obstore.get(self.raw, f"versions/{b}/model.safetensors").bytes())
        obstore.put(self.raw, f"versions/{a}/model.safetensors", other)
        self.holds[a] = source
        if source == a:  # its own bytes put back: nothing a reader can tell
            self.replaced.discard(a)
        else:
            self.replaced.add(a)

    @invariant()
    def current_loads_or_is_refused(self) -> None:
        if not self.names:
            return
        current = self.store.current()
        if current is None:
            return
        if current in self.replaced:
            with pytest.raises(IntegrityError, match=f"version {current}"):
                self.store.load_current(_params(0.0))
            return
        got = self.store.load_current(_params(0.0))
        assert np.array_equal(got["w"], _params(self.scales[current])["w"])

    @invariant()
    def remembered_versions_are_kept(self) -> None:
        if not self.names:
            return
        ptr = self.store._pointer()
        listed = {v.version for v in self.store.versions()}
        assert {ptr.current, *ptr.previous} - {None} <= listed


@pytest.mark.slow
@pytest.mark.xdist_group("s3")
def test_bucket_store_state_machine(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    run_state_machine_as_test(
        BucketMachine,
        settings=settings(
            max_examples=8,
            stateful_step_count=15,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
