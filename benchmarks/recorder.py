"""What the NaN flight recorder costs a training step that stays finite.

    .venv/bin/python benchmarks/recorder.py
    .venv/bin/python benchmarks/recorder.py --width 1024 --rounds 40
    .venv/bin/python benchmarks/recorder.py --width 4 --batch 1   # the per-call overhead

One run, every ratio against a baseline measured in the same run by
``treeguard.bench.ab``: after a warm-up (the compiles), the two sides in ABBA
rounds (neither always runs right after the other), each sample a few steps
long and awaited (``block_until_ready``); the ratio is of the medians, with
its 95% interval over the rounds. The verdict's clock is picked by backend
(``clock="auto"``): this process's CPU time on JAX's CPU backend (the wall
clock also counts what other processes on a shared machine took), the wall
clock on an accelerator (the host's CPU time misses the device's work); the
other clock's ratio is printed beside it. Each side keeps its own params.

* a jitted step function: ``recorder.wrap(step)`` over the bare jitted
  ``step(params, opt_state, batch) -> (params, opt_state, loss)``, target
  <= 1.05, twice: a loop that reads its loss every step (as one that logs it
  does; ``check="now"`` then reads the flag beside it), and a loop that
  dispatches steps without reading anything (``check="next"`` keeps the flag
  on the device and reads it every 16 steps, so the device's queue never
  drains);
* an ``OptaxStep``: ``recorder.wrap(optax_step(adam), loss=loss)`` (one
  program: grads, update and the check of the loss, grads, params and
  state) over a jitted ``value_and_grad`` then the same ``optax_step``
  (which checks the new params and state itself).

The step is an MLP of four ``width x width`` layers on a batch of 256 rows
(``--batch``) with ``optax.adam``; ``--width 4 --batch 1`` leaves little but
the per-call overhead of each side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import optax

import treeguard as tg
from treeguard.bench import ABResult, ab, conditions


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


def _line(name: str, r: ABResult, steps: int = 1) -> str:
    """The ratio of one A/B on its verdict's clock, its interval and verdict,
    what B costs more a step (a call of each side being ``steps`` steps), then
    the other clock."""
    c = r.comparison
    more = (c.cand_median - c.base_median) / steps * 1e6
    other = "wall" if c.clock == "cpu" else "cpu"
    o_a, o_b = (statistics.median(x.samples(other)) for x in (r.a, r.b))
    shown = {"cpu": "CPU time", "wall": "wall clock"}
    return (
        f"{name}: {c.ratio:.3f}x {shown[c.clock]} [{c.ratio_ci[0]:.3f}, {c.ratio_ci[1]:.3f}] "
        f"({c.cand_median * 1e3:.3f} ms / {c.base_median * 1e3:.3f} ms, {more:+.1f} us a step; "
        f"{c.verdict}), "
        f"{o_b / o_a if o_a else float('nan'):.3f}x {shown[other]} "
        f"({o_b * 1e3:.3f} ms / {o_a * 1e3:.3f} ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--batch", type=int, default=256, help="rows of the batch")
    parser.add_argument("--rounds", type=int, default=30, help="ABBA rounds of each A/B")
    parser.add_argument("--min-time", type=float, default=0.1, help="seconds of one sample")
    parser.add_argument(
        "--burst", type=int, default=10, help="steps of one call of the back-to-back loop"
    )
    args = parser.parse_args()
    opt = optax.adam(1e-3)
    batch = {
        "x": jax.random.normal(jax.random.key(1), (args.batch, args.width), jnp.float32),
        "y": jnp.zeros((args.batch, args.width), jnp.float32),
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
        recorded_next = recorder.wrap(step, check="next")
        recorded_optax = recorder.wrap(checked, loss=_loss)
        # each side keeps its own params, so neither waits on the other's buffers
        side: dict[str, list[Any]] = {}
        for name in ("bare", "recorded", "optax", "recorded_optax", "free", "next"):
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

        def free_running() -> Any:  # dispatched back to back; the last one is awaited
            s = side["free"]
            for _ in range(args.burst):
                s[0], s[1], _ = step(s[0], s[1], batch)
            return s[0]

        def next_recorded() -> Any:
            s = side["next"]
            for _ in range(args.burst):
                s[0], s[1], _ = recorded_next(s[0], s[1], batch)
            return s[0]

        def optax_alone() -> None:
            s = side["optax"]
            loss, grads = grad(s[0], batch)
            s[0], s[1] = checked(s[0], grads, s[1])
            float(loss)

        def optax_recorded() -> None:
            s = side["recorded_optax"]
            s[0], s[1], loss = recorded_optax(s[0], s[1], batch)
            float(loss)

        jitted, pipelined, optaxed = (
            ab(a, b, names=names, rounds=args.rounds, min_time=args.min_time, jit=False, warmup=5)
            for a, b, names in (
                (bare, with_recorder, ("bare", "recorded")),
                (free_running, next_recorded, ("bare", "recorded, check next")),
                (optax_alone, optax_recorded, ("grad+optax", "recorded")),
            )
        )
        recorded_next.flush()

    load = conditions().get("load") or {}
    device = jax.devices()[0]
    print(
        f"MLP of 4 layers {args.width}x{args.width}, batch {args.batch}, adam; {args.rounds} ABBA "
        f"rounds; {jax.default_backend()} ({device.device_kind}), jax {jax.__version__}; "
        f"load {load.get('1m')}/{load.get('5m')}/{load.get('15m')}"
    )
    print(_line("jitted step, loss read each step, recorded / bare (target <= 1.05)", jitted))
    print(
        _line(
            f"jitted step, {args.burst} steps dispatched back to back, recorded with "
            'check="next" / bare (target <= 1.05)',
            pipelined,
            args.burst,
        )
    )
    print(_line("optax_step, recorded / grad + optax_step", optaxed))


if __name__ == "__main__":
    main()
