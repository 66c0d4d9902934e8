"""The replicas behind Ray Serve's HAProxy ingress (``--ray-ingress
haproxy``): the protocol, a swap under load, and a replica SIGKILLed under
load, whose unanswered requests HAProxy sends again to another replica.

One cluster for the module (``haproxy_cluster``), in a network namespace of
its own; see conftest.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from fleet import (
    Load,
    body,
    checked_store,
    deploy,
    infer_with_tritonclient,
    kill_one_under_load,
    wait_until,
)

pytestmark = pytest.mark.xdist_group("ray")


def haproxy_servers(cluster) -> list[str]:
    """The replica servers in the HAProxy configuration Ray wrote last."""
    (config,) = Path(cluster.ray_dir, "hap").glob("*/haproxy.cfg")
    return re.findall(r"^\s*server (SERVE_REPLICA_\S+) 127\.0\.0\.1:\d+", config.read_text(), re.M)


def haproxy_failures(cluster) -> list[str]:
    """The lines of HAProxy's access log (kept by the driver) of requests it
    answered with an error status: each names why (its termination state)."""
    log = Path(cluster.ray_dir, "haproxy-access.log")
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [line for line in lines if re.search(r" 5\d\d ", line)]


@pytest.fixture(scope="module")
def fleet(haproxy_cluster, tmp_path_factory):
    versions = checked_store(tmp_path_factory.mktemp("haproxy"), "mlp")
    live = deploy(haproxy_cluster, versions, "hap", "treeguard.examples.mlp:model")
    assert len(live) == 2
    wait_until(lambda: len(haproxy_servers(haproxy_cluster)) == 2)
    return versions, live


@pytest.mark.slow
def test_tritonclient_through_haproxy_reaches_each_replica_directly(haproxy_cluster, fleet):
    versions, live = fleet
    v1 = versions.names[0]
    assert {s.rsplit("-", 1)[1] for s in haproxy_servers(haproxy_cluster)} == set(live)
    infer_with_tritonclient(haproxy_cluster.url, versions, v1)
    # the single-replica control routes stay refused behind HAProxy too
    r = httpx.post(f"http://{haproxy_cluster.url}/v2/treeguard/swap", json={"version": v1})
    assert r.status_code == 409
    assert "treeguard serve swap --ray VERSION" in r.json()["error"]


@pytest.mark.slow
def test_a_swap_through_haproxy_fails_no_request_and_never_mixes_versions(haproxy_cluster, fleet):
    versions, _ = fleet
    v1, v2 = versions.names
    x = np.full((1, 2), 0.5, np.float32)
    url = f"http://{haproxy_cluster.url}/v2/models/mlp/infer"
    assert httpx.post(url, json=body(x)).json()["model_version"] == v1
    with Load(haproxy_cluster.url, "mlp", versions) as load:
        wait_until(lambda: load.count() >= 20)
        result = haproxy_cluster.call("swap", name="hap", version=v2)
        load.phase.set()
        wait_until(lambda: load.count(after=True) >= 20)
    assert result["version"] == v2, result
    assert [o for o in load.outcomes if o.status != 200] == []
    assert all(o.ok for o in load.outcomes)
    assert {o.version for o in load.outcomes if o.after} == {v2}
    assert versions.store.current() == v2


@pytest.mark.reliability
def test_a_killed_replica_behind_haproxy_fails_no_request(haproxy_cluster, fleet):
    versions, _ = fleet
    v2 = versions.names[1]
    if versions.store.current() != v2:  # run alone: the swap test has not run
        assert haproxy_cluster.call("swap", name="hap", version=v2)["version"] == v2
    load, victim_id, text = kill_one_under_load(
        haproxy_cluster,
        versions,
        "hap",
        routed=lambda fresh: any(s.endswith(fresh) for s in haproxy_servers(haproxy_cluster)),
    )
    assert f'treeguard_model_info{{model="mlp",version="{v2}"}} 1.0' in text
    assert not any(s.endswith(victim_id) for s in haproxy_servers(haproxy_cluster))
    answered = [o for o in load.outcomes if o.status == 200]
    failed = [(o.status, o.error) for o in load.outcomes if o.status != 200]
    assert answered and all(o.ok and o.version == v2 for o in answered)
    # HAProxy sends each request the dead replica left unanswered to a live
    # one; what may still fail is a keep-alive connection HAProxy closed as
    # it reloaded its configuration (the replica's removal, then its
    # replacement's arrival): closed unanswered, never an error status
    assert all(f == (0, "RemoteProtocolError") for f in failed), (
        failed,
        haproxy_failures(haproxy_cluster),
    )
    print(f"{len(answered)} answered, {len(failed)} closed unanswered")
