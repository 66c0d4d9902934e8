"""A small model whose params are of one narrow float dtype (bfloat16 by
default, the TPU's own; float16 or a float8 with ``make``):
``tanh(x @ w + b)``, computed and answered in that dtype's precision.

``params(nan=True)`` holds one NaN in ``['dense']['w']``, for the gates that
must refuse it: verify's finite check, the store's model checks and the
server's load gate.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model


def params(dtype: Any = ml_dtypes.bfloat16, *, nan: bool = False) -> dict[str, Any]:
    w = np.array([[0.5, -0.25, 0.125], [0.75, 0.5, -0.5]], np.float32)
    if nan:
        w[1, 2] = np.nan
    return {"dense": {"w": w.astype(dtype), "b": np.array([0.0, 0.25, -0.25]).astype(dtype)}}


def make(dtype: Any = ml_dtypes.bfloat16, *, nan: bool = False) -> Model:
    """The model with params of ``dtype`` (outputs in bfloat16 for every
    float8, which XLA computes in no float8 arithmetic)."""
    out = np.dtype(dtype) if np.dtype(dtype).itemsize >= 2 else np.dtype(ml_dtypes.bfloat16)

    def apply(p: Any, batch: Any) -> jax.Array:
        w, b = p["dense"]["w"].astype(out), p["dense"]["b"].astype(out)
        return jnp.tanh(batch["x"].astype(out) @ w + b)

    return Model(
        init=lambda key: params(dtype, nan=nan),
        apply=apply,
        loss=lambda p, b: jnp.mean(apply(p, b).astype(jnp.float32) ** 2),
        batch_spec=spec_of({"x": LeafSpec(("B", 2), "float32")}),
        rtol=1e-2,
        atol=1e-2,
        name=f"dense_{np.dtype(dtype).name}",
        invalid_raises=(ValueError, TypeError),  # a wrong width fails in the matmul
    )


model = make()
