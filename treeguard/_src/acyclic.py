"""The guard a live tree passes before JAX flattens it: no container that
contains itself, no nesting deeper than ``MAX_DEPTH``.

JAX's C++ flatten does not survive a tree that contains itself or nests
very deeply: it exhausts the interpreter's recursion budget. ``assert_acyclic``
walks every kind of container first, cheaply and without recursion, and
names the path of the cycle or the depth instead.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from itertools import compress
from typing import Any

from .errors import InvalidTreeError
from .paths import Entry, Path, entry_of, keystr

#: The deepest nesting of containers a tree may have. JAX itself gives up
#: near Python's recursion limit (1000); treeguard's own walks stay well inside it.
MAX_DEPTH = 128
#: A fast walk still going after this many levels (each container is at least
#: one) is redone exactly.
_MAX_LEVELS = MAX_DEPTH
#: Shared subtrees are visited once per reference; past this many, check slowly.
_MAX_VISITS = 5_000_000


def assert_acyclic(tree: Any) -> frozenset[type] | None:
    """Refuses a tree that contains itself or nests deeper than ``MAX_DEPTH``,
    before JAX sees it.

    JAX's flatten recurses in C++ and through each custom node's Python
    flatten: a cycle or a very deep tree exhausts the stack there. So every
    kind of container is walked here first, without recursion: dicts,
    lists, tuples, namedtuples and registered custom nodes (dataclasses,
    flax and equinox modules). The fast walk goes level by level with
    ``gc.get_referents``, a few C calls per level, keeping only objects of a
    container type (each new type is classified once, by asking JAX whether
    it is a node). Its view of a custom node is wider than JAX's (it sees
    every attribute), so a walk still going after ``_MAX_LEVELS`` levels is
    redone exactly, one node at a time as JAX flattens it, to name the
    cycle or the depth, or to find that there is neither. A level whose
    values are all of known kinds is taken whole or dropped by the set of
    types it holds, so most levels cost one pass over their values.

    Returns:
      Every type met on the way (containers, keys, static data and leaves),
      or None when the walk was redone exactly.

    Raises:
      InvalidTreeError: naming the path at which the tree contains itself,
        or the depth and a path prefix of a tree nested too deeply.

    Example:
      >>> a = [1]; a.append(a)
      >>> assert_acyclic(a)
      Traceback (most recent call last):
      ...
      treeguard.InvalidTreeError: 1 invalid leaf or node in the tree:
        [1]: this list contains itself (a cycle back to <root>)
      hint: a pytree must be a tree; copy the shared container or break the cycle
    """
    root_type = type(tree)
    kind = _KIND.get(root_type)
    if kind is None:
        kind = _classify(tree)
    if not kind:
        return frozenset((root_type,))
    met: set[type] = {root_type}
    level = [tree]
    seen = 0
    get = _KIND.get
    for _ in range(_MAX_LEVELS):
        refs = gc.get_referents(*level)
        types = frozenset(map(type, refs))
        met |= types
        kinds = set(map(get, types))
        if None in kinds:
            level = [r for r in refs if _kind_of_value(r)]
        elif 1 not in kinds:
            level = []
        elif 0 in kinds:
            level = list(compress(refs, map(get, map(type, refs))))
        else:
            level = refs
        if not level:
            return frozenset(met)
        seen += len(level)
        if seen > _MAX_VISITS:
            break
    exact_check(tree)
    return None


#: How many levels ``top_levels`` looks at.
TOP_LEVELS = 2


def top_levels(tree: Any) -> tuple[Any, ...]:
    """A cheap look at the top of a tree: its type and, for each of the
    first ``TOP_LEVELS`` levels below, the count of values and the set of
    their types. Two trees of one structure look alike, so a difference
    means another structure (the converse need not hold). No cycle guard:
    it never goes deeper than ``TOP_LEVELS``.

    Example:
      >>> top_levels({"a": [1, 2]}) == top_levels({"b": [3, 4]})
      True
      >>> top_levels({"a": [1, 2]}) == top_levels({"a": [1, 2, 3]})
      False
    """
    out: list[Any] = [type(tree)]
    level = [tree]
    get = _KIND.get
    for _ in range(TOP_LEVELS):
        refs = gc.get_referents(*level)
        types = frozenset(map(type, refs))
        out.append((len(refs), types))
        kinds = set(map(get, types))
        if 1 not in kinds:
            break
        level = refs if kinds == {1} else [r for r in refs if get(type(r)) != 0]
    return tuple(out)


#: 1 for a type whose instances are containers to walk, 0 for leaves; filled
#: in as types are first seen (a type is a pytree node or not for good).
_KIND: dict[type, int] = {dict: 1, list: 1, tuple: 1, type(None): 0, str: 0, int: 0, float: 0}


def _kind_of_value(x: Any) -> int:
    kind = _KIND.get(type(x))
    return _classify(x) if kind is None else kind


def _classify(x: Any) -> int:
    """Whether ``x``'s type is a pytree node (1) or a leaf (0), remembered by type."""
    import jax  # lazy: reading files never imports jax

    _tu = jax.tree_util
    try:
        td: Any = jax.tree.structure(x, is_leaf=lambda y: y is not x)
        kind = 0 if _tu.treedef_is_leaf(td) and td.num_leaves == 1 else 1
    except Exception:  # noqa: BLE001 - a node whose flatten fails is JAX's to report
        kind = 0
    if len(_KIND) < 10_000:
        _KIND[type(x)] = kind
    return kind


