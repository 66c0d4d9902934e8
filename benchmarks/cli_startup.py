"""How fast the command line starts, as a ratio to ``python -c "import jax"``.

Commands that only read files (``spec``, ``diff``, ``ckpt inspect``, ``store
ls`` and every ``--help``) never import JAX, so a whole ``treeguard spec FILE``
process costs a fraction of importing JAX alone. The goal: ``treeguard spec``
on a float32 checkpoint and on a spec JSON, and ``treeguard --help``, each
take at most 0.3x ``import jax``. ``python -c "import numpy"`` is shown
beside them: the trees' dtypes are numpy's, so ``spec`` pays for it. Every
command runs in a fresh process, all of them interleaved round by round after
one warm-up round (which writes the bytecode caches, as an install does;
``PYTHONDONTWRITEBYTECODE`` is dropped), and each figure is the median over
the rounds; the baseline is measured in the same rounds.

A checkpoint of a ml_dtypes type (bf16, float8) costs one import of
``ml_dtypes`` more, which ``import jax`` pays too; the ``bf16`` row shows it.

With ``--against TREE`` (another checkout's root, such as main's) each
``treeguard`` command runs a second time in every round with that tree
first on ``PYTHONPATH``, so a change is measured against the tree before it
in the same rounds, at the same load; the rows of the other tree are marked
``[against]``.

    .venv/bin/python benchmarks/cli_startup.py [--rounds 15] [--against ../main]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np

import treeguard as tg

TARGET = 0.3


def _tree(dtype: object) -> dict[str, dict[str, np.ndarray]]:
    """A transformer-shaped tree of 96 leaves."""
    return {
        f"layer_{i}": {
            name: np.zeros(shape, dtype)
            for name, shape in (("kernel", (64, 64)), ("bias", (64,)), ("up", (64, 256)))
        }
        for i in range(32)
    }


def _treeguard() -> list[str]:
    """The installed console script, or ``python -m treeguard``."""
    script = Path(sys.executable).with_name("treeguard")
    return [str(script)] if script.exists() else [sys.executable, "-m", "treeguard"]


def _seconds(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False
    )
    elapsed = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr.decode(errors='replace')}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--against", type=Path, help="another tree, run in the same rounds")
    args = parser.parse_args()

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # as an installed package runs: from cached bytecode, which the warm-up round writes
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    tg_cmd = _treeguard()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, bf16 = Path(tmp, "model.safetensors"), Path(tmp, "bf16.safetensors")
        spec_json = Path(tmp, "model.spec.json")
        tg.save(ckpt, _tree(np.float32))
        tg.save(bf16, _tree(ml_dtypes.bfloat16))
        tg.spec_of(_tree(np.float32)).save(spec_json)
        root = Path(tmp, "store")
        tg.ArtifactStore(root).put(_tree(np.float32))

        commands = {
            'python -c "import jax" (baseline)': [sys.executable, "-c", "import jax"],
            "treeguard spec CKPT (f32)": [*tg_cmd, "spec", str(ckpt)],
            "treeguard spec SPEC.json": [*tg_cmd, "spec", str(spec_json)],
            "treeguard spec CKPT (bf16)": [*tg_cmd, "spec", str(bf16)],
            "treeguard diff SPEC.json CKPT": [*tg_cmd, "diff", str(spec_json), str(ckpt)],
            "treeguard ckpt inspect CKPT": [*tg_cmd, "ckpt", "inspect", str(ckpt)],
            "treeguard store ls ROOT": [*tg_cmd, "store", "ls", str(root)],
            "treeguard --help": [*tg_cmd, "--help"],
            'python -c "import numpy"': [sys.executable, "-c", "import numpy"],
            'python -c "pass"': [sys.executable, "-c", "pass"],
        }
        envs = {name: env for name in commands}
        if args.against is not None:
            paths = (str(args.against), env.get("PYTHONPATH", ""))
            other = dict(env, PYTHONPATH=os.pathsep.join(p for p in paths if p))
            for name, argv in list(commands.items()):
                if name.startswith("treeguard"):
                    commands[f"{name} [against]"], envs[f"{name} [against]"] = argv, other
        times: dict[str, list[float]] = {name: [] for name in commands}
        for name, argv in commands.items():  # warm-up: page cache and .pyc files
            _seconds(argv, envs[name])
        for _ in range(args.rounds):
            for name, argv in commands.items():
                times[name].append(_seconds(argv, envs[name]))

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    base = medians['python -c "import jax" (baseline)']
    print(f"median of {args.rounds} interleaved rounds after one warm-up, one process each")
    print(f"{'command':<50} {'median':>10} {'x import jax':>13}")
    for name, seconds in medians.items():
        print(f"{name:<50} {seconds * 1e3:>8.1f}ms {seconds / base:>12.2f}x")
    for name in ("treeguard spec CKPT (f32)", "treeguard spec SPEC.json", "treeguard --help"):
        ratio = medians[name] / base
        verdict = "met" if ratio <= TARGET else "MISSED"
        print(f"target {name} <= {TARGET}x import jax: {verdict} ({ratio:.2f}x)")


if __name__ == "__main__":
    main()
