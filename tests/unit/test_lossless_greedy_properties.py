"""check-lossless's greedy verdicts and --fail-if-lossy's exit code (``lossless/verdict.py``), by property: every
expectation is an oracle written here from the rule (docs/check-lossless.md), never computed by the code under test.

The rules: a divergence is numerical iff |logit gap| <= the threshold, unclassified when the gap or the threshold is
unknown or not finite; the threshold is the larger of the dtype's floor (8 ulps of a logit of 32) and 4 x the measured
log-prob noise, capped at 4 x the floor, and noise beyond that cap or not a finite number >= 0 is a finding
(inconclusive); the verdict is inconclusive on that finding or an A/A problem, then divergent on a prompt of other
length, then divergent / inconclusive (unclassified) / numerical only / lossless from the drafting arm's divergences;
the A/A arm always runs another batch composition than the k = 0 arm; the exit code is 1 on lossy or divergent, 3 on
inconclusive unless allowed, else 0."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench.errors import MtpBenchError
from mtpbench.lossless.verdict import (
    _divergence,
    aa_label,
    aa_plan,
    aa_problem,
    classify,
    dtype_floor,
    exit_code,
    failed,
    greedy_outcome,
    greedy_verdict,
    greedy_why,
    nothing_drafted,
    numerical_threshold,
)
from mtpbench.scoring import Divergence, max_abs_change

FAST = settings(max_examples=200, deadline=None)
# torch.finfo(dtype).eps, written out: the floor is 8 of them at a logit of 32
EPS = {"float32": 1.1920928955078125e-07, "bfloat16": 0.0078125, "float16": 0.0009765625, "float64": 2.0 ** -52}
FLOOR = {d: 8 * e * 32 for d, e in EPS.items()}
DTYPES = st.sampled_from(sorted(EPS))
NUMERICAL, DIVERGENT = "numerical", "divergent"
GREEDY_VERDICTS = ("lossless", "numerical only", "divergent", "inconclusive")
ALL_VERDICTS = GREEDY_VERDICTS + ("lossy", "lossless (no difference detectable at this N)")
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)


def up(x: float) -> float:
    return math.nextafter(x, math.inf)


def down(x: float) -> float:
    return math.nextafter(x, -math.inf)


# ---- the threshold --------------------------------------------------------------------------------------------

@given(DTYPES, st.booleans())
def test_the_floor_is_8_ulps_of_a_logit_of_32(dtype, prefixed):
    assert dtype_floor(("torch." if prefixed else "") + dtype) == FLOOR[dtype]
    assert FLOOR["float32"] == 2.0 ** -15 and FLOOR["bfloat16"] == 2.0 and FLOOR["float16"] == 0.25


@pytest.mark.parametrize("dtype", ["float8", "int8", "auto", ""])
def test_a_dtype_without_a_floor_is_a_one_line_error(dtype):
    with pytest.raises(MtpBenchError) as e:
        dtype_floor(dtype)
    assert str(e.value) == (f"no rounding floor for dtype '{dtype}' (known: float32, bfloat16, float16, float64); "
                            "give --dtype")


def _noises(dtype: str):
    """Noise around every boundary the rule has (floor / 4, the floor itself: 4 x it is the cap), and anywhere."""
    f = FLOOR[dtype]
    edges = [0.0, -0.0, f / 4, down(f / 4), up(f / 4), f, down(f), up(f), 2 * f, -f, -1e-30, math.nan, math.inf,
             -math.inf, None]
    return st.one_of(st.sampled_from(edges), st.floats(min_value=0, max_value=10 * f), ANY_FLOAT)


@FAST
@given(st.data())
def test_the_threshold_is_the_larger_of_floor_and_4x_noise_capped_and_bad_noise_is_a_finding(data):
    dtype = data.draw(DTYPES)
    noise = data.draw(_noises(dtype))
    floor = FLOOR[dtype]
    cap = 4 * floor
    t = numerical_threshold(data.draw(st.sampled_from(["", "torch."])) + dtype, noise)
    assert t.cap == cap
    usable = noise is not None and not math.isnan(noise) and 0 <= noise < math.inf
    if not usable:
        assert t.value == cap and t.noise is None
        assert t.source == f"the cap, 4 x the {dtype} floor"
        what = "were not measured" if noise is None else f"change by {noise} (not a finite number >= 0)"
        assert t.problem == (f"log-prob noise beyond rounding: the k = 0 engine's teacher-forced log-probs {what} "
                             "between batch compositions, so no divergence can be bounded by rounding")
    elif 4 * noise > cap:
        assert t.value == cap and t.noise == noise and t.source == f"the cap, 4 x the {dtype} floor"
        assert t.problem == (f"log-prob noise beyond rounding: the k = 0 engine's teacher-forced log-probs "
                             f"move by {noise:.3g} nats between batch compositions, beyond the cap of "
                             f"{floor:.3g} (the threshold, 4 x the noise, would be {4 * noise:.3g} logits, "
                             f"above its cap {cap:.3g}, 4 x the {dtype} floor): more than {dtype} rounding explains "
                             "(TF32 matmuls, a nondeterministic reduction, a fault), so no divergence can be bounded "
                             "by rounding")
    else:
        assert t.problem is None and t.noise == noise
        assert t.value == max(floor, 4 * noise) <= cap
        assert t.source == ("dtype" if 4 * noise <= floor else "A/A log-prob noise")


@pytest.mark.parametrize("dtype", sorted(EPS))
def test_the_threshold_at_its_boundaries(dtype):
    f = FLOOR[dtype]
    assert numerical_threshold(dtype, f / 4)[:3] == (f, "dtype", None)  # a tie goes to the floor
    assert numerical_threshold(dtype, up(f / 4))[:3] == (4 * up(f / 4), "A/A log-prob noise", None)
    assert numerical_threshold(dtype, f)[:3] == (4 * f, "A/A log-prob noise", None)  # exactly at the cap: allowed
    beyond = numerical_threshold(dtype, up(f))
    assert beyond.value == 4 * f and beyond.problem is not None
    for bad in (math.inf, math.nan, -f, None):
        assert numerical_threshold(dtype, bad).problem is not None


def test_the_issue_figures():
    """Issue 33 item 10: 0.5 nats of noise in float32 made the threshold 2 logits; inf excused every divergence."""
    t = numerical_threshold("float32", 0.5)
    assert t.value == 2.0 ** -13 and "move by 0.5 nats" in t.problem and "would be 2 logits" in t.problem
    assert numerical_threshold("float32", math.inf).problem and numerical_threshold("float32", math.nan).problem
    assert numerical_threshold("bfloat16", 0.5)[:3] == (2.0, "dtype", None)  # bf16 noise of 0.5 is rounding there


# ---- one divergence's class -----------------------------------------------------------------------------------

THRESHOLDS = st.one_of(st.sampled_from([2.0 ** -15, 0.25, 2.0, 8.0, 0.0]), st.floats(min_value=0, max_value=100))


def _gaps(threshold: float):
    edges = [threshold, -threshold, up(threshold), -up(threshold), down(threshold), -down(threshold), 0.0, -0.0,
             math.nan, math.inf, -math.inf, None]
    return st.one_of(st.sampled_from(edges), ANY_FLOAT)


def oracle_class(gap, threshold):
    if gap is None or threshold is None or gap != gap or threshold != threshold or math.inf in (abs(gap), threshold):
        return None
    return NUMERICAL if -threshold <= gap <= threshold else DIVERGENT


@FAST
@given(st.data())
def test_a_divergence_is_numerical_iff_its_gap_is_within_the_threshold(data):
    threshold = data.draw(st.one_of(THRESHOLDS, st.sampled_from([None, math.nan, math.inf])))
    gap = data.draw(_gaps(threshold if threshold is not None and math.isfinite(threshold) else 1.0))
    assert classify(gap, threshold) == oracle_class(gap, threshold)


@FAST
@given(st.integers(0, 64), st.floats(-20, 20), st.integers(0, 9), st.integers(0, 9),
       st.one_of(ANY_FLOAT, st.none()), THRESHOLDS)
def test_a_divergence_record_is_the_engines_with_its_class(position, margin, a, b, gap, threshold):
    d = Divergence(position, margin, a, b, gap)
    rec = _divergence(d, threshold)
    assert rec.pop("logit_gap") is gap and rec == {"position": position, "margin": margin, "k0_token": a,
                                                   "spec_token": b, "class": oracle_class(gap, threshold)}
    assert _divergence(None, threshold) is None


# ---- the verdict over the drafting arm's divergences -----------------------------------------------------------

RECORDS = st.one_of(st.none(), st.builds(lambda c: {"class": c}, st.sampled_from([NUMERICAL, DIVERGENT, None])))


def oracle_verdict(divs):
    found = [d for d in divs if d is not None]
    if not found:
        return "lossless"
    if any(d["class"] == DIVERGENT for d in found):
        return "divergent"
    if any(d["class"] is None for d in found):
        return "inconclusive"
    return "numerical only"


@FAST
@given(st.lists(RECORDS, max_size=12))
def test_the_greedy_verdict_follows_the_divergences(divs):
    assert greedy_verdict(divs) == oracle_verdict(divs)


def _record(pid_gap_cls):
    position, gap, cls = pid_gap_cls
    return {"position": position, "margin": 0.1, "k0_token": 5, "spec_token": 9, "logit_gap": gap, "class": cls}


FULL_RECORDS = st.one_of(st.none(), st.builds(
    lambda p, g, c: _record((p, g, c)), st.integers(0, 99),
    st.one_of(st.none(), st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(-50, 50)),
    st.sampled_from([NUMERICAL, DIVERGENT, None])))


def oracle_against(g, threshold: float) -> str:
    """A gap beside the threshold it failed, as the why words it."""
    if g is None:
        return "logit gap unknown"
    if g != g or abs(g) == math.inf:
        return f"logit gap {g} (not finite)"
    return f"logit gap {g:.3g} > {threshold:.3g}" if g >= 0 else f"logit gap {g:.3g} < -{threshold:.3g}"


def oracle_why(pids: list[str], divs: list, threshold: float) -> str:
    """The drafting arm's why: the first divergent record, else the first unclassified one, else all within."""
    found = [(p, d) for p, d in zip(pids, divs) if d is not None]
    if not found:
        return "the same tokens on every prompt"
    for cls, head in ((DIVERGENT, ""), (None, "unclassified divergence (logit gap unknown or not finite): ")):
        hit = [(p, d) for p, d in found if d["class"] == cls]
        if hit:
            p, d = hit[0]
            return (f"{head}prompt {p}, token {d['position']}: the drafting run emitted 9 where k = 0 emitted 5, "
                    f"{oracle_against(d['logit_gap'], threshold)} ({len(hit)} such of {len(found)})")
    return f"all {len(found)} divergence(s) within rounding (|logit gap| <= {threshold:.3g})"


