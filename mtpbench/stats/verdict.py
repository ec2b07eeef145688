"""check-lossless's sampling verdict (numpy only: no torch, no I/O): the drafting arm's excess log-prob against the
arms without drafting (``excess_test``), whether a stage's numbers raise an alarm that fresh draws must confirm
(``alarm``), and the verdict over one or two stages (``lossless_verdict``). The two-sample permutation test and the
one-sample score test are in ``stats.lossless``.

The rule, and why:
* The excess test. At every sampled token the target's law p_t is known (the teacher-forced pass), so
  D_t = log p_t(x_t) + H(p_t) has mean 0 under the target's own law whatever the prefix: it removes most of the
  prefix-to-prefix spread of log p. Each continuation's mean D is compared between the drafting arm and both arms
  without drafting pooled (off and off again), within each prompt, weighted as the two-sample test weights prompts;
  z is that difference over its permutation standard deviation (the within-prompt relabelling's exact variance,
  S^2 (1 / n_on + 1 / n_off)), read against the normal. Under lossless drafting the three arms are one law, so the
  test is right whatever the scorer: a scorer that is not the sampler's law (another dtype, a truncation the
  sampler applied) moves every arm's D alike and cancels. The one-sample test of each arm against the scorer's
  law (``stats.score_test``) assumes an exact scorer: it is reported as the scorer's fit, and decides nothing
  (a scorer biased by 2 standard errors in every arm made the old rule call a correct engine lossy 1 time in 4).
* Two stages. A first stage raises an alarm where the excess test's |z| passes ALARM_EXCESS's two-sided point or
  the two-sample test's p is below ALARM_AB. An alarm is never a verdict: the check draws all three arms again with
  fresh seeds and twice the continuations, and calls lossy only where the fault shows again, the same way, in one of
  two ways fixed in advance:
  - confirmed by the second stage on its own (``confirmation``): the excess test beyond CONFIRM_EXCESS's two-sided
    point, the same way as the first, or the two-sample test below CONFIRM_AB;
  - or both stages combined (``combination``), where the second alone fell short: each test's z of the two stages,
    weighted by the square root of their continuations (Stouffer: Z = (sqrt(n1) z1 + sqrt(n2) z2) /
    sqrt(n1 + n2), N(0, 1) for independent null stages), beyond COMBINE's two-sided point, with both stages' z the
    same way. The excess test's z is signed (the drafting arm above the arms without it is +); the two-sample p is
    read as the normal deviate Phi^-1(1 - p / 2), signed by its shift of the mean target log-prob. So a signal seen
    at stage 1 and again the same way at stage 2 is lossy although stage 2 alone fell short (stage 1 two-sample
    p 0.0005, stage 2 0.015, shift the same way: combined p 6.5e-05), while a stage 2 that points the other way
    contradicts the alarm (no combination), and a null one pulls Z down (with z2 near 0, Z is z1 / sqrt(3): only a
    first stage beyond 4.86, p 1e-6, passes COMBINE then).
  A real fault replicates; chance does not. The false-lossy bound, a union bound over the paths to lossy for
  independent null stages (each stage's z N(0, 1), or its p uniform, whatever the two tests' correlation within a
  stage): an alarm (at most ALARM_EXCESS + ALARM_AB = 0.35) confirmed on its own (at most CONFIRM_EXCESS / 2 +
  CONFIRM_AB = 0.035, independent of the alarm), 1.225 %; plus a combination where stage 2's own test fell short,
  0.088 % for the excess test (|z2| within 1.96) and 0.266 % for the two-sample test (|z2| within 2.576), by
  integration over the two stages' normal z for stage 2's twice the continuations: at most 1.58 %
  (FALSE_LOSSY_BOUND). The earlier statement, 0.3 x 0.025 + 0.05 x 0.01 = about 0.8 %, left out an alarm of
  either test confirmed by the other: the rule without the combination was bounded by 1.225 %, 1.16 % were the two
  tests of a stage independent. The doubled second stage buys back the power a second test would cost. Without
  the target's entropies (no excess test) the two-sample test takes both budgets (ALARM_AB_ALONE,
  CONFIRM_AB_ALONE; the same COMBINE): 0.3 x 0.05 + 0.088 % = at most 1.59 % (FALSE_LOSSY_BOUND_ALONE).
* The third test, acceptance against its exact law (``LawEvidence``; issue 46), where the drafting arm's verify
  steps were read (the native engine, vLLM offline, a launched server through the plugin): at each draft position
  and jointly the accepted count's exact upper tail (Poisson-binomial, ``stats.acceptance``; a draft accepted with
  probability 0 is a certain departure) holds its level for an engine that follows the law, whatever the drafter
  and however near 0 or 1 its steps are (a normal z did not: with it the confirmation fired in 1.98 % of null
  stages against its 0.1 %, and the whole verdict was lossy in 1.93 % against the 1.58 % bound; issue 55,
  docs/judgement.md has each regime's simulated rate). Only over-acceptance is lossy (an
  engine that accepts more than sum min(p, q) somewhere emits some token above its probability), so the test is
  one-sided, family-wise over the positions and the joint test (Bonferroni): an alarm at ALARM_LAW, confirmation
  by the second stage on its own at CONFIRM_LAW (over-accepting again), and both stages combined per position
  (Stouffer, weighted by sqrt(steps), both over) at COMBINE_LAW. Its shares come out of the same budgets: beside
  it the excess test alarms at ALARM_EXCESS_LAW = 0.26 instead of 0.3, so the union bound is
  (0.26 + 0.05 + 0.015) x (0.025 + 0.01 + 0.001) + 0.088 % + 0.266 % + 0.05 % = 1.574 %, within FALSE_LOSSY_BOUND;
  without the excess test the two-sample test alarms at ALARM_AB_ALONE_LAW = 0.265: (0.265 + 0.015) x (0.05 +
  0.001) + 0.088 % + 0.05 % = 1.566 %, within FALSE_LOSSY_BOUND_ALONE. (The law combination's share is bounded by
  its level, whatever the alarm.) Without the law's steps (an attached server without the plugin) the levels are
  as before. Under-acceptance wastes drafts and is said beside the verdict, never lossy.
* Controls and gates, in order: a missing test, then any non-finite number (NaN or +inf scores, moments or
  p-values: the verdict cannot rest on them), then an A/A control (off against off again, each stage) below
  ALPHA_AA: inconclusive. A confirmed alarm is lossy whatever the power. Otherwise lossless needs enough
  continuations, a reachable p below ALARM_AB, and a known detectable shift (the two-sample test's; zero spread
  is no evidence of power) within ``max_mde``; its why quotes the evidence it rests on: the first stage's p, or
  where an alarm drew a second stage, both stages' combined p (never the alarm's own p, which fresh draws
  overruled).

Calibration (benchmarks/lossless_verdict_rates.py, the Markov chain of tests/unit/test_lossless_stats.py, 12
prompts x 8 continuations of 16 tokens an arm): see docs/check-lossless.md for the measured false-alarm rate, the
rate under a biased scorer, the power against the planted rules and the lossless rate of a fault at the set shift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from mtpbench.stats.acceptance import UNDER, law_test
from mtpbench.stats.excess import ExcessTest, continuation_excess, excess_test  # noqa: F401
# every level is a share of check-lossless's false-lossy budget, held with the other answers' levels in stats.judge
from mtpbench.stats.judge import (
    ALARM_AB,
    ALARM_AB_ALONE,
    ALARM_AB_ALONE_LAW,
    ALARM_EXCESS,
    ALARM_EXCESS_LAW,
    ALARM_LAW,
    ALPHA_AA,
    COMBINE,
    COMBINE_LAW,
    CONFIRM_AB,
    CONFIRM_AB_ALONE,
    CONFIRM_EXCESS,
    CONFIRM_LAW,
)
from mtpbench.stats.lossless import MIN_CONTINUATIONS, LosslessTest

LOSSLESS, LOSSY, INCONCLUSIVE = "lossless", "lossy", "inconclusive"
# why a sampling check is inconclusive, in a word (the summary's headline and lossless.json's inconclusive_reason)
MISSING, NONFINITE, AA_REJECTS, UNCONFIRMED, TOO_FEW, UNDERPOWERED = (
    "a test is missing", "non-finite scores", "A/A control rejects", "alarm not confirmed",
    "too few continuations", "underpowered")
SCORER = "scorer is not the sampler's law"  # older records' reason (the scorer's control no longer gates)


@dataclass(frozen=True)
class LawEvidence:
    """The drafting arm's acceptance against its exact law (``stats.acceptance``): per draft position and jointly
    (``position`` None, last), the verify steps that reached it, the accepted share and its expectation, the exact
    tails of the accepted count (``p_over``: what the alarm and the confirmation read), certain departures (a draft
    accepted with probability 0: lossy whatever the tails) and z, the upper tail as a normal deviate (what both
    stages' combination reads; None where every step was certain). Over-acceptance is lossy (an engine
    that accepts more than sum min(p, q) somewhere emits some token above its probability); under-acceptance wastes
    drafts and is reported, never lossy."""
    tests: tuple  # of stats.acceptance.PositionTest, the joint one last

    @property
    def family(self) -> int:
        return len(self.tests)


def law_evidence(steps) -> LawEvidence | None:
    """The law test of the drafting arm's (position, accepted 0/1, probability) verify steps; None without any."""
    steps = list(steps)
    return LawEvidence(tuple(law_test(steps)[1])) if steps else None


