"""Property tests of check-lossless's sampling verdict (stats.lossless_verdict, stats.alarm, stats.confirmation) over
random stages, against an oracle written here from the rule in docs/check-lossless.md, never by calling the code
under test:

* inconclusive, in this order: a missing test; any non-finite number; an A/A control below 0.01 at any stage;
  an alarm without a second stage;
* an alarm: the excess test's |z| > 1.0364 (two-sided 30 %), or the two-sample p below 0.05 (0.3 without the
  excess test);
* lossy: an alarm, and the second stage on its own: its excess |z| > 1.9600 (two-sided 5 %) with the sign of the
  first stage's z, or its two-sample p below 0.01 (0.05 without the excess test);
* or an alarm and both stages combined: for the excess test (both stages' z known) and for the two-sample test (its
  p read as the normal deviate whose two-sided p it is, signed by its shift of the mean target log-prob), the z's
  of the two stages weighted by the square roots of their continuations (the drafting arm's),
  Z = (sqrt(n1) z1 + sqrt(n2) z2) / sqrt(n1 + n2), two-sided p = 2 Phi(-|Z|) below 0.005, with z1 z2 > 0;
* otherwise inconclusive with fewer than 8 continuations an arm or a smallest reachable p of 0.05 or more, with an
  unknown detectable shift, or one above the bound; else lossless, quoting the first stage's two-sample p, or with
  a second stage the two-sample p of both stages combined and, where both stages have an excess z, theirs.
"""

import math
from statistics import NormalDist

from hypothesis import given, settings
from hypothesis import strategies as st

from mtpbench import stats

SETTINGS = settings(max_examples=300, deadline=None)
PHI = NormalDist()
Z_ALARM, Z_CONFIRM = PHI.inv_cdf(1 - 0.3 / 2), PHI.inv_cdf(1 - 0.05 / 2)  # the two-sided 30 % and 5 % points


def deviate(t):
    """The two-sample test's p as a signed normal deviate: |z| with 2 Phi(-|z|) = p, the sign of the shift (none: 0).
    p = 0, which no permutation test gives, is the deviate of the smallest float's p."""
    return 0.0 if t.logprob_diff == 0 else math.copysign(-PHI.inv_cdf(max(t.p_value, 1e-323) / 2), t.logprob_diff)


def stouffer(z1, n1, z2, n2):
    """(two-sided p, the same way) of two stages' z weighted by the square roots of their sizes."""
    z = (math.sqrt(n1) * z1 + math.sqrt(n2) * z2) / math.sqrt(n1 + n2)
    return 2 * PHI.cdf(-abs(z)), z1 * z2 > 0


def both_stages(first, second):
    """{test: (combined p, the same way)}: the two-sample test always, the excess test where both stages have a z."""
    out = {"ab": stouffer(deviate(first.ab), first.ab.num_continuations_b, deviate(second.ab),
                          second.ab.num_continuations_b)}
    e1, e2 = first.excess, second.excess
    if e1 is not None and e2 is not None and e1.z is not None and e2.z is not None:
        out["excess"] = stouffer(e1.z, e1.num_continuations_on, e2.z, e2.num_continuations_on)
    return out


def combine_parts(first, second):
    """Which tests' combination calls lossy: 'excess', 'ab', both or neither, in that order."""
    c = both_stages(first, second)
    return [k for k in ("excess", "ab") if k in c and c[k][1] and c[k][0] < 0.005]


def oracle(stages, max_mde):
    if not stages or any(s.ab is None or s.aa is None for s in stages):
        return stats.INCONCLUSIVE, stats.MISSING
    for s in stages:
        for t in (s.ab, s.aa, s.excess):
            if t is not None and (t.num_nonfinite > 0 or math.isnan(t.p_value) or math.isinf(t.p_value)):
                return stats.INCONCLUSIVE, stats.NONFINITE
    if any(s.aa.p_value < 0.01 for s in stages):
        return stats.INCONCLUSIVE, stats.AA_REJECTS
    first = stages[0]
    has_excess = first.excess is not None
    z_ok = has_excess and first.excess.z is not None
    alarmed = (z_ok and abs(first.excess.z) > Z_ALARM) or first.ab.p_value < (0.05 if has_excess else 0.3)
    if alarmed:
        if len(stages) == 1:
            return stats.INCONCLUSIVE, stats.UNCONFIRMED
        second = stages[1]
        if z_ok and second.excess is not None and second.excess.z is not None:
            z1, z2 = first.excess.z, second.excess.z
            if abs(z2) > Z_CONFIRM and (z1 == 0 or (z1 > 0) == (z2 > 0)):  # z1 = 0: no direction
                return stats.LOSSY, None
        if second.ab.p_value < (0.01 if has_excess else 0.05):
            return stats.LOSSY, None
        if combine_parts(first, second):
            return stats.LOSSY, None
    ab = first.ab
    if min(ab.num_continuations_a, ab.num_continuations_b) < 8 or ab.min_p_value >= 0.05:
        return stats.INCONCLUSIVE, stats.TOO_FEW
    if ab.mde_logprob is None or (max_mde is not None and ab.mde_logprob > max_mde):
        return stats.INCONCLUSIVE, stats.UNDERPOWERED
    return stats.LOSSLESS, None