@FAST
@given(st.lists(FULL_RECORDS, min_size=1, max_size=8), st.sampled_from([2.0 ** -15, 2.0]))
def test_the_why_names_the_first_divergence_of_the_worst_kind(divs, threshold):
    pids = [f"p{i}" for i in range(len(divs))]
    assert greedy_why(list(zip(pids, divs)), threshold) == oracle_why(pids, divs, threshold)


@given(st.one_of(st.none(), ANY_FLOAT))
def test_a_gap_is_printed_to_three_digits_or_unknown(g):
    from mtpbench.lossless.verdict import _gap

    assert _gap({"logit_gap": g}) == ("unknown" if g is None else format(g, ".3g"))
    assert _gap({}) == "unknown" and _gap({"logit_gap": 6.0}) == "6" and _gap({"logit_gap": -0.12345}) == "-0.123"


# ---- the A/A control -------------------------------------------------------------------------------------------

@FAST
@given(st.integers(1, 100), st.integers(1, 256))
def test_the_aa_arm_always_runs_another_batch_composition(num_prompts, batch_size):
    aa_bs, copies, (k0_rows, aa_rows) = aa_plan(num_prompts, batch_size)
    assert k0_rows == min(batch_size, num_prompts)  # what the k = 0 arm batched, not what --batch-size said
    assert aa_rows != k0_rows and aa_rows == min(aa_bs, num_prompts * copies)  # so the control can fail
    if min(batch_size, num_prompts) > 1:
        assert (aa_bs, copies) == (1, 1)  # each prompt alone
    elif num_prompts > 1:
        assert (aa_bs, copies) == (num_prompts, 1)  # every prompt in one batch
    else:
        assert (aa_bs, copies) == (2, 2)  # the one prompt beside a copy of itself


