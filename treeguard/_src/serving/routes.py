"""The REST routes: the Open Inference Protocol over HTTP, on the engine.

Routes (``{m}`` the model, ``{v}`` a version):
  ``GET /v2`` (server metadata), ``GET /v2/health/live``, ``GET /v2/health/ready``,
  ``GET /v2/models/{m}[/versions/{v}]`` (metadata), ``.../ready``,
  ``POST .../infer``; treeguard's ``POST /v2/treeguard/swap`` ``{"version": V}``,
  ``POST /v2/treeguard/rollback`` (both behind the control token when one is
  set), ``GET /v2/treeguard/status`` and ``GET /metrics``.

A body is read under the spec's limits (``bodies.py``) and parsed by the
REST codec (``rest.py``). Errors are ``{"error": message}``; each typed
error maps to its status in one place (``Routes.handlers``). An inference
request goes straight to its endpoint, past starlette's middleware and
router, and its errors to the same handlers; every other request (and any
under a root path) takes the router.

starlette is imported with this module, which a server imports only when
it builds its app (the ``serve`` extra).
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..errors import InvalidRequestError, ServingError
from .bodies import BodyReader, BodyReads, Disconnected
from .decode import parse_json
from .engine import Engine
from .protocol import refuse
from .rest import read_request, write_result
from .transport import Dropped

log = logging.getLogger("treeguard.serving")

Headers = list[tuple[bytes, bytes]]


class Unauthorized(Exception):
    """A control request without the right bearer token (401)."""


class _Endpoint:
    """A plain ASGI callable as a route's endpoint: starlette runs an object
    that is not a function as ASGI, with no ``Request`` or ``Response``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class Routes:
    """The REST app's handlers for one engine.

    Args:
      engine: the ``Engine``.
      control_token: the bearer token ``swap`` and ``rollback`` require;
        None to leave them open (a loopback-only server).
      reading: where the app keeps the bodies it waits for.
    """

    def __init__(self, engine: Engine, control_token: bytes | None, reading: BodyReads) -> None:
        self.engine = engine
        self.control_token = control_token
        self.bodies = BodyReader(engine.spec.limits, reading)

    # -- inference ------------------------------------------------------------------

    async def respond(
        self, scope: Any, receive: Any, name: str, version: str | None
    ) -> tuple[bytes, Headers]:
        """One inference request's response body and headers. A request
        refused before ``infer`` (its model not served, its body too large,
        late or not a request) is counted by the engine as ``infer`` counts
        its own."""
        engine = self.engine
        started = time.perf_counter()
        try:
            engine.require_model(name, version)  # before its body is read
            announced = header_length = None
            for key, value in scope["headers"]:  # the first of each, as starlette reads them
                if key == b"content-length" and announced is None:
                    announced = value.decode("latin-1")
                elif key == b"inference-header-content-length" and header_length is None:
                    header_length = value.decode("latin-1")
            request = read_request(await self.bodies.read(announced, receive), header_length)
        except BaseException as e:
            engine.refused(e, started)
            raise
        return write_result(await engine.infer(request, name, version, started=started))

    async def infer(self, scope: Any, receive: Any, send: Any) -> None:
        """The inference endpoint through the router, a plain ASGI callable: no
        Request or Response objects; its errors reach the app's handlers."""
        p = scope["path_params"]
        content, headers = await self.respond(scope, receive, p["name"], p.get("version"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    # -- health and metadata ------------------------------------------------------------

    async def live(self, _: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(self, _: Request) -> Response:
        state = self.engine.readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    async def server_meta(self, _: Request) -> Response:
        return JSONResponse(self.engine.server_metadata())

    async def model_meta(self, request: Request) -> Response:
        p = request.path_params
        return JSONResponse(self.engine.model_metadata(p["name"], p.get("version")))

    async def model_ready(self, request: Request) -> Response:
        p = request.path_params
        ok = self.engine.model_ready(p["name"], p.get("version"))
        return JSONResponse({"name": p["name"], "ready": ok}, status_code=200 if ok else 503)

    async def status(self, _: Request) -> Response:
        return JSONResponse(self.engine.status())

    async def prometheus(self, _: Request) -> Response:
        engine = self.engine
        if engine.batcher is not None:
            engine.metrics.depth(engine.batcher.depth)
        return Response(
            engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    # -- control ----------------------------------------------------------------------

    def authorize(self, request: Request) -> None:
        """Refuses a control request without the bearer token, when there is one.

        Raises:
          Unauthorized: for a missing or wrong token.
        """
        if self.control_token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.control_token
        ):
            raise Unauthorized()

    async def swap(self, request: Request) -> Response:
        self.authorize(request)
        body = await self.bodies.read(request.headers.get("content-length"), request.receive)
        doc = parse_json(body)
        version = doc.get("version") if isinstance(doc, dict) else None
        if not isinstance(version, str):
            raise refuse('the body must be {"version": "<version>"}')
        return JSONResponse(await self.engine.swap(version))

    async def rollback(self, request: Request) -> Response:
        self.authorize(request)
        return JSONResponse(await self.engine.rollback())

    # -- errors -----------------------------------------------------------------------

    async def on_invalid(self, _: Request, e: Exception) -> Response:
        assert isinstance(e, InvalidRequestError)
        return _error(e.status, str(e))

    async def on_serving(self, _: Request, e: Exception) -> Response:
        assert isinstance(e, ServingError)
        headers = {"retry-after": "1"} if e.status in (429, 503) else None
        return _error(e.status, str(e), headers)

    async def on_unauthorized(self, _: Request, e: Exception) -> Response:
        return _error(
            401,
            "this control request needs the server's bearer token\n"
            "hint: send Authorization: Bearer <the token in --control-token-file>",
            {"www-authenticate": "Bearer"},
        )

    async def on_dropped(self, _: Request, e: Exception) -> Response:
        assert isinstance(e, Dropped)
        self._dropped(e.reason)
        log.info("request dropped (%s): %s", e.reason, e)
        return _error(e.status, str(e), {"connection": "close"})

    async def on_disconnect(self, _: Request, e: Exception) -> Response:
        self._dropped("disconnect")
        log.info("client disconnected before its request body was complete")
        return Response(status_code=499)

    def _dropped(self, reason: str) -> None:
        metrics = self.engine.metrics
        metrics.dropped.labels(model=self.engine.spec.name, reason=reason).inc()

    def handlers(self) -> dict[Any, Any]:
        """Each typed error's handler: the one place errors map to statuses."""
        return {
            InvalidRequestError: self.on_invalid,
            ServingError: self.on_serving,
            Unauthorized: self.on_unauthorized,
            Dropped: self.on_dropped,
            Disconnected: self.on_disconnect,
            ClientDisconnect: self.on_disconnect,
        }

    def routes(self) -> list[Route]:
        """The routes, inference first: starlette tries them in order on every request."""
        infer = _Endpoint(self.infer)
        return [
            Route("/v2/models/{name}/infer", infer, methods=["POST"]),
            Route("/v2/models/{name}/versions/{version}/infer", infer, methods=["POST"]),
            Route("/v2", self.server_meta),
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2/models/{name}", self.model_meta),
            Route("/v2/models/{name}/ready", self.model_ready),
            Route("/v2/models/{name}/versions/{version}", self.model_meta),
            Route("/v2/models/{name}/versions/{version}/ready", self.model_ready),
            Route("/v2/treeguard/swap", self.swap, methods=["POST"]),
            Route("/v2/treeguard/rollback", self.rollback, methods=["POST"]),
            Route("/v2/treeguard/status", self.status),
            Route("/metrics", self.prometheus),
        ]


class _FastPath:
    """Inference straight to its endpoint, every other request through
    starlette's middleware and router (``stack``): the same handlers answer
    the same errors, without the layers between them on every request."""

    def __init__(self, stack: Any, routes: Routes, handlers: dict[Any, Any]) -> None:
        self.stack, self.routes, self.handlers = stack, routes, handlers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        target = _infer_target(scope)
        if target is None:
            await self.stack(scope, receive, send)
            return
        try:
            content, headers = await self.routes.respond(scope, receive, *target)
        except Exception as e:
            handlers = self.handlers
            handler = next((handlers[c] for c in type(e).__mro__ if c in handlers), None)
            if handler is None:  # as starlette's ServerErrorMiddleware: a 500, then raise
                await PlainTextResponse("Internal Server Error", 500)(scope, receive, send)
                raise
            response = await handler(Request(scope, receive), e)
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def build_app(
    engine: Engine, *, control_token: bytes | None = None, bodies: BodyReads | None = None
) -> Any:
    """The starlette ASGI app of ``engine`` (see the module's docstring).

    Args:
      engine: the ``Engine``.
      control_token: the bearer token ``swap`` and ``rollback`` require;
        None to leave them open (a loopback-only server).
      bodies: where the app keeps the bodies it waits for (a server closes
        it as it shuts down); None for one of its own.
    """
    # bodies being read now: over the cap a request is refused, never queued
    routes = Routes(engine, control_token, BodyReads() if bodies is None else bodies)
    handlers = routes.handlers()
    app = Starlette(
        routes=routes.routes(),
        exception_handlers=handlers,
        lifespan=lambda _app: engine.running(),
    )
    app.middleware_stack = _FastPath(app.build_middleware_stack(), routes, handlers)
    return app


def _infer_target(scope: Any) -> tuple[str, str | None] | None:
    """The model name and version of an inference request
    (``POST /v2/models/{m}[/versions/{v}]/infer``), or None for any other.

    Example:
      >>> _infer_target({"type": "http", "method": "POST", "path": "/v2/models/m/infer"})
      ('m', None)
      >>> _infer_target({"type": "http", "method": "POST",
      ...                "path": "/v2/models/m/versions/v2/infer"})
      ('m', 'v2')
      >>> _infer_target({"type": "http", "method": "GET", "path": "/v2/models/m/infer"})
    """
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    path: str = scope["path"]
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[11:-6].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[0] and parts[1] == "versions" and parts[2]:
        return parts[0], parts[2]
    return None
