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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BenchError, MachineMismatchError
from .conditions import fingerprint_diff
from .run import BenchResult
from .stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, as_samples, bootstrap_medians

#: The fewest samples per side the verdict accepts (google/benchmark's
#: "lowest reasonable number" of repetitions for the U test).
MIN_SAMPLES = 9

#: Verdicts, in the order of their severity for a gate.
VERDICTS = ("regression", "invalid", "inconclusive", "improvement", "no_change")

#: The largest sample size an ``inconclusive`` verdict suggests.
MAX_SUGGESTED = 100_000


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def mann_whitney_u(
    x: Sequence[float] | np.ndarray[Any, Any], y: Sequence[float] | np.ndarray[Any, Any], /
) -> tuple[float, float]:
    """The two-sided Mann-Whitney U test of ``x`` against ``y``.

    Uses the normal approximation with the tie correction of the variance and
    a continuity correction of 0.5 (as ``scipy.stats.mannwhitneyu`` with
    ``method="asymptotic"``).

    Args:
      x: the first sample.
      y: the second sample.

    Returns:
      ``(U of x, two-sided p-value)``; ``p`` is 1.0 when every value ties.

    Raises:
      BenchError: if either sample is empty or not finite.

    Example:
      >>> u, p = mann_whitney_u([1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 18, 19])
      >>> u, p < 0.001
      (0.0, True)
    """
    a = _finite(x, "x")
    b = _finite(y, "y")
    n1, n2 = a.size, b.size
    both = np.concatenate([a, b])
    ranks = _ranks(both)
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2.0)
    n = n1 + n2
    _, counts = np.unique(both, return_counts=True)
    ties = float(np.sum(counts.astype(np.float64) ** 3 - counts))
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return u1, 1.0
    mu = n1 * n2 / 2.0
    u = max(u1, n1 * n2 - u1)
    z = (u - mu - 0.5) / math.sqrt(var)
    return u1, min(1.0, 2.0 * _normal_sf(z))


def _finite(x: Any, what: str) -> Any:
    a = np.asarray(x, dtype=np.float64).reshape(-1)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise BenchError(f"{what}: expected a non-empty sample of finite values")
    return a


def _ranks(a: Any) -> Any:
    """Ranks from 1, ties given their average rank."""
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    ranks = np.empty(a.size, dtype=np.float64)
    # Positions where a new value starts; each run of ties gets its mean rank.
    starts = np.flatnonzero(np.r_[True, sorted_a[1:] != sorted_a[:-1]])
    ends = np.r_[starts[1:], a.size]
    mean_rank = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def hodges_lehmann(
    base: Sequence[float] | np.ndarray[Any, Any], cand: Sequence[float] | np.ndarray[Any, Any], /
) -> float:
    """The Hodges-Lehmann shift: the median of ``cand[j] - base[i]`` over all pairs.

    Example:
      >>> hodges_lehmann([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
      1.0
    """
    a = _finite(base, "base")
    b = _finite(cand, "cand")
    return float(np.median(b[None, :] - a[:, None]))


