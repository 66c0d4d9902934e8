"""Checked updates against the unchecked idioms, in one run.

    .venv/bin/python benchmarks/update.py            # the table (about 3-4 minutes)
    .venv/bin/python benchmarks/update.py --quick    # small trees only

For each tree it times, after warm-up, the median of several calls of each
variant (every call ends in ``jax.block_until_ready``):

* ``raw jit``: ``jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - lr * b, p, g))``,
  the baseline every ratio is taken against;
* ``apply_updates`` (treeguard), ``updater`` (treeguard, ``on_nonfinite="ignore"``,
  the like-for-like check) and ``updater skip`` (with the NaN/Inf guard);
* ``eager tree.map`` and ``optax.apply_updates``.

It then counts backend compiles over 100 steps of one signature (after the
first), and measures peak memory of a donated step on 64M float32 params in
a fresh child process: peak RSS over six steps (the first compiles) above
the resident set once params and grads exist. On an accelerator the child
runs on the CPU backend (this process holds the chip, and one program at a
time may), so that figure is the host's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np
import optax

from treeguard import apply_updates, updater

LR = 0.01


def tree_of(n: int, size: int, seed: int = 0) -> dict[str, Any]:
    """``n`` leaves of ``size`` float32 values, in layers of two (``w``, ``b``)."""
    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {}
    for i in range(n // 2):
        out[f"layer{i}"] = {
            "w": jnp.asarray(rng.standard_normal(size, np.float32)),
            "b": jnp.asarray(rng.standard_normal(size, np.float32)),
        }
    return out


def seed_tree() -> dict[str, Any]:
    return {
        "dense1": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)},
        "dense2": {"w": jnp.ones((3, 1)), "b": jnp.zeros(1)},
    }


def median_times(
    fs: dict[str, Callable[[], Any]], budget: float, most: int, rounds: int = 5
) -> dict[str, float]:
    """Median seconds of one call of each variant, after warm-up.

    The variants take turns, round after round, so that load from other
    processes on the machine falls on all of them alike.
    """
    reps: dict[str, int] = {}
    for label, f in fs.items():
        jax.block_until_ready(f())
        jax.block_until_ready(f())
        start = time.perf_counter()
        jax.block_until_ready(f())
        once = time.perf_counter() - start
        reps[label] = int(min(most, max(2, budget / rounds / max(once, 1e-6))))
    times: dict[str, list[float]] = {label: [] for label in fs}
    for _ in range(rounds):
        for label, f in fs.items():
            for _ in range(reps[label]):
                start = time.perf_counter()
                jax.block_until_ready(f())
                times[label].append(time.perf_counter() - start)
    return {label: float(np.median(ts)) for label, ts in times.items()}


def variants(p: Any, g: Any, *, heavy: bool) -> dict[str, Callable[[], Any]]:
    raw = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - LR * b, p, g))
    step = updater(lambda a, b: a - LR * b, on_nonfinite="ignore")
    skip = updater(lambda a, b: a - LR * b, on_nonfinite="skip")
    upd = jax.tree.map(lambda x: -LR * x, g)
    jax.block_until_ready(upd)
    out: dict[str, Callable[[], Any]] = {
        "raw jit": lambda: raw(p, g),
        "apply_updates": lambda: apply_updates(p, upd),
        "updater": lambda: step(p, g),
    }
    if heavy:
        out["updater skip"] = lambda: skip(p, g)
    out["eager tree.map"] = lambda: jax.tree.map(lambda a, b: a - LR * b, p, g)
    out["optax.apply_updates"] = lambda: optax.apply_updates(p, upd)
    return out


def count_compiles_over_100_steps() -> tuple[int, int]:
    """Backend compiles during 100 steps after the first, and ``compile_count``."""
    compiles = 0

    def listen(event: str, duration: float, **kw: Any) -> None:
        nonlocal compiles
        if event == "/jax/core/compile/backend_compile_duration":
            compiles += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    step = updater(lambda p, g, *, lr: p - lr * g, on_nonfinite="skip", donate=True)
    params, grads = tree_of(200, 256), tree_of(200, 256, seed=1)
    params = step(params, grads, lr=LR)
    jax.block_until_ready(params)
    compiles = 0
    for i in range(100):
        params = step(params, grads, lr=LR * (1 + i % 3))
    jax.block_until_ready(params)
    return compiles, step.compile_count


MEMORY_CHILD = """
import sys, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
from treeguard import updater
donate = sys.argv[2] == "1"
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
n = 64 * 1024 * 1024 // 4
params = {f"l{i}": jnp.full((n,), 1.0, jnp.float32) for i in range(4)}
grads = {f"l{i}": jnp.full((n,), 1.0, jnp.float32) for i in range(4)}
jax.block_until_ready((params, grads))
step = updater(lambda p, g: p - 0.01 * g, donate=donate, on_nonfinite="ignore")
live = sum(x.nbytes for x in jax.live_arrays())
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")
for _ in range(6):  # the first call also compiles: its memory counts too
    params = jax.block_until_ready(step(params, grads))
