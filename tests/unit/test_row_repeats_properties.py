"""A row of several timed runs takes every statistic from the same runs (issue 44, case 10): tokens/s, req/s and
decode time are each the geometric mean over the runs of that run's own figure (issue 55: the statistic the speedup
is a ratio of), so tokens/s / req/s is the tokens each request has. The oracle is written here (the geometric mean
of each run's figure computed by hand, the t interval on the logs from scipy's t law), never by calling the code
under test. No model."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.metrics import BatchRecord, GridPoint, PointResult, PointRun, RequestRecord, summarize
from mtpbench.metrics.row import TIMING_FIELDS
from mtpbench.sweep.table import table

POINT = GridPoint("plain", 0, 0, 4)  # a served point: concurrency 4, all at once


def run_of(windows: list[float], tokens: list[list[int]]) -> PointRun:
    """A point's timed runs: run r's window ``windows[r]`` s, its requests' output lengths ``tokens[r]``."""
    run = PointRun()
    for wall, lengths in zip(windows, tokens):
        reqs = [RequestRecord("all", 5, list(range(n)), 0.01, 0.01 + 0.001 * n, prompt_id=str(i))
                for i, n in enumerate(lengths)]
        run.add_repeat(reqs, [BatchRecord("all", wall)])
    return run


def row_of(run: PointRun) -> PointResult:
    return summarize("vllm-server", POINT, "all", run.requests, run.batches, None, repeats=run.repeats)


def test_windows_of_4_1_1_s_with_10_tokens_a_request_give_10_tokens_a_request():
    """The issue's example: 8 requests of 10 tokens in windows of 4, 1 and 1 s. req/s was the first run's 2.0 beside
    the runs' typical tokens/s (40 tokens a request); each is now the geometric mean of the runs' own figures (20, 80,
    80 tok/s; 2, 8, 8 req/s; windows 4, 1, 1 s), so tokens/s / req/s is 10, and tokens/s x decode time 80 tokens."""
    row = row_of(run_of([4.0, 1.0, 1.0], [[10] * 8] * 3))
    assert row.num_repeats == 3
    assert row.output_tokens_per_sec == pytest.approx(128000 ** (1 / 3), abs=0.005)  # 50.40
    assert row.request_throughput_per_sec == pytest.approx(128 ** (1 / 3), abs=5e-5)  # 5.040
    assert row.output_tokens_per_sec / row.request_throughput_per_sec == pytest.approx(10, abs=1e-3)
    assert row.decode_time_s == pytest.approx(4 ** (1 / 3), abs=5e-5)
    assert row.num_output_tokens / row.decode_time_s == pytest.approx(row.output_tokens_per_sec, abs=0.01)


def geometric(xs: list[float]) -> float:
    """The geometric mean: the n-th root of the product, by logs (math.fsum)."""
    return math.exp(math.fsum(math.log(x) for x in xs) / len(xs))


def log_t_interval(xs: list[float]) -> tuple[float, float] | None:
    """The 95 % t interval of a geometric mean: exp(mean log -+ t(0.975, n - 1) s / sqrt(n)); None below 3 runs."""
    from scipy.stats import t as t_law  # imported here: the unit tier collects without scipy.stats' start-up

    n = len(xs)
    if n < 3:
        return None
    logs = [math.log(x) for x in xs]
    m = math.fsum(logs) / n
    s = math.sqrt(math.fsum((v - m) ** 2 for v in logs) / (n - 1))
    half = t_law.ppf(0.975, n - 1) * s / math.sqrt(n)
    return math.exp(m - half), math.exp(m + half)


@st.composite
def runs(draw):
    """2 to 8 timed runs of the same prompts; each run its own window and, where ``same`` is false, its own output
    lengths (sampling)."""
    n_runs, n_requests = draw(st.integers(2, 8)), draw(st.integers(1, 12))
    windows = draw(st.lists(st.floats(0.05, 20.0), min_size=n_runs, max_size=n_runs))
    if draw(st.booleans()):  # every request of every run the same length: tokens/s / req/s is that length
        tokens = [[draw(st.integers(1, 64))] * n_requests] * n_runs
    else:
        tokens = draw(st.lists(st.lists(st.integers(1, 64), min_size=n_requests, max_size=n_requests),
                               min_size=n_runs, max_size=n_runs))
    return windows, tokens


