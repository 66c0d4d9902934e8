"""Test-only backends for ``locate``: interpreters that run a closed jaxpr op
by op and perturb chosen equations, as a miscompiling backend would.

They use only public JAX (``jax.extend.core``), and are independent of the
interpreter under test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np


def _scan_layout(params: Any) -> tuple[int, int]:
    """(constants, carries) among a scan equation's inputs, read here rather
    than through the interpreter under test. JAX 0.10 names the counts; later
    releases group the inputs as (consts, carry, xs) in ``ft_in``."""
    if "ft_in" in params:
        consts, carry, _ = params["ft_in"].elts
        return len(list(consts)), len(list(carry))
    return params["num_consts"], params["num_carry"]


_CALLS = {"jit": "jaxpr", "closed_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr"}


def _bind(eqn: Any, invals: list[Any]) -> list[Any]:
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns: tuple[Any, ...] = ()
    if isinstance(params, tuple):
        subfuns, params = params
    out = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


class Perturbing:
    """Runs a jaxpr op by op; adds ``eps`` to the outputs of every equation
    for which ``hit(eqn, iteration, n_top)`` is true."""

    def __init__(self, hit: Callable[[Any, int | None, int], bool], eps: float = 1e-2) -> None:
        self.hit = hit
        self.eps = eps
        self.__name__ = "perturbing"

    def __call__(self, closed: Any, args: Sequence[Any]) -> list[Any]:
        return self.run(closed, list(args), None, len(closed.jaxpr.eqns))

    def run(self, closed: Any, args: list[Any], it: int | None, n_top: int) -> list[Any]:
        j = closed.jaxpr
        env: dict[Any, Any] = dict(zip(j.constvars, closed.consts))
        env.update(zip(j.invars, args))

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jex.Literal) else env[v]

        for eqn in j.eqns:
            invals = [read(v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in _CALLS:
                body = eqn.params[_CALLS[name]]
                n = len(body.jaxpr.invars)
                outs = self.run(body, invals[len(invals) - n :], it, n_top)
            elif name == "cond":
                branch = eqn.params["branches"][int(np.asarray(invals[0]))]
                outs = self.run(branch, invals[1:], it, n_top)
            elif name == "scan":
                p = eqn.params
                nc, nk = _scan_layout(p)
                consts, carry, xs = invals[:nc], invals[nc : nc + nk], invals[nc + nk :]
                ys = []
                for i in range(p["length"]):
                    o = self.run(p["jaxpr"], [*consts, *carry, *(x[i] for x in xs)], i, n_top)
                    carry, y = o[:nk], o[nk:]
                    ys.append(y)
                stacked = [jnp.stack([y[k] for y in ys]) for k in range(len(ys[0]))] if ys else []
                outs = [*carry, *stacked]
            elif name == "while":
                p = eqn.params
                cn, bn = p["cond_nconsts"], p["body_nconsts"]
                cconsts, bconsts, carry = invals[:cn], invals[cn : cn + bn], invals[cn + bn :]
                i = 0
                while bool(self.run(p["cond_jaxpr"], [*cconsts, *carry], it, n_top)[0]):
                    carry = self.run(p["body_jaxpr"], [*bconsts, *carry], i, n_top)
                    i += 1
                outs = carry
            else:
                outs = _bind(eqn, invals)
                if self.hit(eqn, it, n_top):
                    outs = [o + jnp.asarray(self.eps, o.dtype) for o in outs]
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return [read(v) for v in j.outvars]


def perturbing(primitive: str, *, iteration: int | None = None, eps: float = 1e-2) -> Perturbing:
    """Perturbs every ``primitive`` equation (only at ``iteration`` inside a loop, if given)."""
    return Perturbing(
        lambda e, it, n: e.primitive.name == primitive and (iteration is None or it == iteration),
        eps,
    )


def perturbing_in_context(primitive: str, *, eps: float = 1e-2) -> Perturbing:
    """Perturbs ``primitive`` only in programs of several equations: clean alone,
    as an error that comes from fusing it with its neighbours."""
    return Perturbing(lambda e, it, n: e.primitive.name == primitive and n > 1, eps)


def degrading_matmuls(closed: Any, args: Sequence[Any]) -> list[Any]:
    """Rounds every top-level ``dot_general``'s inputs to bfloat16 unless the
    matmul precision is ``highest``: what a TPU's default precision does."""
    highest = str(jax.config.jax_default_matmul_precision) == "highest"
    j = closed.jaxpr
    env: dict[Any, Any] = dict(zip(j.constvars, closed.consts))
    env.update(zip(j.invars, args))

    def read(v: Any) -> Any:
        return v.val if isinstance(v, jex.Literal) else env[v]

    for eqn in j.eqns:
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive.name == "dot_general" and not highest:
            invals = [x.astype(jnp.bfloat16).astype(x.dtype) for x in invals]
        for v, x in zip(eqn.outvars, _bind(eqn, invals)):
            env[v] = x
    return [read(v) for v in j.outvars]
