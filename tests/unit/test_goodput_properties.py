"""Property tests of ``mtpbench tune --goodput`` (tune/goodput.py): goodput of a timed run as ``vllm bench serve
--goodput`` defines it, and the choice of k per load by goodput, over random per-request latencies and wall times,
against an oracle written here from the rule (docs/tune.md), never by calling the code under test for the expectation.

The oracle's goodput: count the requests whose every targeted latency is <= its target, over the run's wall time.
Its choice: a point with a repeat of goodput 0 takes part in no test; a load whose k = 0 is such a point chooses
k = 0; the rest is the tokens/s rule's oracle (test_tune_properties.oracle: Welch on logs with its own t tail,
Bonferroni over the family, the interval above 1) run over the goodputs."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.errors import MtpBenchError
from mtpbench.tune.choose import LoadChoice
from mtpbench.tune.goodput import choose as choose_measured
from mtpbench.tune.goodput import describe, good_requests, parse, ranges_of, run_goodput, samples
from mtpbench.tune.model import Measured
from tests.unit.test_tune_properties import family_of, geo, oracle

SETTINGS = settings(max_examples=200, deadline=None)
METRIC = ("ttft", "tpot", "e2el")


# --- the oracle ----------------------------------------------------------------------------------------------------

def goodput_oracle(repeat: dict, slo: dict) -> float | None:
    requests = list(zip(repeat["request_ttft_ms"], repeat["request_tpot_ms"], repeat["request_e2el_ms"]))
    if any(r[METRIC.index(m)] is None for r in requests for m in slo):
        return None
    good = 0
    for r in requests:
        ok = True
        for m, target in slo.items():
            if r[METRIC.index(m)] > target:
                ok = False
        good += ok
    return good / repeat["wall_s"]


def choose(goodput: dict):
    """goodput.choose over points whose values are the goodputs given ((load, k) -> repeats' goodput)."""
    return choose_measured({key: Measured(*key, xs) for key, xs in goodput.items() if xs is not None})


def choice_oracle(goodput: dict) -> dict[int, dict]:
    """load -> the chosen k by the rule, the pairs that beat and the adjusted p of each k > 0 against k = 0
    (loads with k = 0; where k = 0 has a goodput of 0: k = 0, nothing tested)."""
    positive = {key: xs for key, xs in goodput.items() if min(xs) > 0}
    open_loads = {b for (b, k) in positive if k == 0}
    points = [Measured(b, k, xs) for (b, k), xs in positive.items() if b in open_loads]
    want = oracle(points) if points else {}
    return {b: want.get(b, {"chosen": 0, "wins": set(), "p_vs_0": {}}) for (b, k) in goodput if k == 0}


# --- random runs ---------------------------------------------------------------------------------------------------

@st.composite
def repeats(draw, level: float, speed: float):
    """One timed run: 1-6 requests with latencies around ``level`` ms, a wall time around 1 s / speed."""
    n = draw(st.integers(1, 6))
    vals = lambda: [level * draw(st.sampled_from([0.5, 0.9, 1.0, 1.1, 2.0])) for _ in range(n)]  # noqa: E731
    return {"request_ttft_ms": vals(), "request_tpot_ms": vals(), "request_e2el_ms": vals(),
            "wall_s": draw(st.sampled_from([0.95, 1.0, 1.0, 1.05])) / speed}


@st.composite
def tables(draw):
    """2-3 loads x k = 0..1-3: per point a latency level (against targets of 100 ms) and a speed, 2-6 repeats."""
    loads = draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=2, max_size=3, unique=True))
    k_max = draw(st.integers(1, 3))
    out = {}
    for b in loads:
        for k in range(k_max + 1):
            level, speed = draw(st.sampled_from([20.0, 50.0, 100.0, 300.0])), draw(st.sampled_from([0.7, 1.0, 1.6]))
            n = draw(st.sampled_from([3, 3, 4, 6, 2] if k else [3, 4, 6]))
            out[b, k] = [draw(repeats(level, speed)) for _ in range(n)]
    return out


