"""Opening a checkpoint and reading its bytes: only regular files, bounded reads.

The file is opened once (``atomic.open_regular``: no symbolic link followed,
no FIFO or device blocked on) and every later read is a ``pread`` on that one
descriptor, so the header, the digest check and the tensors all come from
the same file even if the path is replaced meanwhile.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from ..atomic import open_regular
from ..errors import FormatError
from ..hashing import Source, announce, pread_into, source_size
from .format import BAD_FILE_HINT, ENTRY_KEYS, MAX_HEADER_BYTES, MAX_TENSORS, refuse_too_many
from .header import strict_loads, table_budget
from .table import Buffer, entries_past, scan

_PICKLE_HINT = (
    "this looks like a pickle or zip (torch) file; treeguard never unpickles. "
    "Convert it with a trusted tool into a treeguard or safetensors checkpoint"
)
_TRUNCATED_HINT = "this is not a whole checkpoint; restore it from a verified copy or save it again"


def open_checkpoint(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Opens a checkpoint for reading; returns the descriptor and the path text.

    Raises:
      FormatError: for a symbolic link, a directory, a FIFO, a device or a socket.
      FileNotFoundError: if nothing is there.
    """
    return open_regular(path, what="checkpoint"), os.fspath(path)


def _looks_pickled(head: bytes) -> bool:
    return head[:1] == b"\x80" or head[:2] == b"PK"


def utf8_text(raw: Buffer, what: str, name: str) -> str:
    """``raw`` as UTF-8 text, or a ``FormatError`` saying ``what`` is not.

    Example:
      >>> utf8_text(b"{}", "the header is", "f")
      '{}'
    """
    try:
        return str(raw, "utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{what} not UTF-8 text ({e.reason} at byte {e.start})", context=name
        ) from None


def read_raw_header(
    fd: Source, name: str, *, whole: bool = False
) -> tuple[dict[str, Any], int, int]:
    """The parsed JSON header (strictly parsed; its tensor entries as
    ``table.Entry`` records where they are of the usual form), its length
    and the file size, read in at most ``table_budget`` bytes of objects.
    Once its length is known, the header's bytes are announced to a source
    that takes a plan (``hashing.announce``), so a bucket fetches them alone;
    with ``whole`` (the caller reads every byte next), the whole file is
    announced instead, so its data arrives while the header is parsed.

    A header of more than ``MAX_TENSORS`` entries of the usual form is
    refused when they are counted from its bytes, before any record is built.

    Raises:
      FormatError: for a file too short, a header too long or beyond the
        file, bytes that are not UTF-8 JSON of one object, a header of too
        many entries.
    """
    size = source_size(fd)
    if size < 8:
        raise FormatError(
            f"{size} bytes; a checkpoint starts with an 8-byte header length "
            "(truncated, or not a checkpoint)",
            context=name,
            hint=_TRUNCATED_HINT,
        )
    head = bytearray(8)
    if pread_into(fd, memoryview(head), 0) != 8:
        raise FormatError("could not read the 8-byte header length", context=name)
    n = int.from_bytes(head, "little")
    hint = _PICKLE_HINT if _looks_pickled(bytes(head)) else _TRUNCATED_HINT
    if n > MAX_HEADER_BYTES:
        raise FormatError(
            f"the header claims {n:,} bytes, over the {MAX_HEADER_BYTES:,}-byte limit; "
            "not a checkpoint",
            context=name,
            hint=hint,
        )
    if 8 + n > size:
        raise FormatError(
            f"the header claims {n:,} bytes but only {size - 8:,} follow the length "
            "field (truncated, or not a checkpoint)",
            context=name,
            hint=hint,
        )
    if n < 2:
        raise FormatError(f"a header of {n} bytes cannot hold a JSON object", context=name)
    announce(fd, [(0, size if whole else 8 + n)])
    with mmap.mmap(-1, n) as raw:  # unmapped once read: no freed heap kept past the read
        with memoryview(raw) as view:
            if pread_into(fd, view, 8) != n:
                raise FormatError("the file shrank while its header was read", context=name)
        found = _scanned(raw, name, hint)
    return _parsed(found, n, name), n, size


def header_doc(raw: Buffer, name: str) -> dict[str, Any]:
    """A header's bytes parsed as ``read_raw_header`` parses them, within
    ``table_budget`` (``save`` reads the header it laid out so).

    Raises:
      FormatError: as ``read_raw_header``, once the header's bytes are read.

    Example:
      >>> header_doc(b'{"__metadata__": {"a": "b"}}', "f")
      {'__metadata__': {'a': 'b'}}
    """
    return _parsed(_scanned(raw, name, BAD_FILE_HINT), len(raw), name)


def _scanned(raw: Buffer, name: str, hint: str) -> dict[str, Any] | str:
    """A header's bytes read into records where of the usual form (costed
    first), or else as text for ``_parsed``."""
    if raw[:1] != b"{":
        raise FormatError("the header is not a JSON object", context=name, hint=hint)
    if entries_past(raw, MAX_TENSORS):  # counted before a record is built
        refuse_too_many(MAX_TENSORS + 1, name, hint=BAD_FILE_HINT)
    doc = scan(raw, table_budget(len(raw)))  # the usual form, into records costed first
    return utf8_text(raw, "the header is", name) if doc is None else doc


def _parsed(found: dict[str, Any] | str, n: int, name: str) -> dict[str, Any]:
    """``_scanned``'s records, or its text parsed as JSON, measured first."""
    doc: Any = found
    if isinstance(found, str):  # any other, as JSON, measured before it is parsed
        doc = strict_loads(
            found, "the header", context=name, budget=table_budget(n), shared_keys=ENTRY_KEYS
        )
        del found
    if not isinstance(doc, dict):
        raise FormatError("the header is not a JSON object", context=name)
    return doc
