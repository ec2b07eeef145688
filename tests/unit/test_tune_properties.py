"""Property tests of ``mtpbench tune``'s decision (issue 33): the choice at each load, the schedule, the sentence, the
best single k and what is run, each over random tables of repeats against an oracle written here from the rule in
docs/tune.md, never by calling the function under test for the expectation.

The oracle's own pieces: Welch's t on the logs with the t tail integrated numerically (Gauss-Legendre over
theta = atan(t), not the incomplete beta ``stats.t_sf`` uses), Holm as the step-down rejection rule (not adjusted
p-values), the choice as "the smallest qualifying k no larger qualifying k beats". The 95 % intervals come from
``stats.median_ratio_ci`` (the interval tune.md shows; tested in test_stats.py)."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.stats import log_ratio_t_p, median_ratio_ci, t_sf
from mtpbench.tune.choose import (ALPHA, LoadChoice, beats, best_single_k, boundary, check_schedule, choose_all,
                                  decision, fallback_k, holm, mean_log_speedup, recommend, schedule, single_ks,
                                  speculative_config)
from mtpbench.tune.model import Measured, Model

RATES = [0.8, 0.6, 0.45, 0.3375]
NODES, WEIGHTS = np.polynomial.legendre.leggauss(200)
SETTINGS = settings(max_examples=200, deadline=None)


# --- the oracle ----------------------------------------------------------------------------------------------------

def t_tail(t: float, df: float) -> float:
    """P(T > t): the t density integrated from t to infinity, substituting x = tan(theta) (x = t / s beyond t = 1,
    where theta's interval would be too narrow for floats)."""
    const = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    if t > 1:
        s = (NODES + 1) / 2
        x = t / s
        return float(np.sum(WEIGHTS * const * (1 + x * x / df) ** (-(df + 1) / 2) * t / s ** 2) / 2)
    lo, hi = math.atan(t), math.pi / 2
    theta = (hi - lo) / 2 * NODES + (hi + lo) / 2
    density = const * (1 + np.tan(theta) ** 2 / df) ** (-(df + 1) / 2) / np.cos(theta) ** 2
    return float((hi - lo) / 2 * np.sum(WEIGHTS * density))


def welch_p(fast: list[float], slow: list[float]) -> float | None:
    """One-sided p of "fast's typical tokens/s is above slow's": Welch's t on logs; None under 3 repeats a side."""
    x, y = np.log(fast), np.log(slow)
    if len(x) < 3 or len(y) < 3:
        return None
    vx, vy = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    d = x.mean() - y.mean()
    if vx + vy == 0 or d == 0:  # the spec: no spread, the sign decides; no difference, 0.5
        return 0.5 if d == 0 else (0.0 if d > 0 else 1.0)
    df = (vx + vy) ** 2 / (vx ** 2 / (len(x) - 1) + vy ** 2 / (len(y) - 1))
    return t_tail(d / math.sqrt(vx + vy), df)


def holm_rejects(p: dict, alpha: float) -> set:
    """Holm's step-down: walk up the sorted p-values, rejecting while the i-th smallest is <= alpha / (m - i)."""
    order = sorted(p, key=lambda key: p[key])
    out = set()
    for i, key in enumerate(order):
        if p[key] > alpha / (len(order) - i):
            break
        out.add(key)
    return out


def holm_adjusted(p: dict) -> dict:
    order = sorted(p, key=lambda key: p[key])
    return {key: min(1.0, max((len(order) - j) * p[order[j]] for j in range(i + 1))) for i, key in enumerate(order)}


def interval(a: Measured, b: Measured):
    return median_ratio_ci(a.tokps, b.tokps)


def oracle(points: list[Measured]) -> dict[int, dict]:
    """Per load: the family's p-values, the pairs that beat, the qualifying k and the chosen k, from the rule."""
    by = {(p.load, p.k): p for p in points}
    family = {}
    for (b, hi), fast in by.items():
        for lo in range(hi):
            if (b, lo) in by and (p := welch_p(fast.tokps, by[b, lo].tokps)) is not None:
                family[b, hi, lo] = p
    rejected = holm_rejects(family, ALPHA)
    adjusted = holm_adjusted(family)
    out = {}
    for b in sorted({p.load for p in points}):
        ks = sorted(k for (load, k) in by if load == b)
        wins = {key for key in rejected if key[0] == b and interval(by[b, key[1]], by[b, key[2]])[0] > 1}
        qualify = [k for k in ks if (b, k, 0) in wins]
        chosen = 0
        for q in qualify:  # the smallest qualifying k that no larger qualifying k beats
            if not any((b, bigger, q) in wins for bigger in qualify if bigger > q):
                chosen = q
                break
        out[b] = {"chosen": chosen, "wins": wins, "p_vs_0": {k: adjusted[b, k, 0] for k in ks if (b, k, 0) in adjusted}}
    return out


def scores(points: list[Measured]) -> dict[int, float]:
    """Mean over the loads of log(median(k) / median(0)), for the k measured at every load beside k = 0."""
    loads = sorted({p.load for p in points})
    med = {(p.load, p.k): statistics.median(p.tokps) for p in points}
    ks = sorted({k for (_, k) in med if all((b, k) in med and (b, 0) in med for b in loads)})
    return {k: sum(math.log(med[b, k] / med[b, 0]) for b in loads) / len(loads) for k in ks}


# --- random tables -------------------------------------------------------------------------------------------------

SPEEDS = [0.6, 0.9, 1.0, 1.0, 1.05, 1.3, 1.6]


@st.composite
def tables(draw, loads=st.lists(st.sampled_from([1, 2, 3, 4, 8, 16]), min_size=2, max_size=5, unique=True)):
    """Points at 2-5 loads x k = 0..1-4: each k a true speed over k = 0 from SPEEDS, 2-6 repeats (2: no test),
    lognormal noise of one sd for the table (0: identical repeats, ties)."""
    loads = sorted(draw(loads))
    k_max = draw(st.integers(1, 4))
    sd = draw(st.sampled_from([0.0, 0.005, 0.03, 0.1]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    points = []
    for b in loads:
        for k in range(k_max + 1):
            speed = 1.0 if k == 0 else draw(st.sampled_from(SPEEDS))
            n = draw(st.sampled_from([3, 3, 4, 6, 2] if k else [3, 4, 6]))
            tokps = [float(x) for x in 100.0 * b * speed * np.exp(rng.normal(0, sd, n))]
            points.append(Measured(b, k, tokps, 1000 if k else 0, [round(r * 1000) for r in RATES[:k]]))
    return points


# --- the choice ----------------------------------------------------------------------------------------------------

@SETTINGS
@given(tables())
def test_the_choice_at_every_load_is_the_rules(points):
    want = oracle(points)
    got = choose_all(points)
    assert [c.load for c in got] == sorted(want)
    for c in got:
        w = want[c.load]
        assert c.chosen == w["chosen"]
        assert c.p_vs_0 == pytest.approx(w["p_vs_0"], rel=1e-7, abs=1e-300)
        assert {(c.load, a, k) for k, winners in c.beaten_by.items() for a in winners} == w["wins"]


@SETTINGS
@given(tables())
def test_a_chosen_k_beats_k0_beyond_noise_after_the_correction(points):
    by = {(p.load, p.k): p for p in points}
    family = {(b, hi, lo): p for (b, hi) in by for lo in range(hi)
              if (b, lo) in by and (p := welch_p(by[b, hi].tokps, by[b, lo].tokps)) is not None}
    adjusted = holm_adjusted(family)
    for c in choose_all(points):
        if c.chosen:
            assert interval(by[c.load, c.chosen], by[c.load, 0])[0] > 1  # the interval tune.md shows lies above 1
            assert adjusted[c.load, c.chosen, 0] <= ALPHA  # and the test survives the correction over the tune


@SETTINGS
@given(tables())
def test_nothing_shown_faster_even_before_the_correction_chooses_0(points):
    by = {(p.load, p.k): p for p in points}
    for c in choose_all(points):
        above = [k for (b, k) in by if b == c.load and k and (ci := interval(by[b, k], by[b, 0])) and ci[0] > 1]
        if not above:
            assert c.chosen == 0
        assert c.chosen == 0 or c.chosen in above


@SETTINGS
@given(tables())
def test_the_fastest_is_the_highest_median_ties_to_the_smaller_k(points):
    for c in choose_all(points):
        meds = {p.k: statistics.median(p.tokps) for p in points if p.load == c.load}
        top = max(meds.values())
        assert c.fastest == min(k for k, m in meds.items() if m == top)


def test_holm_at_its_boundaries():
    p = {"a": 0.01, "b": 0.02, "c": 0.04, "d": 0.9}
    assert holm(p) == pytest.approx({"a": 0.04, "b": 0.06, "c": 0.08, "d": 0.9})
    assert holm({"a": 0.5, "b": 0.6}) == {"a": 1.0, "b": 1.0}  # capped at 1
    assert holm({"a": 0.03, "b": 0.01}) == {"b": 0.02, "a": 0.03}  # monotone: the larger never below the smaller
    assert holm({"a": 0.02, "b": 0.02}) == {"a": 0.04, "b": 0.04}  # ties
    assert holm({}) == {}


@SETTINGS
@given(st.dictionaries(st.integers(0, 30), st.floats(0, 1), min_size=1, max_size=30))
def test_holm_adjusted_p_values_reject_exactly_what_the_step_down_rejects(p):
    adjusted = holm(p)
    assert adjusted == pytest.approx(holm_adjusted(p), rel=1e-12)
    for alpha in (0.01, 0.05, 0.2):
        # at levels away from an adjusted value (multiplying and dividing may round differently there)
        if all(abs(a - alpha) > 1e-12 for a in adjusted.values()):
            assert {k for k, a in adjusted.items() if a <= alpha} == holm_rejects(p, alpha)


BASE = [90.0, 95.0, 98.0, 100.0]
ABOVE = [100.0, 110.0, 120.0, 130.0]  # the 4 + 4 rank interval: [min / max, max / min] = [100 / 100, 130 / 90]


def test_beats_needs_the_adjusted_p_within_alpha_and_the_interval_wholly_above_1():
    assert median_ratio_ci(ABOVE, BASE)[0] == 1.0  # lower end exactly 1: not above
    assert not beats(Measured(1, 1, ABOVE), Measured(1, 0, BASE), 0.0)
    shifted = [x * 1.01 for x in ABOVE]
    assert median_ratio_ci(shifted, BASE)[0] > 1
    assert beats(Measured(1, 1, shifted), Measured(1, 0, BASE), ALPHA)
    assert not beats(Measured(1, 1, shifted), Measured(1, 0, BASE), math.nextafter(ALPHA, 1))
    assert ALPHA == 0.05  # the family-wise rate docs/tune.md states and benchmarks/tune_false_pick.py measures


def test_an_interval_ending_exactly_at_1_qualifies_nothing():
    pts = [Measured(1, 0, BASE), Measured(1, 1, ABOVE, 1000, [800]), Measured(2, 0, BASE), Measured(2, 1, BASE)]
    assert [c.chosen for c in choose_all(pts)] == [0, 0]
    assert choose_all(pts)[0].p_vs_0[1] < ALPHA  # the test alone passes: the interval refuses
    pts[1] = Measured(1, 1, [x * 1.01 for x in ABOVE])
    assert [c.chosen for c in choose_all(pts)] == [1, 0]


def test_too_few_repeats_are_no_member_of_the_family():
    two = [Measured(1, 0, [100.0, 101.0]), Measured(1, 1, [150.0, 151.0])]
    three = [Measured(2, 0, [100.0, 101.0, 102.0]), Measured(2, 1, [150.0, 151.0, 152.0])]
    c1, c2 = choose_all(two + three)
    assert c1.p_vs_0 == {} and c1.chosen == 0
    assert c2.p_vs_0 == {1: log_ratio_t_p(three[1].tokps, three[0].tokps)} and c2.chosen == 1  # a family of one


# --- the schedule and the sentence ---------------------------------------------------------------------------------

def expected_k_per_load(choices: list[LoadChoice], model: Model) -> dict[int, int]:
    """The rule: up to the first measured load its k; between two measured loads of different k, the larger load's k
    from the first load the prediction makes it at least as fast as the smaller load's k (the larger load at the
    latest)."""
    choices = sorted(choices, key=lambda c: c.load)
    k_of = {b: choices[0].chosen for b in range(1, choices[0].load + 1)}
    for lo, hi in zip(choices, choices[1:]):
        switch = hi.load
        if lo.chosen != hi.chosen:
            for b in range(lo.load + 1, hi.load):
                a, z = model.predict(lo.chosen, b), model.predict(hi.chosen, b)
                if a is not None and z is not None and z >= a:
                    switch = b
                    break
        for b in range(lo.load + 1, hi.load + 1):
            k_of[b] = lo.chosen if b < switch else hi.chosen
    return k_of


@SETTINGS
@given(tables())
def test_the_schedule_covers_1_to_the_largest_load_once_and_gives_each_load_its_k(points):
    model = Model(points)
    choices = choose_all(points)
    ranges = schedule(choices, model)
    largest = max(p.load for p in points)
    assert ranges[0][0] == 1 and ranges[-1][1] == largest
    assert all(s <= e for s, e, _ in ranges)
    assert all(a[1] + 1 == b[0] and a[2] != b[2] for a, b in zip(ranges, ranges[1:]))  # no gap, no overlap, merged
    k_of = {b: k for s, e, k in ranges for b in range(s, e + 1)}
    assert k_of == expected_k_per_load(choices, model)
    assert all(k_of[c.load] == c.chosen for c in choices)
    spec = speculative_config(ranges)
    assert spec is None or check_schedule(ranges, spec["num_speculative_tokens"]) is None


def test_a_boundary_goes_where_the_next_k_is_first_at_least_as_fast():
    pts = [Measured(b, k, [100.0 * b] * 3, 1000 if k else 0, [800] * k) for b in (1, 8) for k in (0, 1)]
    model = Model(pts)
    same = [LoadChoice(1, 1, 1), LoadChoice(8, 1, 1)]
    assert boundary(model, *same) == 2  # equally fast counts as at least as fast
    undrafted = Model([Measured(b, k, [100.0] * 3) for b in (1, 8) for k in (0, 1)])
    assert undrafted.predict(1, 4) is None and boundary(undrafted, *same) == 8  # no prediction: the measured load


def what(k: int) -> str:
    return f"k = {k}" if k else "no drafting"


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4)), min_size=1, max_size=5),
       st.sampled_from(["batch", "concurrency"]))
