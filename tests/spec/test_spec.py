"""TreeSpec: capture, JSON round trip, hand-written specs, bad input."""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpus import Linear, Point

import treeguard as tg


def test_corpus_round_trips_through_json(corpus_tree: Any) -> None:
    spec = tg.spec_of(corpus_tree)
    again = tg.TreeSpec.from_json(spec.to_json())
    assert again == spec
    assert again.to_json() == spec.to_json()
    assert tg.mismatches(corpus_tree, again) == []
    assert spec.num_leaves == len(jax.tree.leaves(corpus_tree))


def test_corpus_paths_match_jax_keystr(corpus_tree: Any) -> None:
    spec = tg.spec_of(corpus_tree)
    jax_paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(corpus_tree)[0]
    ]
    assert [leaf.path for leaf in spec.leaves] == jax_paths


def test_leaf_records() -> None:
    spec = tg.spec_of(
        {"bf": jnp.ones((2, 3), jnp.bfloat16), "i8": np.int8(3), "lr": 0.1, "flag": True}
    )
    by_path = {leaf.path: leaf for leaf in spec.leaves}
    assert by_path["['bf']"].dtype == jnp.bfloat16 and by_path["['bf']"].shape == (2, 3)
    assert by_path["['i8']"].dtype == np.int8 and by_path["['i8']"].weak_type is False
    assert by_path["['lr']"].dtype == np.float32 and by_path["['lr']"].weak_type is True
    assert by_path["['flag']"].dtype == np.bool_
    assert spec.num_params == 6 + 1 + 1 + 1


def test_equal_specs_give_identical_json() -> None:
    a = tg.spec_of({"b": jnp.zeros(3), "a": jnp.ones((2, 2))})
    b = tg.spec_of({"a": np.ones((2, 2), np.float32), "b": np.zeros(3, np.float32)})
    assert a == b and hash(a) == hash(b)
    assert a.to_json() == b.to_json()
    assert json.loads(a.to_json())["format"] == "treeguard.spec/1"


def test_dims_make_symbols() -> None:
    spec = tg.spec_of({"x": jnp.zeros((8, 2)), "y": jnp.zeros((8, 1))}, dims={"B": 0})
    assert [leaf.shape for leaf in spec.leaves] == [("B", 2), ("B", 1)]
    assert spec.symbols == {"B"}
    assert spec.num_params is None
    assert tg.mismatches({"x": jnp.zeros((3, 2)), "y": jnp.zeros((3, 1))}, spec) == []


def test_dims_refuse_a_leaf_without_the_axis() -> None:
    with pytest.raises(ValueError, match=r"\['s'\]: shape \(\) has no axis 0 for symbol 'B'"):
        tg.spec_of({"s": jnp.zeros(()), "x": jnp.zeros((8, 2))}, dims={"B": 0})


def test_hand_written_spec() -> None:
    spec = tg.spec_of({"x": tg.LeafSpec(("B", 2), "float32"), "y": tg.LeafSpec(("B", 1), "int32")})
    assert tg.mismatches({"x": jnp.zeros((5, 2)), "y": jnp.zeros((5, 1), jnp.int32)}, spec) == []
    abstract = spec.abstract({"B": 4})
    assert abstract["x"] == jax.ShapeDtypeStruct((4, 2), jnp.float32)
    with pytest.raises(ValueError, match="no size given for symbolic dimension"):
        spec.abstract()


def test_leafspec_rejects_bad_dims() -> None:
    with pytest.raises(ValueError, match="neither a size nor a symbol"):
        tg.LeafSpec((2.5,), "float32")
    with pytest.raises(tg.FormatError, match="unknown dtype 'float33'"):
        tg.LeafSpec((2,), "float33")


def test_shape_dtype_structs_are_leaves() -> None:
    abstract = jax.eval_shape(lambda: {"w": jnp.ones((2, 3))})
    assert tg.mismatches({"w": jnp.zeros((2, 3))}, tg.spec_of(abstract)) == []


def test_spec_of_works_under_jit() -> None:
    spec = tg.spec_of({"w": jnp.ones((2, 3))})

    @jax.jit
    def f(tree: Any) -> Any:
        tg.check(tree, spec)
        return tree

    f({"w": jnp.zeros((2, 3))})
    with pytest.raises(tg.TreeMismatchError):
        f({"w": jnp.zeros((3, 2))})


def test_treedef_from_json_for_plain_containers() -> None:
    tree = {"a": [jnp.ones(2), None], "b": (jnp.zeros(1),)}
    spec = tg.TreeSpec.from_json(tg.spec_of(tree).to_json())
    assert spec.treedef == jax.tree.structure(tree)


def test_treedef_from_json_refuses_custom_nodes() -> None:
    spec = tg.TreeSpec.from_json(tg.spec_of(Point(jnp.ones(1), jnp.ones(1))).to_json())
    with pytest.raises(tg.InvalidTreeError, match="namedtuple node corpus.Point cannot be rebuilt"):
        _ = spec.treedef


