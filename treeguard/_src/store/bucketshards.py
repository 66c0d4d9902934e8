"""A sharded version in a bucket: ``save_sharded``'s manifest, and each
saved shard its own create-only object.

::

    versions/NAME/data-<16 hex>/KEY.A0-B0.A1-B1...   one saved shard: its bytes in
                                                     C order (KEY: the array's place
                                                     in the manifest; Ai-Bi: its index)
    versions/NAME/treeguard.sharded.json             the manifest, create-only, last

The manifest is the sharded format's own (``sharded/manifest.py``): the
data directory it names is the prefix of the shard objects, and each
shard's digest is the one ``local_digests`` computed as the shard was
written. Every process writes the shards it holds (``ObjectStorage.create``:
``If-None-Match: *``, read back before it is taken as written) while the
hashing engine hashes them; the digests are gathered, which is the barrier
after every shard is confirmed, and process 0 writes the manifest, then
the record (bucket.py). A read fetches only the shards its target shardings
overlap (a ``subtree`` only its arrays'), each object whole in one GET
streamed into the shard's buffer and hashed part by part as it lands
there, and the sharded reader compares every digest with the manifest
(``sharded/reader.py``).
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..checkpoint.received import refuse_forged_claim
from ..errors import IntegrityError, StoreError
from ..hashing import Algorithm, hasher
from ..sharded.digests import Index, local_digests
from ..sharded.manifest import (
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    ArrayRecord,
    Manifest,
    Shard,
    parse_with_digest,
)
from .objects import ObjectStorage
from .storage import Conflict

#: How many shard objects one process writes or reads at once.
THREADS = 8
#: The bytes of shard objects a read has under way at once: ``THREADS``
#: GETs of shards up to 32 MiB each in flight, not two.
WINDOW = THREADS * (32 << 20)
#: The name of the threads that write and read shard objects.
SHARD_THREADS = "treeguard-shard"
_SHARD_RE = re.compile(r"^\d{1,12}(\.\d{1,19}-\d{1,19}){0,64}$")


def shard_object(prefix: str, key: int, index: Index) -> str:
    """The object of array ``key``'s saved shard at ``index``, under ``prefix``."""
    return f"{prefix}/{key}" + "".join(f".{a}-{b}" for a, b in index)


def is_shard_name(name: str) -> bool:
    """Whether ``name`` (under a data prefix) has the form of a shard object."""
    return _SHARD_RE.match(name) is not None


def _create(storage: ObjectStorage, name: str, data: memoryview) -> None:
    if isinstance(storage.create(name, data), Conflict):
        raise StoreError(
            f"the shard object {name} was already there, with other bytes",
            context=storage.where(name),
            hint="something else writes under the store's prefix; put the version again",
        )


def write_shards(
    storage: ObjectStorage, prefix: str, leaves: Sequence[Any], algorithm: Algorithm
) -> list[tuple[int, Index, str]]:
    """Writes every shard this process holds (replica 0 of each) as its own
    create-only object, ``THREADS`` at a time, while the hashing engine
    hashes it; ``(leaf, index, digest)`` of each, once every write is
    confirmed.

    At most ``2 * THREADS`` shards wait for their upload at once (each
    holds its host copy), and none is read after a write failed.

    Raises:
      StorageError, StoreError: the first write that failed (after every
        other one ended).
    """
    futures: list[concurrent.futures.Future[None]] = []
    # at most twice THREADS shards held on the host for their upload at once
    window = threading.BoundedSemaphore(2 * THREADS)
    failed_early: list[BaseException] = []

    def upload(name: str, data: memoryview) -> None:
        try:
            _create(storage, name, data)
        except BaseException as e:
            failed_early.append(e)
            raise
        finally:
            window.release()

    with concurrent.futures.ThreadPoolExecutor(THREADS, SHARD_THREADS) as pool:

        def each(key: int, index: Index, data: memoryview) -> None:
            window.acquire()
            if failed_early:  # no more shards copied, hashed or sent after a failure
                window.release()
                raise failed_early[0]
            futures.append(pool.submit(upload, shard_object(prefix, key, index), data))

        try:
            digests = list(local_digests(leaves, algorithm, each))
        finally:
            failed = [e for e in (f.exception() for f in futures) if e is not None]
    if failed:
        raise failed[0]
    return digests


def process_index() -> int:
    """This process's index in the job (0 alone)."""
    from ..sharded import hosts  # lazy: jax's multi-process utilities

    return hosts.process_index()