def test_the_decision_names_every_range_in_order(spans, unit):
    ranges, start = [], 1
    for width, k in spans:
        if ranges and ranges[-1][2] == k:
            continue
        ranges.append([start, start + width - 1, k])
        start += width
    text = decision(ranges, unit)
    if len(ranges) == 1:
        k, end = ranges[0][2], ranges[0][1]
        assert text == (f"run k = {k} at every load measured ({unit} 1-{end})" if k else
                        f"don't draft at any load measured ({unit} 1-{end})")
        return
    pieces = [f"{what(k)} up to {unit + ' ' if i == 0 else ''}{e}" for i, (_, e, k) in enumerate(ranges[:-1])]
    pieces.append(f"{what(ranges[-1][2])} above")
    at = 0
    for piece in pieces:  # each range named, in order
        found = text.find(piece, at)
        assert found >= at, (piece, text)
        at = found + len(piece)
    assert text.startswith("run ") == (ranges[0][2] > 0) and text.endswith(" above")


# --- one k for every load, and what is run -------------------------------------------------------------------------

@SETTINGS
@given(tables())
def test_the_best_single_k_has_the_highest_mean_log_speedup(points):
    s = scores(points)
    got = best_single_k(points)
    if not s:
        assert got is None
        return
    assert got == min(k for k, v in s.items() if v == max(s.values()))
    assert single_ks(points) == sorted(s)
    assert all(mean_log_speedup(points, k) == v for k, v in s.items())


