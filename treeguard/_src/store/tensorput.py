"""A local store's put of a ``tensors`` version, its writes overlapped.

A put writes the version's name reserved (the marker, its directory, a
``writing`` record), each tensor the store lacks as an object, the
manifest, and then the record that makes it a candidate. Only these orders
matter, and each is kept:

- no object is named before the name is reserved (a put refused its name
  leaves nothing);
- the manifest is written before ``doomed/`` is read (tensors.py: a
  manifest gc's second reading missed was written after gc's marks, so the
  put sees them). Whether an object is linked before or after the manifest
  does not matter to gc: an object it deletes was listed, so linked, before
  gc read the manifests;
- every entry the put made is durable before the record, the one write
  that makes the version visible: each file (the marker, the ``writing``
  record, each object, the candidate record) is fsynced before its rename
  or link, the manifest before the record, and every directory that got a
  new entry (the root, ``versions/``, the version's, ``tensors/``) is
  fsynced after its last entry and before the record. A kill before the
  record leaves a ``writing`` version of a dead process, which no load,
  verify or promote takes and gc removes, with any object no manifest
  names; a crash of the machine may lose the reservation too (the name
  was never returned: a name made durable is never handed out again).

So the name is reserved on one of the pool's threads while the tree is
laid out (``save``'s layout, kept for the next tree of the same
structure) and, for a tree the memo knows some leaves of (a tree a
verified load handed back, whose arrays the memo does not know were
changed since, so are new bytes), the first leaves it does not know are
brought to the host and written to temp files on other threads
(``start``); each such temp is fsynced only once the name is reserved:
the reservation's fsyncs (the marker's and the ``writing`` record's
bytes), issued while a tensor's bytes were being synced, waited behind
them (7 to 8 ms on the TPU host), but beside the bytes' copy into the
page cache they do not. The reservation's directories are synced on the
thread that writes the candidate record (to a temp file beside the
record, fsynced), which waits for the name. Meanwhile the rest is
hashed; every other leaf the store lacks is written on a second thread
(while it is hashed, in that case; otherwise, and for every numpy leaf,
which is as often a copy of a held tensor, once it is hashed and found
missing); and the header is laid out on a third while the tensors are
written, its manifest written to a temp file beside the objects,
fsynced, renamed into the version's directory and that directory
fsynced. The header is not parsed back (the draft holds its spec; verify
and every load parse it). These small syncs are issued while the
tensors' bytes are being synced and end with them (they wait behind
them), so they cost the put no time of its own. Once the tensors are
written the temp files are linked under their digests' names and
``tensors/`` is synced, and the record's rename is synced while the
log's line is.

A put that fails or is interrupted (Ctrl-C, once or again) takes back
what it wrote at its end, once every thread of it has ended (the pool's
job waits for every task it was handed, an interrupt between a task's
submit and its note held off): each temp file and the reserved
directory are noted in ``Leftovers`` by the thread that wrote them, as
they are written, so no interrupt on the calling thread between a task's
start and its bookkeeping there loses one. The directory stays once the
log's line that makes the version whole is written (``Leftovers.keep``,
called with the line's write, an interrupt held between the two). Every
wait of the calling thread for a thread's work is ``interrupts.result``:
Ctrl-C ends it between two slices of it, never while it holds the
future's lock (which left the thread that would end the future, and the
put's end with it, waiting forever).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
from collections.abc import Callable
from concurrent.futures import Executor, Future

import numpy as np

from .. import interrupts
from ..atomic import DirSyncs, fsync_dir
from ..checkpoint.write import Draft
from ..errors import StorageError
from ..hashing import digest, memo
from . import space, tensors
from .storage import Conflict, LocalStorage

#: The threads of one put: the objects' writes (``IN_FLIGHT`` at once), the manifest.
THREADS = 3
#: The most leaves being written at once (each held on the host meanwhile).
IN_FLIGHT = 2


@dataclasses.dataclass(frozen=True)
class Early:
    """A put's first writes, started once its name is reserved, before the
    rest of the tree is hashed (``start``).

    Attributes:
      known: each leaf's digest as the memo remembers it, or None.
      eager: whether each leaf the memo does not know is written while it
        is hashed (it knew some leaf of the tree: one a verified load handed
        back, whose other arrays are new bytes).
      writes: the temp file of each leaf written already, by its index.
    """

    known: list[str | None]
    eager: bool
    writes: dict[int, Future[str]]

    def failed(self) -> StorageError | None:
        """The first of the writes' errors that is a ``StorageError`` (a
        full disk, naming the leaf), once each write has ended; None if
        there is none."""
        for write in self.writes.values():
            error = interrupts.error(write)
            if isinstance(error, StorageError):
                return error
        return None


class Leftovers:
    """What a put's threads wrote that the put removes at its end
    (``remove``), each noted by the thread that wrote it as it wrote it:
    every temp file (one the put linked or renamed since is gone by then),
    and the reserved directory until the log's line that makes the
    version whole is written (``keep``). Safe to share between threads."""

    def __init__(self) -> None:
        self._temps: list[str] = []
        self._dirs: list[str] = []

    def temp(self, path: str) -> str:
        """Notes the temp file at ``path``, written; returns ``path``."""
        self._temps.append(path)
        return path

    def version(self, path: str) -> None:
        """Notes the version's directory at ``path`` (reserved, or not
        durable after all: its record's sync failed)."""
        self._dirs.append(path)

    def keep(self) -> None:
        """The version is whole (its log's line is written): its directory stays."""
        self._dirs.clear()

    def remove(self, discard: Callable[[str], object]) -> None:
        """Removes each temp file noted, then each directory noted (by
        ``discard``: what was written in it, through the deleter); only
        once no thread of the put writes any more."""
        for path in self._temps:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self._temps.clear()
        for path in self._dirs:
            discard(path)
        self._dirs.clear()


