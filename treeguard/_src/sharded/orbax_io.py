"""The one place treeguard calls orbax: write a tree, read one back.

orbax-checkpoint and tensorstore are imported here only, inside the calls,
so ``import treeguard`` stays light. Both sides use the same handler
settings: OCDBT, zarr3, and no compression, so that every stored byte of an
array is an array byte that the manifest's digests cover, and a damaged
chunk reads back as wrong bytes in every process alike (never as a decoder
error in one process only, which would leave the others waiting).
"""

from __future__ import annotations

import os
from typing import Any


def _handler() -> Any:
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    return ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False)


def write_arrays(path: str, tree: Any) -> None:
    """Saves ``tree`` to ``path`` with orbax (a collective): orbax writes into a
    temporary directory and renames it to ``path`` once every process is done."""
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    with ocp.Checkpointer(_handler()) as checkpointer:
        checkpointer.save(os.fspath(path), args=ocp.args.PyTreeSave(tree))


def read_arrays(path: str, item: Any) -> Any:
    """Restores the tree ``item`` describes (``jax.ShapeDtypeStruct`` leaves with
    shardings) from ``path``. No barrier: each process reads its own shards and
    returns, so a failure in one process cannot leave another waiting here."""
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra
    from etils import epath  # lazy: orbax is the optional sharded extra

    restore_args = ocp.checkpoint_utils.construct_restore_args(item)
    return _handler().restore(
        epath.Path(path), args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args)
    )
