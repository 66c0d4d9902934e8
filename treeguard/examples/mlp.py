"""The seed guide's model: two dense layers, ``dense1`` (2 -> 3) and ``dense2`` (3 -> 1).

Params are a plain dict ``{"dense1": {"w", "b"}, "dense2": {"w", "b"}}``. The
key flow is explicit: ``init`` splits its key once per layer and uses each
subkey once.

``model`` describes it for ``treeguard verify treeguard.examples.mlp:model``:
its batch contract, explicit tolerances, the shipped regression set and
params contract under ``data/``, and disjoint train/val/test splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treeguard import LeafSpec, spec_of
from treeguard.examples._common import features, split, uniform
from treeguard.verify import Model

Params = dict[str, dict[str, jax.Array]]

IN, HIDDEN, OUT = 2, 3, 1
LEARNING_RATE = 0.01


def init(key: jax.Array) -> Params:
    """Fresh params: each layer's weights from its own subkey, zero biases.

    Example:
      >>> p = init(jax.random.key(0))
      >>> sorted(p), p["dense1"]["w"].shape, p["dense2"]["w"].shape
      (['dense1', 'dense2'], (2, 3), (3, 1))
    """
    k1, k2 = jax.random.split(key)
    return {
        "dense1": {
            "w": jax.random.normal(k1, (IN, HIDDEN), jnp.float32) / jnp.sqrt(IN),
            "b": jnp.zeros((HIDDEN,), jnp.float32),
        },
        "dense2": {
            "w": jax.random.normal(k2, (HIDDEN, OUT), jnp.float32) / jnp.sqrt(HIDDEN),
            "b": jnp.zeros((OUT,), jnp.float32),
        },
    }


def seed_params() -> Params:
    """The seed guide's literal params: ones for weights, zeros for biases."""
    return {
        "dense1": {"w": jnp.ones((IN, HIDDEN)), "b": jnp.zeros(HIDDEN)},
        "dense2": {"w": jnp.ones((HIDDEN, OUT)), "b": jnp.zeros(OUT)},
    }


def apply(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    """Forward pass on ``batch["x"]`` of shape ``(B, 2)``; returns ``(B, 1)``.

    Raises:
      ValueError: if ``x`` is not ``(B, 2)``.
    """
    x = features(batch, IN)
    h = jnp.tanh(x @ params["dense1"]["w"] + params["dense1"]["b"])
    return h @ params["dense2"]["w"] + params["dense2"]["b"]


def loss(params: Params, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean squared error against ``batch["y"]`` of shape ``(B, 1)``."""
    return jnp.mean((apply(params, batch) - batch["y"]) ** 2)


def update(params: Params, grads: Any) -> Params:
    """One SGD step, leaf by leaf, as the seed writes it."""
    new: Params = jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)
    return new


# -- the model as ``treeguard verify`` sees it ----------------------------------

#: The shipped regression set and params contract.
DATA = Path(__file__).parent / "data"

BATCH_SPEC = spec_of({"x": LeafSpec(("B", IN), "float32"), "y": LeafSpec(("B", OUT), "float32")})
OUTPUT_SPEC = spec_of(LeafSpec(("B", OUT), "float32"))


def splits() -> dict[str, dict[str, np.ndarray]]:
    """Disjoint train/val/test data for the splits check: ``y = sin(x0) * x1``.

    Example:
      >>> {k: v["x"].shape for k, v in splits().items()}
      {'train': (64, 2), 'val': (16, 2), 'test': (16, 2)}
    """
    x = uniform(1234, (IN,))
    return split(x=x, y=(np.sin(x[:, :1]) * x[:, 1:]).astype(np.float32))


model = Model(
    init=init,
    apply=apply,
    loss=loss,
    update=update,
    batch_spec=BATCH_SPEC,
    output_spec=OUTPUT_SPEC,
    params_spec=DATA / "mlp.params.spec.json",
    references=DATA / "mlp.regression.safetensors",
    rtol=1e-5,
    atol=1e-6,
    splits=splits,
    seed=0,
    batch_size=8,
    name="treeguard.examples.mlp:model",
)