slos = st.dictionaries(st.sampled_from(METRIC), st.sampled_from([0.0, 50.0, 100.0, 200.0, 1e9]), min_size=1)


@SETTINGS
@given(repeats(100.0, 1.0), slos)
def test_a_runs_goodput_counts_the_requests_meeting_every_target(repeat, slo):
    assert run_goodput(repeat, slo) == pytest.approx(goodput_oracle(repeat, slo))
    assert good_requests(repeat, slo) == round(goodput_oracle(repeat, slo) * repeat["wall_s"])


@SETTINGS
@given(repeats(100.0, 1.0), slos)
def test_an_unknown_time_or_a_file_without_them_leaves_goodput_unknown(repeat, slo):
    m = next(iter(slo))
    repeat[f"request_{m}_ms"][0] = None
    assert run_goodput(repeat, slo) is None
    del repeat[f"request_{m}_ms"]
    assert run_goodput(repeat, slo) is None and samples([repeat], slo) is None


@SETTINGS
@given(tables(), slos)
def test_the_choice_by_goodput_is_the_rules(table, slo):
    goodput = {key: [goodput_oracle(r, slo) for r in reps] for key, reps in table.items()}
    got, notes = choose({key: samples(reps, slo) for key, reps in table.items()})
    want = choice_oracle(goodput)
    positive = {key: xs for key, xs in goodput.items() if min(xs) > 0}
    if any(abs(lo - 1) < 1e-9 or abs(hi - 1) < 1e-9
           for lo, hi, *_ in family_of([Measured(*key, xs) for key, xs in positive.items()]).values()):
        return  # an interval end within rounding of 1: either side is right
    assert {c.load: c.chosen for c in got} == {b: w["chosen"] for b, w in want.items()}
    for c in got:
        assert c.p_vs_0 == pytest.approx(want[c.load]["p_vs_0"], rel=1e-6, abs=1e-300)
        assert {(c.load, a, k) for k, winners in c.beaten_by.items() for a in winners} == want[c.load]["wins"]
        # ranked by what is judged: the geometric mean where every repeat's goodput is above 0, else the median
        meds = {k: geo(xs) if min(xs) > 0 else statistics.median(xs) for (b, k), xs in goodput.items() if b == c.load}
        assert c.fastest == min(k for k, m in meds.items() if m == max(meds.values()))
        zeros = [k for (b, k), xs in goodput.items() if b == c.load and min(xs) == 0]
        assert (c.load in notes) == bool(zeros)  # a goodput of 0 is said, never divided by
        if 0 in zeros:
            assert c.chosen == 0 and not c.p_vs_0
    if got:
        ranges = ranges_of(got)
        assert ranges[0][0] == 1 and ranges[-1][1] == max(c.load for c in got)
        for c in got:  # the ranges give each measured load its k, contiguous from 1
            assert next(k for s, e, k in ranges if s <= c.load <= e) == c.chosen
        assert all(a[1] + 1 == z[0] for a, z in zip(ranges, ranges[1:]))


def test_goodput_zero_at_k0_chooses_0_and_says_why():
    """Loads with different k, one without k = 0 (no choice there), zeros at k = 0 and at k > 0."""
    got, notes = choose({(1, 0): [0.0, 1.0, 1.0], (1, 1): [5.0, 0.0, 5.2], (1, 2): [5.0, 5.1, 5.2], (1, 3): [6.0] * 3,
                         (2, 0): [1.0, 1.1, 1.2], (2, 1): [0.0, 0.0, 0.0], (3, 1): [1.0, 1.0, 1.0]})
    assert [(c.load, c.chosen, c.fastest) for c in got] == [(1, 0, 3), (2, 0, 0)]
    assert all(not c.p_vs_0 and not any(c.beaten_by.values()) for c in got)
    assert notes == {1: ["k = 0 had goodput 0 in some repeat (no request met the SLO): no ratio test against it, so "
                         "no k > 0 can qualify (k = 2, 3 had goodput above 0 in every repeat)"],
                     2: ["k = 1: goodput 0 in some repeat, no ratio test"]}
    got, notes = choose({(1, 0): [0.0] * 3, (1, 1): [0.0] * 3, (2, 0): [1.0] * 3, (2, 1): [0.0, 1.0, 0.0],
                         (2, 2): [0.0] * 3})
    assert notes == {1: ["k = 0 had goodput 0 in some repeat (no request met the SLO): no ratio test against it, so "
                         "no k > 0 can qualify"], 2: ["k = 1, 2: goodput 0 in some repeat, no ratio test"]}


