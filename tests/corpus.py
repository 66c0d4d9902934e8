"""The shared corpus of edge-case trees. Every feature's tests reuse it.

Each entry is ``(id, factory)``; factories build a fresh tree on each call so
a test may mutate what it gets.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Point = collections.namedtuple("Point", ["x", "y"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Linear:
    """A dataclass pytree with a static field."""

    w: jax.Array
    b: jax.Array
    name: str = dataclasses.field(default="linear", metadata={"static": True})


class Pair:
    """A custom node registered with keys and JSON-friendly aux data."""

    def __init__(self, left: Any, right: Any, tag: str = "pair") -> None:
        self.left, self.right, self.tag = left, right, tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pair) and self.tag == other.tag


jax.tree_util.register_pytree_with_keys(
    Pair,
    lambda p: (
        ((jax.tree_util.GetAttrKey("left"), p.left), (jax.tree_util.GetAttrKey("right"), p.right)),
        p.tag,
    ),
    lambda tag, children: Pair(*children, tag=tag),
)


def seed_params() -> dict[str, Any]:
    return {
        "dense1": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)},
        "dense2": {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)},
    }


def _nnx_state() -> Any:
    from flax import nnx

    model = nnx.Linear(2, 3, rngs=nnx.Rngs(0))
    return nnx.state(model)


def _equinox_module() -> Any:
    import equinox as eqx

    return eqx.nn.Linear(2, 3, key=jax.random.key(0))


def _optax_state() -> Any:
    import optax

    return optax.adam(1e-3).init(seed_params())


CORPUS: list[tuple[str, Callable[[], Any]]] = [
    ("seed_mlp", seed_params),
    ("nested_dict_list_tuple", lambda: {"a": [jnp.ones(2), (jnp.zeros((1, 2)), jnp.ones(()))]}),
    ("with_none", lambda: {"w": jnp.ones(2), "mask": None}),
    ("namedtuple", lambda: Point(jnp.ones(3), jnp.zeros(3))),
    ("dataclass", lambda: Linear(jnp.ones((2, 3)), jnp.zeros(3))),
    ("custom_node", lambda: Pair(jnp.ones(2), {"inner": jnp.zeros(4)})),
    ("empty_containers", lambda: {"d": {}, "l": [], "t": (), "x": jnp.ones(1)}),
    ("scalar_0d", lambda: {"step": jnp.asarray(3, jnp.int32), "scale": jnp.asarray(1.5)}),
    ("zero_size", lambda: {"empty": jnp.zeros((0, 4)), "x": jnp.ones(2)}),
    ("bf16", lambda: {"w": jnp.ones((2, 2), jnp.bfloat16), "b": jnp.zeros(2, jnp.bfloat16)}),
    ("int8_bool", lambda: {"q": jnp.ones(4, jnp.int8), "mask": jnp.array([True, False])}),
    ("numpy_leaves", lambda: {"w": np.ones((2, 2), np.float32), "b": np.zeros(2, np.float16)}),
    ("int_keys", lambda: {0: jnp.ones(1), 1: jnp.zeros(1)}),
    ("odd_keys", lambda: {"a.b": jnp.ones(1), "c/d": jnp.zeros(1), "q'uote": jnp.ones(2)}),
    ("ordered_dict", lambda: collections.OrderedDict(z=jnp.ones(1), a=jnp.zeros(2))),
    ("flax_nnx_state", _nnx_state),
    ("equinox_module", _equinox_module),
    ("optax_adam_state", _optax_state),
]

IDS = [name for name, _ in CORPUS]
FACTORIES = [factory for _, factory in CORPUS]
