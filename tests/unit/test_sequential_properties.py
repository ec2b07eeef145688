"""The stopping rule of stats/sequential.py against oracles written here: a look's interval (Welch t on logs at
level 1 - alpha / L, widened to the noise floor) and its state; the next step; and, by simulation with a known
truth, the error of stopping on the data (a decided comparison names the wrong side at most alpha of the time,
where looking at a plain 95 % interval after every round errs more) and the budget."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scipy.special import stdtrit
from mtpbench.stats.sequential import judge, max_looks, next_step, run

timing = st.floats(10.0, 1000.0, allow_nan=False)


def oracle(num, den, line, alpha, looks, floor):
    """Welch's t interval of mean(log num) - mean(log den) at level 1 - alpha / looks, widened to +-floor."""
    a, b = np.log(num), np.log(den)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    est = a.mean() - b.mean()
    se = math.sqrt(va + vb)
    if se == 0:
        half = 0.0
    else:
        df = (va + vb) ** 2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1))
        half = stdtrit(df, 1 - alpha / looks / 2) * se
    half = max(half, floor)
    lo, hi = math.exp(est - half), math.exp(est + half)
    return lo, hi, "faster" if lo > line else "slower" if hi < line else "open"


@settings(max_examples=300, deadline=None)
@given(st.lists(timing, min_size=3, max_size=10), st.lists(timing, min_size=3, max_size=10),
       st.floats(0.5, 2.0), st.floats(0.01, 0.2), st.integers(1, 20), st.floats(0.0, 0.3))
def test_a_look_is_the_bonferroni_welch_interval_widened_to_the_floor(num, den, line, alpha, looks, floor):
    look = judge(num, den, line, alpha, looks, floor)
    lo, hi, state = oracle(num, den, line, alpha, looks, floor)
    assert math.isclose(look.lo, lo, rel_tol=1e-9) and math.isclose(look.hi, hi, rel_tol=1e-9)
    if not (math.isclose(lo, line, rel_tol=1e-9) or math.isclose(hi, line, rel_tol=1e-9)):
        assert look.state == state
    assert look.repeats == min(len(num), len(den))


@given(st.lists(timing, max_size=2), st.lists(timing, min_size=3, max_size=5))
def test_fewer_than_three_timings_a_side_stay_open(num, den):
    look = judge(num, den)
    assert look.state == "open" and look.lo is None and look.ratio is None


def test_known_looks():
    assert judge([110, 111, 109], [100, 101, 99]).state == "faster"
    assert judge([90, 91, 89], [100, 101, 99]).state == "slower"
    assert judge([110, 111, 109], [100, 101, 99], floor=0.2).state == "open"  # within the machine's noise
    assert judge([100, 100, 100], [100, 100, 100]).state == "open"
    assert max_looks(3, 12) == 10 and max_looks(1, 12) == 10 and max_looks(6, 6) == 1 and max_looks(5, 2) == 1


@given(st.sampled_from(["faster", "slower", "open"]), st.integers(1, 30), st.integers(1, 30),
       st.floats(0, 100), st.one_of(st.none(), st.floats(0, 100)), st.floats(0, 50))
def test_the_next_step(state, repeats, most, elapsed, budget, last_round):
    """Another round only where it fits: the time so far plus one more round as long as the last within budget."""
    want = ("decided" if state != "open" else
            "budget" if repeats >= most or (budget is not None and elapsed + last_round > budget) else "continue")
    assert next_step(state, repeats, most, elapsed, budget, last_round) == want


def test_a_round_that_ends_on_the_budget_still_runs():
    assert next_step("open", 3, 12, 10.0, 20.0, 10.0) == "continue"  # ends at 20 s of 20: within the budget
    assert next_step("open", 3, 12, 10.0, 20.0, 10.5) == "budget"
    assert next_step("open", 3, 12, max_seconds=0.5) == "continue"  # no time spent yet, no round timed yet


