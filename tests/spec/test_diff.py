"""mismatches, check, tree_map and unflatten: every guard shown failing."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from corpus import Linear, Pair, Point, seed_params

import treeguard as tg
from treeguard import Mismatch


def test_renamed_key_is_missing_plus_unexpected() -> None:
    params = seed_params()
    renamed = {"dense1": params["dense1"], "dense_2": params["dense2"]}
    found = tg.mismatches(renamed, params)
    assert [(m.path, m.kind) for m in found] == [
        ("['dense2']", "missing"),
        ("['dense_2']", "unexpected"),
    ]


def test_every_mismatch_is_reported() -> None:
    params = seed_params()
    bad = {
        "dense1": {"w": jnp.ones((3, 2)), "b": jnp.zeros(3, jnp.bfloat16)},
        "dense2": {"w": jnp.ones((3, 1))},
        "extra": jnp.ones(1),
    }
    found = tg.mismatches(bad, params)
    assert found == [
        Mismatch("['dense1']['b']", "dtype", "float32", "bfloat16"),
        Mismatch("['dense1']['w']", "shape", (2, 3), (3, 2)),
        Mismatch("['dense2']['b']", "missing", "f32[1]", None),
        Mismatch("['extra']", "unexpected", None, "f32[1]"),
    ]


def test_list_versus_tuple_is_node_type() -> None:
    found = tg.mismatches({"a": (jnp.ones(1),)}, {"a": [jnp.ones(1)]})
    assert found == [Mismatch("['a']", "node_type", "list", "tuple")]


def test_leaf_versus_container_is_node_type() -> None:
    found = tg.mismatches({"a": {"w": jnp.ones(1)}}, {"a": jnp.ones(2)})
    assert found == [Mismatch("['a']", "node_type", "leaf f32[2]", "dict")]


def test_custom_aux_change_is_node_data() -> None:
    found = tg.mismatches(
        Linear(jnp.ones(1), jnp.ones(1), name="b"), Linear(jnp.ones(1), jnp.ones(1))
    )
    assert [(m.path, m.kind) for m in found] == [("", "node_data")]
    found = tg.mismatches(Pair(jnp.ones(1), jnp.ones(1), "x"), Pair(jnp.ones(1), jnp.ones(1), "y"))
    assert found == [Mismatch("", "node_data", "'y'", "'x'")]


def test_namedtuple_vs_tuple() -> None:
    found = tg.mismatches((jnp.ones(1), jnp.ones(1)), Point(jnp.ones(1), jnp.ones(1)))
    assert found[0].kind == "node_type" and found[0].expected == "corpus.Point"


def test_weak_type_is_compared() -> None:
    found = tg.mismatches({"lr": jnp.asarray(0.1, jnp.float32)}, {"lr": 0.1})
    assert found == [Mismatch("['lr']", "weak_type", True, False)]


def test_symbol_bound_twice_is_dim() -> None:
    spec = tg.spec_of({"x": tg.LeafSpec(("B", 2), "float32"), "y": tg.LeafSpec(("B",), "float32")})
    found = tg.mismatches({"x": jnp.zeros((4, 2)), "y": jnp.zeros(3)}, spec)
    assert found == [Mismatch("['y']", "dim", "B=4 (bound at ['x'])", "B=3")]


def test_sharding_is_compared_when_recorded() -> None:
    spec = tg.spec_of({"w": tg.LeafSpec((2,), "float32", sharding="named(mesh[x=2], spec('x',))")})
    actual = tg.spec_of({"w": jnp.ones(2)}, sharding=True)
    assert tg.mismatches(actual, spec) == [
        Mismatch("['w']", "sharding", "named(mesh[x=2], spec('x',))", "single")
    ]


def test_spec_versus_spec() -> None:
    a = tg.spec_of({"w": jnp.ones((2, 3))})
    b = tg.TreeSpec.from_json(tg.spec_of({"w": jnp.ones((2, 2))}).to_json())
    assert tg.mismatches(a, b) == [Mismatch("['w']", "shape", (2, 2), (2, 3))]


def test_check_passes_and_caches() -> None:
    spec = tg.spec_of(seed_params())
    tg.check(seed_params(), spec)
    assert spec._validated  # the signature is remembered
    tg.check(seed_params(), spec)  # the cached path
    with pytest.raises(tg.TreeMismatchError):
        tg.check({**seed_params(), "dense2": {"w": jnp.ones((3, 2)), "b": jnp.zeros(1)}}, spec)


def test_cached_check_still_catches_a_new_shape_with_the_same_treedef() -> None:
    spec = tg.spec_of({"x": tg.LeafSpec(("B", 2), "float32")})
    tg.check({"x": jnp.zeros((4, 2))}, spec)
    tg.check({"x": jnp.zeros((7, 2))}, spec)
    with pytest.raises(
        tg.TreeMismatchError, match=r"shape \('B', 2\) in the spec, \(4, 3\) in the tree"
    ):
        tg.check({"x": jnp.zeros((4, 3))}, spec)


def test_check_error_is_a_value_error_with_mismatches() -> None:
    with pytest.raises(ValueError) as info:
        tg.check({"w": jnp.ones(2)}, tg.spec_of({"w": jnp.ones(3)}))
    assert isinstance(info.value, tg.TreeguardError)
    assert isinstance(info.value, tg.TreeMismatchError)
    assert info.value.mismatches == (Mismatch("['w']", "shape", (3,), (2,)),)


# -- tree_map ----------------------------------------------------------------


def test_tree_map_matches_jax_on_good_input(corpus_tree: Any) -> None:
    ours = tg.tree_map(lambda x, y: x, corpus_tree, corpus_tree)
    assert jax.tree.structure(ours) == jax.tree.structure(corpus_tree)


def test_tree_map_refuses_broadcast_before_f_runs() -> None:
    calls: list[Any] = []
    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    grads = {"w": jnp.ones((2, 3)), "b": jnp.ones((2, 3))}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.tree_map(lambda p, g: calls.append(1) or p - g, params, grads)
    assert calls == []
    assert info.value.mismatches == (Mismatch("['b']", "shape", (3,), (2, 3)),)
    # jax.tree.map broadcasts the same input silently: the bug this guards.
    assert jax.tree.map(lambda p, g: p - g, params, grads)["b"].shape == (2, 3)


def test_tree_map_refuses_prefix_structure() -> None:
    params = {"layer": {"w": jnp.ones(2), "b": jnp.ones(2)}}
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.tree_map(lambda p, g: p, params, {"layer": jnp.ones(2)})
    assert info.value.mismatches[0] == Mismatch("['layer']", "node_type", "dict", "leaf f32[2]")


def test_tree_map_reports_every_tree() -> None:
    a = {"w": jnp.ones(2)}
    with pytest.raises(tg.TreeMismatchError, match="between tree 1 and tree 2 and tree 0") as info:
        tg.tree_map(lambda *x: x[0], a, {"v": jnp.ones(2)}, {"w": jnp.ones(3)})
    assert len(info.value.mismatches) == 3


def test_tree_map_dtypes_option() -> None:
    a, b = {"w": jnp.ones(2)}, {"w": jnp.ones(2, jnp.bfloat16)}
    assert tg.tree_map(lambda x, y: x, a, b)["w"].dtype == jnp.float32
    with pytest.raises(tg.TreeMismatchError, match="dtype float32 in tree 0, bfloat16 in tree 1"):
        tg.tree_map(lambda x, y: x, a, b, dtypes=True)


def test_tree_map_shapes_can_be_relaxed() -> None:
    out = tg.tree_map(
        lambda x, y: x + y.sum(), {"w": jnp.ones(2)}, {"w": jnp.ones(3)}, shapes=False
    )
    np.testing.assert_allclose(out["w"], [4.0, 4.0])


# -- unflatten ---------------------------------------------------------------


def test_unflatten_round_trip(corpus_tree: Any) -> None:
    spec = tg.spec_of(corpus_tree)
    rebuilt = tg.unflatten(spec, jax.tree.leaves(corpus_tree))
    assert jax.tree.structure(rebuilt) == jax.tree.structure(corpus_tree)


def test_unflatten_refuses_wrong_count() -> None:
    spec = tg.spec_of(seed_params())
    with pytest.raises(tg.TreeMismatchError, match="4 leaves in the spec, 3 leaves in the leaves"):
        tg.unflatten(spec, [jnp.ones(1)] * 3)


def test_unflatten_refuses_swapped_leaves() -> None:
    spec = tg.spec_of(seed_params())
    leaves = jax.tree.leaves(seed_params())
    leaves[0], leaves[1] = leaves[1], leaves[0]
    with pytest.raises(tg.TreeMismatchError) as info:
        tg.unflatten(spec, leaves)
    assert [m.path for m in info.value.mismatches] == ["['dense1']['b']", "['dense1']['w']"]
    # jax.tree.unflatten accepts the same swap without a word.
    jax.tree.unflatten(jax.tree.structure(seed_params()), leaves)


def test_unflatten_refuses_non_array_leaf() -> None:
    spec = tg.spec_of({"w": jnp.ones(1)})
    with pytest.raises(tg.TreeMismatchError, match=r"node type leaf f32\[1\] in the spec, str"):
        tg.unflatten(spec, ["oops"])


def test_check_and_tree_map_agree_under_eager_jit_and_vmap(variant: Any) -> None:
    spec = tg.spec_of({"w": jnp.ones((2, 3)), "b": jnp.zeros(3)})

    def step(params: Any, grads: Any) -> Any:
        tg.check(params, spec)
        return tg.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    params = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    out = variant(step)(params, jax.tree.map(jnp.ones_like, params))
    np.testing.assert_allclose(out["w"], np.full((2, 3), 0.99), rtol=1e-6)
    bad = {"w": jnp.ones((2, 3)), "b": jnp.zeros(2)}
    with pytest.raises(tg.TreeMismatchError, match=r"\['b'\]: shape"):
        variant(step)(bad, jax.tree.map(jnp.ones_like, bad))


def test_tree_map_dtypes_uses_jax_rules_for_python_scalars() -> None:
    # A Python float is float32 to JAX (x64 off): no mismatch, no pathless error.
    out = tg.tree_map(lambda x, y: x + y, {"a": jnp.ones(())}, {"a": 1.0}, dtypes=True)
    assert out["a"].dtype == jnp.float32


def test_long_custom_aux_is_truncated_in_messages() -> None:
    found = tg.mismatches(
        Pair(jnp.ones(1), jnp.ones(1), "x" * 500), Pair(jnp.ones(1), jnp.ones(1), "y")
    )
    assert found[0].kind == "node_data"
    assert len(str(found[0].actual)) == 200 and str(found[0].actual).endswith("...")
