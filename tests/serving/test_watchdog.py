"""The watchdog no client can trigger, a quarantine that survives a restart,
and a warm-up that falls back instead of hanging."""

from __future__ import annotations

import dataclasses
import json

import jax.numpy as jnp
import numpy as np
import pytest
import tinymodel
from serving_support import client, metric, put_verified, request, tiny_spec

import treeguard
from treeguard.serving import Server, ServingError, WatchdogPolicy

pytestmark = pytest.mark.anyio
URL = "/v2/models/tiny/infer"
POLICY = WatchdogPolicy(window=10, min_requests=4, max_nonfinite_rate=0.2)


async def test_an_input_that_overflows_a_good_model_never_counts_against_it(tiny_store):
    store, _ = tiny_store
    better = put_verified(store, tinymodel.params(eps=2.0))
    server = Server(tinymodel.model, store, spec=tiny_spec(), watchdog=POLICY)
    async with client(server) as c:
        assert (await c.post("/v2/treeguard/swap", json={"version": better})).status_code == 200
        for _ in range(12):  # finite, but x**2 overflows float32 in both versions
            r = await c.post(URL, json=request(1, value=3e38))
            assert r.status_code == 422, r.text
            assert r.json()["error"].startswith(
                "the outputs output are NaN or Inf for this input, and no other version shows"
            )
        assert (await c.post(URL, json=request(2))).status_code == 200
        text = (await c.get("/metrics")).text
    status = server.status()
    assert status["active"] == better and status["quarantined"] == []
    assert metric(text, "treeguard_rollbacks_total", trigger="nonfinite") == 0
    assert metric(text, "treeguard_nonfinite_outputs_total", blame="input") == 12
    assert metric(text, "treeguard_invalid_inputs_total", reason="nonfinite_output") == 12
    assert not [e for e in store.history() if e.action == "serve_quarantine"]


async def test_declared_bounds_refuse_inputs_outside_and_blame_the_version_inside(tiny_store):
    store, v = tiny_store
    spec = tiny_spec(bounds=(-10.0, 10.0))
    server = Server(tinymodel.model, store, spec=spec, version=v["nan"], watchdog=POLICY)
    async with client(server) as c:
        r = await c.post(URL, json=request(1, value=3e38))
        assert r.status_code == 422
        assert r.json()["error"].startswith(
            "input ['x']: a value lies outside the served bounds [-10, 10]"
        )
        r = await c.post(URL, json=request(1, value=0.5))  # within bounds: the version's fault
        assert r.status_code == 500
        assert r.json()["error"].startswith(f"version {v['nan']} gave NaN or Inf in output output")
        text = (await c.get("/metrics")).text
    assert metric(text, "treeguard_invalid_inputs_total", reason="bounds") == 1
    assert metric(text, "treeguard_nonfinite_outputs_total", blame="version") == 1


async def test_a_quarantine_is_recorded_and_a_restart_never_serves_it(tiny_store, caplog):
    store, v = tiny_store
    store.promote(v["nan"])  # CURRENT names the version the watchdog will quarantine
    server = Server(tinymodel.model, store, spec=tiny_spec(), version=v["good"], watchdog=POLICY)
    async with client(server) as c:
        assert (await c.post("/v2/treeguard/swap", json={"version": v["nan"]})).status_code == 200
        for _ in range(6):
            await c.post(URL, json=request(2, value=0.5))
    assert server.status()["active"] == v["good"]
    quarantines = [e for e in store.history() if e.action == "serve_quarantine"]
    assert [(e.version, e.detail["trigger"]) for e in quarantines] == [(v["nan"], "nonfinite")]
    info = store.info(v["nan"])  # the quarantine is a verdict of the store
    assert info.status == "rejected"
    assert info.reason == (
        "check serve.quarantine raised ServingError: the watchdog quarantined it "
        "(trigger nonfinite)"
    )
    with pytest.raises(treeguard.StoreError, match="is rejected, not verified"):
        store.promote(v["nan"])
    restarted = Server(tinymodel.model, store, spec=tiny_spec())
    async with client(restarted) as c:
        ready = (await c.get("/v2/health/ready")).json()
        r = await c.post(URL, json=request(1))
    assert ready == {
        "ready": True,
        "fallback": {
            "from": v["nan"],
            "to": v["good"],
            "reasons": {v["nan"]: "quarantined by the watchdog"},
        },
    }
    assert r.json()["model_version"] == v["good"]
    last = store.history()[-1]
    assert (last.action, last.version, last.detail["trigger"]) == (
        "serve_rollback",
        v["good"],
        "warmup",
    )
    assert f"fell back from {v['nan']} to {v['good']}" in caplog.text


