"""A model whose response is large (``x @ w``, 2**18 outputs a row): for the
tests of clients that never read what they asked for."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model

WIDTH = 1 << 18


def params() -> dict[str, np.ndarray[Any, Any]]:
    return {"w": np.full((2, WIDTH), 0.5, np.float32)}


def apply(p: Any, batch: Any) -> jax.Array:
    return batch["x"] @ p["w"]


model = Model(
    init=lambda key: params(),
    apply=apply,
    loss=lambda p, b: jnp.mean(apply(p, b)),
    batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}),
    rtol=1e-6,
    atol=1e-6,
    name="wide",
)
