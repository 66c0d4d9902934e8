"""A newcomer's own models for the model-change tests: a flax.nnx model with
BatchNorm (state that is not an ``nnx.Param``) and Dropout (a PRNG stream),
before and after a layer is added, and the same change to an equinox module.

The module-level trees are what ``treeguard ckpt migrate --init MODULE:ATTR``
points at in the CLI tests.
"""

from __future__ import annotations

import functools
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx


class Net(nnx.Module):
    """The model before the change: an encoder, BatchNorm, Dropout, an output."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        self.encoder = nnx.Linear(4, 8, rngs=rngs)
        self.norm = nnx.BatchNorm(8, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8, 2, rngs=rngs)

    def __call__(self, x: Any, key: Any = None) -> Any:
        """The outputs; with ``key``, dropout draws its mask from it."""
        h = jax.nn.relu(self.norm(self.encoder(x)))
        return self.out(self.drop(h, rngs=nnx.Rngs(dropout=key)) if key is not None else h)


class NetWithHead(Net):
    """The model after the change: a head added after the output."""

    def __init__(self, rngs: nnx.Rngs) -> None:
        super().__init__(rngs)
        self.head = nnx.Linear(2, 3, rngs=rngs)

    def __call__(self, x: Any, key: Any = None) -> Any:
        return self.head(super().__call__(x, key))


def eqx_net(key: Any, *, head: bool) -> Any:
    """An equinox module of one class name before and after a head is added
    (the class is the same in the code; its fields changed)."""

    class EqxNet(eqx.Module):
        encoder: eqx.nn.Linear
        out: eqx.nn.Linear
        head: eqx.nn.Linear | None

        def __init__(self, key: Any) -> None:
            a, b, c = jax.random.split(key, 3)
            self.encoder = eqx.nn.Linear(4, 8, key=a)
            self.out = eqx.nn.Linear(8, 2, key=b)
            self.head = eqx.nn.Linear(2, 3, key=c) if head else None

        def __call__(self, x: Any) -> Any:
            y = self.out(jnp.tanh(self.encoder(x)))
            return y if self.head is None else self.head(y)

    return EqxNet(key)


@functools.cache
def _new_state() -> Any:
    return nnx.state(NetWithHead(nnx.Rngs(1)))


def __getattr__(name: str) -> Any:
    """``NEW_STATE``, the new nnx model's whole state (params, batch statistics,
    PRNG streams), built on first use rather than at import: every pytest
    worker imports this module while collecting, most never read it."""
    if name == "NEW_STATE":
        return _new_state()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def new_leaf(path: str) -> Any:
    """The function form of ``--init``: zeros of each new leaf's shape."""
    shapes = {"['head']['kernel'].value": (2, 3), "['head']['bias'].value": (3,)}
    return jnp.zeros(shapes[path], jnp.float32)
