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

import numpy as np

from mtpbench.stats.lossless import LOGPROB_FLOOR, MIN_CONTINUATIONS, LosslessTest

ALARM_EXCESS = 0.3  # stage 1: the excess test's two-sided p below this raises an alarm
CONFIRM_EXCESS = 0.05  # stage 2 on its own: two-sided, and the same way as stage 1's z (so 0.025 of a null's draws)
ALARM_AB, CONFIRM_AB = 0.05, 0.01  # the two-sample test beside the excess test: stage 1, stage 2 on its own
ALARM_AB_ALONE, CONFIRM_AB_ALONE = 0.3, 0.05  # the two-sample test alone (no target entropies)
COMBINE = 0.005  # both stages combined (Stouffer, weighted by sqrt(continuations)): two-sided, both the same way
FALSE_LOSSY_BOUND, FALSE_LOSSY_BOUND_ALONE = 0.0158, 0.0159  # the union bounds of the module docstring
ALPHA_AA = 0.01  # each stage's A/A control (off against off again): it checks the engine, not a second coin toss

LOSSLESS, LOSSY, INCONCLUSIVE = "lossless", "lossy", "inconclusive"
# why a sampling check is inconclusive, in a word (the summary's headline and lossless.json's inconclusive_reason)
MISSING, NONFINITE, AA_REJECTS, UNCONFIRMED, TOO_FEW, UNDERPOWERED = (
    "a test is missing", "non-finite scores", "A/A control rejects", "alarm not confirmed",
    "too few continuations", "underpowered")
SCORER = "scorer is not the sampler's law"  # older records' reason (the scorer's control no longer gates)


@dataclass(frozen=True)
class ExcessTest:
    """The drafting arm's mean excess log-prob (log p + H, nats/token) against the arms without drafting."""
    z: float | None  # None: no spread at all (every continuation of a prompt alike)
    p_value: float  # two-sided, normal
    excess_on: float  # mean per-continuation excess, prompts weighted as in the difference
    excess_off: float
    diff: float  # on - off
    se: float | None  # the permutation standard deviation of diff
    num_continuations_on: int
    num_continuations_off: int
    num_nonfinite: int = 0  # continuations whose excess is NaN or infinite


def continuation_excess(logprobs, entropies) -> float:
    """One continuation's mean of D_t = log p_t(x_t) + H_t (log-probs floored at LOGPROB_FLOOR, as the other tests;
    NaN stays NaN)."""
    lp = np.maximum(np.asarray(logprobs, float), LOGPROB_FLOOR)
    return float(np.mean(lp + np.asarray(entropies, float)))


def excess_test(excess, strata, on) -> ExcessTest | None:
    """The excess test of the module docstring: ``excess`` per continuation, its prompt (``strata``) and whether it
    came from the drafting arm (``on``). None when some prompt lacks either side."""
    x, strata, on = np.asarray(excess, float), np.asarray(strata), np.asarray(on, bool)
    prompts = np.unique(strata)
    n_on = np.array([on[strata == s].sum() for s in prompts])
    n_off = np.array([(~on[strata == s]).sum() for s in prompts])
    if x.size == 0 or (n_on == 0).any() or (n_off == 0).any():
        return None
    bad = int((~np.isfinite(x)).sum())
    if bad:
        return ExcessTest(None, math.nan, math.nan, math.nan, math.nan, None, int(n_on.sum()), int(n_off.sum()), bad)
    h = n_on * n_off / (n_on + n_off)
    w = h / h.sum()
    m_on = np.array([x[(strata == s) & on].mean() for s in prompts])
    m_off = np.array([x[(strata == s) & ~on].mean() for s in prompts])
    s2 = np.array([x[strata == s].var(ddof=1) for s in prompts])  # at least 2 values a prompt: one of each side
    diff = float(w @ (m_on - m_off))
    se = math.sqrt(float((w ** 2 * s2 * (1 / n_on + 1 / n_off)).sum()))
    if se <= 1e-12 * max(float(np.abs(x).max()), 1.0):  # below: rounding of equal values
        z, p = None, 1.0
    else:
        z = diff / se
        p = 2 * NormalDist().cdf(-abs(z))
    return ExcessTest(z, p, float(w @ m_on), float(w @ m_off), diff, None if z is None else se,
                      int(n_on.sum()), int(n_off.sum()))


@dataclass(frozen=True)
class Stage:
    """One stage's tests: off against on (``ab``), off against off again (``aa``), the excess test (None where the
    backend gave no entropies)."""
    ab: LosslessTest | None
    aa: LosslessTest | None
    excess: ExcessTest | None = None


def two_sample_levels(stage: Stage) -> tuple[float, float]:
    """The two-sample test's (alarm, confirm) levels: its own share beside the excess test, or the whole budget."""
    return (ALARM_AB, CONFIRM_AB) if stage.excess is not None else (ALARM_AB_ALONE, CONFIRM_AB_ALONE)


def levels(stage: Stage) -> dict[str, float]:
    """Every level the verdict reads for this stage, by name (lossless.json's ``levels``)."""
    alarm_ab, confirm_ab = two_sample_levels(stage)
    return {"alarm_excess": ALARM_EXCESS, "confirm_excess": CONFIRM_EXCESS, "alarm_two_sample": alarm_ab,
            "confirm_two_sample": confirm_ab, "combine": COMBINE}


def _two_sided(alpha: float) -> float:
    return NormalDist().inv_cdf(1 - alpha / 2)


def alarm(stage: Stage) -> str | None:
    """What in this stage calls for fresh draws, in words, or None."""
    found = []
    e = stage.excess
    if e is not None and e.z is not None and abs(e.z) > _two_sided(ALARM_EXCESS):
        found.append(f"excess z = {e.z:+.3g} ({e.diff:+.3g} nats/token)")
    if stage.ab is not None and stage.ab.p_value < two_sample_levels(stage)[0]:
        found.append(f"two-sample p = {stage.ab.p_value:.3g} (mean target log-prob {stage.ab.logprob_diff:+.3g})")
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
    return _powered(first.ab, max_mde, evidence, note)


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
