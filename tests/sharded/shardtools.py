"""Helpers of the sharded checkpoint tests: read the manifest, damage stored
bytes, free ports."""

from __future__ import annotations

import os
import socket
from pathlib import Path

# The manifest's own reader on purpose: the tests look at and damage what a save
# wrote, which no public call hands out.
from treeguard._src.sharded.manifest import MANIFEST_NAME, is_sharded, read, sharded_digest

__all__ = [
    "MANIFEST_NAME",
    "data_dir",
    "flip_byte",
    "free_port",
    "is_sharded",
    "read",
    "sharded_digest",
]


def data_dir(directory: str | os.PathLike[str]) -> Path:
    """The data directory the manifest of ``directory`` names."""
    return Path(directory) / read(directory).data


def flip_byte(directory: str | os.PathLike[str], needle: bytes) -> Path:
    """Flips one bit in the middle of ``needle``, found in a stored chunk file
    under the checkpoint's data directory; returns that file."""
    for root, _, files in os.walk(data_dir(directory)):
        for name in sorted(files):
            path = Path(root) / name
            raw = bytearray(path.read_bytes())
            at = raw.find(needle)
            if at >= 0:
                raw[at + len(needle) // 2] ^= 0x01
                path.write_bytes(bytes(raw))
                return path
    raise AssertionError("the array's bytes are in no stored file")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
