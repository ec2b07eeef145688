"""One threshold decides a page's table, its headline, its JSON and its verdict (issue 55 item 1, cases 4 and 5):
check-lossless's law table is decided at the level the verdict reads it at in that stage; the two-sample line shows
the p that decides and its level, never an interval at another level beside "lossless". No engine."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench import stats
from mtpbench.lossless.run import law_block
from tests.unit.test_acceptance_law_properties import chains
from tests.unit.test_lossless_stats import excess, two_sample


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2 ** 32 - 1), st.sampled_from([0.0, 0.03, 0.06, 0.1]), st.integers(0, 2),
       st.sampled_from([(stats.ALARM_LAW, "alarm"), (stats.CONFIRM_LAW, "confirmation")]))
def test_the_lossless_law_table_says_over_accepts_exactly_where_the_verdict_reads_it(seed, bump, at, stage):
    """Issue 55 case 4: lossless.md said "lossless" beside its own law line "over-accepts at position 0" (z +2.30):
    the table was two-sided at 0.05 / F, the verdict one-sided at 0.015 / F. Now each stage's table is decided at
    the level that stage's verdict reads: the alarm's in stage 1, the confirmation's in stage 2."""
    level, role = stage
    rng = np.random.default_rng(seed)
    steps = chains(rng, 150, 3, lambda r, i, last: r.beta(2, 1.5), bump=bump, at=at)
    block = law_block({"observable": True, "steps": [(0, i, x, a, None, None) for i, x, a in steps]}, level)
    evidence = stats.law_evidence(steps)
    read = {t.position for t in stats.verdict.over_accepting(evidence, level)}
    shown = {t["position"] for t in block["positions"] + [block["joint"]] if t["decision"] == "over-accepts"}
    assert shown == read, (shown, read)
    ok = two_sample(0.5)
    if role == "alarm":  # the alarm names over-acceptance exactly where the table shows it
        raised = stats.alarm(stats.Stage(ok, ok, None, evidence)) or ""
        assert ("over-accepts" in raised) == bool(read)
    else:  # a fresh stage confirms exactly where its table shows it
        first = stats.Stage(ok, ok, None, evidence)
        confirmed = stats.confirmation(first, stats.Stage(ok, ok, None, evidence)) or ""
        assert ("over-accepts again" in confirmed) == bool(read)


def test_lossless_is_never_printed_beside_an_interval_that_excludes_0():
    """Issue 55 case 5: "no difference detectable at this N, p = 0.0525" beside its own 95 % interval of the shift
    [+0.0021, +0.0450]. The line shows the p that decides and the level it is read at; its parts are named parts,
    and no interval at another level stands beside the verdict."""
    from mtpbench.lossless.report import _sampling_lines

    ab = stats.LosslessTest(0.0525, 0.027, 0.2, 1 / 2001, -2.0, -1.9765, 0.0235, 0.0021, 0.0450, 0.05, 96, 96, 12,
                            2000)
    ok, ex = two_sample(0.5), excess(0.3, 0.002)
    verdict, why = stats.lossless_verdict([stats.Stage(ab, ok, ex)])
    assert verdict == stats.LOSSLESS and "p = 0.0525" in why
    record = {"samples_per_prompt": 8, "why": why, "test": asdict(ab), "aa_test": asdict(ok), "alpha_aa": 0.01,
              "levels": stats.verdict.levels(stats.Stage(ab, ok, ex)), "detectable_shift": 0.05,
              "max_detectable_shift": 0.1}
    lines = _sampling_lines(record)
    line = next(x for x in lines if x.startswith("- off vs on"))
    assert "p = 0.0525 (the two-sample test, an alarm below 0.05" in line and "0.0021" not in line, line
    assert "0.045" not in " ".join(lines) and "CI" not in " ".join(lines), lines


