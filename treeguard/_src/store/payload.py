"""What a version holds, behind one interface: a checkpoint file or a
sharded checkpoint.

A version's record names its kind (``file`` or ``sharded``); ``of(record)``
gives the payload that knows how to read, re-check and load that kind. The
store never branches on the kind itself.

- ``FilePayload``: ``model.safetensors``; its digest is the header digest
  (which covers every tensor's hash).
- ``TensorsPayload``: a manifest (tensors.py) naming the store's shared
  tensor objects; its digest is the header digest, as a file version's, and
  every read goes through ``tensorread.TensorsReader``, which stands for
  the file.
- ``ShardedPayload``: ``save_sharded``'s manifest and data directories in
  the version's directory; its digest is the manifest's, and since the
  manifest alone does not prove the bytes, a full check reads every shard
  again. Its directory is walked before any use: a link, FIFO, socket or
  device anywhere in it is refused.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, ClassVar

from ..atomic import read_regular
from ..checkpoint import load, read_header, verify_file
from ..checkpoint.read import load_source, verify_source
from ..errors import FormatError, TreeMismatchError
from ..sharded.manifest import read as read_manifest
from ..sharded.manifest import sharded_digest
from ..sharded.source import Source, as_source
from ..spec import TreeSpec, spec_of
from .backend import Wanted
from .layout import MODEL_FILE, Layout
from .records import is_sharded
from .tensorread import TensorsReader, local_opener, opened
from .tensors import MANIFEST_LIMIT, TENSORS_FILE, parse_manifest


def shardable(like: Any) -> bool:
    """Whether ``like`` is a tree whose every leaf carries a sharding to
    restore onto (a ``jax.Array`` or a ``jax.ShapeDtypeStruct`` with one)."""
    if like is None or isinstance(like, TreeSpec):
        return False
    import jax  # lazy: jax is imported only where a sharded tree can be

    leaves = jax.tree.leaves(like)
    return bool(leaves) and all(
        isinstance(x, (jax.Array, jax.ShapeDtypeStruct)) and getattr(x, "sharding", None)
        for x in leaves
    )


class FilePayload:
    """A version that holds one checkpoint file."""

    kind: ClassVar[str] = "file"
    #: whether loading it onto shardings is a collective of every process
    collective: ClassVar[bool] = False
    evidence: ClassVar[tuple[str, str]] = ("header valid", "header and every tensor hash match")

    def location(self, version_dir: str) -> str:
        """The path the checkpoint readers take: the file."""
        return os.path.join(version_dir, MODEL_FILE)

    def check_plain(self, layout: Layout, version_dir: str, version: str) -> None:
        """Nothing to walk: the file is opened without following links."""

    def stored_spec(self, version_dir: str) -> TreeSpec:
        return read_header(self.location(version_dir)).spec

    def digest_now(self, version_dir: str) -> str:
        return read_header(self.location(version_dir)).digest

    def recheck(self, version_dir: str, digest: str) -> None:
        """Reads every byte again and refuses another header digest."""
        verify_file(self.location(version_dir), expect_digest=digest)

    def load(self, version: str, version_dir: str, want: Wanted) -> Any:
        """``load`` with every hash checked, refusing a file whose header
        digest is not ``want.digest`` (when given) before any array is read,
        on the same read (of the part ``want`` selects)."""
        return load(
            self.location(version_dir),
            like=want.like,
            expect_digest=want.digest,
            subtree=want.subtree,
            ignore=want.ignore,
        )

    def read_for_verdict(
        self, layout: Layout, version_dir: str, version: str, contract: Any, digests: list[str]
    ) -> Any:
        """Loads the version against ``contract``, leaving the digest it
        read under in ``digests`` before any array is read."""
        model = self.location(version_dir)
        digests.append(read_header(model).digest)
        return load(model, like=contract, expect_digest=digests[0])


class ShardedPayload:
    """A version that holds ``save_sharded``'s manifest and data."""

    kind: ClassVar[str] = "sharded"
    collective: ClassVar[bool] = True
    evidence: ClassVar[tuple[str, str]] = (
        "manifest valid",
        "manifest and every shard's digest match",
    )

    def location(self, version_dir: str) -> str:
        """The path the sharded readers take: the version's directory."""
        return version_dir

    def check_plain(self, layout: Layout, version_dir: str, version: str) -> None:
        layout.plain_tree(version_dir, version=version)

    def stored_spec(self, version_dir: str) -> TreeSpec:
        return read_manifest(version_dir).spec

    def digest_now(self, version_dir: str) -> str:
        return sharded_digest(version_dir)

    def recheck(self, version_dir: str | Source, digest: str) -> None:
        """Reads every shard again in this process and checks its digest,
        refusing another manifest digest; holds one group of arrays at a
        time, and waits on no other process."""
        from ..sharded.recheck import read_local  # lazy: orbax and tensorstore

        read_local(version_dir, digest=digest, keep=False)

    def load(self, version: str, version_dir: str | Source, want: Wanted) -> Any:
        """``load_sharded`` onto ``want.like``'s shardings with every shard
        hashed, refusing a manifest whose digest is not ``want.digest`` (when
        given) before any array is read (a collective in a multi-process job)."""
        if not shardable(want.like):
            raise ValueError(
                f"version {version} is sharded: `like` must be a tree of jax.Arrays or "
                "jax.ShapeDtypeStructs with shardings, the layout to restore onto\n"
                "hint: `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, "
                "spec))` for each leaf"
            )
        from ..sharded.load import load_expecting  # lazy: orbax and tensorstore

        return load_expecting(
            version_dir, want.like, digest=want.digest, subtree=want.subtree, ignore=want.ignore
        )

    def read_for_verdict(
        self, layout: Layout, version_dir: str, version: str, contract: Any, digests: list[str]
    ) -> Any:
        """Onto ``contract``'s shardings when it has them (every process of
        a job calls verify then), else whole onto this process's first device."""
        layout.plain_tree(version_dir, version=version)
        digests.append(sharded_digest(version_dir))
        return self.read_source(version_dir, contract, digests[0])

    @staticmethod
    def read_source(source: str | Source, contract: Any, digest: str) -> Any:
        """The read a verdict is computed on, refusing another manifest
        digest: onto ``contract``'s shardings when it has them, else whole
        onto this process's first device, checked against ``contract``."""
        from ..sharded.load import contract_mismatches, load_expecting  # lazy: orbax
        from ..sharded.recheck import read_local  # lazy: orbax and tensorstore

        if shardable(contract):
            return load_expecting(source, contract, digest=digest)
        if contract is None:
            return read_local(source, digest=digest)[2]
        manifest = as_source(source).manifest(digest)[0]
        want = contract if isinstance(contract, TreeSpec) else spec_of(contract)
        found = contract_mismatches(manifest.spec, want)
        if found:
            raise TreeMismatchError(found, expected_from="`like`", actual_from="the checkpoint")
        return read_local(source, digest=digest)[2]