def put_everywhere(
    storage: ObjectStorage, prefix: str, leaves: Sequence[Any], algorithm: Algorithm
) -> list[bytes]:
    """Every process writes its shards (``write_shards``); every process's
    digests (``save.digests_json``), in process order, once every shard
    of every process is confirmed: the gather is the barrier.

    Raises:
      StorageError, StoreError: in the process whose write failed; a
        ``StoreError`` naming it in every other one.
    """
    from ..sharded import hosts  # lazy: jax's multi-process utilities
    from ..sharded.save import digests_json  # lazy: jax

    failure: Exception | None = None
    try:
        mine = b"+" + digests_json(write_shards(storage, prefix, leaves, algorithm))
    except Exception as e:  # noqa: BLE001 - every process must hear of it
        failure = e
        mine = b"!" + f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:500]
    gathered = hosts.allgather_bytes(mine)
    if failure is not None:
        raise failure
    for process, raw in enumerate(gathered):
        if raw.startswith(b"!"):
            raise StoreError(
                f"process {process} could not write its shards: "
                + raw[1:].decode("utf-8", "replace"),
                context=storage.where(prefix),
                hint="see that process's error; nothing of the version is kept",
            )
    return [raw[1:] for raw in gathered]


def discard(storage: ObjectStorage, prefix: str) -> None:
    """Deletes every object under a data prefix (a put that failed)."""
    for name in storage.list(prefix):
        storage.delete(f"{prefix}/{name}")


class ShardObjects:
    """The shard objects of one data prefix, read ``THREADS`` at a time (a
    ``sharded.reader.Fetch`` that streams: each object hashed as it
    arrives, in the thread that reads it, which also faults in the pages
    of the buffer it fills as they arrive, or fills none for a check)."""

    window: int = WINDOW
    streams: bool = True

    def __init__(self, storage: ObjectStorage, prefix: str, algorithm: Algorithm) -> None:
        self._storage, self._prefix, self._algorithm = storage, prefix, algorithm
        self._records: Sequence[ArrayRecord] = ()
        self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, SHARD_THREADS)

    def prepare(self, records: Sequence[ArrayRecord], keys: Sequence[int]) -> None:
        """Nothing to open: each shard is its own object."""
        self._records = records

    def start(
        self, key: int, shard: Shard, buf: np.ndarray[Any, Any] | None
    ) -> concurrent.futures.Future[str]:
        return self._pool.submit(self._read, key, shard, buf)

    def name(self, key: int, shard: Shard) -> str:
        return (
            f"the shard object {self._storage.where(shard_object(self._prefix, key, shard.index))}"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, key: int, shard: Shard, buf: np.ndarray[Any, Any] | None) -> str:
        """The whole object (one GET) streamed into ``buf`` (or hashed
        only, without one), each part hashed as it lands there: the digest
        of what ``buf`` holds. Refused when missing or of another size."""
        hashed = [hasher(self._algorithm)]

        def each(offset: int, part: memoryview) -> None:
            if offset == 0:  # the first part, or a retry from the start
                hashed[0] = hasher(self._algorithm)
            hashed[0].update(part)

        name = shard_object(self._prefix, key, shard.index)
        if buf is None:
            nbytes = shard.size * self._records[key].dtype.itemsize
            held = self._storage.stream(name, nbytes, each)
        else:
            nbytes = buf.nbytes
            held = self._storage.read_into(name, buf.reshape(-1).view(np.uint8).data, each)
        if held != nbytes:  # its GET and its HEAD agree (``ObjectStorage.stream``)
            found = "missing" if held is None else f"{held} bytes"
            raise IntegrityError(  # the message names the object: no context to repeat it
                f"{self.name(key, shard)} is {found}, the manifest records {nbytes} bytes",
                hint="the version lost data behind the store (an object deleted or replaced by "
                "hand, a lifecycle rule, another client); do not use it: load or promote "
                "another version, or put the weights again",
            )
        return str(hashed[0].hexdigest())


class BucketShards:
    """A sharded version in a bucket, as the sharded reader's ``Source``.

    Args:
      storage: the store's objects.
      version: the version.
      missing: the error for a version whose manifest is gone, given the
        version and the manifest's object.
    """

    def __init__(
        self, storage: ObjectStorage, version: str, missing: Callable[[str, str], Exception]
    ) -> None:
        self._storage, self._version, self._missing = storage, version, missing
        self.where = storage.where(f"versions/{version}")

    def manifest(self, expect: str | None) -> tuple[Manifest, str]:
        """The manifest, its digest compared before it is parsed; refused
        (``FormatError``) when its arrays claim more bytes than the shard
        objects hold, before any buffer is made for them."""
        name = f"versions/{self._version}/{MANIFEST_NAME}"
        found = self._storage.read(
            name, limit=MAX_MANIFEST_BYTES, what="manifest", confirm_missing=True
        )
        if found is None:
            raise self._missing(self._version, name)
        parsed = parse_with_digest(found[0], self._storage.where(name), self.where, expect)
        # every array byte is a stored byte: no buffer is made for more than the objects hold
        held = self._storage.total_size(f"versions/{self._version}/{parsed[0].data}")
        claimed = sum(a.nbytes for a in parsed[0].arrays)
        refuse_forged_claim(claimed, held, self.where, compressed=False)
        return parsed

    def fetch(self, manifest: Manifest, names: Sequence[str]) -> ShardObjects:
        prefix = f"versions/{self._version}/{manifest.data}"
        return ShardObjects(self._storage, prefix, manifest.hash)
