"""``ab(fn_a, fn_b, *args) -> ABResult``: an interleaved A/B in one process.

Both functions are compiled and warmed up first, then share one loop count.
The samples alternate in ABBA order (A B B A, A B B A, ...), so a drift of
the machine (a clock that steps, a neighbour that starts) falls on both
sides alike instead of on whichever ran second. Each round is then a pair:
B's two samples over A's two give one ratio in which a drift slower than a
round cancels, and the verdict is the paired one (``compare_paired``).
This is the form to gate CI with: two runs in separate jobs differ by far
more than the code does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import BenchError
from .compare import Comparison, compare_paired
from .compiles import CompileCounter
from .conditions import conditions as current_conditions
from .run import (
    SYSTEM_TIMER,
    BenchResult,
    Timer,
    calibrate,
    check_options,
    prepare,
    result_from,
    timed,
)


@dataclasses.dataclass(frozen=True)
class ABResult:
    """The outcome of an interleaved A/B.

    Attributes:
      a: A's result (the base).
      b: B's result (the candidate).
      comparison: B against A.
      rounds: ABBA rounds run; each gives two samples to each side.
    """

    a: BenchResult
    b: BenchResult
    comparison: Comparison
    rounds: int

    @property
    def verdict(self) -> str:
        return self.comparison.verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "order": "ABBA",
            "rounds": self.rounds,
            "comparison": self.comparison.to_dict(),
            "a": self.a.to_dict(with_conditions=False),
            "b": self.b.to_dict(with_conditions=False),
        }


def resolve_clock(clock: str) -> str:
    """``"wall"`` or ``"cpu"`` for a clock option (``"auto"`` picks by backend).

    Raises:
      BenchError: for another value.

    Example:
      >>> import jax
      >>> resolve_clock("wall")
      'wall'
      >>> resolve_clock("auto") == ("cpu" if jax.default_backend() == "cpu" else "wall")
      True
    """
    if clock in ("wall", "cpu"):
        return clock
    if clock == "auto":
        import jax

        return "cpu" if jax.default_backend() == "cpu" else "wall"
    raise BenchError(f"clock={clock!r}", hint="'auto', 'wall' or 'cpu'")


def _abba(
    calls: dict[str, Callable[[], Any]],
    rounds: int,
    loops: int,
    timer: Timer,
    progress: Callable[[int, int], None] | None,
) -> dict[str, list[tuple[float, float]]]:
    """The samples of each side, taken in ABBA rounds."""
    times: dict[str, list[tuple[float, float]]] = {"a": [], "b": []}
    done, total = 0, 4 * rounds
    for _ in range(rounds):
        for side in ("a", "b", "b", "a"):
            times[side].append(timed(calls[side], loops, timer))
            done += 1
            if progress is not None:
                progress(done, total)
    return times


def ab(
    fn_a: Callable[..., Any],
    fn_b: Callable[..., Any],
    *args: Any,
    rounds: int = 30,
    min_time: float = 0.02,
    warmup: int = 2,
    jit: bool = True,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    names: tuple[str, str] | None = None,
    args_b: tuple[Any, ...] | None = None,
    progress: Callable[[int, int], None] | None = None,
    clock: str = "auto",
    timer: Timer = SYSTEM_TIMER,
) -> ABResult:
    """Times ``fn_a(*args)`` and ``fn_b(*args)`` interleaved, and compares them.

    Args:
      fn_a: the base.
      fn_b: the candidate.
      *args: the arguments of both.
      rounds: ABBA rounds; each side gets ``2 * rounds`` samples (30 is the default).
      min_time: the least seconds one sample of either side lasts.
      warmup: warm-up calls of each side.
      jit: compile both ahead of time (see ``treeguard.bench.run``).
      alpha: the significance level of the verdict.
      min_effect: the smallest relative change that counts.
      names: how the results name A and B.
      args_b: B's arguments, when they differ from A's.
      progress: called as ``progress(done, total)`` after each sample.
      clock: what the verdict compares: ``"wall"`` time, ``"cpu"`` time of
        this process (every thread), or ``"auto"``: CPU time on JAX's CPU
        backend, where the wall clock also counts the time other processes
        on a shared machine took, and wall time on accelerators, where the
        host's CPU time says nothing of the device's.
      timer: the clocks the samples read (the real ones by default).

    Returns:
      The ``ABResult``; ``verdict`` is ``regression`` when B is slower.

    Raises:
      BenchError: for bad options.

    Example:
      >>> import jax.numpy as jnp
      >>> x = jnp.ones(64)
      >>> r = ab(jnp.sin, jnp.sin, x, rounds=5, min_time=0.0)
      >>> len(r.a.samples_s), len(r.b.samples_s), r.verdict in ("no_change", "inconclusive")
      (10, 10, True)
    """
    check_options(max(rounds, 1), min_time, warmup)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BenchError(f"rounds={rounds!r}", hint="pass an int >= 1 (15 is the default)")
    resolve_clock(clock)
    conds = current_conditions()
    prep_a = prepare(fn_a, args, jit=jit, warmup=warmup)
    prep_b = prepare(fn_b, args if args_b is None else args_b, jit=jit, warmup=warmup)
    with prep_a.warmup_compiles, prep_b.warmup_compiles:
        loops = max(
            calibrate(prep_a.call, min_time, timer), calibrate(prep_b.call, min_time, timer)
        )
    calls = {"a": prep_a.call, "b": prep_b.call}
    with CompileCounter() as window:
        times = _abba(calls, rounds, loops, timer, progress)
    name_a, name_b = names or (prep_a.name, prep_b.name)
    if name_a == name_b:
        name_a, name_b = f"A {name_a}", f"B {name_b}"
    meta = {"ab": "ABBA", "rounds": rounds}
    ra = result_from(
        prep_a, times["a"], window, loops=loops, warmup=warmup, name=name_a, conds=conds, meta=meta
    )
    rb = result_from(
        prep_b, times["b"], window, loops=loops, warmup=warmup, name=name_b, conds=conds, meta=meta
    )
    # Each ABBA round is a pair: A's two samples beside B's two.
    used = resolve_clock(clock)
    a_s, b_s = ra.samples(used), rb.samples(used)
    comparison = compare_paired(
        [a_s[2 * i] + a_s[2 * i + 1] for i in range(rounds)],
        [b_s[2 * i] + b_s[2 * i + 1] for i in range(rounds)],
        alpha=alpha,
        min_effect=min_effect,
        name=name_b,
        base_samples=a_s,
        cand_samples=b_s,
    )
    comparison = dataclasses.replace(comparison, clock=used)
    if window.total:
        comparison = dataclasses.replace(comparison, verdict="invalid", reason=ra.reason)
    return ABResult(ra, rb, comparison, rounds)
