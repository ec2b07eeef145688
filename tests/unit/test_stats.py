"""The interval code: quantiles, order statistics, edge cases, and the intervals in a real sweep (coverage on
synthetic data with a known answer: test_coverage.py)."""

import math

import numpy as np

from mtpbench import stats


def test_t_quantiles():
    for df, exact in ((1, 12.706), (2, 4.303), (3, 3.182), (7, 2.365), (15, 2.131), (79, 1.990)):
        assert abs(stats.t_quantile(0.975, df) - exact) < 0.005
    # Welch's df is fractional: between its neighbours, and never narrower than the exact 2.5 df (3.495)
    assert 3.495 <= stats.t_quantile(0.975, 2.5) < 4.303


def test_median_interval_from_order_statistics_covers_at_least_95_percent():
    rng = np.random.default_rng(7)
    true = math.log(2)  # the median of Exp(1)
    hits = sum(lo <= true <= hi for lo, hi in (stats.median_ci(rng.exponential(1, 10)) for _ in range(2000)))
    # with 10 runs the interval is [x_(2), x_(9)], covering 1 - 2 * 11/1024 = 97.9 %
    assert 0.96 <= hits / 2000 <= 0.995, hits / 2000
    assert stats.median_ci([3.0, 1.0, 2.0, 5.0, 4.0, 6.0]) == (1.0, 6.0)  # N = 6: min..max (96.9 %)
    assert stats.median_ci([3.0, 1.0, 2.0, 5.0, 4.0]) is None  # N = 5: nothing reaches 95 %


def test_few_repeats_do_not_call_noise_a_difference():
    """Both sides drawn from one distribution: one timing of two runs (compare's rows, stats.judge alone, 95 %) is
    called beyond noise in at most about 5 % of trials, from 3 repeats (a plain bootstrap did so in 10-30 %)."""
    from mtpbench.stats import judge

    rng = np.random.default_rng(11)
    wrong = 0
    for _ in range(300):
        wrong += judge.timing_difference(rng.normal(100, 5, 3), rng.normal(100, 5, 3))[2].decided
    assert wrong / 300 <= 0.08, wrong / 300


def test_paired_difference_of_identical_runs_is_exactly_zero():
    acc, drafts = [5, 9, 2, 7, 4, 6], [4, 5, 3, 6, 4, 5]
    assert stats.paired_ratio_diff_ci(acc, drafts, acc, drafts) == (0.0, 0.0)
    lo, hi = stats.paired_ratio_diff_ci(acc, drafts, [a + 2 for a in acc], drafts)
    assert 0 < lo <= hi
