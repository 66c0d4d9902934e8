"""The gRPC transport: ``inference.GRPCInferenceService`` on the engine.

ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata and
ModelInfer, with tensors as ``raw_input_contents`` / ``raw_output_contents``
(or typed ``contents`` in a request). The messages come from
``proto/inference.proto`` (its descriptor set is committed beside it, with
the command that made it) and live in a descriptor pool of their own
(``messages.py``). The handlers only translate messages to and from
the engine; its typed errors map to gRPC status codes in one place
(``_code``). A message over the spec's request limit is refused by gRPC
before it is decoded.

Every call is bounded as a REST request is (``server_options``, ``receive``):
its message must arrive within the body deadline from the call's start, or
the call ends with ``DEADLINE_EXCEEDED`` and frees its place; a connection
must finish its handshake within the header deadline, and is closed once
it has held no call for as long or leaves a keepalive ping unanswered;
metadata, the request id, parameters and the list of outputs are bounded
as on REST (``transport.py``, ``protocol.py``); a message that does not
parse is ``INVALID_ARGUMENT`` with a one-line reason.

grpcio is imported only when a gRPC server is built (the ``grpc`` extra).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf.message import DecodeError

from ..errors import InvalidRequestError, ServingError
from . import messages
from .engine import Engine
from .protocol import (
    MAX_PARAMETERS,
    InferRequest,
    InferResult,
    RawInput,
    check_request_fields,
    raw_bytes,
    refuse,
)
from .spec import Limits
from .transport import MAX_METADATA_BYTES, Dropped

log = logging.getLogger("treeguard.serving")
pb: Any = messages.load_messages()  # classes built at run time, untyped

SERVICE = "inference.GRPCInferenceService"

#: The typed ``contents`` field of each datatype (FP16 and BF16 travel raw only).
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def read_request(msg: Any) -> InferRequest:
    """A ``ModelInferRequest`` as the engine's ``InferRequest``.

    Raises:
      InvalidRequestError: 422 when raw contents do not pair with the
        inputs, when an input has both typed contents and raw bytes, or for
        a request id, parameters or output list over the shared bounds.
    """
    check_request_fields(msg.id or None, len(msg.outputs))
    if len(msg.parameters) > MAX_PARAMETERS:
        raise refuse(f"the request's parameters are more than {MAX_PARAMETERS}")
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise refuse(
            f"the request has {len(raw)} raw_input_contents for {len(msg.inputs)} inputs",
            "shape",
            hint="send one raw_input_contents entry per input, in order",
        )
    inputs = []
    for i, tensor in enumerate(msg.inputs):
        if len(tensor.parameters) > MAX_PARAMETERS:
            raise refuse(f"inputs[{i}]: its parameters are more than {MAX_PARAMETERS}")
        typed = tensor.HasField("contents") and tensor.contents.ByteSize() > 0
        if raw:
            if typed:
                raise refuse(
                    f"inputs[{i}] has both typed contents and raw_input_contents",
                    hint="send each input's elements one way: raw_input_contents for "
                    "every input, or contents in each",
                )
            data: Any = raw[i]
        else:
            field = CONTENTS.get(tensor.datatype)
            if field is None:
                raise refuse(
                    f"inputs[{i}]: this datatype has no typed contents",
                    "dtype",
                    hint="send it as raw_input_contents",
                )
            data = list(getattr(tensor.contents, field))
        inputs.append(RawInput(tensor.name, tensor.datatype, list(tensor.shape), data))
    names = [o.name for o in msg.outputs] or None
    return InferRequest(inputs, msg.id or None, names, {}, True)


#: The most fields ``skim`` lets a message hold, its sub-messages' included.
MAX_FIELDS = 16 * 1024
#: The sub-messages of a ``ModelInferRequest`` that protobuf builds one object
#: for per entry (field number: its own such fields): parameters (4), inputs
#: (5, with their parameters) and outputs (6, with theirs).
INFER_FIELDS: dict[int, Any] = {4: {}, 5: {4: {}}, 6: {2: {}}}


class _Malformed(Exception):
    """The bytes are not protobuf's wire format."""


