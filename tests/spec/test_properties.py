"""Hypothesis properties over random pytrees: round trips and injected mismatches."""

from __future__ import annotations

from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treeguard as tg

DTYPES = [np.float32, np.int8, np.bool_, np.float16, jax.numpy.bfloat16]

keys = st.text(alphabet="abcdefgh_.'/[]", min_size=1, max_size=6)
shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)
leaves = st.builds(lambda s, d: np.zeros(s, d), shapes, st.sampled_from(DTYPES))


def _containers_of(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.dictionaries(keys, children, min_size=1, max_size=4),
        st.lists(children, min_size=1, max_size=3),
        st.lists(children, min_size=1, max_size=3).map(tuple),
    )


def _trees(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(leaves, _containers_of, max_leaves=max_leaves)


trees = _trees()
# Trees with a dict at the root, drawn as one (filtering `trees` for them threw
# away about half the draws): up to 4 entries, each a tree of up to 3 leaves.
dict_trees = st.dictionaries(keys, _trees(3), min_size=1, max_size=4)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(trees)
def test_json_round_trip(tree: Any) -> None:
    spec = tg.spec_of(tree)
    assert tg.TreeSpec.from_json(spec.to_json()) == spec


@SETTINGS
@given(trees)
def test_a_tree_matches_its_own_spec(tree: Any) -> None:
    assert tg.mismatches(tree, tg.spec_of(tree)) == []


def keystr(path: tuple[Any, ...]) -> str:
    """A path of ``("key", k)`` and ``("index", i)`` entries in JAX's own text form."""
    keys = [jtu.DictKey(k) if kind == "key" else jtu.SequenceKey(k) for kind, k in path]
    return jtu.keystr(tuple(keys))


def _containers(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every dict/list/tuple in the tree with its path."""
    out = []
    if isinstance(tree, (dict, list, tuple)):
        out.append((path, tree))
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        for k, v in items:
            entry = ("key", k) if isinstance(tree, dict) else ("index", k)
            out += _containers(v, (*path, entry))
    return out


def _leaf_paths(tree: Any) -> list[tuple[Any, ...]]:
    return [p for p, x in _walk_leaves(tree, ())]


def _walk_leaves(tree: Any, path: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(tree, (dict, list, tuple)):
        items = tree.items() if isinstance(tree, dict) else enumerate(tree)
        out = []
        for k, v in items:
            entry = ("key", k) if isinstance(tree, dict) else ("index", k)
            out += _walk_leaves(v, (*path, entry))
        return out
    return [(path, tree)]


def _get(tree: Any, path: tuple[Any, ...]) -> Any:
    for _, k in path:
        tree = tree[k]
    return tree


def _set(tree: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``tree`` with the node at ``path`` replaced (tuples rebuilt)."""
    if not path:
        return value
    (_, k), rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, k: _set(tree[k], rest, value)}
    items = list(tree)
    items[k] = _set(items[k], rest, value)
    return tuple(items) if isinstance(tree, tuple) else items


@SETTINGS
@given(dict_trees, st.data())
def test_renamed_key_is_reported_at_its_path(tree: dict[str, Any], data: st.DataObject) -> None:
    dicts = [(p, d) for p, d in _containers(tree) if isinstance(d, dict)]
    path, d = data.draw(st.sampled_from(dicts))
    old = data.draw(st.sampled_from(sorted(d)))
    new = old + "_renamed"
    if new in d:
        return
    renamed = {(new if k == old else k): v for k, v in d.items()}
    mutated = _set(tree, path, renamed)
    found = tg.mismatches(mutated, tg.spec_of(tree))
    assert {(m.path, m.kind) for m in found} == {
        (keystr((*path, ("key", old))), "missing"),
        (keystr((*path, ("key", new))), "unexpected"),
    }


@SETTINGS
@given(trees, st.data())
def test_changed_shape_is_reported_at_its_path(tree: Any, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(_leaf_paths(tree)))
    leaf = _get(tree, path)
    bigger = np.zeros((*leaf.shape, 2), leaf.dtype)
    found = tg.mismatches(_set(tree, path, bigger), tg.spec_of(tree))
    assert found == [tg.Mismatch(keystr(path), "shape", leaf.shape, bigger.shape)]


@SETTINGS
@given(trees, st.data())
def test_changed_dtype_is_reported_at_its_path(tree: Any, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(_leaf_paths(tree)))
    leaf = _get(tree, path)
    other = data.draw(st.sampled_from([d for d in DTYPES if np.dtype(d) != leaf.dtype]))
    found = tg.mismatches(_set(tree, path, leaf.astype(other)), tg.spec_of(tree))
    assert found == [tg.Mismatch(keystr(path), "dtype", leaf.dtype.name, np.dtype(other).name)]


@SETTINGS
@given(dict_trees, st.data())
def test_dropped_leaf_is_missing(tree: dict[str, Any], data: st.DataObject) -> None:
    candidates = [p for p in _leaf_paths(tree) if p and p[-1][0] == "key"]
    if not candidates:
        return
    path = data.draw(st.sampled_from(candidates))
    parent = _get(tree, path[:-1])
    if len(parent) == 1:
        return
    dropped = {k: v for k, v in parent.items() if k != path[-1][1]}
    found = tg.mismatches(_set(tree, path[:-1], dropped), tg.spec_of(tree))
    leaf = _get(tree, path)
    assert found == [
        tg.Mismatch(keystr(path), "missing", tg.LeafSpec(leaf.shape, leaf.dtype).summary(), None)
    ]


@SETTINGS
@given(trees, st.data())
def test_list_turned_into_tuple_is_node_type(tree: Any, data: st.DataObject) -> None:
    lists = [(p, c) for p, c in _containers(tree) if type(c) is list]
    if not lists:
        return
    path, lst = data.draw(st.sampled_from(lists))
    found = tg.mismatches(_set(tree, path, tuple(lst)), tg.spec_of(tree))
    assert found == [tg.Mismatch(keystr(path), "node_type", "list", "tuple")]
