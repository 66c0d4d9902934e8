"""Rank statistics of two samples, with no dependency beyond numpy: the
Mann-Whitney U test, the Wilcoxon signed-rank test, the Hodges-Lehmann shift
and a bootstrap interval of the ratio of medians.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BenchError
from .stats import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, as_samples, bootstrap_medians


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
        raise BenchError("base: the median is 0", hint="time at least one call per sample")
    rng = np.random.default_rng(seed)
    ma = bootstrap_medians(a, resamples, rng)
    mb = bootstrap_medians(b, resamples, rng)
    ratios = mb / np.maximum(ma, np.finfo(np.float64).tiny)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(np.median(b) / np.median(a)), float(lo), float(hi)


def wilcoxon_signed_rank(d: Sequence[float] | np.ndarray[Any, Any], /) -> tuple[float, float]:
    """The two-sided Wilcoxon signed-rank test of the differences ``d`` against 0.

    Zeros are dropped (Wilcoxon's rule); ties get average ranks and the tie
    correction of the variance; the p-value is the normal approximation
    without continuity correction (as ``scipy.stats.wilcoxon`` with
    ``method="asymptotic", correction=False``).

    Args:
      d: the differences, one for each pair (``compare_paired`` passes the
        log ratios of the pairs' times).

    Returns:
      ``(the smaller of the signed-rank sums, two-sided p)``; ``p`` is 1.0
      when every difference is 0.

    Raises:
      BenchError: if ``d`` is empty or not finite.

    Example:
      >>> w, p = wilcoxon_signed_rank([0.1, 0.2, 0.15, 0.3, 0.12, 0.22, 0.18, 0.09, 0.25, 0.11])
      >>> w, p < 0.01
      (0.0, True)
    """
    x = _finite(d, "d")
    x = x[x != 0]
    n = x.size
    if n == 0:
        return 0.0, 1.0
    ranks = _ranks(np.abs(x))
    r_plus = float(ranks[x > 0].sum())
    r_minus = float(ranks[x < 0].sum())
    _, counts = np.unique(np.abs(x), return_counts=True)
    ties = float(np.sum(counts.astype(np.float64) ** 3 - counts))
    var = (n * (n + 1.0) * (2.0 * n + 1.0) - ties / 2.0) / 24.0
    if var <= 0:
        return min(r_plus, r_minus), 1.0
    z = (r_plus - n * (n + 1.0) / 4.0) / math.sqrt(var)
    return min(r_plus, r_minus), min(1.0, 2.0 * _normal_sf(abs(z)))
