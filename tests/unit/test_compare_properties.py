"""compare's answers by property: each metric's verdict (``pair._verdict``), --fail-if-worse's list and exit code
(``pair.worse_beyond``, ``pair.exit_code``) and the page's headline (``page.headline``), checked against oracles
written here from the rules in docs/compare.md, never computed by the code under test.

The rules: a metric is better / worse when B - A is not 0 and its interval (stats.judge.difference, at the level of
its family) lies wholly on the side of B - A (an end at 0 is not beyond it), better in the metric's good direction; B - A = 0 is within noise, interval or not;
no interval (or a non-finite one) is "no interval". --fail-if-worse PCT fails on a point that failed in B or is
missing from B and on every metric over all prompts worse beyond noise by more than PCT % (from A = 0: at any PCT;
raw timings not while the k = 0 control drifted); PCT must be a finite number >= 0. The page is red exactly when the
gate fails at 0 % (so never green when it fails at any PCT), amber when something else speaks against B (a worse row
the gate sets aside, a point failed in A, a row without an interval that moved the bad way), green when some row is
better, plain otherwise; its sentence counts the rows of all prompts by verdict, the missing and the failed points."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.compare.page import headline
from mtpbench.compare.pair import _verdict as verdict_of
from mtpbench.compare.pair import check_pct, exit_code, unjudged_beyond, worse_beyond
from mtpbench.errors import MtpBenchError
from mtpbench.stats import judge


def _verdict(diff, ci, higher: bool) -> str:
    """The verdict of a row whose B - A is ``diff`` and whose interval is ``ci`` (A = 0, B = diff): the judge's
    comparison of it, in compare's words."""
    return verdict_of(judge.difference(None if diff is None else 0.0, diff, lambda level: ci), higher)

FAST = settings(max_examples=200, deadline=None)

# ---- one metric's verdict -------------------------------------------------------------------------------------

# values exact in binary, with 0 and the near-zero ends that decide a verdict
EDGE = st.sampled_from([-2.0, -0.5, -1e-9, 0.0, 1e-9, 0.5, 2.0])
FINITE = EDGE | st.floats(-1e6, 1e6)
ANY = FINITE | st.sampled_from([math.nan, math.inf, -math.inf])


def verdict_oracle(diff, ci, higher: bool) -> str:
    if diff == 0:
        return "within noise"
    if diff is None or ci is None or any(math.isnan(x) or math.isinf(x) for x in (diff, *ci)):
        return "no interval"
    good, bad = ("better", "worse") if higher else ("worse", "better")
    if diff > 0 and ci[0] > 0:
        return good
    if diff < 0 and ci[1] < 0:
        return bad
    return "within noise"


@FAST
@given(st.none() | ANY, st.none() | st.lists(ANY, min_size=2, max_size=2).map(sorted).map(tuple), st.booleans())
def test_a_metrics_verdict_follows_its_difference_and_interval(diff, ci, higher):
    assert _verdict(diff, ci, higher) == verdict_oracle(diff, ci, higher)


@FAST
@given(FINITE, st.lists(FINITE, min_size=2, max_size=2).map(sorted), st.booleans())
def test_a_verdict_turns_with_the_sign_and_with_the_direction(diff, ci, higher):
    lo, hi = ci
    swap = {"better": "worse", "worse": "better"}
    v = _verdict(diff, (lo, hi), higher)
    assert _verdict(diff, (lo, hi), not higher) == swap.get(v, v)
    assert _verdict(-diff, (-hi, -lo), higher) == swap.get(v, v)
    if v != "within noise":  # a verdict beyond noise never contradicts the sign of B - A
        assert diff != 0 and v == ("better" if (diff > 0) == higher else "worse")


def test_an_interval_ending_at_0_or_on_the_other_side_is_within_noise():
    assert _verdict(0.5, (0.0, 1.0), True) == "within noise"
    assert _verdict(-0.5, (-1.0, 0.0), True) == "within noise"
    assert _verdict(-0.5, (0.1, 1.0), True) == "within noise"  # a skewed bootstrap beyond 0 on the other side
    assert _verdict(0.0, None, True) == "within noise"
    assert _verdict(0.5, (math.nan, math.nan), True) == "no interval"  # was "within noise"


