"""``load_sharded``: the manifest, then the contract, then the data, then
every shard's digest."""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from ..checkpoint.plan import LoadOptions, SurgeryOptions, plan_load, select_part
from ..diff import mismatches
from ..errors import ConfigError, InvalidTreeError
from ..leaf import describe_sharding, same_sharding, summarize
from ..mismatch import Mismatch
from ..paths import keystr
from ..spec import TreeSpec, spec_from_leaves
from ..surgery import Surgery
from ..walk import flatten_with_types
from . import hosts
from .manifest import ArrayRecord, Manifest
from .orbax_io import param_names
from .reader import read_verified
from .source import Source, as_source

logger = logging.getLogger("treeguard.sharded")
IGNORED_KINDS = frozenset(("weak_type", "sharding"))


def contract_mismatches(stored: TreeSpec, like: TreeSpec) -> list[Mismatch]:
    """Mismatches between the saved spec and ``like``'s. Shardings may differ
    (a restore reshards) and weak types are not kept, so neither counts."""
    return [m for m in mismatches(stored, like) if m.kind not in IGNORED_KINDS]


def _target(leaf: Any, path: str) -> Any:
    import jax  # lazy: reading files never imports jax

    sharding = getattr(leaf, "sharding", None)
    if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)) or sharding is None:
        raise ConfigError(
            f"{path or '<root>'}: `like` needs a jax.Array or a jax.ShapeDtypeStruct with a "
            f"sharding here, got {type(leaf).__name__}",
            hint="`jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))`",
        )
    return sharding


def _check_divides(where: str, manifest: Manifest, targets: Sequence[Any]) -> None:
    """Refuses, before any array is read, every target sharding that cannot
    hold its array: one whose mesh axes do not divide the array's dimensions.

    Raises:
      InvalidTreeError: naming every such leaf, its sharding and its shape.
    """
    problems = []
    for record, sharding in zip(manifest.arrays, targets):
        if sharding is None:
            continue
        try:
            sharding.shard_shape(tuple(record.shape))
        except ValueError as e:  # JAX's words for which axis does not divide
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            problems.append(
                (
                    record.path,
                    f"the sharding of `like` cannot hold "
                    f"{summarize(tuple(record.shape), record.dtype)}: {why[:300]}",
                )
            )
    if problems:
        raise InvalidTreeError(
            problems,
            context=where,
            hint="give each such leaf of `like` a sharding whose mesh axes divide its "
            "dimensions (P() replicates it); the checkpoint itself is fine",
        )