def test_only_a_new_verdict_lifts_the_quarantine(tiny_store):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    assert server.weights.quarantine(v["nan"], "nonfinite")
    restarted = Server(tinymodel.model, store, spec=tiny_spec())
    restarted.start()
    assert restarted.status()["quarantined"] == [v["nan"]]
    with pytest.raises(ServingError, match=f"version {v['nan']} cannot be served: .*rejected"):
        server.weights.swap(v["nan"])
    assert store.verify(v["nan"]).status == "verified"  # a release check run again
    fresh = Server(tinymodel.model, store, spec=tiny_spec(), version=v["nan"])
    fresh.start()
    assert fresh.status()["active"] == v["nan"] and fresh.status()["quarantined"] == []
    assert fresh.status()["fallback"] is None


def test_an_edited_quarantine_is_refused_by_the_store_signature(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "signed", key=b"a key of sixteen bytes or more")
    good = put_verified(store, tinymodel.params(eps=1.0))
    store.promote(good)
    nan = put_verified(store, tinymodel.params(eps=-1.0))
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    assert server.weights.quarantine(nan, "nonfinite")
    info = store.info(nan)
    assert info.status == "rejected" and info.signed
    # an edit that lifts the quarantine by hand: the verdict says verified again
    status = tmp_path / "signed" / "versions" / nan / "status.json"
    record = json.loads(status.read_text())
    record.update(status="verified", reason=None, checks=record["checks"][:2])
    status.write_text(json.dumps(record))
    with pytest.raises(treeguard.SignatureError, match="verdict signature does not match"):
        store.check_verified(nan)
    restarted = Server(tinymodel.model, store, spec=tiny_spec(), version=nan)
    restarted.start()
    assert restarted.status()["active"] == good
    fallback = restarted.status()["fallback"]
    assert fallback["from"] == nan
    assert "verdict signature does not match" in fallback["reasons"][nan]


def test_a_forged_quarantine_is_refused_as_forged_not_as_quarantined(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "signed", key=b"a key of sixteen bytes or more")
    older = put_verified(store, tinymodel.params(eps=1.0))
    good = put_verified(store, tinymodel.params(eps=2.0))
    store.promote(good)
    # someone without the key writes a quarantine verdict for the good version
    status = tmp_path / "signed" / "versions" / good / "status.json"
    record = json.loads(status.read_text())
    check = {"name": "serve.quarantine", "ok": False, "detail": "the watchdog quarantined it"}
    record.update(status="rejected", checks=[*record["checks"], check])
    del record["signature"]
    status.write_text(json.dumps(record))
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    state = server.status()
    assert state["active"] == older and state["quarantined"] == []
    reason = state["fallback"]["reasons"][good]
    assert f"version {good}'s verdict is not signed" in reason, reason


def test_warm_up_falls_back_past_a_version_that_cannot_run(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    good = put_verified(store, tinymodel.params())
    wrong = put_verified(store, {"w": np.ones((3, 1), np.float32), "eps": np.float32(1)})
    store.promote(wrong)
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    status = server.status()
    assert status["active"] == good
    assert status["fallback"]["from"] == wrong and list(status["fallback"]["reasons"]) == [wrong]


def test_warm_up_with_no_version_that_passes_names_each_and_why(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "s")
    wrong = {"w": np.ones((3, 1), np.float32), "eps": np.float32(1)}
    a = put_verified(store, wrong)
    b = put_verified(store, {"w": np.ones((4, 1), np.float32), "eps": np.float32(1)})
    store.promote(a)
    server = Server(tinymodel.model, store, spec=tiny_spec())
    with pytest.raises(ServingError) as e:
        server.start()
    text = str(e.value)
    assert e.value.status == 503
    assert text.startswith(f"no version can be served: {a}: ")
    assert f"; {b}: " in text
    assert not server.weights.ready


@pytest.mark.parametrize("rolls_back", [True, False], ids=["on_forbidden_compile", "off"])
async def test_a_batch_that_compiles_under_forbid_rolls_back_when_the_policy_says_so(
    tiny_store, rolls_back
):
    store, v = tiny_store
    better = put_verified(store, tinymodel.params(eps=2.0))
    policy = WatchdogPolicy(window=10, min_requests=4, on_forbidden_compile=rolls_back)
    server = Server(tinymodel.model, store, spec=tiny_spec(), watchdog=policy)
    async with client(server) as c:
        assert (await c.post("/v2/treeguard/swap", json={"version": better})).status_code == 200
        # internal: no client can send params; the served ones made weak-typed
        # (as a version of another signature would be) make the next batch compile
        slot = server.weights.active
        server.weights.active = dataclasses.replace(
            slot, params={**slot.params, "eps": jnp.asarray(2.0)}
        )
        r = await c.post(URL, json=request(1))
        assert r.status_code == 503, r.text
        assert "which the policy forbids" in r.json()["error"]
        text = (await c.get("/metrics")).text
    status = server.status()
    assert metric(text, "treeguard_rollbacks_total", trigger="compile") == int(rolls_back)
    assert status["active"] == (v["good"] if rolls_back else better)
    assert status["quarantined"] == ([better] if rolls_back else [])
