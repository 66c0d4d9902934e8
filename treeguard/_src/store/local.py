"""The store's primitives on a local directory (see backend.py).

Every change is made under the store's ``flock`` (``Layout.locked``): the
marker and the pointer through ``LocalStorage``'s compare-and-swap, a
version's ``status.json`` rewritten whole by ``atomic_write``, the log
appended line by line, and a version removed through directory
descriptors (deleter.py). A put's counter is taken before its directory,
and gc retires a name in the marker before it deletes anything of it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from typing import Any

from .. import interrupts, kept
from ..atomic import DirSyncs, open_regular, process_mark, remove_stale_temps, writer_alive
from ..checkpoint import read_header, save
from ..checkpoint.write import laid_out
from ..errors import (
    IntegrityError,
    RetiredVersionError,
    StorageError,
    StoreError,
    UnknownVersionError,
)
from ..hashing import Source
from ..sharded.manifest import read as read_manifest
from ..spec import TreeSpec
from . import deleter, gates, log, payload, records, space, tensorput, tensors
from .backend import Offered, Record, Wanted
from .layout import AUTO_RE, MODEL_FILE, STATUS_FILE, Layout
from .lead import lead_acts, not_made, not_recorded
from .log import Event


class LocalBackend:
    """A store in a local directory.

    Args:
      root: the store's directory.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.layout = Layout(root)
        self.root = self.layout.root
        self.storage = self.layout.storage

    # -- the marker and the log ------------------------------------------

    def init(self, *, dedup: bool = False) -> None:
        made = False
        with contextlib.suppress(FileNotFoundError):
            made = self.layout.exists() and bool(self.layout.require())
        if not made:
            self.layout.init()
            with self.layout.locked():
                log.append(self.root, "init", None, {"dedup": True} if dedup else {})
        if dedup:
            with self.layout.locked():
                self.mark("dedup")
                self._areas()

    def _areas(self) -> None:
        """Makes a dedup store's ``tensors/`` and ``doomed/`` (real directories)."""
        for name in (tensors.AREA, tensors.DOOMED):
            kind = self.layout.kind(name)
            if kind is None:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self.layout.path(name))
                kind = self.layout.kind(name)
            if kind != "dir":
                raise StoreError(
                    f"{name} is not a directory",
                    context=self.root,
                    hint="the store never follows links; remove it or pick another root",
                )

    def locked(self) -> AbstractContextManager[None]:
        return self.layout.locked()

    def require(self) -> dict[str, Any]:
        return self.layout.require()

    def mark(self, flag: str) -> dict[str, Any]:
        marker = self.layout.require()
        if not marker.get(flag):
            marker[flag] = True
            self.layout.write_marker(marker)
        return marker

    def append(self, action: str, version: str | None, detail: dict[str, Any]) -> None:
        log.append(self.root, action, version, detail)

    def history(self) -> list[Event]:
        return log.read(self.root)

    # -- records ---------------------------------------------------------

    def record(self, version: str) -> tuple[str, dict[str, Any]]:
        path = self.layout.existing_version(version)
        if version in self.layout.require()["retired"]:
            # gc retires a name before it deletes anything of it: a gc killed
            # in between leaves the directory, which the next gc removes
            raise RetiredVersionError(
                f"version {version} was removed by gc",
                version=version,
                context=self.root,
                hint="`treeguard store gc ROOT` removes what is left of it",
            )
        try:
            return path, records.read(path)
        except FileNotFoundError as e:  # removed between the look and the read
            raise UnknownVersionError(
                f"version {version} was removed while it was read",
                version=version,
                context=self.root,
                hint="`treeguard store ls ROOT` lists the versions",
            ) from e

    def version_names(self) -> list[str]:
        return self.layout.version_names()

    # -- put -------------------------------------------------------------

    def put(self, offered: Offered) -> str:
        if self._open_for_put().get("dedup"):
            return self._put_tensors(offered)
        with self.layout.locked():
            version, path = self._reserve(offered.version, offered.user)
        try:
            model = os.path.join(path, MODEL_FILE)
            with space.typed(path), space.writing(path):  # a disk's failure names the version
                save(model, offered.tree, metadata=offered.user, digest=offered.digest)
                self._record_candidate(version, path, read_header(model).spec, {})
        except BaseException:
            self._discard(path)
            raise
        return version

    def _put_tensors(self, offered: Offered) -> str:
        """A tensors version: its name reserved on a thread while the tree
        is laid out and the first leaves the memo does not know are written
        to temp files, then its tensors the store lacks hashed and written
        (tensorput.py), then its manifest (taken back if gc marked one of
        its objects), then its record as a candidate (tensorput.py says
        which orders matter: no object is named before the name is
        reserved, and a refused name leaves nothing). The directories the
        reservation adds entries to are synced with the candidate record
        and the manifest with its directory, each on its thread while the
        tensors' bytes are; ``tensors/`` once the objects are linked; all
        before the record. At its end, once every thread of it has ended,
        the put removes the temp files it did not link, and its version's
        directory unless its log's line was written (a put that failed or
        was interrupted before the line; one interrupted after it keeps its
        version, whole); Ctrl-C meanwhile is raised once that is done."""
        self._areas()
        left = tensorput.Leftovers()
        with kept.borrowed(tensorput.THREADS + 1, "treeguard-put") as pool:
            try:
                return self._write_tensors(offered, pool, left)
            finally:
                with interrupts.deferred():
                    pool.settle()  # no thread of this put writes once it has returned or raised
                    left.remove(self._discard)

    def _write_tensors(self, offered: Offered, pool: kept.Job, left: tensorput.Leftovers) -> str:
        """``_put_tensors``'s writes, on ``pool``'s threads, each noted in
        ``left`` by the thread that wrote it: the version's name."""
        dirs = DirSyncs()
        with contextlib.ExitStack() as held:  # its wait ends with an interrupt here
            held.enter_context(self.layout.locked(check=False))
            reserving = pool.submit(self._reserve_held, held.pop_all(), offered, dirs, left)
        draft = laid_out(offered.tree, metadata=offered.user, digest=offered.digest)
        early = tensorput.start(self.storage, draft, pool, reserving, offered.carried, left=left)
        try:
            version, path = _named(interrupts.result(reserving))
        except StorageError as refused:  # a full disk: a leaf's error says more
            leaf = early.failed() if space.filled(refused) else None
            if leaf is None:
                raise
            raise leaf from None
        with space.typed(path):
            record = pool.submit(self._stage_candidate, path, draft.spec, dirs, left)
            tensorput.put(self.storage, draft, pool, path, dirs=dirs, early=early, left=left)
            staged = interrupts.result(record)
            with space.syncing(path):
                dirs.sync(pool)  # the objects' (the others' synced meanwhile)
        self._commit_candidate(version, path, staged, draft.spec, pool, left=left)
        return version

    def _stage_candidate(
        self, path: str, spec: TreeSpec, dirs: DirSyncs, left: tensorput.Leftovers
    ) -> tuple[dict[str, Any], str]:
        """The ``writing`` record of the version at ``path``, and its
        candidate written to a temp file (noted in ``left``) and fsynced,
        with the directories the reservation left to ``dirs`` (while the
        tensors' bytes are being synced: the record waits for both), for
        ``_commit_candidate``."""
        version = os.path.basename(path)
        data = records.read(path)
        staged = left.temp(records.staged(path, version, _as_candidate(data, spec)))
        with space.syncing(path):
            dirs.sync()
        return data, staged

    def _commit_candidate(
        self,
        version: str,
        path: str,
        record: tuple[dict[str, Any], str],
        spec: TreeSpec,
        pool: Executor,
        *,
        left: tensorput.Leftovers,
    ) -> None:
        """``_record_candidate`` of a tensors version with the candidate
        ``_stage_candidate`` wrote: renamed over the record if that is still
        the one read, else written anew from the record now there. The
        directory is synced on ``pool`` while the log's line is written and
        synced (a line that outlives its record in a crash names a put that
        did not finish; nothing decides by a put's line). Once the line is
        written (before the log's sync) the version is whole: ``left`` keeps
        it (with the line's write, Ctrl-C held between the two), so an
        interrupt no longer takes it back; a failed sync of the record's
        directory still does."""
        read, tmp = record
        later = DirSyncs()
        with self.layout.locked(check=False):  # the store's, whose version this put reserved
            now = records.read(path)
            if now == read:
                records.commit(path, tmp, dirs=later)
            else:
                os.unlink(tmp)
                records.write(path, version, _as_candidate(now, spec), dirs=later)
            synced = pool.submit(later.sync)
            detail = {"status": "candidate", "kind": "tensors"}
            log.append(self.root, "put", version, detail, written=left.keep)
            try:
                with space.syncing(path):
                    interrupts.result(synced)
            except Exception:
                left.version(path)  # not durable: taken back, its line left as a crash leaves it
                raise

    def _reserve_held(
        self,
        held: contextlib.ExitStack,
        offered: Offered,
        dirs: DirSyncs,
        left: tensorput.Leftovers,
    ) -> str:
        """``_reserve`` of a tensors version under the store's lock, which
        the calling thread took (``held``: a wait for another writer's lock
        on a pool's thread is one no interrupt ends, and the put waits for
        it before it can take back its writes) and this releases; its
        directories left to ``dirs``: its directory, also noted in ``left``
        (the put takes it back if it fails)."""
        with held:  # _reserve reads the marker under it
            path = self._reserve(offered.version, offered.user, "tensors", dirs)[1]
        left.version(path)
        return path

    def put_sharded(self, offered: Offered) -> str:
        from ..sharded import hosts  # lazy: jax's multi-process utilities
        from ..sharded.save import save_sharded  # lazy: orbax and tensorstore

        lead = hosts.process_index() == 0

        def reserve() -> bytes:
            self._open_for_put()
            with self.layout.locked():
                return self._reserve(offered.version, offered.user, "sharded")[0].encode("ascii")

        version = lead_acts(reserve, failed=not_made(self.root)).decode("ascii")
        path = self.layout.version_dir(version)
        try:
            with space.typed(path), space.writing(path):  # a disk's failure names the version
                save_sharded(  # a collective failing in every process
                    path, offered.tree, metadata=offered.user, digest=offered.digest
                )
            lead_acts(  # also the barrier after the record
                lambda: self._finish_sharded(version, path),
                failed=not_recorded(
                    version, self.root, left="the version stays unfinished until gc"
                ),
            )
        except BaseException:
            if lead:
                self._discard(path)
            raise
        return version

    def _open_for_put(self) -> dict[str, Any]:
        """Makes the store if the root is empty; its marker."""
        with contextlib.suppress(FileNotFoundError):
            if self.layout.exists():
                return self.layout.require()
        if os.path.isdir(self.root) and not os.path.islink(self.root):
            content = set(os.listdir(self.root))
            versions = os.path.join(self.root, "versions")
            # what another first put leaves while it makes the store: versions/ (empty)
            # and the marker's temp file; anything else is content that is not a store
            being_made = content <= {"versions"} | {
                n for n in content if "STORE.json" in n and n.endswith(".tmp")
            }
            if content and not (
                being_made and (not os.path.isdir(versions) or not os.listdir(versions))
            ):
                self.layout.require()  # raises: a directory with content that is not a store
        self.layout.init()
        return self.layout.require()

    def _reserve(
        self,
        version: str | None,
        user: dict[str, Any],
        kind: str = "file",
        dirs: DirSyncs | None = None,
    ) -> tuple[str, str]:
        """Picks the name, creates its directory and its ``writing`` record
        (under the lock). The marker and the record are each fsynced before
        their rename (a crash never leaves either torn); the directories
        their new entries are in (the root, ``versions/``, the version's)
        are synced before it returns, or left to ``dirs`` when given, for
        the caller to sync before anything that makes the version visible.
        Until they are synced a crash may lose the name; no put has
        returned it then, and a name made durable is never handed out
        again (the counter, the names held and those gc retired)."""
        later = DirSyncs() if dirs is None else dirs
        marker = self.layout.require()
        marker["seq"] = seq = int(marker.get("seq", 0)) + 1  # the order of puts, not the clock
        if version is None:
            existing = [
                int(m.group(1))
                for n in [*self.layout.names_taken(), *marker["retired"]]
                if (m := AUTO_RE.match(n))
            ]
            number = max([marker["counter"], *existing]) + 1
            marker["counter"] = number
            version = f"v{number:06d}"
        elif version in marker["retired"]:
            raise StoreError(
                f"version {version} existed and was removed by gc; a name is never reused",
                version=version,
                context=self.root,
                hint="pick another name",
            )
        path = self.layout.version_dir(version)
        with space.typed(path):  # a full disk names the version, whose name was picked
            self.layout.write_marker(marker, dirs=later)
            self._make_writing(path, user, kind, seq, later=later)
            if dirs is None:  # a sync the disk answers ENOSPC is a full disk's error too
                try:
                    with space.syncing(path):
                        later.sync()
                except BaseException:  # the name stays taken (the marker's counter holds it)
                    self._discard(path)
                    raise
        return version, path

    def _make_writing(
        self, path: str, user: dict[str, Any], kind: str, seq: int, *, later: DirSyncs
    ) -> None:
        """The reserved version's directory, and its ``writing`` record naming
        its writer (``_reserve``)."""
        version = os.path.basename(path)
        try:
            os.mkdir(path)
        except FileExistsError:
            raise StoreError(
                f"version {version} already exists",
                version=version,
                context=self.root,
                hint="pick another name, or leave version= out to number it",
            ) from None
        later.add(self.layout.versions_dir())
        try:
            records.write(
                path,
                version,
                {
                    "status": "writing",
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    **({"writer": mark} if (mark := process_mark()) else {}),
                    "uid": secrets.token_hex(16),
                    "created": records.now(),
                    "metadata": user,
                    "kind": kind,
                    "seq": seq,
                },
                dirs=later,
            )
        except BaseException:
            self._discard(path)
            raise

    def _finish_sharded(self, version: str, path: str) -> bytes:
        with space.writing(path):  # a disk's failure names the version
            self._record_candidate(version, path, read_manifest(path).spec, {"kind": "sharded"})
        return b""

    def _record_candidate(
        self, version: str, path: str, spec: TreeSpec, detail: dict[str, Any]
    ) -> None:
        """Turns a reserved version whose data is written into a candidate,
        with the sizes of its ``spec``, and logs the put (with ``detail``)."""
        with self.layout.locked():
            records.write(path, version, _as_candidate(records.read(path), spec))
            log.append(self.root, "put", version, {"status": "candidate", **detail})

    def _discard(self, path: str) -> None:
        """Removes a version directory put itself created (its files only)."""
        deleter.remove_version(os.path.dirname(path), os.path.basename(path))

    # -- verify ----------------------------------------------------------

    def verifiable(self, version: str, location: str, record: dict[str, Any]) -> None:
        if record["status"] == "writing":
            raise StoreError(
                f"version {version} is still being written (by process {record.get('pid')}); "
                "there is no complete checkpoint to verify yet",
                version=version,
                hint="verify it once its put returns; if that process died, store.gc() removes it",
            )
        try:
            gates.require_kind(version, location, record)  # a lying record: no verdict at all
        except IntegrityError:
            if not os.path.lexists(location):  # gc removed it since its record was read
                raise UnknownVersionError(
                    f"version {version} was removed while it was verified",
                    version=version,
                    context=self.root,
                    hint="`treeguard store ls ROOT` lists the versions",
                ) from None
            raise

    def read_for_verdict(
        self, version: str, record: Record, contract: Any, digests: list[str]
    ) -> Any:
        kind = payload.of(record)
        path = self.layout.version_dir(version)
        # a file that does not parse is one (a FormatError); a failed read, not
        with gates.reading(version, since="put", where=path, unreadable=(OSError,)):
            return kind.read_for_verdict(self.layout, path, version, contract, digests)

    def digest_now(self, version: str, location: str, record: dict[str, Any]) -> str | None:
        return payload.digest_now(location, record)

    def save_verdict(
        self, version: str, record: dict[str, Any], verdict: dict[str, Any]
    ) -> dict[str, Any]:
        data = records.write(self.layout.version_dir(version), version, record | verdict)
        return data

    # -- the gates and loads ---------------------------------------------

    def check_payload(self, version: str, location: str, record: dict[str, Any]) -> None:
        if record["status"] == "writing" and payload.of(record).kind != "file":
            raise StoreError(
                f"version {version} is still being written; there is no complete "
                "checkpoint to load yet",
                version=version,
                hint="load it once its put returns; if that process died, store.gc() removes it",
            )
        if record["status"] != "writing":
            gates.require_kind(version, location, record)
        payload.of(record).check_plain(self.layout, location, version)

    def recheck(self, version: str, location: str, record: dict[str, Any], digest: str) -> None:
        with gates.reading(version, since="verified"):
            payload.of(record).recheck(location, digest)

    def load(self, version: str, location: str, record: dict[str, Any], want: Wanted) -> Any:
        # a malformed file stays a FormatError, naming what is wrong in it
        with gates.reading(
            version, since="verified" if want.digest else "put", unreadable=(OSError,)
        ):
            return payload.of(record).load(version, location, want)

    def stored_spec(self, version: str, location: str, record: dict[str, Any]) -> TreeSpec:
        return payload.of(record).stored_spec(location)

    @contextlib.contextmanager
    def checkpoint_source(self, version: str, location: str) -> Iterator[Source]:
        if os.path.lexists(os.path.join(location, tensors.TENSORS_FILE)):  # the gates chose
            with payload.TensorsPayload.opened(location) as (reader, _):
                yield reader
            return
        fd = open_regular(os.path.join(location, MODEL_FILE), what="checkpoint")
        try:
            yield fd
        finally:
            os.close(fd)

    # -- gc --------------------------------------------------------------

    def remove(self, version: str, *, retired: bool, grace: float) -> bool:
        """Removes a version under the lock (nothing changes between gc's
        listing and this), retiring the name first when gc did not. No
        ``grace``: a put holds a ``writing`` record from the start, with its
        pid, and gc leaves a live writer's version alone."""
        base = self.layout.versions_dir()

        def may_remove(fd: int) -> bool:
            if not self._collectable(os.path.join(base, version), fd):
                return False
            self.retire(version)
            return True

        return deleter.remove_version(base, version, may_remove=may_remove)

    def after_gc(self, grace: float) -> None:
        """Clears the trash and stale temporary files, and sweeps the tensor
        objects no version names, whatever their age (``grace`` applies to
        a bucket: a local dedup put whose tensors gc took writes them again,
        tensors.py)."""
        deleter.clean(self.layout.versions_dir())
        remove_stale_temps(self.root)
        if os.path.isdir(self.layout.path(tensors.AREA)):
            self._areas()  # never through a link
            remove_stale_temps(self.layout.path(tensors.AREA))
            removed = tensors.sweep(self.storage, exclusive=True)  # under the lock
            if removed != []:
                log.append(self.root, "sweep", None, tensors.summary(removed))

    def retire(self, version: str) -> None:
        """Records in the marker that ``version`` is never handed out or made
        current again, before anything of it is deleted (so a kill
        mid-removal leaves it retired)."""
        marker = self.layout.require()
        if version not in marker["retired"]:
            marker["retired"] = sorted({*marker["retired"], version})
            self.layout.write_marker(marker)

    def retired(self, version: str) -> bool:
        return version in self.layout.require()["retired"]

    def _collectable(self, path: str, fd: int) -> bool:
        """Whether gc may remove the version directory open at ``fd`` (not
        protected); its record is read through ``fd``, never through ``path``."""
        try:
            os.stat(STATUS_FILE, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return True  # reserved by a put that died before its record; only its temps go
        try:
            data = records.read(path, dir_fd=fd)
        except (StoreError, FileNotFoundError):
            return False  # never delete what cannot be read: a person must look
        if data["status"] != "writing":
            return True
        host = data.get("host")
        if host is not None and host != socket.gethostname():
            return False  # its writer's pid means nothing here: gc on the writer's host takes it
        pid = data.get("pid")  # and the writer's mark: a pid reused after a restart is not it
        return not (isinstance(pid, int) and writer_alive(pid, data.get("writer")))


def _as_candidate(data: dict[str, Any], spec: TreeSpec) -> dict[str, Any]:
    """A ``writing`` record as a candidate's, with the sizes of ``spec``."""
    return data | {
        "status": "candidate",
        "pid": None,
        "num_leaves": spec.num_leaves,
        "num_params": spec.num_params,
        "nbytes": spec.nbytes,
    }


def _named(path: str) -> tuple[str, str]:
    """A version's name and its directory."""
    return os.path.basename(path), path
