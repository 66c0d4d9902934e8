"""The Open Inference Protocol (KServe V2) data model, apart from any wire.

A transport (REST with JSON or binary tensors, gRPC) turns its message into
an ``InferRequest`` whose inputs hold their data as received: a JSON list or
raw little-endian bytes; ``decode.Decoder`` validates it and makes the
arrays. This module holds the model's types (``RawInput``, ``InferRequest``,
``Output``, ``InferResult``, ``TensorMeta``), the datatypes, the bounds
every transport shares on a request's own fields, and how outputs are
chosen, bounded and written as JSON or raw bytes.

Inputs and outputs have plain names (``x``, ``output``, ``a.b``); the key
path each stands for is in the model metadata's ``parameters``. A request
may also name an input by its key path (``['x']``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np

from ..errors import InvalidRequestError

#: Open Inference Protocol datatype names by numpy dtype name.
DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "uint16": "UINT16",
    "uint32": "UINT32",
    "uint64": "UINT64",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
#: numpy dtypes by datatype name.
DTYPES = {v: np.dtype(ml_dtypes.bfloat16 if k == "bfloat16" else k) for k, v in DATATYPES.items()}
#: Bounds on a request's own fields, checked before they are used.
MAX_AXES = 32
#: The longest request id, in characters, on every transport (echoed back).
MAX_ID = 256
MAX_PARAMETERS = 64
#: The most entries a request's list of outputs may have, on every transport,
#: checked before a name is read; repeated names are then taken once
#: (``requested_outputs``).
MAX_OUTPUTS = 1024
#: The largest size a request may give an axis.
MAX_SIZE = 1 << 40


#: Datatype names by numpy dtype, for the hot path (a dtype's ``name`` is slow to build).
_BY_DTYPE = {dtype: name for name, dtype in DTYPES.items()}


def datatype_of(dtype: Any) -> str:
    """The protocol's datatype name of a dtype.

    Example:
      >>> datatype_of("float32"), datatype_of(ml_dtypes.bfloat16)
      ('FP32', 'BF16')
    """
    found = _BY_DTYPE.get(dtype) if isinstance(dtype, np.dtype) else None
    if found is not None:
        return found
    name = str(np.dtype(dtype).name)
    return DATATYPES.get(name, name.upper())


def plain_name(path: Sequence[Any]) -> str:
    """The plain tensor name of a key path: its keys joined by ``.``, and
    ``output`` for the root.

    Example:
      >>> plain_name((jax.tree_util.DictKey("x"),)), plain_name(())
      ('x', 'output')
      >>> plain_name((jax.tree_util.DictKey("a"), jax.tree_util.SequenceKey(0)))
      'a.0'
    """
    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        else:
            parts.append(str(entry).strip(".[]'\""))
    return ".".join(parts) or "output"


def refuse(
    message: str, reason: str = "schema", status: int = 422, *, hint: str | None = None
) -> InvalidRequestError:
    """The ``InvalidRequestError`` a refused request raises."""
    return InvalidRequestError(message, status=status, reason=reason, hint=hint)


# -- the data model ---------------------------------------------------------------


@dataclasses.dataclass(eq=False, slots=True)  # made per request: no frozen __init__
class RawInput:
    """One input as a transport received it.

    Attributes:
      name: the name the client gave (unchecked).
      datatype: the datatype the client gave (unchecked).
      shape: the shape the client gave (unchecked).
      data: a JSON list of elements, or the raw little-endian bytes.
    """

    name: Any
    datatype: Any
    shape: Any
    data: Any


@dataclasses.dataclass(eq=False, slots=True)  # made per request: no frozen __init__
class InferRequest:
    """One inference request, apart from its wire.

    Attributes:
      inputs: the ``RawInput``s.
      id: the client's request id, echoed in the response.
      outputs: the output names asked for, or None for every output.
      binary: per asked output name, whether to send it as raw bytes;
        ``binary_default`` for the others.
      binary_default: whether outputs go as raw bytes unless asked otherwise.

    Example:
      >>> request = InferRequest([RawInput("x", "FP32", [1, 2], [0.5, 0.25])], id="r1")
      >>> request.inputs[0].name, request.outputs
      ('x', None)
    """

    inputs: list[RawInput]
    id: str | None = None
    outputs: list[str] | None = None
    binary: dict[str, bool] = dataclasses.field(default_factory=dict)
    binary_default: bool = False


@dataclasses.dataclass(eq=False, slots=True)  # made per request: no frozen __init__
class Output:
    """One output tensor of a response.

    Attributes:
      name: the output's plain name (``output``, ``a.b``).
      array: its values.
      binary: whether a transport sends it as raw bytes.
    """

    name: str
    array: np.ndarray[Any, Any]
    binary: bool = False

    @property
    def datatype(self) -> str:
        return datatype_of(self.array.dtype)


@dataclasses.dataclass(eq=False, slots=True)  # made per request: no frozen __init__
class InferResult:
    """The response to one request: the outputs asked for, in order.

    Attributes:
      model: the model name served.
      version: the store version that answered.
      outputs: the ``Output``s.
      id: the request's id, echoed.
    """

    model: str
    version: str
    outputs: list[Output]
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """A tensor's metadata: plain name, key path, datatype, shape (-1 for the batch)."""

    name: str
    path: str
    datatype: str
    shape: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "datatype": self.datatype,
            "shape": list(self.shape),
            "parameters": {"key_path": self.path},
        }


