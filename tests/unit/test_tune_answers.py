"""tune's answers against the numbers beside them (issue 44, cases 2, 3, 5, 8 and 9), end to end through
``analyse``, ``facts`` and ``reasons`` on hand-made points: the reason why nothing is drafted, the reliability flags
and the answer by goodput. Oracles are written here from the rules in tune/reliable.py and tune/markdown.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mtpbench.stats import judge
from mtpbench.tune.analyse import analyse, controls
from mtpbench.tune.markdown import goodput_headline, why_not
from mtpbench.tune.model import Measured
from mtpbench.tune.points import Sweeps
from mtpbench.tune.reliable import facts, goodput_reasons, reasons

RATES = [800, 480]  # drafts accepted at positions 0 and 1 of 1000: AL 1.8 at k = 1


def point(load: int, k: int, tokps, repeats=None, noise=None) -> Measured:
    return Measured(load, k, [float(x) for x in tokps], 1000 if k else 0, RATES[:k], repeats or [], 1, noise)


def sweeps(points: list[Measured]) -> Sweeps:
    return Sweeps(points, "native", "batch", "chain", 1, [], {"config": {}})


def answer(points: list[Measured], slo=None) -> tuple[dict, list[str]]:
    result = analyse(sweeps(points), slo=slo)
    return result, reasons(facts(result, []))


# --- case 9: why nothing is drafted --------------------------------------------------------------------------------

cost_row = st.fixed_dictionaries({"load": st.integers(1, 64), "c": st.floats(0.01, 2),
                                  "need": st.one_of(st.none(), st.floats(1, 4)),
                                  "have": st.one_of(st.none(), st.floats(1, 4)),
                                  "source": st.sampled_from(["measured", "measured", "interpolated"])})


@settings(max_examples=300, deadline=None)
@given(st.lists(cost_row, min_size=1, max_size=5, unique_by=lambda c: c["load"]), st.booleans(), st.booleans())
def test_why_nothing_is_drafted_gives_the_cost_only_where_the_numbers_agree(rows, chosen, as_json):
    """The costs are the reason only where the measured acceptance falls short of break-even at every measured
    load; where it exceeds it somewhere, the reason is noise and that load's figures are named."""
    key = (lambda k: str(k)) if as_json else (lambda k: k)  # tune.json reads its int keys back as strings
    costs = [{"load": r["load"], "c": r["c"], "source": r["source"],
              "break_even_acceptance_length": {} if r["need"] is None else {key(1): r["need"]},
              "acceptance_length": {} if r["have"] is None else {key(1): r["have"]}} for r in rows]
    result = {"choices": [{"chosen": int(chosen and i == 0)} for i in range(len(rows))], "costs": costs,
              "unit": "batch"}
    text = why_not(result)
    if chosen:
        assert text is None
        return
    known = [r for r in rows if r["source"] == "measured" and r["need"] is not None and r["have"] is not None]
    assert text.startswith("No k beat plain decoding beyond noise at any batch measured.")
    pays = [r for r in known if r["have"] >= r["need"]]
    if not known:
        assert text == "No k beat plain decoding beyond noise at any batch measured."
    elif pays:
        assert "The costs do not explain it" in text and "breaks even only" not in text
        for r in pays:
            assert f"batch {r['load']}: {r['have']:.2f} against {r['need']:.2f}" in text
    else:
        assert "breaks even only at an acceptance length of" in text and "do not explain" not in text


def test_case_9_the_cause_named_is_noise_where_acceptance_pays():
    """Issue 44, case 9: "k = 1 breaks even only at an acceptance length of 1.33; the measured per-position
    acceptance gives 1.60" said as the reason where 1.60 > 1.33 says drafting should pay."""
    result = {"choices": [{"chosen": 0}], "unit": "batch",
              "costs": [{"load": 1, "c": 0.3, "break_even_acceptance_length": {"1": 1.33},
                         "acceptance_length": {"1": 1.6}, "source": "measured"}]}
    text = why_not(result)
    assert "breaks even only" not in text and "batch 1: 1.60 against 1.33" in text and "noise" in text


# --- case 2: the held-out error only where the schedule uses the prediction ----------------------------------------

