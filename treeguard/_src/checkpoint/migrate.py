"""Deliberate migrations: ``load(..., rename=..., allow_missing=...)``.

Each option relaxes only what it names. ``rename`` moves stored leaves or
subtrees to new paths; ``allow_missing`` lets named paths of ``like`` be
absent from the file. Everything else is still compared: every leaf's shape
and dtype, and the type of every container that both sides have at the same
path (after the renames), so a list still does not load into a tuple, nor
one class into another.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from ..diff import mismatches
from ..errors import TreeMismatchError
from ..mismatch import Mismatch
from ..paths import Path, keystr, parse, parse_user_path, starts_with
from ..spec import LeafSpec, TreeSpec, spec_of
from ..walk import Node
from .names import index_once
from .select import container_hint


def _nodes(root: Node) -> Iterator[tuple[Path, Node]]:
    """Every container below ``root`` (itself included) with its path."""
    stack: list[tuple[Path, Node]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if node.kind == "leaf":
            continue
        yield path, node
        stack.extend(((*path, e), c) for e, c in zip(node.entries, node.children))


def _label(node: Node) -> str:
    return node.type_name if node.kind in ("custom", "namedtuple") else node.kind


def _moved(path: Path, renames: Sequence[tuple[Path, Path, str]]) -> Path:
    best = None
    for old, new, _ in renames:
        if starts_with(path, old) and (best is None or len(old) > len(best[0])):
            best = (old, new)
    return path if best is None else (*best[1], *path[len(best[0]) :])


def _node_type_mismatches(
    stored: Node,
    like: Node,
    renames: Sequence[tuple[Path, Path, str]],
    *,
    init_missing: bool = False,
) -> list[Mismatch]:
    """Containers at one path on both sides (after renames) whose types differ.

    With ``init_missing``, a None stored where ``like`` holds a container is
    no difference: None holds no leaves, so each leaf below is one the file
    lacks, initialised (an equinox module's optional layer, None before).
    """
    stored_at = {_moved(p, renames): n for p, n in _nodes(stored)}
    found: list[Mismatch] = []
    for path, node in sorted(_nodes(like), key=lambda pn: keystr(pn[0])):
        other = stored_at.get(path)
        if other is not None and init_missing and other.kind == "none":
            continue
        if other is not None and (other.kind, other.type_name) != (node.kind, node.type_name):
            found.append(Mismatch(keystr(path), "node_type", _label(node), _label(other)))
    return found


def match_stored(  # noqa: PLR0917 - two call sites, all positional data
    stored_names: Sequence[str],
    stored_leaves: Sequence[LeafSpec],
    like_spec: TreeSpec,
    like_has_value: Sequence[bool],
    rename: Mapping[str, str],
    allow_missing: Sequence[str],
    where: str,
    *,
    extra: Callable[[Sequence[tuple[Path, Path, str]]], list[Mismatch]] | None = None,
    init_missing: bool = False,
    drop: Callable[[Path], bool] | None = None,
) -> list[int | None]:
    """The one leaf matching behind ``rename`` and ``allow_missing``, for
    every stored format (a single file's tensors, a sharded manifest's arrays).

    A rename maps a stored leaf or subtree to a new path (the longest prefix
    wins); a path of ``like`` under ``allow_missing`` may be absent, and then
    keeps ``like``'s value; every other difference (shape, dtype, a missing
    or unexpected leaf) is a mismatch.

    Args:
      stored_names: the stored leaves' paths in ``keystr`` form, in order.
      stored_leaves: their shapes and dtypes.
      like_spec: the spec of the tree to load into.
      like_has_value: for each leaf of ``like``, whether it holds a value to
        keep (an array, not a shape-only placeholder).
      rename: ``{old path: new path}``.
      allow_missing: paths of ``like`` that may be absent.
      where: the stored checkpoint's name for messages.
      extra: given the parsed renames, more mismatches to report with the
        leaf ones (the container types a single file records).
      init_missing: a leaf of ``like`` with no stored leaf is not a mismatch
        (its source is None: the caller initialises it).
      drop: given a stored leaf's path (before any rename), whether it may
        be left unused when no leaf of ``like`` takes it.

    Returns:
      For each leaf of ``like`` in flatten order, the index of the stored
      leaf it takes, or None to keep ``like``'s value.

    Raises:
      TreeMismatchError: for every difference the options do not name.
      ValueError: for an option path that names nothing, two stored leaves
        renamed onto one path, or a missing leaf with no value to keep.

    Example:
      >>> like = spec_of({"b": LeafSpec((2,), "float32")})
      >>> match_stored(["['a']"], [LeafSpec((2,), "float32")], like, [False],
      ...              {"['a']": "['b']"}, [], "ckpt")
      [0]
    """
    stored_paths = [parse(n) for n in stored_names]
    renames, by_new = _renamed(stored_names, stored_paths, rename, where)
    like_paths = like_spec.paths
    optional = [parse_user_path(a, "allow_missing") for a in allow_missing]
    for text, p in zip(allow_missing, optional):
        if not any(starts_with(lp, p) for lp in like_paths):
            raise ValueError(f"allow_missing: {text} names no leaf or subtree of `like`")
    sources: list[int | None] = []
    stored_flat: dict[str, LeafSpec] = {}
    like_flat: dict[str, LeafSpec] = {}
    for i, (lpath, rec) in enumerate(zip(like_paths, like_spec.records)):
        lname = keystr(lpath)
        if lname in by_new:
            k = by_new[lname]
            sources.append(k)
            stored_flat[lname] = LeafSpec(stored_leaves[k].shape, stored_leaves[k].dtype)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
        elif init_missing and not any(starts_with(lpath, p) for p in optional):
            sources.append(None)
        elif any(starts_with(lpath, p) for p in optional):
            if not like_has_value[i]:
                raise ValueError(
                    f"allow_missing: {lname} is absent from {where} and `like` holds no "
                    "value to keep there; pass a `like` tree with arrays"
                )
            sources.append(None)
        else:
            sources.append(None)
            like_flat[lname] = LeafSpec(rec[0], rec[1])
    for n, k in by_new.items():
        if n not in like_flat and not (drop is not None and drop(stored_paths[k])):
            stored_flat[n] = LeafSpec(stored_leaves[k].shape, stored_leaves[k].dtype)
    found = extra(renames) if extra is not None else []
    found += flat_mismatches(stored_flat, like_flat)
    if found:
        actual = "the checkpoint (after rename)"
        hint = container_hint(found)
        raise TreeMismatchError(
            found, expected_from="`like`", actual_from=actual, context=where, hint=hint
        )
    return sources


def flat_mismatches(stored: Mapping[str, LeafSpec], like: Mapping[str, LeafSpec]) -> list[Mismatch]:
    """Every difference between two flat ``{path: LeafSpec}`` tables (a
    path in one only, or another shape or dtype), each named by its path.

    Example:
      >>> f32 = LeafSpec((2,), "float32")
      >>> [(m.path, m.kind) for m in flat_mismatches({"['a']": f32}, {"['b']": f32})]
      [("['b']", 'missing'), ("['a']", 'unexpected')]
    """
    return [
        dataclasses.replace(m, path=parse(m.path)[0][1])
        for m in mismatches(spec_of(dict(stored)), spec_of(dict(like)))
    ]


def _renamed(
    stored_names: Sequence[str], stored_paths: Sequence[Path], rename: Mapping[str, str], where: str
) -> tuple[list[tuple[Path, Path, str]], dict[str, int]]:
    """The parsed renames ``(old, new, old as given)`` and, for each stored
    leaf's path after them (the longest prefix wins), its index.

    Raises:
      ValueError: for a rename that names nothing stored, or two stored
        leaves renamed onto one path.
    """
    renames = [
        (parse_user_path(old, "rename"), parse_user_path(new, "rename"), old)
        for old, new in rename.items()
    ]
    new_name: list[str] = []
    used: set[str] = set()
    for name, p in zip(stored_names, stored_paths):
        best = None
        for old, new, text in renames:
            if starts_with(p, old) and (best is None or len(old) > len(best[0])):
                best = (old, new, text)
        if best is None:
            new_name.append(name)
        else:
            new_name.append(keystr((*best[1], *p[len(best[0]) :])))
            used.add(best[2])
    unused = [text for _, _, text in renames if text not in used]
    if unused:
        close = difflib.get_close_matches(unused[0], list(stored_names), n=1)
        raise ValueError(
            f"rename: {unused[0]} names no leaf or subtree of the checkpoint {where}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    by_new = index_once(
        new_name,
        lambda i, j: (
            f"rename: {stored_names[i]} and {stored_names[j]} would both become "
            f"{new_name[i]} in {where}"
        ),
    )
    return renames, by_new


def migrate(  # noqa: PLR0917 - one call site
    stored: TreeSpec,
    where: str,
    like_spec: TreeSpec,
    like_leaves: list[Any] | None,
    rename: Mapping[str, str],
    allow_missing: Sequence[str],
    *,
    init_missing: bool = False,
    drop: Callable[[Path], bool] | None = None,
) -> list[int | None]:
    """Leaf-level matching for a deliberate migration of a stored tree (a
    whole checkpoint's spec, or the part a partial load selected); the
    options are ``match_stored``'s.

    Returns:
      For each leaf of ``like`` in flatten order, the index of the stored
      leaf to take its value from, or None to keep ``like``'s value.

    Raises:
      TreeMismatchError: for every difference the options do not name.
      ValueError: for an option path that names nothing.
    """
    import jax  # a reader of headers alone never imports JAX

    has_value = [
        ref is not None and not isinstance(ref, (LeafSpec, jax.ShapeDtypeStruct))
        for ref in (like_leaves if like_leaves is not None else [None] * like_spec.num_leaves)
    ]
    return match_stored(
        [keystr(p) for p in stored.paths],
        list(stored.leaves),
        like_spec,
        has_value,
        rename,
        allow_missing,
        where,
        extra=lambda renames: _node_type_mismatches(
            stored.structure, like_spec.structure, renames, init_missing=init_missing
        ),
        init_missing=init_missing,
        drop=drop,
    )
