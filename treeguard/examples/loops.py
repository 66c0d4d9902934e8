"""Two versions of one function that differ by a known amount of work, for
``treeguard bench ab``.

``base`` runs ``STEPS`` dependent ``tanh(x @ w)`` steps on ``f32[48,48]``
under ``lax.fori_loop``; ``more`` runs 10% more steps. The compiler cannot
drop a step, so ``more`` does 10% more work::

    treeguard bench ab treeguard.examples.loops:base treeguard.examples.loops:more
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from treeguard.bench import Target

STEPS = 200
SIZE = 48


def steps(n: int) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """A jitted loop of ``n`` dependent ``tanh(x @ w)`` steps.

    Example:
      >>> x = jnp.ones((SIZE, SIZE)) / SIZE
      >>> steps(3)(x, x).shape
      (48, 48)
    """

    @jax.jit
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        out: jax.Array = jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ w), x)
        return out

    f.__name__ = f"steps{n}"  # type: ignore[attr-defined]
    return f


def _inputs() -> tuple[jax.Array, jax.Array]:
    x = jax.random.normal(jax.random.key(0), (SIZE, SIZE), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (SIZE, SIZE), jnp.float32) / SIZE**0.5
    return x, w


def base() -> Target:
    """``STEPS`` steps."""
    return Target(steps(STEPS), _inputs(), name=f"{STEPS} steps")


def more() -> Target:
    """``STEPS`` steps and 10% more."""
    return Target(steps(STEPS + STEPS // 10), _inputs(), name=f"{STEPS + STEPS // 10} steps")
