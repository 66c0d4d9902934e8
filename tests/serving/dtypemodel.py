"""A model of one input and one output for each 8- to 32-bit datatype of the
protocol (BOOL, INT8-32, UINT8-32, FP16, FP32, BF16); each output is its
input, so a round trip shows every datatype decoded and encoded exactly."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from treeguard import LeafSpec, spec_of
from treeguard.verify import Model

DTYPES = {
    "b": np.dtype(bool),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
}


def apply(p: Any, batch: Any) -> dict[str, Any]:
    return {k: jnp.where(p["on"], batch[k], batch[k]) for k in DTYPES}


model = Model(
    init=lambda key: {"on": np.asarray(True)},
    apply=apply,
    loss=lambda p, b: jnp.zeros(()),
    batch_spec=spec_of({k: LeafSpec(("B", 2), dt) for k, dt in DTYPES.items()}),
    rtol=0.0,
    atol=0.0,
    name="dtypes",
)


def rows(n: int) -> dict[str, np.ndarray[Any, Any]]:
    """``n`` rows of each input, with values near each datatype's extremes."""
    out = {}
    for k, dt in DTYPES.items():
        if dt.kind == "b":
            out[k] = (np.arange(2 * n) % 2 == 0).reshape(n, 2)
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            out[k] = np.resize(np.array([info.min, info.max, 0, 1], dt), (n, 2))
        else:
            out[k] = np.resize(np.array([-1.5, 65504.0 if dt == np.float16 else 3e38], dt), (n, 2))
    return out