def test_a_run_without_a_positive_wall_time_has_no_goodput():
    run = {"request_ttft_ms": [1.0], "request_tpot_ms": [1.0], "request_e2el_ms": [1.0]}
    for wall in (None, 0.0, -1.0):
        assert run_goodput({**run, "wall_s": wall}, {"ttft": 5}) is None
    assert run_goodput({**run, "wall_s": 0.5}, {"ttft": 5}) == 2.0


def test_ranges_switch_at_the_measured_load_that_chose_the_next_k():
    def c(load, k):
        return LoadChoice(load, k, k)

    assert ranges_of([c(4, 0), c(1, 2), c(2, 2), c(8, 1)]) == [[1, 2, 2], [3, 4, 0], [5, 8, 1]]
    assert ranges_of([c(2, 1), c(16, 1)]) == [[1, 16, 1]]
    assert ranges_of([c(3, 0)]) == [[1, 3, 0]]


def test_a_clear_gain_in_goodput_is_chosen():
    got, notes = choose({(b, k): [x * (1 + k) for x in (1.0, 1.01, 0.99, 1.02)] for b in (1, 4) for k in (0, 1)})
    assert [c.chosen for c in got] == [1, 1] and not notes


@pytest.mark.parametrize("pairs,want", [
    (["ttft:500", "tpot:50"], {"ttft": 500.0, "tpot": 50.0}),
    (["ttft:500 tpot:50"], {"ttft": 500.0, "tpot": 50.0}),
    (["e2el:1000,tpot:7.5"], {"e2el": 1000.0, "tpot": 7.5}),
    (["tpot:0"], {"tpot": 0.0}),
])
def test_goodput_option_parses_vllms_pairs(pairs, want):
    assert parse(pairs) == want
    assert describe(want).count("<=") == len(want)


@pytest.mark.parametrize("pairs,why", [
    (["itl:50"], "KEY one of ttft, tpot, e2el"), (["ttft"], "KEY:VALUE"), (["ttft:fast"], "a number of ms >= 0"),
    (["ttft:-1"], "a number of ms >= 0"), (["ttft:inf"], "a number of ms >= 0"), (["ttft:nan"], ">= 0"),
    (["ttft:1", "ttft:2"], "--goodput gives ttft twice (1 and 2 ms)"), (["ttft:1:2"], "a number of ms >= 0"),
    ([" "], "--goodput needs at least one KEY:VALUE target, e.g. --goodput 'ttft:500 tpot:50'"),
])
def test_bad_goodput_is_one_line(pairs, why):
    with pytest.raises(MtpBenchError) as e:
        parse(pairs)
    assert why in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("--goodput ")


def test_describe_orders_as_vllm():
    assert describe({"e2el": 900, "ttft": 500.5}) == "TTFT <= 500.5 ms, E2EL <= 900 ms"
    assert not math.isnan(parse(["e2el:1e3"])["e2el"])


