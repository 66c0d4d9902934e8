"""The checkpoint format: its constants, its header and the strict reading of it.

Layout (the safetensors format, so ``safetensors.numpy.load_file`` opens it)::

    8 bytes   little-endian length N of the header
    N bytes   UTF-8 JSON header, padded with spaces to a multiple of 8
    ...       every tensor's bytes, back to back, in the tree's flatten order

The header maps each tensor name to ``{"dtype", "shape", "data_offsets"}``
and holds ``__metadata__``, a map of strings:

* ``treeguard.format``: ``"treeguard.checkpoint/1"``;
* ``treeguard.spec``: the ``TreeSpec`` JSON, the authority for the structure;
* ``treeguard.hash`` and ``treeguard.hashes``: the hash algorithm
  (``"blake3"``, or ``"sha256"`` in files written before BLAKE3 or with
  ``digest="sha256"``) and one hex digest per tensor, keyed by tensor name;
* ``treeguard.env``: the environment fingerprint of the writer;
* ``treeguard.metadata``: the caller's metadata, as JSON;
* ``treeguard.digest``: a hash (by the same algorithm) of all the above and
  of the tensor table, so a changed header byte is caught even where the
  JSON still parses.

Tensor names are key paths in ``keystr`` form (``['dense1']['w']``), which
``paths.parse`` reads back exactly; the names are exactly the stored spec's
leaf paths, one to one and in flatten order, and the data follow in the same
order. A dtype that ``safetensors.numpy`` cannot represent (float8 and the
other ml_dtypes besides bfloat16, complex128) is stored as ``U8`` bytes, one
trailing axis of ``itemsize`` bytes, and its true dtype is in the spec. A
typed PRNG key array is stored as its raw ``U32`` key data (key axes last),
and the spec gives its dtype as ``key<fry>`` (``keydtype.py``), so ``load``
wraps it back into keys of the same implementation.

Every JSON document in a header is read strictly: a duplicate key, NaN or
Infinity, an integer of more than 20 digits, a field of the wrong type or a
size beyond the file is a ``FormatError`` that says where.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from ..errors import FormatError
from ..hashing import HEX_LEN, HEX_RE, Algorithm, Pipeline, check_algorithm
from ..keydtype import impl_of, is_key_dtype
from ..leaf import summarize
from ..spec import TreeSpec

FORMAT = "treeguard.checkpoint/1"
FORMAT_VERSION = 1
_FORMAT_RE = re.compile(r"^treeguard\.checkpoint/(\d{1,9})$")

#: The largest header read, as in the safetensors reference reader.
MAX_HEADER_BYTES = 100_000_000
#: The most tensors a file may hold (a large mixture of experts holds about 10**5);
#: each one costs Python objects many times its bytes in the file. No treeguard
#: header comes near it: each of its tensors has an entry and a 64-digit hash,
#: over 100 bytes, so ``MAX_HEADER_BYTES`` holds fewer than a million.
MAX_TENSORS = 1_000_000
#: The hint of every refusal of a foreign header.
BAD_FILE_HINT = (
    "the header does not describe the file (truncated, or a forged header); "
    "get a fresh copy from where the weights came from"
)
#: What reading a header may cost in objects: its tensor table and
#: ``__metadata__``'s strings, then the stored spec (its records, or its JSON
#: and the ``TreeSpec`` built from it) and the hashes, environment and
#: metadata documents, all in one budget of ``TABLE_COST_PER_BYTE`` times
#: its bytes, past ``TABLE_FREE_COST``. Its bytes are held too while the
#: table is read, so a header costs at most 4 times its bytes past the
#: allowance. ``table.scan`` reads a table of the usual form in 1.5 to 3.5
#: times its bytes (the shorter the names and the larger the offsets, the
#: more), ``specscan.scan`` a spec of the form ``TreeSpec.to_json`` writes
#: in about 1.5 times its text (3.4 times where each leaf has a shape of its
#: own, 4.4 where each also sits in a container of keys found nowhere else,
#: so that a tree of 20,500 such is over the budget: ``save`` refuses it,
#: ``readback.check_readable``); an honest treeguard header costs about 3
#: times its bytes in all. The allowance covers what does not grow with the
#: header (dicts' first tables, the metadata's few strings: kilobytes) many
#: times over, and lets any header under a MiB through in whatever form
#: ``strictjson.loads`` can read.
TABLE_COST_PER_BYTE = 3
TABLE_FREE_COST = 4 << 20
#: The keys of every tensor entry (parsing keeps one string for each).
ENTRY_KEYS = ("dtype", "shape", "data_offsets")
#: Tensors, and characters of a metadata value, put in the header digest's
#: canonical text at once.
_DIGEST_BATCH, _DIGEST_CHUNK = 4096, 1 << 20
_HEX_RE = HEX_RE
PLACEHOLDER = "0" * HEX_LEN
MAX_NDIM = 64

K_FORMAT = "treeguard.format"
K_SPEC = "treeguard.spec"
K_HASH = "treeguard.hash"
K_HASHES = "treeguard.hashes"
K_ENV = "treeguard.env"
K_META = "treeguard.metadata"
K_DIGEST = "treeguard.digest"
_REQUIRED = (K_FORMAT, K_SPEC, K_HASH, K_HASHES, K_ENV, K_META, K_DIGEST)

#: numpy dtype name -> safetensors dtype name, for the dtypes
#: ``safetensors.numpy`` reads natively.
NATIVE: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}
FOREIGN: dict[str, str] = {
    **{v: k for k, v in NATIVE.items()},
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
#: The ml_dtypes types, by name, so that reading a header need not import
#: ml_dtypes (a test checks that every ml_dtypes float and int type is here).
ML_DTYPES = (
    *("float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e3m4", "float8_e4m3"),
    *("float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"),
    *("float8_e5m2fnuz", "float8_e5m3fnu", "float8_e8m0fnu"),
    *("int1", "int2", "int4", "uint1", "uint2", "uint4"),
)
#: Every dtype a checkpoint may hold: plain numeric types and ml_dtypes.
#: Nothing else is ever allocated from a file (no object or structured dtypes).
ALLOWED_DTYPES: frozenset[str] = frozenset([*NATIVE, "complex128", *ML_DTYPES])

_RESTORE_HINT = "restore the file from a verified copy (ArtifactStore.rollback) or save it again"
#: The fix for a header over its budget, which may be one ``save`` wrote.
OVER_BUDGET_HINT = (
    f"a reader allows {TABLE_COST_PER_BYTE} bytes of objects per byte of header past "
    f"{TABLE_FREE_COST >> 20} MiB, and no option raises it; a file an older treeguard.save "
    "wrote for a tree of very many leaves or keys each of its own can be over it: read its "
    "tensors unverified with safetensors.numpy.load_file and save them as fewer leaves; a damaged "
    "file: " + _RESTORE_HINT
)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor's entry in a safetensors header, ours or another tool's.

    Attributes:
      name: the tensor name (a key path in ``keystr`` form in our files; as
        the writer gave it in another tool's).
      shape: the leaf's shape.
      dtype: the leaf's numpy dtype (``bfloat16`` and the float8 types from
        ml_dtypes too).
      stored_dtype: the safetensors dtype name in the header (``"F32"``;
        ``"U8"`` for a dtype stored as raw bytes).
      begin: the first byte, counted from the start of the data section.
      end: one past the last byte, counted the same way.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    stored_dtype: str
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def size(self) -> int:
        """The element count."""
        return math.prod(self.shape)

    def summary(self) -> str:
        """``f32[3,1]``."""
        return summarize(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo(StoredTensor):
    """One tensor's entry in a treeguard checkpoint's header: a
    ``StoredTensor`` whose name is the leaf's key path, with its hash.

    Attributes:
      digest: the recorded hex digest of the bytes.
    """

    digest: str


class Framed:
    """The frame of a safetensors file, ours or another tool's: an 8-byte
    length, ``header_bytes`` of header, then the data up to ``file_bytes``.
    A header dataclass declares the two fields; this gives the offsets."""

    header_bytes: int
    file_bytes: int

    @property
    def data_start(self) -> int:
        """The file offset of the first tensor byte."""
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        """The bytes of the data section."""
        return self.file_bytes - self.data_start


@dataclasses.dataclass(frozen=True)
class Header(Framed):
    """A checkpoint's header, validated against the file's size; no data read.

    Attributes:
      path: the file it was read from.
      format: the format string, ``"treeguard.checkpoint/1"``.
      spec: the stored ``TreeSpec``.
      tensors: one ``TensorInfo`` per leaf, in the spec's flatten order.
      env: the writer's environment fingerprint.
      metadata: the caller's metadata given to ``save``.
      hash_name: the hash algorithm of the tensors and the header digest
        (``"blake3"`` or ``"sha256"``).
      digest: the header digest.
      header_bytes: the header's length in bytes (without the 8-byte prefix).
      file_bytes: the file's size.
    """

    path: str
    format: str
    spec: TreeSpec
    tensors: tuple[TensorInfo, ...]
    env: dict[str, Any]
    metadata: dict[str, Any]
    hash_name: Algorithm
    digest: str
    header_bytes: int
    file_bytes: int


# -- writing the header --------------------------------------------------------


def stored_layout(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[str, list[int]]:
    """The safetensors dtype and shape under which a leaf is written."""
    native = NATIVE.get(dtype.name)
    if native is not None:
        return native, list(shape)
    if is_key_dtype(dtype):  # a typed PRNG key: its raw uint32 data, key axes last
        return "U32", [*shape, *impl_of(dtype)[1]]
    if dtype.itemsize == 1:
        return "U8", list(shape)
    return "U8", [*shape, dtype.itemsize]


def header_digest(meta: Mapping[str, str], table: Mapping[str, Any]) -> str:
    """The digest over the metadata (all but the digest itself) and the
    table, by the algorithm the metadata names (``treeguard.hash``).

    The canonical text (``json.dumps`` of ``{"metadata": ..., "tensors":
    ...}``, keys sorted, no spaces) is hashed a batch of tensors at a time,
    never built whole.
    """
    algorithm = check_algorithm(meta[K_HASH], what=K_HASH)
    body = {k: v for k, v in meta.items() if k != K_DIGEST}
    with Pipeline(algorithm) as pipeline:
        for chunk in _canonical_chunks(body, table):
            pipeline.feed(0, chunk)
        return pipeline.digests()[0]


def _canonical_chunks(body: Mapping[str, str], table: Mapping[str, Any]) -> Iterator[bytes]:
    """``json.dumps({"metadata": body, "tensors": table}, sort_keys=True,
    separators=(",", ":"))``, encoded, in pieces: a metadata value (the spec,
    the hashes) ``_DIGEST_CHUNK`` characters at a time, the table
    ``_DIGEST_BATCH`` tensors at a time."""
    yield b'{"metadata":{'
    for i, key in enumerate(sorted(body)):
        text = ("," if i else "") + _canonical(key) + ":" + _canonical(body[key])
        for j in range(0, len(text), _DIGEST_CHUNK):
            yield text[j : j + _DIGEST_CHUNK].encode("utf-8")
    yield b'},"tensors":{'
    keys = sorted(table)
    for i in range(0, len(keys), _DIGEST_BATCH):
        batch = _canonical({k: table[k] for k in keys[i : i + _DIGEST_BATCH]})
        yield (("," if i else "") + batch[1:-1]).encode("utf-8")
    yield b"}}"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def draft_meta(
    spec_json: str, algorithm: Algorithm, env_json: str, user_json: str, names: Iterable[str]
) -> dict[str, str]:
    """The ``__metadata__`` of a header being written, every digest still a
    ``PLACEHOLDER`` of its final length (see :func:`signed_meta`).

    Example:
      >>> meta = draft_meta("{}", "sha256", "{}", "{}", ["['w']"])
      >>> meta[K_FORMAT], meta[K_DIGEST] == PLACEHOLDER
      ('treeguard.checkpoint/1', True)
    """
    return {
        K_FORMAT: FORMAT,
        K_SPEC: spec_json,
        K_HASH: algorithm,
        K_HASHES: json.dumps({n: PLACEHOLDER for n in names}, ensure_ascii=False),
        K_ENV: env_json,
        K_META: user_json,
        K_DIGEST: PLACEHOLDER,
    }


def signed_meta(
    meta: Mapping[str, str], table: Mapping[str, Any], hashes: Mapping[str, str]
) -> dict[str, str]:
    """``meta`` with each tensor's digest in ``hashes`` and the header digest over them all.

    Example:
      >>> meta = draft_meta("{}", "sha256", "{}", "{}", ["['w']"])
      >>> done = signed_meta(meta, {}, {"['w']": "ab" * 32})
      >>> done[K_DIGEST] == header_digest(done, {}) != PLACEHOLDER
      True
    """
    out = dict(meta)
    out[K_HASHES] = json.dumps(dict(hashes), ensure_ascii=False)
    out[K_DIGEST] = header_digest(out, table)
    return out


def encode_header(meta: Mapping[str, str], table: Mapping[str, Any]) -> bytes:
    """The header bytes: JSON, padded with spaces to a multiple of 8."""
    doc: dict[str, Any] = {"__metadata__": dict(meta)}
    doc.update(table)
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def ok_int(x: Any, limit: int) -> bool:
    """Whether ``x`` is an integer (not a bool) from 0 to ``limit``."""
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= limit


def data_offsets(entry: Mapping[str, Any], bad: Callable[[str], FormatError]) -> tuple[int, int]:
    """A table entry's ``data_offsets``: two non-negative integers, in order.

    Raises:
      FormatError: ``bad(message)`` for offsets that are not two integers or
        that run backwards.
    """
    offsets = entry["data_offsets"]
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(ok_int(o, 2**63) for o in offsets)
    ):
        raise bad("data_offsets must be two non-negative integers")
    begin, end = offsets
    if begin > end:
        raise bad(f"data_offsets {offsets} run backwards")
    return begin, end


def refuse_too_many(count: int, name: str, *, hint: str) -> None:
    """Refuses a file that holds (or claims) more than ``MAX_TENSORS`` tensors:
    the one refusal of every reader that counts them, early or late.

    Raises:
      FormatError: naming the limit, for a ``count`` over it.

    Example:
      >>> refuse_too_many(MAX_TENSORS, "f", hint="")
    """
    if count > MAX_TENSORS:
        raise FormatError(
            f"holds more than {MAX_TENSORS:,} tensors; no model has that many",
            context=name,
            hint=hint,
        )
