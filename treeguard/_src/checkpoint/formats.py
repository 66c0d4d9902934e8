"""One reader per foreign format, each through its own library, into a flat
``{tensor name: numpy array}`` (or, for our own file, its verified tree):
safetensors, ``.npz`` (its entry count, as its end records claim it, checked
before ``zipfile`` reads its directory, and as ``zipfile`` read it after;
every member's ``.npy`` header checked before any array is allocated; object
arrays refused, so pickle is never reached), flax
msgpack and orbax directories (their JSON read strictly first). Nested
sources are named by the same rule as flat ones (``flat_names``).
"""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from ..atomic import open_regular
from ..errors import ConfigError, FormatError
from ..hashing import pread_into
from ..paths import Path, keystr
from ..strictjson import loads
from ..walk import MAX_DEPTH
from .files import read_raw_header, utf8_text
from .foreign import check_bools, read_tensors
from .foreignheader import ForeignHeader, foreign_header, is_foreign
from .format import ALLOWED_DTYPES, MAX_HEADER_BYTES, refuse_too_many
from .loading import load
from .names import NamingRule, namer
from .received import DEFLATE_MAX_RATIO, plain_tree, refuse_forged_claim, stored_array_bytes
from .zipend import claimed_entries

SourceKind = Literal["safetensors", "treeguard", "npz", "msgpack", "orbax"]

#: The JSON files of an orbax checkpoint directory, read strictly before orbax reads them.
_ORBAX_JSON = ("_METADATA", "_CHECKPOINT_METADATA")


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


def flat_names(tree: Any, names: NamingRule, name: str) -> dict[str, np.ndarray[Any, Any]]:
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
            _at_most_max_tensors(len(leaves), name)  # each leaf becomes an array (~100 bytes)
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


def _at_most_max_tensors(count: int, name: str) -> None:
    """Refuses a source of more than ``MAX_TENSORS`` tensors."""
    refuse_too_many(
        count, name, hint="a file this wide is a decompression bomb or corrupt; get a fresh copy"
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
        _at_most_max_tensors(claimed_entries(fd, size), name)  # before zipfile reads the directory
        with os.fdopen(os.dup(fd), "rb") as f, zipfile.ZipFile(f) as zf:
            _at_most_max_tensors(len(zf.infolist()), name)  # what it holds, whatever it claims
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
    return flat_names(tree, names, name)


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
        loads(
            utf8_text(raw, f"{meta}:", name),
            meta,
            context=name,
            hint="pass the directory StandardCheckpointer.save wrote",
        )


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
    return flat_names(tree, names, name)


def read_values(name: str, kind: SourceKind, fd: int | None, names: NamingRule) -> tuple[Any, bool]:
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
