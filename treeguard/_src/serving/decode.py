"""Decoding a request: the strict JSON parser and the ``Decoder``.

``parse_json`` parses a REST body strictly in memory bounded by its size.
``Decoder`` validates an ``InferRequest`` against the serving spec and
makes the arrays, in bounded memory: every input's name, datatype and
shape are checked first, then the element count and each element's type,
and only then is an array allocated, of exactly the size the shape needs (a
request never costs more than a small multiple of its size). Every refusal
names the input and the expected and actual shape or datatype, and never
holds a request value.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np

from ..errors import InvalidRequestError
from ..leaf import summarize
from ..nonfinite import host_all_finite as all_finite
from ..spec import LeafSpec
from . import jsonbody
from .protocol import (
    DTYPES,
    MAX_AXES,
    MAX_SIZE,
    InferRequest,
    RawInput,
    TensorMeta,
    datatype_of,
    plain_name,
    refuse,
)
from .spec import ServingSpec

_INT = frozenset({int})


# Not ``strictjson``: a request's fault is a 400 ``InvalidRequestError`` that quotes
# nothing the client sent (``strictjson`` names a duplicate key and a bad byte), and
# the decoder bounds each number against the datatype the input declares.
def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):  # a key given twice is kept once
        raise ValueError("a duplicate key")
    return out


#: One strict decoder for every request (``json.loads`` with options builds a new one per call).
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_no_constant)


def parse_json(body: bytes, *, whole: int = jsonbody.WHOLE) -> Any:
    """Parses a request body strictly, in memory bounded by its size: each
    input's flat ``data`` list is kept as its text (a ``jsonbody.Numbers``,
    made into an array by the ``Decoder``), and a body whose other values
    would cost more than ``jsonbody.COST_PER_BYTE`` times its size is
    refused before they are built (see ``jsonbody``).

    Args:
      body: the body's bytes.
      whole: bodies up to this size are parsed whole, as plain JSON.

    Raises:
      InvalidRequestError: 400, saying what is wrong without quoting the
        body; 413 for a body too costly to parse.

    Example:
      >>> parse_json(b'{"a": [1, 2.5]}')
      {'a': [1, 2.5]}
      >>> parse_json(b'{"a": NaN}')
      Traceback (most recent call last):
      ...
      treeguard.serving.InvalidRequestError: the body is not valid JSON: NaN is not ...
    """
    try:
        text, spans = jsonbody.split(body, whole)
    except jsonbody.TooCostly as e:
        raise refuse(
            f"the body's JSON would cost about {e.cost} bytes to parse, over the limit of "
            f"{e.limit} for a body of {len(body)} bytes",
            "size",
            413,
            hint="send each input's data as one flat list, and no other long lists or "
            "many small objects or strings",
        ) from None
    try:
        if not spans:
            return _DECODER.decode(text.decode("utf-8"))

        def number(token: str) -> Any:
            k = jsonbody.mark_index(token)
            return float(token) if k is None else spans[k]

        decoder = json.JSONDecoder(
            object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=number
        )
        return decoder.decode(text.decode("utf-8"))
    except RecursionError:
        raise refuse("the body nests too deep to be a request", status=400) from None
    except UnicodeDecodeError as e:  # its text quotes the byte: never echo the body
        start = e.start
        if spans:  # the place in the body, not in the text without its lists
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as entire:
                start = entire.start
        raise refuse(
            f"the body is not UTF-8 (at byte {start})",
            status=400,
            hint="send an Open Inference Protocol request; binary tensors need the "
            "Inference-Header-Content-Length header",
        ) from None
    except ValueError as e:
        reason = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise refuse(
            f"the body is not valid JSON: {reason}",
            status=400,
            hint="send an Open Inference Protocol request",
        ) from None


_PYTYPES: dict[str, frozenset[type]] = {
    "b": frozenset({bool}),
    "i": frozenset({int}),
    "u": frozenset({int}),
    "f": frozenset({int, float}),
    "V": frozenset({int, float}),  # bfloat16
}


@dataclasses.dataclass(frozen=True)
class _Input:
    """What decoding one input needs, computed once per spec."""

    leaf: LeafSpec
    name: str
    dims: list[int]  # its shape past the batch axis, as a request writes it
    datatype: str
    dtype: np.dtype[Any]
    wire: np.dtype[Any]  # the dtype of its raw bytes: little-endian
    path: str
    lo: float | int  # the smallest and largest value of the datatype (0 for BOOL)
    hi: float | int
    accepted: frozenset[type]  # the Python types its JSON elements may have
    index: int  # its place among the spec's inputs
    row: int  # the elements of one row


def _range_of(dtype: np.dtype[Any]) -> tuple[float | int, float | int]:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    if dtype.kind in "fV":
        top = float(ml_dtypes.finfo(dtype).max)  # type: ignore[no-untyped-call]
        return -top, top
    return 0, 0


class Decoder:
    """Validates ``InferRequest``s for one ``ServingSpec`` and makes their arrays.

    Example:
      >>> from treeguard.examples.mlp import model
      >>> spec = ServingSpec.from_model(model, inputs=["['x']"], buckets=(1, 4))
      >>> req = InferRequest([RawInput("x", "FP32", [3, 2], [0] * 6)])
      >>> [a.shape for a in Decoder(spec).decode(req)]
      [(3, 2)]
    """

    def __init__(self, spec: ServingSpec) -> None:
        self.spec = spec
        self.entries: list[_Input] = []
        self.by_name: dict[str, _Input] = {}
        skeleton = jax.tree.unflatten(spec.inputs.treedef, [0] * spec.inputs.num_leaves)
        treedef_paths = [p for p, _ in jax.tree.leaves_with_path(skeleton)]
        for index, (leaf, kp) in enumerate(zip(spec.inputs.leaves, treedef_paths, strict=True)):
            dtype = np.dtype(leaf.dtype)
            dims = [int(d) for d in leaf.shape[1:]]
            entry = _Input(
                leaf,
                plain_name(kp),
                dims,
                datatype_of(dtype),
                dtype,
                dtype.newbyteorder("<"),
                leaf.path,
                *_range_of(dtype),
                _PYTYPES.get(dtype.kind, frozenset()),
                index,
                math.prod(dims),
            )
            self.entries.append(entry)
            self.by_name[entry.name] = entry
            self.by_name.setdefault(leaf.path, entry)
        self.expected = ", ".join(e.name for e in self.entries)

    def metadata(self) -> list[TensorMeta]:
        """The inputs' metadata, in spec order."""
        return [TensorMeta(e.name, e.path, e.datatype, (-1, *e.dims)) for e in self.entries]

    def decode(self, request: InferRequest) -> list[np.ndarray[Any, Any]]:
        """Validates ``request``'s inputs and returns one array per spec input, in spec order.

        Raises:
          InvalidRequestError: 422 for wrong inputs (reason ``schema``,
            ``shape``, ``dtype``, ``nonfinite``, ``bounds``).
        """
        inputs = request.inputs
        out: list[Any] = [None] * len(self.entries)  # an array in each place, or None
        rows: int | None = None
        for i, item in enumerate(inputs):
            entry = self.by_name.get(item.name) if isinstance(item.name, str) else None
            if entry is None:
                raise refuse(
                    f"inputs[{i}] has an unknown name", hint=f"the inputs are {self.expected}"
                )
            if out[entry.index] is not None:
                raise refuse(f"input {entry.path} is given twice")
            arr = _decode_one(item, entry)
            if rows is not None and arr.shape[0] != rows:
                raise refuse(
                    f"input {entry.path}: {arr.shape[0]} rows, while the other inputs have {rows}",
                    "shape",
                    hint="every input needs the same batch size",
                )
            rows = arr.shape[0]
            out[entry.index] = arr
        if len(inputs) != len(out):  # each input named at most once: some are missing
            missing = ", ".join(e.name for e, x in zip(self.entries, out) if x is None)
            raise refuse(f"missing input(s) {missing}", hint=f"the inputs are {self.expected}")
        bounds = self.spec.bounds
        if bounds is not None:
            for entry, arr in zip(self.entries, out):
                if arr.dtype.kind in "fiu" and arr.size and not _within(arr, bounds):
                    raise refuse(
                        f"input {entry.path}: a value lies outside the served bounds "
                        f"[{bounds[0]:g}, {bounds[1]:g}]",
                        "bounds",
                        hint="send inputs within the bounds the serving spec declares",
                    )
        return out


