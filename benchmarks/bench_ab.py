"""Does ``treeguard bench ab`` see a known 10% difference on this machine?

    .venv/bin/python benchmarks/bench_ab.py             # 10 A/B and 10 A/A trials
    .venv/bin/python benchmarks/bench_ab.py --trials 20

Two versions of one function (``treeguard.examples.loops``): ``base`` runs a
loop of ``STEPS`` small ``tanh(x @ w)`` steps under ``lax.fori_loop``,
``more`` runs 10% more steps (the work differs by a known amount; the
compiler cannot remove a step).
Each trial is one ``treeguard.bench.ab`` run in this process (ABBA, 30
rounds, so 60 samples per side), judged on its default clock (``auto``:
process CPU time on JAX's CPU backend). A right verdict for base -> more is
``regression``. The A/A trials (base against itself) must not call a
regression or an improvement. Beside each verdict is the one the same
samples get on the wall clock, which also counts the time other processes
on this shared machine took.

The ratio printed for each trial is B's over A's per ABBA round (median,
with its 95% interval), measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from treeguard.bench import ab, compare, conditions
from treeguard.examples.loops import SIZE, STEPS
from treeguard.examples.loops import base as base_target
from treeguard.examples.loops import more as more_target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--min-time", type=float, default=0.02)
    args = parser.parse_args()

    a, b = base_target(), more_target()
    base, more, (x, w) = a.fn, b.fn, a.args
    c = conditions()
    load = c.get("load") or {}
    print(
        f"{c['cpu_model']}, {c['usable_cores']} usable cores, load "
        f"{load.get('1m')}/{load.get('5m')}/{load.get('15m')}; jax {c['jax']} on {c['backend']}"
    )
    print(
        f"base: {STEPS} steps of tanh(x @ w) on f32[{SIZE},{SIZE}]; "
        f"more: {STEPS + STEPS // 10} steps (+10% work)"
    )
    started = time.perf_counter()
    verdicts: dict[str, Counter[str]] = {"A/B": Counter(), "A/A": Counter()}
    wall: dict[str, Counter[str]] = {"A/B": Counter(), "A/A": Counter()}
    for kind, cand in (("A/B", more), ("A/A", base)):
        for i in range(args.trials):
            r = ab(base, cand, x, w, rounds=args.rounds, min_time=args.min_time)
            cmp = r.comparison
            lo, hi = cmp.ratio_ci
            verdicts[kind][cmp.verdict] += 1
            a, b = r.a.samples_s, r.b.samples_s
            on_wall = compare(
                [a[2 * k] + a[2 * k + 1] for k in range(r.rounds)],
                [b[2 * k] + b[2 * k + 1] for k in range(r.rounds)],
                paired=True,
            )
            wall[kind][on_wall.verdict] += 1
            print(
                f"{kind} trial {i + 1:2d}: {cmp.clock} ratio {cmp.ratio:.3f} [{lo:.3f}, {hi:.3f}] "
                f"p={cmp.p_value:.2g} -> {cmp.verdict}; wall ratio {on_wall.ratio:.3f} "
                f"[{on_wall.ratio_ci[0]:.3f}, {on_wall.ratio_ci[1]:.3f}] -> {on_wall.verdict}; "
                f"median A {r.a.stats.median * 1e3:.2f} ms wall, {r.a.loops} calls/sample"
            )
    right_ab = verdicts["A/B"]["regression"]
    false_aa = verdicts["A/A"]["regression"] + verdicts["A/A"]["improvement"]
    print(f"A/B (+10% work): {right_ab}/{args.trials} right (regression); {dict(verdicts['A/B'])}")
    print(f"A/A (same function): {false_aa}/{args.trials} false calls; {dict(verdicts['A/A'])}")
    print(f"on the wall clock instead: A/B {dict(wall['A/B'])}; A/A {dict(wall['A/A'])}")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