def _varint(data: bytes, i: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= end or shift > 63:
            raise _Malformed
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def skim(data: bytes, nested: dict[int, Any], *, limit: int = MAX_FIELDS) -> None:
    """Counts a message's fields on the wire, without building it, and those
    of the sub-messages ``nested`` names (field number: its own ``nested``):
    a message of a few bytes per entry costs protobuf an object per entry
    (90,000 outputs in 880 KiB take several times that to parse), so one
    holding more than ``limit`` fields in all is refused before it is parsed.

    Raises:
      InvalidRequestError: 413 over ``limit``; 400 for bytes that are not
        protobuf's wire format.

    Example:
      >>> skim(b"\\x0a\\x03mlp", INFER_FIELDS)
      >>> skim(b"\\x32\\x00" * 5, INFER_FIELDS, limit=4)
      Traceback (most recent call last):
      ...
      treeguard.serving.InvalidRequestError: the message holds more than 4 fields
      hint: name each output once, and send at most 64 parameters
    """
    seen = 0
    todo = [(0, len(data), nested)]
    try:
        while todo:
            i, end, fields = todo.pop()
            while i < end:
                key, i = _varint(data, i, end)
                seen += 1
                if seen > limit:
                    raise refuse(
                        f"the message holds more than {limit} fields",
                        "size",
                        413,
                        hint=f"name each output once, and send at most {MAX_PARAMETERS} parameters",
                    )
                wire = key & 7
                if wire == 0:
                    _, i = _varint(data, i, end)
                elif wire == 1:
                    i += 8
                elif wire == 5:
                    i += 4
                elif wire == 2:
                    n, i = _varint(data, i, end)
                    inner = fields.get(key >> 3)
                    if inner is not None:
                        todo.append((i, min(i + n, end), inner))
                    i += n
                else:  # groups (3, 4) are not in this protocol
                    raise _Malformed
                if i > end:
                    raise _Malformed
    except _Malformed:
        raise _unparsable("ModelInferRequest") from None


def _unparsable(name: str) -> InvalidRequestError:
    return refuse(
        f"the message is not a {name} (it does not parse)",
        status=400,
        hint="send the Open Inference Protocol's message, as a generated client does",
    )


def parse(data: bytes, kind: Any) -> Any:
    """One request message from its bytes (a ``ModelInferRequest`` skimmed first).

    Raises:
      InvalidRequestError: 400 with a one-line reason (never the parser's
        own text, which may quote the bytes); 413 from ``skim``.

    Example:
      >>> parse(b"\\x0a\\x03mlp", pb.ModelInferRequest).model_name
      'mlp'
      >>> parse(b"\\xff\\xff", pb.ModelInferRequest)
      Traceback (most recent call last):
      ...
      treeguard.serving.InvalidRequestError: the message is not a ModelInferRequest (it does ...
      hint: send the Open Inference Protocol's message, as a generated client does
    """
    if kind is pb.ModelInferRequest:
        skim(data, INFER_FIELDS)
    try:
        return kind.FromString(data)
    except (DecodeError, ValueError, RuntimeError):
        raise _unparsable(kind.DESCRIPTOR.name) from None


def write_result(result: InferResult) -> Any:
    """The ``ModelInferResponse`` of a result, every output as raw bytes."""
    response = pb.ModelInferResponse(
        model_name=result.model, model_version=result.version, id=result.id or ""
    )
    for out in result.outputs:
        response.outputs.add(name=out.name, datatype=out.datatype, shape=list(out.array.shape))
        response.raw_output_contents.append(raw_bytes(out.array))
    return response


def _code(e: Exception) -> Any:
    """The gRPC status code of an engine or transport error."""
    import grpc

    status = getattr(e, "status", 500)
    if isinstance(e, InvalidRequestError) and status != 413:
        return grpc.StatusCode.INVALID_ARGUMENT
    return {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        404: grpc.StatusCode.NOT_FOUND,
        408: grpc.StatusCode.DEADLINE_EXCEEDED,
        409: grpc.StatusCode.FAILED_PRECONDITION,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        429: grpc.StatusCode.RESOURCE_EXHAUSTED,
        503: grpc.StatusCode.UNAVAILABLE,
        504: grpc.StatusCode.DEADLINE_EXCEEDED,
    }.get(status, grpc.StatusCode.INTERNAL)


class Waiting:
    """The calls waiting for their request message now, oldest first, at most
    ``cap``: past it, a new call ends the one that has waited longest (as a
    new REST connection closes the oldest idle one), so calls that send
    headers and then nothing never keep a call that sends its message out.

    Example:
      >>> w = Waiting(2)
      >>> w.cap, len(w.calls)
      (2, 0)
    """

    __slots__ = ("calls", "cap", "ended")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.calls: dict[asyncio.Task[Any], None] = {}
        self.ended: set[asyncio.Task[Any]] = set()

    def enter(self, task: asyncio.Task[Any]) -> None:
        """Adds ``task``, ending the oldest waiting call first when at the cap."""
        if len(self.calls) >= self.cap:
            oldest = next(iter(self.calls))
            del self.calls[oldest]
            self.ended.add(oldest)
            oldest.cancel()
        self.calls[task] = None

    def leave(self, task: asyncio.Task[Any]) -> bool:
        """Removes ``task``; whether it was ended to make room."""
        self.calls.pop(task, None)
        if task in self.ended:
            self.ended.discard(task)
            return True
        return False


async def receive(context: Any, deadline_s: float, waiting: Waiting) -> bytes:
    """A call's one request message, whole, within ``deadline_s`` of the call's
    start: the receive deadline REST's body deadline gives a body. A call
    that sends its headers and then nothing (or a message and never its
    end) is given up on then, and frees its place among the calls; while it
    waits it is one of ``waiting``.

    Raises:
      Dropped: ``body_timeout`` (408) past the deadline; ``bodies`` (503)
        when a newer call took its place among those waiting.
      InvalidRequestError: 400 for a call with no message, or more than one.
    """
    import grpc

    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    messages: list[bytes] = []
    waiting.enter(task)
    try:
        while True:
            message = await asyncio.wait_for(context.read(), max(0.0, end - loop.time()))
            if message is grpc.aio.EOF:
                break
            if messages:
                raise refuse("the call sends more than one request message", status=400)
            messages.append(message)
    except TimeoutError:
        raise Dropped(
            "body_timeout", 408, f"the request message did not arrive within {deadline_s:g} s"
        ) from None
    except asyncio.CancelledError:
        if not waiting.leave(task) or task.uncancel() > 0:
            raise  # someone else's cancel
        raise Dropped(
            "bodies",
            503,
            f"{waiting.cap} calls were waiting for their request message; "
            "this one, the oldest, made room for a newer one",
        ) from None
    finally:
        waiting.leave(task)
    if not messages:
        raise refuse("the call ends without a request message", status=400)
    return messages[0]


def _metadata_methods(engine: Engine) -> dict[str, tuple[Callable[[Any], Awaitable[Any]], Any]]:
    """Every method but ``ModelInfer``: its handler of a parsed request, and
    the request's message class."""

    async def server_live(_: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    async def server_ready(_: Any) -> Any:
        return pb.ServerReadyResponse(ready=engine.ready)

    async def model_ready(req: Any) -> Any:
        return pb.ModelReadyResponse(ready=engine.model_ready(req.name, req.version or None))

    async def server_metadata(_: Any) -> Any:
        return pb.ServerMetadataResponse(**engine.server_metadata())

    async def model_metadata(req: Any) -> Any:
        meta = engine.model_metadata(req.name, req.version or None)
        out = pb.ModelMetadataResponse(
            name=meta["name"], versions=meta["versions"], platform=meta["platform"]
        )
        for tensor in engine.input_metadata():
            out.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        for tensor in engine.output_metadata():
            out.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        return out

    return {
        "ServerLive": (server_live, pb.ServerLiveRequest),
        "ServerReady": (server_ready, pb.ServerReadyRequest),
        "ModelReady": (model_ready, pb.ModelReadyRequest),
        "ServerMetadata": (server_metadata, pb.ServerMetadataRequest),
        "ModelMetadata": (model_metadata, pb.ModelMetadataRequest),
    }


def _service(engine: Engine) -> Any:
    import grpc

    limits = engine.spec.limits
    metrics = engine.metrics
    waiting = Waiting(limits.max_connections)
    methods = _metadata_methods(engine)

    async def fail(context: Any, e: Exception) -> None:
        if isinstance(e, Dropped):
            metrics.dropped.labels(model=engine.spec.name, reason=e.reason).inc()
            log.info("call dropped (%s): %s", e.reason, e)
        await context.abort(_code(e), str(e))

    def method(fn: Callable[[Any], Awaitable[Any]], kind: Any) -> Any:
        async def handle(_: Any, context: Any) -> Any:
            try:
                return await fn(parse(await receive(context, limits.body_timeout_s, waiting), kind))
            except (InvalidRequestError, ServingError, Dropped) as e:
                await fail(context, e)

        return handle

    async def model_infer(_: Any, context: Any) -> Any:
        # the message is read and parsed first (the model's name is inside
        # it); a refusal there is counted as ``infer`` counts its own
        started = time.perf_counter()
        try:
            try:
                data = await receive(context, limits.body_timeout_s, waiting)
                msg = parse(data, pb.ModelInferRequest)
                request = read_request(msg)
            except BaseException as e:  # as REST's: every way a request ends, counted once
                engine.refused(e, started)
                raise
            result = await engine.infer(
                request, msg.model_name, msg.model_version or None, started=started
            )
            return write_result(result)
        except (InvalidRequestError, ServingError, Dropped) as e:
            await fail(context, e)

    # every method reads its message itself (a client-streaming handler on
    # the wire of a unary call): the handler starts with the call, so the
    # receive deadline covers a call whose message never comes, and a
    # message that does not parse gets INVALID_ARGUMENT, not UNKNOWN
    handlers = {
        name: grpc.stream_unary_rpc_method_handler(method(fn, kind), response_serializer=_serialize)
        for name, (fn, kind) in methods.items()
    }
    handlers["ModelInfer"] = grpc.stream_unary_rpc_method_handler(
        model_infer, response_serializer=_serialize
    )
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data


def server_options(limits: Limits, connections: int) -> list[tuple[str, int]]:
    """The gRPC server's channel options: REST's bounds, in gRPC's terms.

    A connection must finish its handshake within the header deadline and is
    closed once it has held no call for as long; a peer that does not answer
    a keepalive ping within the header deadline is cut off; metadata is
    bounded as REST's headers are; at most ``connections`` connections at
    once, each with at most ``max_bodies`` calls.

    Example:
      >>> options = dict(server_options(Limits(header_timeout_s=2.0), 100))
      >>> options["grpc.max_connection_idle_ms"], options["grpc.max_allowed_incoming_connections"]
      (2000, 100)
    """
    header_ms = int(limits.header_timeout_s * 1000)
    return [
        ("grpc.max_receive_message_length", limits.max_request_bytes),
        ("grpc.max_send_message_length", limits.max_response_bytes + SEND_HEADROOM),
        ("grpc.max_concurrent_streams", limits.max_bodies),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.absolute_max_metadata_size", MAX_METADATA_BYTES),
        ("grpc.server_handshake_timeout_ms", header_ms),
        ("grpc.max_connection_idle_ms", header_ms),
        ("grpc.keepalive_time_ms", int(limits.body_timeout_s * 1000)),
        ("grpc.keepalive_timeout_ms", header_ms),
        ("grpc.max_allowed_incoming_connections", connections),
    ]


#: What a response's message may hold beyond its tensors (names, shapes, ids).
SEND_HEADROOM = 1 << 20


def grpc_transport(
    engine: Engine, *, host: str = "127.0.0.1", port: int, connections: int | None = None
) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    """The gRPC server of ``engine`` on ``host:port``, as a context the
    engine enters while it runs (``Engine.transports``).

    Args:
      engine: the engine.
      host: the address to bind.
      port: the port.
      connections: the most connections at once (default ``max_connections``;
        ``serve`` passes less where the open-file limit leaves less).

    Raises:
      OSError: when the port cannot be bound (on entering).
    """
    limits = engine.spec.limits

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[Any]:
        # grpcio is imported only when a gRPC server runs (the grpc extra)
        import grpc

        server = grpc.aio.server(
            options=server_options(limits, connections or limits.max_connections),
            # calls waiting for their message (at most max_connections: see
            # ``Waiting``) and as many being served
            maximum_concurrent_rpcs=2 * limits.max_connections,
        )
        server.add_generic_rpc_handlers((_service(engine),))
        if server.add_insecure_port(f"{host}:{port}") == 0:
            raise OSError(f"cannot bind the gRPC port {host}:{port}")
        await server.start()
        log.info("gRPC inference service on %s:%d", host, port)
        try:
            yield server
        finally:
            await server.stop(grace=1)

    return running
