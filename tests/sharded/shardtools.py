"""Helpers of the sharded checkpoint tests: read what a save wrote (its
manifest, as any JSON reader sees it), damage stored bytes, free ports."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import blake3

__all__ = [
    "MANIFEST_NAME",
    "data_dir",
    "flip_byte",
    "read",
    "sharded_digest",
]

#: The manifest's name in a sharded checkpoint directory (part of the format).
MANIFEST_NAME = "treeguard.sharded.json"


def read(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of ``directory`` as plain JSON (``data``, ``metadata``, ...)."""
    doc = json.loads((Path(directory) / MANIFEST_NAME).read_bytes())
    assert isinstance(doc, dict) and doc["format"] == "treeguard.sharded/1", doc.get("format")
    return doc


def sharded_digest(directory: str | os.PathLike[str]) -> str:
    """The digest of the manifest's bytes, by its own algorithm, computed here
    with the reference implementations (the store's and the CLI's digest)."""
    raw = (Path(directory) / MANIFEST_NAME).read_bytes()
    if json.loads(raw)["hash"] == "blake3":
        return str(blake3.blake3(raw).hexdigest())
    return hashlib.sha256(raw).hexdigest()


def data_dir(directory: str | os.PathLike[str]) -> Path:
    """The data directory the manifest of ``directory`` names."""
    return Path(directory) / read(directory)["data"]


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
