"""The manifest of a sharded checkpoint: ``treeguard.sharded.json``.

A sharded checkpoint is a directory::

    DIR/treeguard.sharded.json   the manifest, written last, atomically, by process 0
    DIR/data-<16 hex>/           the arrays, an orbax checkpoint on tensorstore

The manifest is the authority. It names the data directory, so a save that
dies before its manifest is renamed into place leaves the previous manifest,
and the previous data it names, untouched. It holds:

* ``format``: ``"treeguard.sharded/1"``;
* ``data``: the name of the data directory;
* ``spec``: the ``TreeSpec`` of the saved tree, shardings included;
* ``process_count``: how many processes wrote it;
* ``env``: the environment fingerprint of process 0;
* ``metadata``: the caller's metadata;
* ``hash``: the digest algorithm, ``"blake3"`` (or ``"sha256"`` in
  manifests written before BLAKE3, or with ``digest="sha256"``);
* ``arrays``: for each leaf in flatten order, its path, shape, dtype,
  sharding and every stored shard: its index (``[start, stop]`` per axis),
  the process that wrote it and the digest of its bytes in C order, under
  the algorithm's name (``"blake3": "..."``).

The manifest's own digest (``sharded_digest``, what a store's verdict
records) is taken by the same algorithm.

Parsing is strict: duplicate keys, NaN, unknown fields, wrong types, a shard
outside its array or shards that do not tile it exactly are a ``FormatError``
that says where.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import secrets
import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import strictjson
from ..atomic import atomic_write, read_regular
from ..checkpoint import user_metadata_json
from ..errors import FormatError, IntegrityError, InvalidTreeError
from ..hashing import ALGORITHMS, DEFAULT, HEX_RE, Algorithm, digest
from ..leaf import dtype_of
from ..paths import keystr
from ..spec import TreeSpec

FORMAT = "treeguard.sharded/1"
FORMAT_VERSION = 1
MANIFEST_NAME = "treeguard.sharded.json"
#: The largest manifest read: it grows with the number of shards, not with data.
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
_FORMAT_RE = re.compile(r"^treeguard\.sharded/(\d+)$")
_DATA_RE = re.compile(r"^data-[0-9a-f]{16}$")
_HEX_RE = HEX_RE
_MAX_INT = 2**62
_MAX_NDIM = 64
_TOP_KEYS = frozenset(
    ("format", "data", "spec", "process_count", "env", "metadata", "hash", "arrays")
)
_ARRAY_KEYS = frozenset(("path", "shape", "dtype", "sharding", "shards"))
_SHARD_KEYS = {a: frozenset(("index", "process", a)) for a in ALGORITHMS}


@dataclasses.dataclass(frozen=True)
class Shard:
    """One stored shard of an array.

    Attributes:
      index: ``(start, stop)`` per axis, in the global array.
      process: the index of the process that wrote it.
      digest: the hex digest of its bytes in C order (by the manifest's
        algorithm).
    """

    index: tuple[tuple[int, int], ...]
    process: int
    digest: str

    @property
    def size(self) -> int:
        """The number of elements."""
        return math.prod(b - a for a, b in self.index)

    @property
    def slices(self) -> tuple[slice, ...]:
        """The index as slices of the global array."""
        return tuple(slice(a, b) for a, b in self.index)


@dataclasses.dataclass(frozen=True)
class ArrayRecord:
    """One saved array: its path, shape, dtype, saved sharding and shards."""

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    sharding: str | None
    shards: tuple[Shard, ...]

    @property
    def nbytes(self) -> int:
        """The bytes of the whole array."""
        return math.prod(self.shape) * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A parsed manifest (see the module docstring for the fields)."""

    data: str
    spec: TreeSpec
    process_count: int
    env: dict[str, Any]
    metadata: dict[str, Any]
    arrays: tuple[ArrayRecord, ...]
    hash: Algorithm = DEFAULT

    def tree_of(self, leaves: list[Any], where: str, *, hint: str) -> Any:
        """The saved tree's structure holding ``leaves`` (in flatten order).

        Raises:
          FormatError: for a tree of custom nodes, which only a ``like``
            tree can rebuild (``hint`` says what to do instead).
        """
        import jax  # lazy: reading a manifest never imports jax

        try:
            return jax.tree.unflatten(self.spec.treedef, leaves)
        except InvalidTreeError as e:
            raise FormatError(
                "the saved tree holds custom nodes, which only a `like` tree can rebuild",
                context=where,
                hint=hint,
            ) from e

    def to_json(self) -> str:
        """The manifest as canonical JSON text."""
        doc = {
            "format": FORMAT,
            "data": self.data,
            "hash": self.hash,
            "process_count": self.process_count,
            "spec": self.spec.to_dict(),
            "env": self.env,
            "metadata": self.metadata,
            "arrays": [
                {
                    "path": a.path,
                    "shape": list(a.shape),
                    "dtype": a.dtype.name,
                    "sharding": a.sharding,
                    "shards": [
                        {
                            "index": [list(p) for p in s.index],
                            "process": s.process,
                            self.hash: s.digest,
                        }
                        for s in a.shards
                    ],
                }
                for a in self.arrays
            ],
        }
        return json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def new_data_name() -> str:
    """A fresh data directory name, ``data-`` and 16 hex digits."""
    return f"data-{secrets.token_hex(8)}"


