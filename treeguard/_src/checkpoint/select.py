"""Partial loads: ``subtree=`` and ``ignore=`` pick the part of a stored tree
a load reads.

A selection is made on the stored spec alone, before any tensor is read:
``ignore`` prunes named subtrees (leaves or containers) from the stored
structure, then ``subtree`` takes the part below one path as the new root.
What remains is compared with ``like`` exactly as a whole checkpoint is,
and only its tensors are read and hashed. Used by the single-file reader
and by ``load_sharded`` alike.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Collection, Sequence
from typing import Any

from ..errors import ConfigError
from ..mismatch import Mismatch
from ..paths import Path, keystr, parse_user_path, starts_with
from ..spec import TreeSpec
from ..surgery import Change
from ..walk import NNX_STATE, Node


@dataclasses.dataclass(frozen=True)
class Selection:
    """The part of a stored tree a load reads.

    Attributes:
      spec: the selected part's spec, with paths relative to ``subtree``.
      indices: for each leaf of ``spec`` in flatten order, the index of the
        stored leaf (in the stored spec's flatten order) it is.
      cut: the paths (relative to ``subtree``) that ``ignore`` (or
        ``unexpected=``) took out of the part.
      dropped: the stored leaves ``unexpected=`` named, reported as dropped
        by their paths in the file (never read); set by ``plan.select_part``.
    """

    spec: TreeSpec
    indices: list[int]
    cut: tuple[Path, ...] = ()
    dropped: tuple[Change, ...] = ()


def _all_paths(root: Node) -> list[Path]:
    """Every node's path below ``root`` (containers and leaves, root excluded)."""
    out: list[Path] = []
    stack: list[tuple[Path, Node]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if path:
            out.append(path)
        stack.extend(((*path, e), c) for e, c in zip(node.entries, node.children))
    return out


def _find(root: Node, path: Path) -> Node | None:
    node = root
    for entry in path:
        for e, c in zip(node.entries, node.children):
            if e == entry:
                node = c
                break
        else:
            return None
    return node


def _names_nothing(what: str, text: str, root: Node, where: str) -> ConfigError:
    known = [keystr(p) for p in _all_paths(root)]
    close = difflib.get_close_matches(text, known, n=1, cutoff=0.5)
    hint = (
        f"did you mean {close[0]}?"
        if close
        else "list the stored paths with `treeguard ckpt inspect FILE`"
    )
    return ConfigError(
        f"{what}: {text[:200]} names no leaf or subtree of the checkpoint",
        context=where,
        hint=hint,
    )


def _prune(node: Node, path: Path, cut: Sequence[Path]) -> Node:
    if node.kind == "leaf" or not any(starts_with(c, path) and c != path for c in cut):
        return node
    entries, children = [], []
    for e, c in zip(node.entries, node.children):
        p = (*path, e)
        if p in cut:
            continue
        entries.append(e)
        children.append(_prune(c, p, cut))
    return dataclasses.replace(
        node,
        entries=tuple(entries),
        children=tuple(children),
        num_leaves=sum(c.num_leaves for c in children),
    )


def select(
    stored: TreeSpec, *, subtree: str | None, ignore: Collection[str], where: str
) -> Selection:
    """The part of ``stored`` that ``subtree`` and ``ignore`` pick.

    Args:
      stored: the stored spec.
      subtree: the path (``keystr`` form) of the one subtree to load, or None
        for the whole tree.
      ignore: paths of stored subtrees or leaves to leave unread.
      where: the checkpoint's name for messages.

    Returns:
      The ``Selection``.

    Raises:
      ConfigError: for a path that names nothing in the checkpoint (with the
        nearest stored path as the hint), a malformed path, ``ignore`` of
        the whole tree, or a ``subtree`` that lies inside an ignored part.

    Example:
      >>> from treeguard import spec_of, LeafSpec
      >>> s = spec_of({"enc": {"w": LeafSpec((2,), "float32")}, "head": LeafSpec((1,), "int8")})
      >>> sel = select(s, subtree="['enc']", ignore=(), where="ckpt")
      >>> sel.spec, sel.indices
      (TreeSpec({'w': f32[2]}), [0])
    """
    if isinstance(ignore, str):
        raise ConfigError(
            "ignore: a collection of key paths, got one string",
            hint=f'pass ignore=["{ignore[:80]}"]',
        )
    root = stored.structure
    try:
        cut = [parse_user_path(t, "ignore") for t in ignore]
        sub = parse_user_path(subtree, "subtree") if subtree is not None else ()
    except ValueError as e:
        raise ConfigError(str(e), context=where) from None
    for text, p in zip(ignore, cut):
        if not p:
            raise ConfigError(
                "ignore: the root names the whole tree; nothing would be loaded",
                context=where,
                hint="name the subtrees to leave unread",
            )
        if _find(root, p) is None:
            raise _names_nothing("ignore", text, root, where)
    if subtree is not None and _find(root, sub) is None:
        raise _names_nothing("subtree", subtree, root, where)
    inside = [t for t, p in zip(ignore, cut) if starts_with(sub, p)]
    if inside:
        raise ConfigError(
            f"subtree: {subtree} lies inside {inside[0]}, which `ignore` leaves unread",
            context=where,
            hint="drop that path from ignore, or pick another subtree",
        )
    kept = _prune(root, (), cut)
    node = _find(kept, sub)
    assert node is not None  # found above, and not inside a pruned part
    indices = [
        i
        for i, p in enumerate(stored.paths)
        if starts_with(p, sub) and not any(starts_with(p, c) for c in cut)
    ]
    records = stored.records
    within = tuple(c[len(sub) :] for c in cut if len(c) > len(sub) and starts_with(c, sub))
    return Selection(TreeSpec(node, [records[i] for i in indices]), indices, within)


def in_like_containers(stored: TreeSpec, like_spec: TreeSpec, cut: Sequence[Path]) -> TreeSpec:
    """``stored`` (a selected part) with the containers a selection changed
    put in ``like``'s own form, so the part compares equal to the tree it
    loads into; every other container is returned as stored, to be compared.

    Two changes are a selection's own: ``subtree=`` of a part of an nnx
    State gives a dict (an nnx State keeps its nested parts as dicts), which
    loads into ``like``'s State of the same keys; and ``ignore=`` takes
    entries out of a container (the paths ``cut``), whose static data then
    loses them too (an nnx State's keys, an equinox module's fields): such a
    container takes ``like``'s when ``like`` holds the same class with the
    entries kept, plus, of those cut, any it holds as None (an equinox module
    with that field set to None). Nothing else is changed, so every other
    difference is still compared.

    Example:
      >>> from treeguard import spec_of, LeafSpec
      >>> stored = spec_of({"w": LeafSpec((2,), "float32")})
      >>> in_like_containers(stored, stored, ()) is stored
      True
    """
    root, lk = stored.structure, like_spec.structure
    if not cut and not (root.kind == "dict" and lk.type_name == NNX_STATE):
        return stored  # nothing a selection changed: compared as stored
    out: dict[Path, set[Any]] = {}
    for c in cut:
        out.setdefault(c[:-1], set()).add(c[-1])
    fitted = _fit(root, lk, (), out, top=True)
    return stored if fitted is root else TreeSpec(fitted, stored.records)


def _fit(
    node: Node, like: Node, path: Path, cut: dict[Path, set[Any]], *, top: bool = False
) -> Node:
    if node.kind == "leaf" or like.kind == "leaf":
        return node
    state = like.kind == "custom" and like.type_name == NNX_STATE
    if top and state and node.kind == "dict" and node.entries == like.entries:
        node = dataclasses.replace(
            node, kind=like.kind, type_name=like.type_name, aux=like.aux, aux_repr=like.aux_repr
        )
    gone = cut.get(path)
    if gone and (node.kind, node.type_name) == (like.kind, like.type_name):
        kept = dict(zip(node.entries, node.children))
        extra = {e: c for e, c in zip(like.entries, like.children) if e not in kept}
        fills = all(e in gone and c.kind == "none" for e, c in extra.items())
        if fills and [e for e in like.entries if e in kept] == list(node.entries):
            node = dataclasses.replace(
                node,
                aux=like.aux,
                aux_repr=like.aux_repr,
                entries=like.entries,
                children=tuple(kept.get(e) or extra[e] for e in like.entries),
            )
    theirs = dict(zip(like.entries, like.children))
    children = tuple(
        _fit(c, theirs[e], (*path, e), cut) if e in theirs else c
        for e, c in zip(node.entries, node.children)
    )
    if all(a is b for a, b in zip(children, node.children)):
        return node
    return dataclasses.replace(node, children=children)


def container_hint(found: Sequence[Mismatch]) -> str | None:
    """The fix for a container of another kind when one side is an nnx State
    and the other a dict (None: the general hint fits)."""
    for m in found:
        if m.kind == "node_type" and {m.expected, m.actual} == {NNX_STATE, "dict"}:
            state, other = (
                ("`like`", "the checkpoint")
                if m.expected == NNX_STATE
                else ("the checkpoint", "`like`")
            )
            return (
                f"{m.path or '<root>'} is an nnx State in {state} and a dict in {other}: an nnx "
                "State keeps its nested parts as dicts, so a part of one loads with subtree= "
                "into like=state[...] (itself an nnx State) and a whole one into "
                "nnx.state(model); pass `like` in the form the checkpoint was saved from"
            )
    return None
