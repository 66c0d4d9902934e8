"""Importing foreign weights: ``read_foreign`` and ``import_weights``.

``read_foreign`` reads a file or directory another tool wrote into a tree of
numpy arrays (one reader per format, in ``formats.py``); ``import_weights``
writes that tree as a hashed treeguard checkpoint. The formats, told apart
here by their content, not their suffix:

* a safetensors file: the strict header reader of ``foreign.py``, then one
  bounded ``pread`` per tensor;
* an ``.npz`` archive: every member's ``.npy`` header is read with
  ``numpy.lib.format`` and its dtype and size checked against the archive
  *before* any array is allocated; object arrays are refused, so pickle is
  never reached;
* a flax msgpack file (``flax.serialization.msgpack_serialize``): restored
  with ``flax.serialization.msgpack_restore``, which builds only numpy
  arrays and plain values (flax is an optional extra);
* an orbax ``StandardCheckpointer`` or ``PyTreeCheckpointer`` directory:
  restored to numpy arrays without a target, from its own metadata (the
  ``treeguard[orbax]`` extra).

Nested sources (msgpack, orbax) are named by the same rule as flat ones
(``dotted``: ``encoder.layer.0.weight``), so one ``like`` matches any of them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..atomic import file_kind, open_regular
from ..errors import FormatError
from ..hashing import DEFAULT, Algorithm, ShortRead, check_algorithm, hash_file
from .foreign import build, match
from .foreignheader import ForeignHeader, ForeignTensor
from .format import MAX_HEADER_BYTES
from .formats import SourceKind, flat_names, read_values
from .names import NamingRule, namer, nest
from .read import read_header
from .write import save

_SHARDED_MANIFEST = "treeguard.sharded.json"


def source_kind(src: str | os.PathLike[str]) -> SourceKind:
    """Which format ``src`` holds, from its content (and, for msgpack, its name).

    Raises:
      FormatError: for a symbolic link, a FIFO or device, a pickle, or a
        file of no format treeguard imports.
    """
    kind, fd = _open_source(os.fspath(src))
    if fd is not None:
        os.close(fd)
    return kind


def _open_source(name: str) -> tuple[SourceKind, int | None]:
    """``src``'s format and, for a file, the one descriptor every later read uses,
    so the hash, the format and the tensors all come from the same file."""
    st = os.lstat(name)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(
            "is a symbolic link; treeguard never follows links",
            context=name,
            hint="pass the link's target path if you trust it",
        )
    if stat.S_ISDIR(st.st_mode):
        if os.path.exists(os.path.join(name, _SHARDED_MANIFEST)):
            raise FormatError(
                "a treeguard sharded checkpoint, not foreign weights",
                context=name,
                hint="load it with treeguard.load_sharded; it is verified already",
            )
        return "orbax", None
    fd = open_regular(name, what="weights file")
    try:
        return _kind_of(os.pread(fd, 16, 0), name), fd
    except BaseException:
        os.close(fd)
        raise


def _kind_of(head: bytes, name: str) -> SourceKind:
    if head[:2] == b"PK":
        return "npz"
    if len(head) >= 9 and head[8:9] == b"{":
        n = int.from_bytes(head[:8], "little")
        if n <= MAX_HEADER_BYTES:
            return "safetensors"
    if head[:1] == b"\x80":
        raise FormatError(
            "a pickle; treeguard never unpickles",
            context=name,
            hint="convert it with a trusted tool into safetensors or .npz",
        )
    if name.endswith(".msgpack") or (head and (head[0] in (0xDE, 0xDF) or 0x81 <= head[0] <= 0x8F)):
        return "msgpack"
    raise FormatError(
        "not a format treeguard imports",
        context=name,
        hint="import safetensors, .npz, flax msgpack files or orbax checkpoint directories",
    )


def _shaped(
    values: dict[str, np.ndarray[Any, Any]], like: Any, names: NamingRule, name: str
) -> Any:
    """The values matched by name into ``like``'s structure."""
    header = ForeignHeader(
        name,
        tuple(ForeignTensor(n, a.shape, a.dtype, "", 0, a.nbytes) for n, a in values.items()),
        {},
        0,
        0,
    )
    return build(match(header, like, names=names, rename={}, allow_missing=()), values)


def read_foreign(
    src: str | os.PathLike[str], /, *, names: NamingRule = "dotted", like: Any = None
) -> Any:
    """Reads weights another tool wrote into a tree of numpy arrays.

    Nothing in such a file is hash-verified (it holds no hashes): the reader
    checks only the structure (header bounds, offsets, sizes, dtypes). Turn
    the result into a verified checkpoint with ``import_weights``.

    Args:
      src: a safetensors file, an ``.npz`` archive, a flax msgpack file or
        an orbax checkpoint directory. A treeguard checkpoint is loaded
        verified, as ``load`` does.
      names: how tensor names map to key paths: ``"dotted"``
        (``encoder.layer.0.weight``, the default), ``"slashed"``,
        ``"keypath"`` (``['encoder']['layer'][0]['weight']``), ``"flat"`` (one
        dict keyed by name), or with ``like`` a function from a leaf's keys
        to its name.
      like: a tree or ``TreeSpec`` whose structure the result takes, each
        leaf matched by name; every missing or unexpected name and every
        shape or dtype difference is raised together. Without it, the tree
        is nested by the names, every component a string dict key
        (``{'encoder': {'layer': {'0': {...}}}}``): a name cannot tell a
        list from a dict.

    Returns:
      The tree.

    Raises:
      FormatError: for a file that is none of these formats, malformed,
        truncated, a pickle, holding object or non-numeric arrays, or whose
        names do not nest (a name that is both a tensor and a group).
      TreeMismatchError: listing every difference from ``like``.
      ConfigError: if flax (msgpack) or orbax (directories) is not installed.
      ValueError: for an unknown naming rule.

    Example:
      >>> import os, tempfile, numpy as np, safetensors.numpy
      >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
      >>> safetensors.numpy.save_file({"enc.0.w": np.ones((2, 3), np.float32)}, path)
      >>> read_foreign(path)["enc"]["0"]["w"].shape
      (2, 3)
      >>> like = {"enc": [{"w": np.zeros((2, 3), np.float32)}]}
      >>> read_foreign(path, like=like)["enc"][0]["w"].sum()
      np.float32(6.0)
    """
    name = os.fspath(src)
    namer(names)
    kind, fd = _open_source(name)
    try:
        values, flat = read_values(name, kind, fd, names)
    finally:
        if fd is not None:
            os.close(fd)
    return _tree(values, flat, names, like, name)


