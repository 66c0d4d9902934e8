"""``load_sharded``: the manifest, then the contract, then the data, then
every shard's sha256."""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import jax

from ..diff import mismatches
from ..errors import IntegrityError, TreeMismatchError
from ..mismatch import Mismatch
from ..paths import Path, keystr, parse
from ..spec import LeafSpec, TreeSpec, describe_sharding, spec_of
from . import hosts
from .digests import bad_shards
from .manifest import ArrayRecord, Manifest, read
from .orbax_io import read_arrays

logger = logging.getLogger("treeguard.sharded")
_IGNORED_KINDS = frozenset(("weak_type", "sharding"))


def _starts_with(path: Path, prefix: Path) -> bool:
    return path[: len(prefix)] == prefix


def _user_path(text: Any, what: str) -> Path:
    if not isinstance(text, str):
        raise ValueError(f"{what} paths are key-path strings, got {type(text).__name__}")
    try:
        return parse(text)
    except ValueError as e:
        raise ValueError(f"{what}: {e}; write paths as \"['dense1']['w']\"") from None


def migrate(  # noqa: PLR0917 - one call site
    manifest: Manifest,
    like_spec: TreeSpec,
    like_leaves: Sequence[Any],
    rename: Mapping[str, str],
    allow_missing: Sequence[str],
    where: str,
) -> list[int | None]:
    """For each leaf of ``like``, the stored array it takes (or None: it keeps
    ``like``'s value), under a deliberate migration. The same meaning as
    ``treeguard.load``'s ``rename`` and ``allow_missing``: a rename maps a
    stored leaf or subtree to a new path (the longest prefix wins); a path of
    ``like`` under ``allow_missing`` may be absent; every other difference
    is still a ``TreeMismatchError``."""
    stored = [a.path for a in manifest.arrays]
    stored_paths = [parse(p) for p in stored]
    renames = [(_user_path(o, "rename"), _user_path(n, "rename"), o) for o, n in rename.items()]
    new_name: list[str] = []
    used: set[str] = set()
    for name, p in zip(stored, stored_paths):
        best = None
        for old, new, text in renames:
            if _starts_with(p, old) and (best is None or len(old) > len(best[0])):
                best = (old, new, text)
        if best is None:
            new_name.append(name)
        else:
            new_name.append(keystr((*best[1], *p[len(best[0]) :])))
            used.add(best[2])
    unused = [text for _, _, text in renames if text not in used]
    if unused:
        close = difflib.get_close_matches(unused[0], stored, n=1)
        raise ValueError(
            f"rename: {unused[0]} names no leaf or subtree of the checkpoint {where}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    by_new: dict[str, int] = {}
    for k, n in enumerate(new_name):
        if n in by_new:
            raise ValueError(
                f"rename: {stored[by_new[n]]} and {stored[k]} would both become {n} in {where}"
            )
        by_new[n] = k
    like_paths = like_spec.paths
    optional = [_user_path(a, "allow_missing") for a in allow_missing]
    for text, p in zip(allow_missing, optional):
        if not any(_starts_with(lp, p) for lp in like_paths):
            raise ValueError(f"allow_missing: {text} names no leaf or subtree of `like`")
    sources: list[int | None] = []
    stored_flat: dict[str, LeafSpec] = {}
    like_flat: dict[str, LeafSpec] = {}
    for i, (lpath, rec) in enumerate(zip(like_paths, like_spec.records)):
        lname = keystr(lpath)
        if lname in by_new:
            a = manifest.arrays[by_new[lname]]
            sources.append(by_new[lname])
            stored_flat[lname] = LeafSpec(a.shape, a.dtype)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
        elif any(_starts_with(lpath, p) for p in optional):
            if not isinstance(like_leaves[i], jax.Array):
                raise ValueError(
                    f"allow_missing: {lname} is absent from {where} and `like` holds no value "
                    "to keep there; pass a `like` tree with arrays"
                )
            sources.append(None)
        else:
            sources.append(None)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
    for n, k in by_new.items():
        if n not in like_flat:
            a = manifest.arrays[k]
            stored_flat[n] = LeafSpec(a.shape, a.dtype)
    found = [
        dataclasses.replace(m, path=parse(m.path)[0][1])
        for m in mismatches(spec_of(stored_flat), spec_of(like_flat))
    ]
    if found:
        raise TreeMismatchError(
            found,
            expected_from="`like`",
            actual_from="the checkpoint (after rename)",
            context=where,
        )
    return sources


def contract_mismatches(stored: TreeSpec, like: TreeSpec) -> list[Mismatch]:
    """Mismatches between the saved spec and ``like``'s. Shardings may differ
    (a restore reshards) and weak types are not kept, so neither counts."""
    return [m for m in mismatches(stored, like) if m.kind not in _IGNORED_KINDS]


def _target(leaf: Any, path: str) -> Any:
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) or sharding is None:
        raise ValueError(
            f"{path or '<root>'}: `like` needs a jax.Array or a jax.ShapeDtypeStruct with a "
            f"sharding here, got {type(leaf).__name__}\nhint: "
            "`jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))`"
        )
    return sharding


