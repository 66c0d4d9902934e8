"""What a sharded checkpoint's files claim, checked against the bytes they
hold before tensorstore opens an array, so a hostile checkpoint costs the
memory of its own bytes, never that of what it claims.

treeguard writes sharded arrays uncompressed (``orbax_io``): every array
byte is a stored byte. So:

- the manifest's arrays claim no more bytes than the directory's regular
  files hold (no link or FIFO among them);
- each stored array's metadata (its ``zarr.json``) names no codec but the
  ones treeguard writes (``bytes``, ``sharding_indexed``, ``crc32c``): a
  compressed chunk decodes to its claimed size whatever its stored size;
- each chunk lies within its array, and the stored arrays together claim no
  more bytes than the files hold: tensorstore decodes, or fills, a whole
  chunk to read any part of it.
"""

from __future__ import annotations

import math
import os
from typing import Any

from ..checkpoint.received import plain_tree, refuse_forged_claim
from ..errors import FormatError
from ..leaf import dtype_of
from ..strictjson import loads
from .manifest import Manifest
from .orbax_io import array_metadata

#: The codecs of the arrays treeguard writes: none of them compresses.
CODECS = frozenset(("bytes", "sharding_indexed", "crc32c"))
_HINT = "get a fresh copy of the checkpoint"


def check_received(where: str, manifest: Manifest) -> None:
    """The gates on a checkpoint directory, run before tensorstore opens it.

    Args:
      where: the checkpoint directory.
      manifest: its parsed manifest.

    Raises:
      FormatError: naming a link or special file, the array metadata that
        claims a codec, chunk or size the files cannot hold, or both byte
        counts.
    """
    on_disk = plain_tree(where, hint="copy the checkpoint again, without links or special files")
    refuse_forged_claim(sum(a.nbytes for a in manifest.arrays), on_disk, where, compressed=False)
    data = os.path.join(where, manifest.data)
    try:
        stored = array_metadata(data)
    except ValueError as e:
        raise FormatError(f"{manifest.data}: {e}", context=where, hint=_HINT) from None
    except Exception as e:  # noqa: BLE001 - tensorstore raises its own kinds on bad bytes
        raise FormatError(
            f"{manifest.data}: its array index cannot be read ({type(e).__name__})",
            context=where,
            hint=_HINT,
        ) from None
    claimed = sum(_stored_bytes(name, raw, where) for name, raw in stored)
    if claimed > on_disk:
        raise FormatError(
            f"its stored arrays claim {claimed:,} bytes, its files hold {on_disk:,}; "
            "treeguard writes sharded arrays uncompressed, so that is forged",
            context=where,
            hint=_HINT,
        )


def _stored_bytes(name: str, raw: bytes, where: str) -> int:
    """The bytes one stored array claims, once its codecs and chunks are checked."""
    at = f"array {name[:200]!r}"

    def bad(message: str) -> FormatError:
        return FormatError(f"{at}: {message}", context=where, hint=_HINT)

    meta = loads(raw, f"{at} metadata", context=where, hint=_HINT)
    if not isinstance(meta, dict):
        raise bad("its metadata is not a JSON object")
    shape = _dims(meta.get("shape"), "shape", bad)
    try:
        itemsize = dtype_of(meta.get("data_type")).itemsize
    except (FormatError, TypeError):
        raise bad(
            f"data_type {str(meta.get('data_type'))[:40]!r} is no dtype treeguard writes"
        ) from None
    grid = meta.get("chunk_grid")
    config = grid.get("configuration") if isinstance(grid, dict) else None
    chunks = [_dims(config.get("chunk_shape") if isinstance(config, dict) else None, "chunk", bad)]
    chunks += _codec_chunks(meta.get("codecs"), bad)
    for chunk in chunks:
        if len(chunk) != len(shape) or any(c > max(s, 1) for c, s in zip(chunk, shape)):
            raise bad(
                f"a chunk of shape {list(chunk)} in an array of shape {list(shape)}: a chunk "
                "is decoded whole, so it may not reach beyond its array"
            )
    return math.prod(shape) * itemsize


def _dims(value: Any, what: str, bad: Any) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) > 64
        or not all(type(d) is int and 0 <= d < 2**62 for d in value)
    ):
        raise bad(f"its {what} is not a list of sizes")
    return tuple(value)


def _codec_chunks(codecs: Any, bad: Any, depth: int = 0) -> list[tuple[int, ...]]:
    """The chunk shapes the codecs declare (``sharding_indexed``'s inner
    chunks), refusing any codec treeguard does not write."""
    if not isinstance(codecs, list) or depth > 4:
        raise bad("its codecs are not a list")
    out = []
    for codec in codecs:
        name = codec.get("name") if isinstance(codec, dict) else None
        if name not in CODECS:
            shown = str(name)[:40]
            raise bad(
                f"codec {shown!r}: treeguard writes sharded arrays uncompressed, with "
                f"{', '.join(sorted(CODECS))} only; a compressed chunk decodes to its claimed "
                "size whatever its stored size"
            )
        if name == "sharding_indexed":
            config = codec.get("configuration")
            if not isinstance(config, dict):
                raise bad("sharding_indexed has no configuration")
            out.append(_dims(config.get("chunk_shape"), "inner chunk", bad))
            out += _codec_chunks(config.get("codecs"), bad, depth + 1)
            out += _codec_chunks(config.get("index_codecs"), bad, depth + 1)
    return out
