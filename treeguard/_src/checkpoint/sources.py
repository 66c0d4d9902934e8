"""Importing foreign weights: one reader per format, each through its own library.

``read_foreign`` reads a file or directory another tool wrote into a tree of
numpy arrays; ``import_weights`` writes that tree as a hashed treeguard
checkpoint. The formats, told apart by their content, not their suffix:

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
import math
import os
import stat
import zipfile
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ..atomic import file_kind, open_regular
from ..errors import ConfigError, FormatError
from ..hashing import DEFAULT, Algorithm, ShortRead, check_algorithm, hash_file, pread_into
from ..paths import Path, keystr
from ..strictjson import loads
from ..walk import MAX_DEPTH
from . import foreign
from .files import read_raw_header
from .foreign import (
    ForeignHeader,
    ForeignTensor,
    build,
    check_bools,
    foreign_header,
    is_foreign,
    match,
    read_tensors,
)
from .format import ALLOWED_DTYPES, MAX_HEADER_BYTES
from .load import load
from .names import NamingRule, namer, nest
from .read import read_header
from .received import DEFLATE_MAX_RATIO, plain_tree, refuse_forged_claim, stored_array_bytes
from .write import save

SourceKind = Literal["safetensors", "treeguard", "npz", "msgpack", "orbax"]

_SHARDED_MANIFEST = "treeguard.sharded.json"
#: The JSON files of an orbax checkpoint directory, read strictly before orbax reads them.
_ORBAX_JSON = ("_METADATA", "_CHECKPOINT_METADATA")


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


def _check_array(arr: Any, where: str, name: str) -> np.ndarray[Any, Any]:
    """A leaf of a nested source as a numeric native-order numpy array."""
    if isinstance(arr, (bool, int, float, complex, np.generic)) and not isinstance(
        arr, (str, bytes)
    ):
        arr = np.asarray(arr)
    if not isinstance(arr, np.ndarray):
        raise FormatError(
            f"{where}: a {type(arr).__name__}, not an array",
            context=name,
            hint="import only files whose leaves are numeric arrays",
        )
    if arr.dtype.hasobject or arr.dtype.name not in ALLOWED_DTYPES:
        raise FormatError(
            f"{where}: dtype {arr.dtype.str!r} is not a numeric dtype treeguard stores",
            context=name,
            hint="import only files whose leaves are numeric arrays",
        )
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    check_bools(arr, where, name)
    out: np.ndarray[Any, Any] = arr if arr.flags.c_contiguous else arr.copy(order="C")
    return out


def _flat_names(tree: Any, names: NamingRule, name: str) -> dict[str, np.ndarray[Any, Any]]:
    """A nested dict/list source flattened to ``{tensor name: array}`` by the rule."""
    to_name = namer(names)
    out: dict[str, np.ndarray[Any, Any]] = {}
    where: dict[str, str] = {}
    leaves: list[tuple[Path, Any]] = []
    stack: list[tuple[Path, Any]] = [((), tree)]
    while stack:
        path, node = stack.pop()
        if len(path) > MAX_DEPTH:
            raise FormatError(f"nests deeper than {MAX_DEPTH} levels", context=name)
        if isinstance(node, Mapping):
            for k, v in node.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise FormatError(
                        f"{keystr(path) or '<root>'}: key of type {type(k).__name__}", context=name
                    )
                stack.append(((*path, ("key", k)), v))
        elif isinstance(node, (list, tuple)):
            stack.extend(((*path, ("index", i)), v) for i, v in enumerate(node))
        else:
            leaves.append((path, node))
            if len(leaves) > foreign.MAX_TENSORS:  # each leaf becomes an array (~100 bytes)
                raise _too_many(name)
    for path, node in leaves:
        text = keystr(path) or "<root>"
        tensor = to_name(path)
        if tensor in out:
            raise FormatError(
                f"{where[tensor]} and {text} both give the name {tensor[:200]!r}",
                context=name,
                hint="pick another naming rule (names='keypath')",
            )
        out[tensor] = _check_array(node, text, name)
        where[tensor] = text
    return out


def _too_many(name: str) -> FormatError:
    return FormatError(
        f"holds more than {foreign.MAX_TENSORS:,} tensors; no model has that many",
        context=name,
        hint="a file this wide is a decompression bomb or corrupt; get a fresh copy",
    )


def _read_safetensors(
    fd: int, name: str
) -> tuple[dict[str, np.ndarray[Any, Any]], ForeignHeader | None]:
    doc, header_bytes, size = read_raw_header(fd, name)
    if not is_foreign(doc):
        return {"": load(name)}, None  # ours: verified, nested as stored
    header = foreign_header(doc, header_bytes, size, name)
    return read_tensors(fd, header, {t.name for t in header.tensors}), header


def _read_npz(fd: int, name: str) -> dict[str, np.ndarray[Any, Any]]:
    size = os.fstat(fd).st_size
    out: dict[str, np.ndarray[Any, Any]] = {}
    try:
        with os.fdopen(os.dup(fd), "rb") as f, zipfile.ZipFile(f) as zf:
            if len(zf.infolist()) > foreign.MAX_TENSORS:
                raise _too_many(name)
            _no_overlap(zf, name)
            for info in zf.infolist():
                key = _member_name(info.filename, name)
                if key in out:  # numpy.load would keep the last one silently
                    raise FormatError(
                        f"member {info.filename[:200]!r} appears twice in the archive",
                        context=name,
                        hint="an .npz holds each array once; get a fresh copy of the archive",
                    )
                if info.flag_bits & 0x1:
                    raise FormatError(f"member {info.filename[:200]!r} is encrypted", context=name)
                out[key] = _read_member(zf, info, size, name)
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, KeyError, RuntimeError) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(
            f"not a readable .npz archive ({type(e).__name__}: {str(e)[:200]})", context=name
        ) from None
    return out


def _no_overlap(zf: zipfile.ZipFile, name: str) -> None:
    """Refuses members whose stored bytes overlap: a zip bomb makes every member
    read the same compressed bytes again (Python before 3.11.8 does not check)."""
    infos = sorted(zf.infolist(), key=lambda i: i.header_offset)
    ends = [*(i.header_offset for i in infos[1:]), zf.start_dir]
    for info, end in zip(infos, ends):
        local = 30 + len(info.orig_filename.encode("utf-8", "surrogateescape"))
        if info.header_offset + local + info.compress_size > end:
            raise FormatError(
                f"member {info.filename[:200]!r} overlaps the next one in the archive "
                "(a zip bomb, or a corrupt archive)",
                context=name,
                hint="get a fresh copy of the archive",
            )


def _member_name(member: str, name: str) -> str:
    if not member.endswith(".npy"):
        raise FormatError(
            f"member {member[:200]!r} is not an .npy array (a torch zip, or another archive?)",
            context=name,
            hint="an .npz holds only .npy members; treeguard never unpickles",
        )
    return member[: -len(".npy")]


def _read_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, size: int, name: str
) -> np.ndarray[Any, Any]:
    """One ``.npy`` member, its header checked against its size before allocating."""
    where = f"member {info.filename[:200]!r}"
    if info.compress_type == zipfile.ZIP_STORED:
        limit = size
    elif info.compress_type == zipfile.ZIP_DEFLATED:
        limit = info.compress_size * DEFLATE_MAX_RATIO + 1024
    else:
        raise FormatError(f"{where}: compression method {info.compress_type}", context=name)
    if info.file_size > limit:
        raise FormatError(
            f"{where}: claims {info.file_size:,} bytes, more than its "
            f"{info.compress_size:,} stored bytes can hold",
            context=name,
        )
    fmt = np.lib.format
    with zf.open(info) as f:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise FormatError(f"{where}: .npy version {version}", context=name)
        if dtype.hasobject or dtype.name not in ALLOWED_DTYPES:
            raise FormatError(
                f"{where}: dtype {dtype.str!r} is not a numeric dtype (object arrays would "
                "need pickle)",
                context=name,
                hint="treeguard never unpickles; save numeric arrays only",
            )
        if any(d < 0 for d in shape):
            raise FormatError(f"{where}: shape {list(shape)[:8]} has a negative size", context=name)
        nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if nbytes != info.file_size - f.tell():
            raise FormatError(
                f"{where}: {dtype.str}{list(shape)} needs {nbytes:,} bytes, the member holds "
                f"{info.file_size - f.tell():,}",
                context=name,
            )
        data = f.read(nbytes)
    arr = np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C")
    return _check_array(arr, where, name)


def _read_msgpack(fd: int, name: str, names: NamingRule) -> dict[str, np.ndarray[Any, Any]]:
    try:
        from flax import serialization
    except ImportError:
        raise ConfigError(
            "reading a flax msgpack file needs flax, which is not installed",
            context=name,
            hint="pip install flax (or 'treeguard[frameworks]')",
        ) from None
    data = bytearray(os.fstat(fd).st_size)
    if pread_into(fd, memoryview(data), 0) != len(data):
        raise FormatError("the file shrank while it was read", context=name)
    try:
        tree = serialization.msgpack_restore(data)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - msgpack raises many kinds on bad bytes
        raise FormatError(
            f"not a flax msgpack file ({type(e).__name__}: {str(e)[:200]})", context=name
        ) from None
    return _flat_names(tree, names, name)


def _claimed_bytes(tree_meta: Any, on_disk: int, name: str) -> None:
    """Refuses orbax array metadata that claims far more than the files hold."""
    import jax

    claimed = 0
    for leaf in jax.tree.leaves(tree_meta):
        shape, dtype = getattr(leaf, "shape", None), getattr(leaf, "dtype", None)
        if shape is not None and dtype is not None:
            claimed += math.prod(shape) * np.dtype(dtype).itemsize
    refuse_forged_claim(claimed, on_disk, name)


def _strict_metadata(name: str) -> None:
    """Parses orbax's JSON metadata files strictly first: orbax reads them with
    ``json.loads``, which takes duplicate keys, NaN and any depth (a RecursionError)."""
    for meta in _ORBAX_JSON:
        path = os.path.join(name, meta)
        if not os.path.lexists(path):
            continue
        fd = open_regular(path, what="orbax metadata file")
        try:
            size = os.fstat(fd).st_size
            if size > MAX_HEADER_BYTES:
                raise FormatError(
                    f"{meta}: {size:,} bytes, over the {MAX_HEADER_BYTES:,}-byte limit",
                    context=name,
                )
            raw = bytearray(size)
            pread_into(fd, memoryview(raw), 0)
        finally:
            os.close(fd)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(
                f"{meta}: not UTF-8 text ({e.reason} at byte {e.start})", context=name
            ) from None
        loads(text, meta, context=name, hint="pass the directory StandardCheckpointer.save wrote")


def _read_orbax(name: str, names: NamingRule) -> dict[str, np.ndarray[Any, Any]]:
    on_disk = plain_tree(
        name, hint="pass a directory that StandardCheckpointer.save wrote, copied without links"
    )
    _strict_metadata(name)
    try:
        import jax
        import orbax.checkpoint as ocp
    except ImportError:
        raise ConfigError(
            "reading an orbax checkpoint needs orbax-checkpoint, which is not installed",
            context=name,
            hint="pip install 'treeguard[orbax]'",
        ) from None
    # each stored array's chunks and size, from its own metadata, before orbax opens any
    refuse_forged_claim(stored_array_bytes(name, name, compressed=True), on_disk, name)
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            meta = ckptr.metadata(name)
            tree_meta = getattr(getattr(meta, "item_metadata", meta), "tree", None)
            if tree_meta is None:
                tree_meta = getattr(meta, "tree", None)
            if tree_meta is None:
                raise FormatError(
                    "not a readable orbax checkpoint: no tree metadata "
                    "(_METADATA missing or unreadable)",
                    context=name,
                    hint="pass the directory StandardCheckpointer.save wrote",
                )
            _claimed_bytes(tree_meta, on_disk, name)
            args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree_meta)
            tree = ckptr.restore(name, restore_args=args)
    except (
        FileNotFoundError,
        ValueError,
        KeyError,
        TypeError,
        AttributeError,
        OSError,
        RecursionError,
    ) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(
            f"not a readable orbax checkpoint ({type(e).__name__}: {str(e)[:200]})",
            context=name,
            hint="pass the directory StandardCheckpointer.save wrote",
        ) from None
    return _flat_names(tree, names, name)


def _read(name: str, kind: SourceKind, fd: int | None, names: NamingRule) -> tuple[Any, bool]:
    """(values, flat): a flat ``{name: array}`` or, for our own file, its tree."""
    if fd is None:
        return _read_orbax(name, names), True
    if kind == "safetensors":
        values, header = _read_safetensors(fd, name)
        if header is None:
            return values[""], False
        return values, True
    if kind == "npz":
        return _read_npz(fd, name), True
    return _read_msgpack(fd, name, names), True


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
        values, flat = _read(name, kind, fd, names)
    finally:
        if fd is not None:
            os.close(fd)
    return _tree(values, flat, names, like, name)


def _tree(values: Any, flat: bool, names: NamingRule, like: Any, name: str) -> Any:
    if not flat:
        return (
            values if like is None else _shaped(_flat_names(values, names, name), like, names, name)
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
        values, flat = _read(name, kind, fd, names)
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
