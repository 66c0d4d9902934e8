"""The data plane's short cuts keep every guard: inference answered past
starlette's router, and the batcher's queue without a timer per request."""

from __future__ import annotations

import asyncio
import gc
import json
import re
import threading
import tracemalloc
import weakref
from typing import Any

import httpx
import numpy as np
import prometheus_client
import pytest
from serving_support import client, infer_body, metric, mlp_spec, request, rows_of

# the REST app built with the bodies it waits for, closed here as uvicorn's
# shutdown closes them (``Server.app()`` keeps its own, which nothing closes):
# a body that starts after the close, or a deadline that fires with it, needs
# the close at a moment no client of a real server can choose (test_hardening
# stops a real server on a body still arriving)
from treeguard._src.serving import bodies, routes  # _src: the close at a moment no client picks
from treeguard.examples import mlp
from treeguard.serving import InferRequest, InferResult, Limits, RawInput, Server, ServingError

pytestmark = pytest.mark.anyio

URL = "/v2/models/mlp/infer"
SENTINEL = 123456.789


def parsed_request(rows: int) -> InferRequest:
    return InferRequest([RawInput("x", "FP32", [rows, 2], [0.5] * (2 * rows))])


async def test_inference_past_the_router_answers_as_through_it(mlp_store, mlp_server):
    _, v = mlp_store
    x = rows_of(np.random.default_rng(3), 3)
    app = mlp_server.app()
    async with app.router.lifespan_context(app):
        direct = httpx.ASGITransport(app)
        # a root path sends every request through starlette's middleware and router
        routed = httpx.ASGITransport(app, root_path="/api")
        async with (
            httpx.AsyncClient(transport=direct, base_url="http://t") as c,
            httpx.AsyncClient(transport=routed, base_url="http://t") as r,
        ):
            fast = await c.post(URL, json=infer_body(x))
            slow = await r.post("/api" + URL, json=infer_body(x))
            assert fast.status_code == slow.status_code == 200, (fast.text, slow.text)
            assert fast.json() == slow.json()
            assert fast.headers["content-type"] == slow.headers["content-type"]
            pinned = await c.post(f"/v2/models/mlp/versions/{v['v1']}/infer", json=infer_body(x))
            assert pinned.json() == fast.json()
            # what is not an inference request still goes through the router
            assert (await c.get(URL)).status_code == 405
            assert (await c.post("/v2/models/mlp/infer/")).status_code in (307, 404)


async def test_refusals_past_the_router_are_typed_and_quote_nothing(mlp_server):
    async with client(mlp_server) as c:
        bad = request(2, value=SENTINEL, name="nope")
        r = await c.post(URL, json=bad)
        assert r.status_code == 422 and "unknown name" in r.json()["error"]
        assert str(SENTINEL) not in r.text
        r = await c.post(URL, json=request(2, value=SENTINEL, cols=3))
        assert r.status_code == 422 and "shape" in r.json()["error"]
        assert str(SENTINEL) not in r.text
        r = await c.post(URL, content=b'{"inputs": [1, 2', headers={"content-type": "x"})
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        r = await c.post("/v2/models/other/infer", json=request(1))
        assert r.status_code == 404
        r = await c.post("/v2/models/mlp/versions/v999/infer", json=request(1))
        assert r.status_code == 404 and "not the one served" in r.json()["error"]
        r = await c.post(URL, content=b"{}", headers={"content-length": "x"})
        assert r.status_code == 400


async def test_an_unexpected_error_past_the_router_is_a_bare_500(mlp_server, monkeypatch):
    async def broken(*_: object, **__: object) -> None:
        raise RuntimeError(f"internal detail {SENTINEL}")

    app = mlp_server.app()
    async with app.router.lifespan_context(app):
        monkeypatch.setattr(mlp_server, "infer", broken)
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.post(URL, json=request(1))
        assert r.status_code == 500 and r.text == "Internal Server Error"
        with pytest.raises(RuntimeError):
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://t"
            ) as c:
                await c.post(URL, json=request(1))