def load_sharded(
    directory: str | os.PathLike[str],
    like: Any,
    /,
    *,
    rename: Mapping[str, str] | None = None,
    allow_missing: Collection[str] = (),
    subtree: str | None = None,
    ignore: Collection[str] = (),
    missing: Literal["error", "init"] = "error",
    init: Any = None,
    unexpected: Literal["error", "drop"] | Collection[str] = "error",
    report: bool = False,
) -> Any:
    """Restores a sharded checkpoint onto ``like``'s shardings, verified.

    Every process of the job calls it with the same ``like``. In order: the
    manifest is read and parsed strictly; the saved spec is compared with
    ``like`` and every mismatch is raised, in every process, before any
    array is read; each process reads only the saved shards its own part
    of ``like``'s shardings overlaps, each one whole, hashes it as it
    arrives and copies its pieces onto the shardings of ``like`` (another
    mesh, device count or axis type is fine: the load reshards, and each
    resharded path is logged on the ``treeguard.sharded`` logger); nothing
    is returned before every digest matches the manifest, and every process
    raises if any shard read anywhere differs.

    Args:
      directory: a directory written by ``save_sharded``.
      like: the tree to restore into: ``jax.ShapeDtypeStruct`` leaves with
        shardings, or live ``jax.Array``s (their shardings are used).
      rename: ``{old path: new path}`` for a deliberate migration, paths of
        leaves or subtrees in ``keystr`` form.
      allow_missing: paths of ``like`` that may be absent from the
        checkpoint; those leaves keep ``like``'s arrays.
      subtree: the key path of the one stored subtree to restore; ``like``
        then describes that subtree alone. Only its arrays are read.
      ignore: key paths of stored subtrees to leave unread; ``like`` then
        describes the rest.
      missing: ``"error"`` (the default) or ``"init"``: a leaf of ``like``
        the checkpoint lacks takes its value from ``init``, placed on that
        leaf's sharding.
      init: with ``missing="init"``, a tree matched by key path or a
        function of the key path, as for ``load``.
      unexpected: ``"error"`` (the default), ``"drop"`` (stored arrays
        ``like`` lacks are left unread) or a list of stored key paths to
        leave unread and report as dropped, as for ``load``.
      report: return ``(tree, Surgery)``, the report of every path
        initialised, renamed or dropped.

    Returns:
      The tree, in ``like``'s structure, with ``like``'s shardings; or
      ``(tree, Surgery)`` with ``report=True``.

    Raises:
      FormatError: for a directory without a well-formed manifest, one that
        holds a link, a FIFO or another special file, or arrays that claim
        far more bytes than its files hold.
      TreeMismatchError: listing every difference between the checkpoint and
        ``like`` (shape, dtype, missing or unexpected paths).
      IntegrityError: naming every array with a shard whose bytes do not
        match its recorded digest, or whose data could not be read.
      ConfigError: for a ``subtree`` or ``ignore`` path that names nothing
        stored (the hint names the nearest stored path), ``missing="init"``
        without ``init``, or an unknown ``missing`` or ``unexpected``.
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
    surgery = SurgeryOptions(missing, init, unexpected)
    surgery.check(like)
    options = LoadOptions(rename or {}, tuple(allow_missing), subtree, ignore, surgery)
    tree, changes = load_planned(directory, like, options)
    return (tree, changes) if report else tree


def load_expecting(
    directory: str | os.PathLike[str] | Source,
    like: Any,
    /,
    *,
    digest: str | None = None,
    subtree: str | None = None,
    ignore: Collection[str] = (),
) -> Any:
    """``load_sharded`` of a store's version into its contract, without
    migration, refusing (before any array is read) a manifest whose digest
    is not ``digest`` when one is given; the digest is taken over the very
    bytes that are parsed and used."""
    options = LoadOptions(subtree=subtree, ignore=ignore)
    return load_planned(directory, like, options, digest)[0]


def load_planned(
    directory: str | os.PathLike[str] | Source,
    like: Any,
    options: LoadOptions,
    digest: str | None = None,
) -> tuple[Any, Surgery]:
    """The one body of ``load_sharded`` and ``load_expecting``: the manifest,
    the plan ``load`` makes too (``checkpoint.plan``), then the arrays."""
    import jax  # lazy: reading files never imports jax

    source = as_source(directory)
    where = source.where
    manifest, _ = source.manifest(digest)  # compared before it is parsed
    like_leaves, like_treedef, types = flatten_with_types(like)  # like walked once
    like_spec = spec_from_leaves(like, like_leaves, like_treedef, types)
    like_names = [keystr(p) for p in like_spec.paths]
    part = select_part(manifest.spec, options, where=where)
    plan = plan_load(part, where, like_spec, like_leaves, options, ignored=IGNORED_KINDS)
    index = part.indices
    targets: list[Any] = [None] * len(manifest.arrays)
    for i, src in enumerate(plan.sources):
        if src is not None:
            targets[index[src]] = _target(like_leaves[i], like_names[i])
    _check_divides(where, manifest, targets)
    restored = _restore_checked(source, manifest, targets)
    out = []
    for i, src in enumerate(plan.sources):
        if src is not None:
            out.append(restored[index[src]])
        elif i in plan.values:  # initialised: placed as `like` lays the leaf out
            out.append(jax.device_put(plan.values[i], _target(like_leaves[i], like_names[i])))
        else:
            out.append(like_leaves[i])
    return jax.tree.unflatten(like_treedef, out), plan.surgery


def _restore_checked(source: Source, manifest: Manifest, targets: Sequence[Any]) -> list[Any]:
    """The arrays with a target sharding read onto it (None for the others),
    every saved shard read checked against its digest; a collective
    (``reader.read_verified``)."""
    import jax  # lazy: reading files never imports jax

    n = len(manifest.arrays)
    names = param_names(jax.tree.unflatten(manifest.spec.treedef, list(range(n))))
    restored = read_verified(source.where, manifest, source.fetch(manifest, names), targets)
    wanted = [k for k, t in enumerate(targets) if t is not None]
    _report_resharding([manifest.arrays[k] for k in wanted], [restored[k] for k in wanted])
    return restored


def _report_resharding(arrays: Sequence[ArrayRecord], restored: Sequence[Any]) -> None:
    for a, arr in zip(arrays, restored):
        now = describe_sharding(arr)
        changed = a.sharding != now and not (a.sharding and now and same_sharding(a.sharding, now))
        if changed and hosts.process_index() == 0:
            logger.info("%s: resharded from %s to %s", a.path or "<root>", a.sharding, now)