@settings(max_examples=300, deadline=None)
@given(runs())
def test_every_timing_of_a_row_is_the_geometric_mean_of_the_same_runs(data):
    windows, tokens = data
    row = row_of(run_of(windows, tokens))
    tokps = [sum(t) / w for t, w in zip(tokens, windows)]
    reqps = [len(t) / w for t, w in zip(tokens, windows)]
    assert row.num_repeats == len(windows)
    assert row.output_tokens_per_sec == pytest.approx(geometric(tokps), abs=0.0051)
    assert row.request_throughput_per_sec == pytest.approx(geometric(reqps), abs=5.1e-5)
    assert row.decode_time_s == pytest.approx(geometric(windows), abs=5.1e-5)
    for x in (row.request_throughput_per_sec, row.decode_time_s):
        assert round(x, 4) == x  # to 4 decimals, as the single run's
    ci = log_t_interval(reqps)
    got = (row.request_throughput_per_sec_ci_low, row.request_throughput_per_sec_ci_high)
    assert got == ((None, None) if ci is None else (pytest.approx(ci[0], abs=5.1e-5), pytest.approx(ci[1], abs=5.1e-5)))
    if ci is not None:
        assert got[0] <= row.request_throughput_per_sec <= got[1]
    lengths = {n for t in tokens for n in t}
    if len(lengths) == 1:  # tokens a request, from the two figures printed side by side, within their rounding
        per = lengths.pop()
        tok, req = row.output_tokens_per_sec, row.request_throughput_per_sec
        assert abs(tok / req - per) <= (0.005 + per * 5e-5) / (req - 5e-5) + 1e-9


def test_one_timed_run_is_its_own_figures():
    row = row_of(run_of([4.0], [[10] * 8]))
    assert (row.output_tokens_per_sec, row.request_throughput_per_sec, row.decode_time_s) == (20.0, 2.0, 4.0)
    assert row.request_throughput_per_sec_ci_low is None and row.num_repeats == 1


def test_a_point_file_without_per_run_windows_leaves_req_s_and_decode_time_unknown_and_says_why():
    """Point files from before the runs kept their wall time and requests (tokens/s per run only): tokens/s is the
    runs' geometric mean, and the first run's req/s beside it would not agree with it; unknown, with a note."""
    run = run_of([4.0, 1.0, 1.0], [[10] * 8] * 3)
    run.repeats = [{"output_tokens_per_sec": r["output_tokens_per_sec"], "ttft_ms_p50": r["ttft_ms_p50"]}
                   for r in run.repeats]
    row = row_of(run)
    assert row.output_tokens_per_sec == pytest.approx(128000 ** (1 / 3), abs=0.005)
    assert row.request_throughput_per_sec is None and row.decode_time_s is None
    assert row.request_throughput_per_sec_ci_low is None
    assert "req/s and decode time" in row.notes and "3 timed runs" in row.notes


def test_a_run_of_no_window_is_left_out_of_tokens_s_req_s_and_decode_time_alike():
    """A timed run whose window is 0 s has no rate: tokens/s, req/s and decode time are the other runs' geometric
    means (80 and 40 tok/s, 8 and 4 req/s, 1 and 2 s)."""
    row = row_of(run_of([0.0, 1.0, 2.0], [[10] * 8] * 3))
    assert row.output_tokens_per_sec == pytest.approx(math.sqrt(3200), abs=0.005)
    assert row.request_throughput_per_sec == pytest.approx(math.sqrt(32), abs=5e-5)
    assert row.decode_time_s == pytest.approx(math.sqrt(2), abs=5e-5)


