"""Loads: random batch sizes with no serving compile, swaps under load,
floods of good and bad requests, and one real uvicorn end to end."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
from ports import free_port
from serving_support import client, infer_body, mlp_spec, request, rows_of
from subproc import start_python, stop

from treeguard.examples import mlp
from treeguard.serving import Limits, Server

pytestmark = pytest.mark.anyio
URL = "/v2/models/mlp/infer"
FULL = (1, 2, 4, 8, 16, 32, 64)


async def random_sizes(c: httpx.AsyncClient, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 65, n)
    codes: list[int] = []
    for start in range(0, n, 32):
        batch = sizes[start : start + 32]
        rs = await asyncio.gather(
            *(c.post(URL, json=infer_body(rows_of(rng, int(k)))) for k in batch)
        )
        codes += [r.status_code for r in rs]
    return codes


async def _no_compile_storm(mlp_store, n: int) -> None:
    store, _ = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec(buckets=FULL))
    async with client(server) as c:
        codes = await random_sizes(c, n, 0)
    assert len(codes) == n and set(codes) == {200}
    compiles = server.status()["compiles"]
    assert compiles["serving"] == 0 and compiles["swap"] == 0
    assert compiles["warmup"] == len(FULL)


@pytest.mark.slow
async def test_random_batch_sizes_cause_no_serving_compile(mlp_store):
    await _no_compile_storm(mlp_store, 200)


@pytest.mark.reliability
async def test_a_thousand_random_batch_sizes_cause_no_serving_compile(mlp_store):
    await _no_compile_storm(mlp_store, 1000)


@pytest.mark.slow
async def test_swap_under_load_fails_no_request(mlp_store):
    store, v = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec(limits=Limits(max_delay_ms=1)))
    versions: list[str] = []
    failures: list[int] = []
    swapped = asyncio.Event()
    async with client(server) as c:
        # Progress, not time, paces both sides: each swap waits for requests served
        # by the version it leaves, and the load runs until the last swap is done.

        async def load(seed: int) -> None:
            rng = np.random.default_rng(seed)
            for _ in range(2_000):
                if swapped.is_set():
                    return
                r = await c.post(URL, json=infer_body(rows_of(rng, int(rng.integers(1, 17)))))
                if r.status_code != 200:
                    failures.append(r.status_code)
                else:
                    versions.append(r.json()["model_version"])

        async def swaps() -> None:
            for target in (v["v2"], v["v1"], v["v2"]):
                served = len(versions)
                for _ in range(10_000):
                    if len(versions) >= served + 8:
                        break
                    await asyncio.sleep(0.01)
                r = await c.post("/v2/treeguard/swap", json={"version": target})
                assert r.status_code == 200, r.text
                assert r.json()["compiles"] == 0
            swapped.set()

        await asyncio.gather(*(load(i) for i in range(8)), swaps())
    assert failures == []
    assert set(versions) == {v["v1"], v["v2"]}
    assert server.status()["compiles"]["serving"] == 0


def _mixed(rng: np.random.Generator, i: int) -> tuple[bytes, bool]:
    kind = i % 8
    if kind < 4:
        return json.dumps(
            request(int(rng.integers(1, 17)), float(rng.uniform(-1, 1)))
        ).encode(), True
    bad = [
        b"{" * int(rng.integers(1, 5000)),
        json.dumps(request(int(rng.integers(1, 9)), cols=int(rng.integers(3, 6)))).encode(),
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "BF16", "data": [1, 2]}]}
        ).encode(),
        bytes(rng.integers(0, 256, int(rng.integers(1, 200)), dtype=np.uint8)),
    ]
    return bad[kind - 4], False


@pytest.mark.reliability
async def test_ten_thousand_mixed_requests_give_no_crash_and_no_5xx_for_bad_input(mlp_store):
    store, _ = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec())
    rng = np.random.default_rng(7)
    bad_codes: set[int] = set()
    good_codes: set[int] = set()
    async with client(server) as c:
        sent = 0
        while sent < 10_000:
            bodies = [_mixed(rng, sent + j) for j in range(50)]
            rs = await asyncio.gather(
                *(
                    c.post(URL, content=b, headers={"content-type": "application/json"})
                    for b, _ in bodies
                )
            )
            for (_, good), r in zip(bodies, rs):
                (good_codes if good else bad_codes).add(r.status_code)
                assert "error" in r.json() or good
            sent += len(bodies)
        assert (await c.get("/v2/health/ready")).status_code == 200
    assert sent == 10_000
    assert good_codes == {200}
    assert bad_codes <= {400, 413, 422}


SERVER = """
import sys
from treeguard._cli.serve import serve
sys.argv = ["treeguard", *sys.argv[1:]]
serve()
"""


@pytest.mark.slow
def test_uvicorn_end_to_end_with_the_cli(mlp_store, tmp_path):
    store, v = mlp_store
    port = free_port()
    cache = tmp_path / "cache"
    token = tmp_path / "token"
    token.write_text("a-control-token-for-the-test\n")
    token.chmod(0o600)
    proc = start_python(
        SERVER,
        "treeguard.examples.mlp:model",
        "--control-token-file",
        str(token),
        "--store",
        store.root,
        "--input",
        "['x']",
        "--port",
        str(port),
        "--cache-dir",
        str(cache),
        "--allow-unchecked",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=10) as c:
            end = time.monotonic() + 120
            while time.monotonic() < end and proc.poll() is None:
                try:
                    if c.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            else:
                proc.terminate()
                pytest.fail(f"the server never became ready: {stop(proc)[1][-2000:]}")
            r = c.post(URL, json=request(3))
            assert r.status_code == 200, r.text
            assert r.json()["model_version"] == v["v1"]
            from click.testing import CliRunner

            from treeguard._cli.main import main

            out = CliRunner().invoke(main, ["serve", "swap", base, v["v2"]])
            assert out.exit_code == 1 and "refused (401)" in out.output  # no token sent
            with_token = ["--control-token-file", str(token)]
            out = CliRunner().invoke(main, ["serve", "swap", base, v["v2"], *with_token])
            assert out.exit_code == 0, out.output
            assert out.output.startswith(f"serving {v['v2']} (previous {v['v1']}); 0 compiles")
            out = CliRunner().invoke(main, ["serve", "swap", base, v["tampered"], *with_token])
            assert out.exit_code == 1 and "refused (409)" in out.output
            assert c.post(URL, json=request(1)).json()["model_version"] == v["v2"]
            assert "treeguard_model_info" in c.get("/metrics").text
            big = c.post(URL, content=b"x" * (2 << 20))
            assert big.status_code == 413
    finally:
        proc.terminate()
        _, err = stop(proc)
    assert any(cache.iterdir())  # the persistent compilation cache was written
    assert "Uvicorn running on http://127.0.0.1" in err