# ---- --fail-if-worse and the headline -------------------------------------------------------------------------

TIMINGS = ("output_tokens_per_sec", "ttft_ms_p50", "tpot_ms_p50")
HIGHER = {"acceptance_length": True, "draft_acceptance_rate": True, "acceptance_rate_per_pos[0]": True,
          "output_tokens_per_sec": True, "ttft_ms_p50": False, "tpot_ms_p50": False, "speedup": True}
VERDICTS = ("better", "worse", "within noise", "no interval")
# relative changes exact in binary, so that x * 100 against a threshold of the same sample meets it exactly
REL = st.none() | st.sampled_from([0.0, 1e-7, 0.125, -0.125, 0.25, -0.25, 0.5, -0.5, 1.5])
PCT = st.sampled_from([0.0, 12.5, 25.0, 50.0]) | st.floats(0, 200)


@st.composite
def compare_row(draw) -> dict:
    metric = draw(st.sampled_from(sorted(HIGHER)))
    return {"point": draw(st.sampled_from(["k0", "vllm-L1-k2", "vllm-L1-k3"])), "k": 2,
            "category": draw(st.sampled_from(["all", "all", "code"])), "metric": metric,
            "a": 2.0, "b": draw(st.sampled_from([0.5, 3.25, 120.0])),
            "diff": draw(st.none() | st.sampled_from([0.0, -1.5, -0.5, 0.5, 2.0])), "rel_diff": draw(REL),
            "ci_low": None, "ci_high": None, "verdict": draw(st.sampled_from(VERDICTS)),
            "higher_is_better": HIGHER[metric]}


@st.composite
def compare_result(draw) -> dict:
    failed = draw(st.lists(st.fixed_dictionaries({
        "point": st.sampled_from(["chain-k1", "chain-k2"]), "failed_in": st.sampled_from(["A", "B", "A and B"]),
        "error": st.just("boom")}), max_size=3))
    result = {"a": "runs/a", "b": "runs/b", "differences": [], "rows": draw(st.lists(compare_row(), max_size=8)),
              "failed": failed, "unpaired": [], "notes": [], "timings_drifted": draw(st.booleans())}
    missing = draw(st.none() | st.lists(st.sampled_from(["vllm-L1-k4", "vllm-L1-k5"]), max_size=2))
    if missing is not None:  # older compare.json has no missing_in_b
        result["missing_in_b"] = missing
    return result


