"""A user's own models, defined here and nowhere in treeguard: a flax.nnx
model and an equinox model, each as a ``treeguard.verify.Model``. The tests
export them, then serve them from a process where this module cannot be
imported. ``callback`` calls back into Python, which ``jax.export`` refuses.
"""

from __future__ import annotations

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model

IN, OUT = 3, 2
BATCH = spec_of({"features": LeafSpec(("B", IN), "float32")})


class Scorer(nnx.Module):
    """Two linear layers with a gelu between them."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(IN, 5, rngs=rngs)
        self.head = nnx.Linear(5, OUT, rngs=rngs)

    def __call__(self, x: Any) -> Any:
        return self.head(jax.nn.gelu(self.hidden(x)))


_GRAPH, _ = nnx.split(nnx.eval_shape(lambda: Scorer(nnx.Rngs(0))))


def nnx_init(key: jax.Array) -> Any:
    return nnx.split(Scorer(nnx.Rngs(params=key)))[1]


def nnx_apply(params: Any, batch: dict[str, Any]) -> Any:
    return {"scores": nnx.merge(_GRAPH, params)(batch["features"])}


def _eqx_module(key: jax.Array) -> eqx.nn.MLP:
    return eqx.nn.MLP(IN, OUT, 6, 2, activation=jnp.tanh, key=key)


_STATIC = eqx.filter(
    eqx.filter_eval_shape(_eqx_module, jax.random.key(0)), eqx.is_array, inverse=True
)


def eqx_init(key: jax.Array) -> Any:
    return eqx.filter(_eqx_module(key), eqx.is_array)


def eqx_apply(params: Any, batch: dict[str, Any]) -> Any:
    return jax.vmap(eqx.combine(params, _STATIC))(batch["features"])


_RELU_STATIC = eqx.filter(
    eqx.filter_eval_shape(
        lambda key: eqx.nn.MLP(IN, OUT, 6, 2, activation=jax.nn.relu, key=key), jax.random.key(0)
    ),
    eqx.is_array,
    inverse=True,
)


def eqx_relu_apply(params: Any, batch: dict[str, Any]) -> Any:
    """The equinox model after a code change: relu for tanh, the params unchanged."""
    return jax.vmap(eqx.combine(params, _RELU_STATIC))(batch["features"])


def drifting_apply(params: Any, batch: dict[str, Any]) -> Any:
    """A bug: a constant drawn from fresh entropy each time it is traced, so
    the exported function and the live one differ."""
    shift = float(np.random.default_rng().uniform(1.0, 2.0))
    return eqx_apply(params, batch) + shift


def _loss(apply: Any) -> Any:
    def loss(params: Any, batch: Any) -> Any:
        return jnp.mean(jax.tree.leaves(apply(params, batch))[0] ** 2)

    return loss


def callback_apply(params: Any, batch: dict[str, Any]) -> Any:
    x = batch["features"]
    twice = jax.pure_callback(
        lambda a: np.asarray(a) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x
    )
    return eqx_apply(params, {"features": twice})


nnx_model = Model(
    init=nnx_init,
    apply=nnx_apply,
    loss=_loss(nnx_apply),
    batch_spec=BATCH,
    rtol=1e-5,
    atol=1e-6,
    name="user_nnx",
)
eqx_model = Model(
    init=eqx_init,
    apply=eqx_apply,
    loss=_loss(eqx_apply),
    batch_spec=BATCH,
    rtol=1e-5,
    atol=1e-6,
    name="user_eqx",
)
eqx_relu_model = Model(
    init=eqx_init,
    apply=eqx_relu_apply,
    loss=_loss(eqx_relu_apply),
    batch_spec=BATCH,
    rtol=1e-5,
    atol=1e-6,
    name="user_eqx",
)
drifting_model = Model(
    init=eqx_init,
    apply=drifting_apply,
    loss=_loss(drifting_apply),
    batch_spec=BATCH,
    rtol=1e-5,
    atol=1e-6,
    name="user_drifting",
)
callback_model = Model(
    init=eqx_init,
    apply=callback_apply,
    loss=_loss(callback_apply),
    batch_spec=BATCH,
    rtol=1e-5,
    atol=1e-6,
    name="user_callback",
)