@pytest.mark.parametrize("num_prompts", range(1, 7))
@pytest.mark.parametrize("batch_size", range(1, 9))
def test_the_aa_plan_on_every_small_case(num_prompts, batch_size):
    batched = min(num_prompts, batch_size)
    expected = ((1, 1, [batched, 1]) if batched > 1 else (num_prompts, 1, [1, num_prompts]) if num_prompts > 1
                else (2, 2, [1, 2]))
    assert aa_plan(num_prompts, batch_size) == expected


def test_the_aa_label_says_what_ran():
    assert aa_label([48, 1]) == "k = 0 at batch sizes 48 and 1"
    assert aa_label([1, 2], 2) == "k = 0 at batch sizes 1 and 2, the prompt beside a copy of itself"
    assert aa_label([1, 3], 3) == "k = 0 at batch sizes 1 and 3, the prompt beside 2 copies of itself"


AA_ROWS = st.lists(st.tuples(FULL_RECORDS, st.booleans()), min_size=1, max_size=8)


@FAST
@given(AA_ROWS, st.sampled_from([2.0 ** -15, 2.0]), st.sampled_from([([48, 1], 1), ([1, 16], 1), ([1, 2], 2)]))
def test_the_aa_control_forbids_a_verdict_on_a_divergence_beyond_rounding_or_a_length_difference(rows, t, plan):
    batch_sizes, copies = plan
    pids = [f"p{i}" for i in range(len(rows))]
    got = aa_problem([(p, d, differ) for p, (d, differ) in zip(pids, rows)], t, batch_sizes, copies)
    where = f"the A/A control ({aa_label(batch_sizes, copies)})"
    beyond = [(p, d) for p, (d, _) in zip(pids, rows) if d is not None and d["class"] != NUMERICAL]
    length = [p for p, (d, differ) in zip(pids, rows) if d is None and differ]
    if beyond:
        def badness(d):
            g = d["logit_gap"]
            return math.inf if g is None or not math.isfinite(g) else abs(g)

        worst = max(badness(d) for _, d in beyond)
        p, d = next((p, d) for p, d in beyond if badness(d) == worst)  # the first of the worst
        more = f" (and {len(beyond) - 1} more)" if len(beyond) > 1 else ""
        assert got == (f"{where} diverges beyond rounding: prompt {p}, token {d['position']}, 5 vs 9, "
                       f"{oracle_against(d['logit_gap'], t)}{more}; the k = 0 engine is not reproducible, so no "
                       "divergence of the drafting arm can be told from it")
    elif length:
        assert got == (f"{where} differs in length on prompt(s) {', '.join(length)} (the same tokens, one run "
                       "stopped sooner): a difference of the k = 0 engine with no token to bound")
    else:
        assert got is None
    if copies == 1:  # the default: each prompt once
        assert aa_problem([(p, d, differ) for p, (d, differ) in zip(pids, rows)], t, batch_sizes) == got


