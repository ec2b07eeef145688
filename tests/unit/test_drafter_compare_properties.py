"""check-drafter's answers from its numbers (drafter/compare.py), against oracles written here from the rules:
the first stage, in an MTP step's order, whose error is beyond the tolerance (NaN beyond, None unmeasured); vLLM's
per-position acceptance (a position counts where it and every earlier draft match); the verdict (nothing checked is
inconclusive, never parity), its exit code, the headline and the page's tone."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.drafter.compare import (EXIT_CODE, NO_CAUSE, TOLERANCE, acceptance_per_position, cause,
                                      first_difference, headline, note_stages, tolerance, verdict)
from mtpbench.drafter.families import STAGES

ORDER = ["token input", "embedding", "enorm", "hidden input", "hnorm", "concat", "proj", "block input", "block",
         "final norm", "head input", "head"]
error = st.one_of(st.none(), st.just(math.nan), st.just(math.inf), st.floats(0, 10, allow_nan=False))


def test_the_stages_run_in_an_mtp_steps_order():
    assert list(STAGES) == ORDER


@given(st.dictionaries(st.sampled_from(ORDER), error), st.floats(1e-6, 1.0))
def test_the_first_difference_is_the_earliest_stage_beyond_the_tolerance(errors, tol):
    want = None
    for stage in ORDER:
        e = errors.get(stage)
        if e is not None and (e != e or e > tol):
            want = stage
            break
    assert first_difference(errors, tol) == want


@given(st.floats(1e-6, 1.0), st.sampled_from(ORDER))
def test_an_error_at_the_tolerance_is_parity_and_just_above_is_not(tol, stage):
    assert first_difference({stage: tol}, tol) is None
    assert first_difference({stage: math.nextafter(tol, 2.0)}, tol) == stage


@given(st.lists(st.lists(st.booleans(), max_size=5), max_size=12), st.integers(1, 5))
def test_acceptance_per_position_counts_positions_whose_prefix_all_matched(cycles, k):
    got = acceptance_per_position(cycles, k)
    assert len(got) == k
    for s in range(k):
        accepted = sum(1 for c in cycles if len(c) > s and all(c[: s + 1]))
        assert got[s] == (accepted / len(cycles) if cycles else 0.0)
    assert all(a >= b for a, b in zip(got, got[1:]))  # a later position never accepts more


def test_known_acceptance():
    assert acceptance_per_position([[True, True], [True, False], [False, True], [True]], 2) == [0.75, 0.25]


@given(st.sampled_from([None, *ORDER]), st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_the_headline_says_parity_only_without_a_difference(first, acc):
    line = headline(first, ["enorm"], acc, acc)
    assert line.startswith("parity") == (first is None)
    if first is not None:
        assert f"'{first}'" in line
    assert f"{acc[0]:.2f}" in line


def test_tolerances_are_of_the_dtype_and_unknown_dtypes_get_bfloat16s():
    assert tolerance("torch.float32") == TOLERANCE["float32"] == 1e-4
    assert tolerance("bfloat16") == 8 * 2.0 ** -8
    assert tolerance("float16") == 8 * 2.0 ** -11
    assert tolerance("float8") == tolerance("bfloat16")


def test_no_proposal_or_no_position_gives_the_empty_or_zero_list():
    assert acceptance_per_position([], 0) == [] and acceptance_per_position([], 2) == [0.0, 0.0]
    assert acceptance_per_position([[True]], 0) == []


def test_the_headline_word_for_word():
    assert headline(None, ["enorm", "head"], None, [0.5]) == \
        "parity: every stage checked (enorm, head) equals the reference"
    assert headline("hnorm", ["enorm"], [0.78, 0.5], [0.02]) == (
        "the engine's draft differs from the checkpoint's MTP first at stage 'hnorm'; the checkpoint's MTP would "
        "accept 0.78 at position 0, the engine accepts 0.02")
    assert headline("head", ["head"], [0.25, 0.75], []) == (
        "the engine's draft differs from the checkpoint's MTP first at stage 'head'; the checkpoint's MTP would "
        "accept 0.25")


# --- the verdict: nothing checked is inconclusive, never parity (issue 44, case 11) -----------------------------------

def oracle_verdict(errors: dict, tol: float) -> str:
    """The rule: a stage beyond the tolerance (NaN beyond) differs; else parity where some stage was measured, and
    inconclusive where none was (None is a stage not measured)."""
    measured = [errors.get(stage) for stage in ORDER if errors.get(stage) is not None]
    if any(e != e or e > tol for e in measured):
        return "differs"
    return "parity" if measured else "inconclusive"


@st.composite
def stage_errors(draw):
    """A tolerance and errors per stage: unmeasured, NaN, inf, and numbers at, just below and just above it."""
    tol = draw(st.floats(1e-6, 1.0))
    near = st.sampled_from([0.0, tol / 2, math.nextafter(tol, 0.0), tol, math.nextafter(tol, 2.0), 2 * tol])
    value = st.one_of(st.none(), st.none(), st.just(math.nan), st.just(math.inf), near, st.floats(0, 10))
    return draw(st.dictionaries(st.sampled_from(ORDER), value)), tol


def check_summary(errors: dict, tol: float) -> dict:
    """drafter.json's fields that the page reads, around ``errors``."""
    return {"errors": {s: errors.get(s) for s in ORDER}, "tolerance": tol, "dtype": "float32", "k": 2,
            "decoder": "independent (mtpbench's reference)", "notes": {}, "hidden_inputs": [], "family": "mimo",
            "reference_acceptance": [0.5, 0.25], "engine_acceptance": [0.5, 0.25],
            "engine_counters_acceptance": [0.5, 0.25], "num_calls": 7, "num_requests": 2, "model": "m",
            "backend": "native", "first_difference": first_difference(errors, tol),
            "stages_checked": [s for s in ORDER if errors.get(s) is not None], "headline": "as saved"}


