"""The comparison: its U test and signed-rank test against scipy (through
``compare``'s statistic and p-value), its verdicts on simulated timings
(no clock is read here), the power guard and the machine check."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest
from benchresults import ran
from hypothesis import given, settings
from hypothesis import strategies as st

from treeguard.bench import BenchError, BenchResult, MachineMismatchError, compare


def _scipy_stats() -> Any:
    """scipy.stats, imported by the tests that compare with it rather than at
    collection (half a second, in each pytest worker, for this file alone)."""
    import scipy.stats  # the reference implementation; only this file uses scipy

    return scipy.stats


def timings(
    rng: np.random.Generator, n: int, *, scale: float = 1e-3, noise: float = 0.03
) -> np.ndarray:
    """Simulated per-call times: log-normal noise and a few slow outliers, as on a shared box."""
    x = scale * rng.lognormal(0.0, noise, n)
    slow = rng.random(n) < 0.05
    return np.where(slow, x * rng.uniform(1.2, 2.0, n), x)


@pytest.mark.parametrize("seed", range(20))
def test_mann_whitney_agrees_with_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n1, n2 = rng.integers(5, 60, 2)
    x, y = rng.normal(0, 1, n1), rng.normal(rng.uniform(-1, 1), 1, n2)
    if seed % 2:  # ties
        x, y = np.round(x, 1), np.round(y, 1)
    c = compare(y + 10.0, x + 10.0)  # U of the candidate; a common shift keeps every rank
    ref = _scipy_stats().mannwhitneyu(x, y, alternative="two-sided", method="asymptotic")
    assert abs(c.statistic - ref.statistic) <= 1e-12 * max(1.0, ref.statistic)
    assert abs(c.p_value - ref.pvalue) <= 1e-12


@given(
    st.lists(st.integers(0, 6), min_size=2, max_size=30),
    st.lists(st.integers(0, 6), min_size=2, max_size=30),
)
@settings(max_examples=60, deadline=None)
def test_mann_whitney_agrees_with_scipy_on_heavy_ties(x: list[int], y: list[int]) -> None:
    c = compare([v + 1.0 for v in y], [v + 1.0 for v in x])
    u, p = c.statistic, c.p_value
    if len(set(x + y)) == 1:
        assert p == 1.0
        return
    ref = _scipy_stats().mannwhitneyu(x, y, alternative="two-sided", method="asymptotic")
    assert abs(u - ref.statistic) <= 1e-9 and abs(p - ref.pvalue) <= 1e-12


def test_hodges_lehmann_is_the_median_pairwise_difference() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 17), rng.normal(0.5, 1, 23)
    shift = compare(a + 10.0, b + 10.0).shift_s
    assert shift == pytest.approx(np.median([y - x for x in a for y in b]))


def test_a_five_percent_shift_at_n30_is_detected() -> None:
    rng = np.random.default_rng(5)
    base = timings(rng, 30, noise=0.02)
    cand = timings(rng, 30, noise=0.02) * 1.05
    c = compare(base, cand)
    assert c.verdict == "regression", c.describe()
    assert c.ratio_ci[0] - 1 > 0.02 and c.change == pytest.approx(0.05, abs=0.02)
    assert compare(cand, base).verdict == "improvement"


@pytest.mark.slow
def test_a_five_percent_shift_at_n30_is_detected_nine_times_in_ten() -> None:
    rng = np.random.default_rng(6)
    hits = sum(
        compare(timings(rng, 30, noise=0.02), timings(rng, 30, noise=0.02) * 1.05).verdict
        == "regression"
        for _ in range(200)
    )
    assert hits >= 180


@pytest.mark.slow
@pytest.mark.parametrize("min_effect", [0.0])  # 0 is the hardest case: no effect margin
def test_the_aa_false_positive_rate_is_at_most_alpha_plus_one_percent(min_effect: float) -> None:
    rng = np.random.default_rng(7)
    alpha, trials = 0.05, 1000
    called = sum(
        compare(timings(rng, 30), timings(rng, 30), alpha=alpha, min_effect=min_effect).verdict
        in ("regression", "improvement")
        for _ in range(trials)
    )
    assert called / trials <= alpha + 0.01


def test_the_u_test_alone_is_calibrated_on_aa_data() -> None:
    rng = np.random.default_rng(8)
    rejected = sum(compare(timings(rng, 30), timings(rng, 30)).p_value < 0.05 for _ in range(1000))
    assert rejected / 1000 <= 0.06


def test_no_change_when_the_interval_lies_within_min_effect() -> None:
    rng = np.random.default_rng(9)
    c = compare(timings(rng, 200, noise=0.01), timings(rng, 200, noise=0.01))
    assert c.verdict == "no_change", c.describe()
    assert c.reason == "the interval lies within ±2.0%"
    assert c.needed_samples is None


def test_inconclusive_when_noise_hides_the_answer_with_the_samples_needed() -> None:
    rng = np.random.default_rng(10)
    c = compare(timings(rng, 12, noise=0.3), timings(rng, 12, noise=0.3) * 1.03)
    assert c.verdict == "inconclusive", c.describe()
    assert c.reason.startswith("the interval is neither within nor beyond ±2.0%")
    assert c.needed_samples is not None and c.needed_samples > 12


def test_the_power_guard_refuses_too_few_samples() -> None:
    c = compare([1.0] * 5, [2.0] * 5)  # all of B above all of A, yet only 5 each
    assert c.verdict == "inconclusive"
    assert c.reason == "too few samples to call (5 and 5; at least 9 per side)"
    assert c.needed_samples is not None and c.needed_samples >= 9


def test_unequal_sample_sizes_are_fine() -> None:
    rng = np.random.default_rng(11)
    c = compare(timings(rng, 15, noise=0.01), timings(rng, 90, noise=0.01) * 1.2)
    assert (c.n_base, c.n_cand, c.verdict) == (15, 90, "regression")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, "alpha=0.0\nhint: a level between 0 and 1, such as 0.05"),
        ({"min_effect": -0.1}, "min_effect=-0.1\nhint: a fraction such as 0.02 for 2%"),
    ],
)
def test_bad_levels_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(BenchError, match="^" + re.escape(message)):
        compare([1.0] * 10, [1.0] * 10, **kwargs)  # type: ignore[arg-type]


def _result(samples: np.ndarray, **conditions: object) -> BenchResult:
    conds = {"cpu_model": "Test CPU", "usable_cores": 2, "backend": "cpu", "jax": "0.10.2"}
    return ran(samples, conds | conditions)


def test_different_machines_are_refused_unless_allowed() -> None:
    rng = np.random.default_rng(12)
    a = _result(timings(rng, 30))
    b = _result(timings(rng, 30), cpu_model="Other CPU", usable_cores=8)
    with pytest.raises(MachineMismatchError) as e:
        compare(a, b)
    assert str(e.value).splitlines()[:3] == [
        "the two results come from different machines (2 keys):",
        "  cpu_model: 'Test CPU' in the base, 'Other CPU' in the candidate",
        "  usable_cores: 2 in the base, 8 in the candidate",
    ]
    assert "hint: compare runs from one machine" in str(e.value)
    assert e.value.differences[0] == ("cpu_model", "Test CPU", "Other CPU")
    assert compare(a, b, allow_different_machines=True).verdict in ("no_change", "inconclusive")


def test_load_and_commit_are_conditions_not_identity() -> None:
    rng = np.random.default_rng(13)
    a = _result(timings(rng, 30), load={"1m": 0.1}, git_commit="a")
    b = _result(timings(rng, 30), load={"1m": 3.0}, git_commit="b")
    assert compare(a, b).verdict in ("no_change", "inconclusive")


def test_an_invalid_result_makes_the_comparison_invalid() -> None:
    rng = np.random.default_rng(14)
    a = _result(timings(rng, 30))
    b = dataclasses.replace(_result(timings(rng, 30) * 2), status="invalid", reason="1 compile(s)")
    c = compare(a, b)
    assert c.verdict == "invalid" and c.reason == "candidate 'f': 1 compile(s)"


@pytest.mark.parametrize("seed", range(12))
def test_wilcoxon_signed_rank_agrees_with_scipy(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    d = rng.normal(rng.uniform(-0.5, 0.5), 1.0, int(rng.integers(10, 60)))
    if seed % 3 == 0:  # ties, zeros dropped
        d = np.round(d, 1)
    base, cand = np.ones(d.size), np.exp(d)
    c = compare(base, cand, paired=True)  # the signed-rank test of log(cand / base)
    w, p = c.statistic, c.p_value
    ref = _scipy_stats().wilcoxon(
        np.log(cand / base), method="asymptotic", correction=False, zero_method="wilcox"
    )
    assert abs(w - ref.statistic) <= 1e-9 and abs(p - ref.pvalue) <= 1e-12


def test_pairing_cancels_a_drift_that_hides_the_difference_unpaired() -> None:
    rng = np.random.default_rng(15)
    drift = np.linspace(1.0, 2.0, 30) * rng.lognormal(0, 0.01, 30)  # the machine slows down
    base, cand = drift, drift * 1.06 * rng.lognormal(0, 0.01, 30)
    assert compare(base, cand).verdict == "inconclusive"
    paired = compare(base, cand, paired=True)
    assert (paired.verdict, paired.test) == ("regression", "wilcoxon-paired")
    assert compare(base, base * rng.lognormal(0, 0.005, 30), paired=True).verdict == "no_change"
    few = compare(base[:5], cand[:5], paired=True)
    assert few.verdict == "inconclusive"
    assert few.reason == "too few samples to call (5 pairs; at least 9 pairs)"
    with pytest.raises(BenchError, match=r"^paired times: 30 base and 5 candidate"):
        compare(base, cand[:5], paired=True)


@pytest.mark.slow
def test_the_paired_aa_false_positive_rate_is_at_most_alpha_plus_one_percent() -> None:
    rng = np.random.default_rng(16)
    called = 0
    for _ in range(1000):
        drift = np.exp(np.cumsum(rng.normal(0, 0.02, 30)))  # a random-walk machine
        a, b = drift * timings(rng, 30), drift * timings(rng, 30)
        called += compare(a, b, min_effect=0.0, paired=True).verdict in (
            "regression",
            "improvement",
        )
    assert called / 1000 <= 0.06


def test_compare_on_the_cpu_clock() -> None:
    rng = np.random.default_rng(17)
    a = dataclasses.replace(_result(timings(rng, 30) * 3), cpu_samples_s=tuple(timings(rng, 30)))
    b = dataclasses.replace(
        _result(timings(rng, 30) * 3), cpu_samples_s=tuple(timings(rng, 30) * 1.3)
    )
    c = compare(a, b, clock="cpu")
    assert (c.verdict, c.clock) == ("regression", "cpu")
    assert compare(a, b).clock == "wall"
    with pytest.raises(
        BenchError, match=r"^f: no CPU times recorded\nhint: compare with clock='wall'$"
    ):
        compare(_result(timings(rng, 30)), b, clock="cpu")
    with pytest.raises(BenchError, match=r"^clock='gpu'\nhint: 'wall' or 'cpu'$"):
        compare(a, b, clock="gpu")


# -- across runs: the variance from one process to the next --------------------------


def run_of(rng: np.random.Generator, *, scale: float = 1.0, between: float = 0.05) -> BenchResult:
    """One simulated process: its own offset (memory layout, compiled code,
    neighbours; log-normal, ``between``), then 30 samples with little noise."""
    offset = rng.lognormal(0.0, between)
    return _result(timings(rng, 30, noise=0.01) * scale * offset)


def test_one_run_per_side_is_never_a_verdict_though_its_samples_differ() -> None:
    rng = np.random.default_rng(11)
    pairs = [(run_of(rng), run_of(rng)) for _ in range(40)]
    # Within one process the offset is invisible, so the samples alone call
    # most A/A pairs a regression or an improvement...
    within = [compare(a, b).verdict for a, b in pairs]
    assert sum(v in ("regression", "improvement") for v in within) >= 20
    # ...and across runs one run per side says nothing either way.
    for a, b in pairs:
        c = compare([a], [b])
        assert c.verdict == "inconclusive" and c.test == "mann-whitney-runs"
        assert c.reason == "too few samples to call (1 and 1; at least 9 runs per side)"
        assert c.needed_samples is not None and c.needed_samples >= 9


def test_aa_runs_never_call_a_regression_at_the_default_alpha() -> None:
    rng = np.random.default_rng(12)
    verdicts = [
        compare([run_of(rng) for _ in range(10)], [run_of(rng) for _ in range(10)]).verdict
        for _ in range(100)
    ]
    assert verdicts.count("regression") == 0
    assert verdicts.count("improvement") == 0


def test_a_real_slowdown_across_runs_is_a_regression() -> None:
    rng = np.random.default_rng(13)
    hits = sum(
        compare(
            [run_of(rng) for _ in range(10)], [run_of(rng, scale=1.3) for _ in range(10)]
        ).verdict
        == "regression"
        for _ in range(20)
    )
    assert hits >= 18


def test_runs_check_machines_and_validity() -> None:
    rng = np.random.default_rng(14)
    base = [run_of(rng) for _ in range(9)]
    cand = [run_of(rng) for _ in range(8)]
    other = dataclasses.replace(run_of(rng), conditions={"cpu_model": "Other CPU"})
    with pytest.raises(MachineMismatchError, match="cpu_model: 'Test CPU' in the base"):
        compare(base, [*cand, other])
    bad = dataclasses.replace(run_of(rng), status="invalid", reason="1 compile(s)")
    c = compare(base, [*cand, bad])
    assert c.verdict == "invalid" and c.reason == "candidate 'f': 1 compile(s)"
    with pytest.raises(BenchError, match=r"^9 base and 0 candidate runs\nhint: give each side"):
        compare(base, [])


def test_compare_refuses_sides_of_different_kinds() -> None:
    rng = np.random.default_rng(18)
    result = _result(timings(rng, 30))
    for base, cand, paired, kinds in (
        (result, list(timings(rng, 30)), False, "result and samples"),
        ([result], result, False, "result and runs"),
        (result, result, True, "result (paired)"),
    ):
        with pytest.raises(BenchError, match=re.escape(f"base and candidate are {kinds}")):
            compare(base, cand, paired=paired)
