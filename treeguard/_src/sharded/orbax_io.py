"""The one place treeguard calls orbax and tensorstore: write a tree, open
its stored arrays to read back.

orbax-checkpoint and tensorstore are imported here only, inside the calls,
so ``import treeguard`` stays light. Both sides use the same settings: OCDBT,
zarr3, and no compression, so that every stored byte of an array is an
array byte that the manifest's digests cover, and a damaged chunk reads back
as wrong bytes in every process alike (never as a decoder error in one
process only, which would leave the others waiting). Reads open each array
with the tensorstore spec and context orbax itself reads with
(``get_json_tspec_read``, ``get_ts_context``), so the layout on disk is
orbax's, whatever version wrote it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np


def _handler() -> Any:
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    return ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True, use_compression=False)


def write_arrays(path: str, tree: Any) -> None:
    """Saves ``tree`` to ``path`` with orbax (a collective): orbax writes into a
    temporary directory and renames it to ``path`` once every process is done."""
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    with ocp.Checkpointer(_handler()) as checkpointer:
        checkpointer.save(os.fspath(path), args=ocp.args.PyTreeSave(tree))


def param_names(item: Any) -> list[str]:
    """The names orbax stores the leaves of ``item`` under, in flatten order."""
    import jax  # lazy: reading files never imports jax
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra

    names = ocp.tree.get_param_names(item, include_empty_nodes=False)
    return [str(name) for name in jax.tree.leaves(names)]


def open_arrays(path: str, names: Sequence[str]) -> list[Any]:
    """Starts opening each stored array of ``names`` for reading, as orbax
    would open it; returns tensorstore futures, in order, sharing one context
    (one cache of the OCDBT tree's nodes). Opening reads no array data."""
    import orbax.checkpoint as ocp  # lazy: orbax is the optional sharded extra
    import tensorstore as ts  # lazy: tensorstore comes with orbax
    from etils import epath  # lazy: orbax is the optional sharded extra

    context = ocp.type_handlers.get_ts_context(use_ocdbt=True)
    parent = epath.Path(path)
    out = []
    for name in names:
        info = ocp.type_handlers.ParamInfo(
            name=name, parent_dir=parent, use_zarr3=True, ts_context=context
        )
        spec = ocp.type_handlers.get_json_tspec_read(info, use_ocdbt=True)
        out.append(ts.open(spec, context=context, open=True, read=True))
    return out


def shape_and_dtype(store: Any) -> tuple[tuple[int, ...], Any]:
    """The shape and the numpy dtype of an opened stored array."""
    return tuple(store.shape), np.dtype(store.dtype.numpy_dtype)


def read_into(store: Any, index: tuple[tuple[int, int], ...], buf: Any) -> Any:
    """Starts reading the region ``index`` (``(start, stop)`` per axis) of an
    opened stored array straight into ``buf``, a writable C-order numpy array
    of that region's shape and of the array's dtype; returns the future."""
    import tensorstore as ts  # lazy: tensorstore comes with orbax

    dest = ts.array(buf, copy=False, write=True)
    region = store[tuple(slice(a, b) for a, b in index)]
    if index:
        region = region.translate_to[tuple(0 for _ in index)]
    return dest.write(region)


def read_into_parts(store: Any, index: tuple[tuple[int, int], ...], parts: Any) -> Any:
    """Starts reading the region ``index`` of an opened stored array straight
    into ``parts``: ``(offset, view)`` pairs, each a writable numpy view
    (any strides) of the region's part that starts at ``offset`` within it,
    together covering it exactly once; returns the future."""
    import tensorstore as ts  # lazy: tensorstore comes with orbax

    layers = [ts.array(view, copy=False, write=True).translate_to[at] for at, view in parts]
    dest = layers[0] if len(layers) == 1 else ts.overlay(layers)
    region = store[tuple(slice(a, b) for a, b in index)].translate_to[tuple(0 for _ in index)]
    return dest.write(region)
