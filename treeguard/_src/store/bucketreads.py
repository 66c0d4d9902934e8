"""How ``BucketBackend`` reads a version's checkpoint: a file version's
object, or a tensors version's manifest and tensor objects (tensors.py)
read as the one file they stand for (tensorread.py). Every read goes
through the checkpoint reader: the bytes are hashed as they download, into
the arrays' own memory (a partial load fetches its header and the selected
tensors only), and every hash is checked before anything is returned; the
digest is compared with the one recorded at put and, for a verified
version, with the verdict's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..checkpoint import Header
from ..checkpoint.files import read_raw_header
from ..checkpoint.read import checked_header, load_source, verify_source
from ..errors import FormatError, IntegrityError, StoreError, UnknownVersionError
from ..hashing import Source
from ..sharded.manifest import MANIFEST_NAME
from ..spec import TreeSpec
from . import gates
from .backend import Record, Wanted
from .bucketshards import BucketShards
from .layout import MODEL_FILE
from .objectreader import ObjectReader, open_reader
from .objects import ObjectStorage
from .payload import ShardedPayload
from .records import is_sharded
from .tensorread import opened
from .tensors import AREA, MANIFEST_LIMIT, TENSORS_FILE, parse_manifest

_SHARDED = ShardedPayload()


def version_object(version: str, leaf: str) -> str:
    return f"versions/{version}/{leaf}"


def _leaf(record: Record) -> str:
    if is_sharded(record):
        return MANIFEST_NAME
    return TENSORS_FILE if record.get("kind") == "tensors" else MODEL_FILE


class BucketReads:
    """The reads of ``BucketBackend``, over its storage."""

    storage: ObjectStorage
    root: str
    retired: Callable[[str], bool]
    _record: Callable[[str], dict[str, Any]]

    def _where(self, version: str, record: Record) -> str:
        return self.storage.where(version_object(version, _leaf(record)))

    @contextlib.contextmanager
    def _shards(self, version: str, record: Record) -> Iterator[BucketShards]:
        """A sharded version as the sharded reader's source, with the errors
        of reading it naming the version."""
        with gates.reading(version, since="put", where=self._where(version, record)):
            yield BucketShards(self.storage, version, self._missing)

    def _missing(self, version: str, name: str) -> Exception:
        if self.retired(version):
            return UnknownVersionError(
                f"version {version} was removed by gc while it was read",
                version=version,
                context=self.root,
                hint=f"`treeguard store ls {self.root}` lists the versions",
            )
        return IntegrityError(
            f"version {version}: its checkpoint object is missing",
            version=version,
            context=self.storage.where(name),
            hint="do not use it; put the weights again",
        )

    @contextlib.contextmanager
    def _reader(self, version: str, record: Record) -> Iterator[Source]:
        """The version's checkpoint, read as it downloads, with the errors
        of reading it naming the version."""
        name = version_object(version, _leaf(record))
        where = self._where(version, record)
        with gates.reading(version, since="put", where=where, unreadable=(FormatError,)):
            if _leaf(record) == TENSORS_FILE:
                found = self.storage.read(
                    name, limit=MANIFEST_LIMIT, what="tensors manifest", confirm_missing=True
                )
                if found is None:
                    raise self._missing(version, name)
                manifest = parse_manifest(found[0], where)
                with opened(manifest, self._open_tensor, where) as (tensors, _):
                    yield tensors
                return
            reader = open_reader(self.storage, name)
            if reader is None:
                raise self._missing(version, name)
            try:
                yield reader
            finally:
                reader.close()

    def _open_tensor(self, name: str) -> ObjectReader | None:
        reader = open_reader(self.storage, f"{AREA}/{name}")
        if reader is not None:
            reader.plan(None)  # each tensor is read whole
        return reader

    def _header(self, version: str, record: Record, reader: Source) -> Header:
        """The checkpoint's header, fetched alone (the reader announces it)."""
        where = self._where(version, record)
        return checked_header(*read_raw_header(reader, where), where, None)

    def load(self, version: str, location: str, record: dict[str, Any], want: Wanted) -> Any:
        # a candidate has no verdict yet: the digest recorded at put is the one to find
        expected = want.digest or record.get("stored_digest")
        if is_sharded(record):
            with self._shards(version, record) as source:
                return _SHARDED.load(version, source, dataclasses.replace(want, digest=expected))
        with self._reader(version, record) as reader:  # fetches what the reader announces
            where = self._where(version, record)
            return load_source(reader, where, want.like, expected, want.subtree, want.ignore)

    def stored_spec(self, version: str, location: str, record: dict[str, Any]) -> TreeSpec:
        if is_sharded(record):
            with self._shards(version, record) as source:
                return source.manifest(record.get("stored_digest"))[0].spec
        with self._reader(version, record) as reader:
            return self._header(version, record, reader).spec

    def checkpoint_source(self, version: str, location: str) -> AbstractContextManager[Source]:
        record = self._record(version)
        if is_sharded(record):
            raise StoreError(
                f"version {version} is sharded: it has no checkpoint file to copy",
                version=version,
                context=self._where(version, record),
                hint="load it onto a mesh with store.load_version(version, like)",
            )
        return self._reader(version, record)

    def check_payload(self, version: str, location: str, record: dict[str, Any]) -> None:
        """Nothing to look at: every object is read by name."""

    def recheck(self, version: str, location: str, record: dict[str, Any], digest: str) -> None:
        if is_sharded(record):
            with self._shards(version, record) as source:
                _SHARDED.recheck(source, digest)
            return
        with self._reader(version, record) as reader:
            verify_source(reader, self._where(version, record), expect_digest=digest)

    def read_for_verdict(
        self, version: str, record: Record, contract: Any, digests: list[str]
    ) -> Any:
        if is_sharded(record):
            digests.append(str(record.get("stored_digest")))
            with self._shards(version, record) as source:
                return _SHARDED.read_source(source, contract, digests[0])
        with self._reader(version, record) as reader:
            digests.append(self._header(version, record, reader).digest)
            where = self._where(version, record)
            if digests[0] != record.get("stored_digest"):
                raise IntegrityError(
                    f"version {version}: its checkpoint object was changed behind the store: "
                    "its digest is not the one recorded at put",
                    version=version,
                    context=where,
                    hint="do not use it; restore the object from a backup, or put the weights "
                    "again",
                )
            return load_source(reader, where, contract, digests[0], None, ())

    def digest_now(self, version: str, location: str, record: dict[str, Any]) -> str | None:
        """The digest recorded at put: the object under it is create-only, and
        every read of it checks the digest it finds against this one."""
        digest = record.get("stored_digest")
        return digest if isinstance(digest, str) else None
