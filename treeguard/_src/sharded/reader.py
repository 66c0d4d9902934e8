"""Reading a sharded checkpoint onto any mesh, every byte verified.

Each process reads only the saved shards that its own target shards
overlap, each one whole and once (one tensorstore read of its region, which
orbax wrote as that shard's own chunks), and hands it to the hashing engine
as it arrives, so the digest covers exactly the saved bytes with no copy
made to hash them. A saved shard that is a target shard is read into it in
place; one whose pieces the target shards of this process hold whole, as a
grid, is read straight through views of them and hashed there, run by run
in its own C order (``runs``); any other is read into a buffer of its own
and its pieces copied on. Each array is placed on its devices once its last
shard is in. Reads run ahead of the hashing and the copies
(tensorstore's own threads), up to the fetch's ``window`` of bytes. Nothing is returned
before every digest is in and every process agrees that all of them match
(a collective, unless ``local``).

The other processes' shards are never read here: what a process returns is
what it read and hashed itself. A saved shard larger than the pieces a
process needs of it is still read whole, because its digest covers it whole.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..errors import IntegrityError, StorageError
from ..hashing import Pipeline
from ..hashing.engine import DEPTH
from ..leaf import summarize
from . import hosts
from .digests import Index, index_of, intersect
from .manifest import ArrayRecord, Manifest, Shard
from .orbax_io import open_arrays, read_into, read_into_parts, shape_and_dtype
from .runs import Runs, fits, grid
from .scratch import Scratch, aligned

#: The bytes of saved shards read ahead of the one being hashed and copied.
WINDOW = 64 * 1024 * 1024
#: The largest shard for which each shard is hashed on one core, several
#: shards at once; past it one hash spreads over every core.
WHOLE_MAX = 64 * 1024 * 1024


def group_names(paths: Sequence[str]) -> str:
    """Array paths for a message: the first few, and how many more."""
    names = [p or "<root>" for p in paths]
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def unreadable(where: str, paths: Sequence[str], error: BaseException) -> IntegrityError:
    """The error for arrays whose stored data could not be read, naming them."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    # tensorstore appends the repr of a bound method and its spec: noise, and paths
    text = text.split(" See full TensorStore details", 1)[0][:300]
    return IntegrityError(
        f"{where}: the stored arrays {group_names(paths)} could not be read: {text}\n"
        "hint: the data directory is damaged or incomplete; load an earlier checkpoint",
        path=(paths[0] or "<root>") if paths else None,
    )


def shard_error(
    where: str, paths: Sequence[str], algorithm: str, first: str | None = None
) -> IntegrityError:
    """The error for arrays with a shard whose digest does not match;
    ``first``: the first such shard this process read, when it can be named."""
    names = [p or "<root>" for p in paths]
    listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    shown = f" (first: {first})" if first else ""
    return IntegrityError(
        f"{where}: {len(names)} {'array' if len(names) == 1 else 'arrays'} with a shard "
        f"whose {algorithm} does not match the manifest: {listed}{shown}\n"
        "hint: the stored bytes changed after the save; load an earlier checkpoint",
        path=names[0],
    )


def unhashable(path: str, error: BaseException) -> IntegrityError:
    """The error for a shard whose hashing failed (not a mismatch)."""
    out = IntegrityError(
        f"{path or '<root>'}: a shard could not be hashed: "
        f"{str(error).splitlines()[0][:300] if str(error) else type(error).__name__}",
        path=path or "<root>",
        hint="the stored array does not match its record; load an earlier checkpoint",
    )
    out.__cause__ = error
    return out


@dataclasses.dataclass
class _Piece:
    """One distinct target shard of an array in this process: its region,
    the local devices that hold it, and its host buffer once one exists."""

    index: Index
    devices: list[Any]
    buf: np.ndarray[Any, Any] | None = None


@dataclasses.dataclass
class _Plan:
    """What this process reads of one array: the saved shards its pieces overlap."""

    key: int
    record: ArrayRecord
    sharding: Any
    pieces: list[_Piece]
    shards: list[Shard]
    left: int


@dataclasses.dataclass
class _Part:
    """The region of a saved shard that one target shard holds, and the view of
    that target shard's buffer it is read into."""

    region: Index
    #: where the region starts within the saved shard
    at: tuple[int, ...]
    view: np.ndarray[Any, Any]


