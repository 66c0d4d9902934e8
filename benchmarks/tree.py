"""How much the contract costs on the hot path, as ratios to jax.tree.flatten.

Targets: on a 10,000-leaf tree, a repeated ``check`` against a spec it
already matched costs at most 2x ``jax.tree.flatten`` of that tree, whether
its leaves are jax or numpy arrays and its nodes dicts or lists and tuples;
``spec_of`` stays within 5x. Every figure is the median of several runs after
a warm-up, all in this one process; each operation is timed alternately with
``jax.tree.flatten``, and its ratio is to that baseline.

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
import numpy as np

import treeguard as tg


def make_tree(leaves: int, array: Callable[[tuple[int, ...]], Any]) -> dict[str, Any]:
    """A transformer-shaped tree: dicts of layers of blocks of named arrays."""
    per_block = 4
    blocks = leaves // per_block
    shapes = [(4, 4), (4,), (4, 8), (8,)]
    names = ["kernel", "bias", "up", "up_bias"]
    return {
        f"layer_{i // 10}": {
            f"block_{j}": {n: array(s) for n, s in zip(names, shapes)}
            for j in range(min(10, blocks - i))
        }
        for i in range(0, blocks, 10)
    }


def make_sequence_tree(leaves: int, array: Callable[[tuple[int, ...]], Any]) -> list[Any]:
    """The same arrays held in lists and tuples: a list of layers, each a
    list of ``((kernel, bias), (up, up_bias))`` blocks."""
    blocks = leaves // 4
    return [
        [
            ((array((4, 4)), array((4,))), (array((4, 8)), array((8,))))
            for _ in range(min(10, blocks - i))
        ]
        for i in range(0, blocks, 10)
    ]


def _jax_zeros(shape: tuple[int, ...]) -> Any:
    return jnp.zeros(shape)


def _numpy_zeros(shape: tuple[int, ...]) -> Any:
    return np.zeros(shape, np.float32)


#: (name, tree builder, leaf builder); the first is the tree the targets name first.
CASES: list[tuple[str, Callable[..., Any], Callable[[tuple[int, ...]], Any]]] = [
    ("jax arrays, dict nodes", make_tree, _jax_zeros),
    ("numpy arrays, dict nodes", make_tree, _numpy_zeros),
    ("numpy arrays, list/tuple nodes", make_sequence_tree, _numpy_zeros),
]


def paired(op: Callable[[], Any], base: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """Median seconds of ``op`` and of ``base``, called alternately after a
    warm-up, so that a change in the machine's load moves both alike."""
    for _ in range(3):
        op()
        base()
    ops: list[float] = []
    bases: list[float] = []
    for _ in range(repeat):
        for fn, out in ((base, bases), (op, ops)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(ops), statistics.median(bases)


def measure(tree: Any, repeat: int) -> list[tuple[str, float, float]]:
    """Each operation's median seconds on ``tree`` and its ratio to
    ``jax.tree.flatten`` timed alternately with it."""
    spec = tg.spec_of(tree)
    other = jax.tree.map(lambda x: x + 1, tree)  # same structure, new arrays
    jax.block_until_ready(other)
    tg.check(other, spec)

    def flatten() -> Any:
        return jax.tree.flatten(other)

    ops: list[tuple[str, Callable[[], Any], int]] = [
        ("jax.tree.flatten (baseline)", flatten, repeat),
        ("treeguard.check, validated signature", lambda: tg.check(other, spec), repeat),
        ("treeguard.spec_of, known structure", lambda: tg.spec_of(other), repeat),
        (
            "treeguard.mismatches, full comparison",
            lambda: tg.mismatches(other, spec),
            max(5, repeat // 5),
        ),
        (
            "jax.tree_util.tree_flatten_with_path",
            lambda: jax.tree_util.tree_flatten_with_path(other),
            repeat,
        ),
    ]
    rows = []
    for name, fn, n in ops:
        seconds, base = paired(fn, flatten, n)
        rows.append((name, seconds, seconds / base))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--leaves", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()

    print(f"jax {jax.__version__}, median of {args.repeat} runs after warm-up")
    verdicts = []
    for case, build, array in CASES:
        tree = build(args.leaves, array)
        jax.block_until_ready(tree)
        n = len(jax.tree.leaves(tree))
        rows = measure(tree, args.repeat)
        print(f"\n{case}: {n} leaves")
        print(f"{'operation':<40} {'median':>10} {'x flatten':>10}")
        for name, seconds, ratio in rows:
            print(f"{name:<40} {seconds * 1e3:>8.2f}ms {ratio:>9.2f}x")
        verdicts.append((case, rows[1][2], rows[2][2]))
    print()
    for case, check_ratio, spec_ratio in verdicts:
        check_ok = "met" if check_ratio <= 2 else "MISSED"
        spec_ok = "met" if spec_ratio <= 5 else "MISSED"
        print(f"{case}: target check <= 2x: {check_ok} ({check_ratio:.2f}x)")
        print(f"{case}: target spec_of <= 5x: {spec_ok} ({spec_ratio:.2f}x)")


if __name__ == "__main__":
    main()