# ---- the greedy outcome and the exit code ----------------------------------------------------------------------

@FAST
@given(st.one_of(st.floats(0, 2.0 ** -15), st.floats(0, 2.0), ANY_FLOAT, st.none()),
       st.sampled_from(["float32", "bfloat16"]), st.one_of(st.none(), st.just("aa: why")), st.integers(0, 3),
       st.lists(FULL_RECORDS, min_size=1, max_size=6), st.booleans())
def test_the_outcome_and_its_exit_code_follow_the_rule_in_order(noise, dtype, aa_why, length_only, divs, allow):
    usable = noise is not None and noise == noise and 0 <= noise < math.inf and 4 * noise <= 4 * FLOOR[dtype]
    value = max(FLOOR[dtype], 4 * noise) if usable else 4 * FLOOR[dtype]
    divs = [d and {**d, "class": oracle_class(d["logit_gap"], value)} for d in divs]
    pids = [f"p{i}" for i in range(len(divs))]
    verdict, why = greedy_outcome(numerical_threshold(dtype, noise), aa_why, length_only, list(zip(pids, divs)))
    if not usable:
        assert verdict == "inconclusive" and why.startswith("log-prob noise beyond rounding: ")
    elif aa_why:
        assert (verdict, why) == ("inconclusive", aa_why)
    elif length_only:
        assert verdict == "divergent" and why == (f"{length_only} prompt(s) of other length: the same tokens as far "
                                                  "as they go, one run stopped sooner")
    else:
        assert verdict == oracle_verdict(divs) and why == oracle_why(pids, divs, value)
    # whatever the noise, a gate never passes a check that could not bound it
    code = exit_code({"verdict": verdict}, allow)
    assert code == {"divergent": 1, "inconclusive": 0 if allow else 3}.get(verdict, 0)
    if not usable:
        assert code == (0 if allow else 3)