@settings(max_examples=400, deadline=None)
@given(stage_errors())
def test_the_verdict_and_its_exit_code_follow_the_rule(data):
    errors, tol = data
    want = oracle_verdict(errors, tol)
    assert verdict(errors, tol) == want
    assert EXIT_CODE[verdict(errors, tol)] == {"parity": 0, "differs": 1, "inconclusive": 3}[want]  # fails closed
    checked = [s for s in ORDER if errors.get(s) is not None]
    line = headline(first_difference(errors, tol), checked, None, [], 7)
    assert line.startswith({"parity": "parity", "differs": "the engine's draft differs",
                            "inconclusive": "inconclusive: no stage was checked"}[want])
    assert ("parity" in line) == (want == "parity")


@settings(max_examples=60, deadline=None)
@given(stage_errors())
def test_the_pages_answer_and_tone_follow_the_verdict(tmp_path_factory, data):
    """report.html, rebuilt from drafter.json's errors alone: green only for parity, red where a stage differs,
    a warning where none was checked, whatever headline the file saved."""
    from mtpbench.drafter.page import page

    errors, tol = data
    out = tmp_path_factory.mktemp("drafter")
    (out / "drafter.json").write_text(json.dumps(check_summary(errors, tol)))
    html = page(out).read_text()
    want = oracle_verdict(errors, tol)
    tone = {"parity": "good", "differs": "bad", "inconclusive": "warn"}[want]
    assert f'class="answer {tone}"' in html
    assert ("no stage was checked" in html) == (want == "inconclusive")


