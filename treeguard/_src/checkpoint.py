"""The checkpoint file: one safetensors file whose header carries the contract.

Layout (the safetensors format, so ``safetensors.numpy.load_file`` opens it)::

    8 bytes   little-endian length N of the header
    N bytes   UTF-8 JSON header, padded with spaces to a multiple of 8
    ...       every tensor's bytes, back to back, in the tree's flatten order

The header maps each tensor name to ``{"dtype", "shape", "data_offsets"}``
and holds ``__metadata__``, a map of strings:

* ``treeguard.format``: ``"treeguard.checkpoint/1"``;
* ``treeguard.spec``: the ``TreeSpec`` JSON, the authority for the structure;
* ``treeguard.hash`` and ``treeguard.hashes``: the hash algorithm and one hex
  digest per tensor, keyed by tensor name;
* ``treeguard.env``: the environment fingerprint of the writer;
* ``treeguard.metadata``: the caller's metadata, as JSON;
* ``treeguard.digest``: a hash of all the above and of the tensor table, so a
  changed header byte is caught even where the JSON still parses.

Tensor names are key paths in ``keystr`` form (``['dense1']['w']``), which
``paths.parse`` reads back exactly. A dtype that ``safetensors.numpy`` cannot
represent (float8 and the other ml_dtypes besides bfloat16, complex128) is
stored as ``U8`` bytes, one trailing axis of ``itemsize`` bytes, and its true
dtype is in the spec, so it round-trips exactly.

Reading never unpickles, never follows a symbolic link, never imports a
module named in a file, and validates every size against the file's size
before it allocates anything.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import jax
import ml_dtypes
import numpy as np

from .diff import mismatches
from .env import environment
from .errors import FormatError, IntegrityError, InvalidTreeError, TreeMismatchError
from .mismatch import Mismatch
from .paths import Path, keystr, parse
from .spec import LeafSpec, Record, TreeSpec, dtype_of, spec_of, summarize
from .walk import Node, flatten, structure_of

FORMAT = "treeguard.checkpoint/1"
FORMAT_VERSION = 1
_FORMAT_RE = re.compile(r"^treeguard\.checkpoint/(\d+)$")

#: The largest header read, as in the safetensors reference reader.
MAX_HEADER_BYTES = 100_000_000
#: The hash of each tensor (sha256 measured faster than blake2b here, with SHA-NI).
HASH_NAME = "sha256"
_HEX_LEN = 64
_HEX_RE = re.compile(r"^[0-9a-f]{64}$")
_PLACEHOLDER = "0" * _HEX_LEN
_CHUNK = 16 * 1024 * 1024
_MAX_NDIM = 64

_K_FORMAT = "treeguard.format"
_K_SPEC = "treeguard.spec"
_K_HASH = "treeguard.hash"
_K_HASHES = "treeguard.hashes"
_K_ENV = "treeguard.env"
_K_META = "treeguard.metadata"
_K_DIGEST = "treeguard.digest"
_REQUIRED = (_K_FORMAT, _K_SPEC, _K_HASH, _K_HASHES, _K_ENV, _K_META, _K_DIGEST)

#: numpy dtype name -> safetensors dtype name, for the dtypes
#: ``safetensors.numpy`` reads natively.
_NATIVE: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
    "complex64": "C64",
}
_FOREIGN: dict[str, str] = {
    **{v: k for k, v in _NATIVE.items()},
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
#: Every dtype a checkpoint may hold: plain numeric types and ml_dtypes.
#: Nothing else is ever allocated from a file (no object or structured dtypes).
ALLOWED_DTYPES: frozenset[str] = frozenset(
    [*_NATIVE, "complex128"]
    + [
        n
        for n in dir(ml_dtypes)
        if n.startswith(("float", "int", "uint")) and isinstance(getattr(ml_dtypes, n), type)
    ]
)


# -- the header -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry in a checkpoint header.

    Attributes:
      name: the tensor name, the leaf's key path in ``keystr`` form.
      shape: the leaf's shape.
      dtype: the leaf's dtype.
      stored_dtype: the safetensors dtype name in the header (``"F32"``;
        ``"U8"`` for a dtype stored as raw bytes).
      begin: the first byte, counted from the start of the data section.
      end: one past the last byte, counted the same way.
      digest: the recorded hex digest of the bytes.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    stored_dtype: str
    begin: int
    end: int
    digest: str

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def size(self) -> int:
        """The element count."""
        return math.prod(self.shape)

    def summary(self) -> str:
        """``f32[3,1]``."""
        return summarize(self.shape, self.dtype)


@dataclasses.dataclass(frozen=True)
class Header:
    """A checkpoint's header, validated against the file's size; no data read.

    Attributes:
      path: the file it was read from.
      format: the format string, ``"treeguard.checkpoint/1"``.
      spec: the stored ``TreeSpec``.
      tensors: one ``TensorInfo`` per leaf, in the spec's flatten order.
      env: the writer's environment fingerprint.
      metadata: the caller's metadata given to ``save``.
      hash_name: the tensor hash algorithm.
      digest: the header digest.
      header_bytes: the header's length in bytes (without the 8-byte prefix).
      file_bytes: the file's size.
    """

    path: str
    format: str
    spec: TreeSpec
    tensors: tuple[TensorInfo, ...]
    env: dict[str, Any]
    metadata: dict[str, Any]
    hash_name: str
    digest: str
    header_bytes: int
    file_bytes: int

    @property
    def data_start(self) -> int:
        """The file offset of the first tensor byte."""
        return 8 + self.header_bytes

    @property
    def data_bytes(self) -> int:
        return self.file_bytes - self.data_start


def _stored_layout(shape: tuple[int, ...], dtype: np.dtype[Any]) -> tuple[str, list[int]]:
    """The safetensors dtype and shape under which a leaf is written."""
    native = _NATIVE.get(dtype.name)
    if native is not None:
        return native, list(shape)
    if dtype.itemsize == 1:
        return "U8", list(shape)
    return "U8", [*shape, dtype.itemsize]


def _digest(meta: Mapping[str, str], table: Mapping[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != _K_DIGEST}
    canon = json.dumps({"metadata": body, "tensors": table}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def _encode_header(meta: Mapping[str, str], table: Mapping[str, Any]) -> bytes:
    doc: dict[str, Any] = {"__metadata__": dict(meta)}
    doc.update(table)
    raw = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return raw + b" " * (-len(raw) % 8)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"the header names {k!r} twice")
        out[k] = v
    return out


def _loads(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FormatError(f"{what} is not valid JSON: {e}") from None


_LINK_MESSAGE = (
    "{}: is a symbolic link; treeguard never follows links to checkpoints\n"
    "hint: pass the link's target path if you trust it"
)


def _file_kind(mode: int) -> str:
    """What a non-regular file is, for an error message."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return kind
    return "not a file"  # pragma: no cover - every POSIX file type is named above


