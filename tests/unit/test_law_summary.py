"""Acceptance against its law as the artifacts show it (mtpbench.metrics.law): the summary's numbers against sums
written here from the steps, its verdict against the oracle of test_acceptance_law_properties. No engine, no model,
no torch (the recorder's reading of a vLLM verify step: tests/test_acceptance_law.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mtpbench.metrics.law import (LAW_HEADERS, TOKEN_CLASSES, breakdowns, context_bucket, failed_pass, law_block,
                                  law_lines, law_report, law_rows, law_summary, row_fields, token_class,
                                  token_classifier)
from tests.unit.test_acceptance_law_properties import oracle

maybe = st.one_of(st.none(), st.floats(0.0, 1.0, allow_nan=False))
law_step = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 1), st.floats(0.0, 1.0, allow_nan=False),
                     maybe, maybe).map(lambda s: (s[0], s[1], s[2], s[3], s[4], s[4] if s[5] is None else s[5]))


@settings(max_examples=300, deadline=None)
@given(st.lists(law_step, min_size=1, max_size=12))
def test_each_positions_numbers_are_its_steps_and_the_verdict_the_rules(steps):
    block = law_summary(steps)
    verdict, rows = oracle([(s[1], s[2], s[3]) for s in steps], 0.025, 0.025)
    assert block["observable"] and block["verdict"] == verdict
    assert [t["position"] for t in block["positions"]] == sorted({s[1] for s in steps})
    for t in block["positions"] + [block["joint"]]:
        at = [s for s in steps if t["position"] is None or s[1] == t["position"]]
        assert t["steps"] == len(at)
        assert t["observed"] == pytest.approx(sum(s[2] for s in at) / len(at), abs=1e-4)
        assert t["expected"] == pytest.approx(sum(s[3] for s in at) / len(at), abs=1e-4)
        known = [s[4] for s in at if s[4] is not None]
        if known:  # 1 - sum_x min(p, q) is the total-variation distance between p and q
            assert t["probabilistic"] == pytest.approx(sum(known) / len(known), abs=1e-4)
            assert t["tv"] == pytest.approx(1 - sum(known) / len(known), abs=2e-4)
        else:
            assert t["probabilistic"] is None and t["tv"] is None
        want = next(r for r in rows if r[0] == t["position"])
        assert t["decision"] == want[2]
        assert (t["certain_over"], t["certain_under"]) == (want[5], want[6])
        # no z where a certain step departed (infinite) or where every step was certain (nothing to test)
        # (an over-acceptance by its tail beside certain rejections keeps its finite z)
        assert (t["z"] is None) == bool(want[5] or (want[6] and want[2] != "over-accepts") or want[7])
        assert (t["p_over"], t["p_under"]) == (pytest.approx(want[3], rel=1e-3, abs=1e-12),
                                              pytest.approx(want[4], rel=1e-3, abs=1e-12))
    table = law_rows(block)  # the page's table: each row the test's own numbers, the joint row last
    assert len(table) == len(block["positions"]) + 1 and table[-1][0] == "all"
    for row, t in zip(table, block["positions"] + [block["joint"]]):
        assert len(row) == len(LAW_HEADERS)
        cells = dict(zip(LAW_HEADERS, row))
        assert (cells["steps"], cells["observed"], cells["expected"], cells["decision"]) == (
            t["steps"], t["observed"], t["expected"], t["decision"])
        assert cells["observed - expected"] == (f"{t['observed'] - t['expected']:+.3f} "
                                                f"[{t['low']:+.3f}, {t['high']:+.3f}]")
        assert cells["z"] == (certain_words(t) if t["z"] is None else t["z"])
        assert [cells[h] for h in LAW_HEADERS[-3:]] == ["" if t[k] is None else t[k]
                                                         for k in ("tv", "probabilistic", "greedy")]
        if t["position"] is not None:
            assert cells["position"] == t["position"]
    lines = law_lines(block)  # the terminal's: the verdict first, then a line per position with its numbers
    assert lines[:2] == [f"acceptance against its law: {verdict}", "  (the share of the drafts reaching each position "
                         "that were accepted, against the law's expectation)"]
    assert len(lines) == 2 + len(block["positions"])
    for line, t in zip(lines[2:], block["positions"]):
        z = "certain" if t["z"] is None else f"z {t['z']:+.2f}".replace("-0.00", "+0.00")  # never minus zero
        tv = "" if t["tv"] is None else f", TV(p, q) {t['tv']:.2f}"
        assert line == (f"  pos {t['position']}: observed {t['observed']:.3f}, expected {t['expected']:.3f} "
                        f"({t['steps']} steps, {z}{tv}): {t['decision']}")
    assert set(block) == {"observable", "why", "verdict", "positions", "joint", "by_context", "by_token_class"}
    assert block["why"] is None
    for t in block["positions"] + [block["joint"]]:  # JSON's figures to 4 decimals
        assert all(round(t[k], 4) == t[k] for k in ("observed", "expected", "low", "high", "tv", "probabilistic",
                                                      "greedy", "z") if t[k] is not None)


def certain_words(t: dict) -> str:
    """A position without a z: "certain", and its certain departures counted."""
    said = ([f"{t['certain_over']} accepted with probability 0"] if t["certain_over"] else []) + (
        [f"{t['certain_under']} rejected with probability 1"] if t["certain_under"] else [])
    return "certain" + (": " + ", ".join(said) if said else "")


def test_what_cannot_be_observed_is_said_not_tested():
    block = law_summary([], "the server does not serve mtpbench's law routes")
    assert block == {"observable": False, "why": "the server does not serve mtpbench's law routes", "verdict": None,
                     "positions": [], "joint": None, "by_context": None, "by_token_class": None}
    assert law_lines(block) == ["acceptance against its law: not observable (the server does not serve mtpbench's "
                                "law routes)"]
    unhooked = {"observable": False, "why": "no rank of this engine has a rejection sampler to hook"}
    assert law_report([{"recording": False}], [None]) == unhooked
    assert law_report([{"recording": False}], [{"rank": 0, "steps": []}]) == unhooked
    assert law_report([{"recording": True}], [None]) == unhooked
    assert law_report([{"recording": True}, {"recording": True}],
                      [{"rank": 0, "steps": [1]}, {"rank": 1, "steps": [2]}]) == {"observable": True, "rank": 0,
                                                                                 "steps": [1]}
    assert law_report([{"recording": True}] * 2, [{"rank": 0, "verify_steps": 0, "steps": []},
                                                  {"rank": 1, "verify_steps": 3, "steps": [2]}])["rank"] == 1


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10 ** 6))
@example(31).via("the first edge")
@example(32).via("the first edge")
@example(63).via("the second edge")
@example(64).via("the second edge")
def test_a_context_lies_in_its_bucket(n):
    bucket = context_bucket(n)
    if n < 32:
        assert bucket == "< 32"
    else:  # doubling edges from 32: [32, 64), [64, 128), ...
        low, high = map(int, bucket.split("-"))
        assert low <= n <= high and high == 2 * low - 1 and math.log2(low / 32) == int(math.log2(low / 32))


@pytest.mark.parametrize("text, special, want", [
    ("<|endoftext|>", True, "special"), (" ", False, "whitespace/punctuation"),
    ("\n\n", False, "whitespace/punctuation"),
    ("):", False, "whitespace/punctuation"), (" 42", False, "digits"), ("3.", False, "digits"),
    (" def", False, "words"), ("_x1", False, "words"), ("_", False, "words"), ("__", False, "words"), ("é", False, "words"), ("\ufffd", False, "other"),
    ("", False, "other"), ("x", True, "special")])
def test_each_draft_token_falls_in_one_class(text, special, want):
    assert token_class(text, special) == want
    if not special:  # a token is not special unless said
        assert token_class(text) == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.floats(0.0, 1.0, allow_nan=False), maybe,
                          st.one_of(st.none(), st.integers(0, 300)), st.integers(0, 9)), min_size=1, max_size=40))
def test_the_breakdowns_share_out_each_positions_steps(raw):
    """Each (group, position) cell holds exactly its steps: counts, accepted and expected shares by hand; steps
    without a context count in no context bucket; a classifier's class names each token's group."""
    steps = [(0, i, x, a, q, None, 1.0, ctx, tok) for i, x, a, q, ctx, tok in raw]
    classes = ["digits" if t < 3 else "words" if t < 7 else "special" for t in range(10)]
    got = breakdowns(steps, classes.__getitem__)
    for key, group_of in (("by_context", lambda s: None if s[7] is None else context_bucket(s[7])),
                          ("by_token_class", lambda s: classes[s[8]])):
        want: dict = {}
        for s in steps:
            if group_of(s) is not None:
                want.setdefault((group_of(s), s[1]), []).append(s)
        if not want:
            assert got[key] is None
            continue
        assert {(g["group"], g["position"]) for g in got[key]} == set(want)
        for g in got[key]:
            at = want[(g["group"], g["position"])]
            assert g["steps"] == len(at)
            assert g["observed"] == pytest.approx(sum(s[2] for s in at) / len(at), abs=1e-4)
            assert g["expected"] == pytest.approx(sum(s[3] for s in at) / len(at), abs=1e-4)
            known = [s[4] for s in at if s[4] is not None]
            assert g["tv"] == (None if not known else pytest.approx(1 - sum(known) / len(known), abs=2e-4))
    order = [(TOKEN_CLASSES.index(g["group"]), g["position"]) for g in got["by_token_class"]]
    assert order == sorted(order)
    if got["by_context"]:  # buckets by their lower edge, "< 32" first, then position
        edges = [(0 if g["group"] == "< 32" else int(g["group"].split("-")[0]), g["position"])
                 for g in got["by_context"]]
        assert edges == sorted(edges)
    for g in (got["by_context"] or []) + got["by_token_class"]:  # JSON's figures to 4 decimals
        assert all(round(g[k], 4) == g[k] for k in ("observed", "expected", "tv") if g[k] is not None)
    summary = law_summary(steps, classify=classes.__getitem__)  # trace.json's block carries them
    assert (summary["by_context"], summary["by_token_class"]) == (got["by_context"], got["by_token_class"])
    assert breakdowns(steps)["by_token_class"] is None  # no tokenizer: no classes


NOT_OBSERVED = {"observable": False, "verdict": None, "positions": [], "joint": None, "by_context": None,
                "by_token_class": None}


def test_a_block_is_the_summary_of_what_was_recorded_or_says_why_not():
    """A backend's report becomes the artifacts' block: its steps tested where it observed them; else its own
    reason, or the caller's where it gave none (no report, an empty one, one without a why)."""
    assert law_block(None, "the backend reads no law") == {**NOT_OBSERVED, "why": "the backend reads no law"}
    assert law_block({}, "not recorded") == {**NOT_OBSERVED, "why": "not recorded"}
    assert law_block({"observable": False}, "not recorded") == {**NOT_OBSERVED, "why": "not recorded"}
    assert law_block({"observable": False, "why": "no plugin"}, "not recorded") == {**NOT_OBSERVED, "why": "no plugin"}
    steps = [(0, 0, 1, 0.5, None, None, 1.0), (0, 0, 0, 0.5, None, None, 1.0), (0, 1, 1, 1.0, None, None, 1.0)]
    block = law_block({"observable": True, "steps": steps}, "not recorded")
    assert block["observable"] is True and block["why"] is None
    assert [(t["position"], t["steps"], t["observed"], t["expected"]) for t in block["positions"]] == [
        (0, 2, 0.5, 0.5), (1, 1, 1.0, 1.0)]
    assert block["by_token_class"] is None  # no classifier given
    tokens = [(*s, 40, tok) for s, tok in zip(steps, (3, 3, 8))]  # with the context and the draft token
    block = law_block({"observable": True, "steps": tokens}, "not recorded", lambda t: "digits" if t < 5 else "words")
    assert [(g["group"], g["position"], g["steps"]) for g in block["by_token_class"]] == [
        ("digits", 0, 2), ("words", 1, 1)]
    assert [(g["group"], g["position"], g["steps"]) for g in block["by_context"]] == [("32-63", 0, 2), ("32-63", 1, 1)]