def test_nothing_checked_is_inconclusive_word_for_word():
    """Every stage's error None (a capture whose calls carried no stage the reference recomputes) was reported as
    'parity: every stage checked () equals the reference'."""
    nothing = {s: None for s in ORDER}
    assert verdict(nothing, 1e-4) == verdict({}, 1e-4) == "inconclusive" and EXIT_CODE["inconclusive"] == 3
    assert headline(None, [], None, [0.5], 12) == (
        "inconclusive: no stage was checked: none of the engine's 12 draft calls gave a stage the reference could "
        "compare, so nothing shows the draft equals the reference")
    assert headline(None, [], [0.75, 0.5], [0.5]) == (
        "inconclusive: no stage was checked, so nothing shows the draft equals the reference; the checkpoint's MTP "
        "would accept 0.75 at position 0, the engine accepts 0.50")
    assert "1 draft call gave" in headline(None, [], None, [], 1)
    assert verdict({**nothing, "head": 0.0}, 1e-4) == "parity" and verdict({"head": math.nan}, 1e-4) == "differs"


def test_check_drafter_exits_3_on_a_check_of_no_stage(monkeypatch, tmp_path):
    """The CLI's gate: exit 3, the headline printed, where no stage was checked (and 0, 1 as before)."""
    from typer.testing import CliRunner

    import mtpbench.drafter.run as run
    from mtpbench.cli import app

    for errors, code in (({}, 3), ({"enorm": 0.0}, 0), ({"enorm": 1.0}, 1)):
        s = check_summary(errors, 1e-4)
        s["headline"] = headline(s["first_difference"], s["stages_checked"], None, [], 7)
        monkeypatch.setattr(run, "run_check", lambda cfg, k, mode, s=s: s)
        r = CliRunner().invoke(app, ["check-drafter", "builtin", "--backend", "native", "--out", str(tmp_path)])
        assert r.exit_code == code, r.output
        assert s["headline"] in r.output


# --- what the captured values show at the first differing stage (issue 46 item 5) -------------------------------------

note_text = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=12)


@st.composite
def notes_and_first(draw):
    """Notes each with a prefix of one or two stage names (or none, or "checkpoint"), and the calls that gave it."""
    notes = {}
    for _ in range(draw(st.integers(0, 6))):
        names = draw(st.lists(st.sampled_from([*ORDER, "checkpoint"]), min_size=0, max_size=2, unique=True))
        text = draw(note_text)
        notes[(" and ".join(names) + ": " + text) if names else text] = draw(st.integers(1, 9))
    return notes, draw(st.sampled_from([None, *ORDER]))


@given(notes_and_first())
def test_the_cause_is_the_most_given_note_naming_the_first_stage_else_no_cause(case):
    """The rule, written here: none without a difference; else of the notes whose 'a and b: ' prefix names the
    first differing stage, the one the most calls gave (the first such in order on a tie); where none names it,
    '<stage>: differs from here on' and no cause."""
    notes, first = case
    got = cause(first, notes)
    if first is None:
        assert got is None
        return
    naming = []
    for note, n in notes.items():
        if ": " in note and first in note.split(": ")[0].split(" and "):
            naming.append((note, n))
    if not naming:
        assert got == f"{first}: {NO_CAUSE}" and "no cause is named" in got
        return
    most = max(n for _, n in naming)
    assert got == next(note for note, n in naming if n == most)


def test_the_headline_names_what_was_seen_at_the_first_difference():
    why = "embedding and hidden input: exchanged: enorm was given the previous hidden state and hnorm the token embedding"
    assert headline("embedding", ["embedding"], [0.5], [0.1], seen=why) == (
        "the engine's draft differs from the checkpoint's MTP first at stage 'embedding' (" + why + "); the "
        "checkpoint's MTP would accept 0.50 at position 0, the engine accepts 0.10")
    assert cause("concat", {"concat: the projection's input is the two halves in the other order": 3,
                            "embedding and hidden input: exchanged": 5}) == \
        "concat: the projection's input is the two halves in the other order"
    assert cause("proj", {"concat: x": 1}) == \
        "proj: differs from here on; the captured values match no known alternative, so no cause is named"


def test_a_notes_stages_are_its_prefix_before_the_first_colon():
    assert note_stages("embedding and hidden input: exchanged: enorm was given the previous hidden state") == {
        "embedding", "hidden input"}
    assert note_stages("concat") == set() and note_stages("concat: other order") == {"concat"}
