"""Reading a live pytree: its structure, its leaves, and what makes it invalid.

``structure_of`` turns a tree into a ``Node`` tree that records every
container (its kind, its type by qualified name, its keys and its static aux
data) but no leaf values. JAX's own flatten does the work one level at a time,
so the leaf order and the keys are exactly JAX's. Structures are cached by
treedef, so a tree of a known structure costs one flatten. A treedef compares
dict keys and static data by ``==``, so ``{1: x}``, ``{True: x}`` and
``{IntEnum.A: x}`` share one; the cache tells them apart by the types of
their keys (see ``structure_of``).

A tree is first passed through ``acyclic.assert_acyclic``, which names a
cycle or a nesting past ``MAX_DEPTH`` before JAX's flatten meets it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np

from .acyclic import (
    MAX_DEPTH,
    assert_acyclic,
    exact_check,
    known_leaf_types,
    one_level,
    top_levels,
)
from .bounded import Bounded
from .errors import InvalidTreeError
from .paths import Entry, Path, entry_of, entry_problem, entry_str, keystr, short_repr

__all__ = [
    "LEAF",
    "MAX_DEPTH",
    "NNX_STATE",
    "Node",
    "NodeKind",
    "assert_acyclic",
    "flatten",
    "flatten_walked",
    "flatten_with_types",
    "invalid_leaves",
    "key_problems",
    "keys_ascending",
    "node_key_problems",
    "known_leaf_types",
    "qualname",
    "structure_of",
    "to_jsonable",
    "top_levels",
]

NodeKind: TypeAlias = Literal["leaf", "none", "dict", "list", "tuple", "namedtuple", "custom"]

_CACHE_SIZE = 512


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
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


#: (treedef, key types) to Node; treedefs hash and compare in C++.
_structures: Bounded[Any, Node] = Bounded(_CACHE_SIZE)

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
        exact_check(tree)  # names a cycle or depth the fast walk could not see
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

    pairs, td = one_level(x)
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
        problems = node_key_problems(node)
        if problems:
            where = keystr(path)
            out.extend((where, problem) for problem in problems)
        stack.extend((c, (*path, e)) for e, c in reversed(list(zip(node.entries, node.children))))
    return out


def node_key_problems(node: Node) -> list[str]:
    """``key_problems`` of one container's own keys (not those below it).

    Example:
      >>> node_key_problems(Node("dict", entries=(("key", 1), ("key", "1"))))
      []
    """
    if keys_ascending(node.entries):  # nothing held past the entry checked
        return [p for e in node.entries if (p := entry_problem(e)) is not None]
    out: list[str] = []
    texts: dict[str, Entry] = {}
    for e in node.entries:
        problem = entry_problem(e)
        if problem is not None:
            out.append(problem)
            continue
        text = entry_str(e)
        if text in texts:
            out.append(f"two children print as {text[:60]!r}")
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
                    f"{entry_str(other)} and {entry_str(e)} of {node.type_name} both "
                    f"come back as key {short_repr(e[1])} of a plain dict"
                )
            seen[e[1]] = e
    return out


def keys_ascending(entries: Sequence[Entry]) -> bool:
    """Whether the entries are of one kind, their keys of one type (``str``
    or ``int``) and strictly ascending, as JAX orders a dict's: distinct keys
    that print distinctly and are distinct dict keys, so that only each
    entry alone can keep a node's keys from reading back.

    Example:
      >>> keys_ascending([("key", "a"), ("key", "b")]), keys_ascending([("key", "b"), ("key", "a")])
      (True, False)
      >>> keys_ascending([("key", 1), ("key", "1")]), keys_ascending([("key", True)])
      (False, False)
    """
    if not entries:
        return True
    kind, first = entries[0]
    key_type = type(first)
    if key_type is not str and key_type is not int:
        return False
    previous = None
    for e_kind, key in entries:
        if e_kind != kind or type(key) is not key_type:
            return False
        if previous is not None and not previous < key:
            return False
        previous = key
    return True
