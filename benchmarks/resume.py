"""Resuming after a change: what a background save costs a training step,
how long ``save_async`` blocks its caller, and what a subtree load saves.

    .venv/bin/python benchmarks/resume.py            # a 256 MiB checkpoint
    .venv/bin/python benchmarks/resume.py --mib 1024

Every ratio is measured in this one run against a baseline measured in the
same run, the baseline and the measured side alternating (medians, after a
warm-up):

* step during save: the median time of a jitted training-sized step (a
  ``tanh(x @ w)`` chain on 1024x1024 f32) while ``save_async`` writes the
  checkpoint, over the same step with no save running (target <= 1.1);
* caller block: how long ``save_async`` takes to return, over the
  device-to-host copy of the same tree alone (target <= 1.2);
* subtree load: ``load(..., subtree=)`` of one eighth of the checkpoint,
  over a whole ``load`` (target <= 0.2).

The default is 256 MiB rather than 1 GiB: the machine these runs are made on
is shared and small, and a 1 GiB file takes minutes there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax
import jax.numpy as jnp
import numpy as np

import treeguard as tg


def _tree(mib: int) -> dict[str, dict[str, jax.Array]]:
    n = mib * 1024 * 1024 // 4 // 8
    return {f"block{i}": {"w": jnp.full((n,), float(i), jnp.float32)} for i in range(8)}


@jax.jit
def _step(x: jax.Array, w: jax.Array) -> jax.Array:
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return x


def _time(fn: object, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    args = parser.parse_args()
    tree = _tree(args.mib)
    jax.block_until_ready(tree)
    x = jnp.ones((1024, 1024), jnp.float32)
    w = jnp.eye(1024, dtype=jnp.float32) * 0.5
    _step(x, w).block_until_ready()

    def one_step() -> None:
        _step(x, w).block_until_ready()

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ckpt.safetensors"
        tg.save_async(path, tree).result()  # warm-up: every module imported, the file cached

        # the baseline and the saves alternate, so a load that comes and goes hits both
        alone: list[float] = []
        during: list[float] = []
        blocks: list[float] = []
        copies: list[float] = []
        for _ in range(5):
            alone.extend(_time(one_step, 10))
            copies.extend(
                _time(lambda: jax.tree.map(lambda a: np.array(jax.device_get(a)), tree), 1)
            )
            t = time.perf_counter()
            handle = tg.save_async(path, tree)
            blocks.append(time.perf_counter() - t)
            while not handle.done():
                during.extend(_time(one_step, 1))
            handle.result()
        base = statistics.median(alone)

        like = jax.tree.map(np.asarray, tree["block3"])
        whole_like = jax.tree.map(np.asarray, tree)
        tg.load(path, like=whole_like)
        whole = statistics.median(_time(lambda: tg.load(path, like=whole_like), 3))
        part = statistics.median(_time(lambda: tg.load(path, like=like, subtree="['block3']"), 5))

    block, copy = statistics.median(blocks), statistics.median(copies)
    device = jax.devices()[0]
    print(f"jax {jax.__version__} on {device.platform} ({device.device_kind}), wall clock")
    print(f"checkpoint: {args.mib} MiB in 8 blocks; {len(during)} steps timed during saves")
    print(
        f"step during save_async / without: {statistics.median(during) / base:.2f}x "
        f"({statistics.median(during) * 1e3:.1f} ms / {base * 1e3:.1f} ms; target <= 1.1)"
    )
    print(
        f"save_async caller block / host copy: {block / copy:.2f}x "
        f"({block * 1e3:.0f} ms / {copy * 1e3:.0f} ms; target <= 1.2)"
    )
    print(
        f"subtree load (1/8) / whole load: {part / whole:.2f}x "
        f"({part * 1e3:.0f} ms / {whole * 1e3:.0f} ms; target <= 0.2)"
    )


if __name__ == "__main__":
    main()
