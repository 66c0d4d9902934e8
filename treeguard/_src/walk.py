"""Reading a live pytree: its structure, its leaves, and what makes it invalid.

``structure_of`` turns a tree into a ``Node`` tree that records every
container (its kind, its type by qualified name, its keys and its static aux
data) but no leaf values. JAX's own flatten does the work one level at a time,
so the leaf order and the keys are exactly JAX's. Structures are cached by
treedef, so a tree of a known structure costs one flatten.

JAX's C++ flatten does not survive a tree that contains itself: it exhausts
the interpreter's recursion budget. ``assert_acyclic`` walks the builtin
containers first, cheaply, and names the path of the cycle instead.
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
from .paths import Entry, Path, entry_of, keystr

NodeKind: TypeAlias = Literal["leaf", "none", "dict", "list", "tuple", "namedtuple", "custom"]

_tu = jax.tree_util
_CONTAINERS = frozenset((dict, list, tuple))
_is_container = _CONTAINERS.__contains__
#: A tree of builtin containers deeper than this is checked slowly for a cycle.
_MAX_LEVELS = 256
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
    """Refuses a tree whose dicts, lists or tuples contain themselves.

    Only builtin containers are walked: they are the ones JAX flattens in C++
    where a cycle cannot be caught. A cycle through a custom node is caught by
    ``structure_of``. The walk goes level by level with ``gc.get_referents``,
    so each level costs a few C calls, not a Python call per container; a
    tree that is still going after ``_MAX_LEVELS`` levels is walked again
    slowly, keeping paths, to name the cycle.

    Raises:
      InvalidTreeError: naming the path at which the tree contains itself.

    Example:
      >>> a = [1]; a.append(a)
      >>> assert_acyclic(a)
      Traceback (most recent call last):
      ...
      treeguard.InvalidTreeError: 1 invalid leaf or node in the tree:
        [1]: this list contains itself (a cycle back to <root>)
      hint: a pytree must be a tree; copy the shared container or break the cycle
    """
    if type(tree) not in _CONTAINERS:
        return
    level = [tree]
    seen = 0
    for _ in range(_MAX_LEVELS):
        refs = gc.get_referents(*level)
        level = list(compress(refs, map(_is_container, map(type, refs))))
        if not level:
            return
        seen += len(level)
        if seen > _MAX_VISITS:
            break
    try:
        _report_cycle(tree)
    except RecursionError:
        raise InvalidTreeError(
            [("", "the tree nests deeper than Python's recursion limit")],
            hint="flatten the nesting, or raise sys.setrecursionlimit on purpose",
        ) from None


def _report_cycle(tree: Any) -> None:
    """Slow path: find the first cycle again, this time keeping the paths."""
    stack: list[tuple[Any, Path]] = []

    def visit(x: Any, path: Path) -> None:
        for anc, anc_path in stack:
            if anc is x:
                raise InvalidTreeError(
                    [
                        (
                            keystr(path),
                            f"this {type(x).__name__} contains itself "
                            f"(a cycle back to {keystr(anc_path) or '<root>'})",
                        )
                    ],
                    hint="a pytree must be a tree; copy the shared container or break the cycle",
                )
        stack.append((x, path))
        items: Sequence[tuple[Entry, Any]]
        if type(x) is dict:
            items = [(("key", k), v) for k, v in x.items()]
        else:
            items = [(("index", j), v) for j, v in enumerate(x)]
        for e, c in items:
            if type(c) in _CONTAINERS:
                visit(c, (*path, e))
        stack.pop()

    visit(tree, ())


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
        structure_of(tree)  # finds and names the cycle through a custom node
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
