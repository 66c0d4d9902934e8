"""Reading treeguard checkpoints: ``read_header``, ``verify_file`` and the
native half of ``load`` (``load.py`` opens a file and dispatches here or to
the foreign reader).

Each reader opens the file once and reads everything through that one
descriptor: the header, the optional ``expect_digest`` comparison, the
contract check against ``like`` (of the selected part, for a partial load)
and only then the selected tensors, each straight into its final numpy
buffer while ``hashing.read_spans`` hashes the chunks already read. No tree
is returned before every hash matched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np

from ..diff import mismatches
from ..errors import FormatError, IntegrityError, TreeMismatchError
from ..hashing import HEX_RE, Algorithm, ShortRead, Source, announce, hash_ranges, memo
from ..keydtype import is_key_dtype, wrap_keys
from ..mismatch import Mismatch
from ..spec import TreeSpec, spec_of
from ..surgery import Surgery
from . import staged
from .files import open_checkpoint, read_raw_header
from .format import Header, TensorInfo
from .header import header_from_doc
from .plan import LoadOptions, plan_load, select_part
from .restore import (
    RESTORE_HINT,
    as_like,
    build_like,
    integrity_error,
    packed,
    plain,
    read_ranges,
    walk_like,
)


def _parse_header(
    fd: Source, name: str, expect_digest: str | None = None, *, whole: bool = False
) -> Header:
    doc, header_bytes, size = read_raw_header(fd, name, whole=whole)
    return checked_header(doc, header_bytes, size, name, expect_digest)


def checked_header(
    doc: dict[str, Any], header_bytes: int, size: int, name: str, expect_digest: str | None
) -> Header:
    header = header_from_doc(doc, header_bytes, size, name)
    if expect_digest is not None and header.digest != expect_digest:
        raise IntegrityError(
            f"the file changed since its digest was recorded: header digest "
            f"{header.digest[:12]}… in the file, {expect_digest[:12]}… recorded",
            context=name,
            path="__metadata__",
            hint=RESTORE_HINT,
        )
    return header


def check_expect_digest(expect_digest: Any) -> None:
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
    check_expect_digest(expect_digest)
    fd, name = open_checkpoint(path)
    try:
        return verify_source(fd, name, like=like, progress=progress, expect_digest=expect_digest)
    finally:
        os.close(fd)


def verify_source(
    src: Source,
    name: str,
    *,
    like: Any = None,
    progress: Callable[[int, int], None] | None = None,
    expect_digest: str | None = None,
) -> Header:
    """``verify_file`` of a checkpoint read from ``src``: an open descriptor,
    or a ``RangeReader`` (an object in a bucket, hashed as it downloads);
    ``name`` is how messages name it."""
    header = _parse_header(src, name, expect_digest, whole=True)  # every byte is hashed
    if like is not None:
        like_spec = like if isinstance(like, TreeSpec) else spec_of(like)
        found = _contract_mismatches(header.spec, like_spec)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=name
            )
    ranges = spans(header, header.tensors)
    try:
        digests = hash_ranges(src, ranges, header.hash_name, progress=progress)
    except ShortRead:
        raise FormatError(
            "the file was truncated while it was verified", context=name, hint=RESTORE_HINT
        ) from None
    bad = [(t, d, t.digest) for t, d in zip(header.tensors, digests) if d != t.digest]
    if bad:
        raise integrity_error(name, header.hash_name, bad)
    return header


def load_source(  # noqa: PLR0917 - one call site, all positional data
    src: Source,
    name: str,
    like: Any,
    expect_digest: str | None,
    subtree: str | None,
    ignore: Collection[str],
) -> Any:
    """``load`` of a treeguard checkpoint read from ``src`` (a descriptor or
    a ``RangeReader``), without surgery: the header and its digest, the
    selection and the contract, then the selected tensors, every hash checked
    as they arrive."""
    check_expect_digest(expect_digest)
    whole = subtree is None and not ignore  # then every tensor is read, or nothing is
    header = _parse_header(src, name, expect_digest, whole=whole)
    options = LoadOptions(subtree=subtree, ignore=ignore)
    return load_native(src, header, like, options, announced=whole)[0]


def _contract_mismatches(stored: TreeSpec, like: TreeSpec) -> list[Mismatch]:
    """Mismatches between a stored spec and the expected one. Weak types are
    not compared: no file keeps them, and ``load`` gives each leaf ``like``'s."""
    return [m for m in mismatches(stored, like) if m.kind != "weak_type"]


def spans(header: Header, tensors: Sequence[TensorInfo]) -> list[tuple[int, int]]:
    """The ``(offset, length)`` of each tensor's bytes in the file, in order."""
    return [(header.data_start + t.begin, t.nbytes) for t in tensors]


def read_verified(
    fd: Source,
    header: Header,
    todo: Sequence[TensorInfo],
    into: Callable[[int], Any] | None = None,
) -> list[Any]:
    """Reads these tensors and verifies every hash: the one function a load
    reads checkpoint bytes with; each comes back as an array of its dtype,
    in a fresh buffer, or in ``into``'s (a staging buffer: ``staged``).

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its hash.
      FormatError: if the file shrinks while it is read.
    """
    raw = read_ranges(
        fd,
        todo,
        header.data_start,
        header.path,
        [t.digest for t in todo],
        header.hash_name,
        into=into,
    )
    out: list[Any] = []
    for t, b in zip(todo, raw):
        arr = b.view(t.dtype).reshape(t.shape)
        out.append(wrap_keys(arr) if is_key_dtype(t.dtype) else arr)
    return out