@dataclass(frozen=True)
class Stage:
    """One stage's tests: off against on (``ab``), off against off again (``aa``), the excess test (None where the
    backend gave no entropies), the drafting arm's acceptance against its law (None where it was not read)."""
    ab: LosslessTest | None
    aa: LosslessTest | None
    excess: ExcessTest | None = None
    law: LawEvidence | None = None


def two_sample_levels(stage: Stage) -> tuple[float, float]:
    """The two-sample test's (alarm, confirm) levels: its own share beside the excess test, or the whole budget (less
    the law test's alarm share where it runs)."""
    if stage.excess is not None:
        return ALARM_AB, CONFIRM_AB
    return (ALARM_AB_ALONE_LAW if stage.law is not None else ALARM_AB_ALONE), CONFIRM_AB_ALONE


def levels(stage: Stage) -> dict[str, float]:
    """Every level the verdict reads for this stage, by name (lossless.json's ``levels``); the law test's three
    where it runs."""
    alarm_ab, confirm_ab = two_sample_levels(stage)
    out = {"alarm_excess": ALARM_EXCESS_LAW if stage.law is not None else ALARM_EXCESS,
           "confirm_excess": CONFIRM_EXCESS, "alarm_two_sample": alarm_ab, "confirm_two_sample": confirm_ab,
           "combine": COMBINE}
    if stage.law is not None:
        out.update(alarm_law=ALARM_LAW, confirm_law=CONFIRM_LAW, combine_law=COMBINE_LAW)
    return out


