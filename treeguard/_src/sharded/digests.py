"""The digest of every stored shard: computed where each shard lives at save
time, and checked after a restore onto any mesh.

A shard's digest is the hash (BLAKE3, or sha256 in older manifests) of its
bytes in C order, so it does not depend on how tensorstore chunked or laid
them out on disk. The hashing engine (``hashing.Pipeline``) hashes in its
own threads while the caller reads the next arrays. After a restore onto
another sharding, the process that holds a saved shard's whole region among
its own devices hashes it: in place when one of its pieces is exactly that
shard (the same layout), or rebuilt from its pieces into one buffer, one
region at a time, so checking costs at most one shard of extra memory. A
region no single process holds is sliced out on the devices by every process
together (a copy of it on each device), and one process hashes it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import IntegrityError
from ..hashing import DEFAULT, THREAD_PREFIX, Algorithm, Pipeline, digest
from . import hosts
from .manifest import ArrayRecord, Shard

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
    arrays: Sequence[jax.Array], algorithm: Algorithm = DEFAULT
) -> Iterator[tuple[int, Index, str]]:
    """``(leaf, index, digest)`` for every shard this process writes.

    Of the replicas of one shard only the one with ``replica_id == 0`` is
    hashed, as only it is written. Each shard is brought to the host and
    handed to the hashing engine, which hashes it while the next one is
    brought over.
    """
    tasks = []
    for i, arr in enumerate(arrays):
        shape = tuple(arr.shape)
        for shard in arr.addressable_shards:
            if shard.replica_id == 0:
                tasks.append((i, index_of(shard.index, shape), shard.data))
    with Pipeline(algorithm, items=len(tasks)) as pipeline:
        for n, (_, _, data) in enumerate(tasks):
            pipeline.feed(n, _bytes(_host(data)))
        found = pipeline.digests()
    for n, (i, index, _) in enumerate(tasks):
        yield i, index, found[n]


def _intersect(a: Index, b: Index) -> Index | None:
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def _volume(index: Index) -> int:
    return math.prod(b - a for a, b in index)


def _holder(shard: Shard, pieces: dict[int, list[Index]]) -> int | None:
    """The lowest process whose own pieces of the array cover ``shard`` whole."""
    want = shard.size
    for p in sorted(pieces):
        got = 0
        for idx in pieces[p]:
            inter = _intersect(idx, shard.index)
            if inter is not None:
                got += _volume(inter)
        if got == want:
            return p
    return None


def _whole(shard: Shard, local: list[tuple[Index, Any]]) -> Any:
    """The local piece that is exactly the saved shard, or None."""
    for idx, data in local:
        if idx == shard.index:
            return data
    return None


def _assemble(
    shard: Shard,
    local: list[tuple[Index, Any]],
    dtype: np.dtype[Any],
    scratch: np.ndarray[Any, Any],
) -> Any:
    """The saved shard's region rebuilt from this process's local pieces, in
    ``scratch`` (a byte buffer at least as large as the region)."""
    shape = tuple(b - a for a, b in shard.index)
    nbytes = shard.size * dtype.itemsize
    buf = scratch[:nbytes].view(dtype).reshape(shape)
    for idx, data in local:
        inter = _intersect(idx, shard.index)
        if inter is None:
            continue
        src = tuple(slice(lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(inter, idx))
        dst = tuple(slice(lo - s0, hi - s0) for (lo, hi), (s0, _) in zip(inter, shard.index))
        buf[dst] = _host(data)[src]
    return buf


def _distinct_pieces(arr: jax.Array) -> dict[int, list[Index]]:
    shape = tuple(arr.shape)
    pieces: dict[int, set[Index]] = {}
    device: Any
    for device, index in arr.sharding.devices_indices_map(shape).items():
        pieces.setdefault(int(device.process_index), set()).add(index_of(index, shape))
    return {p: sorted(v) for p, v in pieces.items()}


def _local_pieces(arr: jax.Array) -> list[tuple[Index, Any]]:
    shape = tuple(arr.shape)
    seen: dict[Index, Any] = {}
    for shard in arr.addressable_shards:
        seen.setdefault(index_of(shard.index, shape), shard.data)
    return list(seen.items())


def _slice_everywhere(arr: jax.Array, shard: Shard) -> jax.Array:
    """The shard's region, replicated on the array's devices (a collective)."""
    import jax  # lazy: reading files never imports jax

    sharding = arr.sharding
    if isinstance(sharding, jax.sharding.NamedSharding):  # the array's own device order
        devices = np.asarray(sharding.mesh.devices).reshape(-1)
    else:
        devices = np.array(sorted(sharding.device_set, key=lambda d: int(getattr(d, "id", 0))))
    mesh = jax.sharding.Mesh(devices, ("all",))
    replicated: Any = jax.sharding.PartitionSpec
    out = jax.sharding.NamedSharding(mesh, replicated())
    slices = shard.slices
    result: jax.Array = jax.jit(lambda x: x[slices], out_shardings=out)(arr)
    return result


def _unhashable(path: str, error: Exception) -> IntegrityError:
    """The error for a shard whose hashing failed (not a mismatch)."""
    out = IntegrityError(
        f"{path or '<root>'}: a shard could not be hashed: "
        f"{str(error).splitlines()[0][:300] if str(error) else type(error).__name__}",
        path=path or "<root>",
        hint="the restored array does not match its record; load an earlier checkpoint",
    )
    out.__cause__ = error
    return out


class ShardChecker:
    """Checks restored arrays against their recorded shard digests: each
    shard is handed to the hashing engine as soon as its array is added, so
    the hashing of one array overlaps the reading of the next.

    Use it as a context manager: ``add`` each restored array (in the same
    order in every process), then ``bad()``. With ``local=True`` every
    shard is checked in this process and nothing is exchanged (the arrays
    must then be whole on this process's devices).

    Args:
      records: every array the checkpoint holds (to size the scratch buffer).
      local: check in this process alone, with no collective.
      algorithm: the manifest's digest algorithm.
    """

    def __init__(
        self,
        records: Sequence[ArrayRecord],
        *,
        local: bool = False,
        algorithm: Algorithm = DEFAULT,
    ) -> None:
        self._me = 0 if local else hosts.process_index()
        self._nproc = 1 if local else hosts.process_count()
        self._algorithm = algorithm
        self._largest = max(
            (s.size * r.dtype.itemsize for r in records for s in r.shards), default=0
        )
        self._scratch: list[np.ndarray[Any, Any]] = []
        self._pipeline = Pipeline(algorithm, items=sum(len(r.shards) for r in records))
        self._tasks: list[tuple[int, ArrayRecord, Shard]] = []
        self._done: list[tuple[int, ArrayRecord, bool]] = []
        self._failed: IntegrityError | None = None
        self._remote: list[tuple[int, ArrayRecord, Shard, Any]] = []
        self._count = 0

    def __enter__(self) -> ShardChecker:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pipeline.close()

    def add(self, key: int, record: ArrayRecord, arr: jax.Array) -> None:
        """Starts hashing ``arr``'s shards (as ``key``) in the background."""
        self._count = max(self._count, key + 1)
        pieces = _distinct_pieces(arr) if self._nproc > 1 else {self._me: []}
        local = _local_pieces(arr)
        for shard in record.shards:
            owner = self._me if self._nproc == 1 else _holder(shard, pieces)
            if owner == self._me:
                self._check(key, record, shard, local)
            elif owner is None:
                self._remote.append((key, record, shard, arr))

    def _check(
        self, key: int, record: ArrayRecord, shard: Shard, local: list[tuple[Index, Any]]
    ) -> None:
        try:
            whole = _whole(shard, local)
            if whole is not None:  # the same layout: hash the piece in place
                self._pipeline.feed(len(self._tasks), _bytes(_host(whole)))
                self._tasks.append((key, record, shard))
                return
            if not self._scratch:
                self._scratch.append(np.empty(self._largest, dtype=np.uint8))
            region = _assemble(shard, local, record.dtype, self._scratch[0])
            # the scratch buffer is reused for the next region: hashed now
            self._done.append((key, record, hash_host(region, self._algorithm) == shard.digest))
        except Exception as e:  # noqa: BLE001 - numpy, jax and memory errors alike
            self._done.append((key, record, False))
            self._failed = self._failed or _unhashable(record.path, e)

    def bad(self) -> list[int]:
        """The keys of the arrays with a shard whose bytes differ from the
        recorded digest, agreed by every process (a collective unless local).

        Every hash is waited for before it returns. A hash that fails counts
        as a mismatch for the other processes, and is raised here, after the
        exchange, as an ``IntegrityError`` naming its array.
        """
        flags = np.zeros(self._count, dtype=np.uint8)
        failed = self._failed
        try:
            found = self._pipeline.digests()
        except Exception as e:  # noqa: BLE001 - the exchange below must still happen
            found = {}
            if self._tasks:
                failed = failed or _unhashable(self._tasks[0][1].path, e)
        for n, (key, _, shard) in enumerate(self._tasks):
            if found.get(n) != shard.digest:
                flags[key] = 1
        for key, _, ok in self._done:
            if not ok:
                flags[key] = 1
        for n, (key, record, shard, arr) in enumerate(self._remote):
            region = _slice_everywhere(arr, shard)
            if n % self._nproc == self._me:
                try:
                    data = _host(region.addressable_shards[0].data)
                    ok = hash_host(data, self._algorithm) == shard.digest
                except Exception as e:  # noqa: BLE001 - the exchange below must still happen
                    ok = False
                    failed = failed or _unhashable(record.path, e)
                if not ok:
                    flags[key] = 1
            del region
        agreed = flags if self._nproc == 1 else hosts.any_process(flags)
        if failed is not None:  # raised only after the collective, which every process joins
            raise failed
        return [i for i in range(self._count) if agreed[i]]


def bad_shards(
    pairs: Sequence[tuple[ArrayRecord, jax.Array]], algorithm: Algorithm = DEFAULT
) -> list[int]:
    """Which arrays (positions in ``pairs``) hold a shard whose bytes differ
    from the recorded digest, agreed by every process.

    Every process must call this with the same records and arrays: it is a
    collective in a multi-process job.
    """
    with ShardChecker([r for r, _ in pairs], algorithm=algorithm) as checker:
        for i, (record, arr) in enumerate(pairs):
            checker.add(i, record, arr)
        return checker.bad()
