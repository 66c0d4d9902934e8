"""Where a sharded checkpoint is read from: its directory (``Directory``),
or anything else that gives its manifest and its shards' bytes (a store in
a bucket keeps each shard as an object: ``store/bucketshards.py``).

A ``Source`` hands the manifest only after comparing its digest with the
one expected (before parsing it) and running its own gates on what it
holds, and a ``reader.Fetch`` for the shards; ``load`` and ``recheck`` read
every source alike, every shard hashed against the manifest.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ..checkpoint.received import plain_tree, refuse_forged_claim, stored_array_bytes
from .manifest import Manifest, read_with_digest

if TYPE_CHECKING:
    from .reader import Fetch


class Source(Protocol):
    """A sharded checkpoint to read (see the module docstring)."""

    #: the checkpoint, as a message names it
    where: str

    def manifest(self, expect: str | None) -> tuple[Manifest, str]:
        """The parsed manifest and its digest, refused (before it is parsed)
        unless its digest is ``expect`` when given."""
        ...

    def fetch(self, manifest: Manifest, names: Sequence[str]) -> Fetch:
        """The reads of the manifest's shards; ``names``: orbax's name of
        every stored array, in the manifest's order."""
        ...


class Directory:
    """A directory written by ``save_sharded``.

    Args:
      directory: its path.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.where = os.path.abspath(os.fspath(directory))

    def manifest(self, expect: str | None) -> tuple[Manifest, str]:
        found = read_with_digest(self.where, expect=expect)  # compared before it is parsed
        check_received(self.where, found[0])
        return found

    def fetch(self, manifest: Manifest, names: Sequence[str]) -> Fetch:
        from .reader import StoredArrays  # lazy: the reader's collectives import jax

        return StoredArrays(self.where, f"{self.where}/{manifest.data}", names)


def as_source(checkpoint: str | os.PathLike[str] | Source) -> Source:
    """A directory's ``Directory``; any other ``Source`` as it is."""
    if isinstance(checkpoint, (str, os.PathLike)):
        return Directory(checkpoint)
    return checkpoint


def check_received(where: str, manifest: Manifest) -> None:
    """The gates on a checkpoint directory, run before tensorstore opens it
    (``checkpoint.received``): no FIFO or link for it to block on or follow;
    no array of the manifest, and no stored array, claiming more bytes than
    the files hold; no stored chunk beyond its array and no compressing
    codec (treeguard writes sharded arrays uncompressed, so every array byte
    is a stored byte, and what tensorstore decodes or fills is bounded by them).

    Raises:
      FormatError: naming the entry or the array, or both byte counts.
    """
    on_disk = plain_tree(where, hint="copy the checkpoint again, without links or special files")
    refuse_forged_claim(sum(a.nbytes for a in manifest.arrays), on_disk, where, compressed=False)
    data = os.path.join(where, manifest.data)
    stored = stored_array_bytes(data, where, compressed=False)
    refuse_forged_claim(stored, on_disk, where, compressed=False)
