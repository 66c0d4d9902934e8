"""``save``: a tree to one hashed checkpoint file, atomically.

Every key path is checked to read back exactly before anything is written:
``parse(keystr(path))`` must give the same entries, of the same key types,
so a tensor name is never ambiguous and ``load`` never mis-assigns a leaf.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from ..atomic import atomic_write, remove_stale_temps, write_all
from ..bounded import Bounded
from ..env import environment
from ..errors import InvalidTreeError
from ..hashing import DEFAULT, Algorithm, check_algorithm, copy_hashed, write_hashed
from ..hashing import digest as digest_of
from ..keydtype import KEY_DTYPES, is_key_dtype, key_data
from ..leaf import Record, summarize
from ..paths import has_surrogate, int_digits, keystr, short_repr
from ..spec import TreeSpec, spec_from_leaves
from ..strictjson import MAX_DEPTH, MAX_INT_DIGITS
from ..surgery import METADATA_KEY, Surgery
from ..walk import Node, flatten_with_types, key_problems, structure_of
from .format import ALLOWED_DTYPES, draft_meta, encode_header, signed_meta, stored_layout
from .readback import check_readable
from .restore import buffer

#: The layouts kept for the next save of the same tree: the last
#: ``KEPT_LAYOUTS``, each of a header of at most ``KEPT_LAYOUT_BYTES`` (what
#: a layout holds as Python objects is several times its header's bytes).
KEPT_LAYOUTS = 4
KEPT_LAYOUT_BYTES = 256 * 1024
#: Fewer bytes than any leaf's entry in a header (name, table entry, digest).
_LEAF_HEADER_BYTES = 64

_KEY_HINT = (
    "use str or int dict keys (not enums, numpy scalars or other objects) and attribute "
    "names that are identifiers, each distinct within its node"
)


def _is_key_array(x: Any) -> bool:
    """Whether a leaf is a typed PRNG key array (``jax.random.key``)."""
    import jax

    return isinstance(x, jax.Array) and _is_key_dtype(x.dtype)


@functools.lru_cache(maxsize=256)
def _is_key_dtype(dtype: Any) -> bool:
    """Whether a jax array's dtype is a typed PRNG key's (asked per dtype)."""
    import jax

    return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))


def _known_key(x: Any) -> bool:
    return getattr(x.dtype, "name", None) in KEY_DTYPES


def _leaf_problem(x: Any, record: Record) -> str | None:
    """Why one leaf has no bytes to save, or None."""
    import jax

    if isinstance(x, jax.ShapeDtypeStruct):
        return (
            f"a jax.ShapeDtypeStruct ({summarize(tuple(x.shape), np.dtype(x.dtype))}) "
            "describes an array but holds no values"
        )
    if isinstance(x, np.ma.MaskedArray):
        return "a masked array; its mask would be lost"
    if isinstance(x, int) and not isinstance(x, bool):
        dtype = record[1]
        info = np.iinfo(dtype)
        if not info.min <= x <= info.max:
            return f"a Python int outside the range of {dtype.name}, the dtype JAX gives it"
    return _dtype_problem(record[1])


@functools.lru_cache(maxsize=256)
def _dtype_problem(dtype: np.dtype[Any]) -> str | None:
    """Why leaves of ``dtype`` cannot be stored, or None (asked per dtype)."""
    if dtype.name not in ALLOWED_DTYPES and not is_key_dtype(dtype):
        return f"dtype {dtype.name} cannot be stored"
    return None


def _host_array(x: Any, record: Record, name: str) -> np.ndarray[Any, Any]:
    """One leaf as a C-contiguous native-order numpy array: gathered from any
    device or shards, never more than this one leaf in memory. A big-endian
    numpy array is written in native order (its values and dtype unchanged)."""
    import jax

    shape, dtype, _, _ = record
    if is_key_dtype(dtype):  # a typed PRNG key: its raw data, as the spec's key dtype
        return key_data(x, dtype)
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
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    if tuple(arr.shape) != tuple(shape) or arr.dtype != dtype.newbyteorder("="):
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


def bytes_of(arr: np.ndarray[Any, Any]) -> memoryview:
    """The bytes of a C-contiguous array, without a copy."""
    flat: Any = arr.reshape(-1).view(np.uint8)
    return memoryview(flat)


_META_HINT = "metadata holds JSON values only: str, finite numbers, bool, None, lists, dicts"


def _bad_metadata(value: Any, where: str) -> str | None:
    """Where in ``value`` the first value JSON cannot hold is, and why."""
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        v, at, depth = stack.pop()
        if depth > MAX_DEPTH - 8:
            return "metadata: nested too deeply, or it contains itself"
        if isinstance(v, Mapping):
            for k, child in reversed(list(v.items())):
                if not isinstance(k, str):
                    return f"{at}[{short_repr(k)}]: keys must be str, not {type(k).__name__}"
                if has_surrogate(k):
                    return f"{at}[{k!r}]: a key with a lone surrogate has no UTF-8 form"
                stack.append((child, f"{at}[{k!r}]", depth + 1))
        elif isinstance(v, (list, tuple)):
            stack.extend((c, f"{at}[{i}]", depth + 1) for i, c in reversed(list(enumerate(v))))
        elif isinstance(v, float) and not math.isfinite(v):
            return f"{at}: {v!r} has no JSON form"
        elif isinstance(v, int) and not isinstance(v, bool) and int_digits(v) > MAX_INT_DIGITS:
            return f"{at}: an integer of {int_digits(v)} digits is too long to read back"
        elif isinstance(v, str):
            if has_surrogate(v):
                return f"{at}: a string with a lone surrogate has no UTF-8 form"
        elif not (v is None or isinstance(v, (bool, int, float))):
            return f"{at}: an object of type {type(v).__name__} has no JSON form"
    return None


def with_surgery(metadata: Mapping[str, Any] | None, surgery: Surgery | None) -> Any:
    """The caller's metadata with a surgery report added under its key.

    Raises:
      ValueError: if the metadata already holds that key.
    """
    if surgery is None:
        return metadata
    if metadata is not None and METADATA_KEY in metadata:
        raise ValueError(f"metadata already holds {METADATA_KEY!r}; pass the report once")
    return {**(metadata or {}), METADATA_KEY: surgery.to_json()}


def user_metadata_json(metadata: Mapping[str, Any] | None) -> str:
    """The caller's metadata as canonical JSON text, validated.

    Args:
      metadata: the metadata given to ``save`` or ``ArtifactStore.put``.

    Returns:
      The JSON text (``"{}"`` for None).

    Raises:
      TypeError: naming the key path of the first value JSON cannot hold
        (an object, a set, NaN or infinity, a key that is not a str, a
        string with a lone surrogate).

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
            f"metadata must be a mapping with str keys, got {type(metadata).__name__}"
            f"\nhint: {_META_HINT}"
        )
    found = _bad_metadata(metadata, "metadata")
    if found:
        raise TypeError(f"{found}\nhint: {_META_HINT}")
    try:
        return json.dumps(dict(metadata), sort_keys=True, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as e:  # a cycle, or a subclass's odd form
        raise TypeError(f"metadata is not JSON-serialisable: {e}\nhint: {_META_HINT}") from None


def save(
    path: str | os.PathLike[str],
    tree: Any,
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
    digest: Algorithm = DEFAULT,
    surgery: Surgery | None = None,
) -> None:
    """Writes a tree to one checkpoint file, atomically, with a hash per tensor.

    The bytes are streamed from each leaf's own buffer into a temp file in
    the same directory, chunk by chunk, while the hashing engine hashes the
    chunk written last (one pass over the data); the file is fsynced once,
    renamed over ``path`` and the directory fsynced once. A crash at any moment
    leaves the previous file at ``path`` untouched, and two savers to one
    path leave one whole file or the other, never a mix. Arrays on any
    device, and sharded arrays, are gathered one leaf at a time. Checkpoints
    are little-endian: a big-endian numpy leaf is written in that order, its
    values and dtype unchanged (byte order is not part of a contract).

    Args:
      path: the file to write (by convention ``*.safetensors``).
      tree: a pytree of arrays (jax, numpy, Python numbers); any registered
        nodes (flax.nnx State, equinox modules, namedtuples, dataclasses).
      metadata: JSON-serialisable data to keep in the header, read back by
        ``read_header(path).metadata``.
      digest: the hash algorithm of the tensors and the header: ``"blake3"``
        (the default) or ``"sha256"`` (for readers that predate BLAKE3
        digests). Either is verified by ``load``.
      surgery: the ``Surgery`` report of the load the tree came from; it is
        kept in the metadata under ``"treeguard.surgery"``, so the file
        records which of its leaves were initialised, renamed or dropped.

    Raises:
      InvalidTreeError: for leaves that are not arrays or hold no values
        (``jax.ShapeDtypeStruct``), typed PRNG keys of an implementation
        other than threefry2x32, rbg and unsafe_rbg, Python ints out of
        their dtype's range, keys that would not read back from a tensor name
        (enums, numpy scalars, lone surrogates, two keys that print alike),
        or arrays spread over several processes; each named by path. Also
        (at ``<root>``) for a tree whose header every read would refuse as
        over its budget of objects (very many containers and keys each of
        their own, or a large ``metadata``), before a byte is written.
      TypeError: if ``metadata`` is not JSON-serialisable, naming the key.
      ValueError: for a ``digest`` other than ``"blake3"`` and ``"sha256"``.
      OSError: if the file cannot be written; ``path`` is then unchanged.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> path = os.path.join(tempfile.mkdtemp(), "params.safetensors")
      >>> save(path, {"dense1": {"w": jnp.ones((2, 3), jnp.bfloat16)}})
      >>> import safetensors.numpy
      >>> list(safetensors.numpy.load_file(path))
      ["['dense1']['w']"]
    """
    write_checkpoint(path, tree, metadata=metadata, digest=digest, surgery=surgery)


def write_checkpoint(
    path: str | os.PathLike[str],
    tree: Any,
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
    digest: Algorithm = DEFAULT,
    surgery: Surgery | None = None,
    threads: int | None = None,
    flush_every: int | None = None,
    structure: Node | None = None,
) -> None:
    """``save``, with ``threads`` bounding the threads that hash (None: every
    core; a background save passes 1) and ``flush_every`` as for
    ``write_hashed`` (a background save syncs as it goes). With
    ``structure`` (a stored spec's, whose classes need not be imported),
    ``tree`` is the list of its leaves in flatten order, recorded under it."""
    target = os.fspath(path)
    draft = _draft(tree, metadata, digest, surgery, structure)

    def write(fd: int) -> None:
        write_all(fd, draft.start())
        digests = write_hashed(
            fd, draft.leaf_bytes(), draft.algorithm, threads=threads, flush_every=flush_every
        )
        os.pwrite(fd, draft.header(digests), 8)

    dirname, base = os.path.split(os.path.abspath(target))
    remove_stale_temps(dirname, base)
    atomic_write(target, write)


def checkpoint_bytes(
    tree: Any, /, *, metadata: Mapping[str, Any] | None = None, digest: Algorithm = DEFAULT
) -> memoryview:
    """The bytes ``save`` would write, built in memory: each leaf is copied
    once, chunk by chunk, into one buffer while the hashing engine hashes
    the chunks copied before (for an upload, which needs the whole object).

    Args:
      tree: a pytree of arrays, as for ``save``.
      metadata: JSON-serialisable data to keep in the header.
      digest: the hash algorithm, ``"blake3"`` or ``"sha256"``.

    Returns:
      The checkpoint's bytes.

    Raises:
      InvalidTreeError, TypeError, ValueError: as ``save``.

    Example:
      >>> import os, tempfile
      >>> import jax.numpy as jnp, numpy as np
      >>> from treeguard import save
      >>> tree = {"a": np.arange(6, dtype=np.int8).reshape(2, 3), "b": [jnp.ones(3), np.float32(2)]}
      >>> path = os.path.join(tempfile.mkdtemp(), "f.safetensors")
      >>> for algorithm in ("blake3", "sha256"):  # byte for byte the file save writes
      ...     _ = save(path, tree, metadata={"m": 1}, digest=algorithm)
      ...     data = checkpoint_bytes(tree, metadata={"m": 1}, digest=algorithm)
      ...     with open(path, "rb") as f:
      ...         print(bytes(data) == f.read())
      True
      True
    """
    draft = _draft(tree, metadata, digest, None)
    start = draft.start()
    out = memoryview(buffer(len(start) + draft.nbytes).data)
    out[: len(start)] = start
    digests = copy_hashed(out[len(start) :], draft.leaf_bytes(), draft.algorithm)
    final = draft.header(digests)
    out[8 : 8 + len(final)] = final
    return out


@dataclasses.dataclass(frozen=True)
class Draft:
    """A checked tree laid out as a checkpoint: its header with placeholder
    digests, and each leaf's bytes still in the leaf; ``spec``, the spec
    the header holds."""

    leaves: Sequence[Any]
    records: Sequence[Record]
    names: Sequence[str]
    meta: Mapping[str, str]
    table: Mapping[str, Any]
    algorithm: Algorithm
    draft: bytes
    nbytes: int
    spec: TreeSpec

    def start(self) -> bytes:
        """The header's length and the header, digests left blank."""
        return len(self.draft).to_bytes(8, "little") + self.draft

    @property
    def file_bytes(self) -> int:
        """The size of the checkpoint file."""
        return 8 + len(self.draft) + self.nbytes

    def leaf_bytes(self) -> Iterator[memoryview]:
        return _leaf_bytes(self.leaves, self.records, self.names)

    def prefetch(self, i: int) -> None:
        """Starts copying leaf ``i`` from its device to the host."""
        _start_copy(self.leaves[i])

    def host_bytes(self, i: int) -> memoryview:
        """Leaf ``i``'s bytes, brought to the host (no copy for a leaf there)."""
        return bytes_of(_host_array(self.leaves[i], self.records[i], self.names[i]))

    def header(self, digests: Sequence[str]) -> bytes:
        """The header with every leaf's digest and the header's own."""
        meta = signed_meta(self.meta, self.table, dict(zip(self.names, digests)))
        final = encode_header(meta, self.table)
        if len(final) != len(self.draft):  # pragma: no cover - hex digests have fixed length
            raise AssertionError("header length changed while saving")
        return final


def laid_out(
    tree: Any, /, *, metadata: Mapping[str, Any] | None = None, digest: Algorithm = DEFAULT
) -> Draft:
    """A tree checked for ``save`` and laid out as a checkpoint without its
    bytes: its header but for the digests, which ``Draft.header`` fills in,
    and each leaf's bytes still in the leaf (``Draft.host_bytes``).

    Raises:
      InvalidTreeError, TypeError, ValueError: as ``save``.
    """
    return _draft(tree, metadata, digest, None)


def _draft(
    tree: Any,
    metadata: Mapping[str, Any] | None,
    digest: Algorithm,
    surgery: Surgery | None,
    structure: Node | None = None,
) -> Draft:
    """Checks a tree for ``save`` (every problem at once) and lays it out."""
    algorithm = check_algorithm(digest)
    leaves, treedef, types = flatten_with_types(tree)  # the one walk of the tree
    # from the cache by treedef and the key types met (so {1: x} and {True: x},
    # which share one treedef, each keep their own keys)
    root = structure_of(tree, treedef, types) if structure is None else structure
    if root.num_leaves != len(leaves):
        raise ValueError(f"{len(leaves)} leaves for a structure of {root.num_leaves}")
    problems = _key_problems(root)
    if problems:
        raise InvalidTreeError(list(problems), hint=_KEY_HINT)
    keys = [i for i, x in enumerate(leaves) if _is_key_array(x) and not _known_key(x)]
    if keys:  # a spec holds only the key implementations keydtype.py knows
        paths = root.leaf_paths()
        raise InvalidTreeError(
            [
                (
                    keystr(paths[i]),
                    f"typed PRNG key array of unknown implementation {leaves[i].dtype}",
                )
                for i in keys
            ],
            hint="save the raw key bits with jax.random.key_data(key) and rewrap on load",
        )
    records = tuple(spec_from_leaves(tree, leaves, treedef, types).records)
    bad = [(i, p) for i, (x, r) in enumerate(zip(leaves, records)) if (p := _leaf_problem(x, r))]
    if bad:
        paths = root.leaf_paths()
        raise InvalidTreeError(
            [(keystr(paths[i]), problem) for i, problem in bad],
            hint="store numeric arrays with values (jax.random.key_data(k) for typed keys, "
            "np.int64 arrays for large ints)",
        )
    user = user_metadata_json(with_surgery(metadata, surgery))
    env = json.dumps(environment())
    names, table, meta, draft, nbytes, spec = _kept_layout(root, records, user, algorithm, env)
    return Draft(leaves, records, names, meta, table, algorithm, draft, nbytes, spec)


@functools.lru_cache(maxsize=64)
def _key_problems(root: Node) -> tuple[tuple[str, str], ...]:
    """``key_problems`` of a structure, kept per structure (a ``Node`` is
    compared by identity, and ``structure_of`` hands back one per treedef)."""
    return tuple(key_problems(root))


#: What a draft's header holds but its digests: each leaf's name, the
#: tensor table, the metadata, the header, the tensors' bytes and the spec.
_Layout: TypeAlias = tuple[
    tuple[str, ...], Mapping[str, Any], Mapping[str, str], bytes, int, TreeSpec
]


def _layout(
    root: Node, records: tuple[Record, ...], user: str, algorithm: Algorithm, env: str
) -> _Layout:
    """A draft's header laid out from its structure, its leaves' records,
    its metadata's JSON, the algorithm and the environment's JSON alone,
    its parts only read (``Draft.header`` builds new ones)."""
    spec = TreeSpec(root, list(records))
    names = tuple(keystr(p) for p in spec.paths)
    if len(set(names)) != len(names):  # pragma: no cover - key_problems makes names distinct
        raise InvalidTreeError([("", "two leaves share one key path")], hint=_KEY_HINT)
    table: dict[str, Any] = {}
    pos = 0
    for leaf_name, (shape, dtype, _, _) in zip(names, records):
        nbytes = math.prod(int(d) for d in shape) * dtype.itemsize
        st_dtype, st_shape = stored_layout(tuple(int(d) for d in shape), dtype)
        table[leaf_name] = {
            "dtype": st_dtype,
            "shape": st_shape,
            "data_offsets": [pos, pos + nbytes],
        }
        pos += nbytes
    spec_json = spec.to_json(indent=None).rstrip("\n")
    meta = draft_meta(spec_json, algorithm, env, user, names)
    header = encode_header(meta, table)
    check_readable(header, root)  # before a byte is written: one a reader takes
    return names, table, meta, header, pos, spec


_kept: Bounded[tuple[Any, ...], _Layout] = Bounded(KEPT_LAYOUTS)


def _kept_layout(
    root: Node, records: tuple[Record, ...], user: str, algorithm: Algorithm, env: str
) -> _Layout:
    """``_layout``, kept for the next tree of the same (a training run's
    checkpoints, a store's puts of fine-tunes: the same layout each time)
    when its header is small (``KEPT_LAYOUT_BYTES``; a larger one costs
    more to keep than its layout costs to make, beside its tensors)."""
    if len(records) * _LEAF_HEADER_BYTES > KEPT_LAYOUT_BYTES:
        return _layout(root, records, user, algorithm, env)
    key = (root, records, user, algorithm, env)
    kept = _kept.get(key)
    if kept is not None:
        return kept
    out = _layout(*key)
    if len(out[3]) <= KEPT_LAYOUT_BYTES:
        _kept.put(key, out)
    return out


def _leaf_bytes(
    leaves: Sequence[Any], records: Sequence[Record], names: Sequence[str]
) -> Iterator[memoryview]:
    """Each leaf's bytes, brought to the host only when its turn comes; the
    next leaf's copy from its device starts (``copy_to_host_async``) before
    this one's bytes are handed over, so the transfer runs while they are
    written and hashed, and no more than two leaves are on the host at once.

    Leaves already on the host (numpy, CPU jax arrays) are not copied.
    """
    for i, (x, record, leaf_name) in enumerate(zip(leaves, records, names)):
        arr = _host_array(x, record, leaf_name)
        if i + 1 < len(leaves):
            _start_copy(leaves[i + 1])
        yield bytes_of(arr)


def _start_copy(x: Any) -> None:
    """Starts copying a device array to the host (a no-op for anything else)."""
    start = getattr(x, "copy_to_host_async", None)
    if start is not None and getattr(x, "is_fully_addressable", False):
        start()


def leaf_digests(tree: Any, /, *, digest: Algorithm = DEFAULT) -> tuple[TreeSpec, dict[str, str]]:
    """The spec of a tree and the digest of each leaf's bytes, exactly as
    ``save`` would record them in a checkpoint's header, without writing.

    Args:
      tree: a pytree of arrays.
      digest: ``"blake3"`` or ``"sha256"``.

    Returns:
      ``(spec, {tensor name: hex digest})``, in flatten order.

    Raises:
      InvalidTreeError: for a leaf that is not an array or holds no values.

    Example:
      >>> import numpy as np
      >>> spec, found = leaf_digests({"x": np.zeros(2, np.float32)})
      >>> spec, list(found), len(found["['x']"])
      (TreeSpec({'x': f32[2]}), ["['x']"], 64)
    """
    algorithm = check_algorithm(digest)
    leaves, treedef, types = flatten_with_types(tree)
    spec = spec_from_leaves(tree, leaves, treedef, types)
    names = [keystr(p) for p in spec.paths]
    problems = [
        (n, problem)
        for x, n, r in zip(leaves, names, spec.records)
        if (problem := _leaf_problem(x, r)) is not None
    ]
    if problems:
        raise InvalidTreeError(problems, hint="keep only numeric arrays in the tree")
    found = {
        n: digest_of(bytes_of(_host_array(x, r, n)), algorithm)
        for x, n, r in zip(leaves, names, spec.records)
    }
    return spec, found
