"""The seed guide's worked example, done by hand and through treeguard."""

from __future__ import annotations

import jax
import jax.numpy as jnp

import treeguard as tg
from treeguard.examples import mlp


def test_seed_example_as_written() -> None:
    params = mlp.seed_params()
    leaves, treedef = jax.tree.flatten(params)
    grads = jax.tree.map(jnp.ones_like, params)
    updated = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert len(leaves) == 4
    assert jax.tree.structure(updated) == jax.tree.structure(params)
    assert jax.tree.structure(rebuilt) == jax.tree.structure(params)
    for old, new in zip(jax.tree.leaves(params), jax.tree.leaves(updated)):
        assert jnp.allclose(new, old - 0.01)


def test_seed_example_through_treeguard() -> None:
    params = mlp.seed_params()
    spec = tg.spec_of(params)
    assert [leaf.path for leaf in spec.leaves] == [
        "['dense1']['b']",
        "['dense1']['w']",
        "['dense2']['b']",
        "['dense2']['w']",
    ]
    assert spec.num_params == 3 + 6 + 1 + 3
    grads = tg.tree_map(jnp.ones_like, params)
    updated = tg.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    tg.check(updated, spec)
    rebuilt = tg.unflatten(spec, jax.tree.leaves(params))
    tg.check(rebuilt, spec)
    for old, new in zip(jax.tree.leaves(params), jax.tree.leaves(updated)):
        assert jnp.allclose(new, old - 0.01)


def test_bundled_model_params_match_the_seed_contract() -> None:
    tg.check(mlp.init(jax.random.key(0)), tg.spec_of(mlp.seed_params()))