def _tree(values: Any, flat: bool, names: NamingRule, like: Any, name: str) -> Any:
    if not flat:
        return (
            values if like is None else _shaped(flat_names(values, names, name), like, names, name)
        )
    if like is not None:
        return _shaped(values, like, names, name)
    return nest(values, names, name)


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns)


def _refuse_overlap(src: str, dst: str) -> None:
    """Refuses a ``dst`` that is ``src`` or lies inside it (the import would
    replace the weights it came from, or write into the checkpoint it reads),
    one that exists but is not a regular file, and one in no directory."""
    try:
        mode = os.lstat(dst).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):  # save would replace a link or a FIFO, or fail on a directory
        raise FormatError(
            f"the destination {dst[:200]!r} is {file_kind(mode)}, not a regular file",
            context=src,
            hint="name a new file (or an old checkpoint to replace) as the destination",
        )
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    same = real_src == real_dst or (
        os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst)
    )
    if same or os.path.commonpath([real_src, real_dst]) == real_src:
        raise FormatError(
            f"the destination {dst[:200]!r} is "
            + ("the source itself" if same else "inside the source directory")
            + "; the import would change what it reads",
            context=src,
            hint="write the checkpoint somewhere outside the source",
        )
    parent = os.path.dirname(dst) or "."
    if not os.path.isdir(parent):  # found now, not after reading the whole source
        raise FileNotFoundError(errno.ENOENT, "the destination's directory does not exist", parent)


def import_weights(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    /,
    *,
    names: NamingRule = "dotted",
    like: Any = None,
    metadata: Mapping[str, Any] | None = None,
    digest: Algorithm = DEFAULT,
) -> Any:
    """Turns weights another tool wrote into a verified treeguard checkpoint.

    The weights are read as ``read_foreign`` reads them (nested by name, or
    into ``like``'s structure) and written with ``save``: atomically, with a
    hash per tensor and the tree's contract. The metadata records where they
    came from: ``imported_from`` holds the source's path, format, naming
    rule and, for a file, the digest of its bytes, keyed by its algorithm
    (``{"blake3": "..."}``).

    Args:
      src: a safetensors file, an ``.npz`` archive, a flax msgpack file or
        an orbax checkpoint directory.
      dst: the checkpoint to write.
      names: the naming rule (see ``read_foreign``).
      like: a tree or ``TreeSpec`` the weights must match; the checkpoint
        then has its structure.
      metadata: more JSON metadata to keep in the checkpoint.
      digest: the hash algorithm of the checkpoint and of the source's
        digest: ``"blake3"`` (the default) or ``"sha256"``.

    Returns:
      The written checkpoint's ``Header``.

    Raises:
      FormatError, TreeMismatchError, ConfigError, ValueError: as
        ``read_foreign``; nothing is written then. A ``FormatError`` also
        for a ``dst`` that is ``src``, lies inside it or exists but is not a
        regular file, and for a source written to while it is imported.
      TypeError: if ``metadata`` is not JSON.
      ValueError: for a ``digest`` other than ``"blake3"`` and ``"sha256"``.
      OSError: if a file cannot be read or written (FileNotFoundError for
        a ``dst`` in a directory that does not exist, before reading).

    Example:
      >>> import os, tempfile, numpy as np
      >>> d = tempfile.mkdtemp()
      >>> np.savez(os.path.join(d, "w.npz"), **{"dense.w": np.ones((2, 2), np.float32)})
      >>> h = import_weights(os.path.join(d, "w.npz"), os.path.join(d, "w.safetensors"))
      >>> h.spec, h.metadata["imported_from"]["format"]
      (TreeSpec(['dense']['w']: f32[2,2]), 'npz')
    """
    name = os.fspath(src)
    algorithm = check_algorithm(digest)
    _refuse_overlap(name, os.fspath(dst))
    namer(names)
    kind, fd = _open_source(name)
    found = None
    changed = FormatError(
        f"the file changed while it was imported; its {algorithm} digest would not "
        "be of the weights read",
        context=name,
        hint="import it again once nothing writes to it",
    )
    try:
        if fd is not None:
            before = os.fstat(fd)
            try:
                found = hash_file(fd, algorithm)
            except ShortRead:
                raise changed from None
        values, flat = read_values(name, kind, fd, names)
        if fd is not None and _changed(before, os.fstat(fd)):
            raise changed
    finally:
        if fd is not None:
            os.close(fd)
    tree = _tree(values, flat, names, like, name)
    provenance: dict[str, Any] = {
        "file": name,
        "format": kind,
        "names": names if isinstance(names, str) else "function",
    }
    if found is not None:
        provenance[algorithm] = found
    save(
        dst, tree, metadata={**dict(metadata or {}), "imported_from": provenance}, digest=algorithm
    )
    return read_header(dst)
