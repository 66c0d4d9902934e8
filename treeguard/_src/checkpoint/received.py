"""Gates on a checkpoint directory received from elsewhere, run before any
library reads it (an orbax directory to import, a sharded checkpoint to
load or verify):

- it holds only directories and regular files: tensorstore follows symbolic
  links and blocks forever opening a FIFO;
- its arrays claim no more bytes than its files can hold: tensorstore fills
  missing chunks, so a few bytes of JSON can ask for terabytes, and a failed
  allocation aborts the process;
- each stored array's metadata (``zarr.json``, or zarr 2's ``.zarray``)
  declares chunks within its array (tensorstore decodes, or fills, a whole
  chunk to read any part of it) and, where the writer stores arrays
  uncompressed (treeguard's sharded checkpoints), no compressing codec: a
  compressed chunk decodes to its claimed size whatever its stored size.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

from ..atomic import file_kind
from ..dirtree import plain_bytes
from ..errors import FormatError
from ..leaf import dtype_of
from ..strictjson import loads

#: Deflate cannot expand data by more than about this factor.
DEFLATE_MAX_RATIO = 1032
#: Arrays may claim this many bytes however few the files hold.
CLAIM_FLOOR = 1 << 30
#: The most files and directories a received checkpoint directory may hold.
MAX_ENTRIES = 100_000
#: The codecs of the arrays treeguard writes (sharded, through orbax): none compresses.
PLAIN_CODECS = frozenset(("bytes", "sharding_indexed", "crc32c"))
#: The largest array metadata (``zarr.json``) read; orbax writes a few hundred bytes.
MAX_ARRAY_METADATA = 64 * 1024
_METADATA_NAMES = ("zarr.json", ".zarray")


def plain_tree(name: str, *, hint: str) -> int:
    """The bytes the regular files under ``name`` hold.

    Args:
      name: the directory.
      hint: the fix for a directory that holds something else.

    Raises:
      FormatError: naming the first entry that is not a directory or a
        regular file (a link, a FIFO, a device, a socket), for more than
        ``MAX_ENTRIES`` entries, or for directories nested deeper than
        ``dirtree.MAX_DEPTH``.

    Example:
      >>> import os, tempfile
      >>> d = tempfile.mkdtemp()
      >>> os.mkfifo(os.path.join(d, "pipe"))
      >>> plain_tree(d, hint="copy it again")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ...: 'pipe' is not a regular file but a FIFO; treeguard reads none...
    """

    def refuse(path: str, mode: int) -> FormatError:
        return FormatError(
            f"{path[:200]!r} is not a regular file but {file_kind(mode)}; "
            "treeguard reads none of those",
            context=name,
            hint=hint,
        )

    def too_big(what: str) -> FormatError:
        return FormatError(f"holds {what}", context=name, hint=hint)

    return plain_bytes(name, max_entries=MAX_ENTRIES, refuse=refuse, too_big=too_big)


def refuse_forged_claim(claimed: int, on_disk: int, name: str, *, compressed: bool = True) -> None:
    """Refuses arrays that claim more bytes than their files can hold.

    Args:
      claimed: the bytes the arrays' shapes and dtypes claim.
      on_disk: the bytes the directory's regular files hold.
      name: the directory, for the message.
      compressed: whether the files may hold compressed arrays (an orbax
        checkpoint from elsewhere): then a claim up to ``DEFLATE_MAX_RATIO``
        times the files (or ``CLAIM_FLOOR``) is taken. With False (a
        treeguard sharded checkpoint, written uncompressed, so every array
        byte is a stored byte) a claim beyond the files' bytes is refused
        outright: a few KiB of compressed zeros cannot pass for a GiB array.

    Raises:
      FormatError: naming both numbers.

    Example:
      >>> refuse_forged_claim(16 << 30, 796, "ck")
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ck: its arrays claim 17,179,869,184 bytes, its files hold 796; ...
      >>> refuse_forged_claim(1 << 20, 4096, "ck", compressed=False)
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ck: its arrays claim 1,048,576 bytes, its files hold 4,096; ...
    """
    if not compressed:
        if claimed > on_disk:
            raise FormatError(
                f"its arrays claim {claimed:,} bytes, its files hold {on_disk:,}; the data "
                "is truncated or the shapes are forged (treeguard writes sharded arrays "
                "uncompressed: every array byte is a stored byte)",
                context=name,
                hint="get a fresh copy of the checkpoint",
            )
        return
    limit = max(CLAIM_FLOOR, on_disk * DEFLATE_MAX_RATIO)
    if claimed > limit:
        raise FormatError(
            f"its arrays claim {claimed:,} bytes, its files hold {on_disk:,}; "
            f"more than {DEFLATE_MAX_RATIO}x is a forged shape, not compression",
            context=name,
            hint="get a fresh copy of the checkpoint",
        )


def array_metadata(directory: str) -> list[tuple[str, bytes]]:
    """The stored metadata of every array of the orbax checkpoint in
    ``directory``: ``(array name, the bytes of its zarr.json or .zarray)``,
    from its OCDBT key-value store (read by tensorstore, opening no array)
    or, without one, from its files. Nothing is decoded or allocated beyond
    these few bytes each.

    Raises:
      ValueError: for a metadata value over ``MAX_ARRAY_METADATA`` bytes.
    """
    out = []
    if os.path.exists(os.path.join(directory, "manifest.ocdbt")):
        import tensorstore as ts  # lazy: tensorstore comes with orbax, an optional extra

        spec = {"driver": "ocdbt", "base": f"file://{os.path.abspath(directory)}/"}
        kv = ts.KvStore.open(spec).result()
        keys = [k for k in kv.list().result() if _is_metadata(k)]
        reads = [kv.read(k) for k in keys]  # issued together, then awaited in order
        for key, read in zip(keys, reads):
            value = read.result().value
            head = key.rpartition(b"/")[0].decode("utf-8", "replace")
            out.append((head, _bounded(key, len(value), value)))
        return out
    for root, _, files in os.walk(directory):  # plain_tree refused links first
        for leaf in files:
            if leaf in _METADATA_NAMES:
                path = os.path.join(root, leaf)
                size = os.path.getsize(path)
                _bounded(path.encode(), size, b"")
                with open(path, "rb") as f:
                    out.append((os.path.relpath(root, directory), f.read(MAX_ARRAY_METADATA)))
    return out


def _is_metadata(key: bytes) -> bool:
    return key.rpartition(b"/")[2].decode("utf-8", "replace") in _METADATA_NAMES


def _bounded(key: bytes, size: int, value: bytes) -> bytes:
    if size > MAX_ARRAY_METADATA:
        raise ValueError(f"{key[:200]!r}: {size:,} bytes of array metadata")
    return bytes(value)


def stored_array_bytes(directory: str, name: str, *, compressed: bool) -> int:
    """The bytes the stored arrays of an orbax checkpoint claim, once each
    one's codecs and chunks are checked (see the module docstring).

    Args:
      directory: the orbax checkpoint (a sharded checkpoint's data directory).
      name: the checkpoint, for messages.
      compressed: whether compressing codecs may be used (False for
        treeguard's sharded checkpoints, written uncompressed).

    Raises:
      FormatError: naming the array and what it claims.
    """
    hint = "get a fresh copy of the checkpoint"
    try:
        stored = array_metadata(directory)
    except ValueError as e:
        raise FormatError(str(e), context=name, hint=hint) from None
    except Exception as e:  # noqa: BLE001 - tensorstore raises its own kinds on bad bytes
        raise FormatError(
            f"its array index cannot be read ({type(e).__name__})", context=name, hint=hint
        ) from None
    total = 0
    for array, raw in stored:
        at = f"array {array[:200]!r}"

        def bad(message: str, at: str = at) -> FormatError:
            return FormatError(f"{at}: {message}", context=name, hint=hint)

        meta = loads(raw, f"{at} metadata", context=name, hint=hint)
        if not isinstance(meta, dict):
            raise bad("its metadata is not a JSON object")
        total += _array_bytes(meta, bad, compressed=compressed)
    return total


def _array_bytes(
    meta: dict[str, object], bad: Callable[[str], FormatError], *, compressed: bool
) -> int:
    shape = _dims(meta.get("shape"), "shape", bad)
    if meta.get("zarr_format") == 2:  # a .zarray
        dtype, chunks = meta.get("dtype"), [_dims(meta.get("chunks"), "chunks", bad)]
        codecs = [] if meta.get("compressor") is None else [meta.get("compressor")]
        codecs += list(meta.get("filters") or [])  # type: ignore[call-overload]
        if codecs and not compressed:
            raise bad(_codec_refusal(codecs[0]))
    else:
        dtype = meta.get("data_type")
        grid = meta.get("chunk_grid")
        config = grid.get("configuration") if isinstance(grid, dict) else None
        chunk = config.get("chunk_shape") if isinstance(config, dict) else None
        chunks = [_dims(chunk, "chunk", bad)]
        chunks += _codec_chunks(meta.get("codecs"), bad, compressed=compressed)
    try:
        itemsize = dtype_of(dtype).itemsize
    except (FormatError, TypeError):
        raise bad(f"data type {str(dtype)[:40]!r} is no array dtype") from None
    for c in chunks:
        if len(c) != len(shape) or any(a > max(b, 1) for a, b in zip(c, shape)):
            raise bad(
                f"a chunk of shape {list(c)} in an array of shape {list(shape)}: a chunk "
                "is decoded whole, so it may not reach beyond its array"
            )
    return math.prod(shape) * itemsize


def _dims(value: object, what: str, bad: Callable[[str], FormatError]) -> tuple[int, ...]:
    if (
        not isinstance(value, list)
        or len(value) > 64
        or not all(type(d) is int and 0 <= d < 2**62 for d in value)
    ):
        raise bad(f"its {what} is not a list of sizes")
    return tuple(value)


def _codec_refusal(codec: object) -> str:
    named = codec.get("name", codec.get("id")) if isinstance(codec, dict) else codec
    return (
        f"codec {str(named)[:40]!r}: treeguard writes sharded arrays uncompressed, with "
        f"{', '.join(sorted(PLAIN_CODECS))} only; a compressed chunk decodes to its claimed "
        "size whatever its stored size"
    )


def _codec_chunks(
    codecs: object, bad: Callable[[str], FormatError], *, compressed: bool, depth: int = 0
) -> list[tuple[int, ...]]:
    """The chunk shapes the codecs declare (``sharding_indexed``'s inner
    chunks); without ``compressed``, any codec but ``PLAIN_CODECS`` is refused."""
    if not isinstance(codecs, list) or depth > 4:
        raise bad("its codecs are not a list")
    out = []
    for codec in codecs:
        name = codec.get("name") if isinstance(codec, dict) else None
        if not isinstance(name, str) or (not compressed and name not in PLAIN_CODECS):
            raise bad(_codec_refusal(codec))
        if name == "sharding_indexed":
            config = codec.get("configuration")
            if not isinstance(config, dict):
                raise bad("sharding_indexed has no configuration")
            out.append(_dims(config.get("chunk_shape"), "inner chunk", bad))
            for key in ("codecs", "index_codecs"):
                out += _codec_chunks(config.get(key), bad, compressed=compressed, depth=depth + 1)
    return out
