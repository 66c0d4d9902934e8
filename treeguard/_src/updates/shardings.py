"""Shardings in a checked step, on every kind of mesh axis.

A result leaf keeps its param's sharding, and an update laid out otherwise on
the same devices is moved to it inside the compiled step. How a sharding is
imposed depends on the mesh's axis types: ``reshard`` for Explicit axes (the
sharding is part of the array's type), ``with_sharding_constraint`` for Auto
axes (the compiler's choice, constrained); a mixed mesh gets both, each with
its own axes. Inside ``shard_map`` the leaves are per-device values and
nothing is pinned.

What JAX refuses about a layout (a ``ShardingTypeError`` while tracing) comes
out as an ``InvalidTreeError`` naming the leaf and its sharding.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ..errors import InvalidTreeError
from ..leaf import describe_sharding, summarize
from ..mismatch import Mismatch
from .layout import LabelledTree, is_tracer, mismatch_error

#: How much of JAX's own message a refusal quotes.
_QUOTED = 240


@functools.cache
def multi_device() -> bool:
    """Whether arrays can live on more than one device, so shardings can differ."""
    return jax.device_count() > 1 or jax.default_backend() != "cpu"


def sharding_of(x: Any) -> Any:
    """A concrete array's sharding, or None (numpy arrays, numbers, tracers)."""
    try:
        return x.sharding
    except AttributeError:  # numpy arrays, Python numbers, tracers
        return None


def _devices_text(sharding: Any) -> str:
    ids = sorted(d.id for d in sharding.device_set)
    platform = next(iter(sharding.device_set)).platform
    if len(ids) == 1:
        return f"{platform}:{ids[0]}"
    if ids == list(range(ids[0], ids[0] + len(ids))):
        return f"{platform}:{ids[0]}-{ids[-1]}"
    return f"{platform}:{','.join(map(str, ids))}"


class _Sharded:
    """Stands for an array in ``describe_sharding`` so a sharding reads the same
    way here as in a spec."""

    __slots__ = ("sharding",)

    def __init__(self, sharding: Any) -> None:
        self.sharding = sharding


def sharding_text(sharding: Any) -> str:
    """A sharding with the devices it spans: ``single on cpu:1``."""
    return f"{describe_sharding(_Sharded(sharding))} on {_devices_text(sharding)}"


def axis_types(sharding: Any) -> tuple[str, ...]:
    """The names of a named sharding's mesh axis types (``("Explicit", "Auto")``);
    empty for any other sharding."""
    mesh = getattr(sharding, "mesh", None)
    types = getattr(mesh, "axis_types", None)
    return tuple(t.name for t in types) if types is not None else ()


def mesh_of(tree: Any) -> Any:
    """The mesh of the first leaf placed on one with an axis that is not Auto,
    or None: what eager code on such leaves needs as its context mesh."""
    for x in jax.tree.leaves(tree):
        sh = sharding_of(x) if not is_tracer(x) else None
        if sh is not None and any(t != "Auto" for t in axis_types(sh)):
            return sh.mesh
    return None


def on_mesh(tree: Any) -> contextlib.AbstractContextManager[Any]:
    """The context in which eager code may compute on ``tree``: its mesh set
    with ``jax.set_mesh`` (``jax.sharding.use_mesh`` where JAX has no
    ``set_mesh``) when it has Explicit axes, else nothing.

    JAX runs an eager operation on arrays sharded over Explicit axes only
    with their mesh as the context mesh.
    """
    mesh = mesh_of(tree)
    if mesh is None:
        return contextlib.nullcontext()
    set_mesh = getattr(jax, "set_mesh", None) or getattr(jax.sharding, "use_mesh", None)
    if set_mesh is None:  # pragma: no cover - every JAX with axis types has one
        return contextlib.nullcontext()
    return set_mesh(mesh)  # type: ignore[no-any-return]