def test_a_failed_pass_is_not_observable_and_says_what_raised():
    assert failed_pass(ValueError("bad batch")) == {"observable": False,
                                                    "why": "the untimed pass failed: ValueError: bad batch"}
    long = failed_pass(RuntimeError("x" * 1000))["why"]  # a traceback's text is cut to what a block holds
    assert len(long) == 500 and long.startswith("the untimed pass failed: RuntimeError: xxx")


def test_a_row_has_none_at_a_position_no_draft_reached():
    """Every draft at position 0 rejected: position 1 was never reached; its columns are None, not a number."""
    block = law_summary([(0, 0, 0, 0.25, None, None, 1.0)] * 4)
    fields = row_fields(block, 2)
    assert fields["law_verdict"] == block["verdict"]
    assert fields["law_steps_per_pos"] == (4, None) and fields["law_observed_per_pos"] == (0.0, None)
    assert fields["law_expected_per_pos"] == (0.25, None) and fields["law_z_per_pos"][1] is None
    assert row_fields(None, 2) == {} and row_fields({"observable": False, "why": "w"}, 2) == {
        "law_verdict": "not observable (w)"}


def test_the_token_classifier_reads_the_models_tokenizer(tmp_path):
    """Each token id's class from its text in the model's own tokenizer.json, its special tokens "special"; no
    tokenizer (or one that does not load) gives no classifier, not an error."""
    from tokenizers import AddedToken, Tokenizer, models

    tok = Tokenizer(models.WordLevel({"word_x": 0, "42": 1, ",": 2, "_": 3, "<unk>": 4}, unk_token="<unk>"))
    tok.add_special_tokens([AddedToken("<eos>", special=True)])  # id 5
    tok.add_tokens([AddedToken(" 7", special=False)])  # id 6: added, not special
    tok.save(str(tmp_path / "tokenizer.json"))
    classify = token_classifier(tmp_path)
    assert [classify(i) for i in range(7)] == ["words", "digits", "whitespace/punctuation", "words", "words",
                                               "special", "digits"]
    assert token_classifier(tmp_path / "none") is None
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "tokenizer.json").write_text("{")
    assert token_classifier(tmp_path / "broken") is None


