"""The server tests' tiny model (``log(x**2 + eps) @ w``, its outputs NaN
on traffic under a version with ``eps = -1`` while its params stay finite),
falling ill on demand too: a batch holding ``TRIGGER`` makes its process
change JAX's default matmul precision, so the batch after it needs a
compile nobody warmed. It stands for model code that changes JAX's
settings while serving.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import tinymodel

#: The input value that makes the next batch compile.
TRIGGER = 0.3125  # 5/16, exact in float32

params = tinymodel.params


def _settings_changed_on(x: np.ndarray[Any, Any]) -> None:
    if np.any(np.asarray(x) == TRIGGER):
        jax.config.update("jax_default_matmul_precision", "highest")


def apply(p: Any, batch: Any) -> jax.Array:
    jax.debug.callback(_settings_changed_on, batch["x"])
    return tinymodel.apply(p, batch)


model = tinymodel.served(apply, params, "ailing")