def _open(path: str | os.PathLike[str]) -> tuple[int, str]:
    """Opens a regular file for reading; never follows a final symbolic link
    and never blocks on a FIFO or device (each is refused before it is opened)."""
    name = os.fspath(path)
    st = os.lstat(name)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(_LINK_MESSAGE.format(name))
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(
            f"{name}: not a regular file ({_file_kind(st.st_mode)})\n"
            "hint: a checkpoint is a regular file written by treeguard.save"
        )
    # O_NONBLOCK: if the path is swapped for a FIFO after the lstat, opening it
    # still returns at once, and the fstat below refuses it.
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
        | getattr(os, "O_NONBLOCK", 0)
    )
    try:
        fd = os.open(name, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK):
            raise FormatError(_LINK_MESSAGE.format(name)) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FormatError(f"{name}: not a regular file ({_file_kind(st.st_mode)})")
    return fd, name


def _pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Fills ``buf`` from ``offset``; returns how many bytes were read."""
    done = 0
    total = len(buf)
    while done < total:
        if hasattr(os, "preadv"):
            n = os.preadv(fd, [buf[done:]], offset + done)
        else:  # pragma: no cover - platforms without preadv
            data = os.pread(fd, total - done, offset + done)
            n = len(data)
            buf[done : done + n] = data
        if n == 0:
            break
        done += n
    return done


_PICKLE_HINT = (
    "\nhint: this looks like a pickle or zip (torch) file; treeguard never unpickles. "
    "Convert it with a trusted tool into a treeguard or safetensors checkpoint"
)


def _looks_pickled(head: bytes) -> bool:
    return head[:1] == b"\x80" or head[:2] == b"PK"


def _read_raw_header(fd: int, name: str) -> tuple[dict[str, Any], int, int]:
    """The parsed JSON header, its length and the file size."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise FormatError(
            f"{name}: {size} bytes; a checkpoint starts with an 8-byte header length "
            "(truncated, or not a checkpoint)"
        )
    head = bytearray(8)
    if _pread_into(fd, memoryview(head), 0) != 8:
        raise FormatError(f"{name}: could not read the 8-byte header length")
    n = int.from_bytes(head, "little")
    hint = _PICKLE_HINT if _looks_pickled(bytes(head)) else ""
    if n > MAX_HEADER_BYTES:
        raise FormatError(
            f"{name}: the header claims {n:,} bytes, over the {MAX_HEADER_BYTES:,}-byte limit; "
            f"not a checkpoint{hint}"
        )
    if 8 + n > size:
        raise FormatError(
            f"{name}: the header claims {n:,} bytes but only {size - 8:,} follow the length "
            f"field (truncated, or not a checkpoint){hint}"
        )
    if n < 2:
        raise FormatError(f"{name}: a header of {n} bytes cannot hold a JSON object")
    raw = bytearray(n)
    if _pread_into(fd, memoryview(raw), 8) != n:
        raise FormatError(f"{name}: the file shrank while its header was read")
    if raw[:1] != b"{":
        raise FormatError(f"{name}: the header is not a JSON object{hint}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(
            f"{name}: the header is not UTF-8 text ({e.reason} at byte {e.start})"
        ) from None
    doc = _loads(text, f"{name}: the header")
    if not isinstance(doc, dict):
        raise FormatError(f"{name}: the header is not a JSON object")
    return doc, n, size


