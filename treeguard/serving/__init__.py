"""``treeguard.serving``: a contract-driven model server.

A ``ServingSpec`` bounds what a request may hold (inputs from the model's
batch spec, batch buckets, limits) and what may compile after warm-up. A
``Server`` serves a ``treeguard.verify.Model``'s ``apply`` with the params of
a store's verified version over the Open Inference Protocol (KServe V2: REST
with JSON or binary tensors, and gRPC), batching concurrent requests into
padded buckets, with private Prometheus metrics, hot swap with verification,
and a watchdog that rolls back and quarantines a version only when the
version is to blame. ``treeguard serve`` runs it.

starlette, uvicorn and prometheus_client (the ``serve`` extra), and grpcio
and protobuf (the ``grpc`` extra), are imported only when a server is built.
"""

from .._src.errors import InvalidRequestError as InvalidRequestError
from .._src.errors import NonFiniteVersionError as NonFiniteVersionError
from .._src.errors import ServingError as ServingError
from .._src.serving.app import Server as Server
from .._src.serving.plan import BucketPlan as BucketPlan
from .._src.serving.plan import Plan as Plan
from .._src.serving.plan import plan as plan
from .._src.serving.protocol import InferRequest as InferRequest
from .._src.serving.protocol import InferResult as InferResult
from .._src.serving.protocol import Output as Output
from .._src.serving.protocol import RawInput as RawInput
from .._src.serving.release import verify_version as verify_version
from .._src.serving.spec import CompilePolicy as CompilePolicy
from .._src.serving.spec import Limits as Limits
from .._src.serving.spec import Overflow as Overflow
from .._src.serving.spec import ServingSpec as ServingSpec
from .._src.serving.watchdog import WatchdogPolicy as WatchdogPolicy

__all__ = [
    "BucketPlan",
    "CompilePolicy",
    "InferRequest",
    "InferResult",
    "InvalidRequestError",
    "Limits",
    "NonFiniteVersionError",
    "Output",
    "Overflow",
    "Plan",
    "RawInput",
    "Server",
    "ServingError",
    "ServingSpec",
    "WatchdogPolicy",
    "plan",
    "verify_version",
]