async def test_a_request_whose_deadline_passes_in_the_queue_never_runs(mlp_store, monkeypatch):
    spec = mlp_spec(buckets=(1,), limits=Limits(max_delay_ms=1, timeout_s=0.05))
    server = Server(mlp.model, mlp_store[0], spec=spec)
    server.start()
    now = [0.0]
    server.clock = lambda: now[0]  # the batcher's deadlines on a clock this test moves
    runner = server.runner
    real_run = runner.run
    calls = []

    def slow_run(*args: object, **kw: object) -> object:
        calls.append(args[2])
        now[0] += 1.0  # the batch takes 1 s on the batcher's clock: the next one expires
        return real_run(*args, **kw)  # type: ignore[arg-type]

    app = server.app()
    async with app.router.lifespan_context(app):
        monkeypatch.setattr(runner, "run", slow_run)
        # both are queued before the worker takes the first: ``infer`` does not
        # wait before it queues, and the tasks run in the order they were made
        first = asyncio.ensure_future(server.infer(parsed_request(1), "mlp"))
        second = asyncio.ensure_future(server.infer(parsed_request(1), "mlp"))
        done = await asyncio.gather(first, second, return_exceptions=True)
    assert isinstance(done[0], InferResult)
    assert isinstance(done[1], ServingError) and done[1].status == 504
    assert calls == [1]  # the expired request never reached the device


async def test_a_batcher_that_does_not_run_refuses_at_once(mlp_store):
    server = Server(mlp.model, mlp_store[0], spec=mlp_spec())
    server.start()
    app = server.app()
    async with app.router.lifespan_context(app):
        batcher = server.batcher
        assert batcher is not None
        await batcher.stop()
        leaves = [np.zeros((1, 2), np.float32)]
        with pytest.raises(ServingError) as e:
            await asyncio.wait_for(batcher.submit(leaves, 1, (1,)), 5)
        assert e.value.status == 503


async def test_a_worker_that_fails_fails_those_waiting_and_refuses_the_next(mlp_store, caplog):
    server = Server(mlp.model, mlp_store[0], spec=mlp_spec(limits=Limits(max_delay_ms=1)))
    server.start()

    def broken(_: object) -> None:
        raise RuntimeError("metrics store broke")

    async with client(server) as c:
        server.metrics.queued_many = broken  # type: ignore[method-assign]
        r = await asyncio.wait_for(c.post(URL, json=request(1)), 5)
        assert r.status_code == 503 and r.json()["error"].startswith("the batcher failed")
        r = await asyncio.wait_for(c.post(URL, json=request(1)), 5)
        assert r.status_code == 503 and "not running" in r.json()["error"]
        # the batcher's failure is no version's: no rollback, however many are refused
        served = server.status()["active"]
        for _ in range(12):
            assert (await c.post(URL, json=request(1))).status_code == 503
        assert server.status()["active"] == served
        assert server.weights.fallback is None and "rolled back" not in caplog.text
        ready = await c.get("/v2/health/ready")
        assert ready.status_code == 503 and "batcher is not running" in ready.json()["error"]
    assert "worker failed: RuntimeError" in caplog.text


