"""``mtpbench tune``'s pure core: the choice rule, the schedule's ranges and sentence, and the prediction against
hand-made costs (points built from a known cost model must give that model back)."""

import pytest

from mtpbench.tune.choose import best_single_k, check_schedule, choose, decision, schedule, speculative_config
from mtpbench.tune.model import Measured, Model, expected_tokens, held_out, joint_acceptance


def noisy(x: float, n: int = 6, spread: float = 0.01) -> list[float]:
    """n repeats around x, +-spread (relative), symmetric: median x."""
    return [x * (1 + spread * (i - (n - 1) / 2) / n) for i in range(n)]


def point(load, k, tokps, rates=(), drafts=1000, n=6, spread=0.01):
    return Measured(load, k, noisy(tokps, n, spread), drafts if k else 0,
                    [round(r * drafts) for r in rates[:k]])


RATES = [0.8, 0.6, 0.45, 0.3375]  # joint; conditional 0.75 from position 2 on


def synthetic(loads=(1, 2, 4, 8), ks=(0, 1, 2, 3), tokps0=None, f=None, c=None, spread=0.0001):
    """Points that follow the model exactly: tokps(k) = tokps0 * E(k) / (1 + f + c k)."""
    tokps0 = tokps0 or {b: 100.0 * b ** 0.8 for b in loads}
    f = f or {b: 0.05 * b for b in loads}
    c = c or {b: 0.1 + 0.1 * b for b in loads}
    pts = []
    for b in loads:
        for k in ks:
            t = tokps0[b] if k == 0 else tokps0[b] * expected_tokens(RATES, k) / (1 + f[b] + c[b] * k)
            pts.append(point(b, k, t, RATES, drafts=100000, spread=spread))
    return pts, tokps0, f, c


def test_ties_go_to_the_smaller_k():
    # k = 2 is 0.5 % faster in median, well inside its repeats' spread of 10 %: a tie
    pts = [point(1, 0, 100.0, spread=0.1), point(1, 1, 99.0, RATES, spread=0.1), point(1, 2, 100.5, RATES, spread=0.1)]
    c = choose(pts)
    assert c.chosen == 0 and c.fastest == 2 and c.beaten_by[0] == []


def test_a_k_that_beats_every_other_beyond_noise_is_chosen():
    pts = [point(1, 0, 100.0), point(1, 1, 150.0, RATES), point(1, 2, 180.0, RATES), point(1, 3, 170.0, RATES)]
    c = choose(pts)
    assert c.chosen == 2 and c.fastest == 2
    assert c.beaten_by[0] == [1, 2, 3] and c.beaten_by[3] == [2] and c.beaten_by[2] == []


def test_the_smallest_unbeaten_k_wins_over_a_faster_median_within_noise():
    # k = 1 and k = 2 both beat k = 0; 2 is 1 % faster than 1, within their 10 % spread
    pts = [point(1, 0, 100.0, spread=0.01), point(1, 1, 150.0, RATES, spread=0.1), point(1, 2, 151.5, RATES, spread=0.1)]
    c = choose(pts)
    assert c.chosen == 1 and c.fastest == 2 and c.beaten_by[0] == [1, 2] and c.beaten_by[1] == []


def test_too_few_repeats_beat_nothing():
    pts = [point(1, 0, 100.0, n=2), point(1, 1, 200.0, RATES, n=2)]
    assert choose(pts).chosen == 0  # no interval from 2 + 2 repeats: nothing shown faster


def test_the_model_recovers_hand_made_costs_and_predicts_unmeasured_k_and_loads():
    pts, tokps0, f, c = synthetic()
    m = Model(pts, k_max=4)
    for b in (1, 2, 4, 8):
        got = m.costs[b]
        assert got.source == "measured"
        assert got.f == pytest.approx(f[b], abs=1e-3) and got.c == pytest.approx(c[b], abs=1e-3)
        assert got.tokps0 == pytest.approx(tokps0[b])
    # acceptance pooled over the points that reach each position; position 4 continues the last conditional rate
    assert joint_acceptance(pts, 4) == pytest.approx(RATES, abs=1e-3)
    # k = 4 was never measured
    want = tokps0[2] * expected_tokens(RATES, 4) / (1 + f[2] + c[2] * 4)
    assert m.predict(4, 2) == pytest.approx(want, rel=1e-3)
    # a load between measured ones: costs interpolated in log2(load)
    at3 = m.costs_at(3)
    assert at3.source == "interpolated"
    w = 0.5849625007211562  # log2(3) - log2(2)
    assert at3.c == pytest.approx(c[2] + w * (c[4] - c[2]), abs=1e-3)
    assert at3.tokps0 == pytest.approx(100.0 * 3 ** 0.8, rel=1e-6)  # a power law of the load: exact
    # beyond the largest: the nearest load's drafting costs
    at16 = m.costs_at(16)
    assert at16.source == "extrapolated" and at16.c == pytest.approx(c[8], abs=1e-3)
    assert at16.tokps0 == pytest.approx(100.0 * 16 ** 0.8, rel=1e-6)
    # below the smallest measured load, from the two above it: never below 0
    assert Model([p for p in pts if p.load > 1]).costs_at(1).tokps0 == pytest.approx(100.0, rel=1e-6)


