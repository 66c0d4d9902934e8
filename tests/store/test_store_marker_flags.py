"""What a promote or a rollback reads of the store's marker once
(``lifecycle._marker``) against a flag another process sets meanwhile: a
rollback that gates several versions, one of them read again whole, must not
take a verdict by a marker read before that read, when the store was marked
signed during it (a process without the key must refuse every verdict from
then on)."""

from __future__ import annotations

from typing import Any

import numpy as np
import obstore
import pytest

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