def test_a_points_goodput_columns_never_divide_by_a_zero():
    """A point's ratio to k = 0 is the comparison the goodput choice judged (none where either had a repeat of
    goodput 0: the choice judged none), printed as it judged it."""
    from mtpbench.stats import judge
    from mtpbench.tune.by_goodput import point_fields

    assert point_fields(None, None) == {}
    got, _ = choose({(1, 0): [1.0, 1.1, 0.9], (1, 1): [2.0, 2.2, 1.8], (1, 2): [0.0, 1.0, 2.0],
                     (2, 0): [0.0, 1.0, 1.0], (2, 1): [1.0, 2.0, 3.0]})
    assert 2 not in got[0].vs_0 and got[1].vs_0 == {}
    for xs, vs_0 in (([0.0, 1.0, 2.0], got[0].vs_0.get(2)), ([1.0, 2.0, 3.0], None)):
        f = point_fields(xs, vs_0)
        assert f["goodput_rps"] == round(column_oracle(xs)[0], 4) and "goodput_ratio" not in f
    assert point_fields([0.0, 1.0, 2.0], None)["goodput_rps"] == 1.0  # a repeat of 0: the median
    assert point_fields([1.0, 2.0, 3.0], None)["goodput_rps"] == round(6 ** (1 / 3), 4)  # the geometric mean
    f = point_fields([2.0, 2.2, 1.8], got[0].vs_0[1])
    c = judge.ratio([2.0, 2.2, 1.8], [1.0, 1.1, 0.9])  # a family of one comparison, one look, no floor
    assert f["goodput_ratio"] == round(c.estimate, 5) and (f["goodput_ratio_ci_low"], f["goodput_ratio_ci_high"]) == \
        judge.outward(c, 5)
    assert f["goodput_decision"] == "higher" and f["goodput_ratio_level"] == 0.95
    want = column_oracle([2.0, 2.2, 1.8])[1]  # every repeat above 0: the geometric mean's t interval, from 3
    assert (f["goodput_rps_ci_low"], f["goodput_rps_ci_high"]) == (pytest.approx(want[0], abs=5.1e-5),
                                                                  pytest.approx(want[1], abs=5.1e-5))
    assert point_fields([0.0, 1.0, 2.0], None)["goodput_rps_ci_low"] is None  # a median's needs 6 repeats


