"""The repeated check's cached path, and the structure cache's keys.

A tree that matched a spec once is re-checked from a cache. Every test here
validates a tree first, so that the cached path is the one that runs, then
shows that a different tree still fails exactly as it would uncached.
"""

from __future__ import annotations

import dataclasses
import enum
import warnings
from collections import namedtuple
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import treeguard as tg


def _validated(tree: Any) -> tg.TreeSpec:
    spec = tg.spec_of(tree)
    tg.check(tree, spec)
    tg.check(tree, spec)  # the second goes through the cache
    assert spec._validated
    return spec


def _numpy_tree() -> dict[str, Any]:
    return {
        "layers": [(np.zeros((4, 4), np.float32), np.zeros(4, np.float32)) for _ in range(3)],
        "head": {"w": np.zeros((4, 2), np.float32), "b": None},
    }


def test_numpy_leaves_are_checked_again_from_the_cache() -> None:
    spec = _validated(_numpy_tree())
    fresh = jax.tree.map(lambda x: x + 1, _numpy_tree())
    tg.check(fresh, spec)  # new arrays, same contract
    bad = _numpy_tree()
    bad["layers"][1] = (np.zeros((4, 4), np.float32), np.zeros(5, np.float32))
    with pytest.raises(tg.TreeMismatchError, match=r"\['layers'\]\[1\]\[1\]: shape"):
        tg.check(bad, spec)
    cast = jax.tree.map(lambda x: x.astype(np.float16), _numpy_tree())
    with pytest.raises(tg.TreeMismatchError, match="dtype float32 in the spec, float16"):
        tg.check(cast, spec)


def test_a_reshaped_array_in_place_is_seen() -> None:
    tree = _numpy_tree()
    spec = _validated(tree)
    with warnings.catch_warnings():  # numpy >= 2.5 deprecates it, yet still does it
        warnings.simplefilter("ignore", DeprecationWarning)
        tree["head"]["w"].shape = (8,)  # same object, new shape
    assert tree["head"]["w"].shape == (8,)
    with pytest.raises(tg.TreeMismatchError, match=r"\['head'\]\['w'\]: shape \(4, 2\)"):
        tg.check(tree, spec)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t["head"].update(w={"inner": np.zeros((4, 2), np.float32)}),
        lambda t: t["head"].update(w=None),
        lambda t: t["head"].update(w="f32[4,2]"),
        lambda t: t["layers"].__setitem__(0, list(t["layers"][0])),
        lambda t: t["layers"].append(t["layers"][0]),
        lambda t: t["head"].update(b=np.zeros(2, np.float32)),
    ],
    ids=[
        "subtree_for_leaf",
        "none_for_leaf",
        "string_for_leaf",
        "list_for_tuple",
        "longer_list",
        "leaf_for_none",
    ],
)
def test_a_changed_structure_is_refused_after_the_cache_was_filled(change: Any) -> None:
    spec = _validated(_numpy_tree())
    tree = _numpy_tree()
    change(tree)
    with pytest.raises((tg.TreeMismatchError, tg.InvalidTreeError)):
        tg.check(tree, spec)


def test_numpy_and_jax_leaves_keep_their_weak_types() -> None:
    spec = _validated({"w": np.zeros(3, np.float32), "s": jnp.asarray(1.0)})
    tg.check({"w": np.ones(3, np.float32), "s": jnp.asarray(2.0)}, spec)
    with pytest.raises(tg.TreeMismatchError, match="weak type True in the spec, False"):
        tg.check({"w": np.ones(3, np.float32), "s": jnp.asarray(2.0, jnp.float32)}, spec)
    weak = _validated({"w": jnp.asarray(1.0)})
    with pytest.raises(tg.TreeMismatchError, match=r"\['w'\]: weak type True in the spec"):
        tg.check({"w": np.asarray(1.0, np.float32)}, weak)