def _read_everywhere(data: str, item: Any, where: str) -> Any:
    """Restores ``item``; a failure in any process fails every process."""
    error: BaseException | None = None
    out = None
    try:
        out = read_arrays(data, item)
    except Exception as e:  # noqa: BLE001 - any failure must reach every process
        error = e
    failed = hosts.allgather_bytes(b"1" if error is not None else b"0")
    if error is not None:
        raise IntegrityError(
            f"{where}: the stored arrays could not be read: {str(error).splitlines()[0][:300]}\n"
            "hint: the data directory is damaged or incomplete; load an earlier checkpoint"
        ) from error
    bad = [p for p, f in enumerate(failed) if f == b"1"]
    if bad:
        raise IntegrityError(
            f"{where}: process {bad[0]} could not read the stored arrays (see its error)\n"
            "hint: the data directory is damaged or incomplete; load an earlier checkpoint"
        )
    return out


def load_sharded(
    directory: str | os.PathLike[str],
    like: Any,
    /,
    *,
    rename: Mapping[str, str] | None = None,
    allow_missing: Collection[str] = (),
) -> Any:
    """Restores a sharded checkpoint onto ``like``'s shardings, verified.

    Every process of the job calls it with the same ``like``. In order: the
    manifest is read and parsed strictly; the saved spec is compared with
    ``like`` and every mismatch is raised, in every process, before any
    array is read; orbax reads each process's part of the arrays onto the
    shardings of ``like`` (another mesh is fine: the restore reshards, and
    each resharded path is logged on the ``treeguard.sharded`` logger);
    then the sha256 of every saved shard is checked against the manifest,
    and every process raises if any shard anywhere differs.

    Args:
      directory: a directory written by ``save_sharded``.
      like: the tree to restore into: ``jax.ShapeDtypeStruct`` leaves with
        shardings, or live ``jax.Array``s (their shardings are used).
      rename: ``{old path: new path}`` for a deliberate migration, paths of
        leaves or subtrees in ``keystr`` form.
      allow_missing: paths of ``like`` that may be absent from the
        checkpoint; those leaves keep ``like``'s arrays.

    Returns:
      The tree, in ``like``'s structure, with ``like``'s shardings.

    Raises:
      FormatError: for a directory without a well-formed manifest.
      TreeMismatchError: listing every difference between the checkpoint and
        ``like`` (shape, dtype, missing or unexpected paths).
      IntegrityError: naming every array with a shard whose bytes do not
        match its recorded sha256, or whose data could not be read.
      ValueError: for a ``like`` leaf without a sharding, or a ``rename`` or
        ``allow_missing`` path that names nothing.

    Example:
      >>> import tempfile, jax.numpy as jnp, treeguard
      >>> d = tempfile.mkdtemp()
      >>> params = {"dense2": {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)}}
      >>> treeguard.save_sharded(d, params)
      >>> load_sharded(d, params)["dense2"]["w"].shape
      (3, 1)
      >>> load_sharded(d, {"dense2": {"w": jnp.ones((3, 2)), "b": jnp.zeros(1)}})
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: ...: 1 mismatch between the checkpoint and `like`:
        ['dense2']['w']: shape (3, 2) in `like`, (3, 1) in the checkpoint
      hint: ...
    """
    where = os.path.abspath(os.fspath(directory))
    manifest = read(where)
    like_leaves, like_treedef = jax.tree.flatten(like)
    like_spec = spec_of(like)
    like_names = [keystr(p) for p in like_spec.paths]
    if not rename and not allow_missing:
        found = contract_mismatches(manifest.spec, like_spec)
        if found:
            raise TreeMismatchError(
                found, expected_from="`like`", actual_from="the checkpoint", context=where
            )
        sources: list[int | None] = list(range(len(like_leaves)))
    else:
        sources = migrate(
            manifest, like_spec, like_leaves, rename or {}, tuple(allow_missing), where
        )
    targets: list[Any] = [None] * len(manifest.arrays)
    for i, src in enumerate(sources):
        if src is not None:
            targets[src] = _target(like_leaves[i], like_names[i])
    struct: Any = jax.ShapeDtypeStruct
    item_leaves = [struct(a.shape, a.dtype, sharding=s) for a, s in zip(manifest.arrays, targets)]
    if not rename and not allow_missing:
        item = jax.tree.unflatten(like_treedef, item_leaves)
    else:
        item = jax.tree.unflatten(manifest.spec.treedef, item_leaves)
    restored = jax.tree.leaves(_read_everywhere(os.path.join(where, manifest.data), item, where))
    _report_resharding(manifest.arrays, restored)
    bad = bad_shards(list(zip(manifest.arrays, restored)))
    if bad:
        names = [manifest.arrays[k].path or "<root>" for k in bad]
        listed = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise IntegrityError(
            f"{where}: {len(names)} {'array' if len(names) == 1 else 'arrays'} with a shard "
            f"whose sha256 does not match the manifest: {listed}\n"
            "hint: the stored bytes changed after the save; load an earlier checkpoint",
            path=names[0],
        )
    out = [like_leaves[i] if src is None else restored[src] for i, src in enumerate(sources)]
    return jax.tree.unflatten(like_treedef, out)


def _report_resharding(arrays: Sequence[ArrayRecord], restored: Sequence[Any]) -> None:
    for a, arr in zip(arrays, restored):
        now = describe_sharding(arr)
        if a.sharding != now and hosts.process_index() == 0:
            logger.info("%s: resharded from %s to %s", a.path or "<root>", a.sharding, now)