def test_a_block_of_no_steps_has_no_joint_test_and_a_block_reads_the_answers_levels():
    """No verify step recorded (a law pass of no drafts): positions and joint empty, no exception. A block built for
    a sweep's family (``law_levels(family=F)``) decides at alpha / 2F a side, not at the block's own alpha / 2."""
    from mtpbench.metrics.law import law_block, law_summary, sure_text
    from mtpbench.stats.judge import law_levels

    tv = law_summary([(0, 0, 1, 0.9, 0.123456, None, 1.0, 10, 5)])  # the drafter's law known: p and q's distance
    assert tv["positions"][0]["tv"] == 0.8765 and tv["positions"][0]["probabilistic"] == 0.1235  # to 4 decimals
    empty = law_summary([])
    assert empty["positions"] == [] and empty["joint"] is None and empty["observable"] is True
    # 40 steps at position 0, each accepted with probability 0.5: 28 accepted, an over tail of 0.0083 (binomial)
    steps = [(0, 0, int(i < 28), 0.5, None, None, 1.0, 10 + i, 5) for i in range(40)]
    alone = law_block({"observable": True, "steps": steps}, "none", levels=law_levels())
    family = law_block({"observable": True, "steps": steps}, "none", levels=law_levels(family=10))
    from mtpbench.stats.acceptance import FOLLOWS, OVER

    assert alone["positions"][0]["decision"] == OVER  # 0.0083 < 0.025
    assert family["positions"][0]["decision"] == FOLLOWS  # 0.0083 > 0.0025
    assert sure_text({"certain_over": 2, "certain_under": 1}) == \
        ": 2 accepted with probability 0, 1 rejected with probability 1"
    assert sure_text({}) == ""
