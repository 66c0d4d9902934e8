"""A two-minute tour on the bundled model: its contract, and a caught mismatch.

Run it with ``python -m treeguard.examples.tour``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import treeguard as tg
from treeguard.examples import mlp


def main() -> None:
    """Prints the bundled model's contract, then the error a broadcast gradient gets."""
    params = mlp.init(jax.random.key(0))
    spec = tg.spec_of(params)
    print("The contract of treeguard.examples.mlp:")
    for leaf in spec.leaves:
        print(f"  {leaf.path:<18} {leaf.summary()}")
    print(f"  {spec.num_leaves} leaves, {spec.num_params} params\n")

    grads = jax.grad(mlp.loss)(params, {"x": jnp.ones((4, 2)), "y": jnp.zeros((4, 1))})
    grads["dense1"]["b"] = jnp.ones((4, 3))  # a per-example gradient nobody reduced
    silently = jax.tree.map(lambda p, g: p - 0.01 * g, params, grads)
    print(
        "jax.tree.map broadcasts it without a word: dense1.b is now",
        silently["dense1"]["b"].shape,
        "\n",
    )
    try:
        tg.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    except tg.TreeMismatchError as e:
        print("treeguard.tree_map refuses it before any arithmetic:")
        print(e)


if __name__ == "__main__":
    main()