def plan_shardings(ref: LabelledTree, others: Sequence[LabelledTree]) -> list[Any] | None:
    """The params' shardings, to pin every result leaf to its param's sharding.

    An update leaf on the same devices and mesh axis types as its param but
    laid out differently is resharded inside the compiled step. One on other
    devices, or on a mesh whose axes are of other types, is refused.

    Returns:
      One sharding (or None) per leaf, or None when nothing needs pinning
      (one device, or the call runs inside a transformation).

    Raises:
      TreeMismatchError: kind ``sharding`` for every leaf on other devices or
        other axis types.
    """
    if not multi_device():
        return None
    if any(is_tracer(x) for lay in (ref, *others) for x in lay.leaves):
        return None
    # an uncommitted array (jnp.zeros(()) in an optimizer state) may move freely
    ref_sh = [sharding_of(x) if getattr(x, "committed", True) else None for x in ref.leaves]
    refuse_foreign(ref, others, ref_sh)
    return ref_sh if any(s is not None for s in ref_sh) else None


def refuse_foreign(
    ref: LabelledTree, others: Sequence[LabelledTree], ref_sh: Sequence[Any]
) -> None:
    """Refuses every leaf of ``others`` on other devices or mesh axis types
    than its param's sharding in ``ref_sh``.

    Raises:
      TreeMismatchError: kind ``sharding``, naming both shardings.
    """
    found: list[tuple[int, Any, Any, str]] = []
    for lay in others:
        if lay.treedef != ref.treedef:
            continue  # the layout check names what differs
        for i, x in enumerate(lay.leaves):
            sh, want = sharding_of(x), ref_sh[i]
            if sh is None or want is None:
                continue
            if sh.device_set != want.device_set or not _same_axis_types(sh, want):
                found.append((i, want, sh, lay.label))
    if found:
        paths = ref.paths()
        raise mismatch_error(
            [
                Mismatch(paths[i], "sharding", sharding_text(w), sharding_text(s))
                for i, w, s, _ in found
            ],
            expected_from=ref.label,
            actual_from=" and ".join(sorted({lbl for *_, lbl in found})),
            hint="the update lives on other devices or mesh axis types than its param; move "
            "it first with jax.device_put(updates, jax.tree.map(lambda p: p.sharding, params))",
        )


def _same_axis_types(a: Any, b: Any) -> bool:
    """Whether two shardings' meshes have the same axis types; a single-device
    array takes any (it is moved onto the mesh)."""
    ta, tb = axis_types(a), axis_types(b)
    return not ta or not tb or ta == tb


def plan_shardings_all(
    lays: Sequence[LabelledTree], groups: Sequence[tuple[int, Sequence[int]]]
) -> list[list[Any] | None]:
    """For each group ``(ref, matched)``: checks the matched trees' devices
    against the ref tree's and returns the ref tree's shardings to pin."""
    return [plan_shardings(lays[ref], [lays[j] for j in matched]) for ref, matched in groups]


def _split_spec(sharding: Any) -> tuple[Any, Any]:
    """A named sharding's spec split by axis type: the Explicit axes of each
    dimension, and the Auto ones."""
    kinds = dict(zip(sharding.mesh.axis_names, axis_types(sharding)))
    P = jax.sharding.PartitionSpec

    def keep(entry: Any, kind: str) -> Any:
        names = entry if isinstance(entry, tuple) else (entry,)
        kept = tuple(n for n in names if n is not None and kinds.get(n) == kind)
        return None if not kept else kept[0] if len(kept) == 1 else kept

    spec = tuple(sharding.spec)
    explicit = P(*(keep(e, "Explicit") for e in spec))  # type: ignore[no-untyped-call]
    auto = P(*(keep(e, "Auto") for e in spec))  # type: ignore[no-untyped-call]
    return explicit, auto


