"""The distribution of samples: exact values on known data, invariants on any data."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treeguard.bench import BenchError, Stats

durations = st.lists(
    st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=60,
)


def test_known_values() -> None:
    s = Stats.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (s.n, s.median, s.mad, s.min, s.max) == (5, 3.0, 1.0, 1.0, 100.0)
    assert s.mean == pytest.approx(22.0)
    assert s.sd == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))
    assert (s.p25, s.p75, s.iqr) == (2.0, 4.0, 2.0)
    assert (s.mild_outliers, s.severe_outliers) == (0, 1)  # 100 is 96 beyond Q3, > 3 IQR


def test_mild_and_severe_outliers_are_told_apart() -> None:
    base = [10.0] * 5 + [11.0] * 10 + [12.0] * 5  # Q1 = 11 - ..., IQR = 1
    s = Stats.of([*base, 13.8, 20.0])
    assert s.iqr == pytest.approx(1.0)
    assert (s.mild_outliers, s.severe_outliers) == (1, 1)


def test_histogram_and_ci_of_a_constant_sample() -> None:
    s = Stats.of([0.5] * 7)
    assert s.median_ci == (0.5, 0.5)
    assert sum(s.histogram.counts) == 7 and s.mad == 0.0 and s.severe_outliers == 0


@given(durations)
@settings(max_examples=60, deadline=None)
def test_invariants_on_any_sample(xs: list[float]) -> None:
    s = Stats.of(xs)
    assert s.n == len(xs) and sum(s.histogram.counts) == len(xs)
    assert s.min <= s.p5 <= s.p25 <= s.median <= s.p75 <= s.p95 <= s.p99 <= s.max
    assert s.min <= s.median_ci[0] <= s.median_ci[1] <= s.max
    assert s.mild_outliers + s.severe_outliers <= s.n
    assert len(s.histogram.edges) == len(s.histogram.counts) + 1


def test_the_ci_is_reproducible() -> None:
    xs = np.random.default_rng(3).lognormal(0, 0.1, 40)
    assert Stats.of(xs).median_ci == Stats.of(xs).median_ci


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([], "samples: no samples\nhint: run at least one sample"),
        ([1.0, float("nan")], "samples: 1 of 2 samples are negative or not finite"),
        ([-1.0], "samples: 1 of 1 samples are negative or not finite"),
    ],
)
def test_bad_samples_are_refused(bad: list[float], message: str) -> None:
    with pytest.raises(BenchError, match="^" + re.escape(message)):
        Stats.of(bad)