def _within(arr: np.ndarray[Any, Any], bounds: tuple[float, float]) -> bool:
    lo, hi = bounds
    return bool(float(arr.min()) >= lo and float(arr.max()) <= hi)


def _shape_of(item: RawInput, entry: _Input) -> tuple[int, ...]:
    shape = item.shape
    leaf = entry.leaf
    if (
        not isinstance(shape, (list, tuple))
        or len(shape) > MAX_AXES
        or not _INT.issuperset(map(type, shape))  # bool and int subclasses are not sizes
        or (shape and (min(shape) < 0 or max(shape) > MAX_SIZE))
    ):
        want = summarize(leaf.shape, leaf.dtype)
        raise refuse(f"input {entry.path}: shape must be a list of sizes; expected {want}", "shape")
    if len(shape) != len(leaf.shape) or list(shape[1:]) != entry.dims:
        want = summarize(leaf.shape, leaf.dtype)
        raise refuse(
            f"input {entry.path}: shape {_shown(shape)} in the request, {want} in the spec",
            "shape",
        )
    return tuple(shape)


def _shown(shape: Sequence[int]) -> str:
    """A shape as the refusals print it, ``[8,2]`` (built only for a refusal)."""
    return "[" + ",".join(map(str, shape)) + "]"


def _decode_one(item: RawInput, entry: _Input) -> np.ndarray[Any, Any]:
    name = entry.datatype
    shape = item.shape
    if not (  # the common request's shape, tested at once; any other, in full
        type(shape) is list
        and len(shape) == len(entry.dims) + 1
        and _INT.issuperset(map(type, shape))
        and shape[1:] == entry.dims
        and 0 <= shape[0] <= MAX_SIZE
    ):
        shape = _shape_of(item, entry)
    if item.datatype != name:
        dt = item.datatype
        shown = dt if isinstance(dt, str) and dt in DTYPES else "another datatype"
        raise refuse(
            f"input {entry.path}: datatype {shown} in the request, {name} in the spec", "dtype"
        )
    n = shape[0] * entry.row
    dtype = entry.dtype
    if isinstance(item.data, (bytes, bytearray, memoryview)):
        raw = memoryview(item.data)
        if raw.nbytes != n * dtype.itemsize:
            raise refuse(
                f"input {entry.path}: {raw.nbytes} bytes of binary data, shape {_shown(shape)} "
                f"of {name} needs {n * dtype.itemsize}",
                "shape",
            )
        arr = np.frombuffer(raw, dtype=entry.wire).reshape(shape)
        if dtype.kind == "b" and n and int(arr.view(np.uint8).max()) > 1:
            raise refuse(f"input {entry.path}: a BOOL byte is neither 0 nor 1", "dtype")
        if dtype.kind in "fV" and not all_finite(arr):
            raise _beyond(entry)
        return arr
    return _from_json(item.data, entry, n, shape).reshape(shape)