def _two_sided(alpha: float) -> float:
    return NormalDist().inv_cdf(1 - alpha / 2)


def _one_sided(alpha: float) -> float:
    return NormalDist().inv_cdf(1 - alpha)


def over_accepting(law: LawEvidence | None, alpha: float) -> list:
    """The law tests over-accepting at ``alpha`` over the family, in order: a certain departure (a draft accepted
    with probability 0), or the exact upper tail of the accepted count at or below ``alpha`` / the family."""
    if law is None:
        return []
    return [t for t in law.tests if t.certain_over or t.p_over <= alpha / law.family]


def _where(t) -> str:
    return "all positions together" if t.position is None else f"position {t.position}"


def _law_z(t) -> str:
    if t.certain_over:
        return f"{t.certain_over} accepted with probability 0: certain"
    if t.certain_under:
        return f"{t.certain_under} rejected with probability 1: certain"
    return "certain" if t.z is None else f"z {t.z:+.3g}, p {t.p_under if t.z < 0 else t.p_over:.3g}"


def _law_words(tests) -> str:
    return ", ".join(f"{_where(t)} (observed {t.observed:.3g}, expected {t.expected:.3g}, {_law_z(t)})"
                     for t in tests)


def alarm(stage: Stage) -> str | None:
    """What in this stage calls for fresh draws, in words, or None."""
    found = []
    e, lv = stage.excess, levels(stage)
    if e is not None and e.z is not None and abs(e.z) > _two_sided(lv["alarm_excess"]):
        found.append(f"excess z = {e.z:+.3g} ({e.diff:+.3g} nats/token)")
    if stage.ab is not None and stage.ab.p_value < lv["alarm_two_sample"]:
        found.append(f"two-sample p = {stage.ab.p_value:.3g} (mean target log-prob {stage.ab.logprob_diff:+.3g})")
    over = over_accepting(stage.law, ALARM_LAW)
    if over:
        found.append(f"over-accepts at {_law_words(over)}")
    return "; ".join(found) or None