def test_save_and_load(tmp_path: Any) -> None:
    spec = tg.spec_of(Linear(jnp.ones((2, 3)), jnp.zeros(3)))
    spec.save(tmp_path / "spec.json")
    assert tg.TreeSpec.load(tmp_path / "spec.json") == spec
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]


def test_getitem_suggests_close_paths() -> None:
    spec = tg.spec_of({"dense1": {"w": jnp.ones(1)}})
    assert spec["['dense1']['w']"].shape == (1,)
    with pytest.raises(KeyError, match=r"did you mean \['dense1'\]\['w'\]"):
        spec["['dense_1']['w']"]


# -- guards: each bad input gets a clear typed error -------------------------


def test_cycle_through_a_list_names_the_path() -> None:
    a: list[Any] = [jnp.ones(1)]
    a.append({"inner": a})
    with pytest.raises(
        tg.InvalidTreeError, match=r"\[1\]\['inner'\]: this list contains itself"
    ) as info:
        tg.spec_of(a)
    assert info.value.path == "[1]['inner']"


def test_cycle_through_a_dict() -> None:
    d: dict[str, Any] = {"w": jnp.ones(1)}
    d["self"] = d
    with pytest.raises(tg.InvalidTreeError, match=r"\['self'\]: this dict contains itself"):
        tg.check(d, tg.spec_of({"w": jnp.ones(1)}))
    assert tg.spec_of({"still": jnp.ones(1)}).num_leaves == 1  # the interpreter survived


def test_cycle_through_a_custom_node() -> None:
    node = Linear(jnp.ones(1), jnp.ones(1))
    node.b = node  # type: ignore[assignment]
    with pytest.raises(tg.InvalidTreeError, match="contains itself"):
        tg.spec_of(node)


def test_shared_subtrees_are_not_cycles() -> None:
    shared = {"w": jnp.ones(2)}
    assert tg.spec_of({"a": shared, "b": shared}).num_leaves == 2


def test_non_array_leaves_are_named() -> None:
    with pytest.raises(tg.InvalidTreeError) as info:
        tg.spec_of({"w": jnp.ones(1), "name": "dense", "fn": object()})
    assert info.value.problems == (
        ("['fn']", "leaf of type object is not an array"),
        ("['name']", "leaf of type str is not an array"),
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        ("[]", "a spec is a JSON object"),
        ('{"format": "other/1", "tree": {}}', "not a treeguard spec"),
        ('{"format": "treeguard.spec/2", "tree": {}}', "newer than this treeguard reads"),
        ('{"format": "treeguard.spec/1"}', "spec has no 'tree'"),
        ('{"format": "treeguard.spec/1", "tree": {"kind": "blob"}}', "unknown node kind 'blob'"),
        (
            '{"format": "treeguard.spec/1", "tree": {"kind": "leaf", "shape": [-1], "dtype": "float32"}}',
            "bad shape",
        ),
        (
            '{"format": "treeguard.spec/1", "tree": {"kind": "leaf", "shape": [1], "dtype": "f99"}}',
            "unknown dtype 'f99'",
        ),
        (
            '{"format": "treeguard.spec/1", "tree": {"kind": "dict", "children": [["a"]]}}',
            "expected \\[entry, node\\]",
        ),
        (
            '{"format": "treeguard.spec/1", "num_leaves": 3, "tree": {"kind": "leaf", "shape": [], "dtype": "int8"}}',
            "declares 3 leaves but holds 1",
        ),
    ],
)
def test_malformed_json_is_a_format_error(text: str | bytes, message: str) -> None:
    with pytest.raises(tg.FormatError, match=message):
        tg.TreeSpec.from_json(text)


def test_unserialisable_key_is_named() -> None:
    spec = tg.spec_of({(1, 2): jnp.ones(1)})
    with pytest.raises(tg.InvalidTreeError, match=r"key \(1, 2\) of type tuple has no JSON form"):
        spec.to_json()


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        ('{"kind": "leaf", "shape": [1]}', "no dtype given"),
        (
            '{"kind": "leaf", "shape": [1], "dtype": "object"}',
            "'object' is not a numeric array dtype",
        ),
        ('{"kind": "leaf", "shape": [1], "dtype": "V8"}', "is not a numeric array dtype"),
    ],
)
def test_leaf_dtype_must_be_a_numeric_dtype(leaf: str, message: str) -> None:
    with pytest.raises(tg.FormatError, match=message):
        tg.TreeSpec.from_json('{"format": "treeguard.spec/1", "tree": ' + leaf + "}")


def test_save_is_atomic_and_leaves_no_temp_on_failure(tmp_path: Any) -> None:
    spec = tg.spec_of({"w": jnp.ones(2)})
    (tmp_path / "target").mkdir()
    with pytest.raises(OSError):
        spec.save(tmp_path / "target")  # a directory cannot be replaced by a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]
