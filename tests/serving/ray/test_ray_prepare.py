"""A replica's half of the verified rolling swap: ``Slots.prepare`` loads
and checks a version without serving it, and ``swap(version, prepared=...)``
serves what was prepared, unless the store no longer passes it."""

from __future__ import annotations

import pytest
import tinymodel
from serving_support import tiny_spec

from treeguard.serving import Server, ServingError

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]


def test_a_prepared_version_is_held_without_serving_it_then_served(tiny_store):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    slot, checks = server.weights.prepare(v["nan"])
    assert slot.version == v["nan"] and checks == ["finite"]
    assert server.status()["active"] == v["good"]  # nothing switched
    result = server.weights.swap(v["nan"], prepared=slot)
    assert (result["active"], result["previous"], result["checks"]) == (
        v["nan"],
        v["good"],
        ["prepared"],
    )
    assert server.weights.active is slot


def test_a_prepared_version_whose_verdict_changed_is_not_served(tiny_store):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    slot, _ = server.weights.prepare(v["nan"])
    store.verify(v["nan"], checks=[("never", lambda tree: False)])  # now rejected
    with pytest.raises(ServingError, match=f"version {v['nan']} cannot be served"):
        server.weights.swap(v["nan"], prepared=slot)
    assert server.status()["active"] == v["good"]


def test_a_version_that_is_not_in_the_store_cannot_be_prepared(tiny_store):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    with pytest.raises(ServingError, match="no version v999999"):
        server.weights.prepare("v999999")
    assert server.status()["active"] == v["good"]
