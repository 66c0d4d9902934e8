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


def branching_apply(params: Any, batch: dict[str, Any]) -> Any:
    """A Python branch on the batch's size: no symbolic batch axis takes it."""
    out = eqx_apply(params, batch)
    return out * 2.0 if batch["features"].shape[0] > 2 else out


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


def _model(init: Any, apply: Any, name: str, **options: Any) -> Model:
    return Model(
        init=init,
        apply=apply,
        loss=_loss(apply),
        batch_spec=BATCH,
        rtol=1e-5,
        atol=1e-6,
        name=name,
        **options,
    )


nnx_model = _model(nnx_init, nnx_apply, "user_nnx")
eqx_model = _model(eqx_init, eqx_apply, "user_eqx")
#: The equinox model after a code change (its params unchanged).
eqx_relu_model = _model(eqx_init, eqx_relu_apply, "user_eqx")
drifting_model = _model(eqx_init, drifting_apply, "user_drifting")
branching_model = _model(eqx_init, branching_apply, "user_branching", batch_size=4)
callback_model = _model(eqx_init, callback_apply, "user_callback")
