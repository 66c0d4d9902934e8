"""Reading a live pytree: its structure, its leaves, and what makes it invalid.

``structure_of`` turns a tree into a ``Node`` tree that records every
container (its kind, its type by qualified name, its keys and its static aux
data) but no leaf values. JAX's own flatten does the work one level at a time,
so the leaf order and the keys are exactly JAX's. Structures are cached by
treedef, so a tree of a known structure costs one flatten.

JAX's C++ flatten does not survive a tree that contains itself or nests
very deeply: it exhausts the interpreter's recursion budget. ``assert_acyclic``
walks every kind of container first, cheaply and without recursion, and
names the path of the cycle or the depth instead.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import re
from collections.abc import Callable, Sequence
from itertools import compress
from typing import Any, Literal, TypeAlias

import jax
import numpy as np

from .errors import InvalidTreeError
from .paths import Entry, Path, entry_of, entry_problem, entry_str, keystr, short_repr

NodeKind: TypeAlias = Literal["leaf", "none", "dict", "list", "tuple", "namedtuple", "custom"]

_tu = jax.tree_util
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


def qualname(t: type) -> str:
    """``module.QualName`` of a type: how a spec names custom nodes.

    Example:
      >>> qualname(dict)
      'builtins.dict'
    """
    return f"{t.__module__}.{t.__qualname__}"


def assert_acyclic(tree: Any) -> None:
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
    cycle or the depth, or to find that there is neither.

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
    kind = _KIND.get(type(tree))
    if kind is None:
        kind = _classify(tree)
    if not kind:
        return
    level = [tree]
    seen = 0
    for _ in range(_MAX_LEVELS):
        refs = gc.get_referents(*level)
        kinds = list(map(_KIND.get, map(type, refs)))
        if None in kinds:
            kinds = [_classify(r) if k is None else k for r, k in zip(refs, kinds)]
        level = list(compress(refs, kinds))
        if not level:
            return
        seen += len(level)
        if seen > _MAX_VISITS:
            break
    _exact_check(tree)


#: 1 for a type whose instances are containers to walk, 0 for leaves; filled
#: in as types are first seen (a type is a pytree node or not for good).
_KIND: dict[type, int] = {dict: 1, list: 1, tuple: 1, type(None): 0, str: 0, int: 0, float: 0}


def _classify(x: Any) -> int:
    """Whether ``x``'s type is a pytree node (1) or a leaf (0), remembered by type."""
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
    """A small bounded map from treedef to Node; treedefs hash and compare in C++."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: dict[Any, Node] = {}

    def get(self, treedef: Any) -> Node | None:
        return self._data.get(treedef)

    def put(self, treedef: Any, node: Node) -> None:
        if len(self._data) >= self._size:
            self._data.pop(next(iter(self._data)))
        self._data[treedef] = node


_structures = _StructureCache(_CACHE_SIZE)


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
    assert_acyclic(tree)
    try:
        return jax.tree.flatten(tree)
    except (RecursionError, SystemError):
        _exact_check(tree)  # names a cycle or depth the fast walk could not see
        raise


def structure_of(tree: Any, treedef: Any = None) -> Node:
    """The ``Node`` structure of a live tree, from the cache when its treedef
    was seen before.

    Args:
      tree: the live tree.
      treedef: its treedef when the caller already flattened it.

    Returns:
      The root ``Node``.

    Raises:
      InvalidTreeError: if the tree contains itself.

    Example:
      >>> node = structure_of({"w": 1.0, "b": (2.0, None)})
      >>> node.kind, [c.kind for c in node.children]
      ('dict', ['tuple', 'leaf'])
    """
    if treedef is not None:
        hit = _structures.get(treedef)
        if hit is not None:
            return hit
    node = _build(tree, (), [])
    if treedef is not None:
        _structures.put(treedef, node)
    return node


def _build(x: Any, path: Path, ancestors: list[Any]) -> Node:
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


def is_leaf_value(x: Any, extra: tuple[type, ...] = ()) -> bool:
    """Whether ``x`` may be a leaf of a parameter tree.

    Arrays (jax, numpy, tracers), numpy scalars, Python numbers and
    ``jax.ShapeDtypeStruct`` are; strings and arbitrary objects are not.
    """
    return isinstance(
        x, (jax.Array, np.ndarray, np.generic, bool, int, float, complex, jax.ShapeDtypeStruct)
    ) or (bool(extra) and isinstance(x, extra))


def invalid_leaves(
    leaves: Sequence[Any], paths: Callable[[], list[Path]], extra: tuple[type, ...] = ()
) -> list[tuple[str, str]]:
    """The ``(path, description)`` of every leaf that is not an array."""
    bad = [i for i, x in enumerate(leaves) if not is_leaf_value(x, extra)]
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
