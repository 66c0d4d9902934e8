"""How much the contract costs on the hot path, as ratios to jax.tree.flatten.

Targets (issue 2): on a 10,000-leaf tree, a repeated ``check`` against a spec
it already matched costs at most 2x ``jax.tree.flatten``; ``spec_of`` stays
within 5x. Every figure is the median of several runs after a warm-up, all
measured in this one process.

    python benchmarks/tree.py [--leaves 10000] [--repeat 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

import treeguard as tg


def median_seconds(fn: Callable[[], Any], repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def make_tree(leaves: int) -> dict[str, Any]:
    """A transformer-shaped tree: layers of blocks of named arrays."""
    per_block = 4
    blocks = leaves // per_block
    shapes = [(4, 4), (4,), (4, 8), (8,)]
    names = ["kernel", "bias", "up", "up_bias"]
    tree = {
        f"layer_{i // 10}": {
            f"block_{j}": {n: jnp.zeros(s) for n, s in zip(names, shapes)}
            for j in range(min(10, blocks - i))
        }
        for i in range(0, blocks, 10)
    }
    jax.block_until_ready(tree)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    tree = make_tree(args.leaves)
    n = len(jax.tree.leaves(tree))
    spec = tg.spec_of(tree)
    other = jax.tree.map(lambda x: x + 1, tree)  # same structure, new arrays
    jax.block_until_ready(other)
    tg.check(other, spec)

    base = median_seconds(lambda: jax.tree.flatten(other), args.repeat)
    rows = [
        ("jax.tree.flatten (baseline)", base),
        (
            "treeguard.check, validated signature",
            median_seconds(lambda: tg.check(other, spec), args.repeat),
        ),
        (
            "treeguard.spec_of, known structure",
            median_seconds(lambda: tg.spec_of(other), args.repeat),
        ),
        (
            "treeguard.mismatches, full comparison",
            median_seconds(lambda: tg.mismatches(other, spec), max(5, args.repeat // 5)),
        ),
        (
            "jax.tree_util.tree_flatten_with_path",
            median_seconds(lambda: jax.tree_util.tree_flatten_with_path(other), args.repeat),
        ),
    ]
    print(f"tree of {n} leaves, jax {jax.__version__}, median of {args.repeat} runs after warm-up")
    print(f"{'operation':<40} {'median':>10} {'x flatten':>10}")
    for name, seconds in rows:
        print(f"{name:<40} {seconds * 1e3:>8.2f}ms {seconds / base:>9.2f}x")
    check_ratio, spec_ratio = rows[1][1] / base, rows[2][1] / base
    print(f"target check <= 2x: {'met' if check_ratio <= 2 else 'MISSED'} ({check_ratio:.2f}x)")
    print(f"target spec_of <= 5x: {'met' if spec_ratio <= 5 else 'MISSED'} ({spec_ratio:.2f}x)")


if __name__ == "__main__":
    main()
