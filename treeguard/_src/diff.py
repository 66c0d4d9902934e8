"""Comparing trees and specs: every difference, by key path, in one pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .errors import TreeMismatchError
from .keydtype import dtype_name
from .leaf import Record, same_sharding, summarize
from .mismatch import Mismatch
from .paths import Path, keystr
from .spec import TreeSpec, record_of, spec_from_leaves, spec_of
from .walk import Node, flatten_with_types, top_levels


def as_spec(x: Any, *, sharding: bool = False) -> TreeSpec:
    """``x`` itself if it is a ``TreeSpec``, else ``spec_of(x, sharding=...)``."""
    return x if isinstance(x, TreeSpec) else spec_of(x, sharding=sharding)


def mismatches(actual: Any, expected: Any, /) -> list[Mismatch]:
    """Every difference between two trees or specs, matched by key path.

    Either side may be a live tree or a ``TreeSpec``. A renamed key shows as
    one ``missing`` and one ``unexpected`` entry, never as a shape error.
    Symbols in the expected spec bind to one size across the whole tree.

    Args:
      actual: the tree (or spec) under test.
      expected: the contract (tree or spec).

    Returns:
      The mismatches in the expected tree's flatten order, unexpected paths
      after the expected ones of the same container; empty when they match.

    Raises:
      InvalidTreeError: if a live tree contains itself or holds non-array leaves.

    Example:
      >>> import jax.numpy as jnp
      >>> params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
      >>> grads = {"w": jnp.ones((2, 3)), "b": jnp.zeros((2, 3))}
      >>> mismatches(grads, params)
      [Mismatch(path="['b']", kind='shape', expected=(3,), actual=(2, 3))]
    """
    e = as_spec(expected)
    a = as_spec(actual, sharding=e.has_sharding)
    return _Differ(a.records, e.records).run(a.structure, e.structure)


def check(
    actual: Any,
    expected: Any,
    /,
    *,
    expected_from: str = "the spec",
    actual_from: str = "the tree",
) -> None:
    """Raises unless ``actual`` matches ``expected`` exactly.

    A tree that matched a spec once is re-checked for about the cost of one
    flatten: the spec caches each validated signature (treedef plus the
    leaves' abstract values, or shapes and dtypes for numpy arrays), and
    key-path text is built only to report.

    Args:
      actual: the tree (or spec) under test.
      expected: the contract (tree or spec).
      expected_from: how the message names the expected side.
      actual_from: how the message names the actual side.

    Raises:
      TreeMismatchError: listing every mismatch, with a hint.
      InvalidTreeError: for a cyclic tree or non-array leaves.

    Example:
      >>> import jax.numpy as jnp
      >>> spec = spec_of({"dense2": {"w": jnp.ones((3, 1))}})
      >>> check({"dense_2": {"w": jnp.ones((3, 1))}}, spec)
      Traceback (most recent call last):
      ...
      treeguard.TreeMismatchError: 2 mismatches between the tree and the spec:
        ['dense2']: missing: dict of 1 leaf (f32[3,1]) in the spec, absent in the tree
        ['dense_2']: unexpected: dict of 1 leaf (f32[3,1]) in the tree, absent in the spec
      hint: `['dense_2']` in the tree: did you mean `['dense2']`?
    """
    if (
        isinstance(expected, TreeSpec)
        and not isinstance(actual, TreeSpec)
        and not expected.has_sharding  # shardings are not part of the cached signature
    ):
        top = top_levels(actual)
        if expected._accepts_at_once(actual, top):
            return
        leaves, treedef, types = flatten_with_types(actual)
        if expected._accepts(leaves, treedef):
            expected._remember(leaves, treedef, top)
            return
        a = spec_from_leaves(actual, leaves, treedef, types)
        found = _Differ(a.records, expected.records).run(a.structure, expected.structure)
        if not found:
            expected._remember(leaves, treedef, top)
            return
    else:
        found = mismatches(actual, expected)
    if found:
        raise TreeMismatchError(found, expected_from=expected_from, actual_from=actual_from)


def node_summary(node: Node, records: Sequence[Record], start: int) -> str:
    """A short description of a subtree: ``f32[3,1]`` or ``dict of 2 leaves (...)``."""
    if node.kind == "leaf":
        shape, dtype, *_ = records[start]
        return summarize(shape, dtype)
    n = node.num_leaves
    kind = node.type_name.rsplit(".", 1)[-1] if node.kind in ("custom", "namedtuple") else node.kind
    if n == 0:
        return f"empty {kind}"
    inner = ", ".join(summarize(r[0], r[1]) for r in records[start : start + min(n, 3)])
    more = ", ..." if n > 3 else ""
    return f"{kind} of {n} lea{'f' if n == 1 else 'ves'} ({inner}{more})"


class _Differ:
    """One comparison: walks both structures in step, binding symbols as it goes."""

    def __init__(self, actual: Sequence[Record], expected: Sequence[Record]) -> None:
        self.a = actual
        self.e = expected
        self.found: list[Mismatch] = []
        self.bound: dict[str, tuple[int, str]] = {}

    def run(self, a: Node, e: Node) -> list[Mismatch]:
        self.node(a, 0, e, 0, ())
        return self.found

    def add(self, path: Path, kind: Any, expected: object, actual: object) -> None:
        self.found.append(Mismatch(keystr(path), kind, expected, actual))

    def node(self, a: Node, ai: int, e: Node, ei: int, path: Path) -> None:
        if a.kind == "leaf" and e.kind == "leaf":
            self.leaf(self.a[ai], self.e[ei], path)
            return
        if a.kind == "leaf" or e.kind == "leaf" or a.kind != e.kind or a.type_name != e.type_name:
            self.add(path, "node_type", _type_label(e, self.e, ei), _type_label(a, self.a, ai))
            # Two classes of fields (a renamed class whose fields changed too): their
            # fields are compared by name, so a field that moved is named as well.
            fields = {"custom", "namedtuple"}
            if a.kind == "leaf" or e.kind == "leaf":
                return
            if a.entries != e.entries and not (a.kind in fields and e.kind in fields):
                return
        elif a.entries == e.entries and not _same_aux(a, e):
            self.add(path, "node_data", _aux_label(e), _aux_label(a))
        a_index = {}
        off = ai
        for entry, child in zip(a.entries, a.children):
            a_index[entry] = (child, off)
            off += child.num_leaves
        off = ei
        for entry, child in zip(e.entries, e.children):
            hit = a_index.pop(entry, None)
            if hit is None:
                self.add((*path, entry), "missing", node_summary(child, self.e, off), None)
            else:
                self.node(hit[0], hit[1], child, off, (*path, entry))
            off += child.num_leaves
        for entry, (child, start) in a_index.items():
            self.add((*path, entry), "unexpected", None, node_summary(child, self.a, start))

    def leaf(self, a: Record, e: Record, path: Path) -> None:
        a_shape, a_dtype, a_weak, a_sh = a
        e_shape, e_dtype, e_weak, e_sh = e
        self.shape(a_shape, e_shape, path)
        if a_dtype != e_dtype:
            self.add(path, "dtype", dtype_name(e_dtype), dtype_name(a_dtype))
        if a_weak is not None and e_weak is not None and a_weak != e_weak:
            self.add(path, "weak_type", e_weak, a_weak)
        if a_sh is not None and e_sh is not None and not same_sharding(a_sh, e_sh):
            self.add(path, "sharding", e_sh, a_sh)

    def shape(self, a: tuple[Any, ...], e: tuple[Any, ...], path: Path) -> None:
        if len(a) != len(e) or any(
            (isinstance(ed, int) and ed != ad)
            or (isinstance(ed, str) and isinstance(ad, str) and ed != ad)
            or (isinstance(ed, int) and isinstance(ad, str))
            for ad, ed in zip(a, e)
        ):
            self.add(path, "shape", tuple(e), tuple(a))
            return
        where = keystr(path) or "<root>"
        for ad, ed in zip(a, e):
            if isinstance(ed, str) and isinstance(ad, int):
                prior = self.bound.get(ed)
                if prior is None:
                    self.bound[ed] = (ad, where)
                elif prior[0] != ad:
                    self.add(path, "dim", f"{ed}={prior[0]} (bound at {prior[1]})", f"{ed}={ad}")


def _type_label(node: Node, records: Sequence[Record], start: int) -> str:
    if node.kind == "leaf":
        return f"leaf {node_summary(node, records, start)}"
    if node.kind in ("custom", "namedtuple"):
        return node.type_name
    return node.kind


def _aux_label(node: Node, limit: int = 200) -> str:
    text = node.aux_repr if node.aux_repr is not None else repr(node.aux)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same_aux(a: Node, e: Node) -> bool:
    if a.kind != "custom":
        return True
    if a.live and e.live:
        try:
            same = a.raw_aux == e.raw_aux
            if isinstance(same, (bool, np.bool_)):
                return bool(same)
        except Exception:  # noqa: BLE001 - aux data may define == badly
            pass
    if a.aux_repr is None and e.aux_repr is None:
        return bool(a.aux == e.aux)
    if a.aux_repr is not None and e.aux_repr is not None:
        return a.aux_repr == e.aux_repr
    return False


def unflatten(spec: TreeSpec, leaves: Sequence[Any], /) -> Any:
    """Rebuilds a tree from leaves, after checking them against the spec.

    Unlike ``jax.tree.unflatten``, which checks only the count, every leaf's
    shape and dtype must match its ``LeafSpec`` (symbols bind consistently).

    Args:
      spec: the contract, from ``spec_of`` or JSON of plain containers.
      leaves: the leaves in flatten order.

    Returns:
      The tree.

    Raises:
      TreeMismatchError: for a wrong count (kind ``node_data`` at the root)
        or any leaf that does not match, naming each path.

    Example:
      >>> import jax.numpy as jnp
      >>> spec = spec_of({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})
      >>> unflatten(spec, [jnp.zeros(3), jnp.ones((2, 3))])["w"].shape
      (2, 3)
    """
    leaves = list(leaves)
    if len(leaves) != spec.num_leaves:
        raise TreeMismatchError(
            [Mismatch("", "node_data", f"{spec.num_leaves} leaves", f"{len(leaves)} leaves")],
            expected_from="the spec",
            actual_from="the leaves",
        )
    differ = _Differ([], [])
    for x, e, path in zip(leaves, spec.records, spec.paths):
        try:
            rec = record_of(x)
        except TypeError:
            differ.add(path, "node_type", "leaf " + summarize(e[0], e[1]), type(x).__name__)
            continue
        differ.leaf((rec[0], rec[1], None, None), (e[0], e[1], None, None), path)
    if differ.found:
        raise TreeMismatchError(differ.found, expected_from="the spec", actual_from="the leaves")
    import jax  # lazy: reading files never imports jax

    return jax.tree.unflatten(spec.treedef, leaves)
