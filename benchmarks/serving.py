"""What ``treeguard serve`` costs and buys, as ratios to plain endpoints measured
in this one process (apps driven in process through ``httpx.ASGITransport``).

1. Compiles over N random-size requests (1-64 rows) of the bundled model:
   treeguard (padded buckets) against a plain ``jax.jit`` endpoint.
2. Throughput at 32 concurrent one-row clients on a 4-layer, 1024-wide MLP:
   the dynamic batcher against one ``jit`` call per request, and its
   batching efficiency: against full 32-row batches run back to back, the
   ideal a batcher can approach (goal >= 0.8x), in rounds that alternate
   with the batcher's, median of the rounds' ratios. Through real sockets,
   ``hey`` (Debian's load generator, a separate process) with 32 concurrent
   one-row clients: the batcher against the same server with batch size 1.
3. Guard overhead (decoding, validation, bucketing, queue, judging, metrics)
   against a bare starlette + jit endpoint on the same bucket, sequential
   requests, median of several rounds (goal: p50 <= 1.10x); the same two
   apps called directly as ASGI (no client), the server's own time alone; and
   both under uvicorn through real sockets, driven by ``wrk`` with one
   connection (a client in its own process; skipped, saying so, without wrk).
4. p50 and p99 latency per bucket, and AOT compile time per bucket.
5. The wire: the nnx CNN on 32 images through real sockets on 127.0.0.1
   (uvicorn and gRPC in this process): REST with JSON tensors, REST with
   binary tensors and gRPC with raw contents, sequential requests.

    python benchmarks/serving.py [--requests 1000] [--rounds 5] [--sections 2,3]

``--sections`` runs only the sections listed (default: all); ``--hey-requests 0``
leaves out the run through sockets with ``hey``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import re
import shutil
import socket
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np
from _machine import inet_sockets

import treeguard
from treeguard import LeafSpec, spec_of
from treeguard.examples import mlp
from treeguard.serving import Limits, Server, ServingSpec, plan
from treeguard.verify import Model

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_compiles = [0]


def _count(event: str, duration_secs: float, **_: Any) -> None:
    if event == COMPILE_EVENT:
        _compiles[0] += 1


def bare_app(fn: Callable[[Any, Any], Any], params: Any, name: str) -> Any:
    """The baseline: parse, one jit call per request, reply."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def infer(request: Request) -> Any:
        doc = await request.json()
        item = doc["inputs"][0]
        x = np.asarray(item["data"], np.float32).reshape(item["shape"])
        out = np.asarray(fn(params, {"x": x}))
        return JSONResponse(
            {
                "model_name": name,
                "outputs": [
                    {
                        "name": "output",
                        "shape": list(out.shape),
                        "datatype": "FP32",
                        "data": out.reshape(-1).tolist(),
                    }
                ],
            }
        )

    return Starlette(routes=[Route(f"/v2/models/{name}/infer", infer, methods=["POST"])])


def body(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }


class Running:
    """A treeguard app with its lifespan entered, or a bare app."""

    def __init__(self, app: Any, lifespan: bool) -> None:
        self.app, self.lifespan = app, lifespan

    async def __aenter__(self) -> httpx.AsyncClient:
        self._ctx = self.app.router.lifespan_context(self.app) if self.lifespan else None
        if self._ctx is not None:
            await self._ctx.__aenter__()
        self._client = httpx.AsyncClient(
            transport=httpx.ASGITransport(self.app), base_url="http://bench", timeout=60
        )
        return self._client

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.aclose()
        if self._ctx is not None:
            await self._ctx.__aexit__(*exc)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


# -- 1. compiles ---------------------------------------------------------------