def start(
    storage: LocalStorage,
    draft: Draft,
    pool: Executor,
    reserving: Future[str],
    carried: memo.Carried | None = None,
    *,
    left: Leftovers,
) -> Early:
    """Looks each leaf of ``draft`` up in the digest memo (``carried``: the
    digests a host copy carries) and, for a tree it knows some leaves of,
    starts writing the first ``IN_FLIGHT`` leaves it does not know to temp
    files on ``pool``'s threads (each brought to the host there, and noted
    in ``left``; ``reserving``: the version's directory once its name is
    reserved, named in a full disk's error; temp files are no objects, so
    they are written while the name is picked).
    Those writes are what a fine-tune's put waits on; started first, the
    rest of the put (the hashing, the manifest) runs while they do."""
    lookup = memo.known if carried is None else carried.known
    known: list[str | None] = [lookup(x, draft.algorithm) for x in draft.leaves]
    eager = any(k is not None for k in known)
    early = Early(known, eager, {})
    for i, remembered in enumerate(known):
        if not eager or len(early.writes) >= IN_FLIGHT:
            break
        if remembered is None and not isinstance(draft.leaves[i], np.ndarray):
            early.writes[i] = pool.submit(
                _write_temp, storage, draft, reserving.result, i, left=left
            )
    return early


def put(
    storage: LocalStorage,
    draft: Draft,
    pool: Executor,
    reserved: str,
    *,
    dirs: DirSyncs,
    early: Early,
    left: Leftovers,
) -> None:
    """Writes a version's tensors that the store lacks and its manifest
    (see the module), on ``pool``'s threads, taking over ``early``'s
    writes (``start``); ``reserved`` is the version's directory. The
    manifest's bytes and the new entries of the objects and the manifest
    are left to ``dirs`` (with those the reservation left there), which
    the caller syncs before the record; every temp file written, to
    ``left`` (the caller removes those not linked once the put's threads
    have ended). Started again while gc marks one of its objects
    (tensors.py).

    Raises:
      StoreError: if gc kept marking its objects, ``PUT_TRIES`` times.
      StorageError: if a tensor could not be written.
    """
    # early's writes, taken by the first try
    run = _Put(storage, draft, pool, reserved, dirs, left, early.eager, early.writes)
    known = early.known
    for _ in range(tensors.PUT_TRIES):
        done, digests = run.attempt(known)
        if done:
            return
        known = list(digests)
    raise tensors.gc_kept_marking(storage.where(tensors.AREA))