def _parts(plan: _Plan, shard: Shard) -> tuple[list[_Part], Runs] | None:
    """The target parts to read ``shard`` straight into, and its bytes as
    runs of them; None where they do not tile it (a part this process does
    not hold), or its runs are too many and small to hash one by one."""
    if shard.size == 0:
        return None
    found = [(p, r) for p in plan.pieces if (r := intersect(p.index, shard.index)) is not None]
    if grid(shard.index, [r for _, r in found]) is None:
        return None
    parts = []
    for piece, region in found:
        if piece.buf is None:
            piece.buf = aligned(tuple(b - a for a, b in piece.index), plan.record.dtype)
        within: Any = (..., *_relative(region, piece.index))  # a view, also of a 0-d array
        at = tuple(lo - o for (lo, _), (o, _) in zip(region, shard.index))
        parts.append(_Part(region, at, piece.buf[within]))
    runs = Runs(shard.index, [p.region for p in parts], [p.view for p in parts])
    return (parts, runs) if fits(runs) else None


def _plans(records: Sequence[ArrayRecord], targets: Sequence[Any]) -> list[_Plan]:
    out = []
    for key, (record, sharding) in enumerate(zip(records, targets)):
        if sharding is None:
            continue
        shape = tuple(record.shape)
        by_index: dict[Index, list[Any]] = {}
        for device, index in sharding.addressable_devices_indices_map(shape).items():
            by_index.setdefault(index_of(index, shape), []).append(device)
        pieces = [_Piece(index, devices) for index, devices in by_index.items()]
        shards = [
            s for s in record.shards if any(intersect(s.index, p.index) is not None for p in pieces)
        ]
        out.append(_Plan(key, record, sharding, pieces, shards, len(shards)))
    return out


def _relative(region: Index, within: Index) -> tuple[slice, ...]:
    return tuple(slice(lo - o, hi - o) for (lo, hi), (o, _) in zip(region, within))


def _scatter(plan: _Plan, shard: Shard, arr: np.ndarray[Any, Any]) -> None:
    """Copies the saved shard ``arr`` into the target pieces it overlaps."""
    for piece in plan.pieces:
        region = intersect(piece.index, shard.index)
        if region is None:
            continue
        if piece.buf is arr:  # the saved shard is this target shard: read into place
            continue
        if piece.buf is None:  # never a view of ``arr``, whose buffer is used again
            piece.buf = aligned(tuple(b - a for a, b in piece.index), plan.record.dtype)
        piece.buf[_relative(region, piece.index)] = arr[_relative(region, shard.index)]


def _place(plan: _Plan) -> Any:
    """The array of ``plan`` on its devices, from its pieces' host buffers."""
    import jax  # lazy: reading files never imports jax

    bufs = [piece.buf for piece in plan.pieces for _ in piece.devices]
    devices = [device for piece in plan.pieces for device in piece.devices]
    placed = jax.device_put(bufs, devices)
    for piece in plan.pieces:
        piece.buf = None
    shape = tuple(plan.record.shape)
    return jax.make_array_from_single_device_arrays(shape, plan.sharding, placed)


def _opened(where: str, future: Any, record: ArrayRecord) -> Any:
    """The opened tensorstore of ``record``, refused unless it has the
    record's shape and dtype (so no byte is ever reinterpreted)."""
    try:
        store = future.result()
    except Exception as e:  # tensorstore raises many kinds
        raise unreadable(where, [record.path], e) from e
    shape, dtype = shape_and_dtype(store)
    if shape != tuple(record.shape) or dtype != record.dtype:
        raise IntegrityError(
            f"{where}: the stored array {record.path or '<root>'} is "
            f"{summarize(shape, dtype)}, the manifest records "
            f"{summarize(tuple(record.shape), record.dtype)}\n"
            "hint: the data directory does not hold what the manifest lists; "
            "load an earlier checkpoint",
            path=record.path or "<root>",
        )
    return store


class Pending(Protocol):
    """A read under way: a tensorstore or ``concurrent.futures`` future."""

    def result(self) -> Any:
        """Waits for the read; raises its failure."""
        ...

    def cancel(self) -> Any:
        """Drops the read if it has not started."""
        ...