def _no_nan(data: list[Any]) -> bool:
    """Whether a list of numbers holds no NaN: a NaN makes the sum NaN, while
    an overflowing sum is inf or too large a float (then say False, and let
    the exact check decide)."""
    try:
        return not math.isnan(sum(data))
    except OverflowError:
        return False


def _beyond(entry: _Input) -> InvalidRequestError:
    return refuse(
        f"input {entry.path}: a value is beyond the range of {entry.datatype}", "nonfinite"
    )


def _from_json(data: Any, entry: _Input, n: int, shape: Sequence[int]) -> np.ndarray[Any, Any]:
    name, dtype = entry.datatype, entry.dtype
    if not isinstance(data, list):
        if isinstance(data, jsonbody.Numbers):
            return _from_numbers(data, entry, n, shape)
        raise refuse(f"input {entry.path}: data must be a JSON list of {n} numbers")
    if len(data) != n:
        nested = any(isinstance(v, list) for v in data[:64])
        if nested:
            raise refuse(
                f"input {entry.path}: data is ragged", hint=f"send a flat list of {n} numbers"
            )
        raise refuse(
            f"input {entry.path}: data has {len(data)} values, shape {_shown(shape)} needs {n}",
            "shape",
        )
    # every element's type before anything is allocated: a long string among
    # numbers must never reach numpy, which pads every element to the longest
    if not entry.accepted.issuperset(map(type, data)):
        kinds = set(map(type, data))
        if list in kinds:
            raise refuse(
                f"input {entry.path}: data is ragged", hint=f"send a flat list of {n} numbers"
            )
        what = (
            "text"
            if str in kinds
            else "booleans"
            if bool in kinds
            else "floats"
            if float in kinds
            else "mixed or non-numeric values"
        )
        raise refuse(f"input {entry.path}: data holds {what} for datatype {name}", "dtype")
    if not n:
        return np.zeros(0, dtype)
    if dtype.kind in "iu":
        if min(data) < entry.lo or max(data) > entry.hi:
            raise refuse(f"input {entry.path}: a value is out of range for {name}", "dtype")
        return np.array(data, dtype=dtype)
    if dtype.kind in "fV":
        if entry.lo <= min(data) and max(data) <= entry.hi and _no_nan(data):
            # every value within the datatype's range, compared exactly as
            # Python numbers, and no NaN: the cast gives finite values. A
            # numpy float takes the numbers as they are (as float64 then
            # ``astype`` would); ml_dtypes' types refuse a Python int past
            # 64 bits, so they take the float64 route
            if dtype.kind == "f":
                return np.array(data, dtype)
            return np.array(data, np.float64).astype(dtype)
        try:
            wide = np.array(data, dtype=np.float64)
        except OverflowError:  # an integer beyond any float
            raise _beyond(entry) from None
        with np.errstate(over="ignore"):
            arr = wide.astype(dtype)
        if not all_finite(arr):  # beyond the range, not only rounded to its edge
            raise _beyond(entry)
        return arr
    return np.array(data, dtype=dtype)


