"""What provenance costs beside the load it guards: signing a verdict and
checking it (ECDSA over the verdict's canonical text, which holds the header
digest that covers every tensor's BLAKE3 digest; no byte of the weights is
hashed again), against a verified ``treeguard.load`` of the same checkpoint.

Each figure is the median of ``--repeats`` runs, in one process, the file in
the page cache; the fraction is against the load measured in the same run.

    .venv/bin/python benchmarks/provenance.py            # 1 GiB in 64 leaves
    .venv/bin/python benchmarks/provenance.py --mib 128  # a quick run
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
from treeguard._src import strictjson
from treeguard._src.provenance.trust import sign_text
from treeguard.provenance import CURVES, TrustPolicy, generate_keys, load_signing_key

_VERDICT = "application/vnd.treeguard.verdict+json"


def _median(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--leaves", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = args.mib * 1024 * 1024 // 4 // args.leaves
    tree = {f"layer_{i:02d}": np.full(n, i, np.float32) for i in range(args.leaves)}
    like = tg.spec_of(tree)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        tg.save(path, tree)
        del tree
        header = tg.read_header(path)
        verdict = strictjson.dumps(
            {"version": "v000001", "digest": header.digest, "status": "verified", "checks": []}
        ).encode("ascii")
        tg.load(path, like=like)  # warm-up: page cache, imports
        load = _median(lambda: tg.load(path, like=like), args.repeats)
        print(
            f"verified load of {args.mib} MiB in {args.leaves} leaves: {load * 1e3:.1f} ms "
            f"(median of {args.repeats}, page cache)"
        )
        for curve in CURVES:
            key_path, pub = generate_keys(os.path.join(d, curve), curve=curve)
            key = load_signing_key(key_path)
            policy = TrustPolicy.from_paths(trusted=[pub])
            text = sign_text(key, _VERDICT, verdict)
            reps = args.repeats * 20
            sign = _median(lambda key=key: sign_text(key, _VERDICT, verdict), reps)
            check = _median(
                lambda policy=policy, text=text: policy.check_text(_VERDICT, verdict, text), reps
            )
            print(
                f"  {curve}: sign {sign * 1e3:6.3f} ms, check {check * 1e3:6.3f} ms, "
                f"together {(sign + check) / load:.4%} of the load"
            )


if __name__ == "__main__":
    main()
