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
(verify / baseline), with each run's time, the ratios' spread (fastest and
slowest run against the median baseline) and the load average: on a shared
machine other work lengthens every wall time. It also prints the CPU time
(user + system, all threads) of each process, which that load disturbs
less. The goals: mlp at most 3x, the CNN at most 5x, in wall time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _timed(args: list[str]) -> tuple[float, float]:
    """The wall and CPU seconds of one process."""
    cpu, start = _cpu(), time.perf_counter()
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return seconds, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed rounds after one warm-up")
    opts = parser.parse_args()
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:

        def verify(target: str) -> list[str]:
            name = target.rsplit(".", maxsplit=1)[-1].split(":", maxsplit=1)[0]
            return [
                *(py, "-m", "treeguard", "verify", target, "--record", "--no-bench"),
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
        cpus: dict[str, list[float]] = {k: [] for k in commands}
        loads = [os.getloadavg()[0]]
        for round_ in range(opts.runs + 1):
            for name, args in commands.items():
                wall, cpu = _timed(args)
                if round_:  # the first round warms the file cache
                    times[name].append(wall)
                    cpus[name].append(cpu)
            loads.append(os.getloadavg()[0])
    baseline = "import treeguard, flax.nnx, optax"
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    base, cpu_base = med[baseline], cpu_med[baseline]
    print(f"median of {opts.runs} interleaved runs (after one warm-up round), seconds:")
    for name, m in med.items():
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"  {name:36s} wall {m:6.2f}  cpu {cpu_med[name]:6.2f}   (wall: {runs})")
    print("1-minute load average, before and after each round:", *(f"{x:.2f}" for x in loads))
    for label, name, goal in (
        ("mlp", "verify examples.mlp", 3),
        ("cnn", "verify examples.cnn (nnx)", 5),
    ):
        print(
            f"ratio {label} / baseline: {med[name] / base:.2f}x (goal <= {goal}x; runs "
            f"{min(times[name]) / base:.2f}x-{max(times[name]) / base:.2f}x; "
            f"cpu {cpu_med[name] / cpu_base:.2f}x)"
        )


if __name__ == "__main__":
    main()
