"""The digest of every stored shard, computed where each shard lives at
save time, and the index arithmetic a verified read shares with it.

A shard's digest is the hash (BLAKE3, or sha256 in older manifests) of its
bytes in C order, so it does not depend on how tensorstore chunked or laid
them out on disk. The hashing engine (``hashing.Pipeline``) hashes in its
own threads while the caller brings the next shards to the host. A load
(``reader``) checks the same digests on the saved shards as it reads them,
whatever mesh it reads onto.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..hashing import DEFAULT, THREAD_PREFIX, Algorithm, Pipeline, digest

if TYPE_CHECKING:
    import jax

Index = tuple[tuple[int, int], ...]

#: The name prefix of the threads that hash shards (so a test, or a person
#: reading a thread dump, can tell them from other pools).
HASH_THREADS = THREAD_PREFIX


def _bytes(arr: np.ndarray[Any, Any]) -> memoryview:
    flat: Any = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    return memoryview(flat)


def hash_host(arr: np.ndarray[Any, Any], algorithm: Algorithm = DEFAULT) -> str:
    """The digest of an array's bytes in C order."""
    return digest(_bytes(arr), algorithm)


def index_of(index: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    """A shard index (slices, as JAX gives them) as ``(start, stop)`` per axis."""
    out = []
    for s, n in zip(index, shape):
        start, stop, _ = s.indices(n)
        out.append((start, stop))
    return tuple(out)


def _host(data: Any) -> np.ndarray[Any, Any]:
    return np.asarray(data)


def local_digests(
    arrays: Sequence[jax.Array],
    algorithm: Algorithm = DEFAULT,
    each: Callable[[int, Index, memoryview], None] | None = None,
) -> Iterator[tuple[int, Index, str]]:
    """``(leaf, index, digest)`` for every shard this process writes.

    Of the replicas of one shard only the one with ``replica_id == 0`` is
    hashed, as only it is written. Each shard is brought to the host and
    handed to the hashing engine, which hashes it while the next one is
    brought over; ``each(leaf, index, bytes)`` is then given its bytes (C
    order), to write them while they are hashed.
    """
    tasks = []
    for i, arr in enumerate(arrays):
        shape = tuple(arr.shape)
        for shard in arr.addressable_shards:
            if shard.replica_id == 0:
                tasks.append((i, index_of(shard.index, shape), shard.data))
    with Pipeline(algorithm, items=len(tasks)) as pipeline:
        for n, (i, index, data) in enumerate(tasks):
            view = _bytes(_host(data))
            pipeline.feed(n, view)
            if each is not None:
                each(i, index, view)
        found = pipeline.digests()
    for n, (i, index, _) in enumerate(tasks):
        yield i, index, found[n]


def intersect(a: Index, b: Index) -> Index | None:
    """The region two indices share, or None when they share no element."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None
