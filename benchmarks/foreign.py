"""Foreign weights: loading a safetensors file treeguard did not write, by name.

One run writes a Hugging Face style file with ``safetensors.numpy.save_file``
(float32, dotted names, 256 MiB in 32 tensors by default) and reads it back
in one process, alternating the readers so each sees the same page cache:

* ``safetensors.numpy.load_file``: the baseline, a dict of numpy arrays;
* ``treeguard.load(path, like=..., names="dotted", unverified="allow")``:
  the strict header check, the match of every name, shape and dtype with
  ``like``, then the tensors, into ``like``'s nested structure;
* ``treeguard.read_foreign(path)``: the same read, nested by name;
* ``treeguard.import_weights(path, dst)``: read, then a hashed, fsynced save.

Times are the median of ``--repeats`` runs after one warm-up of each;
ratios are against ``load_file`` measured in the same run.

    .venv/bin/python benchmarks/foreign.py              # 256 MiB, 32 tensors
    .venv/bin/python benchmarks/foreign.py --mib 32     # a quick run
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
import safetensors.numpy

import treeguard as tg


def _arrays(total_mib: int, tensors: int) -> dict[str, np.ndarray]:
    n = total_mib * 1024 * 1024 // 4 // tensors
    rows = 1024
    out = {}
    for i in range(tensors):
        block, kind = divmod(i, 2)
        name = f"model.layers.{block}.mlp.{'up' if kind == 0 else 'down'}_proj.weight"
        out[name] = np.full((rows, n // rows), i, np.float32)
    return out


def _like(arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    for name, a in arrays.items():
        _, _, block, _, proj, _ = name.split(".")
        layers.setdefault(block, {}).setdefault("mlp", {})[proj] = {
            "weight": np.zeros(a.shape, a.dtype)
        }
    return {"model": {"layers": [layers[str(i)] for i in range(len(layers))]}}


def _median(f: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
        del out
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--tensors", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    arrays = _arrays(args.mib, args.tensors)
    like = _like(arrays)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        dst = os.path.join(d, "imported.safetensors")
        safetensors.numpy.save_file(arrays, path)
        del arrays
        runs: dict[str, Callable[[], Any]] = {
            "safetensors.numpy.load_file": lambda: safetensors.numpy.load_file(path),
            "treeguard.load(names=dotted)": lambda: tg.load(
                path, like=like, names="dotted", unverified="allow"
            ),
            "treeguard.read_foreign": lambda: tg.read_foreign(path),
            "treeguard.import_weights": lambda: tg.import_weights(path, dst),
        }
        for f in runs.values():  # warm-up: page cache, imports, first allocations
            f()
        times = {name: _median(f, args.repeats) for name, f in runs.items()}
    base = times["safetensors.numpy.load_file"]
    mib = args.mib
    print(
        f"foreign safetensors, {mib} MiB in {args.tensors} float32 tensors, "
        f"median of {args.repeats} (cpus={os.cpu_count()})"
    )
    for name, t in times.items():
        print(f"  {name:32s} {t * 1e3:8.1f} ms  {mib / t:7.0f} MiB/s  {t / base:5.2f}x load_file")


if __name__ == "__main__":
    main()
