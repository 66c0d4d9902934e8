"""Reading a sharded checkpoint whole in one process, every shard's digest
checked there: for a check that must not wait on the rest of a job (the
store's ``promote`` and ``rollback``, ``verify`` without a sharded
``like``).

The arrays are restored onto this process's first device a group at a time
(see ``load.groups``) and hashed while the next group is read. Nothing here
is a collective.
"""

from __future__ import annotations

import os
from typing import Any

from .digests import ShardChecker
from .load import check_received, groups, picked, shard_error, unreadable
from .manifest import Manifest, read_with_digest
from .orbax_io import read_arrays


def read_local(
    directory: str | os.PathLike[str], /, *, digest: str | None = None, keep: bool = True
) -> tuple[Manifest, str, Any]:
    """Every array of ``directory`` onto this process's first device, each
    shard's digest checked before it returns.

    Args:
      directory: a directory written by ``save_sharded``.
      digest: the manifest's expected digest; another one is refused before
        any array is read.
      keep: return the tree; with False each group is dropped once hashed,
        so the memory held is one group's, and None is returned for it.

    Returns:
      ``(manifest, its digest, the tree or None)``.

    Raises:
      FormatError: for a malformed manifest, or a saved tree with custom
        nodes (which only a ``like`` tree can rebuild).
      IntegrityError: for another manifest digest, unreadable data, or
        arrays whose bytes differ (naming them).
    """
    import jax  # lazy: reading files never imports jax
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    where = os.path.abspath(os.fspath(directory))
    manifest, found = read_with_digest(where, expect=digest)  # compared before it is parsed
    check_received(where, manifest)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    struct: Any = jax.ShapeDtypeStruct
    restored: list[Any] = [None] * len(manifest.arrays)
    data = os.path.join(where, manifest.data)
    with ShardChecker(manifest.arrays, local=True, algorithm=manifest.hash) as checker:
        for run in groups(manifest.arrays, range(len(manifest.arrays))):
            chosen = set(run)
            leaves = [
                struct(a.shape, a.dtype, sharding=device) if k in chosen else ocp.PLACEHOLDER
                for k, a in enumerate(manifest.arrays)
            ]
            hint = "load it with `treeguard.load_sharded(DIR, like)`"
            item = manifest.tree_of(leaves, str(where), hint=hint)
            try:
                got = picked(jax.tree.leaves(read_arrays(data, item)), run, where)
            except Exception as e:  # orbax and tensorstore raise many kinds
                raise unreadable(where, [manifest.arrays[k].path for k in run], e) from e
            for k, arr in zip(run, got):
                checker.add(k, manifest.arrays[k], arr)
                if keep:
                    restored[k] = arr
            del got
        bad = checker.bad()
    if bad:
        raise shard_error(where, [manifest.arrays[k].path for k in bad], manifest.hash)
    tree = jax.tree.unflatten(manifest.spec.treedef, restored) if keep else None
    return manifest, found, tree
