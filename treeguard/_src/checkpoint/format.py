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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import FormatError, IntegrityError
from ..hashing import ALGORITHMS, HEX_LEN, HEX_RE, Algorithm, Pipeline, check_algorithm
from ..keydtype import impl_of, is_key_dtype
from ..leaf import summarize
from ..paths import keystr, parse
from ..spec import TreeSpec
from ..strictjson import loads

FORMAT = "treeguard.checkpoint/1"
FORMAT_VERSION = 1
_FORMAT_RE = re.compile(r"^treeguard\.checkpoint/(\d{1,9})$")

#: The largest header read, as in the safetensors reference reader.
MAX_HEADER_BYTES = 100_000_000
#: What parsing a header, or a document inside it (the spec, the hashes),
#: may cost: bytes of objects per byte of the header, past a fixed
#: ``HEADER_FREE_COST``. By ``strictjson.Shape.cost`` an honest treeguard
#: header costs about 3.5 times its bytes (its spec alone about 4 times the
#: whole header), and another tool's safetensors header, all tensor table,
#: 6 to 11 times (a dict, two lists and their numbers per tensor; the more
#: the shorter its names), its ``ENTRY_KEYS`` counted once.
HEADER_COST_PER_BYTE = 8
HEADER_FREE_COST = 16 << 20
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


@dataclasses.dataclass(frozen=True)
class Header:
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

    @property
    def data_start(self) -> int:
        """The file offset of the first tensor byte."""
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        return self.file_bytes - self.data_start


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


def encode_header(meta: Mapping[str, str], table: Mapping[str, Any]) -> bytes:
    """The header bytes: JSON, padded with spaces to a multiple of 8."""
    doc: dict[str, Any] = {"__metadata__": dict(meta)}
    doc.update(table)
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


_NOT_OURS = "this is not a file treeguard.save wrote, or it was damaged; " + _RESTORE_HINT


def strict_loads(
    text: str | bytes,
    what: str,
    *,
    context: str | None = None,
    budget: int | None = None,
    shared_keys: Sequence[str] = (),
) -> Any:
    """``strictjson.loads`` with the checkpoint's hint (and ``budget``, the
    most bytes its objects may take, and its ``shared_keys``)."""
    return loads(
        text, what, context=context, hint=_NOT_OURS, budget=budget, shared_keys=shared_keys
    )


def parse_format_version(fmt: Any, *, expected: str, prefix_re: re.Pattern[str]) -> int:
    """The version number of a format string; the pattern bounds its digits."""
    m = prefix_re.match(fmt) if isinstance(fmt, str) else None
    if m is None:
        shown = fmt[:80] if isinstance(fmt, str) else fmt
        if isinstance(fmt, (int, float)):
            shown = type(fmt).__name__
        raise FormatError(f"unknown format {shown!r}, expected {expected!r}")
    return int(m.group(1))


# -- reading the header --------------------------------------------------------


