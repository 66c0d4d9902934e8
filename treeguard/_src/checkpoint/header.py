"""Reading a checkpoint's header: the steps from the parsed JSON to a checked
``Header`` (format version, required fields, the header digest, the spec, the
tensor table matched to the spec's leaves), the table, the spec and the
documents beside it within one ``table_budget``."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import FormatError, IntegrityError
from ..hashing import ALGORITHMS, Algorithm, check_algorithm
from ..keydtype import is_key_dtype
from ..leaf import summarize
from ..paths import keystr, parse
from ..spec import TreeSpec
from ..specscan import scan as scan_spec
from ..strictjson import Shape, loads
from .digests import Digests
from .digests import cost as digests_cost
from .digests import scan as scan_digests
from .format import (
    _FORMAT_RE,
    _HEX_RE,
    _REQUIRED,
    _RESTORE_HINT,
    ALLOWED_DTYPES,
    FORMAT,
    FORMAT_VERSION,
    K_DIGEST,
    K_ENV,
    K_FORMAT,
    K_HASH,
    K_HASHES,
    K_META,
    K_SPEC,
    MAX_NDIM,
    OVER_BUDGET_HINT,
    TABLE_COST_PER_BYTE,
    TABLE_FREE_COST,
    Header,
    TensorInfo,
    data_offsets,
    header_digest,
    ok_int,
    stored_layout,
)
from .table import STORED_NAMES, Entry, Expanded, expanded, held_cost

_NOT_OURS = "this is not a file treeguard.save wrote, or it was damaged; " + _RESTORE_HINT


def strict_loads(
    text: str | bytes,
    what: str,
    *,
    context: str | None = None,
    budget: int | None = None,
    shared_keys: Sequence[str] = (),
) -> Any:
    """``strictjson.loads`` with the checkpoint's hints (and ``budget``, the
    most bytes its objects may take, and its ``shared_keys``)."""
    return loads(
        text,
        what,
        context=context,
        hint=_NOT_OURS,
        budget=budget,
        over_hint=OVER_BUDGET_HINT,
        shared_keys=shared_keys,
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
    spec, found, (*hashes, env, user) = _documents(doc, meta, header_bytes, name)
    listed = list(doc)
    names = leaf_names(spec, name, listed)
    _check_table_names(listed, names, name)
    del listed
    digests: Sequence[Any] | None = found  # the table's names, in its order, where read so
    if digests is None:
        if set(hashes[0]) != set(names):
            raise FormatError(
                f"{K_HASHES} names other tensors than the stored spec", context=name, hint=_NOT_OURS
            )
        digests = [hashes[0][n] for n in names]
    tensors = _tensor_infos(doc, spec, names, digests, algorithm, size - 8 - header_bytes, name)
    # in the order of Header's fields: path, format, spec, ..., file_bytes
    return Header(
        name, fmt, spec, tensors, env, user, algorithm, meta[K_DIGEST], header_bytes, size
    )


def within_budget(doc: dict[str, Any], header_bytes: int, name: str) -> None:
    """Reads a parsed header's spec and documents in its one budget, as
    ``header_from_doc`` does, and no more (its digests are not checked):
    how ``save`` learns, before it writes a byte, that a reader would take
    the header it laid out.

    Raises:
      FormatError: as ``header_from_doc`` refuses the header, for the spec
        or a document over what is left of the budget.
    """
    _documents(doc, _metadata(doc, name), header_bytes, name)


def _documents(
    doc: dict[str, Any], meta: dict[str, str], header_bytes: int, name: str
) -> tuple[TreeSpec, Digests | None, list[dict[str, Any]]]:
    """The stored spec, the digests (where read into one buffer) and the
    JSON objects still in ``meta``, all in one budget with the table."""
    _compact_table(doc)  # before the spec is parsed, the other large thing
    # one budget for the table, the spec and the documents beside it
    left = table_budget(header_bytes) - held_cost(doc, meta)
    spec, left = _stored_spec(meta, left, name)
    found, left = _digests(meta, doc, left)
    return spec, found, _json_objects(meta, left, name)


def table_budget(header_bytes: int) -> int:
    """The most bytes of objects reading a header may cost: its tensor table
    and ``__metadata__``'s strings, then the stored spec and the hashes,
    environment and metadata documents, all in one budget of
    ``TABLE_COST_PER_BYTE`` times its bytes, past ``TABLE_FREE_COST``; with
    the bytes themselves (held only while the table is read), at most 4
    times the header past the allowance.

    Example:
      >>> table_budget(1000) - TABLE_FREE_COST
      3000
    """
    return TABLE_COST_PER_BYTE * header_bytes + TABLE_FREE_COST


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
    actual = header_digest(meta, Expanded(table))
    if actual != recorded:
        raise IntegrityError(
            f"header: {algorithm} digest {actual[:12]}… of the header read, "
            f"{recorded[:12]}… recorded in it; the header was changed or is corrupt",
            path="__metadata__",
            context=name,
            hint=_RESTORE_HINT,
        )


def _compact_table(table: dict[str, Any]) -> None:
    """Replaces each entry of the usual form by an ``Entry``, in place (a
    table ``strictjson.loads`` read; ``table.scan`` builds them so); any
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
            table[tensor] = Entry(STORED_NAMES.get(dtype, dtype), tuple(shape), *offsets)