@pytest.mark.parametrize("kept", ["wall_s", "request_e2el_ms"])
def test_a_run_that_kept_its_window_or_its_requests_but_not_both_gives_no_req_s(kept):
    run = run_of([4.0, 1.0, 1.0], [[10] * 8] * 3)
    run.repeats = [{"output_tokens_per_sec": r["output_tokens_per_sec"], kept: r[kept]} for r in run.repeats]
    row = row_of(run)
    assert row.request_throughput_per_sec is None and row.decode_time_s is None and "req/s" in row.notes


def test_the_interval_of_req_s_is_a_timing_column_and_shown_in_the_table():
    assert {"request_throughput_per_sec_ci_low", "request_throughput_per_sec_ci_high"} <= set(TIMING_FIELDS)
    cols = PointResult.columns()
    i = cols.index("request_throughput_per_sec")
    assert cols[i + 1: i + 3] == ["request_throughput_per_sec_ci_low", "request_throughput_per_sec_ci_high"]
    row = row_of(run_of([1.0, 1.1, 1.2, 0.9, 1.0, 1.3], [[10] * 8] * 6))
    # the geometric mean of 8 / window over the six runs, its t interval on the logs (exp(2.007 -+ 2.571 x 0.0542))
    assert req_s_cell(row) == "7.44 [6.46, 8.57]"
    assert req_s_cell(row_of(run_of([4.0, 1.0], [[1] * 8] * 2))) == "4*"  # no interval from 2 runs


def req_s_cell(row: PointResult) -> str:
    """The table's req/s cell, cut at its column's rule (``-----``) under the header."""
    header, rule, line = table([row]).splitlines()[:3]
    spans = [m.span() for m in re.finditer(r"-+", rule)]
    names = [header[a:b].strip() for a, b in spans]
    a, b = spans[names.index("req/s")]
    return line[a:b].strip()


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(0, 9)), st.one_of(st.none(), st.integers(0, 9)), st.integers(1, 8),
       st.one_of(st.none(), st.integers(1, 20)), st.lists(st.integers(0, 3), max_size=6),
       st.lists(st.integers(0, 3), max_size=3))
def test_a_sweeps_family_and_looks_are_what_run_json_saved_else_what_its_points_and_rounds_give(
        family, looks, repeats, max_repeats, ks, failed_ks):
    """The family and looks every speedup of a sweep is judged at (issue 44): run.json's, saved before any point
    was measured; for a sweep from before that, its k > 0 points (failed ones too) and one look a round from
    max(--repeats, 3) to --max-repeats (1 without more rounds than --repeats); never below 1."""
    from mtpbench.sweep.load import judge_of

    saved = {k: v for k, v in (("family", family), ("looks", looks)) if v is not None}
    run = {"config": {"repeats": repeats, "max_repeats": max_repeats}, **({"judge": saved} if saved else {})}
    points = [{"point": {"k": k}} for k in ks]
    failures = [{"point": {"k": k}} for k in failed_ks]
    want_family = family if family is not None else sum(k > 0 for k in ks + failed_ks)
    most = max_repeats or repeats
    want_looks = looks if looks is not None else (max(1, most - max(repeats, 3) + 1) if most > repeats else 1)
    assert judge_of(run, points, failures) == (max(1, want_family), max(1, want_looks))


def _runs(speeds: list[float], rounds: list[int | None]) -> list[dict]:
    return [{"output_tokens_per_sec": s, "round": r} for s, r in zip(speeds, rounds)]


_speed = st.floats(50.0, 200.0, allow_nan=False)
_round = st.one_of(st.none(), st.integers(0, 4))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_speed, _round), min_size=1, max_size=6),
       st.lists(st.tuples(_speed, _round), min_size=1, max_size=8),
       st.one_of(st.none(), st.tuples(st.lists(st.tuples(_speed, _round), max_size=8),
                                      st.lists(st.tuples(_speed, _round), max_size=8))),
       st.integers(1, 6), st.integers(1, 5))
