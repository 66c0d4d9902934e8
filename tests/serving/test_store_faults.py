"""The server against a store it cannot use freely: held locked by another
process during a swap, mounted read-only, and a server killed mid-swap."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
from live import live_server
from serving_support import client, mlp_spec, request, tiny_spec
from subproc import child_env, start_python, stop

from treeguard.examples import mlp
from treeguard.serving import Server

pytestmark = [pytest.mark.anyio, pytest.mark.slow]
URL = "/v2/models/mlp/infer"

HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(os.path.join(sys.argv[1], ".lock"), os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(120)
"""


async def test_a_swap_waiting_on_a_lock_held_elsewhere_stalls_no_request(mlp_store):
    store, v = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec())
    holder = start_python(HOLD_LOCK, str(store.root))
    try:
        assert holder.stdout.readline().strip() == "locked"
        async with client(server) as c:
            swap = asyncio.create_task(c.post("/v2/treeguard/swap", json={"version": v["v2"]}))
            served = []
            for _ in range(20):
                r = await c.post(URL, json=request(2))
                served.append((r.status_code, r.json()["model_version"]))
                assert (await c.get("/v2/health/live")).status_code == 200
            assert not swap.done()  # still waiting for the lock, and nothing else was
            assert served == [(200, v["v1"])] * 20
            holder.send_signal(signal.SIGKILL)
            r = await asyncio.wait_for(swap, 60)
            assert r.status_code == 200 and r.json()["active"] == v["v2"]
    finally:
        if holder.poll() is None:
            holder.kill()
        stop(holder)


READ_ONLY = """
import json, sys
from treeguard.examples import mlp
from treeguard.serving import Server, ServingError, ServingSpec
root, v2 = sys.argv[1], sys.argv[2]
spec = ServingSpec.from_model(mlp.model, inputs=["['x']"], buckets=(1,), name="mlp")
server = Server(mlp.model, root, spec=spec)
server.start()
before = server.status()["active"]
try:
    server.weights.swap(v2)
    out = {"swapped": True}
except ServingError as e:
    out = {"status": e.status, "error": str(e)}
out.update(before=before, after=server.status()["active"], previous=server.status()["previous"])
print(json.dumps(out))
"""


def test_a_swap_on_a_read_only_store_changes_nothing_and_says_why(mlp_store, tmp_path):
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a private read-only mount")
    store, v = mlp_store
    copy = tmp_path / "ro"
    shutil.copytree(store.root, copy)
    script = (
        f'mount --bind "{copy}" "{copy}" && mount -o remount,bind,ro "{copy}" "{copy}" && '
        f'exec "{sys.executable}" -c "$0" "{copy}" {v["v2"]}'
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, READ_ONLY],
        capture_output=True, text=True, timeout=120, env=child_env(), check=False,
    )  # fmt: skip
    if "mount" in out.stderr and out.returncode != 0 and "Traceback" not in out.stderr:
        pytest.skip(f"no private mount here: {out.stderr[-300:]}")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["status"] == 507
    assert result["error"].startswith(f"the store cannot record the swap to {v['v2']}: ")
    assert "nothing was changed" in result["error"]
    assert result["before"] == result["after"] == v["v1"] and result["previous"] is None


@pytest.mark.reliability
def test_sigkill_mid_swap_and_after_an_automatic_rollback_then_restart(tiny_store, tmp_path):
    store, v = tiny_store
    spec = tmp_path / "spec.json"
    tiny_spec().save(spec)
    here = os.path.dirname(__file__)
    env = {"PYTHONPATH": os.pathsep.join([here, child_env()["PYTHONPATH"]])}
    args = ["tinymodel:model", "--store", str(store.root), "--spec", str(spec), "--allow-unchecked"]
    body = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]}
    for delay in (0.0, 0.05, 0.2):  # the kill lands at several points of the swap
        with live_server(*args, env=env) as live:
            sent = subprocess.Popen(
                ["curl", "-s", "-m", "20", "-X", "POST", "-d",
                 json.dumps({"version": v["nan"]}), live.url + "/v2/treeguard/swap"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(delay)
            live.proc.send_signal(signal.SIGKILL)
            live.proc.wait(timeout=30)
            sent.wait(timeout=30)
        assert store.current() == v["good"]
    # the version is now swapped in for real, misbehaves and is rolled back...
    with live_server(*args, env=env) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        assert c.post("/v2/treeguard/swap", json={"version": v["nan"]}).status_code == 200
        store.promote(v["nan"])  # CURRENT names it, as a release would
        codes = [c.post("/v2/models/tiny/infer", json=body).status_code for _ in range(40)]
        assert 500 in codes and codes[-1] == 200
        live.proc.send_signal(signal.SIGKILL)
        live.proc.wait(timeout=30)
    # ...and a restart never serves it, even when CURRENT names it
    assert store.current() == v["nan"] and store.info(v["nan"]).status == "rejected"
    with live_server(*args, env=env) as live, httpx.Client(base_url=live.url, timeout=30) as c:
        ready = c.get("/v2/health/ready").json()
        assert ready["fallback"]["to"] == v["good"]
        assert ready["fallback"]["reasons"] == {v["nan"]: "quarantined by the watchdog"}
        r = c.post("/v2/models/tiny/infer", json=body)
        assert r.status_code == 200 and r.json()["model_version"] == v["good"]
