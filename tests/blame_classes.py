"""Two equinox classes for the message tests: ``Dense`` is ``Layer`` renamed,
with its field ``b`` renamed ``bias``."""

from __future__ import annotations

import equinox as eqx
import jax


class Layer(eqx.Module):
    w: jax.Array
    b: jax.Array


class Dense(eqx.Module):
    w: jax.Array
    bias: jax.Array
