"""Reading a live pytree: its structure, its leaves, and what makes it invalid.

``structure_of`` turns a tree into a ``Node`` tree that records every
container (its kind, its type by qualified name, its keys and its static aux
data) but no leaf values. JAX's own flatten does the work one level at a time,
so the leaf order and the keys are exactly JAX's. Structures are cached by
treedef, so a tree of a known structure costs one flatten. A treedef compares
dict keys and static data by ``==``, so ``{1: x}``, ``{True: x}`` and
``{IntEnum.A: x}`` share one; the cache tells them apart by the types of
their keys (see ``structure_of``).

JAX's C++ flatten does not survive a tree that contains itself or nests
very deeply: it exhausts the interpreter's recursion budget. ``assert_acyclic``
walks every kind of container first, cheaply and without recursion, and
names the path of the cycle or the depth instead.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from itertools import compress
from typing import Any, Literal, TypeAlias

import numpy as np

from .errors import InvalidTreeError
from .paths import Entry, Path, entry_of, entry_problem, entry_str, keystr, short_repr

NodeKind: TypeAlias = Literal["leaf", "none", "dict", "list", "tuple", "namedtuple", "custom"]

#: The deepest nesting of containers a tree may have. JAX itself gives up
#: near Python's recursion limit (1000); treeguard's own walks stay well inside it.
MAX_DEPTH = 128
#: A fast walk still going after this many levels (each container is at least
#: one) is redone exactly.
_MAX_LEVELS = MAX_DEPTH
#: Shared subtrees are visited once per reference; past this many, check slowly.
_MAX_VISITS = 5_000_000
_CACHE_SIZE = 512


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One position of a pytree's structure.

    Attributes:
      kind: ``leaf``, ``none``, ``dict``, ``list``, ``tuple``, ``namedtuple``
        or ``custom`` (any other registered node: dataclasses, flax State,
        equinox modules, OrderedDict, ...).
      type_name: the node's type as ``module.QualName``; empty for leaves.
      aux: the node's static data in JSON form, or None.
      aux_repr: ``repr`` of static data that has no JSON form, else None.
      entries: the key of each child, in JAX's flatten order.
      children: the child nodes, in the same order.
      num_leaves: how many leaves lie below (1 for a leaf).
      raw_aux: the live static data (not serialised; None after JSON).
      live: True when built from a live tree, False when read from JSON.
    """

    kind: NodeKind
    type_name: str = ""
    aux: Any = None
    aux_repr: str | None = None
    entries: tuple[Entry, ...] = ()
    children: tuple[Node, ...] = ()
    num_leaves: int = 1
    raw_aux: Any = None
    live: bool = False

    def leaf_paths(self) -> list[Path]:
        """Every leaf's path below this node, in flatten order."""
        out: list[Path] = []
        _collect_paths(self, (), out)
        return out

    def depth(self) -> int:
        """The number of nested containers below this node (a leaf is 0)."""
        return 1 + max((c.depth() for c in self.children), default=0) if self.kind != "leaf" else 0


LEAF = Node("leaf", live=True)


def _collect_paths(node: Node, prefix: Path, out: list[Path]) -> None:
    if node.kind == "leaf":
        out.append(prefix)
        return
    for e, c in zip(node.entries, node.children):
        _collect_paths(c, (*prefix, e), out)


#: ``qualname`` of flax.nnx's State: a mapping node that keeps its nested
#: parts as plain dicts (so a part of one is stored as a dict).
NNX_STATE = "flax.nnx.statelib.State"


def qualname(t: type) -> str:
    """``module.QualName`` of a type: how a spec names custom nodes.

    Example:
      >>> qualname(dict)
      'builtins.dict'
    """
    return f"{t.__module__}.{t.__qualname__}"


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
    _exact_check(tree)
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
        pairs, td = _one_level(x)
    except Exception:  # noqa: BLE001 - a node whose flatten fails is JAX's to report
        return None
    if _tu.treedef_is_leaf(td) and td.num_leaves == 1:
        return None
    return [(entry_of(p[0]), c) for p, c in pairs]


def _exact_check(tree: Any) -> None:
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


def _one_level(x: Any) -> tuple[list[tuple[Any, Any]], Any]:
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


