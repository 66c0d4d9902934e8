"""The REST transport: the Open Inference Protocol over HTTP, on the engine.

Routes (``{m}`` the model, ``{v}`` a version):
  ``GET /v2`` (server metadata), ``GET /v2/health/live``, ``GET /v2/health/ready``,
  ``GET /v2/models/{m}[/versions/{v}]`` (metadata), ``.../ready``,
  ``POST .../infer``; treeguard's ``POST /v2/treeguard/swap`` ``{"version": V}``,
  ``POST /v2/treeguard/rollback`` (both behind the control token when one is
  set), ``GET /v2/treeguard/status`` and ``GET /metrics``.

A request body is JSON, or, with the ``Inference-Header-Content-Length``
header, a JSON header followed by the binary tensor data of the inputs that
carry ``parameters.binary_data_size`` (the binary tensor data extension).
Outputs go back as binary the same way when asked (``binary_data`` on an
output, or ``binary_data_output`` on the request). A body is read under the
spec's size limit; a body not yet whole when its request runs is waited for
under the body deadline, with at most ``max_bodies`` waited for at once (a
whole body needs neither a timer nor a place among them). Errors are
``{"error": message}``; each typed error maps to its status in one place
(``handlers``). An inference request goes straight to its endpoint, past
starlette's middleware and router, and its errors to the same handlers;
every other request (and any under a root path) takes the router.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Coroutine
from typing import Any

from ..errors import InvalidRequestError, ServingError
from . import jsonbody
from .engine import Engine
from .protocol import (
    InferRequest,
    InferResult,
    RawInput,
    check_request_fields,
    json_data,
    parse_json,
    raw_bytes,
    refuse,
)
from .transport import Dropped

log = logging.getLogger("treeguard.serving")

HEADER_LENGTH = "inference-header-content-length"
#: One compact encoder for every response (``json.dumps`` with options builds one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode


_JSON = (b"content-type", b"application/json")
_SHUTTING_DOWN = (
    "the server is shutting down with this request's body still arriving; send it again"
)


class Unauthorized(Exception):
    """A control request without the right bearer token (401)."""


class Disconnected(Exception):
    """The client went away before its request body was whole (499)."""


class _Deadline:
    """Cancels the task that made it, once: when its timer fires, or when the
    server shuts down (see ``read_body``); ``reason`` says which."""

    __slots__ = ("reason", "task")

    def __init__(self) -> None:
        self.task = asyncio.current_task()
        self.reason: str | None = None

    def expire(self, reason: str = "body_timeout") -> None:
        if self.task is not None and self.reason is None:
            self.reason = reason
            self.task.cancel()


class BodyReads:
    """The request bodies an app is waiting for now (each body that was not
    whole when its request ran), so that a server shutting down can end
    them: ``close`` answers each with 503 and refuses any more, while
    requests whose bodies are whole are still answered.

    Example:
      >>> reads = BodyReads()
      >>> reads.close()
      >>> reads.closed, len(reads.waiting)
      (True, 0)
    """

    __slots__ = ("closed", "waiting")

    def __init__(self) -> None:
        self.waiting: set[_Deadline] = set()
        self.closed = False

    def close(self) -> None:
        """Ends every body being waited for, and refuses any more (idempotent)."""
        self.closed = True
        for deadline in list(self.waiting):
            deadline.expire("shutdown")


class _Body:
    """A request body as its messages arrive, under a size limit: the first
    message's bytes as they came, later ones added to one buffer (a list of
    tiny chunks would cost many times their size)."""

    __slots__ = ("first", "limit", "more", "size")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.first: bytes | None = None
        self.more: bytearray | None = None
        self.size = 0

    def take(self, message: Any) -> bool:
        """Adds one ``receive`` message's bytes; whether it was the last.

        Raises:
          Disconnected: for a disconnect instead of body bytes.
          InvalidRequestError: 413 once the body is over the limit.
        """
        if message["type"] != "http.request":
            raise Disconnected()
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            raise refuse(
                f"the body is over the limit of {self.limit} bytes",
                "size",
                413,
                hint="send fewer rows per request",
            )
        if self.first is None:
            self.first = chunk
        elif self.more is None:
            self.more = bytearray(self.first)
            self.more += chunk
        else:
            self.more += chunk
        return not message.get("more_body", False)

    def joined(self) -> bytes:
        if self.more is not None:
            return bytes(self.more)
        return self.first or b""


class _Rest:
    """The rest of a coroutine already run up to its first wait (``waits_for``,
    what it yielded there): awaiting this goes on from that wait, passing
    what the task sends or throws in (a cancel) on to the coroutine, as
    ``await`` of it would have."""

    __slots__ = ("coro", "waits_for")

    def __init__(self, coro: Any, waits_for: Any) -> None:
        self.coro, self.waits_for = coro, waits_for

    def close(self) -> None:
        """Abandons the coroutine (it is never resumed)."""
        self.coro.close()

    def __await__(self) -> Any:
        coro, signal = self.coro, self.waits_for
        while True:
            try:
                sent = yield signal
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as thrown:  # noqa: BLE001 - a cancel goes on to the coroutine
                try:
                    signal = coro.throw(thrown)
                except StopIteration as done:
                    return done.value
                continue
            try:
                signal = coro.send(sent)
            except StopIteration as done:
                return done.value


class _Endpoint:
    """A plain ASGI callable as a route's endpoint: starlette runs an object
    that is not a function as ASGI, with no ``Request`` or ``Response``."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


