"""Reading checkpoints: ``read_header``, ``verify_file`` and ``load``.

Each reader opens the file once and reads everything through that one
descriptor: the header, the optional ``expect_digest`` comparison, the
contract check against ``like`` and only then the tensors, each straight
into its final numpy buffer while ``hashing.read_spans`` hashes the chunks
already read. No tree is returned before every hash matched.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from ..diff import mismatches
from ..errors import FormatError, IntegrityError, InvalidTreeError, TreeMismatchError, cap_lines
from ..hashing import HEX_RE, ShortRead, Span, hash_ranges, pread_into, read_verified
from ..keydtype import is_key_dtype, wrap_keys
from ..mismatch import Mismatch
from ..paths import keystr
from ..spec import TreeSpec, spec_of
from ..walk import Node, flatten
from .files import open_checkpoint, read_raw_header
from .foreign import (
    Unverified,
    check_unverified,
    foreign_header,
    is_foreign,
    load_foreign,
)
from .format import (
    K_FORMAT,
    MAX_HEADER_BYTES,
    Header,
    TensorInfo,
    header_from_doc,
)
from .migrate import migrate
from .names import NamingRule

#: Each loaded array starts at a multiple of this in the shared buffer.
_ALIGN = 64
#: Loads of at least this many bytes go into an anonymous mapping.
_MAPPED = 64 * 1024 * 1024
_RESTORE_HINT = "restore the file from a verified copy (ArtifactStore.rollback) or save it again"


def _parse_header(fd: int, name: str, expect_digest: str | None = None) -> Header:
    doc, header_bytes, size = read_raw_header(fd, name)
    return _checked_header(doc, header_bytes, size, name, expect_digest)


def _checked_header(
    doc: dict[str, Any], header_bytes: int, size: int, name: str, expect_digest: str | None
) -> Header:
    header = header_from_doc(doc, header_bytes, size, name)
    if expect_digest is not None and header.digest != expect_digest:
        raise IntegrityError(
            f"the file changed since its digest was recorded: header digest "
            f"{header.digest[:12]}… in the file, {expect_digest[:12]}… recorded",
            context=name,
            path="__metadata__",
            hint=_RESTORE_HINT,
        )
    return header


def _check_expect_digest(expect_digest: Any) -> None:
    if expect_digest is None:
        return
    if not isinstance(expect_digest, str) or not HEX_RE.match(expect_digest):
        shown = type(expect_digest).__name__ if not isinstance(expect_digest, str) else "text"
        raise ValueError(f"expect_digest is a hex digest (64 lowercase hex digits), got {shown}")


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
      >>> from treeguard import save
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones((2, 3), np.float32)}, metadata={"step": 7})
      >>> h = read_header(path)
      >>> h.spec, h.metadata, h.tensors[0].summary()
      (TreeSpec({'w': f32[2,3]}), {'step': 7}, 'f32[2,3]')
    """
    fd, name = open_checkpoint(path)
    try:
        return _parse_header(fd, name)
    finally:
        os.close(fd)


