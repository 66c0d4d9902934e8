"""Models of a given form with their values drawn by numpy, not by their
initializers: a flax.nnx module built for real runs each initializer eagerly,
compiled once for each shape in each process (about 10 s of CPU for the
bundled CNN), where a test asks only for the model's form."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def drawn(make: Callable[[], Any], seed: int) -> Any:
    """The nnx module ``make`` builds, each float value drawn from a normal
    distribution seeded by ``seed``; nothing compiled."""
    module = nnx.eval_shape(make)  # traced: its variables hold only shapes
    rng = np.random.default_rng(seed)
    state = nnx.state(module)
    nnx.update(
        module,
        jax.tree.map(lambda s: jnp.asarray(rng.standard_normal(s.shape).astype(s.dtype)), state),
    )
    return module


def cnn_params(seed: int) -> Any:
    """The bundled CNN's params in the form ``cnn.init`` gives them (an nnx
    State of Params), drawn."""
    from treeguard.examples import cnn

    return nnx.state(drawn(lambda: cnn.CNN(rngs=nnx.Rngs(0)), seed), nnx.Param)