finite_p = st.floats(1 / 2001, 1.0)
p_values = st.one_of(finite_p, finite_p, finite_p, st.just(math.nan))  # a NaN one time in four
unit = st.sampled_from([0.0, 1e-3, 0.00999, 0.01, 0.0101, 0.049, 0.05, 0.0501, 0.29, 0.3, 0.31, 1.0])
p_any = st.one_of(p_values, unit)


@st.composite
def two_sample(draw):
    n = draw(st.sampled_from([4, 7, 8, 9, 96]))
    return stats.LosslessTest(
        p_value=draw(p_any), p_value_scores=0.5, p_value_tokens=0.5,
        min_p_value=draw(st.sampled_from([1 / 2001, 0.049, 0.05, 0.2])), mean_logprob_a=-2.0, mean_logprob_b=-2.0,
        logprob_diff=draw(st.floats(-1, 1)), logprob_diff_ci_low=None, logprob_diff_ci_high=None,
        mde_logprob=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.1, 0.1000001, 0.3]))),
        num_continuations_a=n, num_continuations_b=draw(st.sampled_from([n, 8, 7])), num_prompts=4,
        permutations=2000, num_nonfinite=draw(st.sampled_from([0, 0, 0, 0, 1])))


@st.composite
def excess(draw):
    z = draw(st.one_of(st.none(), st.floats(-6, 6), st.sampled_from([1.0364, 1.0365, -1.0365, 1.9599, 1.9601, -1.9601, 0.0])))
    bad = draw(st.sampled_from([0, 0, 0, 0, 2]))
    p = 1.0 if z is None else 2 * PHI.cdf(-abs(z))
    n = draw(st.sampled_from([8, 96, 192]))
    return stats.ExcessTest(z, math.nan if bad else p, 0.0, 0.0, 0.0 if z is None else z * 0.01,
                            None if z is None else 0.01, n, 2 * n, bad)


@st.composite
def stage(draw, with_excess):
    ab = draw(st.one_of(two_sample(), two_sample(), two_sample(), st.none()))
    aa = draw(st.one_of(two_sample(), two_sample(), two_sample(), st.none()))
    return stats.Stage(ab, aa, draw(excess()) if with_excess else None)


@st.composite
def stages(draw):
    with_excess = draw(st.booleans())
    return [draw(stage(with_excess)) for _ in range(draw(st.integers(1, 2)))]


def verdict_is_the_oracles(s, max_mde) -> tuple[str, str]:
    """Assert the verdict and its reason are the oracle's; (verdict, why), for further checks."""
    verdict, why = stats.lossless_verdict(s, max_mde=max_mde)
    want, reason = oracle(s, max_mde)
    assert verdict == want, (why, reason)
    if reason is not None:
        assert why.startswith(reason), (why, reason)
    return verdict, why


@SETTINGS
@given(stages(), st.one_of(st.none(), st.sampled_from([0.05, 0.1, 0.3])))
def test_the_verdict_follows_the_rule(s, max_mde):
    verdict_is_the_oracles(s, max_mde)


@SETTINGS
@given(stages(), st.one_of(st.none(), st.sampled_from([0.05, 0.1])))
def test_one_stage_is_never_lossy_and_an_alarm_never_passes_alone(s, max_mde):
    first = s[:1]
    verdict, _ = stats.lossless_verdict(first, max_mde=max_mde)
    assert verdict != stats.LOSSY
    if stats.alarm(first[0]) and verdict != stats.INCONCLUSIVE:
        raise AssertionError("an alarm without fresh draws must not pass")


@SETTINGS
@given(stages(), st.sampled_from([0.05, 0.1]))
def test_any_non_finite_number_is_inconclusive(s, max_mde):
    bad = any(t is not None and (t.num_nonfinite or not math.isfinite(t.p_value))
              for x in s for t in (x.ab, x.aa, x.excess))
    if bad and all(x.ab is not None and x.aa is not None for x in s):
        verdict, why = stats.lossless_verdict(s, max_mde=max_mde)
        assert verdict == stats.INCONCLUSIVE and why.startswith(stats.NONFINITE)