def confirmation(first: Stage, second: Stage) -> str | None:
    """Why the second stage, drawn afresh after ``first`` raised an alarm, shows the fault again on its own: the
    excess test beyond CONFIRM_EXCESS's two-sided point in the first stage's direction (either way where the first
    stage's z is exactly 0, which has none), or the two-sample test below CONFIRM_AB; None when it does not (chance
    does not replicate)."""
    found = []
    e1, e2 = first.excess, second.excess
    if e1 is not None and e2 is not None and e1.z is not None and e2.z is not None:
        if abs(e2.z) > _two_sided(CONFIRM_EXCESS) and (e1.z == 0 or (e1.z > 0) == (e2.z > 0)):
            way = "" if e1.z == 0 else " the same way"
            found.append(f"excess z {e1.z:+.3g}, then {e2.z:+.3g} on fresh draws (beyond {_two_sided(CONFIRM_EXCESS):.3g}"
                         f"{way}): the drafting arm's tokens are not the target's law (excess {e1.diff:+.3g}, "
                         f"{e2.diff:+.3g} nats/token)")
    level = two_sample_levels(first)[1]
    if second.ab.p_value < level:
        found.append(f"two-sample p {first.ab.p_value:.3g}, then {second.ab.p_value:.3g} < {level:g} on fresh draws: "
                     f"drafting changes the output law (mean target log-prob {first.ab.logprob_diff:+.3g}, "
                     f"{second.ab.logprob_diff:+.3g} nats/token)")
    again = over_accepting(second.law, CONFIRM_LAW) if first.law is not None else []
    if again:
        found.append(f"the verifier over-accepts again on fresh draws at {_law_words(again)} (one-sided, "
                     f"{CONFIRM_LAW:g} over the {second.law.family} tests): it keeps drafts its own law rejects")
    return "; ".join(found) or None


@dataclass(frozen=True)
class Combined:
    """One test's evidence over both stages: Stouffer's Z, each stage's z weighted by sqrt(its continuations)."""
    z: float
    p_value: float  # two-sided, normal
    same_way: bool  # both stages' z of one sign (a z of 0 has no way, so it agrees with neither)


def signed_z(ab: LosslessTest) -> float:
    """The two-sample test's p as a normal deviate, Phi^-1(1 - p / 2), signed by its shift of the mean target log-prob
    (0 where there is no shift: no way). Under the null its p is uniform and, with as many continuations a prompt in
    each arm, the shift's sign is a fair coin apart from p: N(0, 1)."""
    if ab.logprob_diff == 0:
        return 0.0
    # p / 2 floored at the smallest float: a p of 0 (which no permutation test gives) is a finite, huge z
    return math.copysign(-NormalDist().inv_cdf(max(ab.p_value / 2, 5e-324)), ab.logprob_diff)


def _stouffer(z1: float, n1: int, z2: float, n2: int) -> Combined:
    z = (math.sqrt(n1) * z1 + math.sqrt(n2) * z2) / math.sqrt(n1 + n2)
    return Combined(z, 2 * NormalDist().cdf(-abs(z)), z1 * z2 > 0)