def is_data_name(name: str) -> bool:
    """Whether ``name`` has the form of a data directory name."""
    return _DATA_RE.match(name) is not None


# -- parsing ------------------------------------------------------------------


def _fields(value: Any, allowed: frozenset[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FormatError(f"{where}: expected an object, got {_kind(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise FormatError(f"{where}: unknown field {unknown[0]!r}")
    missing = sorted(allowed - set(value))
    if missing:
        raise FormatError(f"{where}: missing field {missing[0]!r}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a bool"}.get(
        type(value), type(value).__name__
    )


def _int(value: Any, where: str, *, low: int = 0) -> int:
    if type(value) is not int:
        raise FormatError(f"{where}: expected an integer, got {_kind(value)}")
    if not low <= value < _MAX_INT:
        raise FormatError(f"{where}: {value} is out of range")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where}: expected a string, got {_kind(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise FormatError(f"{where}: expected a list, got {_kind(value)}")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    dims = _list(value, where)
    if len(dims) > _MAX_NDIM:
        raise FormatError(f"{where}: {len(dims)} axes, more than {_MAX_NDIM}")
    return tuple(_int(d, f"{where}[{i}]") for i, d in enumerate(dims))


def _shard(
    value: Any, shape: tuple[int, ...], nproc: int, algorithm: Algorithm, where: str
) -> Shard:
    d = _fields(value, _SHARD_KEYS[algorithm], where)
    index_list = _list(d["index"], f"{where}.index")
    if len(index_list) != len(shape):
        raise FormatError(f"{where}.index: {len(index_list)} axes for an array of {len(shape)}")
    index = []
    for i, (pair, size) in enumerate(zip(index_list, shape)):
        w = f"{where}.index[{i}]"
        bounds = _list(pair, w)
        if len(bounds) != 2:
            raise FormatError(f"{w}: expected [start, stop]")
        a, b = _int(bounds[0], w), _int(bounds[1], w)
        if not a <= b <= size:
            raise FormatError(f"{w}: [{a}, {b}] is not within an axis of size {size}")
        index.append((a, b))
    process = _int(d["process"], f"{where}.process")
    if process >= nproc:
        raise FormatError(f"{where}.process: {process} but only {nproc} processes wrote it")
    found = _str(d[algorithm], f"{where}.{algorithm}")
    if not _HEX_RE.match(found):
        raise FormatError(f"{where}.{algorithm}: not a lowercase hex {algorithm} digest")
    return Shard(tuple(index), process, found)


def _overlap(a: Shard, b: Shard) -> bool:
    return all(max(x0, y0) < min(x1, y1) for (x0, x1), (y0, y1) in zip(a.index, b.index))


#: Shards that do not lie on one grid are compared pair by pair, so only this many.
_MAX_OFF_GRID = 512


def _tiles(shards: tuple[Shard, ...], shape: tuple[int, ...], where: str) -> None:
    """Refuses shards that do not cover the array exactly once.

    The shards' bounds cut each axis into segments, the array into a grid of
    cells; shards of any JAX sharding are unions of whole cells and hold as
    many cells as shards. Each cell must be covered once: the work is the
    number of cells, never more, whatever the manifest claims.
    """
    total = sum(s.size for s in shards)
    if total != math.prod(shape):
        raise FormatError(
            f"{where}: the shards hold {total} elements, the array {math.prod(shape)}"
        )
    nonempty = [s for s in shards if s.size]
    if len(nonempty) < 2:
        return
    cuts = [sorted({x for s in nonempty for x in s.index[d]}) for d in range(len(shape))]
    cells = math.prod(len(c) - 1 for c in cuts)
    if cells > 4 * len(nonempty) + 64:
        _tiles_pairwise(nonempty, where)
        return
    at = [{x: i for i, x in enumerate(c)} for c in cuts]
    seen = np.zeros([len(c) - 1 for c in cuts], dtype=np.uint8)
    touched = 0
    for s in nonempty:
        box = tuple(slice(at[d][a], at[d][b]) for d, (a, b) in enumerate(s.index))
        touched += math.prod(b.stop - b.start for b in box)
        if touched > cells:  # some cell is covered twice
            break
        seen[box] += 1
    if touched > cells or int(seen.max()) > 1:
        raise FormatError(f"{where}: two shards overlap")


def _tiles_pairwise(nonempty: list[Shard], where: str) -> None:
    if len(nonempty) > _MAX_OFF_GRID:
        raise FormatError(
            f"{where}: {len(nonempty)} shards that do not lie on one grid; at most "
            f"{_MAX_OFF_GRID} such shards are read"
        )
    for i, a in enumerate(nonempty):
        for b in nonempty[i + 1 :]:
            if _overlap(a, b):
                raise FormatError(f"{where}: two shards overlap at {list(a.index)}")


def _array(value: Any, nproc: int, algorithm: Algorithm, where: str) -> ArrayRecord:
    d = _fields(value, _ARRAY_KEYS, where)
    path = _str(d["path"], f"{where}.path")
    shape = _shape(d["shape"], f"{where}.shape")
    try:
        dtype = dtype_of(_str(d["dtype"], f"{where}.dtype"))
    except FormatError as e:
        raise FormatError(f"{where}.dtype: {e}") from None
    sharding = d["sharding"]
    if sharding is not None:
        sharding = _str(sharding, f"{where}.sharding")
    raw = _list(d["shards"], f"{where}.shards")
    shards = tuple(
        _shard(s, shape, nproc, algorithm, f"{where}.shards[{i}]") for i, s in enumerate(raw)
    )
    _tiles(shards, shape, f"{where}.shards")
    return ArrayRecord(path, shape, dtype, sharding, shards)


def parse(text: str | bytes, *, where: str = MANIFEST_NAME) -> Manifest:
    """Reads a manifest from its JSON text, strictly.

    Args:
      text: the manifest's text.
      where: the name used in error messages.

    Returns:
      The ``Manifest``.

    Raises:
      FormatError: naming the field that is wrong, for anything that is not a
        manifest of a known version.

    Example:
      >>> parse('{"format": "treeguard.sharded/9"}')
      Traceback (most recent call last):
      ...
      treeguard.FormatError: ...: format 'treeguard.sharded/9' is newer ...
      hint: upgrade treeguard
    """
    doc = strictjson.loads(text, "the manifest", context=where)
    if not isinstance(doc, dict):
        raise FormatError(f"{where}: expected a JSON object, got {_kind(doc)}")
    fmt = doc.get("format")
    m = _FORMAT_RE.match(fmt) if isinstance(fmt, str) else None
    if m is None:
        raise FormatError(
            f"{where}: not a treeguard sharded manifest: format is {fmt!r}, expected {FORMAT!r}"
        )
    if int(m.group(1)) > FORMAT_VERSION:
        raise FormatError(
            f"{where}: format {fmt!r} is newer than this treeguard reads ({FORMAT!r})\n"
            "hint: upgrade treeguard"
        )
    d = _fields(doc, _TOP_KEYS, where)
    data = _str(d["data"], f"{where}: data")
    if not is_data_name(data):
        raise FormatError(f"{where}: data: {data!r} is not a data directory name")
    algorithm = d["hash"]
    if algorithm not in ALGORITHMS:
        shown = repr(algorithm[:40]) if isinstance(algorithm, str) else _kind(algorithm)
        raise FormatError(
            f"{where}: hash: {shown}, expected one of " + ", ".join(map(repr, ALGORITHMS))
        )
    nproc = _int(d["process_count"], f"{where}: process_count", low=1)
    for key in ("env", "metadata"):
        if not isinstance(d[key], dict):
            raise FormatError(f"{where}: {key}: expected an object, got {_kind(d[key])}")
    try:
        spec = TreeSpec.from_dict(d["spec"])
    except FormatError as e:
        raise FormatError(f"{where}: spec: {e}") from None
    raw = _list(d["arrays"], f"{where}: arrays")
    arrays = tuple(_array(a, nproc, algorithm, f"{where}: arrays[{i}]") for i, a in enumerate(raw))
    _agree(spec, arrays, where)
    return Manifest(data, spec, nproc, d["env"], d["metadata"], arrays, algorithm)


def _agree(spec: TreeSpec, arrays: tuple[ArrayRecord, ...], where: str) -> None:
    """The array list must be the spec's leaves, in order, with their shapes and dtypes."""
    if len(arrays) != spec.num_leaves:
        raise FormatError(
            f"{where}: arrays: {len(arrays)} arrays for a spec of {spec.num_leaves} leaves"
        )
    for i, (a, p, leaf) in enumerate(zip(arrays, spec.paths, spec.leaves)):
        if a.path != keystr(p):
            raise FormatError(f"{where}: arrays[{i}].path: {a.path!r}, the spec says {keystr(p)!r}")
        if a.shape != leaf.shape or a.dtype != leaf.dtype:
            raise FormatError(
                f"{where}: arrays[{i}]: {a.path} is {a.dtype.name}{list(a.shape)}, the spec "
                f"says {leaf.dtype.name}{list(leaf.shape)}"
            )


# -- the file -------------------------------------------------------------------


def manifest_path(directory: str | os.PathLike[str]) -> str:
    """The manifest's path in ``directory``."""
    return os.path.join(os.fspath(directory), MANIFEST_NAME)


def _read_bytes(directory: str | os.PathLike[str]) -> tuple[bytes, str]:
    path = manifest_path(directory)
    try:
        return read_regular(path, limit=MAX_MANIFEST_BYTES, what="manifest"), path
    except FileNotFoundError:
        raise FormatError(
            f"no {MANIFEST_NAME}: not a sharded checkpoint, or its first save did not finish",
            context=os.fspath(directory),
            hint="pass a directory written by save_sharded",
        ) from None


def read(directory: str | os.PathLike[str], /) -> Manifest:
    """Reads and parses ``directory``'s manifest.

    Raises:
      FormatError: if there is none, it is not a regular file, or it is malformed.
    """
    raw, path = _read_bytes(directory)
    return parse(raw, where=path)


def write(directory: str | os.PathLike[str], manifest: Manifest, /) -> None:
    """Writes the manifest atomically (``atomic.atomic_write``)."""
    atomic_write(manifest_path(directory), manifest.to_json().encode("utf-8"))


def is_sharded(directory: str | os.PathLike[str], /) -> bool:
    """Whether ``directory`` holds a sharded checkpoint's manifest (not parsed).

    Example:
      >>> import tempfile
      >>> is_sharded(tempfile.mkdtemp())
      False
    """
    try:
        return stat.S_ISREG(os.lstat(manifest_path(directory)).st_mode)
    except OSError:
        return False


def read_with_digest(
    directory: str | os.PathLike[str], /, *, expect: str | None = None
) -> tuple[Manifest, str]:
    """Reads and parses ``directory``'s manifest, with the digest of the very
    bytes parsed (``sharded_digest``: by the manifest's own algorithm).

    Args:
      directory: a directory written by ``save_sharded``.
      expect: the digest the manifest must have; bytes with another one are
        refused before they are parsed, so a replaced manifest costs no
        parse. It is compared as a BLAKE3 and as a sha256 digest (the
        algorithm is known only after parsing; both are 64 hex digits).

    Raises:
      FormatError: if there is none, it is not a regular file, or it is malformed.
      IntegrityError: if its digest is not ``expect``.
    """
    raw, path = _read_bytes(directory)
    return parse_with_digest(raw, path, os.path.abspath(os.fspath(directory)), expect)


def parse_with_digest(
    raw: bytes, where: str, checkpoint: str, expect: str | None = None
) -> tuple[Manifest, str]:
    """Parses a manifest's bytes (``where``: the manifest, for messages)
    after comparing their digest with ``expect`` when given (see
    ``read_with_digest``; ``checkpoint`` names what was replaced); the
    manifest and the digest of those very bytes.

    Raises:
      FormatError: for a malformed manifest.
      IntegrityError: if its digest is not ``expect``.
    """
    if expect is not None:
        found = {a: digest(raw, a) for a in ALGORITHMS}
        if expect not in found.values():
            raise IntegrityError(
                f"the manifest's digest is {found[DEFAULT][:16]}... ({DEFAULT}; "
                f"{found['sha256'][:16]}... as sha256), the verdict's {expect[:16]}...: "
                "the checkpoint was replaced or edited",
                context=checkpoint,
                hint="do not use it; restore it from a backup or verify it again",
            )
        manifest = parse(raw, where=where)
        return manifest, found[manifest.hash]
    manifest = parse(raw, where=where)
    return manifest, digest(raw, manifest.hash)


def sharded_digest(directory: str | os.PathLike[str], /) -> str:
    """One digest over the manifest, which holds every shard's digest; by
    the manifest's own algorithm.

    The manifest is parsed first, so a digest is only given for a well-formed
    checkpoint. Equal digests mean equal manifests, hence equal recorded data.

    Raises:
      FormatError: for a directory that is not a sharded checkpoint.
    """
    return read_with_digest(directory)[1]


def metadata_json(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The caller's metadata as a JSON-ready dict, checked as ``save`` checks it.

    Raises:
      TypeError: for metadata that JSON cannot hold exactly, naming the key.
    """
    return dict(json.loads(user_metadata_json(metadata)))