def gate_oracle(result: dict, pct: float) -> list[str]:
    out = [f"{f['point']} failed in B" for f in result["failed"] if f["failed_in"] == "B"]
    out += [f"{p} missing in B" for p in result.get("missing_in_b") or []]
    for r in result["rows"]:
        counts = r["category"] == "all" and r["verdict"] == "worse"
        if not counts or (result["timings_drifted"] and r["metric"] in TIMINGS):
            continue
        if r["rel_diff"] is None:  # from A = 0: beyond any percentage
            out.append(f"{r['point']} {r['metric']} from 0 to {r['b']:.4g}")
        elif abs(r["rel_diff"]) * 100 > pct:
            out.append(f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %")
    return out


def tone_oracle(result: dict) -> str:
    rows = [r for r in result["rows"] if r["category"] == "all"]
    if gate_oracle(result, 0.0):
        return "bad"
    lost = [r for r in rows if r["verdict"] == "no interval" and r["diff"] and (r["diff"] > 0) != r["higher_is_better"]]
    if any(r["verdict"] == "worse" for r in rows) or any(f["failed_in"] != "B" for f in result["failed"]) or lost:
        return "warn"
    return "good" if any(r["verdict"] == "better" for r in rows) else "plain"


@FAST
@given(compare_result(), PCT)
def test_fail_if_worse_lists_what_the_rule_names_and_exits_on_it(result, pct):
    want = gate_oracle(result, pct)
    assert worse_beyond(result, pct) == want
    assert exit_code(result, pct) == (1 if want else 0)


@FAST
@given(compare_result(), PCT, PCT)
def test_a_wider_threshold_never_fails_more(result, p, q):
    lo, hi = sorted((p, q))
    assert set(worse_beyond(result, hi)) <= set(worse_beyond(result, lo))


@FAST
@given(compare_result(), PCT)
def test_the_headline_is_never_green_while_the_gate_fails(result, pct):
    text, tone = headline(result)
    assert tone == tone_oracle(result)
    if exit_code(result, pct):
        assert tone == "bad"


@FAST
@given(compare_result())
def test_the_headline_counts_the_rows_the_missing_and_the_failed_points(result):
    text, _ = headline(result)
    rows = [r for r in result["rows"] if r["category"] == "all"]
    n = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    m = re.fullmatch(r"B against A: (\d+) better, (\d+) worse, (\d+) within noise(, (\d+) without an interval)? "
                     r"\(of (\d+) rows\)(; (\d+) points? of A missing in B)?(; (\d+) points? failed in B)?"
                     r"(; (\d+) points? failed in A)?(; (\d+) points? failed in A and B)?"
                     r"(; (\d+) worse rows? that --fail-if-worse does not count( \(timings drifted\))?)?\.", text)
    assert m, text
    assert [int(m[i]) for i in (1, 2, 3, 6)] == [n["better"], n["worse"], n["within noise"], len(rows)]
    assert int(m[5] or 0) == n["no interval"] and (m[4] is None) == (n["no interval"] == 0)
    count = lambda i: 0 if m[i] is None else int(m[i])  # noqa: E731
    assert count(8) == len(result.get("missing_in_b") or [])
    for i, side in ((10, "B"), (12, "A"), (14, "A and B")):
        assert count(i) == sum(f["failed_in"] == side for f in result["failed"])
    counted = len(gate_oracle(result, 0.0)) - count(10) - count(8)  # the gate's entries that are rows
    assert count(16) == n["worse"] - counted
    assert (m[17] is not None) == (count(16) > 0 and result["timings_drifted"])
    for i in (8, 10, 12, 14, 16):  # a part with nothing to count is left out, not "0 points"
        assert m[i] is None or int(m[i]) > 0
    for i, word in ((8, 2), (10, 2), (12, 2), (14, 2), (16, 3)):  # "1 point", "2 points"; "1 worse row", "2 ... rows"
        assert m[i] is None or m[i - 1].split()[word].endswith("s") == (int(m[i]) != 1)


@FAST
@given(compare_result(), PCT)
def test_what_moved_without_an_interval_is_listed_beyond_the_threshold(result, pct):
    assert unjudged_beyond(result, pct) == [
        f"{r['point']} {r['metric']} {r['rel_diff'] * 100:+.1f} %" for r in result["rows"]
        if r["category"] == "all" and r["verdict"] == "no interval" and r["rel_diff"] is not None
        and abs(r["rel_diff"]) * 100 > pct]


def test_a_worse_row_the_gate_sets_aside_is_amber_and_said():
    row = {"point": "p", "category": "all", "metric": "speedup", "verdict": "worse", "rel_diff": 0.0, "diff": -1e-9,
           "b": 1.0, "higher_is_better": True}  # a relative change that rounds to 0
    result = {"rows": [row], "failed": [], "timings_drifted": False}
    assert headline(result) == ("B against A: 0 better, 1 worse, 0 within noise (of 1 rows); 1 worse row that "
                                "--fail-if-worse does not count.", "warn")
    drifted = {"rows": [{**row, "metric": "tpot_ms_p50", "rel_diff": 0.5}], "failed": [], "timings_drifted": True}
    assert headline(drifted) == ("B against A: 0 better, 1 worse, 0 within noise (of 1 rows); 1 worse row that "
                                 "--fail-if-worse does not count (timings drifted).", "warn")


def test_a_point_missing_in_b_makes_the_headline_red_issue_33_item_6():
    """B's sweep stopped before a point A measured: --fail-if-worse exits 1, and the headline said "1 better,
    0 worse" in green."""
    result = {"rows": [{"point": "vllm-L1-k2", "category": "all", "metric": "acceptance_length", "verdict": "better",
                        "rel_diff": 0.1, "diff": 0.2, "b": 2.2, "higher_is_better": True}],
              "failed": [], "missing_in_b": ["vllm-L1-k3"], "timings_drifted": False}
    assert exit_code(result, 5) == 1
    assert headline(result) == ("B against A: 1 better, 0 worse, 0 within noise (of 1 rows); 1 point of A missing "
                                "in B.", "bad")


def test_a_worse_metric_from_zero_fails_at_any_threshold():
    result = {"rows": [{"point": "p", "category": "all", "metric": "ttft_ms_p50", "verdict": "worse",
                        "rel_diff": None, "diff": 3.0, "b": 3.0, "higher_is_better": False}],
              "failed": [], "timings_drifted": False}
    assert worse_beyond(result, 1e9) == ["p ttft_ms_p50 from 0 to 3"]


@pytest.mark.parametrize("pct", [-1.0, -1e-9, math.nan, math.inf, -math.inf])
def test_a_threshold_that_is_no_percentage_is_refused(pct):
    with pytest.raises(MtpBenchError, match=r"^--fail-if-worse takes a percentage of 0 or more, got "):
        check_pct(pct)
    with pytest.raises(MtpBenchError):
        exit_code({"rows": [], "failed": []}, pct)


@pytest.mark.parametrize("pct", [0, 0.0, 5, 1e9])
def test_a_percentage_of_0_or_more_is_taken(pct):
    assert check_pct(pct) == pct and exit_code({"rows": [], "failed": []}, pct) == 0


@pytest.mark.parametrize("diff, higher, tone", [(0.5, True, "good"), (-0.5, True, "warn"), (0.5, False, "warn"),
                                                (-0.5, False, "good"), (0.0, True, "good")])
def test_a_row_without_an_interval_that_moved_the_bad_way_keeps_the_page_from_green(diff, higher, tone):
    better = {"point": "p", "category": "all", "metric": "acceptance_length", "verdict": "better", "rel_diff": 0.1,
              "diff": 0.2, "b": 2.2, "higher_is_better": True}
    unjudged = {"point": "p", "category": "all", "metric": "ttft_ms_p50", "verdict": "no interval", "rel_diff": 0.25,
                "diff": diff, "b": 1.0, "higher_is_better": higher}
    assert headline({"rows": [better, unjudged], "failed": [], "timings_drifted": False})[1] == tone


# ---- each row judged at the level of its family (pair.finish) ----------------------------------------------------

VALUE = st.sampled_from([None, 0.0, 0.5, 1.0, 2.0, 1.2345678])
# intervals of B - A whose ends need rounding at 6 decimals, decided either way or open
CI = st.sampled_from([(0.3456789, 1.7500001), (-2.5000001, -0.1234567), (-0.1234567, 0.3456789)])
P = st.sampled_from([(None, None), (0.01234567, 0.0123), (0.5, 0.5)])  # the judge's p, the p shown


@st.composite
def pending_rows(draw) -> list:
    """Rows of the "all" category and of two others, each judged (its interval at any level the same) or not (no
    interval: a table's numbers)."""
    from dataclasses import replace

    from mtpbench.compare.pair import Pending

    out = []
    for _ in range(draw(st.integers(0, 7))):
        a, b = draw(VALUE), draw(VALUE)
        judged = a is not None and b is not None and draw(st.booleans())
        ci, (p, shown) = draw(CI), draw(P)

        def judged_at(m, a=a, b=b, ci=ci, p=p):
            return replace(judge.difference(a, b, lambda lvl: ci, family=m), p_value=p)
        row = Pending("x", 2, draw(st.sampled_from(["all", "code", "chat"])), "acceptance_length", a, b,
                      draw(st.booleans()), 9, "paired prompts", judged_at if judged else None)
        out.append((row, ci if judged else None, shown if judged else None))
    return out


def _round_out(ci):
    return None if ci is None else (math.floor(ci[0] * 1e6) / 1e6, math.ceil(ci[1] * 1e6) / 1e6)


@FAST
@given(pending_rows())
def test_each_row_is_judged_at_the_level_of_its_family(rows):
    """The rows over all prompts with an interval are one family, those of the categories another: each judged row's
    level is 1 - 0.05 / its family's size; its verdict, interval (rounded outward at 6 decimals), p shown, B - A
    and relative change follow from its values; a row without an interval has none of them."""
    from mtpbench.compare.pair import finish

    family = {True: sum(r.category == "all" and r.judge is not None for r, _, _ in rows),
              False: sum(r.category != "all" and r.judge is not None for r, _, _ in rows)}
    out = finish([r for r, _, _ in rows])
    assert len(out) == len(rows)
    for got, (p, ci, shown) in zip(out, rows):
        diff = None if p.a is None or p.b is None else p.b - p.a
        assert (got.point, got.k, got.category, got.metric, got.higher_is_better, got.paired_prompts,
                got.values_from) == (p.point, p.k, p.category, p.metric, p.higher_is_better, p.paired, p.values_from)
        assert (got.a, got.b) == (p.a if p.a is None else round(p.a, 6), p.b if p.b is None else round(p.b, 6))
        assert got.diff == (None if diff is None else round(diff, 6))
        rel = None if diff is None else (diff / p.a if p.a else (0.0 if diff == 0 else None))
        assert got.rel_diff == (None if rel is None else round(rel, 6))
        assert got.verdict == verdict_oracle(diff, ci, p.higher_is_better)
        assert (got.ci_low, got.ci_high) == (_round_out(ci) or (None, None))
        assert got.p_value == shown
        expected = None if ci is None else 1 - 0.05 / family[p.category == "all"]
        assert got.level == (None if expected is None else pytest.approx(expected, rel=1e-12))


def test_the_two_families_levels_known_answer():
    """Three rows over all prompts with an interval (one without) and two category rows: 1 - 0.05/3 and 1 - 0.05/2;
    a judge that finds no interval at its level leaves its row with no level, no interval and "no interval"."""
    from mtpbench.compare.pair import Pending, finish

    def at(ci):
        return lambda m: judge.difference(1.0, 2.0, lambda lvl: ci, family=m)
    rows = [Pending("x", 2, cat, "acceptance_length", 1.0, 2.0, True, 9, "paired prompts", j)
            for cat, j in [("all", at((0.5, 1.5))), ("all", at((-0.5, 1.5))), ("all", at((0.5, 1.5))), ("all", None),
                           ("code", at((0.5, 1.5))), ("chat", at(None))]]
    out = finish(rows)
    assert [r.level for r in out] == [1 - 0.05 / 3, 1 - 0.05 / 3, 1 - 0.05 / 3, None, 1 - 0.05 / 2, None]
    assert [r.verdict for r in out] == ["better", "within noise", "better", "no interval", "better", "no interval"]
    assert [(r.ci_low, r.ci_high) for r in out][-2:] == [(0.5, 1.5), (None, None)]
    # B = A without an interval is within noise (no difference is within any noise); A = 0 < B has no relative change
    same = finish([Pending("x", 2, "all", "ttft_ms_p50", 0.0, 0.0, False, None, "each run's table", None),
                   Pending("x", 2, "all", "ttft_ms_p50", 0.0, 3.0, False, None, "each run's table", None)])
    assert [(r.verdict, r.rel_diff) for r in same] == [("within noise", 0.0), ("no interval", None)]


def test_a_change_of_exactly_the_threshold_does_not_fail():
    """--fail-if-worse PCT fails on worse by more than PCT %: -25 % at 25 does not, at 24.99 it does."""
    r = {"point": "x", "metric": "speedup", "category": "all", "verdict": "worse", "rel_diff": -0.25, "b": 1.5}
    result = {"rows": [r], "failed": []}
    assert worse_beyond(result, 25) == [] and worse_beyond(result, 24.99) == ["x speedup -25.0 %"]
