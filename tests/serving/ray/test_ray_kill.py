"""A replica SIGKILLed under load: Ray replaces it, the replacement serves
the version the fleet serves, and no client ever gets a wrong answer."""

from __future__ import annotations

import pytest
from fleet import checked_store, deploy, kill_one_under_load

# The session's cluster: with the reliability suite on two workers, the
# worker that runs the other Ray tests (one cluster at a time).
pytestmark = [pytest.mark.reliability, pytest.mark.xdist_group("ray")]

# What Ray's proxy answers a request that was on a replica when it died (or
# was routed to it before the proxy learned of its death): a bare 500. The
# request never reached an answer, so it is safe to retry; Ray's proxy gives
# no way to answer it with a 503 instead. Behind HAProxy it is sent to
# another replica (test_ray_haproxy.py).
RAY_DIED = (500, "Internal Server Error")


def test_a_killed_replica_is_replaced_and_serves_the_active_version(cluster, tmp_path_factory):
    versions = checked_store(tmp_path_factory.mktemp("kill"), "mlp")
    v2 = versions.names[1]
    deploy(cluster, versions, "kill", "treeguard.examples.mlp:model")
    assert cluster.call("swap", name="kill", version=v2)["version"] == v2
    load, victim_id, text = kill_one_under_load(cluster, versions, "kill")
    assert f'treeguard_model_info{{model="mlp",version="{v2}"}} 1.0' in text
    assert victim_id not in cluster.call("replicas", name="kill")
    answered = [o for o in load.outcomes if o.status == 200]
    failed = [o for o in load.outcomes if o.status != 200]
    assert answered and all(o.ok and o.version == v2 for o in answered)
    assert all(o.status == 503 or (o.status, o.error) == RAY_DIED for o in failed), [
        (o.status, o.error) for o in failed
    ]
    print(
        f"{len(answered)} answered, {len(failed)} failed:",
        sorted({(o.status, o.error[:80]) for o in failed}),
    )