def test_held_out_predictions_of_an_exact_model_are_exact():
    pts, *_ = synthetic()
    for p in pts:
        if p.k > 0:
            assert held_out(pts, p) == pytest.approx(p.median, rel=2e-3), (p.load, p.k)


def test_the_predicted_best_k_falls_with_load():
    pts, *_ = synthetic()
    m = Model(pts, k_max=4)
    assert m.best_k(1, [0, 1, 2, 3, 4]) >= 2
    assert m.best_k(8, [0, 1, 2, 3, 4]) == 0  # c = 0.9 at batch 8: drafting never pays


def test_schedule_ranges_start_at_1_cover_every_load_and_switch_where_the_model_says():
    pts, *_ = synthetic()
    m = Model(pts)
    choices = [choose([p for p in pts if p.load == b]) for b in (1, 2, 4, 8)]
    ks = [c.chosen for c in choices]
    assert ks == sorted(ks, reverse=True) and ks[0] > 0 and ks[-1] == 0
    ranges = schedule(choices, m)
    assert ranges[0][0] == 1 and ranges[-1][1] == 8
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous
    assert all(a[2] != b[2] for a, b in zip(ranges, ranges[1:]))  # merged
    for (s, e, k) in ranges:
        for b in (1, 2, 4, 8):
            if s <= b <= e:
                assert k == dict(zip((1, 2, 4, 8), ks))[b]
    # a boundary inside (4, 8] is where the prediction says the next k is at least as fast
    for (s, e, k), (s2, _, k2) in zip(ranges, ranges[1:]):
        assert m.predict(k2, s2) >= m.predict(k, s2) or s2 in (1, 2, 4, 8)
    cfg = speculative_config(ranges)
    assert check_schedule(cfg["num_speculative_tokens_per_batch_size"], cfg["num_speculative_tokens"]) is None
    assert cfg["num_speculative_tokens"] == max(ks)


def test_a_schedule_that_never_drafts_is_no_speculative_config():
    assert speculative_config([[1, 16, 0]]) is None
    assert decision([[1, 16, 0]], "batch") == "don't draft at any load measured (batch 1-16)"
    assert speculative_config([[1, 16, 2]]) == {"method": "mtp", "num_speculative_tokens": 2}


def test_the_decision_reads_as_one_sentence():
    assert decision([[1, 2, 3], [3, 8, 1], [9, 16, 0]], "batch") == \
        "run k = 3 up to batch 2, k = 1 up to 8, no drafting above"
    assert decision([[1, 1, 0], [2, 2, 1], [3, 8, 0]], "batch") == \
        "no drafting up to batch 1, k = 1 up to 2, no drafting above"


@pytest.mark.parametrize("ranges,k,why", [
    ([], 2, "non-empty"),
    ([[2, 8, 1]], 1, "start at 1"),
    ([[1, 4, 2], [4, 8, 1]], 2, "overlap"),
    ([[1, 4, 2], [6, 3, 1]], 2, "start must be <= end"),
    ([[1, 4, -1]], 2, ">= 0"),
    ([[0, 4, 1]], 1, "positive"),
    ([[1, 4, 2, 9]], 2, "three integers"),
    ([[1, 4, 0]], 0, "num_speculative_tokens > 0"),
])
def test_schedules_vllm_refuses_are_named(ranges, k, why):
    assert why in check_schedule(ranges, k)


def test_the_best_single_k_maximises_the_geometric_mean_speedup():
    pts = [point(1, 0, 100.0), point(1, 1, 200.0, RATES), point(1, 2, 260.0, RATES),
           point(8, 0, 800.0), point(8, 1, 700.0, RATES), point(8, 2, 500.0, RATES)]
    # k = 1: sqrt(2.0 * 0.875) = 1.32; k = 2: sqrt(2.6 * 0.625) = 1.27; k = 0: 1
    assert best_single_k(pts) == 1


def test_a_saved_sweep_config_comes_back_as_it_ran():
    """--from --validate reruns the sweeps' own workload: run.json's config back as the SweepConfig."""
    import math

    from mtpbench.config import SweepConfig
    from mtpbench.tune.run import saved_config

    cfg = SweepConfig(backend="vllm-server", k=(0, 2), mtp_layers=(1,), concurrency=(1, 4), request_rate=(math.inf, 2.0),
                      engine_args={"enforce_eager": True}, header=("X-A",), max_tokens=32)
    assert saved_config(cfg.to_json()) == cfg
    assert saved_config({**cfg.to_json(), "a_field_from_the_future": 1}) == cfg