@jax.tree_util.register_pytree_node_class
class Wrapped:
    """A registered node that looks like an array (it has an aval)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    @property
    def aval(self) -> Any:
        return self.x.aval

    def tree_flatten(self) -> tuple[tuple[Any], None]:
        return (self.x,), None

    @classmethod
    def tree_unflatten(cls, _aux: None, children: tuple[Any]) -> Wrapped:
        return cls(*children)


def test_a_node_with_an_aval_where_a_leaf_was_is_refused() -> None:
    spec = _validated({"w": jnp.zeros(3)})
    with pytest.raises(tg.TreeMismatchError, match=r"\['w'\]: node type leaf f32\[3\]"):
        tg.check({"w": Wrapped(jnp.zeros(3))}, spec)


Pt = namedtuple("Pt", "x y")
Other = namedtuple("Other", "x y")


@dataclasses.dataclass
class Static:
    w: Any
    n: int = dataclasses.field(metadata={"static": True}, default=1)


jax.tree_util.register_dataclass(Static)


def test_custom_nodes_are_compared_after_the_cache_was_filled() -> None:
    spec = _validated({"p": Pt(np.zeros(2), np.zeros(2)), "s": Static(np.zeros(1))})
    with pytest.raises(tg.TreeMismatchError, match="node type"):
        tg.check({"p": Other(np.zeros(2), np.zeros(2)), "s": Static(np.zeros(1))}, spec)
    with pytest.raises(tg.TreeMismatchError, match="node data"):
        tg.check({"p": Pt(np.zeros(2), np.zeros(2)), "s": Static(np.zeros(1), n=2)}, spec)


class Color(enum.IntEnum):
    RED = 1


def test_keys_that_compare_equal_keep_their_own_types() -> None:
    x = np.zeros(2, np.float32)
    assert jax.tree.structure({1: x}) == jax.tree.structure({True: x})  # why a cache can err
    tg.spec_of({1: x})
    as_bool = tg.spec_of({True: x})
    assert as_bool.paths == [(("key", True),)]
    assert type(as_bool.paths[0][0][1]) is bool
    assert '["key", true]' in as_bool.to_json(indent=None)
    as_enum = tg.spec_of({Color.RED: x})
    assert type(as_enum.paths[0][0][1]) is Color
    as_int = tg.spec_of({1: x})
    assert type(as_int.paths[0][0][1]) is int
    # the same holds one level down, and in a report of the tree's paths
    tg.spec_of({"a": {1: x}})
    with pytest.raises(tg.TreeMismatchError, match=r"\['a'\]\[True\]: unexpected"):
        tg.check({"a": {True: x}}, tg.spec_of({"a": {"k": x}}))


def test_a_cycle_is_refused_after_the_cache_was_filled() -> None:
    tree: dict[str, Any] = {"w": np.zeros(2), "more": []}
    spec = _validated(tree)
    tree["more"].append(tree)
    with pytest.raises(tg.InvalidTreeError, match="contains itself"):
        tg.check(tree, spec)


def test_a_deep_subtree_below_the_top_is_refused_after_the_cache_was_filled() -> None:
    spec = _validated({"w": np.zeros(2), "more": [[[np.zeros(1)]]]})
    deep: Any = np.zeros(1)
    for _ in range(30_000):
        deep = {"a": deep}
    # the top two levels look validated; JAX's flatten_up_to fails deeper,
    # where the repr of the deep subtree in its message cannot be built
    with pytest.raises(tg.InvalidTreeError, match="nests more than 128 containers deep"):
        tg.check({"w": np.zeros(2), "more": [[(deep,)]]}, spec)
    tg.check({"w": np.ones(2), "more": [[[np.ones(1)]]]}, spec)  # still usable


def test_the_collector_is_left_as_it_was_found() -> None:
    import gc

    tree = _numpy_tree()
    spec = _validated(tree)
    assert gc.isenabled()
    tg.check(tree, spec)
    assert gc.isenabled()
    gc.disable()
    try:
        tg.check(tree, spec)
        assert not gc.isenabled()
    finally:
        gc.enable()
