"""Forging a checkpoint's header as an attacker could: edit it, then write a
digest that matches the edit, so that only treeguard's own checks stand in
the way."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The writer's own header encoder and digest, on purpose: a forger who edits a
# header recomputes its digest, and a digest treeguard would refuse tests nothing.
from treeguard._src.checkpoint import encode_header, header_digest

#: Edits the header in place: ``(metadata, tensor table)``.
Mutate = Callable[[dict[str, str], dict[str, Any]], None]


def forge(path: Path, mutate: Mutate, data: bytes | None = None) -> None:
    """Rewrites the checkpoint at ``path`` with ``mutate`` applied to its
    header and a digest that matches; ``data`` replaces the tensor bytes."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    doc = json.loads(raw[8 : 8 + n])
    meta = doc.pop("__metadata__")
    mutate(meta, doc)
    meta["treeguard.digest"] = header_digest(meta, doc)
    header = encode_header(meta, doc)
    body = raw[8 + n :] if data is None else data
    path.write_bytes(len(header).to_bytes(8, "little") + header + body)
