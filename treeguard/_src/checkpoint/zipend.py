"""The entry count a zip archive claims, read from its end records before
``zipfile`` reads its central directory (a ``ZipInfo`` object per entry).

The end records are found where ``zipfile`` finds them: the end of central
directory record (EOCD) in the last 22 bytes when it has no comment, else the
last EOCD signature in the last 64 KiB and 22 bytes (a comment is at most
64 KiB); a ZIP64 locator in the 20 bytes before it, and the ZIP64 EOCD in the
56 bytes before that (where ``zipfile`` reads it) or at the offset the
locator gives (where the format puts it). The count is the largest any of
those records claims, so an archive that claims too many entries anywhere
``zipfile`` may look is refused. ``zipfile`` itself reads the directory by
its size, whatever count it claims, so the count is also at least what a
directory of the size the records give (at most the file's) could hold: an
archive that claims few entries and holds many is refused before its
directory is read too (and so is one whose directory is over 46 MB, which
no archive of fewer tensors than the limit needs but for long names).
"""

from __future__ import annotations

import struct

from ..hashing import pread_into

#: The EOCD: signature, disk, directory's disk, entries on this disk, entries
#: in all, directory size, directory offset, comment length (22 bytes).
_EOCD = struct.Struct("<4s4H2LH")
#: The ZIP64 locator: signature, the ZIP64 EOCD's disk, its offset, disks (20 bytes).
_LOCATOR = struct.Struct("<4sLQL")
#: The ZIP64 EOCD: signature, its size, two versions, disk, directory's disk,
#: entries on this disk, entries in all, directory size and offset (56 bytes).
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_EOCD_SIG, _LOCATOR_SIG, _EOCD64_SIG = b"PK\x05\x06", b"PK\x06\x07", b"PK\x06\x06"
#: How far from the end ``zipfile`` looks for the EOCD: a comment of at most 64 KiB.
_SEARCHED = (1 << 16) + _EOCD.size
#: The fewest bytes of a central directory entry (one of an empty name).
CENTRAL_ENTRY = 46


def _read(fd: int, offset: int, n: int) -> bytes:
    """Up to ``n`` bytes at ``offset`` (fewer at the end of the file)."""
    buf = bytearray(n)
    got = pread_into(fd, memoryview(buf), offset)
    return bytes(buf[:got])


def _eocd_at(fd: int, size: int) -> int | None:
    """Where ``zipfile`` takes the EOCD to start, or None where it finds none."""
    if size < _EOCD.size:
        return None
    last = _read(fd, size - _EOCD.size, _EOCD.size)
    if last[:4] == _EOCD_SIG and last[-2:] == b"\x00\x00":
        return size - _EOCD.size  # no comment
    start = max(size - _SEARCHED, 0)
    found = _read(fd, start, size - start).rfind(_EOCD_SIG)
    if found < 0 or start + found + _EOCD.size > size:
        return None
    return start + found


def _record(fd: int, kind: struct.Struct, offset: int, sig: bytes) -> tuple[int, ...] | None:
    """The record of ``kind`` at ``offset``, or None where another signature
    is there, or too few bytes (the file shrank since its size was taken)."""
    data = _read(fd, offset, kind.size) if offset >= 0 else b""
    if len(data) < kind.size or data[:4] != sig:
        return None
    return tuple(int(x) for x in kind.unpack(data)[1:])


def _eocd64_records(fd: int, at: int) -> list[tuple[int, ...]]:
    """The ZIP64 EOCDs where ``zipfile`` may read one, as the locator before
    ``at`` points to them (none where there is no locator)."""
    locator = _record(fd, _LOCATOR, at - _LOCATOR.size, _LOCATOR_SIG)
    if locator is None:
        return []
    places = {at - _LOCATOR.size - _EOCD64.size, locator[1]}
    found = [_record(fd, _EOCD64, p, _EOCD64_SIG) for p in places if p <= at - _EOCD64.size]
    return [r for r in found if r is not None]


def claimed_entries(fd: int, size: int) -> int:
    """The most entries the end records of the zip archive of ``size`` bytes
    open at ``fd`` claim, or could hold: ``zipfile`` reads as many bytes of
    directory as they say, whatever count they claim, and builds an object
    for each entry in them (``CENTRAL_ENTRY`` bytes at least); 0 where it has
    no end record (``zipfile`` refuses it).

    Example:
      >>> import io, os, tempfile, zipfile
      >>> buf = io.BytesIO()
      >>> with zipfile.ZipFile(buf, "w") as z:
      ...     z.writestr("a.npy", b""); z.writestr("b.npy", b"")
      >>> fd, path = tempfile.mkstemp()
      >>> os.write(fd, buf.getvalue()) == len(buf.getvalue())
      True
      >>> claimed_entries(fd, len(buf.getvalue()))
      2
      >>> os.close(fd); os.remove(path)
    """
    at = _eocd_at(fd, size)
    eocd = None if at is None else _record(fd, _EOCD, at, _EOCD_SIG)
    if at is None or eocd is None:
        return 0
    zip64 = _eocd64_records(fd, at)
    counts = [eocd[2], eocd[3], *(n for r in zip64 for n in (r[5], r[6]))]
    # the directory's size: a ZIP64 EOCD's where zipfile finds one, else the EOCD's
    directory = max(r[7] for r in zip64) if zip64 else eocd[4]
    return max(*counts, min(directory, size) // CENTRAL_ENTRY)