def pin_leaf(y: Any, sharding: Any) -> Any:
    """Imposes ``sharding`` on one traced leaf, by the mesh's axis types."""
    if sharding is None:
        return y
    kinds = axis_types(sharding)
    if not kinds:  # a single device, or a sharding that names no mesh
        return jax.lax.with_sharding_constraint(y, sharding)  # type: ignore[no-untyped-call]
    explicit, auto = _split_spec(sharding)
    named = jax.sharding.NamedSharding
    if "Explicit" in kinds:
        y = jax.sharding.reshard(y, named(sharding.mesh, explicit))  # type: ignore[no-untyped-call]
    if "Auto" in kinds:
        y = jax.lax.with_sharding_constraint(y, named(sharding.mesh, auto))  # type: ignore[no-untyped-call]
    return y


def pin(leaves: list[Any], shardings: list[Any] | None) -> list[Any]:
    """Constrains each leaf to its sharding inside a trace."""
    if shardings is None:
        return leaves
    return [pin_leaf(y, s) for y, s in zip(leaves, shardings)]


def from_jax(error: BaseException) -> bool:
    """Whether JAX itself raised ``error`` (its classes live in ``jax`` and
    ``jaxlib`` modules), as opposed to the caller's code or ours."""
    return type(error).__module__.split(".")[0] in ("jax", "jaxlib")


def about_sharding(error: BaseException) -> bool:
    """Whether JAX's error is about a layout (its type or text speaks of shardings)."""
    text = str(error).lower()
    return "shard" in type(error).__name__.lower() or "shard" in text or "mesh" in text


def refused_layout(error: BaseException) -> bool:
    """Whether ``error`` is JAX refusing a layout: a JAX error, or the
    ``ValueError``/``TypeError`` JAX raises, whose text is about shardings
    or meshes."""
    jaxish = from_jax(error) or isinstance(error, (ValueError, TypeError))
    return jaxish and about_sharding(error)


def _jax_reason(error: BaseException) -> str:
    line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return line if len(line) <= _QUOTED else line[: _QUOTED - 3] + "..."


def leaf_text(x: Any) -> str:
    """A leaf with its sharding, ``f32[8,8] sharded named(...) on cpu:0-7``."""
    shape = tuple(np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)
    what = summarize(shape, np.dtype(x.dtype)) if hasattr(x, "dtype") else type(x).__name__
    sh = sharding_of(x) if not is_tracer(x) else None
    if sh is not None:
        return f"{what} sharded {sharding_text(sh)}"
    aval_sharding = getattr(jax.typeof(x), "sharding", None) if is_tracer(x) else None
    spec = getattr(aval_sharding, "spec", None)
    return f"{what} with spec {tuple(spec)}" if spec is not None else what


def sharding_refused(
    error: BaseException, where: Sequence[tuple[str, Any, str]]
) -> InvalidTreeError:
    """The error for a layout JAX refused, naming each leaf it may concern.

    Args:
      error: what JAX raised.
      where: ``(path, leaf, tree label)`` for each leaf involved.
    """
    reason = _jax_reason(error)
    by_path: dict[str, list[str]] = {}
    for path, x, label in where:
        by_path.setdefault(path, []).append(f"{leaf_text(x)} in {label}")
    return InvalidTreeError(
        [(path, f"{', '.join(texts)}: JAX refused it: {reason}") for path, texts in by_path.items()]
        or [("", f"JAX refused the layout: {reason}")],
        hint="put every tree on its params' shardings (jax.device_put(tree, jax.tree.map("
        "lambda p: p.sharding, params))); on a mesh with Explicit axes an operation must "
        "not mix layouts (use jax.sharding.reshard inside your function)",
    )


def sharded_leaves(lays: Sequence[LabelledTree]) -> list[tuple[str, Any, str]]:
    """``(path, leaf, label)`` for each leaf on a mesh, for a refusal that
    cannot tell which leaf JAX meant."""
    out: list[tuple[str, Any, str]] = []
    for lay in lays:
        paths: list[str] | None = None
        for i, x in enumerate(lay.leaves):
            sh = sharding_of(x)
            if isinstance(sh, jax.sharding.NamedSharding):
                paths = paths if paths is not None else lay.paths()
                out.append((paths[i], x, lay.label))
    return out
