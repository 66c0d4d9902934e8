"""Running one jaxpr equation eagerly, and naming where it came from: what
the PRNG key checker and the diagnosis interpreter both do, equation by
equation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.extend.source_info_util as jsi

#: Call-like primitives and the parameter that holds their body (a closed
#: jaxpr or a jaxpr). A body's inputs are the equation's last
#: ``len(body.invars)`` inputs. The key checker and the diagnosis follow
#: these bodies; anything else is evaluated whole.
CALLS = {
    "jit": "jaxpr",
    "pjit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


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


def site(eqn: Any) -> tuple[str, str]:
    """Where an equation came from, and the transformations it went through.

    Returns ``("model.py:88 (apply)", "transpose(jvp())")``: the user frame
    that bound the equation, as verify's key messages write it, and its
    name stack. Both come from ``eqn.source_info``, read through the public
    ``jax.extend.source_info_util.summarize`` and the ``name_stack`` field of
    ``jax.extend.source_info_util.SourceInfo``. This is the one place that
    reads them; ``tests/diagnose/test_jaxpr.py`` fails loudly if JAX changes
    either. The PRNG key checker and the diagnosis both name sites with it.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> def f(x):
      ...     return jnp.sin(x)
      >>> site(jax.make_jaxpr(f)(1.0).jaxpr.eqns[0])
      ('<doctest treeguard._src.equation.site[1]>:2 (f)', '')
    """
    text = str(jsi.summarize(eqn.source_info))
    where = short_site(text) if text and not text.startswith("<unknown") else ""
    return where or "unknown", str(eqn.source_info.name_stack)


def short_site(text: str) -> str:
    """``/long/path/model.py:88:13 (apply)`` as ``model.py:88 (apply)``.

    Example:
      >>> short_site("/a/b/model.py:88:13 (apply)")
      'model.py:88 (apply)'
      >>> short_site("<doctest x[1]>:2:11 (f)")
      '<doctest x[1]>:2 (f)'
    """
    where, sep, func = text.rpartition(" (")
    if not sep:
        where, func = text, ""
    else:
        func = f"({func}"
    parts = where.split(":")
    if len(parts) >= 3 and parts[-1].isdigit() and parts[-2].isdigit():
        parts = parts[:-1]  # drop the column
    head = ":".join(parts)
    if not head.startswith("<"):
        head = head.rsplit("/", 1)[-1]
    return f"{head} {func}".strip()