def _ok_int(x: Any, limit: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= limit


def header_from_doc(doc: dict[str, Any], header_bytes: int, size: int, name: str) -> Header:
    """Validates a parsed header against itself and the file's size.

    The tensor entries are taken out of ``doc`` as they are checked, so the
    table is held once, never twice.

    Raises:
      FormatError: for anything that is not a well-formed header of a known
        version, naming the field.
      IntegrityError: if the header does not match its own digest.
    """
    meta = _metadata(doc, name)
    fmt, algorithm = _known_fields(meta, name)
    # The digest covers everything below, so check it before interpreting any of it.
    _check_digest(meta, doc, algorithm, name)
    _compact_table(doc)  # before the spec is parsed, the other large thing
    spec = _stored_spec(meta, header_bytes, name)
    hashes, env, user = _json_objects(meta, header_bytes, name)
    names = leaf_names(spec, name)
    _check_table_names(list(doc), names, name)
    if set(hashes) != set(names):
        raise FormatError(
            f"{K_HASHES} names other tensors than the stored spec", context=name, hint=_NOT_OURS
        )
    tensors = _tensor_infos(doc, spec, names, hashes, algorithm, size - 8 - header_bytes, name)
    # in the order of Header's fields: path, format, spec, ..., file_bytes
    return Header(
        name, fmt, spec, tensors, env, user, algorithm, meta[K_DIGEST], header_bytes, size
    )


def header_budget(header_bytes: int) -> int:
    """The most bytes of objects a header's JSON, or a document inside it,
    may cost parsed: ``HEADER_COST_PER_BYTE`` times the header's bytes, past
    ``HEADER_FREE_COST``.

    Example:
      >>> header_budget(1000) - HEADER_FREE_COST
      8000
    """
    return HEADER_COST_PER_BYTE * header_bytes + HEADER_FREE_COST


def _metadata(doc: dict[str, Any], name: str) -> dict[str, str]:
    """``__metadata__``, taken out of ``doc``: treeguard's, a map of strings."""
    meta = doc.pop("__metadata__", None)
    if not isinstance(meta, dict) or K_FORMAT not in meta:
        raise FormatError(
            "a safetensors file without treeguard metadata, so it holds no contract or hashes",
            context=name,
            hint="read it with safetensors.numpy.load_file, check it, and save it with "
            "treeguard.save",
        )
    bad_meta = [k for k, v in meta.items() if not isinstance(v, str)]
    if bad_meta:
        raise FormatError(
            f"__metadata__ values must be strings; {bad_meta[0][:80]!r} is not",
            context=name,
            hint=_NOT_OURS,
        )
    return meta


def _known_fields(meta: dict[str, str], name: str) -> tuple[str, Algorithm]:
    """The format (of a version this reads) and the hash algorithm; every
    required field present and the digest well formed."""
    fmt = meta[K_FORMAT]
    try:
        version = parse_format_version(fmt, expected=FORMAT, prefix_re=_FORMAT_RE)
    except FormatError as e:
        raise FormatError(e.message, context=name, hint=_NOT_OURS) from None
    if version > FORMAT_VERSION:
        raise FormatError(
            f"format {fmt!r} is newer than this treeguard reads ({FORMAT!r})",
            context=name,
            hint="upgrade treeguard",
        )
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise FormatError(f"the header lacks {', '.join(missing)}", context=name, hint=_NOT_OURS)
    algorithm = meta[K_HASH]
    if algorithm not in ALGORITHMS:
        raise FormatError(
            f"unknown tensor hash {algorithm[:80]!r}, expected one of "
            + ", ".join(repr(a) for a in ALGORITHMS),
            context=name,
            hint=_NOT_OURS,
        )
    if not _HEX_RE.match(meta[K_DIGEST]):
        raise FormatError(
            f"the header digest {meta[K_DIGEST][:80]!r} is not a {algorithm} digest",
            context=name,
            hint=_NOT_OURS,
        )
    return fmt, check_algorithm(algorithm, what=K_HASH)


def _check_digest(meta: dict[str, str], table: dict[str, Any], algorithm: str, name: str) -> None:
    recorded = meta[K_DIGEST]
    actual = header_digest(meta, table)
    if actual != recorded:
        raise IntegrityError(
            f"header: {algorithm} digest {actual[:12]}… of the header read, "
            f"{recorded[:12]}… recorded in it; the header was changed or is corrupt",
            path="__metadata__",
            context=name,
            hint=_RESTORE_HINT,
        )


class _Entry(NamedTuple):
    """A tensor entry of the usual form (a dtype name, a shape and two offsets,
    all of the JSON types they should be) in a third of the memory of its dict."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


#: The stored dtype names, so that each entry's names share one string.
_STORED_NAMES = {n: n for n in (*NATIVE.values(), *FOREIGN)}


def _compact_table(table: dict[str, Any]) -> None:
    """Replaces each entry of the usual form by an ``_Entry``, in place; any
    other is left as it is, for ``_tensor_info`` to say what is wrong."""
    for tensor, entry in table.items():
        if type(entry) is not dict or len(entry) != 3:
            continue
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (
            type(dtype) is str
            and type(shape) is list
            and all(type(d) is int for d in shape)
            and type(offsets) is list
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
        ):
            table[tensor] = _Entry(_STORED_NAMES.get(dtype, dtype), tuple(shape), *offsets)


def _expanded(entry: Any) -> Any:
    """An entry as the header holds it: ``_compact_table`` undone."""
    if isinstance(entry, _Entry):
        return {
            "dtype": entry.dtype,
            "shape": list(entry.shape),
            "data_offsets": [entry.begin, entry.end],
        }
    return entry


def _stored_spec(meta: dict[str, str], header_bytes: int, name: str) -> TreeSpec:
    """The stored spec, its text dropped from ``meta`` once read."""
    try:
        doc = loads(meta.pop(K_SPEC), "spec", budget=header_budget(header_bytes))
        return TreeSpec.from_dict(doc)
    except FormatError as e:
        raise FormatError(f"{K_SPEC}: {e.message}", context=name, hint=_NOT_OURS) from e


def _json_objects(meta: dict[str, str], header_bytes: int, name: str) -> list[dict[str, Any]]:
    """The header's JSON objects: ``treeguard.hashes``, ``.env`` and
    ``.metadata``, each text dropped from ``meta`` once read."""
    fields = (K_HASHES, K_ENV, K_META)
    budget = header_budget(header_bytes)
    values = [strict_loads(meta.pop(f), f, context=name, budget=budget) for f in fields]
    for field, value in zip(fields, values):
        if not isinstance(value, dict):
            raise FormatError(
                f"{field} must be a JSON object, not {type(value).__name__}",
                context=name,
                hint=_NOT_OURS,
            )
    return values


def _tensor_infos(  # noqa: PLR0917 - one call site, every argument needed
    table: dict[str, Any],
    spec: TreeSpec,
    names: Sequence[str],
    hashes: dict[str, Any],
    algorithm: str,
    data_bytes: int,
    name: str,
) -> tuple[TensorInfo, ...]:
    """Every tensor's entry checked against its leaf, in flatten order, each
    starting where the one before ended and all covering the data exactly.
    Each entry is taken out of ``table`` as it is read."""
    tensors: list[TensorInfo] = []
    pos = 0
    for leaf_name, (shape, dtype, _, _) in zip(names, spec.records):
        entry = _expanded(table.pop(leaf_name))
        t = _tensor_info(leaf_name, (shape, dtype), entry, hashes[leaf_name], algorithm, name)
        if t.begin != pos:
            raise FormatError(
                f"tensor {t.name or '<root>'} starts at byte {t.begin:,} of the data, "
                f"expected {pos:,}; tensors are stored contiguously in flatten order",
                context=name,
                hint=_NOT_OURS,
            )
        if t.end > data_bytes:
            raise FormatError(
                f"tensor {t.name or '<root>'}: declares bytes up to {t.end:,} but the file "
                f"holds {data_bytes:,} bytes of data (truncated, or a forged header)",
                context=name,
                hint=_RESTORE_HINT,
            )
        pos = t.end
        tensors.append(t)
    if pos != data_bytes:
        raise FormatError(
            f"the tensors cover {pos:,} bytes but the file holds {data_bytes:,} bytes "
            "of data (truncated or extended)",
            context=name,
            hint=_RESTORE_HINT,
        )
    return tuple(tensors)


def leaf_names(spec: TreeSpec, name: str) -> list[str]:
    """The tensor names a stored spec gives its leaves, checked to be distinct.

    A spec that passed ``TreeSpec.from_json`` has distinct, readable entries
    in every node, so distinct names follow; this is checked again here
    because the names are what the tensors are matched by.
    """
    names = [keystr(p) for p in spec.paths]
    if len(set(names)) != len(names):
        raise FormatError(
            "two leaves of the stored spec share one key path", context=name, hint=_NOT_OURS
        )
    return names


def _check_table_names(table: Sequence[str], names: Sequence[str], name: str) -> None:
    """The tensor table names exactly the spec's leaves, one to one, in flatten order."""
    for tensor in table:
        check_name(tensor, name)
    known, listed = set(names), set(table)  # once: a set per name made this quadratic
    unknown = [t for t in table if t not in known]
    if unknown:
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise FormatError(
            f"tensor {unknown[0][:200]!r} is not a leaf of the stored spec{more}",
            context=name,
            hint=_NOT_OURS,
        )
    absent = [n for n in names if n not in listed]
    if absent:
        raise FormatError(
            f"tensor {absent[0] or '<root>'}: in the stored spec but absent from the tensor table",
            context=name,
            hint=_NOT_OURS,
        )
    if list(table) != list(names):
        first = next(i for i, (a, b) in enumerate(zip(table, names)) if a != b)
        raise FormatError(
            f"the tensor table lists {table[first] or '<root>'} where the stored spec's "
            f"flatten order has {names[first] or '<root>'}",
            context=name,
            hint=_NOT_OURS,
        )


def check_name(tensor: str, name: str) -> None:
    """Refuses a tensor name that is not a key path in its canonical text form."""
    try:
        ok = keystr(parse(tensor)) == tensor
    except ValueError:
        ok = False
    if not ok:
        raise FormatError(
            f"tensor name {tensor[:200]!r} is not a key path such as \"['dense1']['w']\"",
            context=name,
            hint=_NOT_OURS,
        )


def _tensor_info(  # noqa: PLR0917 - one call site, every argument needed
    leaf_name: str,
    record: tuple[tuple[Any, ...], np.dtype[Any]],
    entry: Any,
    recorded: Any,
    algorithm: str,
    name: str,
) -> TensorInfo:
    where = f"tensor {leaf_name or '<root>'}"
    shape, dtype = record

    def bad(message: str) -> FormatError:
        return FormatError(f"{where}: {message}", context=name, hint=_NOT_OURS)

    if (dtype.name not in ALLOWED_DTYPES and not is_key_dtype(dtype)) or dtype.hasobject:
        raise bad(f"dtype {dtype.name!r} is not a numeric dtype treeguard stores")
    if not dtype.isnative:
        raise bad(f"dtype {dtype.str!r} has non-native byte order; checkpoints are little-endian")
    if len(shape) > MAX_NDIM or not all(_ok_int(d, 2**62) for d in shape):
        raise bad(f"the stored spec gives shape {shape!r}, not concrete sizes")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise bad("an entry holds exactly dtype, shape and data_offsets")
    want_dtype, want_shape = stored_layout(tuple(shape), dtype)
    if entry["dtype"] != want_dtype:
        shown = entry["dtype"][:20] if isinstance(entry["dtype"], str) else entry["dtype"]
        raise bad(
            f"dtype {shown!r} in the table, {dtype.name} in the stored spec "
            f"(stored as {want_dtype!r})"
        )
    if entry["shape"] != want_shape:
        raise bad(f"shape {entry['shape']!r} in the table, {list(shape)} in the stored spec")
    offsets = entry["data_offsets"]
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(_ok_int(o, 2**63) for o in offsets)
    ):
        raise bad("data_offsets must be two non-negative integers")
    begin, end = offsets
    nbytes = math.prod(shape) * dtype.itemsize
    if begin > end:
        raise bad(f"data_offsets {offsets} run backwards")
    if end - begin != nbytes:
        raise bad(
            f"{summarize(tuple(shape), dtype)} needs {nbytes:,} bytes, "
            f"data_offsets {offsets} give {end - begin:,}"
        )
    if not isinstance(recorded, str) or not _HEX_RE.match(recorded):
        raise bad(f"no valid {algorithm} digest in {K_HASHES}")
    return TensorInfo(leaf_name, tuple(shape), dtype, want_dtype, begin, end, recorded)