def combined(first: Stage, second: Stage) -> dict[str, Combined | None]:
    """Each test over both stages (``excess``: None where a stage has no excess z; ``two_sample``)."""
    e1, e2 = first.excess, second.excess
    ex = None
    if e1 is not None and e2 is not None and e1.z is not None and e2.z is not None:
        ex = _stouffer(e1.z, e1.num_continuations_on, e2.z, e2.num_continuations_on)
    ab = _stouffer(signed_z(first.ab), first.ab.num_continuations_b, signed_z(second.ab),
                   second.ab.num_continuations_b)
    return {"excess": ex, "two_sample": ab}


def law_combined(first: Stage, second: Stage) -> list[tuple]:
    """The law tests over-accepting in both stages combined: per position in both (and jointly), Stouffer's Z of the
    two z's weighted by the square root of their steps, where both are above 0 and Z passes COMBINE_LAW's one-sided
    point over the tests of the two stages; (stage 1's test, stage 2's, Z) each."""
    if first.law is None or second.law is None:
        return []
    later = {t.position: t for t in second.law.tests}
    pairs = [(t, later[t.position]) for t in first.law.tests if t.position in later]
    if not pairs:
        return []
    point = _one_sided(COMBINE_LAW / max(first.law.family, second.law.family))
    out = []
    for t1, t2 in pairs:
        if (t1.z or 0) > 0 and (t2.z or 0) > 0:
            z = math.inf if math.isinf(t1.z) or math.isinf(t2.z) else _stouffer(t1.z, t1.steps, t2.z, t2.steps).z
            if z > point:
                out.append((t1, t2, z))
    return out


def combination(first: Stage, second: Stage) -> str | None:
    """Why both stages combined show the fault (the module docstring): a test whose Stouffer Z over the two stages
    passes COMBINE's two-sided point with both stages the same way; None when neither does."""
    found = []
    c = combined(first, second)
    ex, ab = c["excess"], c["two_sample"]
    if ex is not None and ex.same_way and ex.p_value < COMBINE:
        e1, e2 = first.excess, second.excess
        found.append(f"excess z {e1.z:+.3g}, then {e2.z:+.3g} on fresh draws, the same way: both stages combined "
                     f"(weighted by their continuations) z = {ex.z:+.3g}, p = {ex.p_value:.3g} < {COMBINE:g}: the "
                     f"drafting arm's tokens are not the target's law (excess {e1.diff:+.3g}, {e2.diff:+.3g} "
                     "nats/token)")
    law = law_combined(first, second)
    if law:
        found.append("the verifier over-accepts in both stages, the same way: combined (weighted by their steps) "
                     + ", ".join(f"{_where(t1)} z {t1.z:+.3g}, then {t2.z:+.3g}: {z:+.3g}" for t1, t2, z in law)
                     + f" (one-sided, {COMBINE_LAW:g} over the tests)")
    if ab.same_way and ab.p_value < COMBINE:
        a1, a2 = first.ab, second.ab
        found.append(f"two-sample p {a1.p_value:.3g}, then {a2.p_value:.3g} on fresh draws, the same way: both stages "
                     f"combined (weighted by their continuations) p = {ab.p_value:.3g} < {COMBINE:g}: drafting changes "
                     f"the output law (mean target log-prob {a1.logprob_diff:+.3g}, {a2.logprob_diff:+.3g} nats/token)")
    return "; ".join(found) or None


def nonfinite(stages) -> str | None:
    """Which numbers of the stages are not finite, in words, or None."""
    found = []
    for i, s in enumerate(stages, 1):
        for name, t in (("off vs on", s.ab), ("A/A", s.aa), ("excess", s.excess)):
            if t is None:
                continue
            p = t.p_value
            if t.num_nonfinite or not math.isfinite(p):
                found.append(f"stage {i} {name}: {t.num_nonfinite} non-finite score(s)"
                             + ("" if math.isfinite(p) else f", p = {p}"))
    return "; ".join(found) or None