def test_case_2_a_two_load_tune_is_not_flagged_for_an_extrapolation_it_never_uses():
    """Noiseless batch 1 (100 / 130 tok/s) and batch 4 (380 / 418): k = 1 at both loads, one range, no boundary the
    model places. Its held-out error at k = 0 (one load predicted from the other unscaled) is large, and unread."""
    pts = [point(1, 0, [100] * 3), point(1, 1, [130] * 3), point(4, 0, [380] * 3), point(4, 1, [418] * 3)]
    result, why = answer(pts)
    assert [c["chosen"] for c in result["choices"]] == [1, 1] and result["run"] == [[1, 4, 1]]
    assert result["prediction"]["held_out_abs_error_max"] > 0.25  # the old rule flagged this
    assert result["prediction"]["held_out_used_max"] is None and why == []


def test_where_the_model_places_a_boundary_its_held_out_error_is_read():
    """k = 2 at batch 1, k = 1 at batch 8: the boundary between them is the model's; the worst held-out error of the
    k > 0 points chosen on either side is read. A schedule that would run a load at k = 0 beside drafting ones is
    not what tune runs (one k at every load instead), so it places no boundary and reads none."""
    pts = [point(1, 0, [100] * 3), point(1, 1, [130] * 3), point(1, 2, [150] * 3),
           point(8, 0, [700] * 3), point(8, 1, [840] * 3), point(8, 2, [800] * 3)]
    result, why = answer(pts)
    assert [c["chosen"] for c in result["choices"]] == [2, 1] and len(result["run"]) == 2
    errs = [abs(r["held_out_error"]) for r in result["rows"]
            if r["measured"] and r["k"] in (1, 2) and r["held_out_error"] is not None]
    assert errs and result["prediction"]["held_out_used_max"] == round(max(errs), 4)
    assert any("predicts badly" in w for w in why) == (max(errs) > 0.25)
    mixed = pts[:3] + [point(8, 0, [700] * 3), point(8, 1, [560] * 3), point(8, 2, [420] * 3)]
    result, _ = answer(mixed)
    assert [c["chosen"] for c in result["choices"]] == [2, 0] and len(result["run"]) == 1
    assert result["prediction"]["held_out_used_max"] is None


# --- case 3: "don't draft" beside a k > 0 shown above 1 ------------------------------------------------------------

def test_case_3_not_drafting_beside_an_open_k_is_the_default_and_said_so():
    """Three loads, k = 0..2: a family of nine comparisons. At batch 1, k = 1's uncorrected 95 % interval lies above
    1 but the family's does not: k = 0 is chosen there, its row reads open, the tune says not drafting is the default
    at batch 1, and why_not names noise (the acceptance pays), not the costs."""
    k0, k1 = [100, 103, 97], [111, 115.5, 107]
    pts = [point(1, 0, k0), point(1, 1, k1), point(1, 2, [60, 61, 59])]
    for b in (2, 4):
        pts += [point(b, 0, [100 * b] * 3), point(b, 1, [50 * b, 51 * b, 49 * b]), point(b, 2, [30 * b] * 3)]
    assert judge.ratio(k1, k0).low > 1  # the premise: the uncorrected interval is above 1
    result, why = answer(pts)
    row = next(r for r in result["rows"] if r["measured"] and (r["load"], r["k"]) == (1, 1))
    assert row["speedup_decision"] == "open" and row["speedup_ci_low"] < 1 < row["speedup_ci_high"]
    assert result["family"] == 9 and row["speedup_level"] == 1 - 0.05 / 9
    assert [c["chosen"] for c in result["choices"]] == [0, 0, 0]
    assert any(w.startswith("not drafting at batch 1 is the default") for w in why)
    text = why_not(result)
    assert "The costs do not explain it" in text


# --- case 5: the answer by goodput carries its reliability ---------------------------------------------------------

def runs(goodputs: list[float], requests: int = 10) -> list[dict]:
    """Timed runs of ``requests`` requests in 1 s each, the first ``g`` of which meet a TTFT target of 100 ms."""
    return [{"request_ttft_ms": [1.0] * round(g) + [1e4] * (requests - round(g)), "request_tpot_ms": [1.0] * requests,
             "request_e2el_ms": [1.0] * requests, "wall_s": 1.0, "output_tokens_per_sec": 100.0}
            for g in goodputs]


