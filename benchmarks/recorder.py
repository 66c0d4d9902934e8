"""What the NaN flight recorder costs a training step that stays finite.

    .venv/bin/python benchmarks/recorder.py
    .venv/bin/python benchmarks/recorder.py --width 1024 --steps 300

One run, every ratio against a baseline measured in the same run, the two
sides interleaved step by step (so a load that comes and goes hits both),
medians after a warm-up:

* a jitted step function: ``recorder.wrap(step)`` over the bare jitted
  ``step(params, opt_state, batch) -> (params, opt_state, loss)`` whose loss
  is read every step (as a loop that logs it does), target <= 1.05;
* an ``OptaxStep``: ``recorder.wrap(optax_step(adam), loss=loss)`` over the
  same ``optax_step`` called after a jitted ``value_and_grad``, its loss
  read every step.

The step is an MLP of four ``width x width`` layers on a batch of 256 with
``optax.adam``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import optax

import treeguard as tg


def _params(width: int) -> dict[str, dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.key(0), 4)
    return {
        f"layer{i}": {
            "w": jax.random.normal(k, (width, width), jnp.float32) / width**0.5,
            "b": jnp.zeros(width, jnp.float32),
        }
        for i, k in enumerate(keys)
    }


def _loss(params: Any, batch: Any) -> jax.Array:
    x = batch["x"]
    for i in range(len(params)):
        x = jnp.tanh(x @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"])
    return jnp.mean((x - batch["y"]) ** 2)


def _interleaved(a: Callable[[], None], b: Callable[[], None], steps: int) -> tuple[float, float]:
    """The median time of ``a`` and of ``b``, called in turn ``steps`` times each."""
    ta: list[float] = []
    tb: list[float] = []
    for _ in range(steps):
        for fn, out in ((a, ta), (b, tb)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    opt = optax.adam(1e-3)
    batch = {
        "x": jax.random.normal(jax.random.key(1), (256, args.width), jnp.float32),
        "y": jnp.zeros((256, args.width), jnp.float32),
    }

    @jax.jit
    def step(params: Any, opt_state: Any, batch: Any) -> Any:
        loss, grads = jax.value_and_grad(_loss)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    grad = jax.jit(jax.value_and_grad(_loss))
    checked = tg.optax_step(opt)

    with tempfile.TemporaryDirectory() as d:
        recorder = tg.FlightRecorder(d, batch="digest")
        recorded = recorder.wrap(step)
        recorded_optax = recorder.wrap(checked, loss=_loss)
        # each side keeps its own params, so neither waits on the other's buffers
        side: dict[str, list[Any]] = {}
        for name in ("bare", "recorded", "optax", "recorded_optax"):
            p = _params(args.width)
            side[name] = [p, opt.init(p)]

        def bare() -> None:
            s = side["bare"]
            s[0], s[1], loss = step(s[0], s[1], batch)
            float(loss)

        def with_recorder() -> None:
            s = side["recorded"]
            s[0], s[1], loss = recorded(s[0], s[1], batch)
            float(loss)

        def optax_alone() -> None:
            s = side["optax"]
            loss, grads = grad(s[0], batch)
            s[0], s[1] = checked(s[0], grads, s[1])
            float(loss)

        def optax_recorded() -> None:
            s = side["recorded_optax"]
            s[0], s[1], loss = recorded_optax(s[0], s[1], batch)
            float(loss)

        for fn in (bare, with_recorder, optax_alone, optax_recorded):  # warm-up: compiled
            for _ in range(5):
                fn()
        base, rec = _interleaved(bare, with_recorder, args.steps)
        obase, orec = _interleaved(optax_alone, optax_recorded, args.steps)

    print(f"MLP of 4 layers {args.width}x{args.width}, batch 256, adam; {args.steps} steps a side")
    print(
        f"jitted step, recorded / bare: {rec / base:.3f}x "
        f"({rec * 1e3:.2f} ms / {base * 1e3:.2f} ms; target <= 1.05)"
    )
    print(
        f"optax_step, recorded / grad + optax_step: {orec / obase:.3f}x "
        f"({orec * 1e3:.2f} ms / {obase * 1e3:.2f} ms)"
    )


if __name__ == "__main__":
    main()