def simulate(seed: int, truth: float, runs: int, alpha: float, naive: bool = False, sd: float = 0.05,
             min_repeats: int = 3, max_repeats: int = 15):
    """Share of runs the rule decides, and of those that name the side the truth is not on; and the most
    repeats any run took. Log-normal timings around 100 and 100 * truth."""
    rng = np.random.default_rng(seed)
    decided = wrong = most = 0
    for _ in range(runs):
        draw = lambda: (100 * truth * math.exp(rng.normal(0, sd)), 100 * math.exp(rng.normal(0, sd)))  # noqa: E731
        if naive:  # a plain 95 % interval at every look: what stopping on the data does without the correction
            look, why = run(draw, min_repeats, max_repeats, alpha=alpha * max_looks(min_repeats, max_repeats))
        else:
            look, why = run(draw, min_repeats, max_repeats, alpha=alpha)
        most = max(most, look.repeats)
        if why == "decided":
            decided += 1
            wrong += truth == 1 or (look.state == "faster") != (truth > 1)  # no difference: any side is wrong
    return decided / runs, wrong / runs, most


@settings(max_examples=4, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_stopping_on_the_data_errs_at_most_alpha_and_keeps_the_budget(seed):
    """No difference (truth 1): every decision is an error; at most alpha = 5 % of runs, with 3 standard errors
    of slack for 400 runs. A real 4 % speedup: a decision for "slower" at most as often."""
    for truth in (1.0, 1.04, 1 / 1.04):
        decided, wrong, most = simulate(seed, truth, 400, 0.05)
        assert wrong <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 400), (truth, wrong)
        assert most <= 15
    assert simulate(seed, 1.10, 200, 0.05)[0] > 0.5  # and it decides a real 10 % difference in 15 rounds


def test_without_the_correction_stopping_on_the_data_errs_more():
    """The same simulation looking at a plain 95 % interval after every round: more than 5 % of the runs with no
    difference end "decided" (the inflation the correction removes). Three seeds, 600 runs each."""
    rates = [simulate(seed, 1.0, 600, 0.05, naive=True)[1] for seed in (1, 2, 3)]
    assert min(rates) > 0.05 + 3 * math.sqrt(0.05 * 0.95 / 600), rates


def test_the_floor_widens_both_ends_and_the_ratio_is_the_geometric_means():
    look = judge([110.0, 111.0, 109.0], [100.0, 101.0, 99.0], floor=0.2)
    ratio = math.exp(np.mean(np.log([110.0, 111.0, 109.0])) - np.mean(np.log([100.0, 101.0, 99.0])))
    assert math.isclose(look.ratio, ratio, rel_tol=1e-9)
    assert math.isclose(look.lo, ratio * math.exp(-0.2), rel_tol=1e-9)
    assert math.isclose(look.hi, ratio * math.exp(0.2), rel_tol=1e-9)
    assert judge([1.0, 2.0], [1.0, 2.0, 3.0]).repeats == 2
    assert judge([110.0, 111.0, 109.0], [100.0, 101.0, 99.0]).state == "faster"  # one look by default


def test_run_keeps_its_time_budget_and_its_floor():
    ticks = iter(range(1, 1000))
    same = np.random.default_rng(1)
    look, why = run(lambda: tuple(100 * math.exp(same.normal(0, 0.05)) for _ in range(2)), 3, 50, floor=1.0,
                    clock=lambda: next(ticks), max_seconds=2.5)
    assert why == "budget" and look.repeats == 5  # looks at 3, 4, 5 rounds: 1, 2, 3 seconds
    rng = np.random.default_rng(0)
    draw = lambda: (120 * math.exp(rng.normal(0, 0.01)), 100 * math.exp(rng.normal(0, 0.01)))  # noqa: E731
    assert run(draw, 3, 8)[1] == "decided"
    look, why = run(draw, 3, 8, floor=1.0)  # a 20 % effect inside a floor of e^1: never decided
    assert why == "budget" and look.repeats == 8 and look.state == "open"
    assert run(draw, 4, 4)[0].repeats == 4  # the first look comes at min_repeats, not before