def _children(x: Any) -> list[tuple[Entry, Any]] | None:
    """One level of ``x`` as JAX sees it, or None for a leaf."""
    t = type(x)
    if t is dict:
        return [(("key", k), v) for k, v in x.items()]
    if t is list or t is tuple:
        return [(("index", i), v) for i, v in enumerate(x)]
    if x is None:
        return None
    from jax import tree_util as _tu  # lazy: reading files never imports jax

    try:
        pairs, td = one_level(x)
    except Exception:  # noqa: BLE001 - a node whose flatten fails is JAX's to report
        return None
    if _tu.treedef_is_leaf(td) and td.num_leaves == 1:
        return None
    return [(entry_of(p[0]), c) for p, c in pairs]


def exact_check(tree: Any) -> None:
    """The slow walk: depth first, without recursion, node by node as JAX
    flattens, keeping the path to name a cycle or a depth past ``MAX_DEPTH``."""
    on_path: dict[int, Path] = {}
    stack: list[tuple[Any, Path, bool]] = [(tree, (), False)]
    while stack:
        x, path, leaving = stack.pop()
        if leaving:
            del on_path[id(x)]
            continue
        kids = _children(x)
        if kids is None:
            continue
        if id(x) in on_path:
            raise InvalidTreeError(
                [
                    (
                        keystr(path),
                        f"this {type(x).__name__} contains itself "
                        f"(a cycle back to {keystr(on_path[id(x)]) or '<root>'})",
                    )
                ],
                hint="a pytree must be a tree; copy the shared container or break the cycle",
            )
        if len(path) >= MAX_DEPTH:
            prefix = keystr(path[:6])
            raise InvalidTreeError(
                [
                    (
                        f"{prefix}...",
                        f"the tree nests more than {MAX_DEPTH} containers deep "
                        f"(a {type(x).__name__} at depth {len(path) + 1})",
                    )
                ],
                hint="a parameter tree nests a few levels deep; store long chains in a list",
            )
        on_path[id(x)] = path
        stack.append((x, path, True))
        stack.extend((c, (*path, e), False) for e, c in reversed(kids))


def one_level(x: Any) -> tuple[list[tuple[Any, Any]], Any]:
    """Flattens one level of ``x`` with JAX: its children with their keys."""
    from jax import tree_util as _tu  # lazy: reading files never imports jax

    first = True

    def is_leaf(_: Any) -> bool:
        nonlocal first
        if first:
            first = False
            return False
        return True

    return _tu.tree_flatten_with_path(x, is_leaf=is_leaf)


def known_leaf_types(leaves: Sequence[Any]) -> bool:
    """Whether every value's type is one the cycle guard knows as a JAX leaf
    (never a container), so ``leaves`` really are leaves."""
    return all(_KIND.get(t) == 0 for t in set(map(type, leaves)))
