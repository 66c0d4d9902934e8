"""``save_sharded``: every process writes its shards through orbax, hashes
them, and process 0 writes the manifest last."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
from collections.abc import Mapping
from typing import Any

import jax

from ..env import environment
from ..errors import InvalidTreeError
from ..hashing import DEFAULT, Algorithm, check_algorithm
from ..leaf import describe_sharding
from ..paths import keystr
from ..spec import TreeSpec, spec_of
from . import hosts
from .digests import Index, local_digests
from .manifest import (
    MANIFEST_NAME,
    ArrayRecord,
    Manifest,
    Shard,
    is_data_name,
    metadata_json,
    new_data_name,
    write,
)
from .orbax_io import write_arrays


def _stale(name: str, keep: str) -> bool:
    """Whether ``name`` in a checkpoint directory is left over from an older
    or an interrupted save: a data directory other than ``keep``, orbax's
    temp directory of one, or a manifest temp file."""
    if name in (keep, MANIFEST_NAME):
        return False
    if is_data_name(name):
        return True
    head = name.split(".", 1)[0]
    if is_data_name(head) and ".orbax-checkpoint-tmp" in name:
        return True
    return name.startswith(f".{MANIFEST_NAME}.") and name.endswith(".tmp")


def _remove_stale(directory: str, keep: str) -> None:
    for name in os.listdir(directory):
        if not _stale(name, keep):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def save_sharded(
    directory: str | os.PathLike[str],
    tree: Any,
    /,
    *,
    metadata: Mapping[str, Any] | None = None,
    digest: Algorithm = DEFAULT,
) -> None:
    """Writes a tree of sharded arrays as a verified multi-host checkpoint.

    Every process of the job calls it with its own part of the same global
    arrays. The arrays go through orbax onto tensorstore (zarr3 in an OCDBT
    database, uncompressed), each into its own temporary directory that
    orbax renames into place when every process is done. Each process hashes
    the shards it writes (one digest per stored shard) while orbax writes
    them; the digests are
    gathered to process 0, which writes ``treeguard.sharded.json`` (the
    spec with its shardings, the environment, the metadata and every
    digest) atomically, last, and then removes the data of the previous
    save. A kill of any process at any moment leaves the previous
    checkpoint in ``directory`` loadable.

    Args:
      directory: the checkpoint directory (created if absent). The same
        path in every process, on a file system all of them share.
      tree: a pytree whose leaves are ``jax.Array``s.
      metadata: JSON-ready facts to keep with it (step, data version...).
      digest: the shards' and the manifest's hash algorithm, ``"blake3"``
        (the default) or ``"sha256"``.

    Raises:
      InvalidTreeError: for a tree that contains itself, non-array leaves,
        typed PRNG keys or leaves that are not ``jax.Array``s (a TypeError).
      TypeError: for metadata that JSON cannot hold exactly.
      ValueError: for a ``digest`` other than ``"blake3"`` and ``"sha256"``.

    Example:
      >>> import tempfile, jax.numpy as jnp, treeguard
      >>> d = tempfile.mkdtemp()
      >>> treeguard.save_sharded(d, {"w": jnp.ones((4, 2))}, metadata={"step": 3})
      >>> treeguard.load_sharded(d, {"w": jnp.zeros((4, 2))})["w"].sum()
      Array(8., dtype=float32)
    """
    algorithm = check_algorithm(digest)
    meta = metadata_json(metadata)
    spec, leaves, paths = checked_leaves(tree)
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    data = hosts.broadcast_text(new_data_name())
    with concurrent.futures.ThreadPoolExecutor(1) as background:
        hashing = background.submit(lambda: list(local_digests(leaves, algorithm)))
        write_arrays(os.path.join(directory, data), tree)
        digests = hashing.result()
    gathered = hosts.allgather_bytes(digests_json(digests))
    failure = b""
    if hosts.process_index() == 0:
        try:
            manifest = manifest_of(data, spec, meta, paths, leaves, gathered, algorithm)
            write(directory, manifest)
            _remove_stale(directory, data)
        except Exception as e:  # noqa: BLE001 - every process must hear of it
            failure = f"{type(e).__name__}: {e}".encode("utf-8", "replace")[:500] or b"?"
            error: Exception = e
    outcome = hosts.allgather_bytes(failure)[0]  # also the barrier after the commit
    if failure:
        raise error
    if outcome:
        raise OSError(
            f"{directory}: process 0 could not finish the save: {outcome.decode()}\n"
            "hint: unless its manifest was written, the previous checkpoint is still current"
        )


def checked_leaves(tree: Any) -> tuple[TreeSpec, list[Any], list[str]]:
    """The spec (with shardings), the leaves and their paths of a tree
    ``save_sharded`` can store.

    Raises:
      InvalidTreeError: for typed PRNG keys or leaves that are not
        ``jax.Array``s (and as ``spec_of`` does).
    """
    spec = spec_of(tree, sharding=True)
    leaves = jax.tree.leaves(tree)
    paths = [keystr(p) for p in spec.paths]
    keys = [
        (path or "<root>", f"a typed PRNG key array ({leaf.dtype}): orbax stores no key dtype")
        for path, leaf in zip(paths, leaves)
        if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    ]
    if keys:
        raise InvalidTreeError(
            keys,
            hint="save the key data, `jax.random.key_data(k)`, and after load_sharded wrap it "
            "back with `jax.random.wrap_key_data(data, impl=...)`; or save keys with "
            "treeguard.save, which keeps their implementation",
        )
    unplaced = [
        (path or "<root>", f"save_sharded stores jax.Array leaves, got {type(leaf).__name__}")
        for path, leaf in zip(paths, leaves)
        if not isinstance(leaf, jax.Array)
    ]
    if unplaced:
        raise InvalidTreeError(
            unplaced, hint="place them first, e.g. `jax.device_put(x, NamedSharding(mesh, spec))`"
        )
    return spec, leaves, paths


def digests_json(digests: list[tuple[int, Index, str]]) -> bytes:
    """This process's ``(leaf, index, digest)`` of each shard, to gather."""
    return json.dumps([[i, [list(p) for p in index], h] for i, index, h in digests]).encode()


def manifest_of(  # noqa: PLR0917 - two call sites
    data: str,
    spec: TreeSpec,
    meta: dict[str, Any],
    paths: list[str],
    leaves: list[Any],
    gathered: list[bytes],
    algorithm: Algorithm,
) -> Manifest:
    """The manifest of a save, from every process's gathered digests
    (``digests_json``, in process order)."""
    shards: list[list[Shard]] = [[] for _ in leaves]
    for process, raw in enumerate(gathered):
        for i, index, h in json.loads(raw):
            shards[i].append(Shard(tuple((a, b) for a, b in index), process, h))
    arrays = tuple(
        ArrayRecord(
            path,
            tuple(leaf.shape),
            leaf.dtype,
            describe_sharding(leaf),
            tuple(sorted(s, key=lambda x: x.index)),
        )
        for path, leaf, s in zip(paths, leaves, shards)
    )
    return Manifest(data, spec, hosts.process_count(), environment(), meta, arrays, algorithm)