def test_metrics_recorded_from_several_threads_are_each_counted_once(mlp_store):
    # the hot path appends; a scrape (or a full queue) folds, beside threads still recording
    metrics = Server(mlp.model, mlp_store[0], spec=mlp_spec()).metrics
    per_thread = 6000  # over the fold threshold, so folds run while others record

    def record() -> None:
        for i in range(per_thread):
            metrics.request(200 if i % 3 else 422, 0.002)
            metrics.batch(3, 4, 0.001)
            metrics.queued(0.0)
            if i % 1000 == 0:
                metrics.render()

    threads = [threading.Thread(target=record) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = metrics.render().decode()

    def value(pattern: str) -> float:
        found = re.search(pattern + r" (\S+)", text)
        assert found, pattern
        return float(found.group(1))

    total = 3 * per_thread
    ok = value(r'treeguard_requests_total\{model="mlp",status="200"\}')
    refused = value(r'treeguard_requests_total\{model="mlp",status="422"\}')
    assert (ok, refused) == (total - 3 * 2000, 3 * 2000)
    assert value(r'treeguard_request_duration_seconds_count\{model="mlp"\}') == total
    assert value(r'treeguard_compute_duration_seconds_count\{bucket="4",model="mlp"\}') == total
    assert value(r'treeguard_batch_size_count\{model="mlp"\}') == total
    assert value(r'treeguard_padding_ratio_sum\{model="mlp"\}') == pytest.approx(total * 0.25)
    assert value(r'treeguard_queue_duration_seconds_count\{model="mlp"\}') == total
    # an exporter of the registry's own (as each Ray replica runs) folds too
    metrics.request(200, 0.002)
    text = prometheus_client.generate_latest(metrics.registry).decode()
    assert value(r'treeguard_request_duration_seconds_count\{model="mlp"\}') == total + 1


async def test_an_idle_batcher_holds_nothing_of_the_last_batch(mlp_store):
    server = Server(mlp.model, mlp_store[0], spec=mlp_spec(limits=Limits(max_delay_ms=1)))
    server.start()
    app = server.app()
    async with app.router.lifespan_context(app):
        batcher = server.batcher
        assert batcher is not None
        leaves = [np.zeros((1, 2), np.float32)]
        gone = weakref.ref(leaves[0])
        outputs, _ = await asyncio.wait_for(batcher.submit(leaves, 1, (1,)), 5)
        assert outputs[0][1].shape == (1, 1)
        del leaves, outputs
        await asyncio.sleep(0)  # the worker waits for the next request by now
        gc.collect()
        assert gone() is None


async def test_a_body_in_tiny_pieces_costs_a_small_multiple_of_its_size(mlp_server):
    head = json.dumps(request(1)).encode()
    room = min(200_000, mlp_server.spec.limits.max_request_bytes - len(head))
    body = head + b" " * room  # trailing blanks are JSON
    pieces = [body[i : i + 2] for i in range(0, len(body), 2)]
    pieces.reverse()
    sent: list[int] = []

    async def receive() -> dict[str, Any]:
        chunk = pieces.pop()
        return {"type": "http.request", "body": chunk, "more_body": bool(pieces)}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            sent.append(message["status"])

    scope = _infer_scope(len(body))
    app = mlp_server.app()
    async with app.router.lifespan_context(app):
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            await app(scope, receive, send)
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    assert sent == [200]
    # the body held once, the buffer it grows in and one copy: not a list of
    # 200,000 objects of 2 bytes each (about 20 times the body)
    assert peak < 5 * len(body), peak


async def test_a_server_whose_receive_is_no_coroutine_is_read_too(mlp_server):
    # some ASGI servers hand out their own awaitables: each is awaited, under the deadline
    body = json.dumps(request(2)).encode()
    parts = [body[:9], body[9:]]
    sent: list[Any] = []

    def receive() -> asyncio.Future[dict[str, Any]]:
        ready = asyncio.get_running_loop().create_future()
        chunk = parts.pop(0)
        ready.set_result({"type": "http.request", "body": chunk, "more_body": bool(parts)})
        return ready

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = _infer_scope(len(body))
    app = mlp_server.app()
    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 200
    assert json.loads(sent[1]["body"])["outputs"][0]["shape"] == [2, 1]


def _infer_scope(length: int) -> dict[str, Any]:
    """An ASGI scope of one inference POST of ``length`` bytes."""
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": URL, "raw_path": URL.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        "headers": [(b"content-length", b"%d" % length)],
    }  # fmt: skip


