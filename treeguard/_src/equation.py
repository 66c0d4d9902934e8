"""Running one jaxpr equation eagerly: what the PRNG key checker and the
diagnosis interpreter both do, equation by equation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bind(eqn: Any, invals: Sequence[Any]) -> list[Any]:
    """Runs one equation on concrete (or traced) values; one dispatch.

    Args:
      eqn: a ``jax.extend.core`` equation.
      invals: one value per input variable.

    Returns:
      Its outputs, one per output variable.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> (eqn,) = jax.make_jaxpr(jnp.sin)(1.0).jaxpr.eqns
      >>> [float(v) for v in bind(eqn, [jnp.float32(0.0)])]
      [0.0]
    """
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: tuple[Any, ...] = ()
    if isinstance(params, tuple):  # older JAX: (subfuns, params)
        subfuns, params = params
    with eqn.ctx.manager:
        out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]