def test_a_sweeps_speedup_reads_both_points_and_the_floor_up_to_the_points_last_round(
        point, base, noise_runs, family, looks):
    """A sweep row's speedup (issue 44) is the comparison its rounds made at the point's last look: the point's
    runs over its k = 0's runs up to the last round the point was timed in (all of them where any run has no
    round), the interval widened to the A/A floor from the control's runs up to that round (the two copies cut to
    the same count; 0 without a control), at the sweep's family and looks. The runs are chosen here by hand;
    ``judge.ratio`` and ``noise.floor`` (tested on their own) give the figures of the chosen runs."""
    from mtpbench.stats import judge, noise
    from mtpbench.sweep.load import speedup_comparison

    rounds = [r for _, r in point]
    last = None if None in rounds else max(rounds)

    def upto(runs):
        return [s for s, r in runs if last is None or r is None or r <= last]

    if noise_runs:
        a, b = upto(noise_runs[0]), upto(noise_runs[1])
        n = min(len(a), len(b))
        floor = noise.floor(a[:n], b[:n]) or 0.0
    else:
        floor = 0.0
    want = judge.ratio([s for s, _ in point], upto(base), floor, family, looks)
    got = speedup_comparison(_runs(*zip(*point)), _runs(*zip(*base)),
                             None if noise_runs is None else tuple(_runs(*zip(*x)) if x else [] for x in noise_runs),
                             family, looks)
    assert (got.family, got.looks, got.level) == (family, looks, judge.level(family, looks))
    assert got.floor == pytest.approx(floor)
    assert got == want


def test_a_k0_run_after_the_points_last_round_is_not_in_its_speedup():
    """k = 0 timed again in round 2 at half speed; the point stopped at round 1: its speedup reads k = 0's rounds
    0 and 1 only (x1.5 exactly, not the x2 the slow run would pull it toward)."""
    from mtpbench.sweep.load import speedup_comparison

    point = _runs([150.0, 150.0, 150.0], [0, 0, 1])
    base = _runs([100.0, 100.0, 100.0, 50.0, 50.0], [0, 0, 1, 2, 2])
    assert speedup_comparison(point, base, None, 1, 1).estimate == pytest.approx(1.5)


TIMING_COLUMNS = (("output_tokens_per_sec", 2), ("ttft_ms_p50", 3), ("tpot_ms_p50", 3), ("itl_ms_p50", 3),
                  ("e2el_ms_p50", 3))  # each as the table keeps it: tokens/s to 2 decimals, milliseconds to 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(*[st.floats(0.5, 2000.0) for _ in TIMING_COLUMNS]), min_size=2, max_size=8),
       st.sampled_from([None, "itl_ms_p50"]))
def test_every_timing_column_is_the_runs_geometric_mean_with_its_t_interval(values, unobserved):
    """Issue 55 case 7, every timing a row of several runs carries: the geometric mean of the runs' own figure and
    the t interval on their logs (from 3 runs; none below), each kept to its column's decimals; a figure no run
    observed (ITL offline) is not made up."""
    from mtpbench.metrics.row import repeat_intervals

    repeats = [{name: (None if name == unobserved else v) for (name, _), v in zip(TIMING_COLUMNS, run)}
               for run in values]
    got = repeat_intervals(repeats)
    for i, (name, nd) in enumerate(TIMING_COLUMNS):
        if name == unobserved:
            assert name not in got and f"{name}_ci_low" not in got
            continue
        xs = [run[i] for run in values]
        assert got[name] == pytest.approx(geometric(xs), abs=0.51 * 10 ** -nd) and round(got[name], nd) == got[name]
        ci = log_t_interval(xs)
        low, high = got[f"{name}_ci_low"], got[f"{name}_ci_high"]
        if ci is None:
            assert low is None and high is None
            continue
        assert low == pytest.approx(ci[0], abs=0.51 * 10 ** -nd) and high == pytest.approx(ci[1], abs=0.51 * 10 ** -nd)
        assert round(low, nd) == low and round(high, nd) == high