def test_each_stages_two_sample_line_names_the_level_it_is_read_at():
    """Stage 1's p is read against the alarm's level, stage 2's against the confirmation's (0.01 beside the excess
    test): each line names its own."""
    from mtpbench.lossless.report import _sampling_lines

    ok, ex = two_sample(0.5), excess(0.3, 0.002)
    first, second = stats.Stage(two_sample(0.02), ok, ex), stats.Stage(two_sample(0.03, n_a=192, n_b=192), ok, ex)
    record = {"samples_per_prompt": 8, "why": "w", "test": asdict(first.ab), "aa_test": asdict(ok), "alpha_aa": 0.01,
              "excess_test": asdict(ex), "levels": stats.verdict.levels(first), "alarm": stats.alarm(first),
              "confirmation": {"test": asdict(second.ab), "aa_test": asdict(ok), "excess_test": asdict(ex)},
              "combined": {k: c and asdict(c) for k, c in stats.combined(first, second).items()}}
    lines = _sampling_lines(record)
    one = next(x for x in lines if x.startswith("- off vs on"))
    two = next(x for x in lines if x.startswith("  - stage 2 off vs on"))
    assert "p = 0.02 (the two-sample test, an alarm below 0.05;" in one, one
    assert "p = 0.03 (the two-sample test, lossy below 0.01 (with stage 1's alarm);" in two, two


def test_a_stages_lines_show_each_test_at_the_level_that_decides_it():
    """check-lossless's per-stage lines, a known answer (issue 55 item 3: show what decides, at the level that
    decides): the two-sample p with its level (stage 1 an alarm, stage 2 lossy with stage 1's alarm) and its parts
    named as parts, the excess test, the A/A control's level, the law's lines under "drafting arm's", the scorer's
    fit as a report that decides nothing; a test the stage lacks gives no line."""
    from mtpbench.lossless.report import _stage_lines
    from mtpbench.metrics.law import law_lines, law_summary

    law = law_summary([(0, 0, int(i < 3), 0.5, None, None, 1.0, 10 + i, 5) for i in range(6)])
    stage = {"test": {"p_value": 0.0412, "p_value_scores": 0.0206, "p_value_tokens": 0.5, "mean_logprob_a": -1.23456,
                      "mean_logprob_b": -1.3, "logprob_diff": -0.06544, "mde_logprob": 0.0312},
             "excess_test": {"z": 3e-05, "p_value": 0.99998, "excess_on": 5.12e-05, "excess_off": 0.0021},
             "aa_test": {"p_value": 0.7, "logprob_diff": 0.0012},
             "acceptance_law": law, "score_tests": {"off": {"z": 1.5e-05}, "on": {"z": -1.25}, "off_aa": {"z": 0.5}}}
    record = {"levels": {"alarm_two_sample": 0.05, "confirm_two_sample": 0.01}, "alpha_aa": 0.01}
    first = _stage_lines(stage, "", record)
    head = ("- off vs on: p = 0.0412 (the two-sample test, an alarm below 0.05; its parts: scores 0.0206, tokens 0.5); "
            "mean target log-prob -1.235 -> -1.3 nats/token, shift -0.0654; smallest detectable shift 0.0312")
    excess = ("- excess log p + H, drafting arm against both arms without drafting: z = +3e-05 (p = 1); +5.12e-05 "
              "against +0.0021 nats/token")
    aa = "- A/A control (off vs off): p = 0.7 (inconclusive below 0.01), shift +0.0012"
    laws = [f"- drafting arm's {x.lstrip()}" if i == 0 else f"  {x}" for i, x in enumerate(law_lines(law))]
    fit = ("- scorer's fit, each arm against the target's law (sum(log p + H) / sqrt(sum Var); reported, it decides "
           "nothing): off z = +1.5e-05, on z = -1.25, off again z = +0.5")
    assert first == [head, excess, aa, *laws, fit]
    second = _stage_lines(stage, "stage 2 ", record)
    assert second[0] == head.replace("- off vs on", "- stage 2 off vs on").replace(
        "an alarm below 0.05", "lossy below 0.01 (with stage 1's alarm)")
    assert second[3].startswith("- stage 2 drafting arm's ") and len(second) == len(first)
    assert _stage_lines({}, "", record) == []
    missing = _stage_lines({"score_tests": {"off": {"z": 1.0}}}, "", record)  # an arm the scorer could not fit
    assert missing == [fit.replace("off z = +1.5e-05, on z = -1.25, off again z = +0.5",
                                   "off z = +1, on none, off again none")]
    alone = _stage_lines({"test": stage["test"]}, "", {})
    assert alone == [head.replace(", an alarm below 0.05", "")]