# -- encoding -------------------------------------------------------------------


def check_request_fields(rid: Any, outputs: int) -> None:
    """Refuses a request id or an output list over the bounds every transport
    shares (``MAX_ID`` characters, ``MAX_OUTPUTS`` entries), before either is used.

    Args:
      rid: the request id as the client sent it (None when absent).
      outputs: how many entries the request's list of outputs has.

    Raises:
      InvalidRequestError: 422 naming the bound.

    Example:
      >>> check_request_fields("7", 2)
      >>> check_request_fields("x" * 300, 0)
      Traceback (most recent call last):
      ...
      treeguard.serving.InvalidRequestError: the request id must be a string of at most 256 ...
    """
    if rid is not None and (not isinstance(rid, str) or len(rid) > MAX_ID):
        raise refuse(f"the request id must be a string of at most {MAX_ID} characters")
    if outputs > MAX_OUTPUTS:
        raise refuse(
            f"the request asks for {outputs} outputs, over the limit of {MAX_OUTPUTS}",
            "size",
            hint="name each output once",
        )


def requested_outputs(names: Sequence[str] | None, known: Sequence[str]) -> list[str] | None:
    """The outputs a request asks for, each once, in the order first asked:
    the one rule of every transport, applied before any device work, so a
    response holds each of the model's outputs at most once.

    Args:
      names: the names the request gave, or None for every output.
      known: the model's output names.

    Returns:
      The names without repeats (never more than ``known`` has), or None.

    Raises:
      InvalidRequestError: 422 for a name the model does not have.

    Example:
      >>> requested_outputs(["b", "a", "b", "b"], ["a", "b"])
      ['b', 'a']
      >>> requested_outputs(["c"], ["a", "b"])
      Traceback (most recent call last):
      ...
      treeguard.serving.InvalidRequestError: the request asks for an unknown output
      hint: the outputs are a, b
    """
    if names is None:
        return None
    wanted: dict[str, None] = {}
    for name in names:
        if name not in wanted:
            if name not in known:
                raise refuse(
                    "the request asks for an unknown output",
                    hint=f"the outputs are {', '.join(known)}",
                )
            wanted[name] = None
    return list(wanted)


def response_bytes(request: InferRequest, outputs: Sequence[TensorMeta], rows: int) -> int:
    """An upper bound on the bytes the tensors of ``request``'s response take
    on its wire, from the outputs' metadata, before anything runs: raw bytes
    for a binary output, ``JSON_ELEMENT`` characters per element for JSON.

    Args:
      request: the request, its ``outputs`` already through ``requested_outputs``.
      outputs: the model's outputs (``TensorMeta``, batch axis first).
      rows: the request's rows.

    Example:
      >>> y = TensorMeta("y", "['y']", "FP32", (-1, 3))
      >>> response_bytes(InferRequest([], binary_default=True), [y], 2)
      24
      >>> response_bytes(InferRequest([], outputs=[]), [y], 2)
      0
    """
    wanted = request.outputs
    total = 0
    for meta in outputs:
        if wanted is not None and meta.name not in wanted:
            continue
        n = rows * math.prod(meta.shape[1:])
        binary = request.binary.get(meta.name, request.binary_default)
        dtype = DTYPES.get(meta.datatype)
        total += n * ((16 if dtype is None else dtype.itemsize) if binary else JSON_ELEMENT)
    return total


#: The most characters one element takes in a JSON response (``-1.2345678901234567e-308,``).
JSON_ELEMENT = 25


def select_outputs(
    request: InferRequest, outputs: list[tuple[str, np.ndarray[Any, Any]]], names: dict[str, str]
) -> list[Output]:
    """The outputs a request asked for, in its order (all, in model order, by default).

    Args:
      request: the request, its ``outputs`` already passed through
        ``requested_outputs``.
      outputs: ``(key path, rows)`` as the model computed them.
      names: plain name by key path.

    Raises:
      InvalidRequestError: 422 naming an output the model does not have.
    """
    if request.outputs is None and not request.binary:  # every output, one way
        default = request.binary_default
        return [Output(names.get(p, p), x, default) for p, x in outputs]
    by_name = {names.get(p, p): x for p, x in outputs}
    asked = requested_outputs(request.outputs, list(by_name))
    wanted = list(by_name) if asked is None else asked
    return [
        Output(want, by_name[want], request.binary.get(want, request.binary_default))
        for want in wanted
    ]


def json_data(x: np.ndarray[Any, Any]) -> list[Any]:
    """An array's elements as a flat JSON list (bf16 and fp16 as floats)."""
    flat = x.reshape(-1)
    if flat.dtype.kind == "V" or flat.dtype.char == "e":  # "e": float16
        flat = flat.astype(np.float32)
    out: list[Any] = flat.tolist()
    return out


def raw_bytes(x: np.ndarray[Any, Any]) -> bytes:
    """An array's elements as raw little-endian bytes, in row-major order."""
    return np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<")).tobytes()