def _parse_header(fd: int, name: str) -> Header:
    doc, header_bytes, size = _read_raw_header(fd, name)
    meta = doc.pop("__metadata__", None)
    if not isinstance(meta, dict) or _K_FORMAT not in meta:
        raise FormatError(
            f"{name}: a safetensors file without treeguard metadata, so it holds no contract "
            "or hashes\nhint: read it with safetensors.numpy.load_file, check it, and save it "
            "with treeguard.save"
        )
    bad_meta = [k for k, v in meta.items() if not isinstance(v, str)]
    if bad_meta:
        raise FormatError(f"{name}: __metadata__ values must be strings; {bad_meta[0]!r} is not")
    fmt = meta[_K_FORMAT]
    m = _FORMAT_RE.match(fmt)
    if m is None:
        raise FormatError(f"{name}: unknown format {fmt!r}, expected {FORMAT!r}")
    if int(m.group(1)) > FORMAT_VERSION:
        raise FormatError(
            f"{name}: format {fmt!r} is newer than this treeguard reads ({FORMAT!r})\n"
            "hint: upgrade treeguard"
        )
    missing = [k for k in _REQUIRED if k not in meta]
    if missing:
        raise FormatError(f"{name}: the header lacks {', '.join(missing)}")
    # The digest covers everything below, so check it before interpreting any of it.
    digest = meta[_K_DIGEST]
    if not _HEX_RE.match(digest):
        raise FormatError(f"{name}: the header digest {digest[:80]!r} is not a {HASH_NAME} digest")
    actual_digest = _digest(meta, doc)
    if actual_digest != digest:
        raise IntegrityError(
            f"{name}: header: {HASH_NAME} digest {actual_digest[:12]}… of the header read, "
            f"{digest[:12]}… recorded in it; the header was changed or is corrupt\n"
            "hint: restore the file from a verified copy (ArtifactStore.rollback) or save it again",
            path="__metadata__",
        )
    if meta[_K_HASH] != HASH_NAME:
        raise FormatError(f"{name}: unknown tensor hash {meta[_K_HASH]!r}, expected {HASH_NAME!r}")
    try:
        spec = TreeSpec.from_json(meta[_K_SPEC])
    except FormatError as e:
        raise FormatError(f"{name}: {_K_SPEC}: {e}") from e
    hashes = _loads(meta[_K_HASHES], f"{name}: {_K_HASHES}")
    env = _loads(meta[_K_ENV], f"{name}: {_K_ENV}")
    user = _loads(meta[_K_META], f"{name}: {_K_META}")
    if not isinstance(hashes, dict) or not isinstance(env, dict) or not isinstance(user, dict):
        raise FormatError(f"{name}: {_K_HASHES}, {_K_ENV} and {_K_META} must be JSON objects")
    names = [keystr(p) for p in spec.paths]
    if len(set(names)) != len(names):
        raise FormatError(f"{name}: two leaves of the stored spec share one key path")
    for tensor in doc:
        _check_name(tensor, name)
    unknown = sorted(set(doc) - set(names))
    if unknown:
        raise FormatError(
            f"{name}: tensor {unknown[0]!r} is not a leaf of the stored spec"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
        )
    data_bytes = size - 8 - header_bytes
    tensors: list[TensorInfo] = []
    for leaf_name, (shape, dtype, _, _) in zip(names, spec.records):
        tensors.append(_tensor_info(leaf_name, shape, dtype, doc, hashes, data_bytes, name))
    _check_contiguous(tensors, data_bytes, name)
    return Header(
        path=name,
        format=fmt,
        spec=spec,
        tensors=tuple(tensors),
        env=env,
        metadata=user,
        hash_name=HASH_NAME,
        digest=digest,
        header_bytes=header_bytes,
        file_bytes=size,
    )


def _check_name(tensor: str, name: str) -> None:
    try:
        ok = keystr(parse(tensor)) == tensor
    except ValueError:
        ok = False
    if not ok:
        raise FormatError(
            f"{name}: tensor name {tensor[:200]!r} is not a key path such as \"['dense1']['w']\""
        )


def _tensor_info(  # noqa: PLR0917 - one call site, every argument needed
    leaf_name: str,
    shape: tuple[Any, ...],
    dtype: np.dtype[Any],
    table: Mapping[str, Any],
    hashes: Mapping[str, Any],
    data_bytes: int,
    name: str,
) -> TensorInfo:
    where = f"{name}: tensor {leaf_name or '<root>'}"
    if dtype.name not in ALLOWED_DTYPES or dtype.hasobject:
        raise FormatError(f"{where}: dtype {dtype.name!r} is not a numeric dtype treeguard stores")
    if len(shape) > _MAX_NDIM or not all(isinstance(d, int) for d in shape):
        raise FormatError(f"{where}: the stored spec gives shape {shape!r}, not concrete sizes")
    entry = table.get(leaf_name)
    if entry is None:
        raise FormatError(f"{where}: in the stored spec but absent from the tensor table")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise FormatError(f"{where}: an entry holds exactly dtype, shape and data_offsets")
    want_dtype, want_shape = _stored_layout(tuple(shape), dtype)
    if entry["dtype"] != want_dtype:
        raise FormatError(
            f"{where}: dtype {entry['dtype']!r} in the table, {dtype.name} in the stored spec "
            f"(stored as {want_dtype!r})"
        )
    if entry["shape"] != want_shape:
        raise FormatError(
            f"{where}: shape {entry['shape']!r} in the table, {list(shape)} in the stored spec"
        )
    offsets = entry["data_offsets"]
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise FormatError(f"{where}: data_offsets must be two integers")
    begin, end = offsets
    nbytes = math.prod(shape) * dtype.itemsize
    if not 0 <= begin <= end:
        raise FormatError(f"{where}: data_offsets {offsets} run backwards")
    if end - begin != nbytes:
        raise FormatError(
            f"{where}: {summarize(tuple(shape), dtype)} needs {nbytes:,} bytes, "
            f"data_offsets {offsets} give {end - begin:,}"
        )
    if end > data_bytes:
        raise FormatError(
            f"{where}: declares bytes up to {end:,} but the file holds {data_bytes:,} bytes of "
            "data (truncated, or a forged header)"
        )
    digest = hashes.get(leaf_name)
    if not isinstance(digest, str) or not _HEX_RE.match(digest):
        raise FormatError(f"{where}: no valid {HASH_NAME} digest in {_K_HASHES}")
    return TensorInfo(leaf_name, tuple(shape), dtype, want_dtype, begin, end, digest)