def _stored_spec(meta: dict[str, str], left: int, name: str) -> tuple[TreeSpec, int]:
    """The stored spec, read in at most ``left`` bytes of objects, and the
    bytes left after it; its text dropped from ``meta`` once read.

    The form ``TreeSpec.to_json`` writes is read into compact records
    (``specscan.scan``); any other is parsed as JSON in half of ``left``
    (its equal leaves one dict), the ``TreeSpec`` built from it in the rest.
    """
    text = meta.pop(K_SPEC)
    left += sys.getsizeof(text)  # given back once the spec is read
    found = scan_spec(text, max(0, left - sys.getsizeof(text)))
    if found is not None:
        return TreeSpec(found[0], found[1]), left - found[2]
    try:
        budget = max(0, left - sys.getsizeof(text)) // 2
        doc = loads(text, "spec", budget=budget, over_hint=OVER_BUDGET_HINT, share=_is_leaf)
        del text
        return TreeSpec.from_dict(doc), left // 2
    except FormatError as e:
        hint = OVER_BUDGET_HINT if e.hint == OVER_BUDGET_HINT else _NOT_OURS
        raise FormatError(f"{K_SPEC}: {e.message}", context=name, hint=hint) from e


def _is_leaf(node: dict[str, Any]) -> bool:
    """Whether a spec's node is a leaf (whose dict ``TreeSpec.from_dict`` only reads)."""
    return node.get("kind") == "leaf"


def _digests(meta: dict[str, str], table: dict[str, Any], left: int) -> tuple[Digests | None, int]:
    """``treeguard.hashes`` read into one buffer (``digests.scan``), its
    text dropped from ``meta``, and what is left; None (and ``left``) for a
    document of another form, left in ``meta`` to be parsed as JSON."""
    text = meta[K_HASHES]
    found = scan_digests(text, table, len(table), max(0, left))
    if found is None:
        return None, left
    del meta[K_HASHES]
    return found, left + sys.getsizeof(text) - digests_cost(len(table))


def _json_objects(meta: dict[str, str], left: int, name: str) -> list[dict[str, Any]]:
    """The header's JSON objects still in ``meta``: ``treeguard.hashes``
    (unless read already), ``.env`` and ``.metadata``, each text dropped
    from ``meta`` once read, together in at most ``left`` bytes of objects
    (each text's bytes given back)."""
    fields = [f for f in (K_HASHES, K_ENV, K_META) if f in meta]
    values = []
    for field in fields:
        text = meta.pop(field)
        value = strict_loads(text, field, context=name, budget=max(0, left))
        left += sys.getsizeof(text) - Shape.of(text).cost
        values.append(value)
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
    digests: Sequence[Any],
    algorithm: str,
    data_bytes: int,
    name: str,
) -> tuple[TensorInfo, ...]:
    """Every tensor's entry checked against its leaf, in flatten order, each
    starting where the one before ended and all covering the data exactly,
    each with its recorded digest (``digests``, in the order of ``names``).
    Each entry is taken out of ``table`` as it is read."""
    tensors: list[TensorInfo] = []
    pos = 0
    for i, (leaf_name, (shape, dtype, _, _)) in enumerate(zip(names, spec.records)):
        entry = expanded(table.pop(leaf_name))
        t = _tensor_info(leaf_name, (shape, dtype), entry, digests[i], algorithm, name)
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


def leaf_names(spec: TreeSpec, name: str, listed: Sequence[str] = ()) -> list[str]:
    """The tensor names a stored spec gives its leaves, checked to be distinct.

    A spec that passed ``TreeSpec.from_json`` has distinct, readable entries
    in every node, so distinct names follow; this is checked again here
    because the names are what the tensors are matched by. Names equal, in
    order, to ``listed`` (a table's keys, distinct) need no set to show it.
    """
    names = [keystr(p) for p in spec.paths]
    if names != listed and len(set(names)) != len(names):
        raise FormatError(
            "two leaves of the stored spec share one key path", context=name, hint=_NOT_OURS
        )
    return names


def _check_table_names(table: Sequence[str], names: Sequence[str], name: str) -> None:
    """The tensor table names exactly the spec's leaves, one to one, in flatten order."""
    for tensor in table:
        check_name(tensor, name)
    if len(table) == len(names) and all(t == n for t, n in zip(table, names)):
        return  # as save writes it: no set of either built
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
    if len(shape) > MAX_NDIM or not all(ok_int(d, 2**62) for d in shape):
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
    begin, end = data_offsets(entry, bad)
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
        raise bad(
            f"{summarize(tuple(shape), dtype)} needs {nbytes:,} bytes, "
            f"data_offsets {[begin, end]} give {end - begin:,}"
        )
    if not isinstance(recorded, str) or not _HEX_RE.match(recorded):
        raise bad(f"no valid {algorithm} digest in {K_HASHES}")
    return TensorInfo(leaf_name, tuple(shape), dtype, want_dtype, begin, end, recorded)