def test_single_ks_need_k_and_k0_at_every_load():
    pts = [Measured(1, 0, [1.0] * 3), Measured(1, 1, [2.0] * 3), Measured(1, 2, [2.0] * 3),
           Measured(2, 0, [1.0] * 3), Measured(2, 1, [4.0] * 3)]
    assert single_ks(pts) == [0, 1] and mean_log_speedup(pts, 1) == pytest.approx(math.log(8) / 2)
    assert single_ks(pts[1:]) == [] and best_single_k(pts[1:]) is None  # batch 1 lacks k = 0


def oracle_fallback(choices: list[LoadChoice], points: list[Measured]) -> int:
    by = {(p.load, p.k): p for p in points}
    s = scores(points)
    ok = [k for k in s if k > 0 and any(c.chosen == k for c in choices)
          and all(not ((ci := interval(by[c.load, k], by[c.load, 0])) and ci[1] < 1) for c in choices)]
    return min((k for k in ok if s[k] == max(s[j] for j in ok)), default=0)


@SETTINGS
@given(tables(), st.sampled_from([None, (True, "figures"), (False, "figures")]))
def test_what_is_run_is_the_schedule_only_where_it_runs_what_was_measured(points, validated):
    choices = choose_all(points)
    ranges = schedule(choices, Model(points))
    plan = recommend(choices, ranges, points, "batch", validated)
    ks = {k for *_, k in ranges}
    mixed = 0 in ks and len(ks) > 1
    if mixed and not (validated and validated[0]):
        assert plan["run"] == [[1, ranges[-1][1], oracle_fallback(choices, points)]]
        assert plan["note"].startswith(f"the per-load choices ({decision(ranges, 'batch')}) would run batch ")
    else:
        assert plan["run"] == ranges
        assert (plan["note"] is None) == (not mixed)
    assert plan["decision"] == decision(plan["run"], "batch")
    assert plan["unmeasured"] == ([[s, e] for s, e, k in ranges if k == 0] if mixed and not validated else [])