def _check_contiguous(tensors: Sequence[TensorInfo], data_bytes: int, name: str) -> None:
    pos = 0
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin != pos:
            raise FormatError(
                f"{name}: tensor {t.name or '<root>'} starts at byte {t.begin:,} of the data, "
                f"expected {pos:,}; tensors must be contiguous and not overlap"
            )
        pos = t.end
    if pos != data_bytes:
        raise FormatError(
            f"{name}: the tensors cover {pos:,} bytes but the file holds {data_bytes:,} bytes "
            "of data (truncated or extended)"
        )


def read_header(path: str | os.PathLike[str], /) -> Header:
    """Reads and validates a checkpoint's header; reads no tensor data.

    Args:
      path: a file written by ``save``.

    Returns:
      The ``Header``: stored spec, tensor table, environment and metadata.

    Raises:
      FormatError: for a file that is not a treeguard checkpoint, is a
        symbolic link, is truncated, oversized, of an unknown format version,
        or whose header is malformed or disagrees with the file's size.
      IntegrityError: if the header's contents do not match its digest.
      OSError: if the file cannot be opened.

    Example:
      >>> import os, tempfile, numpy as np
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones((2, 3), np.float32)}, metadata={"step": 7})
      >>> h = read_header(path)
      >>> h.spec, h.metadata, h.tensors[0].summary()
      (TreeSpec({'w': f32[2,3]}), {'step': 7}, 'f32[2,3]')
    """
    fd, name = _open(path)
    try:
        return _parse_header(fd, name)
    finally:
        os.close(fd)


# -- writing ----------------------------------------------------------------


def _is_key_array(x: Any) -> bool:
    """Whether a leaf is a typed PRNG key array (``jax.random.key``)."""
    return isinstance(x, jax.Array) and jax.numpy.issubdtype(x.dtype, jax.dtypes.prng_key)


def _refuse_key_arrays(leaves: Sequence[Any], spec_paths: Callable[[], list[Path]]) -> None:
    """Raises for typed PRNG keys, which have no byte form to store."""
    bad = [i for i, x in enumerate(leaves) if _is_key_array(x)]
    if bad:
        paths = spec_paths()
        raise InvalidTreeError(
            [(keystr(paths[i]), f"typed PRNG key array {leaves[i].dtype}") for i in bad],
            hint="save the raw key bits with jax.random.key_data(key) and rewrap on load",
        )


def _host_array(x: Any, record: Record, name: str) -> np.ndarray[Any, Any]:
    """One leaf as a C-contiguous little-endian numpy array: gathered from any
    device or shards, never more than this one leaf in memory."""
    shape, dtype, _, _ = record
    if isinstance(x, jax.Array):
        if not x.is_fully_addressable:
            raise InvalidTreeError(
                [(name, "array spans several processes; this host sees only some shards")],
                hint="save multi-host arrays with orbax, or gather them with "
                "jax.experimental.multihost_utils.process_allgather first",
            )
        arr = np.asarray(x)
    else:
        arr = np.asarray(x, dtype=dtype)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")
    if tuple(arr.shape) != tuple(shape) or arr.dtype != dtype:
        raise InvalidTreeError(
            [
                (
                    name,
                    f"became {summarize(arr.shape, arr.dtype)} while saving, was "
                    f"{summarize(tuple(shape), dtype)}",
                )
            ],
            hint="do not mutate a tree while it is being saved",
        )
    return arr


def _bytes_of(arr: np.ndarray[Any, Any]) -> memoryview:
    flat: Any = arr.reshape(-1).view(np.uint8)
    return memoryview(flat)


def _hash_bytes(buf: memoryview) -> str:
    h = hashlib.sha256()
    h.update(buf)
    return h.hexdigest()


def _write_all(fd: int, buf: memoryview) -> None:
    while len(buf):
        n = os.write(fd, buf[:_CHUNK])
        buf = buf[n:]