async def compiles(n: int) -> tuple[int, int]:
    store = treeguard.ArtifactStore(tempfile.mkdtemp())
    v = store.put(mlp.init(jax.random.key(0)))
    store.verify(v)
    store.promote(v)
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 65, n)
    xs = [rng.uniform(-1, 1, (int(k), 2)).astype(np.float32) for k in sizes]

    spec = ServingSpec.from_model(mlp.model, inputs=["['x']"], name="mlp")
    server = Server(mlp.model, store, spec=spec)
    _compiles[0] = 0
    server.start()
    async with Running(server.app(), True) as c:
        for i in range(0, n, 32):
            rs = await asyncio.gather(
                *(c.post("/v2/models/mlp/infer", json=body(x)) for x in xs[i : i + 32])
            )
            assert all(r.status_code == 200 for r in rs)
    ours = _compiles[0]

    params = store.load_version(v)
    fn = jax.jit(mlp.apply)
    _compiles[0] = 0
    async with Running(bare_app(fn, params, "mlp"), False) as c:
        for x in xs:
            assert (await c.post("/v2/models/mlp/infer", json=body(x))).status_code == 200
    return ours, _compiles[0]


# -- 2. throughput ---------------------------------------------------------------

IN, WIDTH, LAYERS = 16, 1024, 4


def wide_params(seed: int = 0) -> dict[str, Any]:
    """4 dense layers 1024 wide (16 inputs, one output): about 3.2M params."""
    rng = np.random.default_rng(seed)
    sizes = [IN] + [WIDTH] * LAYERS + [1]
    return {
        f"l{i}": {
            "w": (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
            "b": np.zeros(b, np.float32),
        }
        for i, (a, b) in enumerate(itertools.pairwise(sizes))
    }


def wide_apply(params: Any, batch: Any) -> Any:
    h = batch["x"]
    for i in range(LAYERS + 1):
        h = h @ params[f"l{i}"]["w"] + params[f"l{i}"]["b"]
        h = jnp.tanh(h) if i < LAYERS else h
    return h


WIDE = Model(
    init=lambda key: wide_params(),
    apply=wide_apply,
    loss=lambda p, b: jnp.mean(wide_apply(p, b)),
    batch_spec=spec_of({"x": LeafSpec(("B", IN), "float32")}),
    rtol=1e-5,
    atol=1e-6,
    name="wide",
)


async def clients(c: httpx.AsyncClient, url: str, n_clients: int, per_client: int) -> float:
    x = np.random.default_rng(1).uniform(-1, 1, (1, IN)).astype(np.float32)
    payload = body(x)

    async def one() -> None:
        for _ in range(per_client):
            r = await c.post(url, json=payload)
            assert r.status_code == 200, r.text

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n_clients)))
    return n_clients * per_client / (time.perf_counter() - start)


async def api_clients(submit: Callable[[], Any], n_clients: int, per_client: int) -> float:
    async def one() -> None:
        for _ in range(per_client):
            await submit()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n_clients)))
    return n_clients * per_client / (time.perf_counter() - start)