class Fetch(Protocol):
    """Where the saved shards' bytes come from: the data directory
    (``StoredArrays``) or, in a store in a bucket, one object per shard.

    Attributes:
      window: the bytes of saved shards read ahead of the one being used.
      streams: whether ``start`` hashes the bytes as they arrive, in a
        thread of its own that also faults in the buffer's pages; such a
        fetch is given no buffer for a read that keeps nothing (a check).
    """

    window: int
    streams: bool

    def prepare(self, records: Sequence[ArrayRecord], keys: Sequence[int]) -> None:
        """Starts opening the arrays ``keys`` (of ``records``) that will be read."""
        ...

    def start(self, key: int, shard: Shard, buf: np.ndarray[Any, Any] | None) -> Pending:
        """Starts reading the saved ``shard`` of array ``key`` into ``buf``
        (C order, the shard's shape and the array's dtype; None: nowhere,
        for a fetch that ``streams``). A fetch that hashes the bytes as it
        reads them (by the manifest's algorithm) gives their hex digest as
        the read's result; otherwise the reader hands ``buf`` to the hashing
        engine once it is read."""
        ...

    def name(self, key: int, shard: Shard) -> str | None:
        """The shard, as a message shows it, where it has a name of its own."""
        ...

    def close(self) -> None:
        """Ends the reads still under way, once none is needed."""
        ...


class StoredArrays:
    """The shards of a data directory, read through tensorstore as orbax
    wrote them (``orbax_io``)."""

    window: int = WINDOW
    streams: bool = False

    def __init__(self, where: str, data: str, names: Sequence[str]) -> None:
        self._where, self._data, self._names = where, data, names
        self._records: Sequence[ArrayRecord] = ()
        self._opening: dict[int, Any] = {}
        self._stores: dict[int, Any] = {}

    def prepare(self, records: Sequence[ArrayRecord], keys: Sequence[int]) -> None:
        self._records = records
        self._opening = dict(zip(keys, open_arrays(self._data, [self._names[k] for k in keys])))

    def start(self, key: int, shard: Shard, buf: np.ndarray[Any, Any] | None) -> Pending:
        if key not in self._stores:
            self._stores[key] = _opened(self._where, self._opening[key], self._records[key])
        return read_into(self._stores[key], shard.index, buf)  # type: ignore[no-any-return]

    def start_parts(self, key: int, shard: Shard, parts: Sequence[_Part]) -> Pending:
        """Starts reading the saved ``shard`` of array ``key`` straight into
        the target ``parts`` that tile it."""
        if key not in self._stores:
            self._stores[key] = _opened(self._where, self._opening[key], self._records[key])
        at = [(p.at, p.view) for p in parts]
        return read_into_parts(self._stores[key], shard.index, at)  # type: ignore[no-any-return]

    def name(self, key: int, shard: Shard) -> None:
        """None: a shard is a region of its array's stored chunks."""

    def close(self) -> None:
        """Nothing to end: tensorstore's futures are cancelled one by one."""


@dataclasses.dataclass
class _Ahead:
    """A read under way: the place of its shard in the work, the shard, the
    read, and what it reads into (a buffer of its own, or ``Runs``)."""

    n: int
    shard: Shard
    future: Pending
    buf: Any
    runs: Runs | None
    nbytes: int


