"""The KServe V2 (Open Inference Protocol) request and response bodies.

A request is ``{"inputs": [{"name", "shape", "datatype", "data"}, ...]}``,
each input named by its key path in the serving spec (``['x']``, or ``x``
for a top-level key). Decoding is strict and refuses, before any device
work: JSON that is hostile as JSON (deep nesting, NaN or Infinity, huge
numbers, duplicate keys), unknown, missing or repeated inputs, shapes that
disagree with the spec or the data, datatypes other than the spec's, and
values the dtype cannot hold. Every refusal names the input's path and the
expected and actual shape or dtype, and never holds a request value.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np

from ..errors import InvalidRequestError
from ..leaf import summarize
from ..spec import LeafSpec
from .buckets import Admission, admit
from .spec import ServingSpec

#: V2 datatype names by numpy dtype name.
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


def datatype_of(dtype: Any) -> str:
    """The V2 datatype name of a dtype (``FP32`` for float32)."""
    name = str(np.dtype(dtype).name)
    return DATATYPES.get(name, name.upper())


def _refuse(
    message: str, reason: str = "schema", status: int = 422, *, hint: str | None = None
) -> InvalidRequestError:
    return InvalidRequestError(message, status=status, reason=reason, hint=hint)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("a duplicate key")
        out[k] = v
    return out


def parse_json(body: bytes) -> Any:
    """Parses a request body strictly.

    Raises:
      InvalidRequestError: 400, saying what is wrong without quoting the body.

    Example:
      >>> parse_json(b'{"a": [1, 2.5]}')
      {'a': [1, 2.5]}
      >>> parse_json(b'{"a": NaN}')
      Traceback (most recent call last):
      ...
      treeguard.InvalidRequestError: the body is not valid JSON: NaN is not ...
    """
    try:
        return json.loads(
            body,
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constant,
        )
    except RecursionError:
        raise _refuse("the body nests too deep to be a request", status=400) from None
    except UnicodeDecodeError as e:  # its text quotes the byte: never echo the body
        raise _refuse(
            f"the body is not UTF-8 (at byte {e.start})",
            status=400,
            hint="send a KServe V2 inference request",
        ) from None
    except ValueError as e:
        text = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise _refuse(
            f"the body is not valid JSON: {text}",
            status=400,
            hint="send a KServe V2 inference request",
        ) from None


@dataclasses.dataclass(frozen=True)
class _Input:
    """What decoding one input needs, computed once per spec."""

    leaf: LeafSpec
    tail: tuple[int, ...]
    datatype: str
    accepts: str  # the numpy kinds of JSON data the dtype takes without loss

    @classmethod
    def of(cls, leaf: LeafSpec) -> _Input:
        kind = leaf.dtype.kind
        accepts = {"b": "b", "i": "iu", "u": "iu", "f": "iuf", "c": "iuf"}.get(kind, "")
        return cls(leaf, tuple(int(d) for d in leaf.shape[1:]), datatype_of(leaf.dtype), accepts)


class Decoder:
    """Decodes requests for one ``ServingSpec`` (see ``decode``)."""

    def __init__(self, spec: ServingSpec) -> None:
        self.spec = spec
        self.paths = spec.input_paths
        self.names: dict[str, _Input] = {}
        for leaf in spec.inputs.leaves:
            entry = _Input.of(leaf)
            self.names[leaf.path] = entry
            p = leaf.path
            if p.startswith("['") and p.count("[") == 1 and p.endswith("']"):
                self.names[p[2:-2]] = entry
        self.expected = ", ".join(self.paths)

    def decode(self, doc: Any) -> tuple[list[np.ndarray[Any, Any]], Admission]:
        """See ``decode``."""
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
            raise _refuse('the body has no "inputs" list', hint='{"inputs": [{"name": ...}]}')
        got: dict[str, np.ndarray[Any, Any]] = {}
        rows: int | None = None
        for i, item in enumerate(doc["inputs"]):
            if not isinstance(item, dict):
                raise _refuse(f"inputs[{i}] is a JSON {type(item).__name__}, not an object")
            name = item.get("name")
            entry = self.names.get(name) if isinstance(name, str) else None
            if entry is None:
                raise _refuse(
                    f"inputs[{i}] has an unknown name", hint=f"the inputs are {self.expected}"
                )
            path = entry.leaf.path
            if path in got:
                raise _refuse(f"input {path} is given twice")
            arr = _decode_one(item, entry)
            if rows is not None and arr.shape[0] != rows:
                raise _refuse(
                    f"input {path}: {arr.shape[0]} rows, while the other inputs have {rows}",
                    "shape",
                    hint="every input needs the same batch size",
                )
            rows = arr.shape[0]
            got[path] = arr
        if len(got) != len(self.paths):
            missing = ", ".join(p for p in self.paths if p not in got)
            raise _refuse(f"missing input(s) {missing}", hint=f"the inputs are {self.expected}")
        assert rows is not None
        spec = self.spec
        adm = admit(rows, spec.buckets, max_rows=spec.limits.max_rows, overflow=spec.overflow)
        if not adm.ok:
            raise _refuse(adm.detail, "size", 413 if adm.reason != "empty" else 422)
        return [got[p] for p in self.paths], adm


def decode(doc: Any, spec: ServingSpec) -> tuple[list[np.ndarray[Any, Any]], Admission]:
    """Decodes a parsed request into one array per spec input, in spec order.

    Returns:
      The arrays, and the request's ``Admission`` (its rows and chunks).

    Raises:
      InvalidRequestError: 422 for wrong inputs (reason ``schema``, ``shape``,
        ``dtype``, ``nonfinite``), 413 for more rows than allowed (``size``).

    Example:
      >>> from treeguard.examples.mlp import model
      >>> spec = ServingSpec.from_model(model, inputs=["['x']"], buckets=(1, 4))
      >>> doc = {"inputs": [{"name": "x", "shape": [3, 2], "datatype": "FP32", "data": [0] * 6}]}
      >>> arrays, admission = decode(doc, spec)
      >>> arrays[0].shape, admission.chunks
      ((3, 2), (3,))
    """
    return Decoder(spec).decode(doc)


def _decode_one(item: dict[str, Any], entry: _Input) -> np.ndarray[Any, Any]:
    leaf, path, name = entry.leaf, entry.leaf.path, entry.datatype
    shape = item.get("shape")
    if (
        not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or any(d < 0 or d > 1 << 40 for d in shape)
    ):
        want = summarize(leaf.shape, leaf.dtype)
        raise _refuse(f"input {path}: shape must be a list of sizes; expected {want}", "shape")
    if len(shape) != len(leaf.shape) or tuple(shape[1:]) != entry.tail:
        want = summarize(leaf.shape, leaf.dtype)
        got = f"[{','.join(map(str, shape))}]" if len(shape) <= 8 else f"{len(shape)} axes"
        raise _refuse(f"input {path}: shape {got} in the request, {want} in the spec", "shape")
    dt = item.get("datatype")
    if dt != name:
        shown = dt if isinstance(dt, str) and dt in DATATYPES.values() else "another datatype"
        raise _refuse(f"input {path}: datatype {shown} in the request, {name} in the spec", "dtype")
    data = item.get("data")
    n = math.prod(shape)
    if not isinstance(data, list):
        raise _refuse(f"input {path}: data must be a JSON list of {n} numbers")
    try:
        raw = np.asarray(data)
    except ValueError:
        raise _refuse(
            f"input {path}: data is ragged", hint=f"send a flat list of {n} numbers"
        ) from None
    kind = raw.dtype.kind
    if raw.size and kind not in entry.accepts:
        what = {"U": "text", "O": "mixed or non-numeric values", "b": "booleans", "f": "floats"}
        raise _refuse(
            f"input {path}: data holds {what.get(kind, 'values')} for datatype {name}", "dtype"
        )
    if raw.size != n:
        raise _refuse(
            f"input {path}: data has {raw.size} values, shape [{','.join(map(str, shape))}] "
            f"needs {n}",
            "shape",
        )
    target = leaf.dtype
    if target.kind in "iu" and raw.size:
        info = np.iinfo(target)
        if raw.min() < info.min or raw.max() > info.max:
            raise _refuse(f"input {path}: a value is out of range for {name}", "dtype")
    arr = raw.astype(target, copy=False).reshape(shape)
    if target.kind in "fc" and not np.isfinite(arr).all():
        raise _refuse(f"input {path}: a value is beyond the range of {name}", "nonfinite")
    return arr


def encode(
    outputs: list[tuple[str, np.ndarray[Any, Any]]], model: str, version: str
) -> dict[str, Any]:
    """The V2 response body of one request's outputs."""
    return {
        "model_name": model,
        "model_version": version,
        "outputs": [
            {
                "name": path or "output",
                "shape": list(x.shape),
                "datatype": datatype_of(x.dtype),
                "data": x.reshape(-1).tolist(),
            }
            for path, x in outputs
        ],
    }