@dataclasses.dataclass(frozen=True)
class _Put:
    """One put's store, draft and threads; ``left``: where its threads note
    the temp files they write; ``eager``: stage each leaf the memo does not
    know while it is hashed; ``first``: the leaves ``start`` began writing,
    taken by the first try."""

    storage: LocalStorage
    draft: Draft
    pool: Executor
    reserved: str
    dirs: DirSyncs
    left: Leftovers
    eager: bool
    first: dict[int, Future[str]]

    def attempt(self, known: list[str | None]) -> tuple[bool, list[str]]:
        """One try: whether the manifest stands (not if gc marked an object
        or a name was taken meanwhile), and every leaf's digest. A temp
        written and not linked (its bytes held already) is left to the
        put's end (``Leftovers``)."""
        usable, taken = tensors.usable_objects(self.storage)
        staged: dict[str, Future[str]] = {}  # ALGO-HEX: its temp file, written and fsynced
        first = dict(self.first)
        self.first.clear()
        digests = self._hashed(known, usable, staged, first)
        names = {base: _fresh(base, taken) for base in staged}
        algorithm = self.draft.algorithm
        objects = [usable.get(f"{algorithm}-{d}") or names[f"{algorithm}-{d}"] for d in digests]
        manifest = self.pool.submit(self._write_manifest, digests, objects)
        linked = [
            self.storage.link(interrupts.result(staged[b]), f"{tensors.AREA}/{name}", tag=False)
            for b, name in names.items()
        ]
        # also when this put linked nothing: an object it names may have been
        # linked by another put that has not synced the directory yet
        self.dirs.add(self.storage.where(tensors.AREA))
        path = interrupts.result(manifest)
        if Conflict.EXISTS in linked or tensors.doomed_among(self.storage, objects):
            os.unlink(path)  # a name taken meanwhile, or marked by gc: start again
            return False, digests
        return True, digests

    def _hashed(
        self,
        known: list[str | None],
        usable: dict[str, str],
        staged: dict[str, Future[str]],
        first: dict[int, Future[str]],
    ) -> list[str]:
        """Every leaf's digest; each leaf no usable object holds is staged
        (written while it is hashed when ``eager``, or before by ``start``:
        ``first``; such a temp whose bytes are held is left unlinked)."""
        draft, algorithm = self.draft, self.draft.algorithm
        digests: list[str] = []
        flight: list[Future[str]] = list(first.values())
        for i, got in tensors.leaves_to_hash(draft, known, usable):
            if isinstance(got, str):
                digests.append(got)
                continue
            early = None
            # a numpy leaf is hashed first: it is as often a copy of a held tensor
            if self.eager and not isinstance(draft.leaves[i], np.ndarray):
                early = first.pop(i, None) or self._stage(i, got, flight)
            found = digest(got, algorithm)
            base = f"{algorithm}-{found}"
            if base not in usable and base not in staged:
                staged[base] = early or self._stage(i, got, flight)
            digests.append(found)
        return digests

    def _stage(self, i: int, data: memoryview, flight: list[Future[str]]) -> Future[str]:
        """Writes leaf ``i``'s bytes ``data`` to a temp file on a thread,
        once no more than ``IN_FLIGHT`` others are being written (so few
        leaves are held on the host at once, as a ``save`` holds them)."""
        while len(flight) >= IN_FLIGHT:
            interrupts.error(flight.pop(0))  # waits; its error is raised where its path is used
        flight.append(
            self.pool.submit(
                _write_temp, self.storage, self.draft, self.reserved, i, data, left=self.left
            )
        )
        return flight[-1]

    def _write_manifest(self, digests: list[str], objects: list[str]) -> str:
        """The header laid out with ``digests``, and the manifest naming
        ``objects`` written to a temp file beside the objects and fsynced,
        then renamed into the version's directory, which is fsynced (on
        this thread, while the tensors' bytes are being synced: the record
        waits for both); the manifest's path. The header is not parsed
        back: the draft holds its spec, and verify reads it as every load
        does."""
        draft = self.draft
        prefix = len(draft.draft).to_bytes(8, "little") + draft.header(digests)
        raw = tensors.manifest_bytes(prefix, draft.file_bytes, objects)
        tmp = self.left.temp(self.storage.stage(f"{tensors.AREA}/{tensors.TENSORS_FILE}", raw))
        target = os.path.join(self.reserved, tensors.TENSORS_FILE)
        os.replace(tmp, target)
        with space.syncing(self.reserved):
            fsync_dir(self.reserved)
        return target


def _write_temp(
    storage: LocalStorage,
    draft: Draft,
    reserved: str | Callable[[], str],
    i: int,
    data: memoryview | None = None,
    *,
    left: Leftovers,
) -> str:
    """Leaf ``i``'s bytes (``data``, else brought to the host here) in a
    fresh temp file beside the objects (noted in ``left``), fsynced; its
    path. ``reserved``: the version's directory, or what waits for its
    reservation (``start``'s writes, made while the name is picked), whose
    fsyncs go first: issued while these bytes are being synced, they would
    wait behind them. A full disk is the error naming the version and the
    leaf's key path."""
    name = f"{tensors.AREA}/staged"
    with space.typed(reserved, draft.names[i]):
        data = draft.host_bytes(i) if data is None else data
        tmp = left.temp(storage.stage(name, data, sync=False))
        if not isinstance(reserved, str):
            reserved()  # raises what refused the name
        storage.sync_staged(name, tmp)
        return tmp


def _fresh(base: str, taken: set[str]) -> str:
    """The name of a new object holding ``base``'s bytes: none taken."""
    return base if base not in taken else f"{base}.{secrets.token_hex(8)}"
