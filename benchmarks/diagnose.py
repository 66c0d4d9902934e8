"""How long ``locate`` takes, as a ratio to running the function eagerly and under jit once.

Two programs: the bundled example's loss (``treeguard.examples.mlp``) and a
deep MLP whose gradient has well over 500 jaxpr equations. Each is searched
twice: with no divergence (the candidate is plain ``jit``), and with one
injected at a known equation by a backend that compiles the program with
one ``tanh`` nudged (as a miscompiling backend would). The baseline is one
eager call plus one fresh ``jit`` compile-and-call of the same function,
measured in this process: the least a tool must do to see a divergence at
all. Every figure is the median of several runs after a warm-up.

    python benchmarks/diagnose.py [--repeat 3] [--layers 16]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp

from treeguard.diagnose import locate
from treeguard.examples import mlp


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def nudging(primitive: str, nth: int, eps: float = 1e-2) -> Callable[[Any, Sequence[Any]], Any]:
    """A backend: the program compiled with the ``nth`` top-level ``primitive`` nudged."""

    def run_jaxpr(closed: Any, args: Sequence[Any]) -> list[Any]:
        j = closed.jaxpr
        env: dict[Any, Any] = dict(zip(j.constvars, closed.consts))
        env.update(zip(j.invars, args))
        seen = 0

        def read(v: Any) -> Any:
            return v.val if isinstance(v, jex.Literal) else env[v]

        for eqn in j.eqns:
            params = eqn.primitive.get_bind_params(eqn.params)
            subfuns: tuple[Any, ...] = ()
            if isinstance(params, tuple):
                subfuns, params = params
            out = eqn.primitive.bind(*subfuns, *(read(v) for v in eqn.invars), **params)
            outs = list(out) if eqn.primitive.multiple_results else [out]
            if eqn.primitive.name == primitive:
                if seen == nth:
                    outs = [o + eps for o in outs]
                seen += 1
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in j.outvars]

    def backend(closed: Any, args: Sequence[Any]) -> list[Any]:
        return list(jax.jit(lambda *a: run_jaxpr(closed, a))(*args))

    return backend


def deep_loss(params: list[dict[str, jax.Array]], x: jax.Array) -> jax.Array:
    h = x
    for layer in params:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
        h = h / (1.0 + jnp.mean(h**2, axis=-1, keepdims=True))
    return jnp.mean(h**2)


def deep_params(layers: int, width: int) -> list[dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), layers)
    return [
        {"w": jax.random.normal(k, (width, width)) / jnp.sqrt(width), "b": jnp.zeros(width)}
        for k in keys
    ]


def baseline(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    def run() -> Any:
        with jax.disable_jit():
            fn(*args)
        return jax.jit(lambda *a: fn(*a))(*args)  # noqa: PLW0108 - a fresh function, a fresh compile

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--layers", type=int, default=16)
    args = parser.parse_args()
    params = mlp.model.init(mlp.model.key())
    batch = {k: jnp.asarray(v) for k, v in mlp.splits()["train"].items()}
    deep = deep_params(args.layers, 16)
    xs = jax.random.normal(jax.random.key(1), (8, 16))
    programs = [
        ("mlp loss", mlp.loss, (params, batch), 0),
        ("mlp grad", jax.grad(mlp.loss), (params, batch), 0),
        (f"deep grad ({args.layers} layers)", jax.grad(deep_loss), (deep, xs), args.layers // 2),
    ]
    print(f"jax {jax.__version__} on {jax.default_backend()}, median of {args.repeat} runs")
    print(
        f"{'program':<24} {'eqns':>5} {'baseline':>9} {'no div.':>9} {'ratio':>6} "
        f"{'located':>9} {'ratio':>6} {'runs':>5}  found"
    )
    for name, fn, fargs, nth in programs:
        n_eqns = len(jax.make_jaxpr(fn)(*fargs).jaxpr.eqns)
        base = median_seconds(baseline(fn, *fargs), args.repeat)
        # A fresh function object each time, so that jit compiles afresh as in the baseline.
        clean = median_seconds(
            lambda fn=fn, fargs=fargs: locate(lambda *a: fn(*a), *fargs).leaves,  # noqa: PLW0108
            args.repeat,
        )
        backend = nudging("tanh", nth)
        found: list[Any] = []

        def search(
            fn: Any = fn, fargs: Any = fargs, backend: Any = backend, found: list[Any] = found
        ) -> Any:
            d = locate(fn, *fargs, candidate=backend, check_precision=False)
            found.append(d)
            return d.leaves

        hit = median_seconds(search, args.repeat)
        d = found[-1]
        where = f"{d.equation.primitive} at {d.equation.index}" if d.equation else d.outcome
        print(
            f"{name:<24} {n_eqns:>5} {base:>8.3f}s {clean:>8.3f}s {clean / base:>5.1f}x "
            f"{hit:>8.3f}s {hit / base:>5.1f}x {d.compiles:>5}  {where}"
        )


if __name__ == "__main__":
    main()
