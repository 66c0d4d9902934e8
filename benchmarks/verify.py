"""verify's wall time against importing the libraries it runs on, in one run.

    .venv/bin/python benchmarks/verify.py             # 1 warm-up round + 3 timed (minutes)
    .venv/bin/python benchmarks/verify.py --runs 5

Each round runs three fresh processes, interleaved so that the machine's load
falls on all of them alike:

* the baseline, ``python -c "import treeguard, flax.nnx, optax"``;
* ``treeguard verify treeguard.examples.mlp:model --record --no-bench`` (the
  seed's two-layer model);
* ``treeguard verify treeguard.examples.cnn:model --record --no-bench`` (a
  3,658-parameter flax.nnx CNN trained with optax's adam).

References are recorded to a temporary directory, never over the shipped
ones. It prints the median wall time of each and the two ratios
(verify / baseline). The goals: mlp at most 3x, the CNN at most 5x.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _timed(args: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds after one warm-up")
    opts = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:

        def verify(target: str) -> list[str]:
            name = target.rsplit(".", maxsplit=1)[-1].split(":", maxsplit=1)[0]
            return [
                *(py, "-m", "treeguard.cli_verify", target, "--record", "--no-bench"),
                *("--references", f"{tmp}/{name}.safetensors", "--report-dir", f"{tmp}/{name}"),
            ]

        commands = {
            "import treeguard, flax.nnx, optax": [
                py,
                "-c",
                "import treeguard, flax.nnx, optax",
            ],
            "verify examples.mlp": verify("treeguard.examples.mlp:model"),
            "verify examples.cnn (nnx)": verify("treeguard.examples.cnn:model"),
        }
        times: dict[str, list[float]] = {k: [] for k in commands}
        for round_ in range(opts.runs + 1):
            for name, args in commands.items():
                t = _timed(args)
                if round_:  # the first round warms the file cache
                    times[name].append(t)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["import treeguard, flax.nnx, optax"]
    print(f"median of {opts.runs} interleaved runs (after one warm-up round), wall seconds:")
    for name, m in med.items():
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"  {name:36s} {m:7.2f} s   ({runs})")
    print(f"ratio mlp / baseline: {med['verify examples.mlp'] / base:.2f}x (goal <= 3x)")
    print(f"ratio cnn / baseline: {med['verify examples.cnn (nnx)'] / base:.2f}x (goal <= 5x)")


if __name__ == "__main__":
    main()