async def throughput(per_client: int) -> tuple[float, float, float, float, float, float]:
    store = treeguard.ArtifactStore(tempfile.mkdtemp())
    params = wide_params()
    v = store.put(params)
    store.verify(v)
    store.promote(v)
    spec = ServingSpec.from_model(
        WIDE, buckets=(1, 2, 4, 8, 16, 32), name="wide", limits=Limits(max_delay_ms=2)
    )
    server = Server(WIDE, store, spec=spec)
    server.start()
    fn = jax.jit(wide_apply)
    dev = jax.device_put(params)
    x1 = jnp.zeros((1, IN), jnp.float32)
    row = np.zeros((1, IN), np.float32)

    async def plain_call() -> None:
        np.asarray(fn(dev, {"x": row}))
        await asyncio.sleep(0)

    async with Running(server.app(), True) as c:
        await clients(c, "/v2/models/wide/infer", 32, 2)
        ours = await clients(c, "/v2/models/wide/infer", 32, per_client)
        assert server.batcher is not None
        batcher = server.batcher

        async def batched_call() -> None:
            await batcher.submit([row], 1, (1,))

        x32 = np.zeros((32, IN), np.float32)

        def full_batches(n: int) -> float:
            """Rows per second of ``n`` rows as full 32-row batches back to back."""
            start = time.perf_counter()
            for _ in range(n // 32):
                np.asarray(fn(dev, {"x": x32}))
            return n // 32 * 32 / (time.perf_counter() - start)

        await api_clients(batched_call, 32, 2)
        await api_clients(plain_call, 32, 2)
        full_batches(320)
        # the three alternate in each round, so a noisy neighbour weighs on all
        api = [
            (
                await api_clients(batched_call, 32, per_client * 5),
                await api_clients(plain_call, 32, per_client * 5),
                full_batches(32 * per_client * 5),
            )
            for _ in range(5)
        ]
    api_ours = statistics.median(a for a, _, _ in api)
    api_base = statistics.median(b for _, b, _ in api)
    EFFICIENCY.extend(a / c for a, _, c in api)
    FULL.extend(c for _, _, c in api)
    jax.block_until_ready(fn(dev, {"x": x1}))

    def call_ms(x: Any) -> float:
        jax.block_until_ready(fn(dev, {"x": x}))
        t = []
        for _ in range(30):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(dev, {"x": x}))
            t.append(time.perf_counter() - t0)
        return statistics.median(t) * 1000

    single_ms = call_ms(x1)
    batch_ms = call_ms(jnp.zeros((32, IN), jnp.float32))
    async with Running(bare_app(fn, dev, "wide"), False) as c:
        await clients(c, "/v2/models/wide/infer", 32, 2)
        base = await clients(c, "/v2/models/wide/infer", 32, per_client)
    return ours, base, single_ms, batch_ms, api_ours, api_base


# -- 3 and 4. overhead and latency per bucket ------------------------------------