def lossless_verdict(stages, max_mde: float | None = None) -> tuple[str, str]:
    """(verdict, why) from one stage, or two where the first raised an ``alarm`` (the module docstring). An
    inconclusive why starts with its reason (MISSING ... UNDERPOWERED). ``max_mde``: the largest detectable shift
    (nats/token) lossless may carry; None: no bound (but an unknown shift is still no power)."""
    stages = list(stages)
    if not stages or any(s.ab is None or s.aa is None for s in stages):
        return INCONCLUSIVE, f"{MISSING}: no prompt with continuations in both arms"
    bad = nonfinite(stages)
    if bad:
        return INCONCLUSIVE, f"{NONFINITE}: {bad}; the scores cannot be tested"
    for i, s in enumerate(stages, 1):
        if s.aa.p_value < ALPHA_AA:
            return INCONCLUSIVE, (f"{AA_REJECTS}: off against off (stage {i}), p = {s.aa.p_value:.3g} < "
                                  f"{ALPHA_AA:g}; two runs without drafting already differ more than sampling explains")
    first, note = stages[0], ""
    evidence = f"p = {first.ab.p_value:.3g}"
    raised = alarm(first)
    if raised:
        if len(stages) < 2:
            return INCONCLUSIVE, f"{UNCONFIRMED}: {raised}; fresh draws must confirm it before a verdict"
        # the second stage on its own first: where it confirms, its own numbers are the plainest why
        why = confirmation(first, stages[1]) or combination(first, stages[1])
        if why:
            return LOSSY, why
        # what lossless rests on now is both stages' evidence, not the alarm's p that fresh draws overruled
        c = combined(first, stages[1])
        evidence = f"p = {c['two_sample'].p_value:.3g} over both stages"
        if c["excess"] is not None:
            evidence += f", excess p = {c['excess'].p_value:.3g}"
        note = f"; the first stage's alarm ({raised}) did not replicate on fresh draws"
    verdict, why = _powered(first.ab, max_mde, evidence, note)
    return verdict, why + wasted(first.law)


def wasted(law: LawEvidence | None) -> str:
    """Beside a verdict that is not lossy: where the verifier under-accepts (two-sided, family-wise at the law
    test's own level): drafts wasted, which is slow, not lossy."""
    under = [t for t in (law.tests if law is not None else ()) if t.decision == UNDER]
    return f"; the verifier under-accepts at {_law_words(under)}: drafts wasted, not lossy" if under else ""


def _powered(ab: LosslessTest, max_mde: float | None, evidence: str, note: str) -> tuple[str, str]:
    """Lossless where this N could have seen a shift, else inconclusive and why; ``evidence``: the p the verdict
    rests on, in words."""
    if min(ab.num_continuations_a, ab.num_continuations_b) < MIN_CONTINUATIONS or ab.min_p_value >= ALARM_AB:
        return INCONCLUSIVE, (f"{TOO_FEW}: {ab.num_continuations_a} and {ab.num_continuations_b}; at least "
                              f"{MIN_CONTINUATIONS} each, to detect anything")
    mde = ab.mde_logprob
    if mde is None:
        return INCONCLUSIVE, (f"{UNDERPOWERED}: the continuations' scores have no spread, so no detectable shift can "
                              "be claimed (identical draws say nothing of power)")
    if max_mde is not None and not mde <= max_mde:
        n = ab.num_continuations_b
        need = math.ceil(n * (mde / max_mde) ** 2)
        return INCONCLUSIVE, (f"{UNDERPOWERED}: the smallest detectable shift ({mde:.3g} nats/token) exceeds the bound "
                              f"{max_mde:g}; about {math.ceil(need / ab.num_prompts)} continuations a prompt ({need} "
                              f"an arm, {n} now; the detectable shift falls as 1 / sqrt(continuations)) would reach it")
    return LOSSLESS, (f"no difference detectable at this N ({evidence}; it would detect a shift of {mde:.3g} "
                      f"nats/token){note}")


def detectable_shift(ab: LosslessTest) -> float | None:
    """The smallest shift of the mean target log-prob (nats/token) the check detects with POWER: the two-sample
    test's (the excess test sees the local excess log p + H, which misses a fault that moves which prefixes are
    visited or mass between tokens scored alike, so its power says nothing of the quantity the bound is set on).
    None: unknown (no spread)."""
    return ab.mde_logprob