def test_case_5_a_goodput_choice_left_to_the_default_is_not_reliable_and_never_advises_validate():
    """Batch 4: k = 0's goodput [0, 0, 8] (no ratio can be taken), k = 1's [6, 6, 6]; batch 1: k = 1 clearly more.
    By goodput: k = 1 at batch 1, not drafting at batch 4 only because nothing could be tested there: the default,
    said; the mixed schedule's note does not point at --validate, which does not measure goodput."""
    pts = [point(1, 0, [100] * 3, runs([3, 3, 3])), point(1, 1, [100] * 3, runs([8, 8, 8])),
           point(4, 0, [100] * 3, runs([0, 0, 8])), point(4, 1, [100] * 3, runs([6, 6, 6]))]
    result = analyse(sweeps(pts), slo={"ttft": 100.0})
    f = facts(result, [])
    g = result["goodput"]
    assert [c["chosen"] for c in g["choices"]] == [1, 0] and f["goodput_undecided"] == [4]
    g["unreliable_because"] = goodput_reasons(f)
    assert g["unreliable_because"][0].startswith("not drafting at batch 4 is the default")
    assert "--validate" not in (g["why"] or "") and "not reliable: not drafting at batch 4" in goodput_headline(result)


# --- case 8: drift flagged at its stated rate -------------------------------------------------------------------

def test_case_8_a_steady_machine_is_called_drifted_at_most_5_percent_of_five_sweep_tunes():
    """iid lognormal timings (3 %), five sweeps of six rounds, each with its A/A control: the tune's drift flag
    (every control judged as one of five, stats.judge) fires in at most 5 % of tunes; the old rule (each control
    its own 5 % test) in about 1 - 0.95^5 = 23 %."""
    rng = np.random.default_rng(44)
    trials, flagged, old = 1000, 0, 0
    for _ in range(trials):
        pts = []
        for b in (1, 2, 4, 8, 16):
            k0, copy = (list(100 * b * np.exp(rng.normal(0, 0.03, 6))) for _ in range(2))
            noise = ([{"output_tokens_per_sec": x} for x in k0], [{"output_tokens_per_sec": x} for x in copy])
            pts.append(point(b, 0, k0, noise=noise))
            old += judge.ratio(copy, k0).decided
        flagged += any(c["decision"] != judge.OPEN for c in controls(pts))
    assert all(c["family"] == 5 for c in controls(pts))
    assert flagged / trials <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / trials)
    assert old / trials > 0.03  # each sweep's own test alone: 5 % a control, the flag above 15 % a tune


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(50, 200), min_size=0, max_size=6),
                          st.lists(st.floats(50, 200), min_size=0, max_size=6)), min_size=1, max_size=4),
       st.booleans())
@example([([100.0, 101.0, 99.0], [100.0, 104.0, 98.0]), ([90.0, 91.0, 92.0, 93.0], [80.0, 95.0, 90.0])], True)
def test_the_drift_controls_are_each_sweeps_aa_judged_as_one_family(sweeps, distractor):
    """tune's "the machine drifted" (analyse.controls), against the rule written here: one control a sweep (the
    A/A copy beside its k = 0, read once however many points share it), in load order, each the ratio of the
    copy's geometric mean over k = 0's on their common rounds, judged at a family of every sweep's control; a
    sweep whose runs give no ratio (fewer than 3 common rounds) has none. A k > 0 point's runs are never a control."""
    import math

    from mtpbench.tune.analyse import controls
    from mtpbench.tune.model import Measured

    def runs(xs):
        return [{"output_tokens_per_sec": x} for x in xs]

    points, want = [], []
    for i, (k0, aa) in enumerate(sweeps):
        load = 2 ** i
        noise = (runs(k0), runs(aa))
        points += [Measured(load, 0, k0 or [1.0], noise=noise)] + [Measured(load, 1, [1.0], noise=noise)] * (i % 2)
        n = min(len(k0), len(aa))
        if n >= 3:
            ratio = math.exp(sum(map(math.log, aa[:n])) / n - sum(map(math.log, k0[:n])) / n)
            want.append((load, ratio))
    if distractor:  # a drafting point with runs of its own: never read as a control
        points.append(Measured(99, 2, [1.0], noise=(runs([100.0] * 3), runs([300.0] * 3))))
    got = controls(list(reversed(points)))
    assert [c["load"] for c in got] == [load for load, _ in want]
    assert all(c["estimate"] == pytest.approx(r, rel=1e-4) for c, (_, r) in zip(got, want))  # saved to 5 digits
    assert all(c["family"] == len(sweeps) for c in got)


