"""Reading a sharded checkpoint whole in one process, every shard's digest
checked there: for a check that must not wait on the rest of a job (the
store's ``promote`` and ``rollback``, ``verify`` without a sharded
``like``).

Every saved shard is read and hashed in this process (``reader``), onto
this process's first device. Nothing here is a collective.
"""

from __future__ import annotations

import os
from typing import Any

from .manifest import Manifest
from .orbax_io import param_names
from .reader import read_verified
from .source import Source, as_source


def read_local(
    directory: str | os.PathLike[str] | Source, /, *, digest: str | None = None, keep: bool = True
) -> tuple[Manifest, str, Any]:
    """Every array of ``directory`` onto this process's first device, each
    shard's digest checked before it returns.

    Args:
      directory: a directory written by ``save_sharded``.
      digest: the manifest's expected digest; another one is refused before
        any array is read.
      keep: return the tree; with False every shard is read and hashed and
        none is kept, so the memory held is a few shards', and None is
        returned for the tree.

    Returns:
      ``(manifest, its digest, the tree or None)``.

    Raises:
      FormatError: for a malformed manifest, or a saved tree with custom
        nodes (which only a ``like`` tree can rebuild).
      IntegrityError: for another manifest digest, unreadable data, or
        arrays whose bytes differ (naming them).
    """
    import jax  # lazy: reading files never imports jax

    source = as_source(directory)
    where = source.where
    manifest, found = source.manifest(digest)  # compared before it is parsed
    n = len(manifest.arrays)
    hint = "load it with `treeguard.load_sharded(DIR, like)`"
    names = param_names(manifest.tree_of(list(range(n)), where, hint=hint))
    device = jax.sharding.make_single_device_sharding(jax.local_devices()[0])  # type: ignore[no-untyped-call]
    fetch = source.fetch(manifest, names)
    restored = read_verified(where, manifest, fetch, [device] * n, local=True, keep=keep)
    tree = jax.tree.unflatten(manifest.spec.treedef, restored) if keep else None
    return manifest, found, tree
