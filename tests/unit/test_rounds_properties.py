"""The sweep's rounds (sweep/rounds.py) and the machine's noise (stats/noise.py) against oracles written here from
their rules: the A/A figures, each round's order, which points the next round times, the options refused, and the
load-change line (environment.load_change)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.config import SweepConfig
from mtpbench.environment import load_change
from mtpbench.metrics import GridPoint
from mtpbench.stats import noise
from scipy.special import stdtrit
from mtpbench.sweep.rounds import baselines, check, order, still_timed, with_aa

timing = st.floats(10.0, 1000.0, allow_nan=False)
timings = st.lists(timing, min_size=3, max_size=8)


def welch(num, den, level):
    """The Welch t interval of mean(log num) - mean(log den), in logs: (estimate, half-width)."""
    a, b = np.log(num), np.log(den)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return a.mean() - b.mean(), 0.0
    df = (va + vb) ** 2 / (va * va / (a.size - 1) + vb * vb / (b.size - 1))
    return a.mean() - b.mean(), stdtrit(df, 1 - (1 - level) / 2) * math.sqrt(va + vb)


@settings(max_examples=200, deadline=None)
@given(timings, timings)
def test_the_noise_floor_is_the_aa_intervals_reach_from_one(a, b):
    est, half = welch(b, a, 0.95)
    assert math.isclose(noise.floor(a, b), abs(est) + half, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(timing, min_size=2, max_size=8), st.lists(timing, min_size=2, max_size=8))
def test_single_runs_differ_by_t_sqrt2_pooled_sd(a, b):
    la, lb = np.log(a), np.log(b)
    df = len(a) + len(b) - 2
    s2 = (np.sum((la - la.mean()) ** 2) + np.sum((lb - lb.mean()) ** 2)) / df
    want = stdtrit(df, 1 - 0.025) * math.sqrt(2 * s2)
    assert math.isclose(noise.single_run(a, b), want, rel_tol=1e-9, abs_tol=1e-12)


def test_the_noise_summary_and_its_sentence():
    assert noise.floor([1, 2], [1, 2, 3]) is None and noise.single_run([1], [1, 2]) is None
    s = noise.summary([100, 101, 99, 100], [100, 102, 98, 101])
    assert s["rounds"] == 4 and s["called_different"] is False and s["floor_pct"] > 0
    assert f"{s['single_run_pct']:.1f} %" in noise.line(s) and f"{s['floor_pct']:.1f} %" in noise.line(s)
    drift = noise.summary([100, 101, 99], [120, 121, 119])
    assert drift["called_different"] and "came out different" in noise.line(drift)
    assert noise.line(None) is None and noise.line({"floor": None}) is None


@given(st.integers(0, 12), st.integers(0, 10 ** 6), st.integers(0, 50))
def test_each_round_is_a_permutation_drawn_again_from_seed_and_round(n, seed, r):
    got = order(n, seed, r)
    assert sorted(got) == list(range(n)) and got == order(n, seed, r)


def test_rounds_do_not_all_run_in_one_order():
    assert len({tuple(order(4, 0, r)) for r in range(10)}) > 1


def grid(ks, loads):
    return [GridPoint("plain" if k == 0 else "chain", k, 0 if k == 0 else 1, c) for c in loads for k in ks]


@settings(max_examples=150, deadline=None)
@given(st.lists(timings, min_size=4, max_size=4), st.lists(timings, min_size=4, max_size=4),
       st.integers(1, 12), st.booleans(), st.data())
def test_the_next_round_times_the_open_points_and_what_they_are_judged_against(load1, load2, looks, with_copy, data):
    points = grid([0, 1, 2], [1, 2])  # k0, k1, k2 at concurrency 1 and 2
    tokps = {p.name: t for p, t in zip(points[:3] + points[3:], load1[:3] + load2[:3])}
    partner = baselines(points)
    aa = None
    if with_copy:
        aa = replace(points[0], mode="aa").name
        partner[aa], tokps[aa] = points[0].name, load1[3]
    timed = set(data.draw(st.sets(st.sampled_from(sorted(tokps)))))
    keep, look = still_timed(timed, tokps, partner, aa, looks, 0.05)
    floor = 0.0
    if aa:
        est, half = welch(tokps[aa], tokps[points[0].name], 0.95)
        floor = abs(est) + half
    want = set()
    for p in points:
        if p.k == 0 or p.name not in timed:
            continue
        est, half = welch(tokps[p.name], tokps[partner[p.name]], 1 - 0.05 / looks)
        half = max(half, floor)
        lo, hi = est - half, est + half
        if abs(lo) < 1e-9 or abs(hi) < 1e-9:
            return  # on the line: rounding decides
        if lo <= 0 <= hi:
            want |= {p.name, partner[p.name]}
    if aa and points[0].name in want:
        want.add(aa)
    assert keep == want
    assert set(look["looks"]) == {p.name for p in points if p.k > 0 and p.name in timed}
    assert math.isclose(look["floor"], floor, rel_tol=1e-9, abs_tol=1e-12)


def test_a_point_without_a_baseline_stops():
    points = grid([1, 2], [1])
    keep, look = still_timed({p.name for p in points}, {p.name: [100.0, 101.0, 99.0] for p in points},
                             baselines(points), None, 1, 0.05)
    assert keep == set() and look["looks"] == {}


def test_the_aa_copy_is_of_the_first_k0_point_from_three_repeats():
    cfg = SweepConfig(repeats=3)
    todo = [(p, None) for p in grid([0, 1], [1, 2])]
    got = with_aa(cfg, todo)
    assert got[-1][0] == replace(todo[0][0], mode="aa") and got[-1][0].name == "aa-k0-c1"
    assert with_aa(replace(cfg, repeats=2), todo) == todo
    assert with_aa(replace(cfg, aa_control=False), todo) == todo
    assert with_aa(cfg, todo[1:2]) == todo[1:2]  # no k = 0 point
    assert baselines([p for p, _ in got])["aa-k0-c1"] == "k0-c1"


@given(st.integers(1, 20), st.one_of(st.none(), st.integers(0, 30)), st.one_of(st.none(), st.floats(-5, 100)),
       st.integers(-2, 3))
def test_the_rounds_options_refused(repeats, most, seconds, warmup):
    problem = check(SweepConfig(repeats=repeats, max_repeats=most, max_seconds=seconds, warmup=warmup))
    bad = ((most is not None and most < repeats) or (most is not None and most > repeats and repeats < 3)
           or (seconds is not None and seconds <= 0) or warmup < 0)
    assert (problem is not None) == bad
    if problem:
        assert "\n" not in problem and problem.startswith("--")


load = st.floats(0, 64, allow_nan=False)


@given(load, load, st.integers(1, 64))
def test_the_load_change_line(start, end, cores):
    prov = {"load_average": [start, 0, 0], "load_average_end": [end, 0, 0], "hardware": {"cpus_usable": cores}}
    margin = max(0.5, cores / 4)
    busier, quieter = end - cores >= start + margin, end <= start - margin
    lines = load_change(prov)
    assert len(lines) == (1 if busier or quieter else 0)
    if lines:
        assert ("busier" if busier else "quieter") in lines[0]
    assert load_change({"load_average": [start]}) == []


@settings(max_examples=100, deadline=None)
@given(timings, timings, st.sampled_from([0.9, 0.95, 0.99]))
def test_the_noise_summary_against_the_oracle(a, b, level):
    n = min(len(a), len(b))
    est, half = welch(b, a, level)
    floor = abs(est) + half
    s2 = (np.sum((np.log(a) - np.mean(np.log(a))) ** 2) + np.sum((np.log(b) - np.mean(np.log(b))) ** 2))
    single = stdtrit(len(a) + len(b) - 2, 1 - (1 - level) / 2) * math.sqrt(2 * s2 / (len(a) + len(b) - 2))
    got = noise.summary(a, b, level)
    assert set(got) == {"rounds", "floor", "floor_pct", "single_run", "single_run_pct", "ratio", "ratio_ci_low",
                        "ratio_ci_high", "called_different"}
    assert got["rounds"] == n
    assert math.isclose(got["floor"], round(floor, 5), abs_tol=2e-5)
    assert math.isclose(got["single_run"], round(single, 5), abs_tol=2e-5)
    assert math.isclose(got["floor_pct"], round(100 * math.expm1(floor), 2), abs_tol=0.02)
    assert math.isclose(got["single_run_pct"], round(100 * math.expm1(single), 2), abs_tol=0.02)
    assert math.isclose(got["ratio"], round(math.exp(est), 5), abs_tol=2e-5)
    assert math.isclose(got["ratio_ci_low"], round(math.exp(est - half), 5), abs_tol=2e-5)
    assert math.isclose(got["ratio_ci_high"], round(math.exp(est + half), 5), abs_tol=2e-5)
    if abs(abs(est) - half) > 1e-9:
        assert got["called_different"] == (abs(est) > half)


def test_too_few_rounds_give_no_figures():
    got = noise.summary([100.0, 101.0], [99.0, 100.0])
    assert got["rounds"] == 2 and got["floor"] is None and got["floor_pct"] is None and got["ratio"] is None
    assert got["called_different"] is None and got["single_run"] is not None


MOMENT = 1e-3  # the least share a sweep gets, in seconds: its first rounds run anyway


@settings(max_examples=150, deadline=None)
@given(st.floats(1.0, 1000.0), st.lists(st.floats(0.1, 100.0), min_size=1, max_size=6), st.data())
def test_a_tune_shares_its_budget_in_proportion_to_each_sweeps_round_cost(left, costs, data):
    """The rule (tune/budget.py, docs/measure-until-decided.md), as behaviour: the sweeps run one after another, each
    given a share of the time left; a sweep that spends its whole share leaves the rest to the sweeps after it, so
    the shares add up to the budget and each sweep's is in proportion to its round's cost (twice the cost, twice the
    time); what a sweep leaves unspent goes to the sweeps after it, never to nobody; a costlier sweep never gets
    less; every sweep gets a positive share, over budget too."""
    from mtpbench.tune.budget import budget_share

    rest, shares = left, []
    for i in range(len(costs)):  # every sweep spends its whole share
        shares.append(budget_share(rest, costs[i:]))
        rest -= shares[-1]
    assert all(s > 0 for s in shares)
    if any(s <= MOMENT for s in shares):  # a share below a moment is raised to it: over by at most a moment each
        assert left - 1e-9 * left <= sum(shares) <= left + MOMENT * len(costs)
        return
    assert math.isclose(sum(shares), left, rel_tol=1e-9)  # all of it, never more
    for i in range(len(costs)):  # in proportion: share_i / cost_i the same for every sweep
        for j in range(i):
            assert math.isclose(shares[i] * costs[j], shares[j] * costs[i], rel_tol=1e-9)
    # a sweep that leaves part of its share unspent: the sweeps after it get more, and still all of it is shared
    if len(costs) > 1:
        used = data.draw(st.floats(0.0, 1.0))
        spent = budget_share(left, costs) * used
        later = [budget_share(left - spent, costs[1:])]
        assert later[0] >= budget_share(left - budget_share(left, costs), costs[1:]) * (1 - 1e-12)
        for i in range(2, len(costs)):
            later.append(budget_share(left - spent - sum(later), costs[i:]))
        assert math.isclose(sum(later), left - spent, rel_tol=1e-9)
        # a costlier first sweep never gets less, a cheaper one never more; equal costs share evenly
        bigger = data.draw(st.floats(0.1, 100.0))
        assert (budget_share(left, [bigger] + costs[1:]) >= budget_share(left, costs)) == (bigger >= costs[0]) \
            or math.isclose(bigger, costs[0], rel_tol=1e-12)
        assert math.isclose(budget_share(left, [costs[0]] * len(costs)), left / len(costs), rel_tol=1e-9)
    # spent to the last second, or past it: the next sweep still gets a moment, and no more
    over = data.draw(st.floats(-1000.0, 0.0))
    assert 0 < budget_share(over, costs) <= MOMENT
    assert budget_share(over, costs) <= budget_share(left, costs)


def test_a_round_costs_its_batches_one_after_another():
    from mtpbench.tune.budget import budget_share, round_cost

    assert [round_cost(SweepConfig(num_prompts=16, batch_size=b)) for b in (1, 2, 4, 16, 32)] == [16, 8, 4, 1, 1]
    assert round_cost(SweepConfig(batch_size=2)) == 4  # the built-in set's 8 prompts
    assert budget_share(-5.0, [1.0, 1.0]) > 0  # over budget: the sweep still runs its first rounds


def test_a_point_decided_on_its_raw_interval_stays_timed_while_the_aa_floor_covers_it():
    """The rounds stop a point on the interval its row shows, never narrower than the A/A floor: k = 1 at a tight
    x1.3 over k = 0 is decided on its own repeats, but with an A/A copy of k = 0 that differs by 40 % (a floor wider
    than log 1.3) it is still open and stays timed, with its baseline and the copy; the look reports that floor. A
    steady x1.1 is decided at alpha 0.05 and stays open at 1e-9, or over 10^8 looks or comparisons (the level is
    1 - alpha / (family x looks))."""
    import math

    tokps = {"k0": [100.0, 101.0, 99.0, 100.5], "k1": [130.0, 131.0, 129.0, 130.5],
             "aa": [140.0, 60.0, 150.0, 70.0]}
    partner = {"k1": "k0", "aa": "k0"}
    keep, look = still_timed({"k0", "k1"}, {k: v for k, v in tokps.items() if k != "aa"}, partner, None, 1, 0.05)
    assert keep == set() and look["floor"] == 0.0  # decided without the copy
    keep, look = still_timed({"k0", "k1", "aa"}, tokps, partner, "aa", 1, 0.05)
    assert look["floor"] > math.log(1.3) and keep == {"k0", "k1", "aa"}, look
    steady = {"k0": [100.0, 103.0, 97.0], "k1": [112.0, 108.0, 110.0]}
    assert still_timed({"k0", "k1"}, steady, partner, None, 1, 0.05)[0] == set()
    assert still_timed({"k0", "k1"}, steady, partner, None, 1, 1e-9)[0] == {"k0", "k1"}
    # and at 1 - 0.05 / (family x looks): many looks, or a large family, ask as much
    assert still_timed({"k0", "k1"}, steady, partner, None, 10 ** 8, 0.05)[0] == {"k0", "k1"}
    assert still_timed({"k0", "k1"}, steady, partner, None, 1, 0.05, family=10 ** 8)[0] == {"k0", "k1"}
