"""The header of a safetensors file another tool wrote, validated against
itself and the file's size before anything is allocated.

Every entry holds exactly ``dtype``, ``shape`` and ``data_offsets``; the
dtype is one of the safetensors names (little-endian by definition); each
size is checked against its shape and dtype with Python integers (no
overflow); the tensors must cover the data section exactly, without gaps or
overlaps, as the safetensors reference reader requires. Matching such a
file's tensors to a tree is ``foreign.py``'s; this module is apart so that
reading the contract of a file (``treeguard spec FILE``) loads no matcher.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from ..errors import FormatError
from ..keydtype import dtype_name
from ..leaf import dtype_of, summarize
from ..spec import TreeSpec
from ..specjson import FORMAT as SPEC_FORMAT
from .files import open_checkpoint, read_raw_header
from .format import (
    BAD_FILE_HINT,
    FOREIGN,
    K_FORMAT,
    MAX_NDIM,
    Framed,
    StoredTensor,
    data_offsets,
    ok_int,
    refuse_too_many,
)
from .table import expanded

#: safetensors dtype name -> numpy dtype name, for every dtype a foreign file may hold.
FOREIGN_DTYPES: dict[str, str] = {**FOREIGN, "F8_E8M0": "float8_e8m0fnu"}  # ml_dtypes >= 0.5
#: Sub-byte dtypes are packed several to a byte; no numpy dtype holds them one per element.
_PACKED = ("F4", "F6_E2M3", "F6_E3M2")

#: The most bytes numpy lets an array's axes span, counting a 0 axis as 1.
MAX_ARRAY_BYTES = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class ForeignTensor(StoredTensor):
    """One tensor of a foreign safetensors file: its header entry, with no
    hash (see ``StoredTensor`` for the fields)."""


@dataclasses.dataclass(frozen=True)
class ForeignHeader(Framed):
    """The validated header of a safetensors file treeguard did not write.

    It holds no contract and no hashes: what it says about the tensors'
    places and sizes has been checked against the file, nothing else.

    Attributes:
      path: the file.
      tensors: every tensor, in the order of its bytes in the file.
      metadata: the writer's ``__metadata__`` (strings), or ``{}``.
      header_bytes: the header's length (without the 8-byte prefix).
      file_bytes: the file's size.
    """

    path: str
    tensors: tuple[ForeignTensor, ...]
    metadata: dict[str, str]
    header_bytes: int
    file_bytes: int

    @property
    def spec(self) -> TreeSpec:
        """A flat dict spec keyed by tensor name, sorted by name.

        Built from the spec's JSON form rather than by walking a tree, so that
        reading a foreign header (``treeguard spec FILE``) never imports JAX.
        """
        children = [
            [
                ["key", t.name],
                {"kind": "leaf", "shape": list(t.shape), "dtype": dtype_name(t.dtype)},
            ]
            for t in sorted(self.tensors, key=tensor_name)
        ]
        return TreeSpec.from_dict(
            {"format": SPEC_FORMAT, "tree": {"kind": "dict", "children": children}}
        )


def tensor_name(t: ForeignTensor) -> str:
    return t.name


def is_foreign(doc: Mapping[str, Any]) -> bool:
    """Whether a parsed safetensors header lacks treeguard's metadata."""
    meta = doc.get("__metadata__")
    return not (isinstance(meta, dict) and K_FORMAT in meta)


def foreign_header(doc: dict[str, Any], header_bytes: int, size: int, name: str) -> ForeignHeader:
    """Validates a foreign header against itself and the file's size.

    Raises:
      FormatError: naming the tensor and the field at fault.
    """
    meta = doc.get("__metadata__", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError("__metadata__ must be a map of strings", context=name, hint=BAD_FILE_HINT)
    data_bytes = size - 8 - header_bytes
    # a header read as JSON is counted here; one of the usual form was counted from its
    # bytes before its records were built (``files.read_raw_header``)
    refuse_too_many(len(doc) - ("__metadata__" in doc), name, hint=BAD_FILE_HINT)
    tensors: list[ForeignTensor] = []
    for tensor, entry in doc.items():
        if tensor == "__metadata__":
            continue
        tensors.append(_tensor(tensor, expanded(entry), name))
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            what = (
                "overlaps the one before" if t.begin < pos else f"leaves a gap after byte {pos:,}"
            )
            raise FormatError(
                f"tensor {t.name[:200]!r}: data_offsets [{t.begin}, {t.end}] {what}; "
                "tensors cover the data section exactly",
                context=name,
                hint=BAD_FILE_HINT,
            )
        pos = t.end
    if pos != data_bytes:
        raise FormatError(
            f"the tensors cover {pos:,} bytes but the file holds {data_bytes:,} bytes of data "
            "(truncated or extended)",
            context=name,
            hint=BAD_FILE_HINT,
        )
    return ForeignHeader(name, tuple(tensors), dict(meta), header_bytes, size)


def _tensor(tensor: str, entry: Any, name: str) -> ForeignTensor:
    where = f"tensor {tensor[:200]!r}"

    def bad(message: str) -> FormatError:
        return FormatError(f"{where}: {message}", context=name, hint=BAD_FILE_HINT)

    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("an entry holds exactly dtype, shape and data_offsets")
    st = entry["dtype"]
    if not isinstance(st, str) or st not in FOREIGN_DTYPES:
        shown = st[:20] if isinstance(st, str) else type(st).__name__
        if shown in _PACKED:
            raise bad(f"dtype {shown!r} packs several values into a byte; treeguard reads none")
        raise bad(
            f"unknown dtype {shown!r}; safetensors names are "
            + ", ".join(sorted(FOREIGN_DTYPES))
            + " (little-endian by definition)"
        )
    shape = entry["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(ok_int(d, 2**62) for d in shape)
    ):
        raise bad(f"shape must be a list of at most {MAX_NDIM} sizes")
    begin, end = data_offsets(entry, bad)
    dtype = dtype_of(FOREIGN_DTYPES[st])
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise bad(
            f"{summarize(tuple(shape), dtype)} needs {nbytes:,} bytes, "
            f"data_offsets {[begin, end]} give {end - begin:,}"
        )
    if math.prod(max(d, 1) for d in shape) * dtype.itemsize > MAX_ARRAY_BYTES:
        # numpy refuses such a shape even when another axis is 0 (no bytes at all),
        # so a zero-size tensor with huge axes passes the size check and fails here
        raise bad(f"shape {shape[:8]} is larger than any array can be")
    return ForeignTensor(tensor, tuple(shape), dtype, st, begin, end)


def read_foreign_header(path: str | os.PathLike[str], /) -> ForeignHeader | None:
    """The validated header of a foreign safetensors file; None for a treeguard
    checkpoint or a file whose header is not safetensors JSON at all.

    Raises:
      FormatError: for a foreign header that does not describe its file.
    """
    try:
        fd, name = open_checkpoint(path)
    except (FormatError, OSError):
        return None
    try:
        try:
            doc, header_bytes, size = read_raw_header(fd, name)
        except FormatError:
            return None
        if not is_foreign(doc):
            return None
        return foreign_header(doc, header_bytes, size, name)
    finally:
        os.close(fd)