peak = status("VmHWM:")
print(live, peak - base, sum(x.nbytes for x in jax.live_arrays()))
"""


def memory(donate: bool) -> tuple[int, int, int]:
    """``(live bytes before, peak RSS above the resident set, live bytes after)``."""
    root = str(Path(__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, root, "1" if donate else "0"],
        capture_output=True,
        text=True,
        check=True,
        env={
            **os.environ,
            "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
            # this process holds any accelerator: the child measures the host
            **({} if jax.default_backend() == "cpu" else {"JAX_PLATFORMS": "cpu"}),
        },
    ).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small trees only")
    args = parser.parse_args()
    # (name, tree, all variants?, seconds of timing per variant)
    cases: list[tuple[str, Callable[[], Any], bool, float]] = [
        ("4 leaves (seed MLP)", seed_tree, True, 1.0),
        ("200 leaves x 256", lambda: tree_of(200, 256), True, 1.0),
        ("2000 leaves x 256", lambda: tree_of(2000, 256), True, 1.0),
    ]
    if not args.quick:
        cases += [
            ("10000 leaves x 64", lambda: tree_of(10000, 64), False, 1.0),
            ("4 leaves x 16M (64M params)", lambda: tree_of(4, 16 * 1024 * 1024), True, 4.0),
        ]
    print(
        f"jax {jax.__version__}, optax {optax.__version__}, {jax.devices()[0].device_kind}, "
        f"{os.cpu_count()} CPUs"
    )
    header = f"{'tree':<30}{'variant':<22}{'median':>12}{'vs raw jit':>12}"
    print(header)
    print("-" * len(header))
    for name, make, heavy, budget in cases:
        p = make()
        g = jax.tree.map(lambda x: x * 0.5, p)
        times = median_times(variants(p, g, heavy=heavy), budget=budget, most=400 if heavy else 10)
        base = times["raw jit"]
        for label, t in times.items():
            unit = f"{t * 1e6:.1f} us" if t < 1e-3 else f"{t * 1e3:.2f} ms"
            print(f"{name:<30}{label:<22}{unit:>12}{t / base:>11.2f}x")
        t = times["apply_updates"]
        print(
            f"{'':<30}{'-> optax / checked':<22}{'':>12}{times['optax.apply_updates'] / t:>11.1f}x"
        )
        print(f"{'':<30}{'-> eager / checked':<22}{'':>12}{times['eager tree.map'] / t:>11.1f}x")
        del p, g
    compiles, count = count_compiles_over_100_steps()
    print(f"\nrecompiles over 100 steps after the first: {compiles} (compile_count {count})")
    if not args.quick:
        nbytes = 2 * 64 * 1024 * 1024 * 4
        for donate in (True, False):
            live, extra, after = memory(donate)
            where = "" if jax.default_backend() == "cpu" else " (a child on the CPU backend)"
            print(
                f"64M f32 params + grads = {nbytes >> 20} MiB{where}; donate={donate}: live "
                f"buffers {live >> 20} MiB before, {after >> 20} MiB after; peak RSS "
                f"{extra >> 20} MiB above the resident set "
                f"({100 * extra / nbytes:.1f}% of params+grads)"
            )


if __name__ == "__main__":
    main()