def test_the_fallback_keeps_a_k_whose_interval_ends_exactly_at_1_and_prefers_the_smaller_of_equals():
    below = [90.0, 95.0, 98.0, 100.0]
    above = [100.0, 110.0, 120.0, 130.0]
    assert median_ratio_ci(below, above)[1] == 1.0
    fast = [x * 2 for x in above]
    pts = [Measured(1, 0, above), Measured(1, 1, fast), Measured(1, 2, fast),
           Measured(2, 0, above), Measured(2, 1, below), Measured(2, 2, below)]
    both = [LoadChoice(1, 1, 1), LoadChoice(1, 2, 2), LoadChoice(2, 0, 0)]
    assert fallback_k(both, pts) == 1  # equal speedups: the smaller k; an interval ending at 1 is not slower
    pts[4] = Measured(2, 1, [x * 0.99 for x in below])
    assert fallback_k(both, pts) == 2  # k = 1 is slower at batch 2 now


# --- the statistics the choice rests on ----------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(st.floats(-30, 30), st.floats(2, 60))  # Welch's df from 3 + 3 repeats is at least 2
def test_t_sf_is_the_t_distributions_tail(t, df):
    assert t_sf(t, df) == pytest.approx(t_tail(t, df), rel=1e-8, abs=1e-15)