class _Reads:
    """The reads of every planned shard, in order, each into a buffer of its
    own (or straight into the target shard it is), at most the fetch's ``window`` of bytes
    ahead of the one being consumed."""

    def __init__(
        self,
        where: str,
        fetch: Fetch,
        records: Sequence[ArrayRecord],
        plans: list[_Plan],
        keep: bool,
        *,
        direct: bool = False,
    ) -> None:
        self._where = where
        self._plans = plans
        self._keep = keep
        self._fetch = fetch
        #: read a resharded shard straight into its target parts (``runs``)
        self._direct = fetch if direct and keep and isinstance(fetch, StoredArrays) else None
        fetch.prepare(records, [p.key for p in plans])
        self._work = [(n, shard) for n, plan in enumerate(plans) for shard in plan.shards]
        self._next = 0
        self._ahead: collections.deque[_Ahead] = collections.deque()
        self._held = 0
        #: buffers of saved shards already hashed and copied, to read into again (fresh
        #: memory costs its page faults), at most a window of them kept
        self.scratch = Scratch(fetch.window)

    def __len__(self) -> int:
        return len(self._work)

    def _issue(self) -> None:
        fault = not self._fetch.streams  # a fetch that streams faults its buffers in itself
        while self._next < len(self._work) and (not self._ahead or self._held < self._fetch.window):
            n, shard = self._work[self._next]
            plan = self._plans[n]
            shape = tuple(b - a for a, b in shard.index)
            buf, runs = None, None
            if self._keep:
                for piece in plan.pieces:
                    if piece.index == shard.index and piece.buf is None:
                        piece.buf = buf = aligned(shape, plan.record.dtype, fault=fault)
            direct = self._direct
            parts = _parts(plan, shard) if buf is None and direct is not None else None
            if direct is not None and parts is not None:
                future = direct.start_parts(plan.key, shard, parts[0])
                runs = parts[1]
                nbytes = runs.nbytes
            else:
                if buf is None and (self._keep or not self._fetch.streams):
                    buf = self.scratch.take(shape, plan.record.dtype, fault=fault)
                future = self._fetch.start(plan.key, shard, buf)  # None: a check that streams
                nbytes = int(np.prod(shape, dtype=np.int64)) * plan.record.dtype.itemsize
            self._held += nbytes
            self._ahead.append(_Ahead(n, shard, future, buf, runs, nbytes))
            self._next += 1

    def next(self) -> tuple[_Plan, Shard, np.ndarray[Any, Any] | Runs | None, str | None]:
        """The next shard's plan, shard, bytes (in a buffer of their own, C
        order, or as ``Runs`` of the target shards they were read into; None
        for a check by a fetch that streams) and their digest when the fetch
        hashed them."""
        self._issue()
        got = self._ahead.popleft()
        self._held -= got.nbytes
        self._issue()  # the window moved: keep the reader busy while this one is used
        try:
            done = got.future.result()
        except StorageError:
            raise  # a request to storage failed: it names the object, and says nothing of it
        except Exception as e:  # tensorstore raises many kinds
            raise unreadable(self._where, [self._plans[got.n].record.path], e) from e
        found = done if isinstance(done, str) else None
        if found is None and got.buf is None and got.runs is None:  # a defect of the fetch
            raise TypeError("a fetch that streams gave no digest of a shard it kept nowhere")
        return self._plans[got.n], got.shard, got.runs if got.runs is not None else got.buf, found

    def reuse(self, buf: np.ndarray[Any, Any]) -> None:
        """Takes back a shard's buffer once nothing reads it any more."""
        self.scratch.give(buf)

    def cancel(self) -> None:
        """Drops the reads still in flight."""
        for got in self._ahead:
            got.future.cancel()
        self._ahead.clear()
        self._fetch.close()


def _read(  # noqa: PLR0917 - one call site
    reads: _Reads,
    plans: list[_Plan],
    pipeline: Pipeline,
    keep: bool,
    out: list[Any],
    hashed: dict[int, str],
) -> list[tuple[int, Shard]]:
    """Reads, hashes (in the background) and places every planned shard;
    returns what was read, in order: the digests of the shards the fetch
    hashed itself go to ``hashed``, the others' are ``pipeline``'s, under
    the same place in that order."""
    fed: list[tuple[int, Shard]] = []
    # per hashing worker, the buffers it may still read: each hashes its chunks
    # in order, so a buffer is done with once DEPTH + 1 later ones were fed to it
    hashing: dict[int, collections.deque[np.ndarray[Any, Any] | None]] = {}
    try:
        for _ in range(len(reads)):
            plan, shard, got, found = reads.next()
            # read straight into its target shards (``Runs`` of them), or into them in place
            kept = isinstance(got, Runs) or (keep and any(p.buf is got for p in plan.pieces))
            if found is not None:
                hashed[len(fed)] = found  # hashed as it was read: nothing to wait for
            elif got is not None:  # never None without a digest (``_Reads.next``)
                lane = _feed(pipeline, len(fed), plan, got)
            fed.append((plan.key, shard))
            arr = None if isinstance(got, Runs) else got
            if keep and arr is not None:
                _scatter(plan, shard, arr)
            if found is not None:
                if not kept and arr is not None:
                    reads.reuse(arr)
            else:
                ring = hashing.setdefault(lane, collections.deque())
                ring.append(None if kept else arr)
                if len(ring) > DEPTH + 1:
                    done = ring.popleft()
                    if done is not None:
                        reads.reuse(done)
            plan.left -= 1
            if keep and plan.left == 0:
                out[plan.key] = _place(plan)
        for plan in plans:  # arrays with no byte to read (zero-size)
            if keep and out[plan.key] is None:
                for piece in plan.pieces:
                    piece.buf = aligned(tuple(b - a for a, b in piece.index), plan.record.dtype)
                out[plan.key] = _place(plan)
    finally:
        reads.cancel()
    return fed


