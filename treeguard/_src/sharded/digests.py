"""The sha256 of every stored shard: computed where each shard lives at save
time, and checked after a restore onto any mesh.

A shard's digest is the sha256 of its bytes in C order, so it does not depend
on how tensorstore chunked or laid them out on disk. After a restore onto
another sharding, the process that holds a saved shard's whole region among
its own devices hashes it: in place when one of its pieces is exactly that
shard (the same layout), or rebuilt from its pieces into one buffer, one
region at a time, so checking costs at most one shard of extra memory. A
region no single process holds is sliced out on the devices by every process
together (a copy of it on each device), and one process hashes it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np

from . import hosts
from .manifest import ArrayRecord, Shard

Index = tuple[tuple[int, int], ...]


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def hash_host(arr: np.ndarray[Any, Any]) -> str:
    """The sha256 of an array's bytes in C order."""
    flat = np.ascontiguousarray(arr).reshape(-1)
    return hashlib.sha256(flat.view(np.uint8).data).hexdigest()


def index_of(index: tuple[slice, ...], shape: tuple[int, ...]) -> Index:
    """A shard index (slices, as JAX gives them) as ``(start, stop)`` per axis."""
    out = []
    for s, n in zip(index, shape):
        start, stop, _ = s.indices(n)
        out.append((start, stop))
    return tuple(out)


def _host(data: Any) -> np.ndarray[Any, Any]:
    return np.asarray(data)


def local_digests(arrays: Sequence[jax.Array]) -> Iterator[tuple[int, Index, str]]:
    """``(leaf, index, sha256)`` for every shard this process writes.

    Of the replicas of one shard only the one with ``replica_id == 0`` is
    hashed, as only it is written. The hashes run in threads (hashlib lets go
    of the GIL), so they overlap with the caller's own work when the caller
    iterates lazily; here they are consumed in order.
    """
    tasks = []
    for i, arr in enumerate(arrays):
        shape = tuple(arr.shape)
        for shard in arr.addressable_shards:
            if shard.replica_id == 0:
                tasks.append((i, index_of(shard.index, shape), shard.data))
    with concurrent.futures.ThreadPoolExecutor(_workers()) as pool:
        futures = [pool.submit(lambda d: hash_host(_host(d)), d) for _, _, d in tasks]
        for (i, index, _), fut in zip(tasks, futures):
            yield i, index, fut.result()


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


def bad_shards(pairs: Sequence[tuple[ArrayRecord, jax.Array]]) -> list[int]:
    """Which arrays (positions in ``pairs``) hold a shard whose bytes differ
    from the recorded sha256, agreed by every process.

    Every process must call this with the same records and arrays: it is a
    collective in a multi-process job.
    """
    me = hosts.process_index()
    nproc = hosts.process_count()
    local_jobs: list[tuple[int, Shard, Any]] = []
    remote_jobs: list[tuple[int, Shard]] = []
    for i, (record, arr) in enumerate(pairs):
        pieces = _distinct_pieces(arr) if nproc > 1 else {me: []}
        local = _local_pieces(arr)
        for shard in record.shards:
            owner = me if nproc == 1 else _holder(shard, pieces)
            if owner == me:
                local_jobs.append((i, shard, local))
            elif owner is None:
                remote_jobs.append((i, shard))
    flags = np.zeros(len(pairs), dtype=np.uint8)

    assembling = threading.Lock()  # one scratch buffer, one rebuilt region at a time
    largest = max(
        (s.size * record.dtype.itemsize for record, _ in pairs for s in record.shards), default=0
    )
    scratch: list[np.ndarray[Any, Any]] = []

    def check(job: tuple[int, Shard, Any]) -> tuple[int, bool]:
        i, shard, local = job
        whole = _whole(shard, local)
        if whole is not None:  # the same layout: hash the piece in place
            return i, hash_host(_host(whole)) == shard.digest
        with assembling:
            if not scratch:
                scratch.append(np.empty(largest, dtype=np.uint8))
            region = _assemble(shard, local, pairs[i][0].dtype, scratch[0])
            return i, hash_host(region) == shard.digest

    with concurrent.futures.ThreadPoolExecutor(_workers()) as pool:
        for i, ok in pool.map(check, local_jobs):
            if not ok:
                flags[i] = 1
    for n, (i, shard) in enumerate(remote_jobs):
        region = _slice_everywhere(pairs[i][1], shard)
        if n % nproc == me and hash_host(_host(region.addressable_shards[0].data)) != shard.digest:
            flags[i] = 1
        del region
    agreed = hosts.any_process(flags)
    return [i for i in range(len(pairs)) if agreed[i]]