def _read_tensors(
    fd: int,
    header: Header,
    wanted: Collection[str],
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """Reads the wanted tensors and verifies every hash.

    All tensors land in one buffer allocated at once, each at a 64-byte
    aligned offset and viewed as its own array (so the arrays of one load
    share one allocation, freed when the last of them is). The file is read
    in order, chunk by chunk, straight into that buffer while the hashing
    engine hashes the chunks already read.

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its hash.
      FormatError: if the file shrinks while it is read.
    """
    todo = [t for t in header.tensors if t.name in wanted]
    offsets: list[int] = []
    pos = 0
    for t in todo:
        pos = (pos + _ALIGN - 1) // _ALIGN * _ALIGN
        offsets.append(pos)
        pos += t.nbytes
    base = _buffer(pos)
    whole = memoryview(base.data)
    spans = [
        Span(header.data_start + t.begin, whole[off : off + t.nbytes], t.digest)
        for t, off in zip(todo, offsets)
    ]
    _verify_spans(fd, header, todo, spans, progress)
    out: dict[str, Any] = {}
    for t, off in zip(todo, offsets):
        arr = base[off : off + t.nbytes].view(t.dtype).reshape(t.shape)
        out[t.name] = wrap_keys(arr) if is_key_dtype(t.dtype) else arr
    return out


def _verify_spans(
    fd: int,
    header: Header,
    todo: Sequence[TensorInfo],
    spans: Sequence[Span],
    progress: Callable[[int, int], None] | None,
) -> None:
    """Reads and hashes the spans of ``todo``'s tensors; raises for every mismatch."""
    try:
        wrong = read_verified(fd, spans, header.hash_name, progress=progress)
    except ShortRead as e:
        raise FormatError(
            f"tensor {todo[e.index].name or '<root>'}: the file was truncated while it was read",
            context=header.path,
            hint=_RESTORE_HINT,
        ) from None
    bad = [(todo[i], found) for i, found in wrong]
    if bad:
        raise _integrity_error(header.path, header.hash_name, bad)


def _buffer(nbytes: int) -> np.ndarray[Any, Any]:
    """A fresh byte buffer; a large one is an anonymous mapping whose pages
    the kernel fills in at once (``MAP_POPULATE``: measured 1.6x to 5x
    faster here than faulting them in one by one during the reads; numpy
    would ask for huge pages, which can stall a whole load while the kernel
    compacts memory)."""
    if nbytes < _MAPPED:
        return np.empty(max(nbytes, 1), np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)


def _integrity_error(
    name: str, algorithm: str, bad: Sequence[tuple[TensorInfo, str]]
) -> IntegrityError:
    n = len(bad)
    lines = [f"{n} tensor{'s' if n > 1 else ''} corrupt ({algorithm} mismatch):"]
    lines += cap_lines(
        [
            f"  {t.name or '<root>'}: {t.summary()}: {algorithm} {actual[:12]}… of the bytes "
            f"read, {t.digest[:12]}… recorded in the header"
            for t, actual in bad
        ]
    )
    return IntegrityError(
        "\n".join(lines),
        path=bad[0][0].name,
        context=name,
        hint="the file was changed after it was saved; " + _RESTORE_HINT,
    )


def verify_file(
    path: str | os.PathLike[str],
    /,
    *,
    like: Any = None,
    progress: Callable[[int, int], None] | None = None,
    expect_digest: str | None = None,
) -> Header:
    """Checks a checkpoint completely without keeping its data: the header,
    the contract (when ``like`` is given) and every tensor's hash.

    Memory stays at a few chunk buffers whatever the file's size.

    Args:
      path: the checkpoint.
      like: a tree or ``TreeSpec`` the checkpoint must match exactly.
      progress: called as ``progress(bytes_done, bytes_total)`` while hashing.
      expect_digest: the header digest recorded when the file was verified
        (``Header.digest``); the file read must carry exactly this digest,
        checked before any tensor is read.

    Returns:
      The validated ``Header``.

    Raises:
      FormatError: for a malformed, truncated or foreign file.
      TreeMismatchError: listing every difference from ``like``, before any
        data is read.
      IntegrityError: naming every tensor whose bytes do not match, or if
        the header digest is not ``expect_digest``.
      ValueError: if ``expect_digest`` is not a hex digest.

    Example:
      >>> import os, tempfile, numpy as np
      >>> from treeguard import save
      >>> path = os.path.join(tempfile.mkdtemp(), "p.safetensors")
      >>> save(path, {"w": np.ones(3, np.float32)})
      >>> verify_file(path, like={"w": np.zeros(3, np.float32)}).spec.num_leaves
      1
    """
    _check_expect_digest(expect_digest)
    fd, name = open_checkpoint(path)
    try:
        header = _parse_header(fd, name, expect_digest)
        if like is not None:
            like_spec = like if isinstance(like, TreeSpec) else spec_of(like)
            found = _contract_mismatches(header.spec, like_spec)
            if found:
                raise TreeMismatchError(
                    found, expected_from="`like`", actual_from="the checkpoint", context=name
                )
        ranges = [(header.data_start + t.begin, t.nbytes) for t in header.tensors]
        try:
            digests = hash_ranges(fd, ranges, header.hash_name, progress=progress)
        except ShortRead:
            raise FormatError(
                "the file was truncated while it was verified", context=name, hint=_RESTORE_HINT
            ) from None
        bad = [(t, d) for t, d in zip(header.tensors, digests) if d != t.digest]
        if bad:
            raise _integrity_error(name, header.hash_name, bad)
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
    expect_digest: str | None = None,
    names: NamingRule | None = None,
    unverified: Unverified = "refuse",
) -> Any:
    """Reads a checkpoint, verified: header, then contract, then every hash.

    In order: the header is read and validated against the file's size (and
    its digest compared with ``expect_digest`` when given); the stored spec
    is compared with ``like`` and every mismatch is reported before any
    array data is read; every tensor is read and its hash checked; only then
    is the tree built. Leaves are matched by key path, never by position,
    and nothing is cast.

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
        Neither option relaxes anything else: leaf shapes and dtypes and the
        type of every container on both sides are still compared.
      expect_digest: the header digest recorded when the file was verified
        (``Header.digest``); the file read must carry exactly this digest,
        checked on the same open file before any array is read.
      names: for a safetensors file another tool wrote (a *foreign* file),
        how a key path of ``like`` names its tensor: ``"keypath"`` (the
        default, ``['encoder']['layer'][0]['weight']``), ``"dotted"``
        (``encoder.layer.0.weight``), ``"slashed"``
        (``encoder/layer/0/weight``) or a function from the leaf's keys (a
        tuple of str and int) to the name. With ``like=None`` the tree is
        nested by the names (numeric components become string keys). Not
        used for a treeguard checkpoint, whose names are its key paths.
      unverified: what to do with a foreign file, which holds no hashes:
        ``"refuse"`` (the default) raises ``FormatError``; ``"warn"`` loads it
        and emits ``UnverifiedWeightsWarning`` naming the file; ``"allow"``
        loads it on purpose, silently. The header's structure (offsets,
        sizes, dtypes) and the match of names, shapes and dtypes with
        ``like`` are checked either way, before any tensor is read.

    Returns:
      The tree.

    Raises:
      FormatError: for a file that is not a treeguard checkpoint (a foreign
        safetensors file unless ``unverified`` lets it through), is a
        symbolic link, truncated, oversized or malformed.
      TreeMismatchError: listing every difference between the checkpoint
        and ``like`` (for a foreign file: every missing and unexpected
        tensor name, shape and dtype), raised before any array data is read.
      IntegrityError: naming every tensor whose bytes do not match its
        hash, or if the header digest is not ``expect_digest``.
      ValueError: for a ``rename`` or ``allow_missing`` path that names
        nothing, ``rename`` without ``like``, or a malformed ``expect_digest``.

    Example:
      >>> import os, tempfile, jax.numpy as jnp
      >>> from treeguard import save
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

      A safetensors file another tool wrote, matched by dotted names:

      >>> import numpy as np, safetensors.numpy
      >>> hf = os.path.join(os.path.dirname(path), "hf.safetensors")
      >>> safetensors.numpy.save_file({"dense2.w": np.ones((3, 1), np.float32)}, hf)
      >>> like = {"dense2": {"w": jnp.zeros((3, 1))}}
      >>> load(hf, like=like, names="dotted", unverified="allow")["dense2"]["w"].shape
      (3, 1)
    """
    if (rename or allow_missing) and like is None:
        raise ValueError("rename and allow_missing need `like`, the tree to migrate into")
    _check_expect_digest(expect_digest)
    fd, name = open_checkpoint(path)
    try:
        doc, header_bytes, size = read_raw_header(fd, name)
        if is_foreign(doc):
            fh = foreign_header(doc, header_bytes, size, name)
            check_unverified(unverified, name, stacklevel=2, expect_digest=expect_digest)
            return load_foreign(
                fd, fh, like, names or "keypath", rename or {}, allow_missing, expect_digest
            )
        header = _checked_header(doc, header_bytes, size, name, expect_digest)
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
            return _plain(root, iter([arrays[t.name] for t in header.tensors]))

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
        sources = migrate(header, like_spec, like_names, like_leaves, rename, allow_missing)

    def build(arrays: dict[str, np.ndarray[Any, Any]]) -> Any:
        import jax

        out: list[Any] = []
        for i, src in enumerate(sources):
            ref = like_leaves[i] if like_leaves is not None else None
            if src is None:
                out.append(ref)
                continue
            out.append(_as_like(arrays.pop(src), ref))
        if like_treedef is not None:
            return jax.tree.unflatten(like_treedef, out)
        try:
            treedef = like_spec.treedef
        except InvalidTreeError:
            return _plain(like_spec.structure, iter(out))
        return jax.tree.unflatten(treedef, out)

    return build