def _feed(pipeline: Pipeline, n: int, plan: _Plan, arr: np.ndarray[Any, Any] | Runs) -> int:
    """Hands a shard's bytes to ``pipeline`` as item ``n``; the lane."""
    lane = pipeline.lane(n)
    try:
        if isinstance(arr, Runs):
            pipeline.feed_runs(n, arr)
        else:
            flat: Any = arr.reshape(-1).view(np.uint8)
            pipeline.feed(n, memoryview(flat))
    except Exception as e:
        raise unhashable(plan.record.path, e) from e
    return lane


def read_verified(
    where: str,
    manifest: Manifest,
    fetch: Fetch,
    targets: Sequence[Any],
    *,
    local: bool = False,
    keep: bool = True,
) -> list[Any]:
    """The arrays with a target sharding, read onto it, every saved shard
    this process read checked against its digest; a collective unless
    ``local``.

    Args:
      where: the checkpoint directory (for messages).
      manifest: its parsed manifest.
      fetch: where the saved shards' bytes come from (``StoredArrays``).
      targets: a sharding per array, or None for an array left unread.
      local: this process alone: no collective, nothing exchanged.
      keep: place the arrays; with False every shard is read and hashed
        and nothing is kept (a check).

    Returns:
      One ``jax.Array`` (None when unread or not kept) per array.

    Raises:
      IntegrityError: in every process, naming the arrays with a shard
        whose bytes differ from their digest (in any process), an array
        that could not be read or does not match its record (in the process
        that failed; the others name that process and the array).
      StorageError: in the process whose fetch's request to storage failed
        (the fetch's own error, naming the object; the others as above).
    """
    plans = _plans(manifest.arrays, targets)
    out: list[Any] = [None] * len(manifest.arrays)
    flags = np.zeros(len(manifest.arrays), dtype=np.uint8)
    failure: Exception | None = None
    first: str | None = None
    items = max(1, sum(len(p.shards) for p in plans))
    # shards of a few MiB: each hashed whole on one core, several at once
    largest = max((s.size * p.record.dtype.itemsize for p in plans for s in p.shards), default=0)
    whole = largest <= WHOLE_MAX
    with Pipeline(manifest.hash, items=items, whole=whole) as pipeline:
        try:
            reads = _Reads(where, fetch, manifest.arrays, plans, keep, direct=whole)
            hashed: dict[int, str] = {}
            fed = _read(reads, plans, pipeline, keep, out, hashed)
            try:
                found = pipeline.digests() | hashed
            except Exception as e:
                raise unhashable(manifest.arrays[fed[0][0]].path if fed else "", e) from e
            for n, (key, shard) in enumerate(fed):
                if found.get(n) != shard.digest:
                    flags[key] = 1
                    first = first or fetch.name(key, shard)
        except Exception as e:  # noqa: BLE001 - the exchange below must still happen
            failure = e
            out.clear()
    mine = b""
    if failure is not None:
        path = failure.path if isinstance(failure, IntegrityError) else None
        mine = (path or "<root>").encode("utf-8", "replace")
    gathered = [mine] if local else hosts.allgather_bytes(mine)
    agreed = flags if local else hosts.any_process(flags)
    if failure is not None:  # raised only after the exchange, which every process joins
        raise failure
    others = [(p, raw.decode("utf-8", "replace")) for p, raw in enumerate(gathered) if raw]
    if others:
        process, path = others[0]
        raise IntegrityError(
            f"{where}: process {process} could not read the stored arrays {path} "
            "(see its error)\n"
            "hint: the data directory is damaged or incomplete; load an earlier checkpoint",
            path=path,
        )
    bad = [k for k in range(len(manifest.arrays)) if agreed[k]]
    if bad:
        raise shard_error(where, [manifest.arrays[k].path for k in bad], manifest.hash, first)
    return out