def load_native(
    fd: Source, header: Header, like: Any, options: LoadOptions, *, announced: bool = False
) -> tuple[Any, Surgery]:
    """``load`` of a treeguard checkpoint whose header was checked: the
    selection, then the contract, then the selected tensors, verified.
    Before they are read, their spans are announced to the source, unless
    the whole file was (``announced``: every tensor is read). Returns the
    tree and what was changed on the way."""
    part = select_part(header.spec, options, where=header.path)
    tensors = [header.tensors[i] for i in part.indices]
    if like is None:
        if not announced:
            announce(fd, spans(header, tensors))
        got = read_verified(fd, header, tensors)
        return plain(part.spec.structure, iter(got)), Surgery.of((), header.path)
    like_spec, like_leaves, like_treedef = walk_like(like)
    plan = plan_load(part, header.path, like_spec, like_leaves, options)
    wanted = sorted({k for k in plan.sources if k is not None})
    refs = like_leaves if like_leaves is not None else [None] * len(plan.sources)
    users: dict[int, list[int]] = {}
    for i, src in enumerate(plan.sources):
        if src is not None:
            users.setdefault(src, []).append(i)
    placed: dict[int, Any] = {}

    def place(batch: Sequence[int], arrays: Sequence[Any]) -> list[Any]:
        values = []
        for k, arr in zip(batch, arrays):
            for i in users[k]:
                placed[i] = as_like(arr, refs[i])
                values.append(placed[i])
        return values

    todo = [tensors[k] for k in wanted]
    if not announced:
        announce(fd, spans(header, todo))  # the plan, told to the source before any read
    stage = isinstance(fd, int) and staged.wanted(refs)
    read_placed(fd, header, todo, wanted, place, _on_devices(refs), stage=stage)
    _remember(header.hash_name, todo, [[placed[i] for i in users[k]] for k in wanted])
    out = [
        placed[i] if src is not None else plan.values.get(i, refs[i])
        for i, src in enumerate(plan.sources)
    ]
    return build_like(like_spec, like_treedef, out), plan.surgery


def _remember(
    algorithm: Algorithm, todo: Sequence[TensorInfo], given: Sequence[Sequence[Any]]
) -> None:
    """Tells the digest memo (``hashing/memo.py``) the digest of each device
    array a load hands back (``given``: the leaves made of each tensor of
    ``todo``), every byte of which was checked against it. Nothing is told
    when a numpy leaf came from the same read: its buffer is the one the jax
    arrays may share on the CPU, and numpy may write it."""
    if any(isinstance(x, np.ndarray) for leaves in given for x in leaves):
        return
    for t, leaves in zip(todo, given):
        for x in leaves:
            memo.remember(x, algorithm, t.digest, t.dtype, t.shape)


#: A load onto devices reads and verifies about this many bytes at a time,
#: and puts them on their devices before it reads the next.
DEVICE_BATCH = staged.SLOT


def _on_devices(refs: Sequence[Any]) -> bool:
    """Whether some leaf of ``like`` is placed on devices (a jax array, or a
    ``ShapeDtypeStruct`` with a sharding)."""
    return any(getattr(ref, "sharding", None) is not None for ref in refs)


def read_placed(  # noqa: PLR0917 - one call site, all positional data
    fd: Source,
    header: Header,
    todo: Sequence[TensorInfo],
    keys: Sequence[int],
    place: Callable[[Sequence[int], Sequence[Any]], Sequence[Any]],
    batched: bool,
    *,
    stage: bool = False,
) -> None:
    """Reads these tensors, verifies every hash and hands them to ``place``
    (with their ``keys``) once verified. For leaves bound to devices
    (``batched``), about ``DEVICE_BATCH`` bytes at a time: each batch is put
    on its devices (``jax.device_put`` returns at once) while the next is read
    and hashed, so the transfers overlap the reads, and a batch's host memory
    is freed once it is on its devices. With ``stage`` (leaves on an
    accelerator, ``staged.wanted``), the batches are read into reused
    staging buffers instead of fresh memory. Nothing is placed from a batch that
    fails; the rest are still hashed, so the error names every tensor that
    differs, and no tree is returned.

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its hash.
      FormatError: if the file shrinks while it is read.
    """
    batches: list[list[int]] = [[]]
    size = 0
    for j, t in enumerate(todo):
        if batched and batches[-1] and size + packed(t.nbytes) > DEVICE_BATCH:
            batches.append([])
            size = 0
        batches[-1].append(j)
        size += packed(t.nbytes)
    with contextlib.ExitStack() as stack:
        staging = stack.enter_context(staged.Staging()) if stage else None
        for n, batch in enumerate(batches):
            try:
                arrays = read_verified(
                    fd, header, [todo[j] for j in batch], staging.buffer if staging else None
                )
            except IntegrityError as e:
                rest = [todo[j] for b in batches[n + 1 :] for j in b]
                raise _with_rest(e, fd, header, [todo[j] for j in batch], rest) from None
            values = place([keys[j] for j in batch], arrays)
            if staging is not None:
                staging.hold(values)


def _with_rest(
    error: IntegrityError,
    fd: Source,
    header: Header,
    failed: Sequence[TensorInfo],
    rest: Sequence[TensorInfo],
) -> IntegrityError:
    """``error`` of one batch, widened to every tensor that differs in that
    batch and the ones not read yet (hashed without keeping their bytes)."""
    if not rest:
        return error
    tensors = [*failed, *rest]
    ranges = spans(header, tensors)
    announce(fd, ranges)
    try:
        digests = hash_ranges(fd, ranges, header.hash_name)
    except ShortRead:
        return error
    bad = [(t, d, t.digest) for t, d in zip(tensors, digests) if d != t.digest]
    return integrity_error(header.path, header.hash_name, bad) if bad else error