def to_jsonable(x: Any) -> Any:
    """Converts static aux data into a canonical JSON value.

    Raises:
      TypeError: if some part of it has no JSON form.
    """
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        if not np.isfinite(x):
            raise TypeError("non-finite float")
        return x
    if isinstance(x, (tuple, list)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return {k: to_jsonable(v) for k, v in x.items()}
    if isinstance(x, np.dtype):
        return {"dtype": x.name}
    raise TypeError(f"{type(x).__name__} has no JSON form")


class _StructureCache:
    """A small bounded map from (treedef, key types) to Node; treedefs hash
    and compare in C++."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: dict[Any, Node] = {}

    def get(self, key: Any) -> Node | None:
        return self._data.get(key)

    def put(self, key: Any, node: Node) -> None:
        if len(self._data) >= self._size:
            self._data.pop(next(iter(self._data)))
        self._data[key] = node


_structures = _StructureCache(_CACHE_SIZE)

_PLAIN_TYPES = frozenset((dict, list, tuple, type(None), str))


def _keys_are_plain(types: Iterable[type]) -> bool:
    """Whether a tree whose walk met only ``types`` holds no key or static
    data but exact ``str``: every other type is a container or unhashable
    (an array), so it cannot be a dict key."""
    return all(t in _PLAIN_TYPES or t.__hash__ is None for t in types)


def _type_tree(x: Any) -> Any:
    """The types of ``x`` and, inside tuples, lists and dicts, of its parts."""
    t = type(x)
    if t is tuple or t is list:
        return (t, *map(_type_tree, x))
    if t is dict:
        return (t, *((_type_tree(k), _type_tree(v)) for k, v in x.items()))
    return t


def _static_types(treedef: Any) -> tuple[Any, ...] | None:
    """The types inside every node's static data (a dict's keys, a custom
    node's aux data) in the treedef's order, or None when unreadable."""
    out: list[Any] = []

    def node(_children: Any, data: Any) -> None:
        if data is not None:
            out.append(_type_tree(data))

    try:
        treedef.walk(node, id, itertools.repeat(None, treedef.num_leaves))
    except (RecursionError, TypeError, ValueError):
        return None
    return tuple(out)


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """``jax.tree.flatten`` made safe: a tree that contains itself is refused
    with its path instead of breaking the interpreter.

    Returns:
      The leaves and the treedef, as ``jax.tree.flatten`` returns them.

    Raises:
      InvalidTreeError: for a cyclic tree.

    Example:
      >>> leaves, treedef = flatten({"b": 1, "a": 2})
      >>> leaves
      [2, 1]
    """
    leaves, treedef, _ = flatten_with_types(tree)
    return leaves, treedef


def flatten_with_types(tree: Any) -> tuple[list[Any], Any, frozenset[type] | None]:
    """``flatten``, and the types its cycle guard met (for ``structure_of``).

    Raises:
      InvalidTreeError: for a cyclic tree.
    """
    types = assert_acyclic(tree)
    leaves, treedef = flatten_walked(tree)
    return leaves, treedef, types


def flatten_walked(tree: Any) -> tuple[list[Any], Any]:
    """``jax.tree.flatten`` of a tree ``assert_acyclic`` has passed."""
    import jax  # lazy: reading files never imports jax

    try:
        return jax.tree.flatten(tree)
    except (RecursionError, SystemError):
        _exact_check(tree)  # names a cycle or depth the fast walk could not see
        raise


def structure_of(tree: Any, treedef: Any = None, types: Iterable[type] | None = None) -> Node:
    """The ``Node`` structure of a live tree, from the cache when its treedef
    was seen before.

    A treedef compares keys and static data with ``==``, so trees whose keys
    differ only in type (``1``, ``True``, ``1.0``, an ``IntEnum``) share one.
    A tree whose keys are all exact ``str`` is looked up by its treedef; any
    other by its treedef and the types inside its static data, so the
    ``Node`` always holds the tree's own keys.

    Args:
      tree: the live tree.
      treedef: its treedef when the caller already flattened it.
      types: the types ``assert_acyclic`` met in it, when known.

    Returns:
      The root ``Node``.

    Raises:
      InvalidTreeError: if the tree contains itself.

    Example:
      >>> node = structure_of({"w": 1.0, "b": (2.0, None)})
      >>> node.kind, [c.kind for c in node.children]
      ('dict', ['tuple', 'leaf'])
    """
    key: Any = None
    if treedef is not None:
        if types is None:
            types = assert_acyclic(tree)
        if types is not None and _keys_are_plain(types):
            key = (treedef, None)
        else:
            static = _static_types(treedef)
            key = None if static is None else (treedef, static)
    if key is not None:
        hit = _structures.get(key)
        if hit is not None:
            return hit
    node = _build(tree, (), [])
    if key is not None:
        _structures.put(key, node)
    return node


def _build(x: Any, path: Path, ancestors: list[Any]) -> Node:
    from jax import tree_util as _tu  # lazy: reading files never imports jax

    pairs, td = _one_level(x)
    if _tu.treedef_is_leaf(td) and td.num_leaves == 1:
        return LEAF
    if any(a is x for a in ancestors):
        raise InvalidTreeError(
            [(keystr(path), f"this {type(x).__name__} contains itself")],
            hint="a pytree must be a tree; break the cycle",
        )
    node_type, raw_aux = td.node_data()
    entries = tuple(entry_of(p[0]) for p, _ in pairs)
    ancestors.append(x)
    try:
        children = tuple(_build(c, (*path, e), ancestors) for e, (_, c) in zip(entries, pairs))
    except RecursionError:
        raise InvalidTreeError(
            [(keystr(path), "the tree nests deeper than Python's recursion limit")]
        ) from None
    finally:
        ancestors.pop()
    kind = _kind_of(node_type)
    aux: Any = None
    aux_repr: str | None = None
    if kind == "custom":
        try:
            aux = to_jsonable(raw_aux)
            json.dumps(aux)
        except (TypeError, ValueError):
            aux, aux_repr = None, _stable_repr(raw_aux)
    return Node(
        kind=kind,
        type_name=qualname(node_type),
        aux=aux,
        aux_repr=aux_repr,
        entries=entries,
        children=children,
        num_leaves=sum(c.num_leaves for c in children),
        raw_aux=raw_aux,
        live=True,
    )


def _kind_of(t: type) -> NodeKind:
    if t is dict:
        return "dict"
    if t is list:
        return "list"
    if t is tuple:
        return "tuple"
    if t is type(None):
        return "none"
    if issubclass(t, tuple) and hasattr(t, "_fields"):
        return "namedtuple"
    return "custom"


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _stable_repr(x: Any, limit: int = 200) -> str:
    """``repr`` without memory addresses, so it reads the same in every process."""
    text = _ADDRESS.sub("", repr(x))
    return text if len(text) <= limit else text[: limit - 3] + "..."


@functools.cache
def _leaf_types() -> tuple[type, ...]:
    import jax  # lazy: reading files never imports jax

    return (
        np.ndarray,
        np.generic,
        bool,
        int,
        float,
        complex,
        jax.Array,
        jax.ShapeDtypeStruct,
    )


def known_leaf_types(leaves: Sequence[Any]) -> bool:
    """Whether every value's type is one the cycle guard knows as a JAX leaf
    (never a container), so ``leaves`` really are leaves."""
    return all(_KIND.get(t) == 0 for t in set(map(type, leaves)))


def invalid_leaves(
    leaves: Sequence[Any], paths: Callable[[], list[Path]], extra: tuple[type, ...] = ()
) -> list[tuple[str, str]]:
    """The ``(path, description)`` of every leaf that is not an array."""
    types = _leaf_types() + extra
    bad = [i for i, x in enumerate(leaves) if not isinstance(x, types)]
    if not bad:
        return []
    all_paths = paths()
    return [
        (keystr(all_paths[i]), f"leaf of type {type(leaves[i]).__name__} is not an array")
        for i in bad
    ]


def key_problems(root: Node) -> list[tuple[str, str]]:
    """Every key that could not be read back from a tensor name, as
    ``(path of the node, description)``; empty for a savable structure.

    Within one node the entries must print distinctly, and in a custom node
    or namedtuple (which ``load(like=None)`` rebuilds as a dict) the keys
    must also be distinct as dict keys.
    """
    out: list[tuple[str, str]] = []
    stack: list[tuple[Node, Path]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if node.kind == "leaf":
            continue
        where = keystr(path)
        texts: dict[str, Entry] = {}
        for e in node.entries:
            problem = entry_problem(e)
            if problem is not None:
                out.append((where, problem))
                continue
            text = entry_str(e)
            if text in texts:
                out.append((where, f"two children print as {text[:60]!r}"))
            texts[text] = e
        if node.kind in ("dict", "custom", "namedtuple"):
            seen: dict[Any, Entry] = {}
            for e in node.entries:
                try:
                    other = seen.get(e[1])
                except TypeError:
                    continue  # unhashable keys were reported above
                if other is not None and entry_str(other) != entry_str(e):
                    out.append(
                        (
                            where,
                            f"{entry_str(other)} and {entry_str(e)} of {node.type_name} both "
                            f"come back as key {short_repr(e[1])} of a plain dict",
                        )
                    )
                seen[e[1]] = e
        stack.extend((c, (*path, e)) for e, c in reversed(list(zip(node.entries, node.children))))
    return out