def test_t_sf_at_its_ends():
    assert t_sf(0.0, 3) == 0.5 and t_sf(1e300, 3) == 0.0 and t_sf(-1e300, 3) == 1.0
    assert t_sf(1.959963984540054, math.inf) == pytest.approx(0.025, rel=1e-12)
    assert t_sf(1.0, 1) == pytest.approx(0.25, rel=1e-12)  # Cauchy
    assert t_sf(2.0, 2) == pytest.approx(0.5 - 2 / (2 * math.sqrt(2.0 ** 2 + 2)), rel=1e-12)  # closed form at df 2
    # near 0 the tail falls by the density at 0 times t (1 - x as a difference lost t below ~1e-8 entirely)
    density0 = math.exp(math.lgamma(16.5) - math.lgamma(16)) / math.sqrt(32 * math.pi)
    assert t_sf(6e-8, 32) == pytest.approx(0.5 - 6e-8 * density0, rel=1e-14) and t_sf(6e-8, 32) < 0.5


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(50, 200), min_size=2, max_size=7), st.lists(st.floats(50, 200), min_size=2, max_size=7))
def test_the_p_value_is_welchs_on_logs(fast, slow):
    want = welch_p(fast, slow)
    got = log_ratio_t_p(fast, slow)
    assert (got is None) == (want is None)
    if want is not None:
        assert got == pytest.approx(want, rel=1e-8, abs=1e-15)