async def test_closing_the_bodies_answers_those_arriving_503_and_still_serves_whole_ones(
    mlp_server,
):
    reads = bodies.BodyReads()
    app = routes.build_app(mlp_server, bodies=reads)
    body = json.dumps(request(1)).encode()
    more = asyncio.Event()  # never set: the rest of the body never comes

    async def trickle() -> dict[str, Any]:
        if not started.is_set():
            started.set()
            return {"type": "http.request", "body": body[:9], "more_body": True}
        await more.wait()
        raise AssertionError("unreachable")

    async def whole() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    def sink(into: list[dict[str, Any]]) -> Any:
        async def send(message: dict[str, Any]) -> None:
            into.append(message)

        return send

    async with app.router.lifespan_context(app):
        started = asyncio.Event()
        cut: list[dict[str, Any]] = []
        waiting = asyncio.create_task(app(_infer_scope(len(body)), trickle, sink(cut)))
        await started.wait()
        while not reads.waiting:  # it waits for the rest of its body
            await asyncio.sleep(0)
        reads.close()
        await asyncio.wait_for(waiting, 5)
        late: list[dict[str, Any]] = []
        started = asyncio.Event()  # a body that begins to arrive after the close
        await asyncio.wait_for(app(_infer_scope(len(body)), trickle, sink(late)), 5)
        served: list[dict[str, Any]] = []
        await asyncio.wait_for(app(_infer_scope(len(body)), whole, sink(served)), 5)
        text = mlp_server.metrics.render().decode()
    for answer in (cut, late):
        assert answer[0]["status"] == 503
        assert (b"connection", b"close") in answer[0]["headers"]
        assert "shutting down" in json.loads(answer[1]["body"])["error"]
    assert served[0]["status"] == 200
    assert not reads.waiting
    assert metric(text, "treeguard_dropped_requests_total", reason="shutdown") == 2
    assert metric(text, "treeguard_dropped_requests_total", reason="body_timeout") == 0


async def test_a_body_deadline_and_the_close_at_once_end_the_read_once(mlp_server):
    reads = bodies.BodyReads()
    app = routes.build_app(mlp_server, bodies=reads)
    body = json.dumps(request(1)).encode()
    parts = [body[:9]]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if parts:
            return {"type": "http.request", "body": parts.pop(), "more_body": True}
        await asyncio.sleep(0)  # the app waits for this receive from here on
        # the body's deadline passes and the server shuts down before the
        # read sees either: the first ends it, the second cancels nothing more
        (deadline,) = reads.waiting
        deadline.expire()
        reads.close()
        await asyncio.sleep(5)
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async with app.router.lifespan_context(app):
        await asyncio.wait_for(app(_infer_scope(len(body)), receive, send), 5)
    assert sent[0]["status"] == 408


async def test_the_transport_bound_refusals_read_word_for_word(mlp_server):
    # pinned through the REST app, as a client meets them (the gRPC ones sit in the slow
    # tests of test_transport_bounds, with a live server; the JSON cost's in test_json_bounds)
    async with client(mlp_server) as c:
        r = await c.post(URL, json=request(1) | {"id": "r" * 257})
        assert (r.status_code, r.json()["error"]) == (
            422,
            "the request id must be a string of at most 256 characters",
        )
        r = await c.post(URL, json=request(1) | {"outputs": [{"name": "output"}] * 1025})
        assert (r.status_code, r.json()["error"]) == (
            422,
            "the request asks for 1025 outputs, over the limit of 1024\nhint: name each output once",
        )
        r = await c.post(URL, json=request(1) | {"outputs": [{"name": "output"}] * 1024})
        assert r.status_code == 200 and [o["name"] for o in r.json()["outputs"]] == ["output"]
        r = await c.post(URL, json=request(1) | {"outputs": [{"name": "nope"}]})
        assert (r.status_code, r.json()["error"]) == (
            422,
            "the request asks for an unknown output\nhint: the outputs are output",
        )