# -- the binary tensor data extension -------------------------------------------


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict) or len(params) > 64:
        raise refuse(f"{where}: parameters must be a JSON object of at most 64 entries")
    return params


def size_in(text: str) -> int | None:
    """A header's byte count: ASCII digits, at most 18 of them; None for
    anything else (``str.isdigit`` takes ``²`` too, and ``int`` refuses
    thousands of digits).

    Example:
      >>> size_in("130"), size_in("²"), size_in("9" * 5000), size_in("-1")
      (130, None, None, None)
    """
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None


def read_request(
    body: bytes, header_length: str | None, *, whole: int = jsonbody.WHOLE
) -> InferRequest:
    """Parses a REST inference body (JSON, or JSON then binary tensors).

    Args:
      body: the body's bytes.
      header_length: the ``Inference-Header-Content-Length`` header, if any.
      whole: JSON up to this size is parsed whole (see ``parse_json``).

    Raises:
      InvalidRequestError: 400 for a body that is not a request, 422 for
        binary sizes that disagree with the body.

    Example:
      >>> req = read_request(b'{"id": "7", "inputs": [{"name": "x", "shape": [1], '
      ...                    b'"datatype": "FP32", "data": [1.5]}]}', None)
      >>> req.id, req.inputs[0].data
      ('7', [1.5])
    """
    tail = b""
    if header_length is not None:
        n = size_in(header_length)
        if n is None or n > len(body):
            raise refuse(
                f"{HEADER_LENGTH} is not a size within the body's {len(body)} bytes",
                status=400,
                hint="set it to the byte length of the JSON header",
            )
        body, tail = body[:n], body[n:]
    doc = parse_json(body, whole=whole)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise refuse('the body has no "inputs" list', hint='{"inputs": [{"name": ...}]}')
    rid = doc.get("id")
    outputs = doc.get("outputs")
    if outputs is not None and not isinstance(outputs, list):
        raise refuse('"outputs" must be a list of {"name": ...} objects')
    check_request_fields(rid, len(outputs or ()))
    request_params = _parameters(doc, "the request")
    view = memoryview(tail)
    offset = 0
    inputs = []
    for i, item in enumerate(doc["inputs"]):
        if not isinstance(item, dict):
            raise refuse(f"inputs[{i}] is a JSON {type(item).__name__}, not an object")
        # most inputs carry no parameters: nothing to check, no name to format
        size = (
            _parameters(item, f"inputs[{i}]").get("binary_data_size")
            if "parameters" in item
            else None
        )
        if size is None:
            data = item.get("data")
        else:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise refuse(f"inputs[{i}]: binary_data_size must be a size", "shape")
            if offset + size > len(view):
                raise refuse(
                    f"inputs[{i}]: binary_data_size {size} runs past the body's "
                    f"{len(view) - offset} remaining bytes of binary data",
                    "shape",
                )
            data = view[offset : offset + size]
            offset += size
        inputs.append(RawInput(item.get("name"), item.get("datatype"), item.get("shape"), data))
    if offset != len(view):
        raise refuse(
            f"the body holds {len(view) - offset} bytes of binary data no input claims",
            "shape",
            hint="give each binary input its binary_data_size",
        )
    names: list[str] | None = None
    binary: dict[str, bool] = {}
    if outputs is not None:
        names = []
        for j, out in enumerate(outputs):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise refuse(f"outputs[{j}] must be an object with a name")
            names.append(out["name"])
            flag = _parameters(out, f"outputs[{j}]").get("binary_data")
            if flag is not None:
                binary[out["name"]] = bool(flag)
    default = bool(request_params.get("binary_data_output", False))
    return InferRequest(inputs, rid, names, binary, default)


