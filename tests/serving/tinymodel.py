"""A tiny model for the server tests: ``log(x**2 + eps) @ w``.

With ``eps = 1`` its outputs are finite; with ``eps = -1`` its params are
still finite (so a version passes the store's and the server's checks) but
its outputs are NaN for any ``|x| < 1``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model


def params(eps: float = 1.0) -> dict[str, np.ndarray[Any, Any]]:
    return {"w": np.ones((2, 1), np.float32), "eps": np.asarray(eps, np.float32)}


def apply(p: Any, batch: Any) -> jax.Array:
    return jnp.log(batch["x"] ** 2 + p["eps"]) @ p["w"]


def served(apply: Any, params: Any, name: str) -> Model:
    """A model of one batch input ``x`` of shape ``(B, 2)``, as the server tests serve it."""
    return Model(
        init=lambda key: params(),
        apply=apply,
        loss=lambda p, b: jnp.mean(apply(p, b)),
        batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}),
        rtol=1e-6,
        atol=1e-6,
        name=name,
    )


model = served(apply, params, "tiny")