class TensorsPayload:
    """A version that holds a manifest of the store's shared tensor objects
    (a local store's ``ROOT/tensors/``, its directory two levels up)."""

    kind: ClassVar[str] = "tensors"
    collective: ClassVar[bool] = False
    evidence: ClassVar[tuple[str, str]] = (
        "manifest valid",
        "manifest and every tensor hash match",
    )

    def location(self, version_dir: str) -> str:
        """The path ``VersionInfo.path`` shows: the version's directory."""
        return version_dir

    def check_plain(self, layout: Layout, version_dir: str, version: str) -> None:
        """Nothing to walk: the manifest and each object are opened without
        following links."""

    @staticmethod
    def opened(version_dir: str) -> contextlib.AbstractContextManager[tuple[TensorsReader, Any]]:
        """The version as its checkpoint file: the reader and its header."""
        where = os.path.join(version_dir, TENSORS_FILE)
        raw = read_regular(where, limit=MANIFEST_LIMIT, what="tensors manifest")
        root = os.path.dirname(os.path.dirname(version_dir))
        return opened(parse_manifest(raw, where), local_opener(root), version_dir)

    def stored_spec(self, version_dir: str) -> TreeSpec:
        with self.opened(version_dir) as (_, header):
            spec: TreeSpec = header.spec
            return spec

    def digest_now(self, version_dir: str) -> str:
        with self.opened(version_dir) as (_, header):
            digest: str = header.digest
            return digest

    def recheck(self, version_dir: str, digest: str) -> None:
        """Reads every tensor again and refuses another header digest."""
        with self.opened(version_dir) as (reader, _):
            verify_source(reader, version_dir, expect_digest=digest)

    def load(self, version: str, version_dir: str, want: Wanted) -> Any:
        """As ``FilePayload.load``, each tensor read from its object."""
        with self.opened(version_dir) as (reader, _):
            return load_source(
                reader, version_dir, want.like, want.digest, want.subtree, want.ignore
            )

    def read_for_verdict(
        self, layout: Layout, version_dir: str, version: str, contract: Any, digests: list[str]
    ) -> Any:
        with self.opened(version_dir) as (reader, header):
            digests.append(header.digest)
            return load_source(reader, version_dir, contract, digests[0], None, ())


Payload = FilePayload | ShardedPayload | TensorsPayload

_FILE = FilePayload()
_SHARDED = ShardedPayload()
_TENSORS = TensorsPayload()


def of(record: dict[str, Any]) -> Payload:
    """The payload of a validated record's kind."""
    if is_sharded(record):
        return _SHARDED
    return _TENSORS if record.get("kind") == "tensors" else _FILE


def exported_as(record: dict[str, Any]) -> Payload:
    """The payload of a version's export: a ``tensors`` version is written
    as the one file it stands for."""
    return _SHARDED if is_sharded(record) else _FILE


def digest_now(version_dir: str, record: dict[str, Any]) -> str | None:
    """The digest of the checkpoint there now (header or manifest), or None."""
    try:
        return of(record).digest_now(version_dir)
    except (FormatError, OSError):
        return None
