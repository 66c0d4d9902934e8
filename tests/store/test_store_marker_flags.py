"""What a load, a promote or a rollback reads of the store's marker: once
(one GET of ``STORE.json``, ``lifecycle._marker``), and against a flag
another process sets meanwhile: a rollback that gates several versions, one of them read again whole, must not
take a verdict by a marker read before that read, when the store was marked
signed during it (a process without the key must refuse every verdict from
then on)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import obstore
import pytest

from tests.s3server import LyingProxy, Request, S3Server
from tests.store.buckets import raw_store
from treeguard import ArtifactStore, StoreError
from treeguard._src.store import lifecycle  # _src: a verify between two gates of a rollback

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("s3")]

KEY = b"k" * 32


def _params(value: float) -> dict[str, Any]:
    return {"w": np.full((64, 64), value, np.float32), "b": np.zeros(8, np.float32)}


def _verified(store: ArtifactStore, value: float) -> str:
    v = store.put(_params(value))
    assert store.verify(v).status == "verified"
    return v


def test_a_rollback_s_later_gate_sees_the_store_signed_during_an_earlier_gate(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2, v3 = (_verified(store, x) for x in (1.0, 2.0, 3.0))
    for v in (v1, v2, v3):
        store.promote(v)
    later = store.put(_params(4.0))
    raw, name = raw_store(s3_url), f"versions/{v2}/model.safetensors"
    data = bytearray(obstore.get(raw, name).bytes())
    data[-1] ^= 0xFF  # v2's gate fails once it has read its bytes again
    obstore.put(raw, name, bytes(data))
    gate, signed = lifecycle.gate, []

    def verify_meanwhile(backend: Any, signer: Any, version: str, **kw: Any) -> Any:
        try:
            return gate(backend, signer, version, **kw)
        finally:
            if version == v2 and not signed:  # another process, with the key, during v2's gate
                signed.append(ArtifactStore(s3_url, key=KEY).verify(later).status)

    monkeypatch.setattr(lifecycle, "gate", verify_meanwhile)
    # before: v1's gate took the marker read before v2's, unsigned, and the rollback made
    # v1 current by its unsigned verdict in a store that signs its verdicts
    with pytest.raises(StoreError, match="without its key"):
        store.rollback()
    monkeypatch.undo()
    assert signed == ["verified"] and store.current() == v3


@contextlib.contextmanager
def _seen_through_a_proxy(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ArtifactStore, list[tuple[str, str]]]]:
    """The store through a proxy that passes every request on, and the
    method and key of each request it saw."""
    seen: list[tuple[str, str]] = []

    def watch(req: Request) -> None:
        seen.append((req.method, req.key))

    with LyingProxy(s3_server.endpoint, watch) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        yield ArtifactStore(s3_url), seen


def test_a_load_reads_the_store_s_marker_once(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    v = store.put(_params(0))
    store.verify(v)
    store.promote(v)
    with _seen_through_a_proxy(s3_server, s3_url, monkeypatch) as (through, seen):
        for load in (through.load_current, lambda like: through.load_verified(v, like)):
            seen.clear()
            load(_params(1))
            # the pointer's check and the gate's take the one marker the load read
            assert [m for m, k in seen if k.endswith("/STORE.json")] == ["GET"], seen


def test_a_promote_and_a_rollback_read_the_store_s_marker_once(
    s3_server: S3Server, s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ArtifactStore.init(s3_url)
    v1, v2 = store.put(_params(0)), store.put(_params(1))
    for v in (v1, v2):
        store.verify(v)
    store.promote(v1)
    with _seen_through_a_proxy(s3_server, s3_url, monkeypatch) as (through, seen):
        for move in (lambda: through.promote(v2), through.rollback):
            seen.clear()
            move()
            # the pointer's damage rule and every gate take the one marker it read; a
            # store already marked promoted is not marked again
            assert [m for m, k in seen if k.endswith("/STORE.json")] == ["GET"], seen
    assert (store.current(), store.previous()) == (v1, None)
