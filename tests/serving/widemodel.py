"""A model whose response is large (``x @ w``, 2**18 outputs a row): for the
tests of clients that never read what they asked for."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from tinymodel import served

WIDTH = 1 << 18


def params() -> dict[str, np.ndarray[Any, Any]]:
    return {"w": np.full((2, WIDTH), 0.5, np.float32)}


def apply(p: Any, batch: Any) -> jax.Array:
    return batch["x"] @ p["w"]


model = served(apply, params, "wide")