def _plain(node: Node, leaves: Iterator[Any]) -> Any:
    """Plain containers of a stored structure; custom nodes become dicts.

    The leaves are taken in flatten order, the order the tensor names were
    matched in; a stored structure nests no deeper than ``walk.MAX_DEPTH``.
    """
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
    import jax

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
    import jax

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
        fd, name = open_checkpoint(path)
    except FormatError:
        raise
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        head = bytearray(9)
        if size < 10 or pread_into(fd, memoryview(head), 0) != 9 or head[8:9] != b"{":
            return None
        n = int.from_bytes(head[:8], "little")
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return None
        doc, header_bytes, size = read_raw_header(fd, name)
        meta = doc.get("__metadata__")
        if isinstance(meta, dict) and K_FORMAT in meta:
            return header_from_doc(doc, header_bytes, size, name).spec
        return foreign_header(doc, header_bytes, size, name).spec
    finally:
        os.close(fd)


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
      >>> from treeguard import save
      >>> d = tempfile.mkdtemp()
      >>> save(os.path.join(d, "c.safetensors"), {"w": np.ones(2, np.int8)})
      >>> spec_from_file(os.path.join(d, "c.safetensors"))
      TreeSpec({'w': i8[2]})
    """
    spec = spec_reader(path)
    if spec is not None:
        return spec
    if os.path.islink(os.fspath(path)):
        raise FormatError(
            "is a symbolic link; treeguard never follows links",
            context=os.fspath(path),
            hint="pass the link's target path if you trust it",
        )
    return TreeSpec.load(path)
