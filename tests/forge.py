"""Forging a checkpoint's header as an attacker could: edit it, then write a
digest that matches the edit, so that only treeguard's own checks stand in
the way."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3

#: Edits the header in place: ``(metadata, tensor table)``.
Mutate = Callable[[dict[str, str], dict[str, Any]], None]


def header_digest(meta: dict[str, str], table: dict[str, Any]) -> str:
    """The header's digest as the format defines it (docs/reference/formats.md),
    computed here with the reference hashers: a forger needs no treeguard code,
    and a digest treeguard would refuse tests nothing."""
    body = {k: v for k, v in meta.items() if k != "treeguard.digest"}
    canonical = json.dumps(
        {"metadata": body, "tensors": table}, sort_keys=True, separators=(",", ":")
    ).encode("utf-8")
    algorithm = meta["treeguard.hash"]
    if algorithm == "blake3":
        return str(blake3.blake3(canonical).hexdigest())
    assert algorithm == "sha256", algorithm
    return hashlib.sha256(canonical).hexdigest()


def forge(path: Path, mutate: Mutate, data: bytes | None = None) -> None:
    """Rewrites the checkpoint at ``path`` with ``mutate`` applied to its
    header and a digest that matches; ``data`` replaces the tensor bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + n])
    meta = doc.pop("__metadata__")
    mutate(meta, doc)
    meta["treeguard.digest"] = header_digest(meta, doc)
    header = json.dumps({"__metadata__": meta, **doc}, separators=(",", ":"), ensure_ascii=False)
    padded = header.encode("utf-8")
    padded += b" " * (-len(padded) % 8)  # safetensors pads its header to 8 bytes
    body = raw[8 + n :] if data is None else data
    path.write_bytes(len(padded).to_bytes(8, "little") + padded + body)