def _from_numbers(
    data: jsonbody.Numbers, entry: _Input, n: int, shape: Sequence[int]
) -> np.ndarray[Any, Any]:
    """``_from_json`` for a list kept as its text: the same refusals in the
    same order, and an array made a chunk at a time, with no Python number
    per element."""
    name, dtype = entry.datatype, entry.dtype
    kind = dtype.kind
    if len(data) != n:
        raise refuse(
            f"input {entry.path}: data has {len(data)} values, shape {_shown(shape)} needs {n}",
            "shape",
        )
    if data.booleans != (kind == "b") or (data.floats and kind not in "fV"):
        what = (
            "booleans"
            if data.booleans
            else "floats"
            if data.floats
            else "mixed or non-numeric values"
        )
        raise refuse(f"input {entry.path}: data holds {what} for datatype {name}", "dtype")
    if data.booleans:
        words = itertools.chain.from_iterable(map(jsonbody.booleans_of, data.chunks()))
        return np.fromiter(words, np.bool_, n)
    out = np.empty(n, dtype)
    at = 0
    for chunk in data.chunks():
        if kind in "iu":
            if jsonbody.LONG_INT.search(chunk):  # past int64: this chunk as Python ints
                ints = _DECODER.decode("[" + chunk.decode("ascii") + "]")
                low, high = min(ints), max(ints)
                part = np.array(ints if entry.lo <= low and high <= entry.hi else [], dtype)
            else:
                part = np.fromstring(chunk, np.int64, chunk.count(b",") + 1, sep=",")
                low, high = (int(part.min()), int(part.max())) if part.size else (0, 0)
            if low < entry.lo or high > entry.hi:
                raise refuse(f"input {entry.path}: a value is out of range for {name}", "dtype")
        else:
            # an integer -0 is 0.0, as Python's int makes it
            text = jsonbody.unsign_zeros(chunk) if b"-0" in chunk else chunk
            part = np.fromstring(text, np.float64, text.count(b",") + 1, sep=",")
        if at + part.size > n:
            break
        piece = out[at : at + part.size]
        with np.errstate(over="ignore"):
            piece[...] = part
        if kind in "fV" and not all_finite(piece):  # beyond the range, not only rounded to it
            raise _beyond(entry)
        at += part.size
    if at != n:  # never for the text ``split`` kept; the exact way if it were
        return _from_json(_DECODER.decode(data.text()), entry, n, shape)
    return out