async def asgi_call(app: Any, path: str, raw: bytes) -> None:
    """One POST straight into an ASGI app: no client, no socket."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        "headers": [(b"host", b"bench"), (b"content-type", b"application/json"),
                    (b"content-length", b"%d" % len(raw))],
    }  # fmt: skip
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    status = []

    async def receive() -> Any:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    assert status == [200], status


async def server_side(app: Any, bare: Any, rounds: int, n: int) -> list[tuple[float, float]]:
    """Median µs per request of each app called directly, alternating, per round."""
    payload = body(np.random.default_rng(8).uniform(-1, 1, (8, 2)).astype(np.float32))
    raw = json.dumps(payload).encode()
    url = "/v2/models/mlp/infer"

    async def run(a: Any, k: int) -> float:
        t = []
        for _ in range(k):
            t0 = time.perf_counter()
            await asgi_call(a, url, raw)
            t.append(time.perf_counter() - t0)
        return statistics.median(t) * 1e6

    await run(app, 50)
    await run(bare, 50)
    out = []
    for i in range(rounds):
        if i % 2:
            b, a = await run(bare, n), await run(app, n)
        else:
            a, b = await run(app, n), await run(bare, n)
        out.append((a, b))
    return out


async def latencies(c: httpx.AsyncClient, url: str, rows: int, n: int) -> list[float]:
    rng = np.random.default_rng(rows)
    payload = body(rng.uniform(-1, 1, (rows, 2)).astype(np.float32))
    for _ in range(10):
        await c.post(url, json=payload)
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.post(url, json=payload)
        out.append(time.perf_counter() - t0)
        assert r.status_code == 200
    return out


async def through_wrk(ours: Any, bare: Any, raw: bytes, rounds: int) -> list[tuple[float, float]]:
    """p50 µs of each app under uvicorn, from ``wrk`` with one connection (a
    client in its own process, through real sockets), alternating, per round;
    empty when wrk is not installed."""
    if shutil.which("wrk") is None:
        return []
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(raw.decode())}\n'
                     'wrk.headers["Content-Type"] = "application/json"\n')  # fmt: skip

    async def p50(http_port: int, seconds: int) -> float:
        url = f"http://127.0.0.1:{http_port}/v2/models/mlp/infer"
        cmd = ["wrk", "-t1", "-c1", f"-d{seconds}s", "--latency", "-s", script.name, url]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), seconds + 60)
        text = out.decode()
        assert "Non-2xx" not in text and "Socket errors" not in text, text
        found = re.search(r"50%\s+([\d.]+)(us|ms)", text)
        assert found, text
        return float(found.group(1)) * (1000 if found.group(2) == "ms" else 1)

    out = []
    # ours is running already (its lifespan entered by the caller)
    async with under_uvicorn(ours, "off") as a, under_uvicorn(bare) as b:
        await p50(a, 1)
        await p50(b, 1)
        for i in range(rounds):
            if i % 2:
                y, x = await p50(b, 2), await p50(a, 2)
            else:
                x, y = await p50(a, 2), await p50(b, 2)
            out.append((x, y))
    return out


async def overhead(
    rounds: int, n: int
) -> tuple[
    list[tuple[float, float]], dict[int, Any], list[tuple[float, float]], list[tuple[float, float]]
]:
    store = treeguard.ArtifactStore(tempfile.mkdtemp())
    v = store.put(mlp.init(jax.random.key(0)))
    store.verify(v)
    store.promote(v)
    # a sequential client: no batch to gather, so no delay to wait
    spec = ServingSpec.from_model(
        mlp.model, inputs=["['x']"], name="mlp", limits=Limits(max_delay_ms=0)
    )
    server = Server(mlp.model, store, spec=spec)
    server.start()
    params = jax.device_put(store.load_version(v))
    fn = jax.jit(mlp.apply)
    jax.block_until_ready(fn(params, {"x": np.zeros((8, 2), np.float32)}))
    pairs = []
    per_bucket: dict[int, list[float]] = {b: [] for b in spec.buckets}
    ours_app, bare_app_ = server.app(), bare_app(fn, params, "mlp")
    async with (
        Running(ours_app, True) as ours,
        Running(bare_app_, False) as bare,
    ):
        for i in range(rounds):
            if i % 2:
                b = await latencies(bare, "/v2/models/mlp/infer", 8, n)
                a = await latencies(ours, "/v2/models/mlp/infer", 8, n)
            else:
                a = await latencies(ours, "/v2/models/mlp/infer", 8, n)
                b = await latencies(bare, "/v2/models/mlp/infer", 8, n)
            pairs.append((statistics.median(a), statistics.median(b)))
        for bucket in spec.buckets:
            per_bucket[bucket] = await latencies(ours, "/v2/models/mlp/infer", bucket, n)
        direct = await server_side(ours_app, bare_app_, rounds, n * 3)
        raw = json.dumps(body(np.random.default_rng(8).uniform(-1, 1, (8, 2)).astype(np.float32)))
        sockets = await through_wrk(ours_app, bare_app_, raw.encode(), rounds)
    compile_s = {p.bucket: p.compile_s for p in plan(mlp.model, spec).buckets}
    table = {
        b: (pct(per_bucket[b], 50) * 1e3, pct(per_bucket[b], 99) * 1e3, compile_s[b] * 1e3)
        for b in spec.buckets
    }
    return pairs, table, direct, sockets


# -- 2b. batching through real sockets, driven by hey ------------------------------


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def under_uvicorn(app: Any, lifespan: str = "auto") -> AsyncIterator[int]:
    """``app`` served by uvicorn in this process on 127.0.0.1; yields its port.
    ``lifespan="off"`` serves an app whose lifespan is already entered."""
    import uvicorn

    http_port = port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=http_port,
        log_level="error",
        access_log=False,
        lifespan=lifespan,
    )
    runner = uvicorn.Server(config)
    task = asyncio.create_task(runner.serve())
    try:
        for _ in range(3000):
            if runner.started:
                break
            await asyncio.sleep(0.01)
        assert runner.started, "uvicorn did not start within 30 s"
        yield http_port
    finally:
        runner.should_exit = True
        await task


#: Per round of section 2: the batcher API's rate over full batches', and their rows/s.
EFFICIENCY: list[float] = []
FULL: list[float] = []
#: CPU seconds (this process, then hey) and requests of every ``hey_rate`` run.
CPU: dict[str, list[float]] = {"server": [], "hey": [], "requests": []}


async def hey_rate(server: Server, body_file: str, n: int, clients: int) -> float:
    """Requests per second that ``hey`` (a separate process) gets from ``server``
    under uvicorn in this process; every response must be a 200. The CPU time
    each side spent goes to ``CPU``."""
    import resource

    n -= n % clients  # hey gives each client n // clients requests
    async with under_uvicorn(server.app()) as http_port:
        url = f"http://127.0.0.1:{http_port}/v2/models/{server.spec.name}/infer"
        hey = ["hey", "-n", str(n), "-c", str(clients), "-t", "30", "-m", "POST",
               "-T", "application/json", "-D", body_file, url]  # fmt: skip
        mine, theirs = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = await asyncio.create_subprocess_exec(*hey, stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        CPU["server"].append(time.process_time() - mine)
        CPU["hey"].append(after.ru_utime + after.ru_stime - theirs.ru_utime - theirs.ru_stime)
        CPU["requests"].append(n)
        text = out.decode()
        codes = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", text))
        assert codes == {"200": str(n)}, text
        found = re.search(r"Requests/sec:\s+([\d.]+)", text)
        assert found, text
        return float(found.group(1))


async def batching_http(n: int, rounds: int) -> tuple[float, float] | None:
    """hey with 32 concurrent one-row clients: the batcher (buckets up to 32)
    against the same server with batch size 1, alternating, median of rounds."""
    if shutil.which("hey") is None:
        return None
    store = treeguard.ArtifactStore(tempfile.mkdtemp())
    v = store.put(wide_params())
    store.verify(v)
    store.promote(v)
    limits = Limits(max_delay_ms=2)
    batched = Server(
        WIDE, store, spec=ServingSpec.from_model(WIDE, buckets=(1, 2, 4, 8, 16, 32),
                                                 name="wide", limits=limits)
    )  # fmt: skip
    single = Server(
        WIDE, store, spec=ServingSpec.from_model(WIDE, buckets=(1,), name="wide", limits=limits)
    )
    batched.start()
    single.start()
    x = np.random.default_rng(1).uniform(-1, 1, (1, IN)).astype(np.float32)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(body(x), f)
    await hey_rate(batched, f.name, 200, 32)
    await hey_rate(single, f.name, 200, 32)
    for column in CPU.values():
        column.clear()
    rates: list[tuple[float, float]] = []
    for i in range(rounds):
        if i % 2:
            b = await hey_rate(single, f.name, n, 32)
            a = await hey_rate(batched, f.name, n, 32)
        else:
            a = await hey_rate(batched, f.name, n, 32)
            b = await hey_rate(single, f.name, n, 32)
        rates.append((a, b))
    return statistics.median(a for a, _ in rates), statistics.median(b for _, b in rates)


# -- 5. the wire -----------------------------------------------------------------


async def wires(rounds: int, n: int) -> dict[str, float]:
    import grpc

    # gRPC's messages and transport on purpose: the wire itself is what this section times
    from treeguard._src.serving import messages
    from treeguard._src.serving.grpc_transport import grpc_transport
    from treeguard.examples import cnn

    pb = messages.load_messages()

    store = treeguard.ArtifactStore(tempfile.mkdtemp())
    v = store.put(cnn.init(jax.random.key(0)))
    store.verify(v)
    store.promote(v)
    spec = ServingSpec.from_model(
        cnn.model, inputs=["['image']"], buckets=(32,), name="cnn", limits=Limits(max_delay_ms=0)
    )
    server = Server(cnn.model, store, spec=spec)
    server.start()
    grpc_port = port()
    server.transports.append(grpc_transport(server, port=grpc_port))
    x = np.random.default_rng(0).uniform(0, 9, (32, 8, 8, 1)).astype(np.float32)
    json_body = {
        "inputs": [
            {
                "name": "image",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ]
    }
    header = json.dumps({
        "inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes}}],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    binary = header + x.tobytes()
    message = pb.ModelInferRequest(model_name="cnn", raw_input_contents=[x.tobytes()])
    message.inputs.add(name="image", datatype="FP32", shape=list(x.shape))
    results: dict[str, list[float]] = {"REST, JSON tensors": [], "REST, binary tensors": [],
                                       "gRPC, raw contents": []}  # fmt: skip
    async with (
        under_uvicorn(server.app()) as http_port,
        httpx.AsyncClient(timeout=60) as c,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        url = f"http://127.0.0.1:{http_port}/v2/models/cnn/infer"
        infer = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.ModelInferResponse.FromString,
        )

        async def rest_json() -> None:
            assert (await c.post(url, json=json_body)).status_code == 200

        async def rest_binary() -> None:
            r = await c.post(
                url, content=binary, headers={"Inference-Header-Content-Length": str(len(header))}
            )
            assert r.status_code == 200

        async def grpc_raw() -> None:
            await infer(message)

        calls = dict(zip(results, (rest_json, rest_binary, grpc_raw), strict=True))
        for call in calls.values():
            for _ in range(10):
                await call()
        for i in range(rounds):
            order = list(calls.items())
            for label, call in order if i % 2 else reversed(order):
                t = []
                for _ in range(n):
                    t0 = time.perf_counter()
                    await call()
                    t.append(time.perf_counter() - t0)
                results[label].append(statistics.median(t) * 1e3)
    return {label: statistics.median(ms) for label, ms in results.items()}


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--per-client", type=int, default=10)
    ap.add_argument("--hey-requests", type=int, default=2000)
    ap.add_argument("--sections", default="1,2,3,4,5", help="the sections to run, e.g. 2,3")
    args = ap.parse_args()
    sections = {int(s) for s in args.sections.split(",")}
    jax.monitoring.register_event_duration_secs_listener(_count)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.devices()[0].device_kind})")

    if 1 in sections:
        ours, plain = await compiles(args.requests)
        print(f"\n1. compiles over {args.requests} requests of 1-64 rows")
        print(f"   treeguard: {ours} (all at warm-up)   plain jax.jit endpoint: {plain}")
    if 2 in sections:
        await section_2(args.per_client, args.hey_requests)
    if sections & {3, 4}:
        await sections_3_4(args.rounds, sections)
    if 5 in sections and not inet_sockets():
        print("\n5. skipped: this machine opens no internet socket, not even on the loopback")
    elif 5 in sections:
        wire = await wires(args.rounds, 60)
        print("\n5. the wire: nnx CNN, 32 images (8x8x1), sequential requests, p50 ms")
        for label, ms in wire.items():
            print(f"   {label:<22} {ms:8.3f}   {ms / wire['REST, JSON tensors']:.2f}x of JSON")


async def section_2(per_client: int, hey_requests: int) -> None:
    mine, base, single_ms, batch_ms, api_mine, api_base = await throughput(per_client)
    print(f"\n2. throughput, 32 concurrent one-row clients, {LAYERS}x{WIDTH} MLP")
    print(
        f"   one jit call: 1 row {single_ms:.2f} ms, 32 rows {batch_ms:.2f} ms "
        f"(so batching can gain at most {32 * single_ms / batch_ms:.1f}x here)"
    )
    print(f"   at the batcher API: batcher {api_mine:.0f} req/s, one call per request")
    print(f"   {api_base:.0f} req/s, ratio {api_mine / api_base:.2f}x (goal >= 4x)")
    print(f"   through HTTP in process: batcher {mine:.0f} req/s, one call per request")
    print(f"   {base:.0f} req/s, ratio {mine / base:.2f}x (the in-process client shares the CPU)")
    ideal = statistics.median(FULL)
    print(
        f"   batching efficiency: full 32-row batches back to back {ideal:.0f} rows/s "
        f"(median of rounds alternating with the batcher); batcher API "
        f"{statistics.median(EFFICIENCY):.2f}x (rounds: "
        f"{', '.join(f'{e:.2f}x' for e in EFFICIENCY)}), through HTTP {mine / ideal:.2f}x "
        f"(goal >= 0.8x)"
    )

    hey = await batching_http(hey_requests, 3) if hey_requests else None
    if hey is None and hey_requests:
        print("   through sockets with hey: hey is not installed (apt-get install hey), skipped")
    elif hey is not None:
        batched, single = hey
        print(f"   through sockets, hey -c 32 (a separate process): batcher {batched:.0f} req/s, "
              f"batch size 1 {single:.0f} req/s, ratio {batched / single:.2f}x; "
              f"efficiency {batched / ideal:.2f}x of full batches")  # fmt: skip
        requests = sum(CPU["requests"])
        server_us = sum(CPU["server"]) / requests * 1e6
        hey_us = sum(CPU["hey"]) / requests * 1e6
        row_us = batch_ms * 1000 / 32
        print(f"   CPU per request under hey (both servers): server process {server_us:.0f} us, "
              f"hey {hey_us:.0f} us; one row of a full batch {row_us:.0f} us of wall time. "
              f"0.8x of full batches is {0.8 * ideal:.0f} req/s, "
              f"{2e6 / (0.8 * ideal):.0f} us of CPU per request on 2 cores")  # fmt: skip


async def sections_3_4(rounds: int, sections: set[int]) -> None:
    pairs, table, direct, sockets = await overhead(rounds, 100)
    if 3 in sections:
        print_overhead(pairs, direct, sockets)
    if 4 in sections:
        print("\n4. per bucket: latency through the app, AOT compile time")
        print("   bucket    p50 ms    p99 ms   compile ms")
        for b, (p50, p99, c) in table.items():
            print(f"   {b:>6} {p50:>9.3f} {p99:>9.3f} {c:>12.0f}")


def print_overhead(
    pairs: list[tuple[float, float]],
    direct: list[tuple[float, float]],
    sockets: list[tuple[float, float]],
) -> None:
    ratios = [a / b for a, b in pairs]
    ours_p50 = statistics.median(a for a, _ in pairs) * 1e3
    bare_p50 = statistics.median(b for _, b in pairs) * 1e3
    print("\n3. guard overhead, bucket 8, sequential requests, median of rounds")
    print(f"   treeguard p50 {ours_p50:.3f} ms   bare starlette+jit p50 {bare_p50:.3f} ms")
    print(
        f"   ratio {statistics.median(ratios):.2f}x of p50 "
        f"(rounds: {', '.join(f'{r:.2f}x' for r in ratios)}; goal <= 1.10x)"
    )
    d_ours = statistics.median(a for a, _ in direct)
    d_bare = statistics.median(b for _, b in direct)
    print(
        f"   the apps called directly (no client): treeguard {d_ours:.0f} us, bare {d_bare:.0f} us"
        f", {d_ours - d_bare:.0f} us more per request, ratio {d_ours / d_bare:.2f}x"
    )
    if not sockets:
        print("   through sockets with wrk: wrk is not installed (apt-get install wrk), skipped")
        return
    ratios = [a / b for a, b in sockets]
    print(
        f"   through sockets (uvicorn; wrk -c1 in its own process): treeguard p50 "
        f"{statistics.median(a for a, _ in sockets):.0f} us, bare "
        f"{statistics.median(b for _, b in sockets):.0f} us, ratio "
        f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{r:.2f}x' for r in ratios)})"
    )


if __name__ == "__main__":
    asyncio.run(main())