def test_the_levels_are_the_documented_ones():
    """The oracle's numbers are the module's levels (a changed level must change the docs and this oracle)."""
    assert (stats.ALARM_EXCESS, stats.CONFIRM_EXCESS, stats.ALARM_AB, stats.CONFIRM_AB, stats.ALARM_AB_ALONE,
            stats.CONFIRM_AB_ALONE, stats.COMBINE, stats.ALPHA_AA) == (0.3, 0.05, 0.05, 0.01, 0.3, 0.05, 0.005, 0.01)
    assert abs(PHI.inv_cdf(0.85) - 1.0364) < 1e-4 and abs(PHI.inv_cdf(0.975) - 1.9600) < 1e-4
    assert abs(Z_ALARM - 1.0364) < 1e-4 and abs(Z_CONFIRM - 1.9600) < 1e-4


def test_the_recorded_levels_are_the_ones_the_stage_is_judged_at():
    """lossless.json's ``levels``: the two-sample test's share depends on whether the excess test ran beside it."""
    beside = stats.Stage(None, None, stats.ExcessTest(0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 10, 10))
    assert stats.verdict.levels(beside) == {"alarm_excess": 0.3, "confirm_excess": 0.05, "alarm_two_sample": 0.05,
                                            "confirm_two_sample": 0.01, "combine": 0.005}
    assert stats.verdict.levels(stats.Stage(None, None)) == {"alarm_excess": 0.3, "confirm_excess": 0.05,
                                                         "alarm_two_sample": 0.3, "confirm_two_sample": 0.05,
                                                         "combine": 0.005}


# Past the gates: both tests present and every number finite, so most draws reach the alarm, the confirmation and
# the power gate (the draws above spend most examples on a missing or non-finite test). Each stage draws its own
# excess test or none (a backend that lost its entropies between stages must not crash the confirmation).
boundary_z = st.sampled_from([Z_ALARM, -Z_ALARM, Z_CONFIRM, -Z_CONFIRM, 0.0, 0.5, 1.0, -1.0, 2.5, -2.5,
                              math.nextafter(Z_ALARM, 9), math.nextafter(Z_CONFIRM, 9), -math.nextafter(Z_CONFIRM, 9)])


@st.composite
def clean_two_sample(draw, aa=False):
    n = draw(st.sampled_from([7, 8, 96]))
    p = draw(st.sampled_from([0.0099, 0.01, 0.5]) if aa else st.one_of(unit, st.floats(0.0, 1.0), st.just(0.5)))
    return stats.LosslessTest(
        p_value=p, p_value_scores=0.5, p_value_tokens=0.5,
        min_p_value=draw(st.sampled_from([1 / 2001, 1 / 2001, 0.049, 0.05])), mean_logprob_a=-2.0,
        mean_logprob_b=-2.0, logprob_diff=draw(st.floats(-1, 1)), logprob_diff_ci_low=None, logprob_diff_ci_high=None,
        mde_logprob=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.1, 0.1000001, 0.3]))),
        num_continuations_a=n, num_continuations_b=draw(st.sampled_from([n, 96, 7])), num_prompts=12,
        permutations=2000)


@st.composite
def clean_excess(draw):
    z = draw(st.one_of(st.none(), st.floats(-6, 6), boundary_z, boundary_z))
    p = 1.0 if z is None else 2 * PHI.cdf(-abs(z))
    n = draw(st.sampled_from([8, 96, 192]))
    return stats.ExcessTest(z, p, 0.0, 0.0, 0.0 if z is None else z * 0.01, None if z is None else 0.01, n, 2 * n)


@st.composite
def clean_stages(draw):
    with_excess = draw(st.booleans())
    out = []
    for _ in range(draw(st.integers(1, 2))):
        has = with_excess if draw(st.integers(0, 4)) else not with_excess  # one stage in five differs
        out.append(stats.Stage(draw(clean_two_sample()), draw(clean_two_sample(aa=True)),
                               draw(clean_excess()) if has else None))
    return out


def alarm_parts(first):
    """What raises the first stage's alarm: 'excess', 'ab', both or neither (the oracle's rule)."""
    e = first.excess
    parts = ["excess"] if e is not None and e.z is not None and abs(e.z) > Z_ALARM else []
    return parts + (["ab"] if first.ab.p_value < (0.05 if e is not None else 0.3) else [])


def confirm_parts(first, second):
    e1, e2 = first.excess, second.excess
    both_z = e1 is not None and e2 is not None and e1.z is not None and e2.z is not None
    parts = ["excess"] if both_z and abs(e2.z) > Z_CONFIRM and (e1.z == 0 or (e1.z > 0) == (e2.z > 0)) else []
    return parts + (["ab"] if second.ab.p_value < (0.01 if e1 is not None else 0.05) else [])


