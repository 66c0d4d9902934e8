"""When a replica tells Ray to replace it (``check_health``): after a
quarantine, a compile the policy forbids, or a failed warm-up; never for a
quarantine it inherited from the store."""

from __future__ import annotations

import asyncio
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
import tinymodel
from serving_support import client, request, tiny_spec

import treeguard

# The replica's health verdict on purpose: Ray calls it in a replica, and these
# tests hold it to a server in this process without a Ray cluster.
from treeguard._src.serving.ray.health import unhealthy  # _src: only Ray calls it, in a replica
from treeguard.serving import Server, ServingError, WatchdogPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.xdist_group("ray")]

URL = "/v2/models/tiny/infer"
POLICY = WatchdogPolicy(window=10, min_requests=4, max_nonfinite_rate=0.2)


async def test_a_replica_whose_watchdog_quarantined_a_version_is_unhealthy(tiny_store):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec(), watchdog=POLICY)
    async with client(server) as c:
        baseline = frozenset(server.weights.quarantined)
        assert unhealthy(server, baseline) is None
        assert (await c.post("/v2/treeguard/swap", json={"version": v["nan"]})).status_code == 200
        for _ in range(6):
            await c.post(URL, json=request(2, value=0.5))
    assert server.status()["active"] == v["good"]
    assert unhealthy(server, baseline) == f"the watchdog quarantined {v['nan']} and rolled back"
    # its replacement starts with the quarantine on record, and is healthy
    fresh = Server(tinymodel.model, store, spec=tiny_spec())
    fresh.start()
    assert fresh.weights.quarantined == {v["nan"]}
    assert unhealthy(fresh, frozenset(fresh.weights.quarantined)) is None


def test_a_replica_that_compiled_under_forbid_is_unhealthy(tiny_store):
    store, _ = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    slot = server.weights.active
    weak = dataclasses.replace(slot, params={**slot.params, "eps": jnp.asarray(1.0)})
    with pytest.raises(ServingError):
        server.runner.run(weak, [np.full((1, 2), 0.5, np.float32)], 1)
    assert unhealthy(server, frozenset()) == (
        "1 compile(s) while serving, which the compile policy forbids"
    )


def test_a_compile_the_policy_allows_leaves_a_replica_healthy(tiny_store):
    store, _ = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec(compile_policy="allow"))
    server.start()
    slot = server.weights.active
    weak = dataclasses.replace(slot, params={**slot.params, "eps": jnp.asarray(1.0)})
    server.runner.run(weak, [np.full((1, 2), 0.5, np.float32)], 1)
    assert server.status()["compiles"]["serving"] == 1
    assert unhealthy(server, frozenset()) is None


async def test_a_replica_whose_warm_up_failed_is_unhealthy(tmp_path):
    store = treeguard.ArtifactStore.init(tmp_path / "empty")
    server = Server(tinymodel.model, store, spec=tiny_spec())
    async with server.running():
        for _ in range(2000):  # a bounded wait for the warm-up thread
            if server.start_error is not None:
                break
            await asyncio.sleep(0.01)
    why = unhealthy(server, frozenset())
    assert why is not None and why.startswith("warm-up failed: the store ")
    assert why.endswith("has no current version")