def median_ratio_ci(
    base: Sequence[float] | np.ndarray[Any, Any],
    cand: Sequence[float] | np.ndarray[Any, Any],
    /,
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float, float]:
    """``median(cand) / median(base)`` and its percentile bootstrap interval.

    Each side is resampled on its own.

    Returns:
      ``(ratio, low, high)``.

    Raises:
      BenchError: for empty or non-finite samples, or a base median of 0.

    Example:
      >>> r, lo, hi = median_ratio_ci([1.0] * 9, [2.0] * 9)
      >>> r, lo, hi
      (2.0, 2.0, 2.0)
    """
    a = as_samples(base, "base")
    b = as_samples(cand, "cand")
    if np.median(a) <= 0:
        raise BenchError("base: the median is 0; hint: time at least one call per sample")
    rng = np.random.default_rng(seed)
    ma = bootstrap_medians(a, resamples, rng)
    mb = bootstrap_medians(b, resamples, rng)
    ratios = mb / np.maximum(ma, np.finfo(np.float64).tiny)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


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
      u: the U statistic of the candidate.
      p_value: the two-sided p-value.
      alpha: the significance level.
      min_effect: the smallest relative change that counts.
      needed_samples: for ``inconclusive``, the samples per side that would
        likely settle it (None when it cannot be estimated).
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
    u: float
    p_value: float
    alpha: float
    min_effect: float
    needed_samples: int | None = None

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
      >>> import numpy as np
      >>> rng = np.random.default_rng(0)
      >>> base = rng.lognormal(0.0, 0.01, 30)
      >>> compare_samples(base, base * 1.10).verdict
      'regression'
      >>> compare_samples(base, rng.permutation(base)).verdict
      'no_change'
    """
    if not (isinstance(alpha, (int, float)) and 0 < alpha < 1):
        raise BenchError(f"alpha={alpha!r}; hint: a level between 0 and 1, such as 0.05")
    if not (isinstance(min_effect, (int, float)) and 0 <= min_effect < 1):
        raise BenchError(f"min_effect={min_effect!r}; hint: a fraction such as 0.02 for 2%")
    a = as_samples(base, "base")
    b = as_samples(cand, "cand")
    u, p = mann_whitney_u(b, a)
    ratio, lo, hi = median_ratio_ci(a, b, level=1.0 - alpha)
    base_c = Comparison(
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
        u=u,
        p_value=p,
        alpha=float(alpha),
        min_effect=float(min_effect),
    )
    n = min(a.size, b.size)
    half = (hi - lo) / 2.0
    distance = abs(abs(ratio - 1.0) - min_effect)
    up, down = 1.0 + min_effect, 1.0 - min_effect
    if n < MIN_SAMPLES or _smallest_p(a.size, b.size) >= alpha:
        return dataclasses.replace(
            base_c,
            reason=(
                f"too few samples to call ({a.size} and {b.size}; at least {MIN_SAMPLES} per side)"
            ),
            needed_samples=max(MIN_SAMPLES, _needed(n, half, distance) or 0),
        )
    if p < alpha and lo > up:
        return dataclasses.replace(
            base_c, verdict="regression", reason=f"slower by more than {min_effect:.1%}"
        )
    if p < alpha and hi < down:
        return dataclasses.replace(
            base_c, verdict="improvement", reason=f"faster by more than {min_effect:.1%}"
        )
    if down <= lo and hi <= up:
        return dataclasses.replace(
            base_c, verdict="no_change", reason=f"the interval lies within ±{min_effect:.1%}"
        )
    return dataclasses.replace(
        base_c,
        reason=(
            f"the interval is neither within nor beyond ±{min_effect:.1%}"
            + ("" if p < alpha else f" and p={p:.3g} >= {alpha:g}")
        ),
        needed_samples=_needed(n, half, distance),
    )


def compare(
    base: BenchResult,
    cand: BenchResult,
    /,
    *,
    alpha: float = 0.05,
    min_effect: float = 0.02,
    allow_different_machines: bool = False,
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

    Returns:
      The ``Comparison``; its verdict is ``invalid`` when either result is.

    Raises:
      MachineMismatchError: if the fingerprints differ and
        ``allow_different_machines`` is False.
      BenchError: for ``alpha`` or ``min_effect`` out of range.

    Example:
      >>> import jax.numpy as jnp
      >>> from treeguard.bench import run
      >>> a = run(jnp.sin, jnp.ones(8), samples=10, min_time=0.0)
      >>> compare(a, a).verdict
      'no_change'
    """
    diffs = fingerprint_diff(base.conditions, cand.conditions)
    if diffs and not allow_different_machines:
        raise MachineMismatchError(diffs)
    result = compare_samples(
        base.samples_s, cand.samples_s, alpha=alpha, min_effect=min_effect, name=cand.name
    )
    bad = [f"{w} {r.name!r}: {r.reason}" for w, r in (("base", base), ("candidate", cand))]
    bad = [b for b, r in zip(bad, (base, cand)) if not r.valid]
    if bad:
        return dataclasses.replace(result, verdict="invalid", reason="; ".join(bad))
    return result
