"""The ASGI app: the KServe V2 protocol, treeguard's swap endpoints, metrics.

``Server`` ties the parts together (spec, slots, batcher, metrics) and
``Server.app()`` is a starlette app for uvicorn or ``httpx.ASGITransport``.
starlette is imported only here, when an app is built.

Routes:
  ``GET /v2/health/live``, ``GET /v2/health/ready`` (503 until warm),
  ``GET /v2/models/{name}``, ``POST /v2/models/{name}/infer``,
  ``POST /v2/treeguard/swap`` ``{"version": V}``, ``POST /v2/treeguard/rollback``,
  ``GET /v2/treeguard/status``, ``GET /metrics``.

Errors are ``{"error": message}`` with 400/422 for invalid input, 413 over
the limits, 429 when the queue is full, 503 while not ready; a message names
the input's path and the expected and actual shape or dtype, never a value.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from ..errors import InvalidRequestError, ServingError
from ..verify.model import Model
from .batcher import Batcher
from .compile_guard import enable_persistent_cache
from .metrics import Metrics
from .protocol import Decoder, datatype_of, encode, parse_json
from .slots import Slots, WatchdogPolicy
from .spec import ServingSpec

log = logging.getLogger("treeguard.serving")


class Server:
    """One model served from a store.

    Args:
      model: the ``treeguard.verify.Model``.
      store: the ``ArtifactStore`` (or its root).
      spec: the ``ServingSpec``; default: every batch input of the model.
      version: the version to start with; default the store's current one.
      cache_dir: where the persistent compilation cache lives; None leaves
        JAX's setting alone.
      memory_budget: the bytes all loaded params may take (see ``Slots``).
      watchdog: the ``WatchdogPolicy`` of automatic rollback.
      watch_s: poll the store's current pointer this often and swap to a
        new current version; None not to watch.

    Example:
      >>> import tempfile, jax
      >>> import treeguard
      >>> from treeguard.examples import mlp
      >>> store = treeguard.ArtifactStore(tempfile.mkdtemp())
      >>> v = store.put(mlp.init(jax.random.key(0)))
      >>> store.verify(v).status
      'verified'
      >>> store.promote(v)
      >>> spec = ServingSpec.from_model(mlp.model, inputs=["['x']"], buckets=(1,))
      >>> server = Server(mlp.model, store, spec=spec)
      >>> server.start()
      >>> server.status()["compiles"]["warmup"], server.status()["active"] == v
      (1, True)
    """

    def __init__(
        self,
        model: Model,
        store: Any,
        *,
        spec: ServingSpec | None = None,
        version: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        memory_budget: int | None = None,
        watchdog: WatchdogPolicy | None = None,
        watch_s: float | None = None,
    ) -> None:
        if not hasattr(store, "load_verified"):
            from ..store import ArtifactStore

            store = ArtifactStore(store)
        self.model = model
        self.store = store
        self.spec = spec or ServingSpec.from_model(model)
        self.metrics = Metrics(self.spec.name, buckets=self.spec.buckets)
        self.slots = Slots(
            model,
            self.spec,
            store,
            metrics=self.metrics,
            memory_budget=memory_budget,
            watchdog=watchdog,
        )
        self.version = version
        self.cache_dir = cache_dir
        self.watch_s = watch_s
        self.batcher: Batcher | None = None
        self.start_error: str | None = None
        self._seen_current: str | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Loads, checks and warms the first version (blocking)."""
        if self.cache_dir is not None:
            enable_persistent_cache(self.cache_dir)
        self._seen_current = self.store.current()
        self.slots.start(self.version)

    def status(self) -> dict[str, Any]:
        """The server's state: versions, buckets, compile counts, readiness."""
        out = self.slots.status()
        out["model"] = self.spec.name
        out["queue_depth"] = self.batcher.depth if self.batcher else 0
        if self.start_error:
            out["error"] = self.start_error
        return out

    async def _watch(self) -> None:
        assert self.watch_s is not None
        while True:
            await asyncio.sleep(self.watch_s)
            try:
                cur = await asyncio.to_thread(self.store.current)
            except Exception as e:  # noqa: BLE001 - a damaged pointer must not stop serving
                log.warning("watch: cannot read the store's current version: %s", e)
                continue
            if cur is None or cur == self._seen_current or not self.slots.ready:
                continue
            self._seen_current = cur
            try:
                await asyncio.to_thread(self.slots.swap, cur)
                log.info("watch: now serving %s", cur)
            except ServingError as e:
                log.warning("watch: swap to %s refused: %s", cur, str(e).splitlines()[0])

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        """Starts the batcher and warms up in a thread, so liveness answers at once."""
        self.batcher = Batcher(self.slots)
        self.batcher.start()
        tasks: list[asyncio.Task[Any]] = []

        async def warm() -> None:
            try:
                await asyncio.to_thread(self.start)
            except Exception as e:  # noqa: BLE001 - reported by /ready and /status
                self.start_error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
                log.error("warm-up failed: %s", self.start_error)

        if not self.slots.ready:
            tasks.append(asyncio.create_task(warm()))
        if self.watch_s is not None:
            tasks.append(asyncio.create_task(self._watch()))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self.batcher.stop()

    # -- the app ---------------------------------------------------------------

    def app(self) -> Any:
        """The starlette ASGI app."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Route

        spec = self.spec
        metrics = self.metrics
        slots = self.slots
        decoder = Decoder(spec)

        def error(status: int, message: str) -> Any:
            return JSONResponse({"error": message}, status_code=status)

        async def live(_: Request) -> Any:
            return JSONResponse({"live": True})

        async def ready(_: Request) -> Any:
            if not slots.ready:
                return JSONResponse(
                    {"ready": False, "error": self.start_error or "warming up"}, status_code=503
                )
            return JSONResponse({"ready": True})

        def unknown(name: str) -> Any:
            return error(404, f"no model of that name; hint: this server serves {spec.name!r}")

        async def model_meta(request: Request) -> Any:
            if request.path_params["name"] != spec.name:
                return unknown(request.path_params["name"])
            active = slots.active
            return JSONResponse(
                {
                    "name": spec.name,
                    "versions": [active.version] if active else [],
                    "platform": "jax",
                    "inputs": [
                        {
                            "name": leaf.path,
                            "datatype": datatype_of(leaf.dtype),
                            "shape": [-1, *leaf.shape[1:]],
                        }
                        for leaf in spec.inputs.leaves
                    ],
                    "buckets": list(spec.buckets),
                }
            )

        async def read_body(request: Request) -> bytes:
            limit = spec.limits.max_request_bytes
            announced = request.headers.get("content-length")
            if announced is not None:
                if not announced.isdigit():
                    raise InvalidRequestError("content-length is not a size", status=400)
                if int(announced) > limit:
                    raise InvalidRequestError(
                        f"the body announces {int(announced)} bytes, over the limit of {limit}; "
                        "hint: send fewer rows per request",
                        status=413,
                        reason="size",
                    )
            chunks = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise InvalidRequestError(
                        f"the body is over the limit of {limit} bytes; "
                        "hint: send fewer rows per request",
                        status=413,
                        reason="size",
                    )
                chunks.append(chunk)
            return b"".join(chunks)

        def finish(status: int, started: float) -> None:
            metrics.request(status, time.perf_counter() - started)

        async def infer(request: Request) -> Any:
            started = time.perf_counter()
            if request.path_params["name"] != spec.name:
                finish(404, started)
                return unknown(request.path_params["name"])
            if not slots.ready or self.batcher is None:
                finish(503, started)
                return error(
                    503, "the model is not ready (warming up); hint: poll /v2/health/ready"
                )
            try:
                body = await read_body(request)
                leaves, adm = decoder.decode(parse_json(body))
            except InvalidRequestError as e:
                metrics.invalid_inputs.labels(model=spec.name, reason=e.reason).inc()
                finish(e.status, started)
                return error(e.status, str(e))
            version = slots.active.version if slots.active else "?"
            try:
                outputs, version = await self.batcher.submit(leaves, adm.rows, adm.chunks)
            except TimeoutError:
                finish(504, started)
                return error(504, f"no result within {spec.limits.timeout_s:g} s")
            except ServingError as e:
                if e.status >= 500:
                    slots.record(version, nonfinite=False, error=True)
                finish(e.status, started)
                return error(e.status, str(e))
            except Exception as e:  # noqa: BLE001 - a model failure is a 500, never a crash
                log.error("batch failed: %s", type(e).__name__)
                slots.record(version, nonfinite=False, error=True)
                finish(500, started)
                return error(500, f"the model failed on this batch ({type(e).__name__})")
            bad = [
                p or "output"
                for p, x in outputs
                if x.dtype.kind in "fc" and not np.isfinite(x).all()
            ]
            if bad:
                metrics.nonfinite_outputs.labels(model=spec.name, version=version).inc()
                slots.record(version, nonfinite=True, error=False)
                finish(500, started)
                return error(
                    500,
                    f"version {version} gave NaN or Inf in output {', '.join(bad)}; "
                    "hint: the watchdog rolls back a version that keeps doing so",
                )
            slots.record(version, nonfinite=False, error=False)
            finish(200, started)
            return JSONResponse(encode(outputs, spec.name, version))

        async def swap(request: Request) -> Any:
            try:
                doc = parse_json(await read_body(request))
            except InvalidRequestError as e:
                return error(e.status, str(e))
            version = doc.get("version") if isinstance(doc, dict) else None
            if not isinstance(version, str):
                return error(422, 'the body must be {"version": "<version>"}')
            if not slots.ready:
                return error(503, "the server is not ready; hint: poll /v2/health/ready")
            try:
                result = await asyncio.to_thread(slots.swap, version)
            except ServingError as e:
                return error(e.status, str(e))
            return JSONResponse(result)

        async def rollback(_: Request) -> Any:
            try:
                return JSONResponse(slots.rollback("manual"))
            except ServingError as e:
                return error(e.status, str(e))

        async def status(_: Request) -> Any:
            return JSONResponse(self.status())

        async def prometheus(_: Request) -> Any:
            if self.batcher is not None:
                metrics.depth(self.batcher.depth)
            return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

        return Starlette(
            routes=[
                Route("/v2/health/live", live),
                Route("/v2/health/ready", ready),
                Route("/v2/models/{name}", model_meta),
                Route("/v2/models/{name}/infer", infer, methods=["POST"]),
                Route("/v2/treeguard/swap", swap, methods=["POST"]),
                Route("/v2/treeguard/rollback", rollback, methods=["POST"]),
                Route("/v2/treeguard/status", status),
                Route("/metrics", prometheus),
            ],
            lifespan=self.lifespan,
        )


def serve(server: Server, *, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Runs ``server`` under uvicorn, one process, one worker (JAX owns the device).

    Scale out with replicas of this process, one per device set.
    """
    import uvicorn

    config = uvicorn.Config(server.app(), host=host, port=port, workers=1, log_level="info")
    uvicorn.Server(config).run()