@FAST
@given(st.sampled_from(ALL_VERDICTS), st.booleans())
def test_the_exit_code_matches_the_verdict(verdict, allow):
    expected = 1 if verdict in ("lossy", "divergent") else 3 if verdict == "inconclusive" and not allow else 0
    assert exit_code({"verdict": verdict}, allow) == expected
    assert exit_code({"verdict": verdict}) == (1 if verdict in ("lossy", "divergent") else
                                                3 if verdict == "inconclusive" else 0)
    assert failed({"verdict": verdict}) == (verdict in ("lossy", "divergent"))


def _greedy_record(verdict: str, why: str, noise) -> dict:
    """A greedy record with the keys the summary prints."""
    return {"kind": "greedy", "verdict": verdict, "why": why, "inconclusive_reason": None,
            "config": {"model": "m", "backend": "native", "k": [2], "mode": ["mtp"], "temperature": 0.0,
                       "max_tokens": 4, "seed": 0, "planted_lossy": False},
            "engine": {"dtype": "float32"}, "num_prompts": 1, "identical_share": 1.0, "num_divergent": 0,
            "num_numerical": 0, "numerical_threshold": 2.0 ** -15, "numerical_threshold_source": "dtype",
            "numerical_threshold_cap": 2.0 ** -13, "dtype_floor": 2.0 ** -15, "aa_batch_sizes": [1, 2],
            "aa_copies": 2, "aa_identical_share": 1.0, "num_aa_numerical": 0, "num_aa_beyond_bound": 0,
            "aa_logprob_noise": noise, "per_prompt": []}


@FAST
@given(ANY_FLOAT | st.none(), st.booleans())
def test_the_printed_verdict_and_the_exit_code_agree(noise, allow):
    """What the summary prints as the verdict is what --fail-if-lossy exits on: a noise finding prints
    inconclusive and exits 3 (0 when allowed), and never prints a number JSON cannot hold."""
    from mtpbench.lossless.report import summary

    t = numerical_threshold("float32", noise)
    verdict, why = greedy_outcome(t, None, 0, [("p0", None)])
    text = summary(_greedy_record(verdict, why, t.noise))
    printed = re.match(r"# check-lossless: (.+)\n", text).group(1)
    assert printed == verdict
    assert exit_code({"verdict": printed}, allow) == (0 if printed == "lossless" or allow else 3)
    assert "k = 0 at batch sizes 1 and 2, the prompt beside a copy of itself" in text
    assert "cap 0.000122" in text
    if t.noise is None:
        assert "log-prob noise unknown (no finite number: see why)" in text


# ---- a drafting arm that drafted nothing ----------------------------------------------------------------------

@FAST
@given(st.sampled_from(ALL_VERDICTS), st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.just("w")))
def test_nothing_drafted_turns_a_pass_into_inconclusive_and_leaves_a_fail(verdict, drafts, why):
    result = {"verdict": verdict, "why": why}
    arm = {"acceptance": None if drafts is None else {"num_drafts": drafts}}
    nothing_drafted(result, arm)
    if drafts == 0 and verdict not in ("lossy", "divergent"):
        assert result["verdict"] == "inconclusive"
        assert result["why"] == ("nothing drafted: the drafting arm drafted nothing (num_drafts 0), so it was k = 0 "
                                 f"against k = 0 (the tests alone said: {verdict}" + (f"; {why}" if why else "") + ")")
    else:
        assert result == {"verdict": verdict, "why": why}


# ---- the noise itself: a NaN anywhere is a NaN, never dropped --------------------------------------------------

@FAST
@given(st.lists(st.lists(st.tuples(ANY_FLOAT, ANY_FLOAT), max_size=5), max_size=4))
def test_the_noise_is_the_largest_change_and_nan_when_any_change_is(rows):
    together = [[a for a, _ in r] for r in rows]
    alone = [[b for _, b in r] for r in rows]
    changes = [abs(a - b) for r in rows for a, b in r]
    got = max_abs_change(together, alone)
    if any(c != c for c in changes):
        assert got != got
    else:
        assert got == (max(changes) if changes else 0.0)