def write_result(result: InferResult) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The response body and its ASGI headers (binary outputs after the JSON).

    Example:
      >>> import numpy as np
      >>> from treeguard._src.serving.protocol import Output
      >>> out = Output("output", np.array([[0.5]], np.float32))
      >>> content, headers = write_result(InferResult("mlp", "v000001", [out], "7"))
      >>> json.loads(content)["outputs"][0]["data"], json.loads(content)["id"]
      ([0.5], '7')
      >>> headers
      [(b'content-length', b'130'), (b'content-type', b'application/json')]
    """
    blobs = []
    outputs = []
    for out in result.outputs:
        entry: dict[str, Any] = {
            "name": out.name,
            "datatype": out.datatype,
            "shape": list(out.array.shape),
        }
        if out.binary:
            blob = raw_bytes(out.array)
            blobs.append(blob)
            entry["parameters"] = {"binary_data_size": len(blob)}
        else:
            entry["data"] = json_data(out.array)
        outputs.append(entry)
    doc: dict[str, Any] = {
        "model_name": result.model,
        "model_version": result.version,
        "outputs": outputs,
    }
    if result.id is not None:
        doc["id"] = result.id
    header = _ENCODE(doc).encode()
    if not blobs:
        return header, [(b"content-length", b"%d" % len(header)), _JSON]
    content = header + b"".join(blobs)
    return content, [
        (b"content-length", b"%d" % len(content)),
        (b"content-type", b"application/octet-stream"),
        (b"inference-header-content-length", b"%d" % len(header)),
    ]


# -- the app ------------------------------------------------------------------------


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
    # starlette is imported only when an app is built (the serve extra)
    from starlette.applications import Starlette
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, PlainTextResponse, Response
    from starlette.routing import Route

    spec = engine.spec
    limits = spec.limits
    metrics = engine.metrics
    # bodies being read now: over the cap a request is refused, never queued
    reading = BodyReads() if bodies is None else bodies

    async def read_body(announced: str | None, receive: Any) -> bytes:
        """The whole body, under the size limit and the body deadline."""
        if announced is not None:
            size = size_in(announced)
            if size is None:
                raise refuse("content-length is not a size", status=400)
            if size > limits.max_request_bytes:
                raise refuse(
                    f"the body announces {size} bytes, over the limit of "
                    f"{limits.max_request_bytes}",
                    "size",
                    413,
                    hint="send fewer rows per request",
                )
        # most bodies are whole by the time their request runs: then every
        # receive returns without a wait, and nothing needs a deadline or a
        # place among the bodies being read
        body = _Body(limits.max_request_bytes)
        while True:
            step = receive()
            if not isinstance(step, Coroutine):  # a server's own awaitable: awaited, timed
                return await read_rest(body, step, receive)
            try:
                waits_for = step.send(None)
            except StopIteration as done:
                if body.take(done.value):
                    return body.joined()
                continue
            return await read_rest(body, _Rest(step, waits_for), receive)

    async def read_rest(body: _Body, pending: Awaitable[Any], receive: Any) -> bytes:
        """The rest of a body from a receive that waits on, under the
        deadline and the cap on bodies read at once."""
        if reading.closed or len(reading.waiting) >= limits.max_bodies:
            if isinstance(pending, _Rest):
                pending.close()
            if reading.closed:
                raise Dropped("shutdown", 503, _SHUTTING_DOWN)
            raise Dropped("bodies", 503, f"{limits.max_bodies} request bodies are being read")
        # the deadline is one timer that cancels this task (``asyncio.timeout``
        # costs several times as much per request)
        deadline = _Deadline()
        loop = asyncio.get_running_loop()
        timer = loop.call_at(loop.time() + limits.body_timeout_s, deadline.expire)
        reading.waiting.add(deadline)
        try:
            if body.take(await pending):
                return body.joined()
            while not body.take(await receive()):
                pass
            return body.joined()
        except asyncio.CancelledError:
            if deadline.reason is None or deadline.task is None or deadline.task.uncancel() > 0:
                raise  # someone else's cancel, not the deadline's
            if deadline.reason == "shutdown":
                raise Dropped("shutdown", 503, _SHUTTING_DOWN) from None
            raise Dropped(
                "body_timeout", 408, f"the body did not arrive within {limits.body_timeout_s:g} s"
            ) from None
        finally:
            timer.cancel()
            reading.waiting.discard(deadline)

    async def respond(
        scope: Any, receive: Any, name: str, version: str | None
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """One inference request's response body and headers."""
        announced = header_length = None
        for key, value in scope["headers"]:  # the first of each, as starlette reads them
            if key == b"content-length" and announced is None:
                announced = value.decode("latin-1")
            elif key == b"inference-header-content-length" and header_length is None:
                header_length = value.decode("latin-1")

        started = time.perf_counter()
        try:
            engine.require_model(name, version)  # before its body is read
            request = read_request(await read_body(announced, receive), header_length)
        except BaseException as e:
            engine.refused(e, started)
            raise
        return write_result(await engine.infer(request, name, version, started=started))

    async def infer(scope: Any, receive: Any, send: Any) -> None:
        # a plain ASGI endpoint: no Request or Response objects; errors raised
        # here reach the app's exception handlers as from any route
        p = scope["path_params"]
        content, headers = await respond(scope, receive, p["name"], p.get("version"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    async def live(_: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(_: Request) -> Response:
        state = engine.readiness()
        return JSONResponse(state, status_code=200 if state["ready"] else 503)

    async def server_meta(_: Request) -> Response:
        return JSONResponse(engine.server_metadata())

    async def model_meta(request: Request) -> Response:
        p = request.path_params
        return JSONResponse(engine.model_metadata(p["name"], p.get("version")))

    async def model_ready(request: Request) -> Response:
        p = request.path_params
        ok = engine.model_ready(p["name"], p.get("version"))
        return JSONResponse({"name": p["name"], "ready": ok}, status_code=200 if ok else 503)

    def authorize(request: Request) -> None:
        if control_token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), control_token
        ):
            raise Unauthorized()

    async def swap(request: Request) -> Response:
        authorize(request)
        doc = parse_json(await read_body(request.headers.get("content-length"), request.receive))
        version = doc.get("version") if isinstance(doc, dict) else None
        if not isinstance(version, str):
            raise refuse('the body must be {"version": "<version>"}')
        return JSONResponse(await engine.swap(version))

    async def rollback(request: Request) -> Response:
        authorize(request)
        return JSONResponse(await engine.rollback())

    async def status(_: Request) -> Response:
        return JSONResponse(engine.status())

    async def prometheus(_: Request) -> Response:
        if engine.batcher is not None:
            metrics.depth(engine.batcher.depth)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    async def on_invalid(_: Request, e: Exception) -> Response:
        assert isinstance(e, InvalidRequestError)
        return error(e.status, str(e))

    async def on_serving(_: Request, e: Exception) -> Response:
        assert isinstance(e, ServingError)
        headers = {"retry-after": "1"} if e.status in (429, 503) else None
        return error(e.status, str(e), headers)

    async def on_unauthorized(_: Request, e: Exception) -> Response:
        return error(
            401,
            "this control request needs the server's bearer token\n"
            "hint: send Authorization: Bearer <the token in --control-token-file>",
            {"www-authenticate": "Bearer"},
        )

    async def on_dropped(_: Request, e: Exception) -> Response:
        assert isinstance(e, Dropped)
        metrics.dropped.labels(model=spec.name, reason=e.reason).inc()
        log.info("request dropped (%s): %s", e.reason, e)
        return error(e.status, str(e), {"connection": "close"})

    async def on_disconnect(_: Request, e: Exception) -> Response:
        metrics.dropped.labels(model=spec.name, reason="disconnect").inc()
        log.info("client disconnected before its request body was complete")
        return Response(status_code=499)

    handlers: dict[Any, Any] = {
        InvalidRequestError: on_invalid,
        ServingError: on_serving,
        Unauthorized: on_unauthorized,
        Dropped: on_dropped,
        Disconnected: on_disconnect,
        ClientDisconnect: on_disconnect,
    }

    app = Starlette(
        routes=[
            # inference first: starlette tries the routes in order on every request
            Route("/v2/models/{name}/infer", _Endpoint(infer), methods=["POST"]),
            Route("/v2/models/{name}/versions/{version}/infer", _Endpoint(infer), methods=["POST"]),
            Route("/v2", server_meta),
            Route("/v2/health/live", live),
            Route("/v2/health/ready", ready),
            Route("/v2/models/{name}", model_meta),
            Route("/v2/models/{name}/ready", model_ready),
            Route("/v2/models/{name}/versions/{version}", model_meta),
            Route("/v2/models/{name}/versions/{version}/ready", model_ready),
            Route("/v2/treeguard/swap", swap, methods=["POST"]),
            Route("/v2/treeguard/rollback", rollback, methods=["POST"]),
            Route("/v2/treeguard/status", status),
            Route("/metrics", prometheus),
        ],
        exception_handlers=handlers,
        lifespan=lambda _app: engine.running(),
    )
    stack = app.build_middleware_stack()

    async def dispatch(scope: Any, receive: Any, send: Any) -> None:
        """Inference straight to its endpoint, every other request through
        starlette's middleware and router: the same handlers answer the same
        errors, without the layers between them on every request."""
        target = _infer_target(scope)
        if target is None:
            await stack(scope, receive, send)
            return
        try:
            content, headers = await respond(scope, receive, *target)
        except Exception as e:
            handler = next((handlers[c] for c in type(e).__mro__ if c in handlers), None)
            if handler is None:  # as starlette's ServerErrorMiddleware: a 500, then raise
                await PlainTextResponse("Internal Server Error", 500)(scope, receive, send)
                raise
            response = await handler(Request(scope, receive), e)
            await response(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    app.middleware_stack = dispatch
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
