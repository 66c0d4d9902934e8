"""Ray replaces a replica that tells it to (its ``check_health``): after a
compile the policy forbids, or after its watchdog quarantined a version;
the replacement starts with the quarantine on record and is healthy. Seen
as Ray sees it: the deployment's status (``serve.status()``), the replicas
it runs, and what its controller logged of each failed health check."""

from __future__ import annotations

import re

import ailing
import httpx
import numpy as np
import pytest
from fleet import Load, Versions, body, controller_log, deploy

import treeguard

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]  # the session's cluster


def _ailing_store(tmp_path) -> Versions:
    """A store of the ailing model: a good version, current, and one whose
    outputs are NaN on traffic (its params finite, verified without the
    model's checks, which would see the NaN)."""
    store = treeguard.ArtifactStore.init(tmp_path / "ailing")
    names, params = [], {}
    for eps in (1.0, -1.0):
        tree = ailing.params(eps)
        v = store.put(tree)
        assert store.verify(v).status == "verified"
        names.append(v)
        params[v] = tree
    store.promote(names[0])
    return Versions(store, names, params, ailing.model)


def _infer(cluster, value: float) -> httpx.Response:
    x = np.full((1, 2), value, np.float32)
    return httpx.post(f"http://{cluster.url}/v2/models/ailing/infer", json=body(x), timeout=60)


def test_ray_replaces_a_replica_that_compiled_under_forbid_or_quarantined(cluster, tmp_path):
    versions = _ailing_store(tmp_path)
    good, bad = versions.names
    first = deploy(cluster, versions, "ailing", "ailing:model", allow_unchecked=True)
    assert cluster.call("check_health", name="ailing", times=4) == ["ok"] * 4

    # a batch after the trigger compiles on the replica that saw it: 503, and Ray replaces it
    assert _infer(cluster, ailing.TRIGGER).status_code == 200
    with Load(cluster.url, "ailing", versions, threads=1) as load:
        seen = cluster.call("health", name="ailing", old=list(first), gone=1, n=2)
    assert "error" not in seen, seen
    assert ["UNHEALTHY", "HEALTH_CHECK_FAILED"] in seen["seen"]
    (ill,) = set(first) - set(seen["replicas"])
    assert any(o.status == 503 and "which the policy forbids" in o.error for o in load.outcomes), {
        (o.status, o.error[:80]) for o in load.outcomes
    }
    forbidden = rf"replica {ill} is unhealthy: \d+ compile\(s\) while serving, which the compile"
    assert re.search(forbidden + " policy forbids", controller_log(cluster))

    # a version whose outputs are NaN: each replica's watchdog quarantines it and
    # rolls back, and Ray replaces both; the replacements skip it, and are healthy
    second = seen["replicas"]
    assert cluster.call("swap", name="ailing", version=bad)["version"] == bad
    with Load(cluster.url, "ailing", versions, threads=1):
        seen = cluster.call("health", name="ailing", old=list(second), gone=2, n=2)
    assert "error" not in seen, seen
    assert ["UNHEALTHY", "HEALTH_CHECK_FAILED"] in seen["seen"]
    logged = controller_log(cluster)
    for replica in second:
        assert (
            f"replica {replica} is unhealthy: the watchdog quarantined {bad} and rolled back"
            in logged
        )
    assert versions.store.info(bad).status == "rejected"
    assert _infer(cluster, 0.5).json()["model_version"] == good
    assert cluster.call("check_health", name="ailing", times=6) == ["ok"] * 6
