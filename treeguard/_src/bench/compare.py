"""``compare(base, cand) -> Comparison``: an honest verdict on two distributions.

The evidence:

- a two-sided Mann-Whitney U test (normal approximation with the tie
  correction and a continuity correction), which needs no equal sample
  sizes and no normal noise;
- the Hodges-Lehmann shift, the median of all pairwise differences;
- the ratio of the medians with a bootstrap confidence interval.

The verdict, with ``m = min_effect``:

- ``regression`` (``improvement``) when the test is significant at
  ``alpha`` and the whole interval of the ratio lies above ``1 + m``
  (below ``1 - m``): the effect is real and larger than ``m``;
- ``no_change`` when the whole interval lies within ``1 ± m``;
- ``inconclusive`` otherwise, with an estimate of the samples per side that
  would settle it;
- ``invalid`` when either result had a compile in its timed window.

A power guard calls ``inconclusive`` whenever a side has fewer than
``MIN_SAMPLES`` samples, or when no outcome of the test could reach
``alpha`` with these sample sizes.

``compare`` takes two results, two lists of runs or two arrays of samples
(``compare_results``, ``compare_runs``, ``compare_samples``).
``compare(..., paired=True)`` (``compare_paired``) applies the same rules to
paired times (the rounds of an interleaved A/B), with the Wilcoxon
signed-rank test of the log ratios.

``compare_runs`` gives the verdict across runs (each a fresh process, as
pyperf runs them): the samples of one process share its memory layout, its
compiled code and its neighbours, so two processes of identical code differ
by more than their samples say. Each run's median is one observation, and
the rules above apply to those medians, so the run-to-run variance is in
the verdict; with fewer than ``MIN_SAMPLES`` runs per side it is
``inconclusive``, whatever the samples within a run say.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BenchError, MachineMismatchError
from .conditions import fingerprint_diff
from .ranks import (
    hodges_lehmann,
    mann_whitney_u,
    median_ratio_ci,
    wilcoxon_signed_rank,
)
from .run import BenchResult
from .stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, as_samples, bootstrap_medians

__all__ = [
    "MAX_SUGGESTED",
    "MIN_SAMPLES",
    "VERDICTS",
    "Comparison",
    "compare",
    "compare_paired",
    "compare_results",
    "compare_runs",
    "compare_samples",
    "decide",
    "hodges_lehmann",
    "mann_whitney_u",
    "median_ratio_ci",
    "wilcoxon_signed_rank",
]

#: The fewest samples per side the verdict accepts (google/benchmark's
#: "lowest reasonable number" of repetitions for the U test).
MIN_SAMPLES = 9

#: Verdicts, in the order of their severity for a gate.
VERDICTS = ("regression", "invalid", "inconclusive", "improvement", "no_change")

#: The largest sample size an ``inconclusive`` verdict suggests.
MAX_SUGGESTED = 100_000


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The verdict on a candidate against a base.

    Attributes:
      name: what was compared.
      verdict: ``regression``, ``improvement``, ``no_change``,
        ``inconclusive`` or ``invalid``.
      reason: one line on why.
      n_base: samples of the base.
      n_cand: samples of the candidate.
      base_median: the base's median, in seconds.
      cand_median: the candidate's median.
      ratio: ``cand_median / base_median``; above 1 is slower.
      ratio_ci: the bootstrap interval of ``ratio`` at ``1 - alpha``.
      shift_s: the Hodges-Lehmann shift, in seconds (positive is slower).
      statistic: the test's statistic (U of the candidate, or the smaller
        signed-rank sum of a paired test).
      p_value: the two-sided p-value.
      alpha: the significance level.
      min_effect: the smallest relative change that counts.
      needed_samples: for ``inconclusive``, the samples per side (rounds,
        for a paired test) that would likely settle it (None when it cannot
        be estimated).
      test: ``mann-whitney`` for two independent samples, ``wilcoxon-paired``
        for the rounds of an interleaved A/B.
      clock: the clock compared: ``wall`` or ``cpu`` (process CPU time).
    """

    name: str
    verdict: str
    reason: str
    n_base: int
    n_cand: int
    base_median: float
    cand_median: float
    ratio: float
    ratio_ci: tuple[float, float]
    shift_s: float
    statistic: float
    p_value: float
    alpha: float
    min_effect: float
    needed_samples: int | None = None
    test: str = "mann-whitney"
    clock: str = "wall"

    @property
    def change(self) -> float:
        """The relative change of the median (``ratio - 1``)."""
        return self.ratio - 1.0

    def describe(self) -> str:
        """One line: verdict, change, its interval and the p-value.

        Example:
          >>> c = compare_samples([1.0] * 9 + [1.1], [1.0] * 9 + [1.1])
          >>> c.describe()
          'no_change: +0.0% [+0.0%, +0.0%] (p=1, n=10/10)...'
        """
        lo, hi = self.ratio_ci
        return (
            f"{self.verdict}: {self.change:+.1%} [{lo - 1:+.1%}, {hi - 1:+.1%}] "
            f"(p={self.p_value:.3g}, n={self.n_base}/{self.n_cand}); {self.reason}"
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["ratio_ci"] = list(self.ratio_ci)
        out["change"] = self.change
        return out


def _needed(n: int, half_width: float, target: float) -> int | None:
    if target <= 0 or half_width <= 0 or not math.isfinite(half_width):
        return None
    wanted = math.ceil(n * (half_width / target) ** 2)
    return min(max(wanted, n + 1, MIN_SAMPLES), MAX_SUGGESTED)


def _smallest_p(n1: int, n2: int) -> float:
    """The smallest two-sided p the U test can give for these sizes (all of
    one side below all of the other, no ties)."""
    return min(1.0, 2.0 / math.comb(n1 + n2, n1))


def compare_samples(
    base: Sequence[float] | np.ndarray[Any, Any],
    cand: Sequence[float] | np.ndarray[Any, Any],
    /,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    name: str = "",
) -> Comparison:
    """The verdict on two samples of durations (see the module's rules).

    Args:
      base: the base's samples, in seconds.
      cand: the candidate's samples.
      alpha: the significance level of the test, and ``1 - level`` of the
        interval.
      min_effect: the smallest relative change of the median that counts.
      name: how the comparison names them.

    Returns:
      The ``Comparison``.

    Raises:
      BenchError: for empty or non-finite samples, or ``alpha`` or
        ``min_effect`` out of range.

    Example:
      >>> compare_samples([1.0] * 9, [1.2] * 9).verdict
      'regression'
    """
    _check_levels(alpha, min_effect)
    a = as_samples(base, "base")
    b = as_samples(cand, "cand")
    u, p = mann_whitney_u(b, a)
    ratio, lo, hi = median_ratio_ci(a, b, level=1.0 - alpha)
    evidence = Comparison(
        name=name,
        verdict="inconclusive",
        reason="",
        n_base=int(a.size),
        n_cand=int(b.size),
        base_median=float(np.median(a)),
        cand_median=float(np.median(b)),
        ratio=ratio,
        ratio_ci=(lo, hi),
        shift_s=hodges_lehmann(a, b),
        statistic=u,
        p_value=p,
        alpha=float(alpha),
        min_effect=float(min_effect),
    )
    if min(a.size, b.size) < MIN_SAMPLES or _smallest_p(a.size, b.size) >= alpha:
        return _too_few(evidence, f"{a.size} and {b.size}", "per side")
    return decide(evidence)


def _check_levels(alpha: float, min_effect: float) -> None:
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise BenchError(f"alpha={alpha!r}", hint="a level between 0 and 1, such as 0.05")
    if not (isinstance(min_effect, (int, float)) and 0 <= min_effect < 1):
        raise BenchError(f"min_effect={min_effect!r}", hint="a fraction such as 0.02 for 2%")


def _too_few(evidence: Comparison, sizes: str, unit: str) -> Comparison:
    """``inconclusive`` for too few samples, with the number that would do."""
    lo, hi = evidence.ratio_ci
    distance = abs(abs(evidence.ratio - 1.0) - evidence.min_effect)
    n = min(evidence.n_base, evidence.n_cand)
    return dataclasses.replace(
        evidence,
        verdict="inconclusive",
        reason=f"too few samples to call ({sizes}; at least {MIN_SAMPLES} {unit})",
        needed_samples=max(MIN_SAMPLES, _needed(n, (hi - lo) / 2.0, distance) or 0),
    )


def decide(evidence: Comparison) -> Comparison:
    """Applies the verdict rules (see the module) to a comparison's p-value
    and interval, once the power guard has passed."""
    lo, hi = evidence.ratio_ci
    p, alpha, m = evidence.p_value, evidence.alpha, evidence.min_effect
    if p < alpha and lo > 1.0 + m:
        return dataclasses.replace(
            evidence, verdict="regression", reason=f"slower by more than {m:.1%}"
        )
    if p < alpha and hi < 1.0 - m:
        return dataclasses.replace(
            evidence, verdict="improvement", reason=f"faster by more than {m:.1%}"
        )
    if 1.0 - m <= lo and hi <= 1.0 + m:
        return dataclasses.replace(
            evidence, verdict="no_change", reason=f"the interval lies within ±{m:.1%}"
        )
    n = min(evidence.n_base, evidence.n_cand)
    distance = abs(abs(evidence.ratio - 1.0) - m)
    return dataclasses.replace(
        evidence,
        verdict="inconclusive",
        reason=(
            f"the interval is neither within nor beyond ±{m:.1%}"
            + ("" if p < alpha else f" and p={p:.3g} >= {alpha:g}")
        ),
        needed_samples=_needed(n, (hi - lo) / 2.0, distance),
    )


def compare_paired(
    base: Sequence[float] | np.ndarray[Any, Any],
    cand: Sequence[float] | np.ndarray[Any, Any],
    /,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    name: str = "",
    base_samples: Sequence[float] | None = None,
    cand_samples: Sequence[float] | None = None,
) -> Comparison:
    """The verdict on paired times: ``cand[i]`` ran right beside ``base[i]``.

    Each pair gives a ratio ``cand[i] / base[i]``; a drift of the machine
    that spans a pair cancels in it. The test is the Wilcoxon signed-rank
    test of the log ratios, the ratio is their median with a bootstrap
    interval over the pairs, and the rules are those of the module.

    Args:
      base: the base's time in each pair (an ABBA round: its two samples).
      cand: the candidate's time in the same pairs.
      alpha: the significance level.
      min_effect: the smallest relative change that counts.
      name: how the comparison names them.
      base_samples: the base's raw samples, for the medians reported.
      cand_samples: the candidate's raw samples.

    Returns:
      The ``Comparison`` (``test`` is ``wilcoxon-paired``; ``n_base`` and
      ``n_cand`` count pairs).

    Raises:
      BenchError: for unequal lengths, empty, non-finite or zero times.

    Example:
      >>> import numpy as np
      >>> drift = np.linspace(1.0, 3.0, 15)  # the machine slows down threefold
      >>> compare_paired(drift, drift * 1.05).verdict
      'regression'
    """
    _check_levels(alpha, min_effect)
    a = as_samples(base, "base")
    b = as_samples(cand, "cand")
    if a.size != b.size:
        raise BenchError(f"paired times: {a.size} base and {b.size} candidate", hint="one each")
    if np.any(a <= 0):
        raise BenchError("base: a pair with a time of 0", hint="time at least one call")
    ratios = b / a
    w, p = wilcoxon_signed_rank(np.log(ratios))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    boot = bootstrap_medians(ratios, BOOTSTRAP_RESAMPLES, rng)
    tail = alpha / 2.0 * 100.0
    lo, hi = (float(v) for v in np.percentile(boot, [tail, 100.0 - tail]))
    raw_a = a if base_samples is None else as_samples(base_samples, "base")
    raw_b = b if cand_samples is None else as_samples(cand_samples, "cand")
    evidence = Comparison(
        name=name,
        verdict="inconclusive",
        reason="",
        n_base=int(a.size),
        n_cand=int(b.size),
        base_median=float(np.median(raw_a)),
        cand_median=float(np.median(raw_b)),
        ratio=float(np.median(ratios)),
        ratio_ci=(lo, hi),
        shift_s=float(np.median(b - a)),
        statistic=w,
        p_value=p,
        alpha=float(alpha),
        min_effect=float(min_effect),
        test="wilcoxon-paired",
    )
    if a.size < MIN_SAMPLES or min(1.0, 2.0 / 2.0**a.size) >= alpha:
        return _too_few(evidence, f"{a.size} pairs", "pairs")
    return decide(evidence)


def compare_results(
    base: BenchResult,
    cand: BenchResult,
    /,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    allow_different_machines: bool = False,
    clock: str = "wall",
) -> Comparison:
    """The verdict on ``cand`` against ``base`` (see the module's rules).

    Args:
      base: the base result.
      cand: the candidate result.
      alpha: the significance level.
      min_effect: the smallest relative change of the median that counts.
      allow_different_machines: compare results whose machine fingerprints
        differ (CPU, cores, backend, devices, JAX versions, x64, matmul
        precision, ``XLA_FLAGS``); refused by default.
      clock: ``"wall"`` (the default) or ``"cpu"``: the process CPU time,
        which on the CPU backend leaves out the time other processes took.

    Returns:
      The ``Comparison``; its verdict is ``invalid`` when either result is.

    Raises:
      MachineMismatchError: if the fingerprints differ and
        ``allow_different_machines`` is False.
      BenchError: for ``alpha`` or ``min_effect`` out of range, or a clock
        the results lack.

    Example:
      >>> import jax.numpy as jnp
      >>> from treeguard.bench import run
      >>> a = run(jnp.cos, jnp.ones(8), samples=10, min_time=0.0)
      >>> compare_results(a, a).verdict in ("no_change", "inconclusive")
      True
    """
    diffs = fingerprint_diff(base.conditions, cand.conditions)
    if diffs and not allow_different_machines:
        raise MachineMismatchError(diffs)
    result = compare_samples(
        base.samples(clock), cand.samples(clock), alpha=alpha, min_effect=min_effect, name=cand.name
    )
    result = dataclasses.replace(result, clock=clock)
    bad = [f"{w} {r.name!r}: {r.reason}" for w, r in (("base", base), ("candidate", cand))]
    bad = [b for b, r in zip(bad, (base, cand)) if not r.valid]
    if bad:
        return dataclasses.replace(result, verdict="invalid", reason="; ".join(bad))
    return result


def compare_runs(
    base: Sequence[BenchResult],
    cand: Sequence[BenchResult],
    /,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    allow_different_machines: bool = False,
    clock: str = "wall",
) -> Comparison:
    """The verdict across runs: ``cand``'s runs of one benchmark against ``base``'s.

    Each run (one process: ``treeguard bench run``, once per file or per
    process of ``--processes``) gives the median of its samples; the two
    sides' medians are compared with the module's rules (the U test, the
    bootstrap interval of the ratio of their medians, the power guard of
    ``MIN_SAMPLES`` runs per side). The spread between runs of one side is
    the run-to-run variance, so a busy machine or another memory layout in
    another process does not make a verdict by itself: two runs of identical
    code are at worst ``inconclusive``.

    Args:
      base: the base's runs of the benchmark.
      cand: the candidate's runs.
      alpha: the significance level.
      min_effect: the smallest relative change of the median that counts.
      allow_different_machines: compare runs whose machine fingerprints differ.
      clock: ``"wall"`` or ``"cpu"``.

    Returns:
      The ``Comparison`` (``test`` is ``mann-whitney-runs``; ``n_base`` and
      ``n_cand`` count runs, the medians are those of the runs' medians);
      ``invalid`` when any run is.

    Raises:
      MachineMismatchError: if a run's fingerprint differs from the first
        base run's and ``allow_different_machines`` is False.
      BenchError: for no run on a side, ``alpha`` or ``min_effect`` out of
        range, or a clock the runs lack.

    Example:
      >>> import numpy as np
      >>> from treeguard.bench import BenchResult
      >>> rng = np.random.default_rng(0)
      >>> def runs(scale, n):  # each run of 20 samples is offset by up to 5%
      ...     return [BenchResult("f", "ok", "", tuple(scale * rng.lognormal(0, 0.05)
      ...             * rng.lognormal(0, 0.01, 20)), 1, 0, {}, {}, None, None, {})
      ...             for _ in range(n)]
      >>> compare_runs(runs(1.0, 1), runs(1.0, 1)).verdict
      'inconclusive'
      >>> compare_runs(runs(1.0, 12), runs(1.3, 12)).verdict
      'regression'
    """
    _check_levels(alpha, min_effect)
    if not base or not cand:
        raise BenchError(
            f"{len(base)} base and {len(cand)} candidate runs", hint="give each side a run"
        )
    first = base[0].conditions
    for r in (*base, *cand):
        diffs = fingerprint_diff(first, r.conditions)
        if diffs and not allow_different_machines:
            raise MachineMismatchError(diffs)
    a = [float(np.median(r.samples(clock))) for r in base]
    b = [float(np.median(r.samples(clock))) for r in cand]
    name = cand[0].name
    result = compare_samples(a, b, alpha=alpha, min_effect=min_effect, name=name)
    if result.verdict == "inconclusive" and result.reason.startswith("too few samples"):
        result = _too_few(result, f"{len(a)} and {len(b)}", "runs per side")
    result = dataclasses.replace(result, test="mann-whitney-runs", clock=clock)
    bad = [
        f"{side} {r.name!r}: {r.reason}"
        for side, runs in (("base", base), ("candidate", cand))
        for r in runs
        if not r.valid
    ]
    if bad:
        return dataclasses.replace(result, verdict="invalid", reason="; ".join(bad))
    return result


def compare(
    base: BenchResult | Sequence[BenchResult] | Sequence[float] | np.ndarray[Any, Any],
    cand: BenchResult | Sequence[BenchResult] | Sequence[float] | np.ndarray[Any, Any],
    /,
    *,
    paired: bool = False,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    allow_different_machines: bool = False,
    clock: str = "wall",
) -> Comparison:
    """The verdict on ``cand`` against ``base``: two results, two lists of runs,
    or two arrays of durations (see the module's rules).

    - Two ``BenchResult``: their samples, with the U test; ``invalid`` when
      either result is.
    - Two lists of ``BenchResult`` (runs of one benchmark, each a process):
      each run's median is one observation, so the run-to-run variance is in
      the verdict (``test`` is ``mann-whitney-runs``, ``n_base`` and
      ``n_cand`` count runs); fewer than 9 runs a side is ``inconclusive``.
    - Two arrays of durations in seconds: the U test; with ``paired=True``,
      ``cand[i]`` ran right beside ``base[i]`` (the rounds of an interleaved
      A/B): the Wilcoxon signed-rank test of the log ratios, so a drift of the
      machine that spans a pair cancels (``test`` is ``wilcoxon-paired``).

    Args:
      base: the base: a result, a list of runs, or durations.
      cand: the candidate, of the same kind.
      paired: for durations, whether they are paired.
      alpha: the significance level of the test, and ``1 - level`` of the
        interval.
      min_effect: the smallest relative change of the median that counts.
      allow_different_machines: compare results whose machine fingerprints
        differ (CPU, cores, backend, devices, JAX versions, x64, matmul
        precision, ``XLA_FLAGS``); refused by default.
      clock: for results, ``"wall"`` (the default) or ``"cpu"``: the process
        CPU time, which on the CPU backend leaves out the time other
        processes took.

    Returns:
      The ``Comparison``.

    Raises:
      MachineMismatchError: if results' fingerprints differ and
        ``allow_different_machines`` is False.
      BenchError: for sides of different kinds, ``paired`` with results,
        empty, non-finite or (paired) unequal or zero durations, no run on a
        side, ``alpha`` or ``min_effect`` out of range, or a clock the
        results lack.

    Example:
      >>> import numpy as np
      >>> rng = np.random.default_rng(0)
      >>> base = rng.lognormal(0.0, 0.01, 30)
      >>> compare(base, base * 1.10).verdict
      'regression'
      >>> compare(base, rng.permutation(base)).verdict
      'no_change'
      >>> drift = np.linspace(1.0, 3.0, 15)  # the machine slows down threefold
      >>> compare(drift, drift * 1.05, paired=True).verdict
      'regression'
      >>> import jax.numpy as jnp
      >>> from treeguard.bench import run
      >>> a = run(jnp.sin, jnp.ones(8), samples=10, min_time=0.0)
      >>> c = compare(a, a)
      >>> c.ratio, c.p_value, c.verdict in ("no_change", "inconclusive")
      (1.0, 1.0, True)
    """
    kinds = {_kind(base), _kind(cand)} - {"empty"} or {"samples"}
    if len(kinds) != 1 or (paired and kinds != {"samples"}):
        given = " and ".join(sorted(kinds)) + (" (paired)" if paired else "")
        raise BenchError(
            f"compare: base and candidate are {given}",
            hint="give two results, two lists of runs, or two arrays of durations"
            " (paired=True only for durations)",
        )
    machines = {"allow_different_machines": allow_different_machines, "clock": clock}
    levels = {"alpha": alpha, "min_effect": min_effect}
    if kinds == {"result"}:
        return compare_results(base, cand, **levels, **machines)  # type: ignore[arg-type]
    if kinds == {"runs"}:
        return compare_runs(base, cand, **levels, **machines)  # type: ignore[arg-type]
    if paired:
        return compare_paired(base, cand, **levels)  # type: ignore[arg-type]
    return compare_samples(base, cand, **levels)  # type: ignore[arg-type]


def _kind(side: Any) -> str:
    """``result``, ``runs`` (a sequence of results), ``samples``, or ``empty``
    (an empty sequence: of the other side's kind, which refuses it)."""
    if isinstance(side, BenchResult):
        return "result"
    if isinstance(side, Sequence) and not side:
        return "empty"
    if isinstance(side, Sequence) and side and all(isinstance(r, BenchResult) for r in side):
        return "runs"
    return "samples"