def _fsync_dir(dirname: str) -> None:
    try:
        dfd = os.open(dirname or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover - file systems without directory fsync
        pass
    finally:
        os.close(dfd)


_TMP_RE = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(dirname: str, base: str | None = None) -> list[str]:
    """Removes temp files left by savers that died (their pid is gone).

    A crash during ``save`` leaves ``.{name}.{pid}.{random}.tmp`` beside the
    target. It never blocks a later save (every saver uses a fresh name);
    this only reclaims the space.

    Args:
      dirname: the directory to clean.
      base: only temps for this target file name; all when None.

    Returns:
      The names removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(dirname or ".")
    except OSError:
        return removed
    for entry in names:
        m = _TMP_RE.match(entry)
        if m is None or (base is not None and m.group("base") != base):
            continue
        if _pid_alive(int(m.group("pid"))):
            continue
        try:
            os.unlink(os.path.join(dirname, entry))
            removed.append(entry)
        except OSError:
            pass
    return removed


_META_HINT = (
    "\nhint: metadata holds JSON values only: str, finite numbers, bool, None, lists, dicts"
)


def _bad_metadata(value: Any, where: str) -> str | None:
    """Where in ``value`` the first value JSON cannot hold is, and why."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{where}[{k!r}]: keys must be str, not {type(k).__name__}"
            found = _bad_metadata(v, f"{where}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _bad_metadata(v, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where}: {value!r} has no JSON form"
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    return f"{where}: an object of type {type(value).__name__} has no JSON form"


def user_metadata_json(metadata: Mapping[str, Any] | None) -> str:
    """The caller's metadata as canonical JSON text, validated.

    Args:
      metadata: the metadata given to ``save`` or ``ArtifactStore.put``.

    Returns:
      The JSON text (``"{}"`` for None).

    Raises:
      TypeError: naming the key path of the first value JSON cannot hold
        (an object, a set, NaN or infinity, a key that is not a str).

    Example:
      >>> user_metadata_json({"step": 7, "tags": ["a"]})
      '{"step": 7, "tags": ["a"]}'
      >>> user_metadata_json({"opt": {"lr": {0.1}}})
      Traceback (most recent call last):
      ...
      TypeError: metadata['opt']['lr']: an object of type set has no JSON form
      hint: ...
    """
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping):
        raise TypeError(
            f"metadata must be a mapping with str keys, got {type(metadata).__name__}{_META_HINT}"
        )
    try:
        found = _bad_metadata(metadata, "metadata")
    except RecursionError:
        found = "metadata: nested too deeply, or it contains itself"
    if found:
        raise TypeError(found + _META_HINT)
    try:
        return json.dumps(dict(metadata), sort_keys=True, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:  # a cycle, or a subclass's odd form
        raise TypeError(f"metadata is not JSON-serialisable: {e}{_META_HINT}") from None


def save(
    path: str | os.PathLike[str],
    tree: Any,
    *,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Writes a tree to one checkpoint file, atomically, with a hash per tensor.

    The bytes are streamed from each leaf's own buffer into a temp file in
    the same directory while a second thread hashes them; the file is
    fsynced, renamed over ``path`` and the directory fsynced. A crash at any
    moment leaves the previous file at ``path`` untouched, and two savers to
    one path leave one whole file or the other, never a mix. Arrays on any
    device, and sharded arrays, are gathered one leaf at a time.

    Args:
      path: the file to write (by convention ``*.safetensors``).
      tree: a pytree of arrays (jax, numpy, Python numbers); any registered
        nodes (flax.nnx State, equinox modules, namedtuples, dataclasses).
      metadata: JSON-serialisable data to keep in the header, read back by
        ``read_header(path).metadata``.

    Raises:
      InvalidTreeError: for leaves that are not arrays, typed PRNG keys,
        keys with no JSON form, two leaves with one key path, or arrays
        spread over several processes.
      TypeError: if ``metadata`` is not JSON-serialisable, naming the key.
      OSError: if the file cannot be written; ``path`` is then unchanged.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> path = os.path.join(tempfile.mkdtemp(), "params.safetensors")
      >>> save(path, {"dense1": {"w": jnp.ones((2, 3), jnp.bfloat16)}})
      >>> import safetensors.numpy
      >>> list(safetensors.numpy.load_file(path))
      ["['dense1']['w']"]
    """
    target = os.fspath(path)
    leaves, _ = flatten(tree)
    _refuse_key_arrays(leaves, lambda: structure_of(tree).leaf_paths())
    spec = spec_of(tree)
    records = spec.records
    names = [keystr(p) for p in spec.paths]
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    for leaf_name, (_, dtype, _, _) in zip(names, records):
        if leaf_name in seen:
            problems.append((leaf_name, "two leaves share this key path"))
        seen.add(leaf_name)
        if dtype.name not in ALLOWED_DTYPES:
            problems.append((leaf_name, f"dtype {dtype.name} cannot be stored"))
    if problems:
        raise InvalidTreeError(problems, hint="store numeric arrays only, under distinct keys")
    user = user_metadata_json(metadata)
    table: dict[str, Any] = {}
    pos = 0
    for leaf_name, (shape, dtype, _, _) in zip(names, records):
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        st_dtype, st_shape = _stored_layout(tuple(int(d) for d in shape), dtype)
        table[leaf_name] = {
            "dtype": st_dtype,
            "shape": st_shape,
            "data_offsets": [pos, pos + nbytes],
        }
        pos += nbytes
    meta: dict[str, str] = {
        _K_FORMAT: FORMAT,
        _K_SPEC: spec.to_json(indent=None).rstrip("\n"),
        _K_HASH: HASH_NAME,
        _K_HASHES: json.dumps({n: _PLACEHOLDER for n in names}, ensure_ascii=False),
        _K_ENV: json.dumps(environment()),
        _K_META: user,
        _K_DIGEST: _PLACEHOLDER,
    }
    draft = _encode_header(meta, table)

    dirname, base = os.path.split(os.path.abspath(target))
    remove_stale_temps(dirname, base)
    tmp = os.path.join(dirname, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        try:
            _write_all(fd, memoryview(len(draft).to_bytes(8, "little") + draft))
            digests = _stream_leaves(fd, leaves, records, names)
            meta[_K_HASHES] = json.dumps(dict(zip(names, digests)), ensure_ascii=False)
            meta[_K_DIGEST] = _digest(meta, table)
            final = _encode_header(meta, table)
            if len(final) != len(draft):  # pragma: no cover - hex digests have fixed length
                raise AssertionError("header length changed while saving")
            os.pwrite(fd, final, 8)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)  # a failed rename (the target is a directory) leaves no temp
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(dirname)


def _stream_leaves(
    fd: int, leaves: Sequence[Any], records: Sequence[Record], names: Sequence[str]
) -> list[str]:
    """Writes each leaf's bytes while a second thread hashes the same buffer.

    At most two converted leaves are alive at once, so a tree on an
    accelerator costs no more than two leaves of host memory.
    """
    futures: list[concurrent.futures.Future[str]] = []
    pending: deque[concurrent.futures.Future[str]] = deque()
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="treeguard-hash") as pool:
        for x, record, leaf_name in zip(leaves, records, names):
            while len(pending) >= 2:
                pending.popleft().result()
            buf = _bytes_of(_host_array(x, record, leaf_name))
            fut = pool.submit(_hash_bytes, buf)
            futures.append(fut)
            pending.append(fut)
            _write_all(fd, buf)
            del buf
        return [f.result() for f in futures]


# -- reading ----------------------------------------------------------------


def _read_tensors(
    fd: int,
    header: Header,
    wanted: Collection[str],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """Reads the wanted tensors straight into fresh arrays and verifies every
    hash (two threads hash while the main thread reads the next tensor).

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its hash.
      FormatError: if the file shrinks while it is read.
    """
    todo = sorted((t for t in header.tensors if t.name in wanted), key=lambda t: t.begin)
    total = sum(t.nbytes for t in todo)
    done = 0
    out: dict[str, np.ndarray[Any, Any]] = {}
    checks: list[tuple[TensorInfo, concurrent.futures.Future[str]]] = []
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="treeguard-hash") as pool:
        for t in todo:
            arr = np.empty(t.shape, t.dtype)
            buf = _bytes_of(arr)
            got = _pread_into(fd, buf, header.data_start + t.begin)
            if got != t.nbytes:
                raise FormatError(
                    f"{header.path}: tensor {t.name or '<root>'}: read {got:,} of {t.nbytes:,} "
                    "bytes; the file was truncated while it was read"
                )
            checks.append((t, pool.submit(_hash_bytes, buf)))
            out[t.name] = arr
            done += t.nbytes
            if progress is not None:
                progress(done, total)
        bad = [(t, f.result()) for t, f in checks if f.result() != t.digest]
    if bad:
        raise _integrity_error(header.path, bad)
    return out


def _integrity_error(name: str, bad: Sequence[tuple[TensorInfo, str]]) -> IntegrityError:
    n = len(bad)
    lines = [f"{name}: {n} tensor{'s' if n > 1 else ''} corrupt ({HASH_NAME} mismatch):"]
    for t, actual in bad[:20]:
        lines.append(
            f"  {t.name or '<root>'}: {t.summary()}: {HASH_NAME} {actual[:12]}… of the bytes read, "
            f"{t.digest[:12]}… recorded in the header"
        )
    if n > 20:
        lines.append(f"  ... and {n - 20} more")
    lines.append(
        "hint: the file was changed after it was saved; restore it from a verified copy "
        "(ArtifactStore.rollback) or save it again"
    )
    return IntegrityError("\n".join(lines), path=bad[0][0].name)


def verify_file(
    path: str | os.PathLike[str],
    /,
    *,
    like: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> Header:
    """Checks a checkpoint completely without keeping its data: the header,
    the contract (when ``like`` is given) and every tensor's hash.

    Memory stays at two 16 MiB buffers whatever the file's size.

    Args:
      path: the checkpoint.
      like: a tree or ``TreeSpec`` the checkpoint must match exactly.
      progress: called as ``progress(bytes_done, bytes_total)`` while hashing.

    Returns:
      The validated ``Header``.

    Raises:
      FormatError: for a malformed, truncated or foreign file.
      TreeMismatchError: listing every difference from ``like``, before any
        data is read.
      IntegrityError: naming every tensor whose bytes do not match.

    Example:
      >>> import os, tempfile, numpy as np
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones(3, np.float32)})
      >>> verify_file(path, like={"w": np.zeros(3, np.float32)}).spec.num_leaves
      1
    """
    fd, name = _open(path)
    try:
        header = _parse_header(fd, name)
        if like is not None:
            like_spec = like if isinstance(like, TreeSpec) else spec_of(like)
            found = _contract_mismatches(header.spec, like_spec)
            if found:
                raise TreeMismatchError(
                    found, expected_from="`like`", actual_from="the checkpoint", context=name
                )
        total = header.data_bytes
        done = 0

        def digest_of(t: TensorInfo) -> str:
            h = hashlib.sha256()
            buf = memoryview(bytearray(min(_CHUNK, max(t.nbytes, 1))))
            pos = 0
            while pos < t.nbytes:
                step = min(len(buf), t.nbytes - pos)
                got = _pread_into(fd, buf[:step], header.data_start + t.begin + pos)
                if got != step:
                    raise FormatError(f"{name}: the file was truncated while it was verified")
                h.update(buf[:step])
                pos += step
            return h.hexdigest()

        bad: list[tuple[TensorInfo, str]] = []
        with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="treeguard-hash") as pool:
            for t, actual in zip(header.tensors, pool.map(digest_of, header.tensors)):
                if actual != t.digest:
                    bad.append((t, actual))
                done += t.nbytes
                if progress is not None:
                    progress(done, total)
        if bad:
            raise _integrity_error(name, bad)
        return header
    finally:
        os.close(fd)


def _contract_mismatches(stored: TreeSpec, like: TreeSpec) -> list[Mismatch]:
    """Mismatches between a stored spec and the expected one. Weak types are
    not compared: no file keeps them, and ``load`` gives each leaf ``like``'s."""
    return [m for m in mismatches(stored, like) if m.kind != "weak_type"]


def load(
    path: str | os.PathLike[str],
    *,
    like: Any = None,
    rename: Mapping[str, str] | None = None,
    allow_missing: Collection[str] = (),
) -> Any:
    """Reads a checkpoint, verified: header, then contract, then every hash.

    In order: the header is read and validated against the file's size; the
    stored spec is compared with ``like`` and every mismatch is reported
    before any array data is read; every tensor is read and its hash
    checked; only then is the tree built. Leaves are matched by key path,
    never by position, and nothing is cast.

    Each returned leaf takes the kind of ``like``'s leaf at its path: a
    ``jax.Array`` is placed with that leaf's sharding (and weak type); a
    ``jax.ShapeDtypeStruct`` with a sharding is placed with it; a numpy
    scalar or Python number comes back as one; anything else is a numpy
    array. With ``like=None`` the leaves are numpy arrays, dicts, lists,
    tuples and None are rebuilt as stored, and namedtuples and registered
    classes come back as dicts keyed by attribute name or index: classes
    named in a file are never imported.

    Args:
      path: a file written by ``save``.
      like: the tree (or ``TreeSpec``) whose structure the result takes.
      rename: ``{old path: new path}`` for a deliberate migration; a path
        names a leaf or a whole subtree in ``keystr`` form. Needs ``like``.
      allow_missing: paths (leaves or subtrees) of ``like`` that may be
        absent from the checkpoint; those leaves keep ``like``'s values.

    Returns:
      The tree.

    Raises:
      FormatError: for a file that is not a treeguard checkpoint, is a
        symbolic link, truncated, oversized or malformed.
      TreeMismatchError: listing every difference between the checkpoint
        and ``like``, raised before any array data is read.
      IntegrityError: naming every tensor whose bytes do not match its hash.
      ValueError: for a ``rename`` or ``allow_missing`` path that names
        nothing, or ``rename`` without ``like``.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> params = {"dense2": {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)}}
      >>> save(path, params)
      >>> load(path, like=params)["dense2"]["w"].shape
      (3, 1)
      >>> load(path, like={"dense2": {"w": jnp.ones((3, 2)), "b": jnp.zeros(1)}})
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: ...: 1 mismatch between the checkpoint and `like`:
        ['dense2']['w']: shape (3, 2) in `like`, (3, 1) in the checkpoint
      hint: ...
    """
    if (rename or allow_missing) and like is None:
        raise ValueError("rename and allow_missing need `like`, the tree to migrate into")
    fd, name = _open(path)
    try:
        header = _parse_header(fd, name)
        plan = _plan(header, like, rename or {}, tuple(allow_missing))
        arrays = _read_tensors(fd, header, {t.name for t in header.tensors})
    finally:
        os.close(fd)
    return plan(arrays)


_Builder = Callable[[dict[str, np.ndarray[Any, Any]]], Any]


def _plan(
    header: Header, like: Any, rename: Mapping[str, str], allow_missing: Sequence[str]
) -> _Builder:
    """Checks the contract and returns how to build the tree from the arrays."""
    stored = header.spec
    if like is None:
        root = stored.structure

        def build_plain(arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
            it = iter([arrays[t.name] for t in header.tensors])
            return _plain(root, it)

        return build_plain
    if isinstance(like, TreeSpec):
        like_spec, like_leaves, like_treedef = like, None, None
    else:
        like_spec = spec_of(like)
        like_leaves, like_treedef = flatten(like)
    like_names = [keystr(p) for p in like_spec.paths]
    if not rename and not allow_missing:
        found = _contract_mismatches(stored, like_spec)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=header.path
            )
        sources: list[str | None] = list(like_names)
    else:
        sources = _migrate(header, like_spec, like_names, like_leaves, rename, allow_missing)

    def build(arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
        out: list[Any] = []
        for i, src in enumerate(sources):
            ref = like_leaves[i] if like_leaves is not None else None
            if src is None:
                out.append(ref)
                continue
            arr = arrays.pop(src)
            out.append(_as_like(arr, ref))
        if like_treedef is not None:
            return jax.tree.unflatten(like_treedef, out)
        try:
            treedef = like_spec.treedef
        except InvalidTreeError:
            return _plain(like_spec.structure, iter(out))
        return jax.tree.unflatten(treedef, out)

    return build


def _starts_with(path: Path, prefix: Path) -> bool:
    return path[: len(prefix)] == prefix


def _parse_user_path(text: str, what: str) -> Path:
    if not isinstance(text, str):
        raise ValueError(f"{what} paths are key-path strings, got {type(text).__name__}")
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"{what}: {e}; write paths as \"['dense1']['w']\"") from None


def _migrate(  # noqa: PLR0917 - one call site
    header: Header,
    like_spec: TreeSpec,
    like_names: list[str],
    like_leaves: list[Any] | None,
    rename: Mapping[str, str],
    allow_missing: Sequence[str],
) -> list[str | None]:
    """Leaf-level matching for a deliberate migration: renamed paths, and
    paths of ``like`` that may be absent. Every other difference still fails."""
    import difflib

    stored_paths = [parse(t.name) for t in header.tensors]
    renames = [
        (_parse_user_path(old, "rename"), _parse_user_path(new, "rename"), old)
        for old, new in rename.items()
    ]
    new_name: dict[str, str] = {}
    used: set[str] = set()
    for t, p in zip(header.tensors, stored_paths):
        best = None
        for old, new, text in renames:
            if _starts_with(p, old) and (best is None or len(old) > len(best[0])):
                best = (old, new, text)
        if best is None:
            new_name[t.name] = t.name
        else:
            new_name[t.name] = keystr((*best[1], *p[len(best[0]) :]))
            used.add(best[2])
    unused = [text for _, _, text in renames if text not in used]
    if unused:
        close = difflib.get_close_matches(unused[0], [t.name for t in header.tensors], n=1)
        raise ValueError(
            f"rename: {unused[0]} names no leaf or subtree of the checkpoint {header.path}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    by_new: dict[str, TensorInfo] = {}
    for t in header.tensors:
        n = new_name[t.name]
        if n in by_new:
            raise ValueError(
                f"rename: {by_new[n].name} and {t.name} would both become {n} in {header.path}"
            )
        by_new[n] = t
    like_paths = like_spec.paths
    optional = [_parse_user_path(a, "allow_missing") for a in allow_missing]
    for text, p in zip(allow_missing, optional):
        if not any(_starts_with(lp, p) for lp in like_paths):
            raise ValueError(f"allow_missing: {text} names no leaf or subtree of `like`")
    sources: list[str | None] = []
    stored_flat: dict[str, LeafSpec] = {}
    like_flat: dict[str, LeafSpec] = {}
    for i, (lname, lpath, rec) in enumerate(zip(like_names, like_paths, like_spec.records)):
        if lname in by_new:
            t = by_new[lname]
            sources.append(t.name)
            stored_flat[lname] = LeafSpec(t.shape, t.dtype)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
        elif any(_starts_with(lpath, p) for p in optional):
            ref = like_leaves[i] if like_leaves is not None else None
            if ref is None or isinstance(ref, (LeafSpec, jax.ShapeDtypeStruct)):
                raise ValueError(
                    f"allow_missing: {lname} is absent from {header.path} and `like` holds no "
                    "value to keep there; pass a `like` tree with arrays"
                )
            sources.append(None)
        else:
            sources.append(None)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
    for n, t in by_new.items():
        if n not in like_flat:
            stored_flat[n] = LeafSpec(t.shape, t.dtype)
    found = [
        dataclasses.replace(m, path=parse(m.path)[0][1])
        for m in mismatches(spec_of(stored_flat), spec_of(like_flat))
    ]
    if found:
        raise TreeMismatchError(
            found,
            expected_from="`like`",
            actual_from="the checkpoint (after rename)",
            context=header.path,
        )
    return sources


def _plain(node: Node, leaves: Iterator[Any]) -> Any:
    """Plain containers of a stored structure; custom nodes become dicts."""
    if node.kind == "leaf":
        return next(leaves)
    if node.kind == "none":
        return None
    kids = [(e, _plain(c, leaves)) for e, c in zip(node.entries, node.children)]
    if node.kind == "list":
        return [k for _, k in kids]
    if node.kind == "tuple":
        return tuple(k for _, k in kids)
    return {e[1]: k for e, k in kids}


def _as_like(arr: np.ndarray[Any, Any], ref: Any) -> Any:
    """A loaded array in the form of ``like``'s leaf at the same path."""
    if isinstance(ref, jax.Array):
        if getattr(ref, "weak_type", False):
            return _weak(arr, ref.sharding)
        return jax.device_put(arr, ref.sharding)
    if isinstance(ref, jax.ShapeDtypeStruct) and ref.sharding is not None:
        return jax.device_put(arr, ref.sharding)
    if isinstance(ref, np.generic):
        return arr[()]
    if isinstance(ref, (bool, int, float, complex)):
        return type(ref)(arr.item())
    return arr


def _weak(arr: np.ndarray[Any, Any], sharding: Any) -> Any:
    """A weakly typed jax array with ``arr``'s value (JAX's scalar promotion type)."""
    if arr.ndim == 0:
        candidate = jax.numpy.asarray(arr.item())
        if candidate.dtype == arr.dtype and candidate.weak_type:
            return jax.device_put(candidate, sharding)
    placed = jax.device_put(arr, sharding)
    try:  # JAX has no public way to make a weakly typed array of a given value
        from jax._src.lax.lax import _convert_element_type

        return _convert_element_type(placed, placed.dtype, weak_type=True)
    except (ImportError, TypeError, AttributeError):  # pragma: no cover - JAX moved it
        return placed


# -- specs from files -------------------------------------------------------


def spec_reader(path: str | os.PathLike[str], /) -> TreeSpec | None:
    """The spec in a checkpoint or any safetensors file; None for other files.

    Registered with the CLI so that ``treeguard spec`` and ``treeguard diff``
    read checkpoints as well as spec JSON.

    Raises:
      FormatError: for a file that looks like safetensors but is broken.
    """
    try:
        fd, name = _open(path)
    except FormatError:
        raise
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        head = bytearray(9)
        if size < 10 or _pread_into(fd, memoryview(head), 0) != 9 or head[8:9] != b"{":
            return None
        n = int.from_bytes(head[:8], "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return None
        doc, _, _ = _read_raw_header(fd, name)
        meta = doc.get("__metadata__")
        if isinstance(meta, dict) and _K_FORMAT in meta:
            return _parse_header(fd, name).spec
        return _foreign_spec(doc, name)
    finally:
        os.close(fd)


def _foreign_spec(doc: dict[str, Any], name: str) -> TreeSpec:
    """A flat dict spec for a safetensors file written by another tool."""
    leaves: dict[str, LeafSpec] = {}
    for tensor, entry in doc.items():
        if tensor == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise FormatError(f"{name}: tensor {tensor!r}: entry is not a JSON object")
        st = entry.get("dtype")
        if st not in _FOREIGN:
            raise FormatError(f"{name}: tensor {tensor!r}: unknown dtype {st!r}")
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise FormatError(f"{name}: tensor {tensor!r}: bad shape {shape!r}")
        leaves[tensor] = LeafSpec(tuple(shape), dtype_of(_FOREIGN[st]))
    return spec_of(leaves)


def spec_from_file(path: str | os.PathLike[str], /) -> TreeSpec:
    """Reads a contract from a spec JSON file, a checkpoint's header or any
    safetensors file (whose tensors become a flat dict keyed by name).

    Args:
      path: the file.

    Returns:
      The ``TreeSpec``.

    Raises:
      FormatError: if the file is none of these.
      OSError: if it cannot be read.

    Example:
      >>> import os, tempfile, numpy as np
      >>> d = tempfile.mkdtemp()
      >>> save(os.path.join(d, "c.safetensors"), {"w": np.ones(2, np.int8)})
      >>> spec_from_file(os.path.join(d, "c.safetensors"))
      TreeSpec({'w': i8[2]})
    """
    spec = spec_reader(path)
    if spec is not None:
        return spec
    if os.path.islink(os.fspath(path)):
        raise FormatError(f"{os.fspath(path)}: is a symbolic link; treeguard never follows links")
    return TreeSpec.load(path)
