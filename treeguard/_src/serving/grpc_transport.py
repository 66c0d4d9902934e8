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

grpcio is imported only when a gRPC server is built (the ``grpc`` extra).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..errors import InvalidRequestError, ServingError
from . import messages
from .engine import Engine
from .protocol import InferRequest, InferResult, RawInput, raw_bytes, refuse

log = logging.getLogger("treeguard.serving")
pb: Any = messages.load()  # classes built at run time, untyped

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
      InvalidRequestError: 422 when raw contents do not pair with the inputs.
    """
    raw = list(msg.raw_input_contents)
    if raw and len(raw) != len(msg.inputs):
        raise refuse(
            f"the request has {len(raw)} raw_input_contents for {len(msg.inputs)} inputs",
            "shape",
            hint="send one raw_input_contents entry per input, in order",
        )
    inputs = []
    for i, tensor in enumerate(msg.inputs):
        if raw:
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
    """The gRPC status code of an engine error."""
    import grpc

    if isinstance(e, InvalidRequestError):
        return (
            grpc.StatusCode.RESOURCE_EXHAUSTED
            if e.status == 413
            else (grpc.StatusCode.INVALID_ARGUMENT)
        )
    status = getattr(e, "status", 500)
    return {
        404: grpc.StatusCode.NOT_FOUND,
        409: grpc.StatusCode.FAILED_PRECONDITION,
        429: grpc.StatusCode.RESOURCE_EXHAUSTED,
        503: grpc.StatusCode.UNAVAILABLE,
        504: grpc.StatusCode.DEADLINE_EXCEEDED,
    }.get(status, grpc.StatusCode.INTERNAL)


def _handler(
    fn: Callable[[Any], Awaitable[Any]],
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handle(request: Any, context: Any) -> Any:
        try:
            return await fn(request)
        except (InvalidRequestError, ServingError) as e:
            await context.abort(_code(e), str(e))

    return handle


def _service(engine: Engine) -> Any:
    import grpc

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

    async def model_infer(req: Any) -> Any:
        result = await engine.infer(read_request(req), req.model_name, req.model_version or None)
        return write_result(result)

    methods: dict[str, tuple[Callable[[Any], Awaitable[Any]], Any]] = {
        "ServerLive": (server_live, pb.ServerLiveRequest),
        "ServerReady": (server_ready, pb.ServerReadyRequest),
        "ModelReady": (model_ready, pb.ModelReadyRequest),
        "ServerMetadata": (server_metadata, pb.ServerMetadataRequest),
        "ModelMetadata": (model_metadata, pb.ModelMetadataRequest),
        "ModelInfer": (model_infer, pb.ModelInferRequest),
    }
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                _handler(fn),
                request_deserializer=kind.FromString,
                response_serializer=lambda m: m.SerializeToString(),
            )
            for name, (fn, kind) in methods.items()
        },
    )


def grpc_transport(
    engine: Engine, *, host: str = "127.0.0.1", port: int
) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    """The gRPC server of ``engine`` on ``host:port``, as a context the
    engine enters while it runs (``Engine.transports``).

    Raises:
      OSError: when the port cannot be bound (on entering).
    """

    @contextlib.asynccontextmanager
    async def running() -> AsyncIterator[Any]:
        # grpcio is imported only when a gRPC server runs (the grpc extra)
        import grpc

        limit = engine.spec.limits.max_request_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 1 << 30),
                ("grpc.max_concurrent_streams", engine.spec.limits.max_bodies),
            ],
            maximum_concurrent_rpcs=engine.spec.limits.max_connections,
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
