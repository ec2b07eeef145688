"""Property and known-answer tests of ``stats.judge``, the one judgement of noise (issue 44), against an oracle
written here from the rule in its docstring, never from its body: each comparison's interval at 1 - 0.05 / (family x
looks) with scipy's exact t quantile (``scipy.special.stdtrit``) and tail (``scipy.special.stdtr``), never narrower
than the A/A floor; the p-value the two-sided tail times family x looks, capped at 1, and 1 within the floor; the
decision the side of the null the whole interval lies on."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.special import stdtr, stdtrit

from mtpbench.stats import judge
from mtpbench.stats.intervals import t_sf
from mtpbench.stats.judge import ABOVE, BELOW, OPEN, Comparison

SETTINGS = settings(max_examples=150, deadline=None)
TIMINGS = st.lists(st.floats(50, 200), min_size=0, max_size=7)


# --- the oracle ----------------------------------------------------------------------------------------------------

def level(family: int, looks: int, alpha: float = 0.05) -> float:
    return 1 - alpha / (max(family, 1) * max(looks, 1))


def side(low: float, high: float, null: float) -> str:
    return ABOVE if low > null else BELOW if high < null else OPEN


def two_sided(t: float, df: float) -> float:
    return 2 * float(stdtr(df, -abs(t)))


def moments(groups: list[tuple[float, list[float]]]) -> tuple[float, float]:
    """se and Welch-Satterthwaite df of sum(w * mean(log x)) over independent groups."""
    parts = [(w * w * np.var(np.log(x), ddof=1) / len(x), len(x)) for w, x in groups]
    v = sum(c for c, _ in parts)
    if v == 0:
        return 0.0, math.inf
    return math.sqrt(v), v * v / sum(c * c / (n - 1) for c, n in parts)


def oracle_ratio(num, den, floor, family, looks):
    """(estimate, low, high, p, decision) of num over den, or None under 3 positive repeats a side."""
    x = [v for v in num if v is not None and v > 0]
    y = [v for v in den if v is not None and v > 0]
    if min(len(x), len(y)) < 3:
        return None
    d = float(np.mean(np.log(x)) - np.mean(np.log(y)))
    se, df = moments([(1.0, x), (1.0, y)])
    m = max(family, 1) * max(looks, 1)
    if se == 0:
        half, p = 0.0, (1.0 if d == 0 else 0.0)
    else:
        half, p = -float(stdtrit(df, (1 - level(family, looks)) / 2)) * se, two_sided(d / se, df)
    if abs(d) <= floor:
        p = 1.0
    half = max(half, floor)
    low, high = math.exp(d - half), math.exp(d + half)
    return math.exp(d), low, high, min(1.0, p * m), side(low, high, 1.0)


def near(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-7 * max(1.0, abs(b))


# --- t_isf: the exact inverse of the tail ----------------------------------------------------------------------------

@pytest.mark.parametrize("df", [0.5, 1.0, 1.7, 2.0, 3.0, 4.5, 9.0, 30.0, 200.0, 1e6])
@pytest.mark.parametrize("a", [0.4, 0.25, 0.025, 0.005, 1e-4, 1e-7])
def test_t_isf_is_scipys_t_quantile(a, df):
    # the tail it inverts (``t_sf``, from lgamma) is good to about 1e-8 relative at 10^6 df, 1e-12 below 10^3
    # (the upper quantile as minus the lower one: 1 - 1e-7 in floats moves a by 1e-9 of itself)
    tol = 1e-8 if df > 1e4 else 1e-10
    t = judge.t_isf(a, df)
    assert t == pytest.approx(-float(stdtrit(df, a)), rel=tol)
    assert t_sf(t, df) == pytest.approx(a, rel=1e-9)  # the inverse of the tail the p-values read


def test_t_isf_of_infinite_df_is_the_normal_quantile():
    assert judge.t_isf(0.025, math.inf) == pytest.approx(1.959963984540054, rel=1e-12)
    assert judge.t_isf(0.3, math.inf) == pytest.approx(0.5244005127080407, rel=1e-12)


@SETTINGS
@given(st.floats(1e-9, 0.49), st.floats(0.3, 1e3))
def test_t_isf_inverts_the_tail(a, df):
    assert judge.t_isf(a, df) == pytest.approx(-float(stdtrit(df, a)), rel=1e-9)


# --- the level, the decision, the floor --------------------------------------------------------------------------

def test_the_level_is_bonferroni_over_family_and_looks():
    assert judge.ALPHA == 0.05
    assert judge.level() == 0.95
    assert judge.level(6) == pytest.approx(1 - 0.05 / 6, abs=1e-15)
    assert judge.level(3, 4) == pytest.approx(1 - 0.05 / 12, abs=1e-15)
    assert judge.level(5, 2, alpha=0.1) == pytest.approx(0.99, abs=1e-15)
    assert judge.level(0, 0) == 0.95 and judge.level(-2, 3) == pytest.approx(1 - 0.05 / 3, abs=1e-15)


def test_the_decision_is_the_side_the_whole_interval_lies_on():
    assert judge.decide(1.01, 1.2, 1.0) == ABOVE and judge.decide(0.5, 0.99, 1.0) == BELOW
    assert judge.decide(1.0, 1.2, 1.0) == OPEN and judge.decide(0.8, 1.0, 1.0) == OPEN  # an end at the null
    assert judge.decide(0.9, 1.1, 1.0) == OPEN
    assert judge.decide(0.1, 0.2, 0.0) == ABOVE and judge.decide(-0.2, -0.1, 0.0) == BELOW
    for low, high in [(None, 2.0), (2.0, None), (None, None), (1.1, math.inf), (-math.inf, 0.5), (math.nan, 2.0),
                      (1.2, math.nan)]:
        assert judge.decide(low, high, 1.0) == OPEN
    assert (ABOVE, BELOW, OPEN) == ("above", "below", "open")


def test_combined_floor_adds_the_runs_floors_in_quadrature():
    assert judge.combined_floor(0.3, 0.4) == pytest.approx(0.5, rel=1e-12)
    assert judge.combined_floor(0.3, 0.4, per_measure=True) == pytest.approx(math.sqrt(0.125), rel=1e-12)
    assert judge.combined_floor(None, 0.4) == pytest.approx(0.4, rel=1e-12)
    assert judge.combined_floor(0.0, None) == 0.0 and judge.combined_floor() == 0.0
    assert judge.combined_floor(0.2, per_measure=True) == pytest.approx(0.2 / math.sqrt(2), rel=1e-12)


def test_widen_difference_reaches_b_moved_by_the_floor():
    assert judge.widen_difference(-0.1, 0.1, 1.0, 1.2, 0.0) == (-0.1, 0.1)
    low, high = judge.widen_difference(0.15, 0.25, 1.0, 1.2, 0.1)
    assert low == pytest.approx(1.2 * math.exp(-0.1) - 1.0, rel=1e-12)
    assert high == pytest.approx(1.2 * math.exp(0.1) - 1.0, rel=1e-12)
    assert judge.widen_difference(-1.0, 2.0, 1.0, 1.2, 0.1) == (-1.0, 2.0)  # already wider: kept


# --- ratio: Welch's t on the logs ----------------------------------------------------------------------------------

@SETTINGS
@given(TIMINGS, TIMINGS, st.sampled_from([0.0, 0.0, 0.02, 0.1, 0.35]), st.integers(0, 12), st.integers(0, 5),
       st.floats(0.5, 2.0))
def test_ratio_is_welchs_t_on_the_logs_at_the_families_level(num, den, floor, family, looks, scale):
    num = [x * scale for x in num]
    c = judge.ratio(num, den, floor=floor, family=family, looks=looks)
    want = oracle_ratio(num, den, floor, family, looks)
    assert (c.level, c.family, c.looks, c.floor, c.null) == (level(family, looks), family, looks, floor, 1.0)
    assert c.n == min(len(num), len(den))
    if want is None:
        assert (c.estimate, c.low, c.high, c.p_value, c.decision) == (None, None, None, None, OPEN)
        assert not c.decided
        return
    est, low, high, p, decision = want
    assert c.estimate == pytest.approx(est, rel=1e-12)
    assert near(c.low, low) and near(c.high, high)
    assert c.p_value == pytest.approx(p, rel=1e-7, abs=1e-300)
    assume(min(abs(low - 1), abs(high - 1)) > 1e-9)  # an end on the null: rounding may decide either way
    assert c.decision == decision and c.decided == (decision != OPEN)
    if abs(math.log(est)) > floor and not (p == 0 or abs(p - 0.05) < 1e-9):
        assert c.decided == (c.p_value < 0.05)  # the interval is the dual of the adjusted p


def test_ratio_drops_missing_and_non_positive_timings():
    c = judge.ratio([200.0, None, 210.0, 0.0, 190.0, -5.0], [100.0, 105.0, 95.0, None])
    ref = judge.ratio([200.0, 210.0, 190.0], [100.0, 105.0, 95.0])
    assert (c.estimate, c.low, c.high, c.p_value, c.n) == (ref.estimate, ref.low, ref.high, ref.p_value, 3)
    two = judge.ratio([200.0, 210.0, None, 0.0], [100.0, 105.0, 95.0])
    assert two.n == 2 and two.estimate is None and two.decision == OPEN


def test_ratio_without_spread_lets_the_sign_decide():
    c = judge.ratio([120.0] * 3, [100.0] * 4)
    assert (c.low, c.high, c.p_value, c.decision) == (pytest.approx(1.2), pytest.approx(1.2), 0.0, ABOVE)
    same = judge.ratio([100.0] * 3, [100.0] * 3, family=3)
    assert (same.estimate, same.low, same.high, same.p_value, same.decision) == (1.0, 1.0, 1.0, 1.0, OPEN)
    slower = judge.ratio([80.0] * 3, [100.0] * 3, floor=0.1)
    assert slower.decision == BELOW and slower.p_value == 0.0
    assert slower.low == pytest.approx(0.8 * math.exp(-0.1)) and slower.high == pytest.approx(0.8 * math.exp(0.1))
    within = judge.ratio([105.0] * 3, [100.0] * 3, floor=0.1)
    assert within.decision == OPEN and within.p_value == 1.0


def test_ratio_known_answer():
    """Three repeats a side, worked by hand: logs' means differ by d, Welch's se and df, the 95 % t point."""
    num, den = [130.0, 128.0, 133.0], [100.0, 101.0, 99.0]
    x, y = np.log(num), np.log(den)
    d = x.mean() - y.mean()
    vx, vy = x.var(ddof=1) / 3, y.var(ddof=1) / 3
    df = (vx + vy) ** 2 / (vx ** 2 / 2 + vy ** 2 / 2)
    t = float(stdtrit(df, 0.975))
    c = judge.ratio(num, den)
    assert c.low == pytest.approx(math.exp(d - t * math.sqrt(vx + vy)), rel=1e-10)
    assert c.high == pytest.approx(math.exp(d + t * math.sqrt(vx + vy)), rel=1e-10)
    assert c.p_value == pytest.approx(2 * float(stdtr(df, -d / math.sqrt(vx + vy))), rel=1e-8)
    assert c.decision == ABOVE and c.level == 0.95 and c.n == 3
    c6 = judge.ratio(num, den, family=3, looks=2)
    assert c6.level == pytest.approx(1 - 0.05 / 6, abs=1e-15)
    assert c6.p_value == pytest.approx(min(1.0, 6 * c.p_value), rel=1e-9)
    t6 = float(stdtrit(df, 1 - 0.05 / 12))
    assert c6.high == pytest.approx(math.exp(d + t6 * math.sqrt(vx + vy)), rel=1e-10)


# --- speedup_difference: B's speedup minus A's -------------------------------------------------------------------

def oracle_between(a: float, b: float, groups, floor, family):
    """B - A of two positive estimates by the delta method over ``groups`` (weight, repeats); no spread: the sign
    decides, a difference within float round-off (1e-12) is none."""
    se, df = moments(groups)
    diff = b - a
    if se == 0:
        half, p = 0.0, (1.0 if abs(diff) <= 1e-12 else 0.0)
    else:
        half, p = -float(stdtrit(df, 0.025 / max(family, 1))) * se, two_sided(diff / se, df)
    low, high = diff - half, diff + half
    if floor:
        low, high = min(low, b * math.exp(-floor) - a), max(high, b * math.exp(floor) - a)
        if abs(math.log(b / a)) <= floor:
            p = 1.0
    return a, b, diff, low, high, min(1.0, p * max(family, 1)), side(low, high, 0.0)


def oracle_difference(a_k, a_0, b_k, b_0, floor, family):
    sa = math.exp(np.mean(np.log(a_k)) - np.mean(np.log(a_0)))
    sb = math.exp(np.mean(np.log(b_k)) - np.mean(np.log(b_0)))
    return oracle_between(sa, sb, [(sa, a_k), (sa, a_0), (sb, b_k), (sb, b_0)], floor, family)


SIDE = st.lists(st.floats(50, 200), min_size=3, max_size=6)


@SETTINGS
@given(SIDE, SIDE, SIDE, SIDE, st.sampled_from([0.0, 0.0, 0.05, 0.3]), st.integers(0, 8), st.floats(0.7, 1.5))
def test_speedup_difference_is_the_delta_method_at_the_families_level(a_k, a_0, b_k, b_0, floor, family, lift):
    b_k = [x * lift for x in b_k]
    sa, sb, c = judge.speedup_difference(a_k, a_0, b_k, b_0, floor=floor, family=family)
    wsa, wsb, diff, low, high, p, decision = oracle_difference(a_k, a_0, b_k, b_0, floor, family)
    assert sa == pytest.approx(wsa, rel=1e-12) and sb == pytest.approx(wsb, rel=1e-12)
    assert c.estimate == pytest.approx(diff, rel=1e-9, abs=1e-12)
    assert near(c.low, low) and near(c.high, high)
    assert c.p_value == pytest.approx(p, rel=1e-7, abs=1e-300)
    assert (c.level, c.family, c.looks, c.floor, c.null) == (level(family, 1), family, 1, floor, 0.0)
    assert c.n == min(map(len, (a_k, a_0, b_k, b_0)))
    assume(min(abs(low), abs(high)) > 1e-9)
    assert c.decision == decision


def test_speedup_difference_needs_three_repeats_each():
    three = [100.0, 101.0, 99.0]
    sa, sb, c = judge.speedup_difference(three, three, [1.0, 2.0], three, floor=0.1, family=4)
    assert (sa, sb) == (None, None)
    assert (c.estimate, c.low, c.high, c.p_value, c.decision, c.n, c.null) == (None, None, None, None, OPEN, 2, 0.0)
    assert (c.level, c.family, c.looks, c.floor) == (pytest.approx(1 - 0.05 / 4), 4, 1, 0.1)


# --- timing_difference: one timing of B minus A's (compare's tokens/s, TTFT, TPOT rows) ------------------------------

def oracle_timing(a, b, floor, family):
    ga, gb = math.exp(np.mean(np.log(a))), math.exp(np.mean(np.log(b)))
    return oracle_between(ga, gb, [(ga, a), (gb, b)], floor, family)


@SETTINGS
@given(SIDE, SIDE, st.sampled_from([0.0, 0.0, 0.05, 0.3]), st.integers(0, 50), st.floats(0.7, 1.5))
def test_timing_difference_is_the_delta_method_on_two_geometric_means(a, b, floor, family, lift):
    b = [x * lift for x in b]
    ga, gb, c = judge.timing_difference(a + [None, 0.0], b, floor=floor, family=family)
    wga, wgb, diff, low, high, p, decision = oracle_timing(a, b, floor, family)
    assert ga == pytest.approx(wga, rel=1e-12) and gb == pytest.approx(wgb, rel=1e-12)
    assert c.estimate == pytest.approx(diff, rel=1e-9, abs=1e-12)
    assert near(c.low, low) and near(c.high, high)
    assert c.p_value == pytest.approx(p, rel=1e-7, abs=1e-300)
    assert (c.level, c.family, c.looks, c.floor, c.null) == (level(family, 1), family, 1, floor, 0.0)
    assert c.n == min(len(a), len(b))
    assume(min(abs(low), abs(high)) > 1e-9)
    assert c.decision == decision


def test_timing_difference_known_answer_and_its_edges():
    # logs 0, 0, 0 against log 2 + (0, 0, 3): A 1, B 2 e; B's log variance of the mean 1, df 2, weight 2 e
    ga, gb, c = judge.timing_difference([1.0] * 3, [2.0, 2.0, 2 * math.exp(3)])
    assert (ga, gb) == (1.0, pytest.approx(2 * math.e))
    half = 0.95 / math.sqrt(0.04875) * 2 * math.e  # t_0.975 at df 2, times se = gb * 1
    assert (c.low, c.high) == (pytest.approx(gb - 1 - half), pytest.approx(gb - 1 + half))
    assert judge.timing_difference([1.0, 2.0], [1.0, 2.0, 3.0])[:2] == (None, None)
    none = judge.timing_difference([1.0, 2.0, 0.0], [1.0, 2.0, 3.0], floor=0.2, family=3)[2]
    assert (none.estimate, none.low, none.decision, none.n, none.floor) == (None, None, OPEN, 2, 0.2)
    assert none.level == pytest.approx(1 - 0.05 / 3)


def test_the_gate_reads_the_floor_both_ways():
    """Issue 44 case 6: A x1.20, B x1.10, tight repeats, floors of 0.35: B - A lies within the floor, open, p 1."""
    base = [100.0, 100.5, 99.5, 100.2]
    a_k, b_k = [x * 1.2 for x in base], [x * 1.1 for x in base]
    _, _, tight = judge.speedup_difference(a_k, base, b_k, base)
    assert tight.decision == BELOW and tight.p_value < 0.05
    floor = judge.combined_floor(0.35, 0.35)
    _, _, wide = judge.speedup_difference(a_k, base, b_k, base, floor=floor)
    assert wide.decision == OPEN and wide.p_value == 1.0
    assert wide.low == pytest.approx(1.1 * math.exp(-floor) - 1.2, rel=1e-3)
    assert wide.high == pytest.approx(1.1 * math.exp(floor) - 1.2, rel=1e-3)
    far = [x * 3.0 for x in base]  # beyond the floor: the p is the test's
    _, _, beyond = judge.speedup_difference(a_k, base, far, base, floor=0.1, family=2)
    assert beyond.decision == ABOVE and 0 < beyond.p_value < 0.05
    assert beyond.p_value == pytest.approx(oracle_difference(a_k, base, far, base, 0.1, 2)[5], rel=1e-7)


# --- difference: an interval without a p-value -------------------------------------------------------------------

@SETTINGS
@given(st.one_of(st.none(), st.floats(0.5, 2.0)), st.one_of(st.none(), st.floats(0.5, 2.0)),
       st.floats(-1, 1), st.floats(0, 0.5), st.sampled_from([0.0, 0.0, 0.1]), st.integers(0, 6), st.integers(0, 9))
def test_difference_is_the_interval_at_the_families_level_on_b_minus_as_side(a, b, centre, width, floor, family, n):
    seen = []

    def interval_at(lvl):
        seen.append(lvl)
        return centre - width, centre + width

    c = judge.difference(a, b, interval_at, family=family, floor=floor, n=n)
    assert (c.level, c.family, c.looks, c.floor, c.n, c.null, c.p_value) == (level(family, 1), family, 1, floor, n,
                                                                              0.0, None)
    if a is None or b is None:
        assert (c.estimate, c.low, c.high, c.decision) == (None, None, None, OPEN) and seen == []
        return
    assert seen == [level(family, 1)]
    low, high = centre - width, centre + width
    if floor:
        low, high = min(low, b * math.exp(-floor) - a), max(high, b * math.exp(floor) - a)
    want = side(low, high, 0.0)
    if (want == ABOVE and b - a <= 0) or (want == BELOW and b - a >= 0):
        want = OPEN
    assert c.estimate == b - a and (c.low, c.high) == (pytest.approx(low), pytest.approx(high))
    assume(min(abs(low), abs(high)) > 1e-12)
    assert c.decision == want


def test_difference_without_an_interval_is_open():
    c = judge.difference(1.0, 1.5, lambda lvl: None, family=2)
    assert (c.estimate, c.low, c.high, c.decision) == (0.5, None, None, OPEN)
    for ci in [(math.nan, 1.0), (0.1, math.inf)]:
        c = judge.difference(1.0, 1.5, lambda lvl, ci=ci: ci)
        assert (c.low, c.high, c.decision) == (None, None, OPEN)
    c = judge.difference(1.0, 1.5, lambda lvl: (0.2, 0.6))
    assert (c.low, c.high, c.decision) == (0.2, 0.6, ABOVE)
    skewed = judge.difference(1.5, 1.0, lambda lvl: (0.2, 0.6))  # beyond 0 on the other side of B - A: no evidence
    assert skewed.decision == OPEN and skewed.estimate == -0.5
    skewed = judge.difference(1.0, 1.5, lambda lvl: (-0.6, -0.2))
    assert skewed.decision == OPEN
    nothing = judge.difference(1.0, 1.0, lambda lvl: (0.1, 0.2))
    assert nothing.decision == OPEN
    nothing = judge.difference(1.0, 1.0, lambda lvl: (-0.2, -0.1))
    assert nothing.decision == OPEN
    below = judge.difference(1.5, 1.0, lambda lvl: (-0.6, -0.2))
    assert below.decision == BELOW


# --- what is shown ---------------------------------------------------------------------------------------------------

def test_outward_rounds_the_ends_away_from_the_estimate():
    c = Comparison(1.2, 1.123456, 1.234561, 0.01, 0.95, ABOVE)
    assert judge.outward(c) == (1.1234, 1.2346)
    assert judge.outward(c, 2) == (1.12, 1.24)
    assert judge.outward(Comparison(None, None, 1.0, None, 0.95, OPEN)) == (None, None)
    assert judge.outward(Comparison(None, 1.0, None, None, 0.95, OPEN)) == (None, None)
    # a decided interval whose end rounds onto the null keeps every digit
    assert judge.outward(Comparison(1.1, 1.00003, 1.2, 0.01, 0.95, ABOVE)) == (1.00003, 1.2)
    assert judge.outward(Comparison(0.9, 0.8, 0.99997, 0.01, 0.95, BELOW)) == (0.8, 0.99997)
    assert judge.outward(Comparison(-0.1, -0.2, -0.00003, 0.01, 0.95, BELOW, null=0.0)) == (-0.2, -0.00003)
    # an open one is rounded outward all the same
    assert judge.outward(Comparison(1.0, 0.99997, 1.00003, 0.5, 0.95, OPEN)) == (0.9999, 1.0001)
    # rounding that stays off the null is kept
    assert judge.outward(Comparison(1.1, 1.00013, 1.2, 0.01, 0.95, ABOVE)) == (1.0001, 1.2)
    assert judge.outward(Comparison(0.9, 0.8, 0.99987, 0.01, 0.95, BELOW)) == (0.8, 0.9999)
    # an above end that rounds onto the null exactly
    assert judge.outward(Comparison(1.1, 1.00001, 1.2, 0.01, 0.95, ABOVE), 2) == (1.00001, 1.2)
    assert judge.outward(Comparison(0.9, 0.8, 0.99999, 0.01, 0.95, BELOW), 2) == (0.8, 0.99999)
    # exactly on a grid point: kept
    assert judge.outward(Comparison(1.1, 1.5, 2.25, 0.01, 0.95, ABOVE), 1) == (1.5, 2.3)


def test_p_shown_keeps_the_side_of_alpha():
    assert judge.p_shown(None) is None
    assert judge.p_shown(0.0123456) == 0.0123
    assert judge.p_shown(0.049996) == 0.049996  # 3 digits would print 0.05
    assert judge.p_shown(0.0499999996) == 0.0499999996  # 6 would too
    assert judge.p_shown(0.05) == 0.05 and judge.p_shown(0.050004) == 0.05
    assert judge.p_shown(0.09996, alpha=0.1) == 0.09996 and judge.p_shown(0.09996) == 0.1
    assert judge.p_shown(0.04999999999999999) == 0.04999999999999999


def test_the_texts():
    assert judge.end_text(1.0004, 1.0) == "1.0004" and judge.end_text(1.23456, 1.0) == "1.23"
    assert judge.end_text(0.99996, 1.0) == "0.99996" and judge.end_text(1.0, 1.0) == "1"
    assert judge.end_text(0.0004, 0.0, 3, "f") == "0.0004" and judge.end_text(0.12345, 0.0, 2, "f") == "0.12"
    assert judge.end_text(-0.0004, 0.0, 3, "f") == "-0.0004"
    assert judge.end_text(1 + 2 ** -52, 1.0) == "1.0000000000000002"  # 17 significant digits tell it from 1
    assert judge.end_text(1.2, 1.0, 4) == "1.2" and judge.end_text(1.23456, 1.0, 4) == "1.235"
    assert judge.interval_text(0.99996, 1.23456, 1.0) == "[0.99996, 1.23]"
    assert judge.interval_text(0.05, 0.1, 0.0, 2, "f") == "[0.05, 0.10]"
    assert judge.level_text(0.95) == "95 %" and judge.level_text(0.999) == "99.9 %"
    assert judge.level_text(1 - 0.05 / 6) == "99.17 %" and judge.level_text(0.9) == "90 %"
    assert judge.speed(Comparison(1.2, 1.1, 1.3, 0.01, 0.95, ABOVE)) == "faster"
    assert judge.speed(Comparison(0.8, 0.7, 0.9, 0.01, 0.95, BELOW)) == "slower"
    assert judge.speed(Comparison(1.0, 0.9, 1.1, 0.5, 0.95, OPEN)) == "open"


def test_a_comparisons_json():
    c = Comparison(1.2345678, 1.1234567, 1.3456789, 0.0123456, 0.99, ABOVE, 3, 2, 0.1234567, 5)
    assert c.decided and not Comparison(None, None, None, None, 0.95, OPEN).decided
    assert c.to_json() == {"estimate": 1.23457, "low": 1.12345, "high": 1.34568, "p_value": 0.0123, "level": 0.99,
                           "decision": ABOVE, "family": 3, "looks": 2, "floor": 0.12346, "n": 5}
    assert c.to_json(2)["estimate"] == 1.23 and c.to_json(2)["low"] == 1.12 and c.to_json(2)["floor"] == 0.12346
    none = Comparison(None, None, None, None, 0.95, OPEN).to_json()
    assert none == {"estimate": None, "low": None, "high": None, "p_value": None, "level": 0.95, "decision": OPEN,
                    "family": 1, "looks": 1, "floor": 0.0, "n": 0}
    assert Comparison(None, None, None, None, 0.95, OPEN).null == 1.0


# --- edges the rule fixes ----------------------------------------------------------------------------------------------

def test_alpha_sets_every_comparisons_level():
    num, den = [130.0, 128.0, 133.0], [100.0, 101.0, 99.0]
    assert judge.ratio(num, den, family=2, looks=3, alpha=0.12).level == pytest.approx(0.98, abs=1e-15)
    _, _, c = judge.speedup_difference(num, den, den, den, family=3, alpha=0.12)
    assert c.level == pytest.approx(0.96, abs=1e-15)
    seen = []
    c = judge.difference(1.0, 1.3, lambda lvl: seen.append(lvl) or (0.1, 0.5), family=4, alpha=0.2)
    assert seen == [pytest.approx(0.95, abs=1e-15)] and c.level == pytest.approx(0.95, abs=1e-15)


def test_the_defaults_are_a_family_of_one():
    num, den = [130.0, 128.0, 133.0], [100.0, 101.0, 99.0]
    _, _, c = judge.speedup_difference(num, den, den, den)
    assert (c.family, c.level, c.floor) == (1, 0.95, 0.0)
    _, _, c4 = judge.speedup_difference(num, den, den, den, family=4)
    assert c.p_value == pytest.approx(c4.p_value / 4, rel=1e-12)
    c = judge.difference(1.0, 1.3, lambda lvl: (0.1, 0.5))
    assert (c.family, c.level, c.n, c.floor) == (1, 0.95, 0, 0.0)


def test_no_spread_and_an_estimate_of_exactly_1_is_still_decided():
    """Identical repeats a side, log ratio exactly 1: the sign decides, p 0 (the estimate is not the null)."""
    c = judge.ratio([math.e] * 3, [1.0] * 3, family=5)
    assert c.estimate == pytest.approx(math.e) and c.p_value == 0.0 and c.decision == ABOVE


def test_an_estimate_exactly_at_the_floor_is_within_it():
    """|log ratio| equal to the floor: the widened interval reaches 1, open, and the p says so (1)."""
    num, den = [130.0, 128.0, 133.0], [100.0, 101.0, 99.0]
    d = float(np.log(np.asarray(num)).mean() - np.log(np.asarray(den)).mean())
    c = judge.ratio(num, den, floor=d)
    assert c.p_value == 1.0 and c.decision == OPEN
    assert judge.ratio(num, den, floor=d * (1 - 1e-12)).p_value < 0.05
    a_k, b_k = [130.0, 128.0, 133.0, 131.0], [150.0, 149.0, 152.0, 151.0]
    sa, sb, _ = judge.speedup_difference(a_k, den, b_k, den)
    _, _, c = judge.speedup_difference(a_k, den, b_k, den, floor=abs(math.log(sb / sa)))
    assert c.p_value == 1.0
    _, _, c = judge.speedup_difference(a_k, den, b_k, den, floor=abs(math.log(sb / sa)) * (1 - 1e-9))
    assert c.p_value < 0.05


def test_p_shown_gives_the_fewest_digits_that_keep_the_side():
    assert judge.p_shown(0.04999991234) == 0.0499999  # 3 digits cross alpha, 6 do not


def test_the_texts_in_exponent_and_fixed_styles():
    assert judge.end_text(1.2345e-5, 0.0) == "1.23e-05"
    assert judge.interval_text(1.2345e-5, 2.5e-5, 0.0) == "[1.23e-05, 2.5e-05]"
    assert judge.interval_text(1.234, 2.5, 0.0, 2, "f") == "[1.23, 2.50]"


def test_two_equal_speedups_from_other_timings_are_not_told_apart_by_round_off():
    """No spread, both runs' repeats scaled alike (B's machine 20 % slower): the speedups are equal and float
    round-off of their logs (a few 1e-16) is no difference; a true difference with no spread still decides."""
    a_k, a_0 = [70.0] * 3, [100.0] * 3
    b_k, b_0 = [x * 0.8 for x in a_k], [x * 0.8 for x in a_0]
    sa, sb, c = judge.speedup_difference(a_k, a_0, b_k, b_0)
    assert abs(sb - sa) < 1e-12 and c.decision == judge.OPEN and c.p_value == 1.0
    assert judge.ratio(b_k, b_0).decision == judge.BELOW  # 0.7, no spread: the sign decides
    *_, c = judge.speedup_difference(a_k, a_0, [71.0] * 3, a_0)
    assert c.decision == judge.ABOVE and c.p_value == 0.0


@given(st.sampled_from([0.5, 0.7, 1.3]), st.sampled_from([0.8, 0.9, 1.25]), st.integers(3, 8), st.integers(3, 8))
def test_two_equal_speedups_from_scaled_timings_are_no_difference(speedup, scale, na, nb):
    """Two runs whose every timing is one value, B's machine slower by ``scale``: equal speedups whose difference
    and spread are float round-off (issue 55's tests found [1.1e-16, 1e-06] read "better"): open, p 1, and an
    interval that holds 0."""
    from mtpbench.stats.judge import speedup_difference

    a0, b0 = [100.0] * na, [100.0 * scale] * nb
    ak, bk = [100.0 * speedup] * na, [100.0 * speedup * scale] * nb
    _, _, c = speedup_difference(ak, a0, bk, b0, floor=0.0, family=10)
    assert c.decision == OPEN and c.p_value == 1.0 and c.low <= 0 <= c.high, c


@given(st.lists(st.integers(0, 8), max_size=10))
def test_a_sweeps_law_family_is_each_drafting_points_positions_and_joint_test(ks):
    """Issue 55 item 1: a sweep's --law tests are one family across its points: each k > 0 point tests its k positions
    and its joint count (k + 1 tests); plain points (k = 0) test nothing."""
    from mtpbench.stats.judge import law_family

    want = 0
    for k in ks:
        if k > 0:
            want += k + 1
    assert law_family(ks) == want


@given(st.floats(1e-6, 0.5), st.one_of(st.none(), st.integers(0, 50)))
def test_the_laws_share_is_half_alpha_a_side_over_its_family(alpha, family):
    """The law's share of an answer that reads it alone: two-sided, alpha / 2 over-acceptance and alpha / 2
    under-acceptance, the family (Bonferroni) passed on where there is one (None or 0: the block's own)."""
    from mtpbench.stats.judge import ALPHA, law_levels

    got = law_levels(alpha, family)
    assert got["over"] == got["under"] == alpha / 2
    assert got.get("family") == (family or None) and set(got) <= {"over", "under", "family"}
    assert law_levels() == {"over": ALPHA / 2, "under": ALPHA / 2}


def test_identical_timings_are_no_evidence_either_way():
    """Both sides timed alike to the last digit (no spread, no difference): p = 1 and open, never a p of 0 beside an
    open decision; a difference without spread is decided by its sign alone (p = 0)."""
    same = judge.ratio([100.0, 100.0, 100.0], [100.0, 100.0, 100.0])
    assert same.p_value == 1.0 and same.decision == OPEN and same.estimate == 1.0
    apart = judge.ratio([110.0, 110.0, 110.0], [100.0, 100.0, 100.0])
    assert apart.p_value == 0.0 and apart.decision == ABOVE
