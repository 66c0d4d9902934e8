"""What a store in a bucket costs over plain object reads and writes.

    .venv/bin/python benchmarks/store_s3.py              # 64 MiB, 3 runs each
    .venv/bin/python benchmarks/store_s3.py --mib 256
    .venv/bin/python benchmarks/store_s3.py --sharded   # a sharded version instead

Starts a SeaweedFS server on 127.0.0.1 (``tests/s3server.py``), then times,
on the same server and the same bytes (one float32 leaf of ``--mib`` MiB):

- ``put`` through ``ArtifactStore("s3://...")`` against one plain
  ``obstore.put`` of the checkpoint's bytes;
- ``load_current`` (streamed, every hash checked as it arrives) against one plain
  ``obstore.get`` of them;
- ``promote`` (the whole object read again and re-hashed) against one
  ranged read of the whole object.

With ``--sharded`` the tree is that leaf placed on a 2x4 mesh of 8 CPU
devices (8 shards), and the rows are ``put_sharded`` against a plain
``obstore.put`` of each shard's bytes, ``load_current`` onto the same mesh
against a plain ``obstore.get`` of each shard object, and ``promote`` (every
shard object read again and re-hashed) against the same gets; the plain
requests run 8 at a time, as the store's do. The ``load_placed`` row times
``load_current`` again against those gets made into the array a plain load
would return: each shard's bytes placed on its device (``jax.device_put``)
and the shards made one array on the mesh
(``jax.make_array_from_single_device_arrays``), none of it verified.

Each figure is the median of ``--runs`` runs after one warm-up, the store's
and the baseline's runs alternating in ABBA rounds; the ratio is the store's over the
baseline's, measured in the same run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import obstore
from _machine import need_inet_sockets
from obstore.store import S3Store

from tests.s3server import seaweedfs
from treeguard import ArtifactStore


def _medians(ours: Callable[[], object], base: Callable[[], object], runs: int) -> list[float]:
    """The median time of each call, the two alternating in ABBA rounds (so a
    change in the machine's load reaches both alike, and neither always runs
    first), after one warm-up each."""
    ours()
    base()
    times: list[list[float]] = [[], []]
    pairs = [(ours, times[0]), (base, times[1])]
    for n in range(runs):
        for call, out in pairs if n % 2 == 0 else pairs[::-1]:
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sharded", action="store_true")
    args = parser.parse_args()
    need_inet_sockets("benchmarks/store_s3.py (a SeaweedFS bucket on the loopback)")
    if args.sharded:
        _sharded(args.mib, args.runs)
        return
    tree = {"w": np.random.default_rng(0).standard_normal(args.mib * 2**18, np.float32)}
    with tempfile.TemporaryDirectory() as tmp, seaweedfs(Path(tmp) / "weed") as server:
        server.make_bucket("bench")
        os.environ.update(server.env())
        raw = S3Store("bench", prefix="plain", config={"conditional_put": "etag"})
        store = ArtifactStore.init("s3://bench/store")
        v1 = store.put(tree)
        store.verify(v1)
        store.promote(v1)
        v2 = store.put(tree)
        store.verify(v2)
        blob = bytes(
            obstore.get(
                S3Store("bench", prefix="store"), f"versions/{v1}/model.safetensors"
            ).bytes()
        )
        size = len(blob)
        flip = [v2, v1]

        def promote() -> None:
            flip.reverse()
            store.promote(flip[0])

        rows = [
            ("put", lambda: store.put(tree), lambda: obstore.put(raw, "x", blob)),
            (
                "load_current",
                lambda: store.load_current(tree),
                lambda: obstore.get(raw, "x").bytes(),
            ),
            ("promote", promote, lambda: obstore.get_range(raw, "x", start=0, length=size)),
        ]
        print(f"{args.mib} MiB tree ({size / 2**20:.1f} MiB object), median of {args.runs} runs")
        _table(rows, args.runs)


def _table(rows: list[tuple[str, Callable[[], object], Callable[[], object]]], runs: int) -> None:
    print(f"{'operation':<14}{'store s':>10}{'baseline s':>12}{'ratio':>8}")
    for name, ours, base in rows:
        t_ours, t_base = _medians(ours, base, runs)
        print(f"{name:<14}{t_ours:>10.3f}{t_base:>12.3f}{t_ours / t_base:>8.2f}")


def _sharded(mib: int, runs: int) -> None:
    """The ``--sharded`` rows (see the module docstring)."""
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((2, 4), ("x", "y"), devices=jax.devices("cpu")[:8])
    host = np.random.default_rng(0).standard_normal((mib * 2**9, 512), np.float32)
    tree = {"w": jax.device_put(host, NamedSharding(mesh, P("x", "y")))}
    like = {"w": jax.ShapeDtypeStruct(host.shape, host.dtype, sharding=tree["w"].sharding)}
    shards = [np.asarray(s.data).tobytes() for s in tree["w"].addressable_shards]
    devices = [s.device for s in tree["w"].addressable_shards]
    shapes = [s.data.shape for s in tree["w"].addressable_shards]
    pool = concurrent.futures.ThreadPoolExecutor(8)

    def each(call: Callable[[int], object]) -> None:
        list(pool.map(call, range(len(shards))))

    with tempfile.TemporaryDirectory() as tmp, seaweedfs(Path(tmp) / "weed") as server:
        server.make_bucket("bench")
        os.environ.update(server.env())
        raw = S3Store("bench", prefix="plain", config={"conditional_put": "etag"})
        store = ArtifactStore.init("s3://bench/store")
        flip = []
        for _ in range(2):
            v = store.put_sharded(tree)
            store.verify(v)
            flip.append(v)
        store.promote(flip[0])

        def promote() -> None:
            flip.reverse()
            store.promote(flip[0])

        def put_plain() -> None:
            each(lambda n: obstore.put(raw, f"s{n}", shards[n], use_multipart=False))

        def get_plain() -> None:
            each(lambda n: obstore.get(raw, f"s{n}").bytes())

        def get_placed() -> None:
            got = pool.map(lambda n: obstore.get(raw, f"s{n}").bytes(), range(len(shards)))
            bufs = [np.frombuffer(memoryview(b), host.dtype) for b in got]
            placed = jax.device_put([b.reshape(s) for b, s in zip(bufs, shapes)], devices)
            jax.block_until_ready(
                jax.make_array_from_single_device_arrays(host.shape, tree["w"].sharding, placed)
            )

        put_plain()
        rows: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
            ("put_sharded", lambda: store.put_sharded(tree), put_plain),
            ("load_current", lambda: jax.block_until_ready(store.load_current(like)), get_plain),
            ("load_placed", lambda: jax.block_until_ready(store.load_current(like)), get_placed),
            ("promote", promote, get_plain),
        ]
        print(f"{mib} MiB in {len(shards)} shards on a 2x4 mesh, median of {runs} runs")
        _table(rows, runs)


if __name__ == "__main__":
    main()
