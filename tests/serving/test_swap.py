"""Hot swap, rollback, the watchdog and the compile guard."""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tinymodel
from serving_support import client, metric, mlp_params, mlp_spec, put_verified, request, tiny_spec

import treeguard
from treeguard.examples import mlp
from treeguard.serving import Server, ServingError, WatchdogPolicy

pytestmark = pytest.mark.anyio


async def test_swap_same_spec_reuses_executables_and_refuses_what_cannot_be_served(mlp_store):
    store, v = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec())
    async with client(server) as c:
        before = dict(server.status()["compiles"])
        r = await c.post("/v2/treeguard/swap", json={"version": v["v2"]})
        assert r.status_code == 200, r.text
        assert r.json() == {
            "active": v["v2"],
            "previous": v["v1"],
            "compiles": 0,
            "checks": ["contract", "finite", "regression"],
        }
        assert server.status()["compiles"] == before
        assert (await c.post("/v2/models/mlp/infer", json=request(3))).json()["model_version"] == v[
            "v2"
        ]
        for name, status, message in [
            ("candidate", 409, f"version {v['candidate']} cannot be served: "),
            ("rejected", 409, f"version {v['rejected']} cannot be served: "),
            ("tampered", 409, f"version {v['tampered']} cannot be served: "),
        ]:
            r = await c.post("/v2/treeguard/swap", json={"version": v[name]})
            assert r.status_code == status, (name, r.text)
            assert r.json()["error"].startswith(message)
        r = await c.post("/v2/treeguard/swap", json={"version": "v999999"})
        assert r.status_code == 404
        r = await c.post("/v2/treeguard/swap", json={"nope": 1})
        assert r.status_code == 422
        assert server.status()["active"] == v["v2"]
        r = await c.post("/v2/treeguard/rollback")
        assert r.json()["active"] == v["v1"] and r.json()["previous"] == v["v2"]
        text = (await c.get("/metrics")).text
    assert metric(text, "treeguard_swaps_total", result="ok") == 1
    assert metric(text, "treeguard_swaps_total", result="refused") == 4
    assert metric(text, "treeguard_rollbacks_total", trigger="manual") == 1
    assert metric(text, "treeguard_model_info", version=v["v1"]) == 1
    assert metric(text, "treeguard_model_info", version=v["v2"]) == 0
    actions = [(e.action, e.version) for e in store.history()]
    assert ("serve_swap", v["v2"]) in actions and ("serve_rollback", v["v1"]) in actions


async def test_a_sharded_version_is_refused_by_name_before_anything_is_loaded(tmp_path):
    store = treeguard.ArtifactStore(tmp_path / "store")
    v1 = put_verified(store, mlp_params(0))
    store.promote(v1)
    sharded = store.put_sharded(jax.device_put(mlp_params(1)))
    assert store.verify(sharded).status == "verified"
    server = Server(mlp.model, store, spec=mlp_spec())
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": sharded})
        assert r.status_code == 409, r.text
        assert r.json()["error"] == (
            f"version {sharded} cannot be served: it is a sharded checkpoint, and the server "
            "loads single-file versions\nhint: gather it with store.load_verified(version, like) "
            "and put the result as a file version (store.put), then verify and swap to that"
        )
        assert server.status()["active"] == v1


async def test_nan_version_is_rolled_back_automatically_without_flapping(tiny_store):
    store, v = tiny_store
    policy = WatchdogPolicy(window=10, min_requests=4, max_nonfinite_rate=0.2)
    server = Server(tinymodel.model, store, spec=tiny_spec(), watchdog=policy)
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": v["nan"]})
        assert r.status_code == 200, r.text  # its params are finite: it passes the checks
        codes = []
        for _ in range(12):
            r = await c.post("/v2/models/tiny/infer", json=request(2, value=0.5))
            codes.append(r.status_code)
            if r.status_code == 500:
                assert r.json()["error"].startswith(f"version {v['nan']} gave NaN or Inf in output")
        status = server.status()
        text = (await c.get("/metrics")).text
    assert codes[:4] == [500] * 4 and set(codes[4:]) == {200}
    assert status["active"] == v["good"] and status["quarantined"] == [v["nan"]]
    assert metric(text, "treeguard_rollbacks_total", trigger="nonfinite") == 1
    assert metric(text, "treeguard_nonfinite_outputs_total", version=v["nan"]) == 4
    rollbacks = [e for e in store.history() if e.action == "serve_rollback"]
    assert [(e.version, e.detail["trigger"]) for e in rollbacks] == [(v["good"], "nonfinite")]
    assert not server.weights.auto_rollback("5xx")  # never back onto the quarantined version


@pytest.mark.slow
async def test_a_weak_typed_call_is_caught_and_explained(tiny_store, caplog):
    store, v = tiny_store
    server = Server(tinymodel.model, store, spec=tiny_spec())
    server.start()
    slot = server.weights.active
    weak = dataclasses.replace(
        slot,
        params={**slot.params, "eps": jnp.asarray(1.0)},  # a Python float: weak-typed
    )
    x = np.full((1, 2), 0.5, np.float32)
    caplog.set_level(logging.WARNING, "treeguard.serving")
    with pytest.raises(ServingError) as e:
        server.runner.run(weak, [x], 1)
    assert e.value.status == 503
    assert str(e.value).startswith(
        "this request needed a compile after warm-up, which the policy forbids: "
        "params['eps']: f32[] weak-typed in this call, f32[] strong at warm-up"
    )
    assert server.status()["compiles"]["serving"] == 1
    assert "weak-typed in this call" in caplog.text
    out, version = server.runner.run(slot, [x], 1)  # the warm signature still runs
    assert version == v["good"] and out[0][1].shape == (1, 1)
    assert server.status()["compiles"]["serving"] == 1


