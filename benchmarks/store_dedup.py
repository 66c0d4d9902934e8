"""What a store made with ``dedup=True`` adds per version, and what its put
costs, against baselines measured in the same run.

1. A base of ``--mib`` in 64 tensors, then a version changing 1 of them:
   the bytes it adds to the store against that tensor's bytes (goal: at
   most 1.05x, plus its manifest), and its put's time against writing
   those bytes to a file (open, write, fsync, rename: what a put of them
   alone costs; goal: at most 1.1x) and against a put of the whole tree
   into a store without dedup; then ``load_current`` of each (every byte
   hashed) against each other.
2. A version identical to one held: the bytes it adds (goal: a manifest).
3. A fine-tune of the same base: ``load_current`` onto jax arrays (whose
   digests the load remembers), one leaf replaced by a new jax array, and
   the put of that tree against writing the new leaf's bytes to a file
   (goal: at most 1.1x), in ABBA order (the write first every other time). Then the
   same tree put with ``block=False`` (waited for) against a put with
   ``block=False`` of fresh copies of its arrays, which the memo does not
   know: what the digests carried to the host copy save. ``--leaves``
   changes the base's leaf count (so the changed leaf's size: the put's
   fixed cost against the bytes).
4. ``--versions`` fine-tunes over a base of ``--fine-mib`` in 100 tensors,
   each changing 2 of them (2%): the store's bytes against the base's
   (goal: at most 4x).

    .venv/bin/python benchmarks/store_dedup.py              # 1 GiB; 256 MiB for 3.
    .venv/bin/python benchmarks/store_dedup.py --mib 128 --fine-mib 32 --versions 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import treeguard as tg


def _tree(total_mib: int, leaves: int) -> dict[str, np.ndarray]:
    n = total_mib * 1024 * 1024 // 4 // leaves
    return {f"layer_{i:03d}": np.full(n, i, np.float32) for i in range(leaves)}


def _bytes(root: str) -> int:
    """Every byte of tensors and manifests the store holds (its records, log,
    marker and pointer are the same for every kind of version)."""
    total = 0
    for here, _, files in os.walk(root):
        for name in files:
            if name == "tensors.json" or os.path.basename(here) == "tensors":
                total += os.lstat(os.path.join(here, name)).st_size
    return total


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _write_file(path: str, data: memoryview) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = data
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _load(store: tg.ArtifactStore, tree: dict[str, np.ndarray], repeats: int) -> float:
    """The median ``load_current`` of the store's newest version, verified
    and promoted first (every byte hashed, through every gate)."""
    v = store.versions()[-1].version
    store.verify(v)
    store.promote(v)
    like = tg.spec_of(tree)
    store.load_current(like)  # warm-up
    return statistics.median(_timed(lambda: store.load_current(like))[0] for _ in range(repeats))


def one_changed(mib: int, repeats: int) -> None:
    tree = _tree(mib, 64)
    nbytes = tree["layer_000"].nbytes
    with tempfile.TemporaryDirectory() as d:
        store = tg.ArtifactStore.init(os.path.join(d, "dedup"), dedup=True)
        plain = tg.ArtifactStore(os.path.join(d, "plain"))
        store.put(tree)
        puts, writes, wholes, added = [], [], [], []
        for i in range(repeats):
            tree["layer_000"] = np.full_like(tree["layer_000"], 1000 + i)
            before = _bytes(store.root)
            puts.append(_timed(lambda: store.put(tree))[0])
            added.append(_bytes(store.root) - before)
            target, raw = os.path.join(d, f"w{i}"), memoryview(tree["layer_000"]).cast("B")
            writes.append(_timed(lambda: _write_file(target, raw))[0])  # noqa: B023 - called now
            wholes.append(_timed(lambda: plain.put(tree))[0])
        v = store.versions()[-1].version
        manifest = os.path.getsize(os.path.join(store.root, "versions", v, "tensors.json"))
        loads = [_load(s, tree, repeats) for s in (store, plain)]
        before = _bytes(store.root)
        store.put(tree)
        same = _bytes(store.root) - before
    put, write, whole = (statistics.median(x) for x in (puts, writes, wholes))
    print(f"1 of 64 tensors changed ({mib} MiB in all; the tensor {nbytes / 2**20:.1f} MiB):")
    print(f"  bytes added            {statistics.median(added):>14,}")
    print(f"  tensor + manifest      {nbytes:>14,} + {manifest:,}")
    print(f"  added / tensor bytes   {(statistics.median(added) - manifest) / nbytes:>14.3f}x")
    print(f"  put                    {put * 1e3:>12.1f} ms")
    print(f"  write the tensor alone {write * 1e3:>12.1f} ms   put / write {put / write:.2f}x")
    print(f"  put without dedup      {whole * 1e3:>12.1f} ms   put / that  {put / whole:.2f}x")
    print(f"an identical version adds {same:,} bytes (its manifest: {manifest:,})")
    print(
        f"load_current of a tensors version {loads[0] * 1e3:.1f} ms, of a file version "
        f"{loads[1] * 1e3:.1f} ms: {loads[0] / loads[1]:.2f}x"
    )


def fine_tune(mib: int, repeats: int, leaves: int = 64) -> None:
    import jax
    import jax.numpy as jnp

    tree = _tree(mib, leaves)
    with tempfile.TemporaryDirectory() as d:
        store = tg.ArtifactStore.init(os.path.join(d, "dedup"), dedup=True)
        v = store.put(tree)
        store.verify(v)
        store.promote(v)
        like = {k: jax.ShapeDtypeStruct(a.shape, a.dtype) for k, a in tree.items()}
        params = store.load_current(like)  # jax arrays, every byte hashed
        del tree
        puts, writes = [], []
        for i in range(repeats + 1):  # the first is a warm-up
            params["layer_000"] = jnp.full_like(params["layer_000"], 2000 + i).block_until_ready()
            target = os.path.join(d, f"w{i}")
            raw = memoryview(np.asarray(params["layer_000"])).cast("B")
            if i % 2:  # ABBA: the write first every other time
                write = _timed(lambda: _write_file(target, raw))[0]  # noqa: B023 - called now
            put = _timed(lambda: store.put(params))[0]
            if not i % 2:
                write = _timed(lambda: _write_file(target, raw))[0]  # noqa: B023 - called now
            if i:
                puts.append(put)
                writes.append(write)
            if i == repeats:
                _non_blocking(store, params, repeats)
    put, write = statistics.median(puts), statistics.median(writes)
    print(f"fine-tune: load_current onto jax arrays, 1 of {leaves} leaves replaced ({mib} MiB):")
    print(f"  put                    {put * 1e3:>12.1f} ms")
    print(f"  write the tensor alone {write * 1e3:>12.1f} ms   put / write {put / write:.2f}x")
    print(f"  ratios, run by run     {' '.join(f'{p / w:.2f}' for p, w in zip(puts, writes))}")


def _non_blocking(store: tg.ArtifactStore, params: dict[str, Any], repeats: int) -> None:
    """``put(block=False)`` of ``params`` (each array but one known to the
    memo) against the same of fresh copies (none known), interleaved."""
    import jax.numpy as jnp

    fresh = {k: jnp.array(x, copy=True).block_until_ready() for k, x in params.items()}
    known, unknown = [], []
    for i in range(repeats + 1):  # the first is a warm-up
        a = _timed(lambda: store.put(params, block=False).result())[0]
        b = _timed(lambda: store.put(fresh, block=False).result())[0]
        if i:
            known.append(a)
            unknown.append(b)
    k, u = statistics.median(known), statistics.median(unknown)
    print("put(block=False) of the fine-tune, waited for:")
    print(f"  digests carried        {k * 1e3:>12.1f} ms")
    print(f"  fresh copies (hashed)  {u * 1e3:>12.1f} ms   carried / hashed {k / u:.2f}x")
    print(f"  ratios, run by run     {' '.join(f'{x / y:.2f}' for x, y in zip(known, unknown))}")


def fine_tunes(mib: int, versions: int) -> None:
    rng = np.random.default_rng(0)
    tree = _tree(mib, 100)
    base = sum(a.nbytes for a in tree.values())
    with tempfile.TemporaryDirectory() as d:
        store = tg.ArtifactStore.init(os.path.join(d, "dedup"), dedup=True)
        store.put(tree)
        for i in range(versions):
            for name in rng.choice(sorted(tree), size=2, replace=False):
                tree[name] = np.full_like(tree[name], 10_000 + i)
            store.put(tree)
        held = _bytes(store.root)
    print(f"{versions} versions each changing 2 of 100 tensors over a {mib} MiB base:")
    print(f"  store {held / 2**20:,.1f} MiB = {held / base:.2f}x the base (goal: <= 4x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--fine-mib", type=int, default=256)
    parser.add_argument("--versions", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fine-tune-only", action="store_true", help="run part 3 alone")
    parser.add_argument(
        "--leaves", type=int, default=64, help="part 3's leaves (1 GiB in 16: 64 MiB changed)"
    )
    args = parser.parse_args()
    if not args.fine_tune_only:
        one_changed(args.mib, args.repeats)
    fine_tune(args.mib, args.repeats, args.leaves)
    if not args.fine_tune_only:
        fine_tunes(args.fine_mib, args.versions)


if __name__ == "__main__":
    main()