STARTS = {"excess": ("excess z = ", "excess z "), "ab": ("two-sample p = ", "two-sample p ")}


@SETTINGS
@given(clean_stages(), st.one_of(st.none(), st.sampled_from([0.05, 0.1, 0.3])))
def test_past_the_gates_the_verdict_and_its_why_follow_the_rule(s, max_mde):
    verdict, why = verdict_is_the_oracles(s, max_mde)
    raised = alarm_parts(s[0])
    said = stats.alarm(s[0])
    if not raised:
        assert said is None
    else:  # each cause in its own clause, in the rule's order, joined by "; "
        assert [c.split(" = ")[0] for c in said.split("; ")] == [STARTS[r][0][:-3] for r in raised], said
    if verdict == stats.LOSSY:  # the second stage's own confirmation where there is one, else the combination
        parts = why.split("; ")
        confirmed = confirm_parts(*s)
        assert [p.split(",")[0].rsplit(" ", 1)[0] for p in parts] == [STARTS[r][1].strip()
                                                                     for r in confirmed or combine_parts(*s)], why
        assert all(("both stages combined" in p) != bool(confirmed) for p in parts), why
    if verdict == stats.LOSSLESS:  # the evidence it rests on: both stages' combined p where fresh draws were drawn
        if raised:
            c = both_stages(*s)
            said = f"p = {c['ab'][0]:.3g} over both stages" + (f", excess p = {c['excess'][0]:.3g}" if "excess" in c
                                                                else "")
        else:
            said = f"p = {s[0].ab.p_value:.3g}"
        assert why.startswith(f"no difference detectable at this N ({said}; it would detect a shift of "), why
        assert why.endswith(" did not replicate on fresh draws" if raised else " nats/token)"), why


@st.composite
def alarmed_pairs(draw):
    """Two clean stages whose first raises an alarm (so the combination is read), every size and sign drawn."""
    s = draw(clean_stages().filter(lambda x: len(x) == 2 and alarm_parts(x[0])))
    return s


@SETTINGS
@given(alarmed_pairs())
def test_both_stages_combined_follow_the_rule(s):
    """stats.combined and stats.combination against the oracle's Stouffer Z: its p, its way, and which tests'
    combination calls lossy, each clause naming both stages' numbers."""
    first, second = s
    want = both_stages(first, second)
    got = stats.combined(first, second)
    assert (got["excess"] is None) == ("excess" not in want)
    for key, name in (("ab", "two_sample"), ("excess", "excess")):
        if key in want:
            p, same = want[key]
            assert math.isclose(got[name].p_value, p, rel_tol=1e-9, abs_tol=1e-300) and got[name].same_way == same
            assert math.isclose(2 * PHI.cdf(-abs(got[name].z)), p, rel_tol=1e-9, abs_tol=1e-300)
    why = stats.combination(first, second)
    parts = combine_parts(first, second)
    if not parts:
        assert why is None
        return
    clauses = why.split("; ")
    assert [c.split(",")[0].rsplit(" ", 1)[0] for c in clauses] == [STARTS[r][1].strip() for r in parts], why
    for c, r in zip(clauses, parts):
        assert "the same way: both stages combined (weighted by their continuations)" in c and "< 0.005:" in c
        if r == "ab":
            assert f"p = {want['ab'][0]:.3g} < 0.005" in c and c.startswith(
                f"two-sample p {first.ab.p_value:.3g}, then {second.ab.p_value:.3g} on fresh draws")
        else:
            assert f"p = {want['excess'][0]:.3g} < 0.005" in c and c.startswith(
                f"excess z {first.excess.z:+.3g}, then {second.excess.z:+.3g} on fresh draws")


@SETTINGS
@given(alarmed_pairs())
def test_a_second_stage_the_other_way_never_combines_to_lossy(s):
    """Fresh draws that point the other way contradict the alarm: flipping the second stage's signs (its excess z
    and its shift) leaves only the second stage's own confirmation to call lossy."""
    first, second = s
    flipped = stats.Stage(
        stats.LosslessTest(**{**second.ab.__dict__, "logprob_diff": -first.ab.logprob_diff}), second.aa,
        None if second.excess is None or second.excess.z is None or first.excess is None or first.excess.z is None
        else stats.ExcessTest(**{**second.excess.__dict__, "z": -math.copysign(abs(second.excess.z), first.excess.z)}))
    assert stats.combination(first, flipped) is None
    verdict, why = stats.lossless_verdict([first, flipped])
    if verdict == stats.LOSSY:
        assert "both stages combined" not in why and stats.confirmation(first, flipped) == why
