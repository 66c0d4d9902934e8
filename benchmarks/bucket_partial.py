"""Partial and whole loads from a store in a bucket, this checkout against another.

    .venv/bin/python benchmarks/bucket_partial.py                      # this checkout alone
    .venv/bin/python benchmarks/bucket_partial.py --against ../main    # side by side

Starts a SeaweedFS server on 127.0.0.1 (``tests/s3server.py``), puts one
checkpoint of ``--mib`` MiB (``--leaves`` float32 leaves under
``['layers'][i]``, plus one ``['head']`` subtree of ``--part-mib`` MiB in two
leaves) and times, for each checkout, in a child process of its own that
imports that checkout's ``treeguard``:

- ``partial``: ``load_version(v, like, subtree="['head']")``, the subtree only;
- ``whole``: ``load_version(v)``, every tensor.

Each round runs one child per checkout, alternating (so a change in the
machine's load reaches both alike); a child makes one warm-up load, then
``--runs`` timed ones. Each figure is the median over every timed load of
every round; the ratio is this checkout's over the other's, measured in the
same run. Every load checks every hash it reads, in both checkouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from _machine import need_inet_sockets

from tests.s3server import seaweedfs

HERE = Path(__file__).resolve().parents[1]

#: What a child runs: the loads, timed, one JSON line of seconds per kind.
_CHILD = """
import json, sys, time
import numpy as np
from treeguard import ArtifactStore
url, version, runs, part_mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
n = part_mib * 2**17
like = {"w": np.zeros(n, np.float32), "b": np.zeros(n, np.float32)}
loads = {
    "partial": lambda s: s.load_version(version, like, subtree="['head']"),
    "whole": lambda s: s.load_version(version),
}
out = {}
for kind, load in loads.items():
    load(ArtifactStore(url))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        load(ArtifactStore(url))
        times.append(time.perf_counter() - start)
    out[kind] = times
print(json.dumps(out))
"""


def _tree(mib: int, leaves: int, part_mib: int) -> dict[str, object]:
    rng = np.random.default_rng(0)
    per = (mib - part_mib) * 2**20 // 4 // leaves
    half = part_mib * 2**17
    return {
        "layers": [rng.standard_normal(per, np.float32) for _ in range(leaves)],
        "head": {"w": rng.standard_normal(half, np.float32), "b": np.ones(half, np.float32)},
    }


def _child(checkout: Path, url: str, version: str, runs: int, part_mib: int) -> dict[str, list]:
    env = os.environ | {"PYTHONPATH": str(checkout), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, url, version, str(runs), str(part_mib)],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    times: dict[str, list] = json.loads(done.stdout.strip().splitlines()[-1])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, default=None, help="another checkout")
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--leaves", type=int, default=62)
    parser.add_argument("--part-mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    need_inet_sockets("benchmarks/bucket_partial.py (a SeaweedFS bucket on the loopback)")
    checkouts = {"this": HERE}
    if args.against is not None:
        checkouts["other"] = args.against.resolve()
    from treeguard import ArtifactStore

    with tempfile.TemporaryDirectory() as tmp, seaweedfs(Path(tmp) / "weed") as server:
        server.make_bucket("bench")
        os.environ.update(server.env())
        url = "s3://bench/store"
        version = ArtifactStore.init(url).put(_tree(args.mib, args.leaves, args.part_mib))
        times: dict[str, dict[str, list[float]]] = {k: {} for k in checkouts}
        for r in range(args.rounds):
            order = list(checkouts.items())
            for name, checkout in order if r % 2 == 0 else order[::-1]:
                got = _child(checkout, url, version, args.runs, args.part_mib)
                for kind, t in got.items():
                    times[name].setdefault(kind, []).extend(t)
    print(
        f"{args.mib} MiB checkpoint in a SeaweedFS bucket on 127.0.0.1, a {args.part_mib} MiB "
        f"subtree; median of {args.rounds} x {args.runs} loads after a warm-up each, "
        f"checkouts alternating ({os.cpu_count()} cores)"
    )
    for kind in ("partial", "whole"):
        medians = {name: statistics.median(t[kind]) for name, t in times.items()}
        line = "  ".join(f"{name} {m * 1e3:8.1f} ms" for name, m in medians.items())
        if "other" in medians:
            line += f"  this/other {medians['this'] / medians['other']:.2f}x"
        print(f"{kind:8s} {line}")


if __name__ == "__main__":
    main()