# --- issue 55 case 9: one sweep, opposite answers, each page says why --------------------------------------------

def test_where_a_sweep_and_the_tune_answer_differently_the_tune_says_both_and_why():
    """Case 3's points, batch 1's sweep judging its 2 comparisons on its own (97.5 %): it calls k = 1 faster, the tune
    (9 comparisons, 99.44 %) leaves it open. The tune says both numbers and why; where the two agree it says nothing.
    The oracle: judge.ratio at each family, written here."""
    from mtpbench.tune.markdown import markdown

    k0, k1 = [100, 103, 97], [111, 115.5, 107]
    pts = [point(1, 0, k0), point(1, 1, k1), point(1, 2, [60, 61, 59])]
    for b in (2, 4):
        pts += [point(b, 0, [100 * b] * 3), point(b, 1, [50 * b, 51 * b, 49 * b]), point(b, 2, [30 * b] * 3)]
    for p in pts:
        p.sweep_family, p.sweep = 2, f"sweeps/b{p.load}"
    alone, among = judge.ratio(k1, k0, family=2), judge.ratio(k1, k0, family=9)
    assert alone.decision == judge.ABOVE and among.decision == judge.OPEN  # the premise
    result, _ = answer(pts)
    said = result["sweep_disagreements"]
    assert len(said) == 1, said  # batch 1, k = 1 only: k = 2 and the other loads are slower in both
    assert said[0] == (f"batch 1, k = 1: the sweep sweeps/b1 on its own calls it faster than k = 0 "
                       f"(x{judge.end_text(alone.estimate, 1.0)} {judge.interval_text(alone.low, alone.high, 1.0)} "
                       f"at 97.5 %, one of its 2 comparisons); this tune judges it among its 9 comparisons at "
                       f"99.44 %: not told apart from k = 0 "
                       f"({judge.interval_text(among.low, among.high, 1.0)}): a larger family asks each comparison for "
                       f"more evidence; each answer holds its 5 % over its own family, and the tune's choice reads the "
                       f"tune's")
    result = {**result, "model": "m", "backend": "native", "provenance": {}, "unreliable_because": [],
              "validation": None}
    assert f"Where the sweep's own page answers otherwise: {said[0]}." in markdown(result)
    for p in pts:  # a sweep judged as the tune is: no disagreement to say
        p.sweep_family = 9
    assert answer(pts)[0]["sweep_disagreements"] == []
    for p in pts:  # k = 0 and k = 1 from different sweeps: no judgement either sweep made
        p.sweep_family, p.sweep = 2, f"sweeps/k{p.k}"
    assert answer(pts)[0]["sweep_disagreements"] == []
    # a sweep of 30 comparisons (99.83 %) against the tune's 9: k = 1 at [115, 118, 112] is faster in the tune,
    # open in the sweep: said the other way round, and why
    pts[1] = point(1, 1, [115, 118, 112])
    for p in pts:
        p.sweep_family, p.sweep = 30, "sweeps/all"
    assert judge.ratio([115, 118, 112], k0, family=30).decision == judge.OPEN  # the premise
    later = answer(pts)[0]["sweep_disagreements"]
    assert len(later) == 1 and later[0].startswith("batch 1, k = 1: the sweep sweeps/all on its own calls it not "
                                                   "told apart from k = 0"), later
    assert ": faster than k = 0 (" in later[0] and ("the tune judges fewer comparisons (points without a test are no "
                                                     "members), so each asks for less; each answer holds") in later[0]
    # the disagreement at k = 2 behind an agreement at k = 1 (both slower), then behind a k = 1 from another sweep:
    # each k of a load is read, whatever came before it
    pts = [point(1, 0, k0), point(1, 1, [60, 61, 59]), point(1, 2, k1)]
    for b in (2, 4):
        pts += [point(b, 0, [100 * b] * 3), point(b, 1, [50 * b, 51 * b, 49 * b]), point(b, 2, [30 * b] * 3)]
    for p in pts:
        p.sweep_family, p.sweep = 2, f"sweeps/b{p.load}"
    behind = answer(pts)[0]["sweep_disagreements"]
    assert len(behind) == 1 and behind[0].startswith("batch 1, k = 2: the sweep sweeps/b1 on its own calls it faster"), behind
    pts[1].sweep = "sweeps/other"
    assert answer(pts)[0]["sweep_disagreements"] == behind
