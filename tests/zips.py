"""Zip archives as a hostile writer makes them: stored members, a central
directory, and end records (the EOCD, and the ZIP64 locator and EOCD) whose
counts and comment the test chooses."""

from __future__ import annotations

import struct
import zlib


def local(name: bytes, data: bytes) -> bytes:
    """A stored zip member's local header and data."""
    crc = zlib.crc32(data)
    head = struct.pack(
        "<IHHHHHIIIHH", 0x04034B50, 20, 0, 0, 0, 0, crc, len(data), len(data), len(name), 0
    )
    return head + name + data


def central(name: bytes, data: bytes, offset: int) -> bytes:
    """A stored member's central directory entry, its local header at ``offset``."""
    crc = zlib.crc32(data)
    fields = (0x02014B50, 20, 20, 0, 0, 0, 0, crc, len(data), len(data), len(name))
    return struct.pack("<IHHHHHHIIIHHHHHII", *fields, 0, 0, 0, 0, 0, offset) + name


def eocd(entries: int, directory: int, offset: int, comment: bytes = b"") -> bytes:
    """The end of central directory record: ``entries`` on this disk and in
    all, the directory's size and offset, and the comment after it."""
    fields = (0x06054B50, 0, 0, entries, entries, directory, offset, len(comment))
    return struct.pack("<IHHHHIIH", *fields) + comment


def zip64(
    members: list[tuple[bytes, bytes]], *, claimed: int | None = None, comment: bytes = b""
) -> bytes:
    """A zip archive of these stored members, its end records in the ZIP64 form
    that more than 65,535 members need; the ZIP64 EOCD claims ``claimed``
    entries (by default, as many as there are)."""
    parts, entries, offset = [], [], 0
    for name, data in members:
        parts.append(local(name, data))
        entries.append(central(name, data, offset))
        offset += len(parts[-1])
    directory = b"".join(entries)
    n = len(members) if claimed is None else claimed
    end64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(directory), offset)
    locator = struct.pack("<IIQI", 0x07064B50, 0, offset + len(directory), 1)
    end = eocd(0xFFFF, 2**32 - 1, 2**32 - 1, comment)
    return b"".join(parts) + directory + end64 + locator + end
