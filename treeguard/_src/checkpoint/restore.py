"""What every reader of a safetensors file shares: reading byte ranges into
one buffer (hashing them on the way when the file records hashes), and
building the returned tree in the form of ``like``.

Both the native reader (``read.py``) and the foreign one (``foreign.py``)
use these; neither imports the other.
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from ..errors import FormatError, IntegrityError, InvalidTreeError, cap_lines
from ..hashing import Algorithm, ShortRead, Source, Span, mismatched, pread_into, read_spans
from ..spec import TreeSpec, spec_from_leaves
from ..walk import Node, flatten_with_types
from .format import StoredTensor

_CHUNK = 16 * 1024 * 1024
#: Each loaded array starts at a multiple of this in the shared buffer.
ALIGN = 64
#: Loads of at least this many bytes go into an anonymous mapping.
_MAPPED = 64 * 1024 * 1024
RESTORE_HINT = "restore the file from a verified copy (ArtifactStore.rollback) or save it again"


def walk_like(like: Any) -> tuple[TreeSpec, list[Any] | None, Any]:
    """``like``'s spec, leaves and treedef, from one walk of it (a
    ``TreeSpec`` is its own spec, with no leaves and no treedef).

    Raises:
      InvalidTreeError: for a tree that contains itself or holds leaves
        that are not arrays.
    """
    if isinstance(like, TreeSpec):
        return like, None, None
    leaves, treedef, types = flatten_with_types(like)
    return spec_from_leaves(like, leaves, treedef, types), leaves, treedef


def buffer(nbytes: int, *, populate: bool = True) -> np.ndarray[Any, Any]:
    """A fresh byte buffer; a large one is an anonymous mapping whose pages
    the kernel fills in at once (``MAP_POPULATE``), never numpy's huge pages,
    which can stall a whole load while the kernel compacts memory.
    ``populate=False`` leaves them to whoever fills the buffer: the threads
    that read a file fault in each chunk's pages just before its read
    (``hashing.prefault``), bytes that arrive over the network as they
    arrive. Why, with figures: the performance page, "How a load moves the
    bytes"."""
    if nbytes < _MAPPED:
        return np.empty(max(nbytes, 1), np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if populate:
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), np.uint8)


