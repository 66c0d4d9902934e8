"""Models for the flight recorder's tests: the bundled examples with a loss
term that is finite on their data and NaN on an input out of its range, as
a log barrier is. A batch with such an input, fed at some step, makes the
step's loss NaN at the line marked ``# NaN is born here``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import optax

from treeguard import LeafSpec, spec_of
from treeguard.examples import cnn, eqx_mlp
from treeguard.verify import Model


def eqx_loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """The MLP's loss and a barrier keeping the inputs inside (-1, 1)."""
    barrier = jnp.mean(jnp.log1p(-jnp.abs(batch["x"])))  # NaN is born here
    return eqx_mlp.loss(params, batch) - 1e-3 * barrier


def cnn_loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """The CNN's loss and a barrier keeping the pixels below 1."""
    barrier = jnp.mean(jnp.log(1.0 - batch["image"]))  # NaN is born here
    return cnn.loss(params, batch) - 1e-3 * barrier


eqx_model = dataclasses.replace(eqx_mlp.model, loss=eqx_loss, name="nanmodels:eqx_model")
cnn_model = dataclasses.replace(cnn.model, loss=cnn_loss, name="nanmodels:cnn_model")


def tiny_loss(params: Any, batch: dict[str, jax.Array]) -> jax.Array:
    """A weighted sum of square roots: NaN for a negative input."""
    return jnp.sum(jnp.sqrt(batch["x"]) * params["w"])  # NaN is born here


def tiny_init(key: jax.Array) -> Any:
    return {"w": jnp.ones(3, jnp.float32)}


def _explode(updates: Any, state: Any, params: Any = None) -> Any:
    return jax.tree.map(lambda u: jnp.exp(jnp.abs(u) + 100.0), updates), state  # Inf is born here


#: An optimizer whose every update overflows: the loss and the grads stay
#: finite, and the update is where the step goes non-finite.
exploding = optax.GradientTransformation(lambda p: optax.EmptyState(), _explode)


tiny = Model(
    init=tiny_init,
    apply=lambda p, b: b["x"] * p["w"],
    loss=tiny_loss,
    optimizer=optax.sgd(0.1),
    batch_spec=spec_of({"x": LeafSpec(("B",), "float32")}),
    rtol=1e-6,
    atol=1e-6,
    name="nanmodels:tiny",
)
tiny_exploding = dataclasses.replace(tiny, optimizer=exploding, name="nanmodels:tiny_exploding")
#: The exploding optimizer's state with updates that stay finite.
tiny_tame = dataclasses.replace(
    tiny,
    optimizer=optax.GradientTransformation(
        lambda p: optax.EmptyState(), lambda u, s, p=None: (u, s)
    ),
    name="nanmodels:tiny_tame",
)


def marked_line(fn_name: str) -> str:
    """``nanmodels.py:N`` of the marked line inside the function ``fn_name``."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {fn_name}("))
    n = next(i for i in range(start, len(lines)) if "is born here" in lines[i])
    return f"nanmodels.py:{n + 1}"
