"""The distribution of a benchmark's samples: robust centre and spread,
percentiles, Tukey outliers, a bootstrap CI of the median and a histogram.

There is no best-of: the minimum is reported beside everything else, never
instead of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import BenchError

#: Resamples drawn for every bootstrap interval.
BOOTSTRAP_RESAMPLES = 2000

#: The seed of every bootstrap, so that one set of samples gives one interval.
BOOTSTRAP_SEED = 20260


def as_samples(samples: Sequence[float] | np.ndarray[Any, Any], what: str = "samples") -> Any:
    """``samples`` as a 1-d float64 array, refusing empty or non-finite input.

    Raises:
      BenchError: if there are no samples, or one is NaN, infinite or negative.

    Example:
      >>> as_samples([1, 2]).dtype.name
      'float64'
    """
    a = np.asarray(samples, dtype=np.float64).reshape(-1)
    if a.size == 0:
        raise BenchError(f"{what}: no samples", hint="run at least one sample")
    if not np.all(np.isfinite(a)) or np.any(a < 0):
        bad = int(np.sum(~np.isfinite(a) | (a < 0)))
        raise BenchError(
            f"{what}: {bad} of {a.size} samples are negative or not finite; "
            "hint: samples are durations in seconds"
        )
    return a


def bootstrap_medians(a: Any, resamples: int, rng: np.random.Generator) -> Any:
    """The medians of ``resamples`` resamples (with replacement) of the 1-d array ``a``."""
    n = a.size
    idx = rng.integers(0, n, (resamples, n), dtype=np.int32 if n < 2**31 else np.int64)
    s = np.sort(a[idx], axis=1)
    return (s[:, (n - 1) // 2] + s[:, n // 2]) / 2.0


def bootstrap_median_ci(
    samples: Sequence[float] | np.ndarray[Any, Any],
    /,
    *,
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> tuple[float, float]:
    """A percentile bootstrap confidence interval of the median.

    Args:
      samples: the values.
      level: the confidence level.
      resamples: how many bootstrap resamples to draw.
      seed: the resampling seed (the interval is reproducible).

    Returns:
      ``(low, high)``.

    Raises:
      BenchError: for empty or non-finite samples.

    Example:
      >>> lo, hi = bootstrap_median_ci([1.0, 2.0, 3.0, 4.0, 5.0])
      >>> 1.0 <= lo <= 3.0 <= hi <= 5.0
      True
    """
    a = as_samples(samples)
    rng = np.random.default_rng(seed)
    medians = bootstrap_medians(a, resamples, rng)
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(medians, [tail, 100.0 - tail])
    return float(lo), float(hi)


@dataclasses.dataclass(frozen=True)
class Histogram:
    """Counts of samples in equal-width bins.

    Attributes:
      edges: the ``bins + 1`` bin edges, in seconds.
      counts: how many samples fall in each bin (the last bin is closed).
    """

    edges: tuple[float, ...]
    counts: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"edges": list(self.edges), "counts": list(self.counts)}


def histogram(samples: Sequence[float] | np.ndarray[Any, Any], /, *, bins: int = 20) -> Histogram:
    """Equal-width bins from the minimum to the maximum.

    Example:
      >>> histogram([1.0, 1.0, 2.0], bins=2).counts
      (2, 1)
    """
    a = as_samples(samples)
    lo, hi = float(a.min()), float(a.max())
    if hi <= lo:
        hi = lo + max(abs(lo) * 1e-9, 1e-12)
    counts, edges = np.histogram(a, bins=bins, range=(lo, hi))
    return Histogram(tuple(float(e) for e in edges), tuple(int(c) for c in counts))


@dataclasses.dataclass(frozen=True)
class Stats:
    """A summary of samples (durations in seconds).

    Attributes:
      n: the number of samples.
      median: the median.
      mad: the median absolute deviation from the median (not rescaled).
      mean: the mean.
      sd: the sample standard deviation (0 for one sample).
      cv: ``sd / mean``.
      min: the smallest sample (reported, never used as the result).
      max: the largest sample.
      p5, p25, p75, p95, p99: percentiles (linear interpolation).
      iqr: ``p75 - p25``.
      mild_outliers: samples beyond 1.5 IQR from the quartiles but within 3.
      severe_outliers: samples beyond 3 IQR from the quartiles.
      median_ci: the 95% bootstrap confidence interval of the median.
      histogram: the samples in 20 bins.
    """

    n: int
    median: float
    mad: float
    mean: float
    sd: float
    cv: float
    min: float
    max: float
    p5: float
    p25: float
    p75: float
    p95: float
    p99: float
    iqr: float
    mild_outliers: int
    severe_outliers: int
    median_ci: tuple[float, float]
    histogram: Histogram

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["median_ci"] = list(self.median_ci)
        out["histogram"] = self.histogram.to_dict()
        return out

    @classmethod
    def of(cls, samples: Sequence[float] | np.ndarray[Any, Any], /) -> Stats:
        """The summary of ``samples``.

        Args:
          samples: durations in seconds (any order).

        Returns:
          The ``Stats``.

        Raises:
          BenchError: for empty, negative or non-finite samples.

        Example:
          >>> s = Stats.of([1.0, 2.0, 3.0, 4.0, 100.0])
          >>> s.n, s.median, s.mad, s.min, s.severe_outliers
          (5, 3.0, 1.0, 1.0, 1)
        """
        return describe(samples)


def describe(samples: Sequence[float] | np.ndarray[Any, Any], /) -> Stats:
    """``Stats.of``, whose docstring says what it computes and refuses."""
    a = as_samples(samples)
    med = float(np.median(a))
    p5, p25, p75, p95, p99 = (float(v) for v in np.percentile(a, [5, 25, 75, 95, 99]))
    iqr = p75 - p25
    beyond = np.maximum(p25 - a, a - p75)
    severe = int(np.sum(beyond > 3.0 * iqr)) if iqr > 0 else 0
    mild = int(np.sum(beyond > 1.5 * iqr)) - severe if iqr > 0 else 0
    mean = float(np.mean(a))
    sd = float(np.std(a, ddof=1)) if a.size > 1 else 0.0
    return Stats(
        n=int(a.size),
        median=med,
        mad=float(np.median(np.abs(a - med))),
        mean=mean,
        sd=sd,
        cv=sd / mean if mean > 0 else math.nan,
        min=float(a.min()),
        max=float(a.max()),
        p5=p5,
        p25=p25,
        p75=p75,
        p95=p95,
        p99=p99,
        iqr=iqr,
        mild_outliers=mild,
        severe_outliers=severe,
        median_ci=bootstrap_median_ci(a),
        histogram=histogram(a),
    )