def packed(nbytes: int) -> int:
    """The bytes a tensor of ``nbytes`` takes in ``read_ranges``' buffer
    (each starts at a multiple of ``ALIGN``).

    Example:
      >>> packed(1), packed(64), packed(65)
      (64, 64, 128)
    """
    return -(-nbytes // ALIGN) * ALIGN


def read_ranges(  # noqa: PLR0917 - every argument is needed, all positional data
    fd: Source,
    todo: Sequence[StoredTensor],
    data_start: int,
    where: str,
    digests: Sequence[str] | None,
    algorithm: Algorithm = "blake3",
    truncated_hint: str = RESTORE_HINT,
    *,
    quote: bool = False,
    into: Callable[[int], np.ndarray[Any, Any] | None] | None = None,
) -> list[np.ndarray[Any, Any]]:
    """Reads these tensors' byte ranges and, with ``digests``, verifies them.

    This is the one place a load reads tensor bytes: only the ranges asked
    for are read, so a partial load reads (and hashes) only what it returns.
    All ranges land in one buffer allocated at once, each at a 64-byte
    aligned offset (so the arrays of one load share one allocation, freed
    when the last of them is). With digests, the hashing engine reads each
    chunk straight into that buffer while it hashes the chunks already read.

    Args:
      fd: the open file.
      todo: the tensors to read.
      data_start: the file offset of the data section.
      where: the file's name for messages.
      digests: the recorded hex digest of each tensor, or None for a file
        that records none (its bytes are read unchecked).
      algorithm: the algorithm of ``digests`` (the file's ``hash_name``).
      truncated_hint: the fix named when the file shrinks meanwhile.
      quote: name tensors quoted in messages (names another tool chose).
      into: gives the buffer to read into for a total size (``None`` from
        it, or no ``into``: a fresh one); a load onto an accelerator reads
        into reused staging buffers (``staged.Staging.buffer``).

    Returns:
      Each tensor's bytes as a ``uint8`` array, in ``todo``'s order.

    Raises:
      IntegrityError: naming every tensor whose bytes differ from its digest.
      FormatError: if the file shrinks while it is read.
    """
    offsets: list[int] = []
    pos = 0
    for t in todo:
        pos = packed(pos)
        offsets.append(pos)
        pos += t.nbytes
    given = into(pos) if into is not None else None
    # the readers fault fresh pages in as they fill them
    base = given if given is not None else buffer(pos, populate=False)
    whole = memoryview(base.data)
    views = [whole[off : off + t.nbytes] for t, off in zip(todo, offsets)]

    def truncated(i: int) -> FormatError:
        t = todo[i]
        label = repr(t.name[:200]) if quote else t.name or "<root>"
        return FormatError(
            f"tensor {label}: the file was truncated while it was read",
            context=where,
            hint=truncated_hint,
        )

    if digests is None:
        for i, (t, view) in enumerate(zip(todo, views)):
            done = 0
            while done < t.nbytes:
                step = min(_CHUNK, t.nbytes - done)
                if pread_into(fd, view[done : done + step], data_start + t.begin + done) != step:
                    raise truncated(i)
                done += step
    else:
        spans = [Span(data_start + t.begin, v, d) for t, v, d in zip(todo, views, digests)]
        try:
            found = read_spans(fd, spans, algorithm)
        except ShortRead as e:
            raise truncated(e.index) from None
        if wrong := mismatched(spans, found):
            raise integrity_error(
                where, algorithm, [(todo[i], found[i], digests[i]) for i in wrong]
            )
    return [base[off : off + t.nbytes] for t, off in zip(todo, offsets)]


def integrity_error(
    name: str, algorithm: str, bad: Sequence[tuple[StoredTensor, str, str]]
) -> IntegrityError:
    """The error naming every tensor whose bytes (actual digest) differ from
    the digest recorded for them."""
    n = len(bad)
    lines = [f"{n} tensor{'s' if n > 1 else ''} corrupt ({algorithm} mismatch):"]
    lines += cap_lines(
        [
            f"  {t.name or '<root>'}: {t.summary()}: {algorithm} {actual[:12]}… of the bytes "
            f"read, {recorded[:12]}… recorded in the header"
            for t, actual, recorded in bad
        ]
    )
    return IntegrityError(
        "\n".join(lines),
        path=bad[0][0].name,
        context=name,
        hint="the file was changed after it was saved; " + RESTORE_HINT,
    )


def build_like(like_spec: TreeSpec, like_treedef: Any, leaves: list[Any]) -> Any:
    """The tree of ``leaves`` (in flatten order) in ``like``'s structure: its
    treedef, or the spec's plain containers for a spec read from JSON that
    holds custom nodes."""
    import jax  # a reader of headers alone never imports JAX

    treedef = like_treedef
    if treedef is None:
        try:
            treedef = like_spec.treedef
        except InvalidTreeError:  # custom nodes without their classes: plain containers
            return plain(like_spec.structure, iter(leaves))
    return jax.tree.unflatten(treedef, leaves)


def plain(node: Node, leaves: Iterator[Any]) -> Any:
    """Plain containers of a stored structure; custom nodes become dicts.

    The leaves are taken in flatten order, the order the tensor names were
    matched in; a stored structure nests no deeper than ``walk.MAX_DEPTH``.
    """
    if node.kind == "leaf":
        return next(leaves)
    if node.kind == "none":
        return None
    kids = [(e, plain(c, leaves)) for e, c in zip(node.entries, node.children)]
    if node.kind == "list":
        return [k for _, k in kids]
    if node.kind == "tuple":
        return tuple(k for _, k in kids)
    return {e[1]: k for e, k in kids}


def plain_leaves(node: Node, tree: Any) -> list[Any]:
    """The leaves of a tree ``plain`` built from ``node``, in the stored
    structure's flatten order (a custom node's dict is read in its entries'
    order, not sorted as a dict flattens).

    Example:
      >>> from treeguard import spec_of, LeafSpec
      >>> node = spec_of({"b": LeafSpec((), "int8"), "a": [LeafSpec((), "int8")]}).structure
      >>> plain_leaves(node, plain(node, iter([1, 2])))
      [1, 2]
    """
    out: list[Any] = []
    stack: list[tuple[Node, Any]] = [(node, tree)]
    while stack:
        n, x = stack.pop()
        if n.kind == "leaf":
            out.append(x)
        elif n.kind in ("list", "tuple"):
            stack.extend(zip(reversed(n.children), reversed(x)))
        elif n.kind != "none":
            stack.extend((c, x[e[1]]) for e, c in zip(reversed(n.entries), reversed(n.children)))
    return out


def as_like(arr: np.ndarray[Any, Any], ref: Any) -> Any:
    """A loaded array in the form of ``like``'s leaf at the same path."""
    import jax  # a reader of headers alone never imports JAX

    if isinstance(ref, jax.Array):
        if getattr(ref, "weak_type", False):
            return _weak(arr, ref.sharding)
        return jax.device_put(arr, ref.sharding)
    if isinstance(ref, jax.ShapeDtypeStruct):
        # a jax.Array, as the struct describes: without a sharding, on the default
        # device. Never a numpy array: nnx updates an RNG count in place (`+=`), and
        # on the CPU JAX may alias an aligned numpy buffer, so a computation still
        # queued would read the count after the update.
        return jax.device_put(arr, ref.sharding)
    if isinstance(ref, np.generic):
        return arr[()]
    if isinstance(ref, (bool, int, float, complex)):
        return type(ref)(arr.item())
    return arr


@functools.lru_cache(maxsize=64)
def _weak_identity(shape: tuple[int, ...], dtype: np.dtype[Any], sharding: Any) -> Any:
    """The identity compiled for a weakly typed argument: it returns its
    argument's value with JAX's weak type (public API only:
    ``ShapeDtypeStruct(weak_type=True)`` and ahead-of-time compilation)."""
    import jax  # a reader of headers alone never imports JAX

    weak = jax.ShapeDtypeStruct(shape, dtype, weak_type=True, sharding=sharding)  # type: ignore[no-untyped-call]
    return jax.jit(lambda a: a, out_shardings=sharding).lower(weak).compile()


def _weak(arr: np.ndarray[Any, Any], sharding: Any) -> Any:
    """A weakly typed jax array with ``arr``'s value (JAX's scalar promotion type).

    tests/checkpoint/test_checkpoint.py fails loudly if a JAX release stops
    giving the weak type this way.
    """
    import jax  # a reader of headers alone never imports JAX

    if arr.ndim == 0:
        candidate = jax.numpy.asarray(arr.item())
        if candidate.dtype == arr.dtype and candidate.weak_type:
            return jax.device_put(candidate, sharding)
    placed = jax.device_put(arr, sharding)
    return _weak_identity(arr.shape, arr.dtype, sharding)(placed)
