"""The REST codec: a request body as an ``InferRequest``, a result as a body.

A request body is JSON, or, with the ``Inference-Header-Content-Length``
header, a JSON header followed by the binary tensor data of the inputs that
carry ``parameters.binary_data_size`` (the binary tensor data extension).
Outputs go back as binary the same way when asked (``binary_data`` on an
output, or ``binary_data_output`` on the request). The routes that read a
body and answer with this are in ``routes.py``; gRPC's codec sits in
``grpc_transport.py``.
"""

from __future__ import annotations

import json
from typing import Any

from . import jsonbody
from .bodies import size_in
from .decode import parse_json
from .protocol import (
    InferRequest,
    InferResult,
    RawInput,
    check_request_fields,
    json_data,
    raw_bytes,
    refuse,
)

HEADER_LENGTH = "inference-header-content-length"
#: One compact encoder for every response (``json.dumps`` with options builds one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_JSON = (b"content-type", b"application/json")


def _parameters(obj: dict[str, Any], where: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if not isinstance(params, dict) or len(params) > 64:
        raise refuse(f"{where}: parameters must be a JSON object of at most 64 entries")
    return params


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
    inputs = _inputs(doc["inputs"], memoryview(tail))
    names, binary = _outputs(outputs)
    default = bool(request_params.get("binary_data_output", False))
    return InferRequest(inputs, rid, names, binary, default)


def _inputs(items: list[Any], view: memoryview) -> list[RawInput]:
    """The body's inputs, each binary one given its span of the binary data
    after the JSON (``view``), every byte of which an input must claim."""
    offset = 0
    inputs = []
    for i, item in enumerate(items):
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
    return inputs


def _outputs(outputs: list[Any] | None) -> tuple[list[str] | None, dict[str, bool]]:
    """The output names a body asks for (None for every output), and which
    of them it wants as binary data."""
    if outputs is None:
        return None, {}
    names: list[str] = []
    binary: dict[str, bool] = {}
    for j, out in enumerate(outputs):
        if not isinstance(out, dict) or not isinstance(out.get("name"), str):
            raise refuse(f"outputs[{j}] must be an object with a name")
        names.append(out["name"])
        flag = _parameters(out, f"outputs[{j}]").get("binary_data")
        if flag is not None:
            binary[out["name"]] = bool(flag)
    return names, binary


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
