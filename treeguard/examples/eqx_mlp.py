"""An equinox ``eqx.nn.MLP`` described for ``treeguard verify`` and trained with optax.

An equinox module is a pytree of arrays and everything else (activation
functions, sizes). treeguard checks arrays, so the params are
``eqx.filter(module, eqx.is_array)`` and the rest (``STATIC``) stays apart;
``apply`` puts them back together with ``eqx.combine``.

Run it with ``treeguard verify treeguard.examples.eqx_mlp:model``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from treeguard import LeafSpec, spec_of
from treeguard.examples._common import features, split, uniform
from treeguard.verify import Model

IN, WIDTH, DEPTH, OUT = 2, 8, 2, 1


def _module(key: jax.Array) -> eqx.nn.MLP:
    return eqx.nn.MLP(IN, OUT, WIDTH, DEPTH, key=key)


#: The module's non-array part (activations, sizes); the params travel apart.
STATIC = eqx.filter(eqx.filter_eval_shape(_module, jax.random.key(0)), eqx.is_array, inverse=True)


def init(key: jax.Array) -> Any:
    """A fresh MLP's arrays: the module with every non-array field set to None.

    Example:
      >>> params = jax.eval_shape(init, jax.random.key(0))  # shapes only, nothing compiled
      >>> type(params).__name__, [x.shape for x in jax.tree.leaves(params)][:2]
      ('MLP', [(8, 2), (8,)])
    """
    return eqx.filter(_module(key), eqx.is_array)


def apply(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Outputs ``(B, 1)`` for ``batch["x"]`` of shape ``(B, 2)``.

    Raises:
      ValueError: if ``x`` is not ``(B, 2)``.
    """
    x = features(batch, IN)
    module = eqx.combine(params, STATIC)
    out: jax.Array = jax.vmap(module)(x)
    return out


def loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """Mean squared error against ``batch["y"]`` of shape ``(B, 1)``."""
    return jnp.mean((apply(params, batch) - batch["y"]) ** 2)


def splits() -> dict[str, dict[str, np.ndarray]]:
    """Disjoint train/val/test data: ``y = x0 * x1``."""
    x = uniform(5, (IN,))
    return split(x=x, y=x[:, :1] * x[:, 1:])


model = Model(
    init=init,
    apply=apply,
    loss=loss,
    optimizer=optax.adam(1e-2),
    batch_spec=spec_of({"x": LeafSpec(("B", IN), "float32"), "y": LeafSpec(("B", OUT), "float32")}),
    output_spec=spec_of(LeafSpec(("B", OUT), "float32")),
    rtol=1e-5,
    atol=1e-6,
    splits=splits,
    references=Path(__file__).parent / "data" / "eqx_mlp.regression.safetensors",
    name="treeguard.examples.eqx_mlp:model",
)