@pytest.mark.slow
async def test_another_spec_is_warmed_before_it_takes_traffic(mlp_store, tmp_path):
    import treeguard

    store = treeguard.ArtifactStore(tmp_path / "wide")
    first = put_verified(store, mlp_params(0))
    store.promote(first)
    rng = np.random.default_rng(0)
    wide = {
        "dense1": {"w": rng.normal(size=(2, 5)).astype(np.float32), "b": np.zeros(5, np.float32)},
        "dense2": {"w": rng.normal(size=(5, 1)).astype(np.float32), "b": np.zeros(1, np.float32)},
    }
    w = store.put(wide)
    assert store.verify(w, like=wide).status == "verified"
    # a model that pins no params contract may change its widths between versions
    loose = dataclasses.replace(mlp.model, params_spec=None)
    server = Server(loose, store, spec=mlp_spec())
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": w})
        assert r.status_code == 200, r.text
        assert r.json()["compiles"] == 3  # one per bucket, before the switch
        assert r.json()["checks"][0] == "finite"  # no contract to check, none claimed
        assert server.status()["compiles"] == {"warmup": 3, "serving": 0, "swap": 3, "shadow": 0}
        r = await c.post("/v2/models/mlp/infer", json=request(4))
        assert r.json()["model_version"] == w
        assert server.status()["compiles"]["serving"] == 0


@pytest.mark.slow
async def test_no_room_for_a_second_copy_is_refused_clearly(mlp_store):
    store, v = mlp_store
    nbytes = store.info(v["v1"]).nbytes
    server = Server(mlp.model, store, spec=mlp_spec(), memory_budget=nbytes + 10)
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": v["v2"]})
        assert r.status_code == 507
        assert r.json()["error"].startswith(
            f"version {v['v2']} needs {nbytes} bytes of params, and the memory budget of "
            f"{nbytes + 10} leaves 10 with {nbytes} held by the active and previous versions"
        )
        assert server.status()["active"] == v["v1"]


@pytest.mark.slow
async def test_watch_follows_the_store_pointer_and_swapping_back_reuses_the_previous(tmp_path):
    import asyncio

    import treeguard

    store = treeguard.ArtifactStore(tmp_path / "watched")
    first = put_verified(store, mlp_params(0))
    store.promote(first)
    second = put_verified(store, mlp_params(1))
    server = Server(mlp.model, store, spec=mlp_spec(), watch_s=0.02)
    async with client(server) as c:
        store.promote(second)
        for _ in range(3_000):  # a bound, not a verdict: it stops once the watcher swapped
            if server.status()["active"] == second:
                break
            await asyncio.sleep(0.02)
        assert server.status()["active"] == second
        for _ in range(3_000):  # the watcher's swap may still be finishing
            r = await c.post("/v2/treeguard/swap", json={"version": first})
            if "another swap is in progress" not in r.text:
                break
            await asyncio.sleep(0.02)
        assert r.json() == {
            "active": first,
            "previous": second,
            "compiles": 0,
            "checks": ["reused"],
        }


async def test_returning_to_held_weights_passes_the_store_gate_again(tmp_path):
    import json as _json
    from pathlib import Path

    import treeguard

    key = b"serve-key-0123456789abcdef"
    store = treeguard.ArtifactStore(tmp_path / "s", key=key)
    v1 = put_verified(store, mlp_params(0))
    store.promote(v1)
    v2 = put_verified(store, mlp_params(1))
    server = Server(mlp.model, store, spec=mlp_spec())
    async with client(server) as c:
        assert (await c.post("/v2/treeguard/swap", json={"version": v2})).status_code == 200
        # v1, still held as previous, is found bad after the fact
        assert store.verify(v1, checks=[("never", lambda t: False)]).status == "rejected"
        r = await c.post("/v2/treeguard/rollback")
        assert r.status_code == 409 and r.json()["error"].startswith(
            f"version {v1} cannot be served: version {v1} is rejected, not verified"
        )
        assert not server.weights.auto_rollback("nonfinite")
        # a hand-edited, unsigned "verified" record does not get it back either
        status = Path(store.info(v1).path).with_name("status.json")
        record = _json.loads(status.read_text())
        record.update(status="verified", reason=None, signature=None)
        status.write_text(_json.dumps(record))
        r = await c.post("/v2/treeguard/swap", json={"version": v1})
        assert r.status_code == 409 and "verdict is not signed" in r.json()["error"]
        assert server.status()["active"] == v2


async def test_a_swap_checks_the_models_params_contract(tmp_path):
    import treeguard

    store = treeguard.ArtifactStore(tmp_path / "s")
    v1 = put_verified(store, mlp_params(0))
    store.promote(v1)
    wide = {
        "dense1": {"w": np.ones((2, 5), np.float32), "b": np.ones(5, np.float32)},
        "dense2": {"w": np.ones((5, 1), np.float32), "b": np.ones(1, np.float32)},
    }
    v2 = store.put(wide)
    assert store.verify(v2, like=wide).status == "verified"  # verified against itself only
    server = Server(mlp.model, store, spec=mlp_spec())
    async with client(server) as c:
        r = await c.post("/v2/treeguard/swap", json={"version": v2})
        assert r.status_code == 409 and r.json()["error"].startswith(
            f"version {v2} fails the contract check"
        )
        assert server.status()["active"] == v1