def column_oracle(xs: list[float]) -> tuple[float, tuple[float, float] | None]:
    """A point's goodput column, from the rule: the geometric mean of its repeats with the t interval on their logs
    (scipy's t law; from 3 repeats) where every repeat met the SLO somewhere, the statistic the choice ranks and
    judges by; else (a goodput of 0 has no logarithm) the median with its order-statistic interval (the largest j
    whose coverage P(j <= Binomial(n, 1/2) <= n - j) is at least 0.95; from 6 repeats)."""
    from scipy.stats import t as t_law

    n = len(xs)
    if min(xs) > 0:
        logs = [math.log(x) for x in xs]
        m = math.fsum(logs) / n
        if n < 3:
            return math.exp(m), None
        half = t_law.ppf(0.975, n - 1) * math.sqrt(math.fsum((v - m) ** 2 for v in logs) / (n - 1) / n)
        return math.exp(m), (math.exp(m - half), math.exp(m + half))
    x = sorted(xs)
    ok = [j for j in range(1, n // 2 + 1) if sum(math.comb(n, i) for i in range(j, n - j + 1)) / 2 ** n >= 0.95]
    return statistics.median(xs), ((x[max(ok) - 1], x[n - max(ok)]) if ok else None)


def goodput_plan_oracle(goodput: dict, ranges: list[list[int]], chosen: dict[int, int]) -> list[list[int]]:
    """What to run by goodput, from the rule written out: the per-load ranges where they never run a load at k = 0
    beside drafting ranges; else one k at every load: of the k > 0 chosen at some load whose goodput is above 0 in
    every repeat at every load (k = 0's too), those whose goodput ratio to k = 0 has an interval (the family's)
    wholly below 1 at no load (no ratio at a load: not shown safe there), the one of highest mean log ratio of
    geometric means (ties: the smaller k); 0 where none is left."""
    from tests.unit.test_tune_properties import scores

    ks = {k for *_, k in ranges}
    if not (0 in ks and len(ks) > 1):
        return ranges
    open_loads = {b for (b, k), xs in goodput.items() if k == 0 and min(xs) > 0}
    pts = [Measured(b, k, xs) for (b, k), xs in goodput.items() if min(xs) > 0]
    by = {(p.load, p.k): p.tokps for p in pts}
    family = family_of([p for p in pts if p.load in open_loads])

    def below(k, b):
        if (b, k) not in by or (b, 0) not in by:
            return True
        return (b, k, 0) in family and family[b, k, 0][1] < 1

    s = scores(pts)
    ok = [k for k in s if k > 0 and k in chosen.values() and not any(below(k, b) for b in chosen)]
    best = min((k for k in ok if s[k] == max(s[j] for j in ok)), default=0)
    return [[1, ranges[-1][1], best]]


@SETTINGS
@given(tables(), slos)
def test_what_to_run_by_goodput_never_runs_k0_under_a_speculative_config(table, slo):
    """The goodput section's answer follows the tokens/s decision's discipline: per-load choices that would run a
    load at k = 0 under a speculative config (not plain decoding, measured nowhere) give way to one k at every load,
    and its --speculative-config and sentence are that run's."""
    from mtpbench.tune.by_goodput import section
    from mtpbench.tune.choose import decision, speculative_config

    goodput = {key: [goodput_oracle(r, slo) for r in reps] for key, reps in table.items()}
    g, _ = section([Measured(b, k, [1.0], repeats=reps) for (b, k), reps in table.items()], slo, "batch", "mtp")
    positive = [Measured(*key, xs) for key, xs in goodput.items() if min(xs) > 0]
    if any(abs(lo - 1) < 1e-9 or abs(hi - 1) < 1e-9 for lo, hi, *_ in family_of(positive).values()):
        return  # an interval end within rounding of 1: either side is right
    if not g["choices"]:
        assert g["run"] is None and g["decision"] is None
        return
    chosen = {c["load"]: c["chosen"] for c in g["choices"]}
    want = goodput_plan_oracle(goodput, g["schedule"], chosen)
    assert g["run"] == want
    assert g["decision"] == decision(want, "batch") and g["speculative_config"] == speculative_config(want, "mtp")
    assert (g["why"] is None) == (want == g["schedule"])
    assert not (any(k == 0 for *_, k in g["run"]) and any(k for *_, k in g["run"]))


def test_a_load_where_no_ratio_can_be_taken_keeps_every_k_from_the_single_config():
    """Concurrency 1: k = 1 serves twice k = 0's goodput; concurrency 4: every point had a repeat where no request
    met the SLO. The per-load choices (k = 1, then no drafting) would run concurrency 4 at k = 0 under a speculative
    config; k = 1 cannot be shown no worse there (no ratio of a zero), so nothing is drafted."""
    from mtpbench.tune.by_goodput import section

    def reps(good: list[int]) -> list[dict]:  # one request per repeat, wall 1 s: goodput = good
        return [{"request_ttft_ms": [1.0 if g else 1e6], "request_tpot_ms": [1.0], "request_e2el_ms": [1.0],
                 "wall_s": 1.0} for g in good]

    pts = [Measured(1, 0, [1.0], repeats=reps([1, 1, 1, 1])), Measured(1, 1, [1.0], repeats=reps([1, 1, 1, 1])),
           Measured(4, 0, [1.0], repeats=reps([1, 0, 1, 1])), Measured(4, 1, [1.0], repeats=reps([1, 1, 0, 1]))]
    pts[1].repeats = [dict(r, wall_s=0.5) for r in pts[1].repeats]  # twice the goodput at concurrency 1
    g, _ = section(pts, {"ttft": 100.0}, "concurrency", "mtp")
    assert g["schedule"] == [[1, 1, 1], [2, 4, 0]]
    assert g["run"] == [[1, 4, 0]] and g["speculative_config"] is None
    assert g["why"].startswith("the per-load choices (run k = 1 up to concurrency 1, no drafting above) would run")


@SETTINGS
@given(tables(), slos)
def test_the_sections_rows_carry_each_points_goodput_as_the_rule_has_it(table, slo):
    """Per point: goodput_rps as the choice ranks it, with its interval (``column_oracle``), the
    ratio to k = 0 (the ratio of geometric means) with the interval the choice read, where both were above 0 in every
    repeat, goodput_chosen and the adjusted p of the choice at that load; the SLO, its words and the rule beside
    them."""
    from mtpbench.tune.by_goodput import section
    from mtpbench.tune.goodput import RULE

    goodput = {key: [goodput_oracle(r, slo) for r in reps] for key, reps in table.items()}
    g, fields = section([Measured(b, k, [1.0], repeats=reps) for (b, k), reps in table.items()], slo, "batch", "mtp")
    open_loads = {b for (b, k), xs in goodput.items() if k == 0 and min(xs) > 0}
    family = family_of([Measured(*key, xs) for key, xs in goodput.items() if min(xs) > 0 and key[0] in open_loads])
    assert (g["slo"], g["slo_text"], g["rule"]) == (slo, describe(slo), RULE)
    assert g["unknown"] == [] and g["unknown_because"] is None
    chosen = {c["load"]: c for c in g["choices"]}
    assert set(g["notes"]) == {str(b) for (b, k), xs in goodput.items() if min(xs) == 0}  # a zero is said there

    def r4(x):
        return None if x is None else round(x, 4)

    for (b, k), xs in goodput.items():
        f = fields[b, k]
        want, ci = column_oracle(xs)
        assert f["goodput_rps"] == pytest.approx(want, abs=5.1e-5)
        assert (f["goodput_rps_ci_low"], f["goodput_rps_ci_high"]) == (
            (pytest.approx(ci[0], abs=5.1e-5), pytest.approx(ci[1], abs=5.1e-5)) if ci else (None, None))
        if k and (b, k, 0) in family:  # both above 0 in every repeat, 3 repeats or more: compared
            lo, hi, p, est = family[b, k, 0]
            assert f["goodput_ratio"] == pytest.approx(est, abs=5.1e-5)
            assert (f["goodput_ratio_ci_low"], f["goodput_ratio_ci_high"]) == pytest.approx((lo, hi), abs=1.1e-5)
            assert f["goodput_p"] == pytest.approx(p, rel=5e-3)  # shown to 3 significant digits
            assert f["goodput_decision"] == ("higher" if lo > 1 else "lower" if hi < 1 else "open")
        else:
            assert "goodput_ratio" not in f
        assert f["goodput_chosen"] == (chosen[b]["chosen"] == k)


def test_points_without_per_request_times_are_unknown_and_no_load_without_k0_is_chosen():
    """A point file from before goodput (no per-request times) leaves that point unknown, named with the load;
    a tune with no k = 0 anywhere has no choice, no run and no config."""
    from mtpbench.tune.by_goodput import UNKNOWN, section

    reps = [{"request_ttft_ms": [1.0], "request_tpot_ms": [1.0], "request_e2el_ms": [1.0], "wall_s": 1.0}] * 3
    old = [{"wall_s": 1.0}] * 3
    g, fields = section([Measured(2, 0, [1.0], repeats=reps), Measured(2, 1, [1.0], repeats=old)], {"ttft": 5.0},
                        "concurrency", "mtp")
    assert g["unknown"] == ["concurrency 2, k = 1"] and g["unknown_because"] == UNKNOWN
    assert fields[2, 1] == {} and fields[2, 0]["goodput_rps"] == 1.0 and fields[2, 0]["goodput_chosen"] is True
    assert g["run"] == g["schedule"] == [[1, 2, 0]] and g["speculative_config"] is None and g["why"] is None
    g, _ = section([Measured(1, 1, [1.0], repeats=reps)], {"ttft": 5.0}, "batch", "mtp")
    assert g["choices"] == [] and (g["schedule"], g["run"], g["decision"], g["why"], g["speculative_config"]) == (
        None, None, None, None, None)


def test_the_goodput_config_names_the_method():
    from mtpbench.tune.by_goodput import section

    fast = [{"request_ttft_ms": [1.0] * 4, "request_tpot_ms": [1.0] * 4, "request_e2el_ms": [1.0] * 4, "wall_s": w}
            for w in (0.50, 0.51, 0.49, 0.5)]
    slow = [dict(r, wall_s=r["wall_s"] * 4) for r in fast]
    g, _ = section([Measured(1, 0, [1.0], repeats=slow), Measured(1, 2, [1.0], repeats=fast)], {"e2el": 5.0},
                   "batch", "eagle3")
    assert g["run"] == [[1, 1, 2]] and g["speculative_config"] == {"method": "eagle3", "num_speculative_tokens": 2}
