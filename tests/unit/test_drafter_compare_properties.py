"""check-drafter's answers from its numbers (drafter/compare.py), against oracles written here from the rules:
the first stage, in an MTP step's order, whose error is beyond the tolerance (NaN beyond, None unmeasured); vLLM's
per-position acceptance (a position counts where it and every earlier draft match); the headline's verdict."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from mtpbench.drafter.compare import TOLERANCE, acceptance_per_position, first_difference, headline, tolerance
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
