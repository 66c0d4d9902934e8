"""The nnx model with BatchNorm and Dropout of ``nnxmodels``, whose loss takes the step's PRNG
key (``loss(params, batch, key)``, the dropout mask drawn from it), for the
replay of a flight-recorder bundle: a pixel at 1 makes the loss's log
barrier NaN at the line marked ``# NaN is born here``."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from nnxmodels import Net

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model


@functools.cache
def _split() -> tuple[Any, Any, Any]:
    """The module's graph, params and the rest (batch statistics, streams).

    Built on first use rather than at import (pytest's doctest collection
    imports this file in every worker), and first used where ``model`` is
    read, outside any trace."""
    return nnx.split(Net(nnx.Rngs(0)), nnx.Param, ...)


def init(key: Any) -> Any:
    return _split()[1]


def _model(params: Any) -> Any:
    """The module, with a fresh copy of its batch statistics and streams (a
    training call updates them, inside whatever trace runs it)."""
    graph, _, rest = _split()
    return nnx.merge(graph, params, jax.tree.map(lambda x: x, rest))


def apply(params: Any, batch: Any) -> Any:
    model = _model(params)
    model.eval()
    return model(batch["x"])


def loss(params: Any, batch: Any, key: Any) -> Any:
    """The squared output under dropout, and a barrier keeping inputs below 1."""
    y = _model(params)(batch["x"], key)
    barrier = jnp.mean(jnp.log(1.0 - batch["x"]))  # NaN is born here
    return jnp.mean(y**2) - 1e-3 * barrier


@functools.cache
def _keyed_model() -> Model:
    _split()  # the nnx model is built here, eagerly, before any step traces init or loss
    return Model(
        init=init,
        apply=apply,
        loss=loss,
        optimizer=optax.sgd(0.1),
        batch_spec=spec_of({"x": LeafSpec(("B", 4), "float32")}),
        rtol=1e-5,
        atol=1e-5,
        name="keyed:model",
    )


def __getattr__(name: str) -> Any:
    """``model``, the ``Model`` that ``keyed:model`` names, made on first read."""
    if name == "model":
        return _keyed_model()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
