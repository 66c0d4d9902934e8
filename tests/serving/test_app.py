"""The KServe V2 app in process: inference, refusals, limits, metrics, privacy."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from machine import matmul_tolerance
from prometheus_client.parser import text_string_to_metric_families
from serving_support import client, infer_body, metric, mlp_reference, mlp_spec, request, rows_of

from treeguard.examples import mlp
from treeguard.serving import Limits, Server

pytestmark = pytest.mark.anyio

URL = "/v2/models/mlp/infer"


async def test_health_model_and_inference_match_apply(mlp_store, mlp_server):
    store, v = mlp_store
    server = mlp_server
    async with client(server) as c:
        assert (await c.get("/v2/health/live")).json() == {"live": True}
        assert (await c.get("/v2/health/ready")).status_code == 200
        meta = (await c.get("/v2/models/mlp")).json()
        assert meta["inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [-1, 2], "parameters": {"key_path": "['x']"}}
        ]
        assert meta["outputs"] == [
            {"name": "output", "datatype": "FP32", "shape": [-1, 1], "parameters": {"key_path": ""}}
        ]
        assert (await c.get("/v2/models/other")).status_code == 404
        x = rows_of(np.random.default_rng(0), 3)
        r = await c.post(URL, json=infer_body(x))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model_version"] == v["v1"]
        out = body["outputs"][0]
        assert out["shape"] == [3, 1] and out["datatype"] == "FP32"
        want = mlp_reference(store.load_version(v["v1"]), x)
        np.testing.assert_allclose(
            np.reshape(out["data"], (3, 1)), want, **matmul_tolerance(1e-5, 1e-6)
        )
        status = (await c.get("/v2/treeguard/status")).json()
        assert status["active"] == v["v1"] and status["buckets"] == [1, 4, 16]
        assert status["compiles"] == {"warmup": 3, "serving": 0, "swap": 0, "shadow": 0}


async def test_not_ready_until_warm(mlp_store):
    store, _ = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec())
    app = server.app()
    import httpx

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        assert (await c.get("/v2/health/ready")).status_code == 503
        r = await c.post(URL, json=request(1))
        assert r.status_code == 503 and "not ready" in r.json()["error"]


async def test_concurrent_requests_are_batched_in_order_without_padding_leaks(
    mlp_store, mlp_server
):
    store, v = mlp_store
    server = mlp_server
    params = store.load_version(v["v1"])
    rng = np.random.default_rng(1)
    xs = [rows_of(rng, int(n)) for n in rng.integers(1, 17, 24)]
    async with client(server) as c:
        before = (await c.get("/metrics")).text
        results = await asyncio.gather(*(c.post(URL, json=infer_body(x)) for x in xs))
        text = (await c.get("/metrics")).text
    for x, r in zip(xs, results):
        out = r.json()["outputs"][0]
        assert out["shape"] == [len(x), 1]
        want = mlp_reference(params, x)
        np.testing.assert_allclose(
            np.reshape(out["data"], want.shape), want, **matmul_tolerance(1e-5, 1e-6)
        )
    assert server.status()["compiles"]["serving"] == 0

    def delta(name):
        return metric(text, name, model="mlp") - metric(before, name, model="mlp")

    assert 1 <= delta("treeguard_batch_size_count") < len(xs)  # gathered, not one per request
    assert delta("treeguard_batch_size_sum") == sum(len(x) for x in xs)


@pytest.mark.slow
async def test_split_runs_oversized_requests_on_one_version(mlp_store):
    store, v = mlp_store
    params = store.load_version(v["v1"])
    x = rows_of(np.random.default_rng(2), 40)
    server = Server(mlp.model, store, spec=mlp_spec(overflow="split"))
    async with client(server) as c:
        r = await c.post(URL, json=infer_body(x))
    out = r.json()["outputs"][0]
    np.testing.assert_allclose(
        np.reshape(out["data"], (40, 1)), mlp_reference(params, x), **matmul_tolerance(1e-5, 1e-6)
    )
    assert r.json()["model_version"] == v["v1"]
    assert server.status()["compiles"]["serving"] == 0


async def test_reject_refuses_requests_over_the_largest_bucket(mlp_server):
    x = rows_of(np.random.default_rng(2), 40)
    async with client(mlp_server) as c:
        r = await c.post(URL, json=infer_body(x))
    assert r.status_code == 413
    assert r.json() == {
        "error": "the request has 40 rows, over the largest batch bucket 16; "
        "hint: send at most 16 rows per request"
    }


BAD = [
    (b"{", 400, "the body is not valid JSON: Expecting property name enclosed in double quotes"),
    (
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [NaN, 1]}]}',
        400,
        "NaN is not a JSON number",
    ),
    (b"[" * 20_000 + b"]" * 20_000, 400, "the body nests too deep to be a request"),
    (b'{"inputs": [], "inputs": []}', 400, "a duplicate key"),
    (
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1e999, 1]}]}',
        422,
        "input ['x']: a value is beyond the range of FP32",
    ),
    (  # an integer no float holds: refused by name, never a 500
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 1'
        + b"0" * 400
        + b"]}]}",
        422,
        "input ['x']: a value is beyond the range of FP32",
    ),
    (
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, '
        + b"9" * 5000
        + b"]}]}",
        400,
        "the body is not valid JSON",
    ),
    (json.dumps({"inputs": 3}).encode(), 422, 'the body has no "inputs" list'),
    (
        json.dumps(request(2, cols=3)).encode(),
        422,
        "input ['x']: shape [2,3] in the request, f32[B,2] in the spec",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
        ).encode(),
        422,
        "input ['x']: shape [2] in the request, f32[B,2] in the spec",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1]}]}
        ).encode(),
        422,
        "input ['x']: data has 1 values, shape [2,2] needs 4",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT8", "data": [1, 2]}]}
        ).encode(),
        422,
        "input ['x']: datatype INT8 in the request, FP32 in the spec",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": ["a", 2]}]}
        ).encode(),
        422,
        "input ['x']: data holds text for datatype FP32",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [[1], 2]}]}
        ).encode(),
        422,
        "input ['x']: data is ragged",
    ),
    (
        json.dumps(request(1, name="secret_name")).encode(),
        422,
        "inputs[0] has an unknown name\nhint: the inputs are x",
    ),
    (json.dumps({"inputs": request(1)["inputs"] * 2}).encode(), 422, "input ['x'] is given twice"),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [-1, 2], "datatype": "FP32", "data": []}]}
        ).encode(),
        422,
        "input ['x']: shape must be a list of sizes",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [0, 2], "datatype": "FP32", "data": []}]}
        ).encode(),
        422,
        "the request has 0 rows",
    ),
    (
        json.dumps(
            {"inputs": [{"name": "x", "shape": [2**62, 2], "datatype": "FP32", "data": []}]}
        ).encode(),
        422,
        "input ['x']: shape must be a list of sizes",
    ),
]


async def test_bad_input_is_refused_with_the_path_and_no_value(mlp_server):
    server = mlp_server
    async with client(server) as c:
        for body, status, message in BAD:
            r = await c.post(URL, content=body, headers={"content-type": "application/json"})
            assert r.status_code == status, r.text
            assert message in r.json()["error"], r.text
            assert "secret_name" not in r.text and "9999" not in r.text
            assert (await c.post(URL, json=request(2))).status_code == 200  # still serving
    assert server.status()["compiles"]["serving"] == 0


async def test_oversize_is_refused_before_reading_the_body_or_device_work(mlp_server):
    server = mlp_server
    limit = 64 * 1024

    async def stream():
        for _ in range(100):
            yield b" " * 1000

    async with client(server) as c:
        before = (await c.get("/metrics")).text
        big = json.dumps(request(16)).encode() + b" " * limit
        r = await c.post(URL, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert r.json()["error"].startswith(f"the body announces {len(big)} bytes, over the limit")
        r = await c.post(URL, content=stream())  # no content-length: cut off while streaming
        assert r.status_code == 413 and f"over the limit of {limit} bytes" in r.json()["error"]
        after = (await c.get("/metrics")).text

    def delta(name, **labels):
        return metric(after, name, model="mlp", **labels) - metric(
            before, name, model="mlp", **labels
        )

    assert delta("treeguard_batch_size_count") == 0
    assert delta("treeguard_compute_duration_seconds_count", bucket="16") == 0
    assert delta("treeguard_invalid_inputs_total", reason="size") == 2


@pytest.mark.slow
async def test_full_queue_answers_429(mlp_store):
    store, _ = mlp_store
    server = Server(mlp.model, store, spec=mlp_spec(limits=Limits(max_queue=2, max_delay_ms=200)))
    async with client(server) as c:
        rs = await asyncio.gather(*(c.post(URL, json=request(16)) for _ in range(12)))
    codes = [r.status_code for r in rs]
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
    full = next(r for r in rs if r.status_code == 429)
    assert full.json()["error"].startswith("the queue is full")


async def test_metrics_parse_and_privacy_sentinel_never_leaks(mlp_server, caplog):
    server = mlp_server
    sentinel = 13371337.25
    caplog.set_level(logging.DEBUG)
    texts = []
    async with client(server) as c:
        before = (await c.get("/metrics")).text
        good = await c.post(URL, json=request(3, value=sentinel))
        assert good.status_code == 200
        for body in (
            request(3, value=sentinel, cols=5),
            request(3, value=sentinel, name=str(sentinel)),
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [sentinel]}]},
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": str(sentinel), "data": [1, 2]}]},
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]},
            {
                "inputs": [
                    {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [sentinel, "s"]}
                ]
            },
        ):
            r = await c.post(URL, json=body)
            assert r.status_code in (413, 422), r.text
            texts.append(r.text)
        text = (await c.get("/metrics")).text
        texts += [text, (await c.get("/v2/treeguard/status")).text]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "treeguard_requests",
        "treeguard_request_duration_seconds",
        "treeguard_queue_duration_seconds",
        "treeguard_compute_duration_seconds",
        "treeguard_batch_size",
        "treeguard_padding_ratio",
        "treeguard_compiles",
        "treeguard_invalid_inputs",
        "treeguard_nonfinite_outputs",
        "treeguard_queue_depth",
        "treeguard_swaps",
        "treeguard_rollbacks",
        "treeguard_model_info",
    ):
        assert name in families, name

    def delta(name, **labels):
        return metric(text, name, model="mlp", **labels) - metric(
            before, name, model="mlp", **labels
        )

    assert delta("treeguard_requests_total", status="200") == 1
    assert delta("treeguard_requests_total", status="422") == 6
    assert delta("treeguard_invalid_inputs_total", reason="shape") == 2
    assert delta("treeguard_invalid_inputs_total", reason="dtype") == 3
    assert metric(text, "treeguard_compiles_total", model="mlp", phase="warmup") == 3
    assert metric(text, "treeguard_compiles_total", model="mlp", phase="serving") == 0
    texts += [r.getMessage() for r in caplog.records]
    for t in texts:
        assert "13371337" not in t and "1.337133" not in t


async def test_a_version_that_cannot_start_is_reported_not_ready(tmp_path):
    import treeguard

    store = treeguard.ArtifactStore.init(tmp_path / "empty")
    server = Server(mlp.model, store, spec=mlp_spec())
    app = server.app()
    import httpx

    transport = httpx.ASGITransport(app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        for _ in range(3_000):  # a bound, not a verdict: it stops as soon as the start failed
            r = await c.get("/v2/health/ready")
            if "no current version" in r.text:
                break
            await asyncio.sleep(0.01)
        assert r.status_code == 503 and "has no current version" in r.json()["error"]


async def test_a_body_that_is_not_utf8_is_refused_without_echoing_a_byte(mlp_server):
    async with client(mlp_server) as c:
        body = b'{"inputs": [{"name": "\xe9\xe9\xe9"}]}'
        r = await c.post(URL, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"].startswith("the body is not UTF-8 (at byte 22)")
    assert "0xe9" not in r.text and "\\xe9" not in r.text
