"""What a store in a bucket costs over plain object reads and writes.

    .venv/bin/python benchmarks/store_s3.py              # 64 MiB, 3 runs each
    .venv/bin/python benchmarks/store_s3.py --mib 256

Starts a SeaweedFS server on 127.0.0.1 (``tests/s3server.py``), then times,
on the same server and the same bytes (one float32 leaf of ``--mib`` MiB):

- ``put`` through ``ArtifactStore("s3://...")`` against one plain
  ``obstore.put`` of the checkpoint's bytes;
- ``load_current`` (streamed, every hash checked as it arrives) against one plain
  ``obstore.get`` of them;
- ``promote`` (the whole object read again and re-hashed) against one
  ranged read of the whole object.

Each figure is the median of ``--runs`` runs after one warm-up, the store's
and the baseline's runs alternating; the ratio is the store's over the
baseline's, measured in the same run.
"""

from __future__ import annotations

import argparse
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
    """The median time of each call, the two alternating run by run (so a
    change in the machine's load reaches both alike), after one warm-up each."""
    ours()
    base()
    times: list[list[float]] = [[], []]
    for _ in range(runs):
        for call, out in ((ours, times[0]), (base, times[1])):
            start = time.perf_counter()
            call()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    need_inet_sockets("benchmarks/store_s3.py (a SeaweedFS bucket on the loopback)")
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
        print(f"{'operation':<14}{'store s':>10}{'baseline s':>12}{'ratio':>8}")
        for name, ours, base in rows:
            t_ours, t_base = _medians(ours, base, args.runs)
            print(f"{name:<14}{t_ours:>10.3f}{t_base:>12.3f}{t_ours / t_base:>8.2f}")


if __name__ == "__main__":
    main()
