"""The engine as a Ray Serve application: the protocol through Ray's proxy,
per-replica metrics, and the verified rolling swap (a local cluster on
127.0.0.1 run by the ``cluster`` fixture)."""

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
    served_requests,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # one cluster


@pytest.fixture(scope="module")
def mlp_fleet(cluster, tmp_path_factory):
    versions = checked_store(tmp_path_factory.mktemp("fleet"), "mlp")
    live = deploy(cluster, versions, "mlp", "treeguard.examples.mlp:model")
    assert len(live) == 2
    return versions


def test_tritonclient_and_curl_speak_to_the_proxy(cluster, mlp_fleet):
    infer_with_tritonclient(cluster.url, mlp_fleet, mlp_fleet.names[0])


def test_a_single_replica_swap_through_the_proxy_is_refused(cluster, mlp_fleet):
    r = httpx.post(f"http://{cluster.url}/v2/treeguard/swap", json={"version": mlp_fleet.names[1]})
    assert r.status_code == 409
    assert "treeguard serve swap --ray VERSION" in r.json()["error"]
    assert mlp_fleet.store.current() == mlp_fleet.names[0]


def test_each_replica_serves_its_metrics_with_bounded_labels(cluster, mlp_fleet):
    payload = 0.4140625  # 53/128, exact in float32; no metric holds it by chance
    x = np.full((2, 2), payload, np.float32)
    for _ in range(6):
        assert (
            httpx.post(f"http://{cluster.url}/v2/models/mlp/infer", json=body(x)).status_code == 200
        )
    targets = cluster.call("metrics", name="mlp")
    assert set(targets) == set(cluster.call("replicas", name="mlp"))
    served = 0
    for url in targets.values():
        assert url.startswith("http://127.0.0.1:")
        text = httpx.get(url).text
        assert f'treeguard_model_info{{model="mlp",version="{mlp_fleet.names[0]}"}} 1.0' in text
        served += served_requests(text)
        labels = set(re.findall(r'(\w+)="', text))
        assert labels <= {
            "model",
            "version",
            "status",
            "bucket",
            "reason",
            "phase",
            "result",
            "trigger",
            "blame",
            "le",
        }
        for line in text.splitlines():  # no payload value, as a label or a sample
            if line and not line.startswith("#"):
                labels_part, _, value = line.rpartition(" ")
                assert str(payload) not in labels_part and float(value) != payload, line
    assert served >= 6


def test_a_swap_under_load_fails_no_request_and_never_mixes_versions(cluster, mlp_fleet):
    v1, v2 = mlp_fleet.names
    with Load(cluster.url, "mlp", mlp_fleet) as load:
        wait_until(lambda: load.count() >= 20)
        result = cluster.call("swap", name="mlp", version=v2)
        load.phase.set()
        wait_until(lambda: load.count(after=True) >= 20)
    assert result == {"version": v2, "replicas": sorted(cluster.call("replicas", name="mlp"))}
    outcomes = load.outcomes
    assert [o for o in outcomes if o.status != 200] == []
    assert all(o.ok for o in outcomes)  # each output is the named version's own
    assert {o.version for o in outcomes} == {v1, v2}
    assert {o.version for o in outcomes if o.after} == {v2}
    assert mlp_fleet.store.current() == v2
    history = [e.action for e in mlp_fleet.store.history()]
    assert history.count("serve_swap") == 2 and history[-1] == "promote"


def test_a_version_that_fails_on_one_replica_switches_none(cluster, tmp_path_factory):
    versions = checked_store(tmp_path_factory.mktemp("picky"), "mlp")
    v1, v2 = versions.names
    live = deploy(cluster, versions, "picky", "picky:model")
    odd_one, pid = sorted(live.items())[0]
    Path(cluster.picky_pids).write_text(str(pid))
    try:
        with Load(cluster.url, "mlp", versions) as load:
            wait_until(lambda: load.count() >= 10)
            refused = cluster.call("swap", name="picky", version=v2)
            load.phase.set()
            wait_until(lambda: load.count(after=True) >= 10)
    finally:
        Path(cluster.picky_pids).write_text("")
    assert refused["status"] == 409
    assert (
        f"swap to {v2} refused: the check failed on 1 replica(s), and none switched"
        in refused["error"]
    )
    assert f"replica {odd_one}: version {v2} fails the contract check" in refused["error"]
    assert all(o.status == 200 and o.ok and o.version == v1 for o in load.outcomes)
    assert versions.store.current() == v1
    # the same version, once every replica passes, goes through
    assert cluster.call("swap", name="picky", version=v2)["version"] == v2
    assert versions.store.current() == v2


def test_the_equinox_model_through_the_proxy(cluster, tmp_path_factory):
    httpclient = pytest.importorskip("tritonclient.http")
    versions = checked_store(tmp_path_factory.mktemp("eqx"), "eqx_mlp")
    deploy(cluster, versions, "eqx", "treeguard.examples.eqx_mlp:model")
    v1, v2 = versions.names
    c = httpclient.InferenceServerClient(cluster.url)
    served = httpx.get(f"http://{cluster.url}/v2/treeguard/status").json()["model"]
    x = np.random.default_rng(5).uniform(-1, 1, (4, 2)).astype(np.float32)
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    result = c.infer(served, [inp])
    np.testing.assert_allclose(
        result.as_numpy("output"), versions.expected(v1, x), rtol=1e-5, atol=1e-6
    )
    assert cluster.call("swap", name="eqx", version=v2)["version"] == v2
    result = c.infer(served, [inp])
    assert result.get_response()["model_version"] == v2
    np.testing.assert_allclose(
        result.as_numpy("output"), versions.expected(v2, x), rtol=1e-5, atol=1e-6
    )
