"""The gRPC messages of the Open Inference Protocol, in a pool of their own.

The messages are built from ``proto/inference.desc``, the descriptor set
``grpc_tools.protoc`` makes from ``proto/inference.proto`` (the command is
written at the top of the ``.proto``). They live in a private descriptor pool,
not protobuf's default one: a client library that defines the same
``inference.*`` messages (``tritonclient.grpc`` does) can then be imported in
the same process, before or after this module, without a clash of symbols.
The wire is unchanged: a message's bytes do not depend on its pool.
"""

from __future__ import annotations

import types
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

#: The protocol's package: the service's full name is ``inference.GRPCInferenceService``.
PACKAGE = "inference"

#: Every message the transport sends or receives.
NAMES = (
    "ServerLiveRequest",
    "ServerLiveResponse",
    "ServerReadyRequest",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataRequest",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "ModelInferRequest",
    "ModelInferResponse",
)


def load_messages() -> Any:
    """The message classes, by name, built in a private descriptor pool.

    Returns:
      A namespace with one attribute per name in ``NAMES``.

    Example:
      >>> pb = load_messages()
      >>> pb.ServerLiveResponse(live=True).SerializeToString()
      b'\\x08\\x01'
    """
    data = resources.files(__package__).joinpath("proto", "inference.desc").read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    return types.SimpleNamespace(
        **{
            name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
            for name in NAMES
        }
    )
